"""The chapter's model: `MiniGPT` and its parts (gpt.py: the blocks and the forward pass; layers.py:
norms, attention, FFN, the residual add; recorder.py: the named stages a pass records; cache.py:
the KV cache; reading.py: how a model is read, its trained length and rope rules, and the one
refusal of a text too long), the stage names (stages.py, no torch), the norm fold (fold.py), the
chapter-17 teaching weights (chapter17.py) and a step's arithmetic (flops.py).

`from minigpt.model import MiniGPT` works as before; the names below are looked up on first use, so
importing `minigpt.model.stages` loads no torch.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "MiniGPT": "gpt",
    "Block": "gpt",
    "DTYPES": "gpt",
    "ContextTooLongError": "reading",
    "TokenOutOfRangeError": "gpt",
    "check_context": "reading",
    "Reading": "reading",
    "check_token_ids": "gpt",
    "LayerNorm": "layers",
    "RMSNorm": "layers",
    "CausalSelfAttention": "layers",
    "FeedForward": "layers",
    "ResidualShapeError": "layers",
    "residual": "layers",
    "Recorder": "recorder",
    "UnknownStageError": "recorder",
    "KVCache": "cache",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
