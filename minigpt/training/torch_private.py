"""The private part of torch that minigpt uses, kept here alone so that a torch which changes it
breaks one small module and one test (tests/test_torch_private.py), which say so by name.

torch.optim.Muon scales its learning rate by each matrix's shape (`adjust_lr_fn`: "original",
Keller Jordan's sqrt(max(1, A/B)), or "match_rms_adamw", Moonshot's 0.2 sqrt(max(A, B)), as its
docstring gives them), but torch offers that scale only inside Muon.step: `adjust_lr_fn` takes one
of those two names, not a function, and no public function returns the scale. BatchedMuon
(optimizers.py) steps many matrices in one batched update and has to scale each one exactly as
torch.optim.Muon does, so it calls torch's own function rather than a copy that could drift from
the optimizer it must equal.
"""

from __future__ import annotations

import torch

try:
    from torch.optim._muon import _adjust_lr
except ImportError as exc:  # a torch that moved or removed it
    raise ImportError(
        f"minigpt's Muon needs torch.optim._muon._adjust_lr, which torch {torch.__version__} does not have; "
        f"reinstall minigpt so that pip picks a torch its dependencies admit"
    ) from exc


def muon_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The learning rate torch.optim.Muon steps a matrix of `shape` with: `lr` scaled as `adjust_lr_fn` says."""
    return _adjust_lr(lr, adjust_lr_fn, shape)
