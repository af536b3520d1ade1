"""Checkpoint files: what a checkpoint holds, writing one atomically, and reading one back.

Checkpoints load with `weights_only=True`: a checkpoint can hold tensors and plain values, never
code. The [model] section is stored with the weights, so a model is always built from what it was
trained as, never from a config that merely names the run.
"""

from __future__ import annotations

import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .. import failpoints
from ..config import Config
from ..errors import MinigptError
from ..io import atomic_write
from ..model import lora
from ..model.gpt import MiniGPT
from .layout import FORMAT_VERSION

# ---------------------------------------------------------------- checkpoints


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    # Streamed into the temporary file, not serialised in memory first: an imported 1B model would
    # otherwise be held twice. torch.save passes the file's own OSError on ("No space left on device").
    # The failpoint lets a test kill or fail the write here: the temporary file written, not yet renamed.
    atomic_write(path, lambda f: (torch.save(payload, f), failpoints.reach("checkpoint-write")), binary=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MinigptError("no checkpoint at {path}; train a run there first", path=path)
    try:
        # mmap: tensors are read from the file when used, so a reader that needs the model alone
        # never reads the optimizer state (twice the model's size) off the disk.
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError):
        # torch's own message suggests weights_only=False, which would let the file run code: not shown.
        raise MinigptError(
            "checkpoint {path} could not be loaded as plain tensors and values; it is damaged, truncated or "
            "not a minigpt checkpoint: retrain, or restore it",
            path=path,
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise MinigptError(
            "checkpoint {path} is not a minigpt checkpoint of format {FORMAT_VERSION}",
            path=path,
            FORMAT_VERSION=FORMAT_VERSION,
        )
    return payload


def model_payload(cfg: Config, model: MiniGPT, tokenizer_size: int | None = None) -> dict[str, Any]:
    """What any checkpoint holds; training adds optimizer, step, RNG states and hashes.
    `tokenizer_size`: the ids the tokenizer writes, when fewer than the model's rows (see state_payload).
    A model with LoRA adapters stores the adapters alone, and under "lora" their settings and the
    base checkpoint they adapt (its run folder, which checkpoint, its sha256): never a second copy
    of the base."""
    if lora.has_adapters(model):
        payload = state_payload(cfg, lora.adapter_state(model), model.vocab_size, tokenizer_size)
        payload["lora"] = dict(model.lora_settings)
        return payload
    payload = state_payload(cfg, model.state_dict(), model.vocab_size, tokenizer_size)
    if model.parts is not None:  # a learner's module: its file (name, path, sha256, source), read back by reading.py
        payload["exercise"] = dict(model.parts.source)
    return payload


def state_payload(
    cfg: Config,
    state: dict[str, torch.Tensor],
    vocab_size: int,
    tokenizer_size: int | None = None,
    origin: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint of parameters that need not be in a model yet (an imported model's).

    `tokenizer_size`: how many ids the tokenizer writes, stored only when it is fewer than the
    model's `vocab_size` rows (a padded vocabulary: nanoGPT's 50,304 rows for GPT-2's 50,257 ids);
    the rows past it are kept exact and never sampled. `origin`: where the weights came from (also
    written beside the checkpoint as origin.json)."""
    payload = {"format": FORMAT_VERSION, "model": state, "model_config": asdict(cfg.model), "vocab_size": vocab_size}
    if tokenizer_size is not None and tokenizer_size != vocab_size:
        payload["tokenizer_size"] = tokenizer_size
    if origin is not None:
        payload["origin"] = origin
    return payload


def tokenizer_size(payload: dict[str, Any]) -> int:
    """The ids a checkpoint's tokenizer writes: all its rows unless it was stored padded."""
    return payload.get("tokenizer_size", payload["vocab_size"])
