"""Where a command computes: `[train] device` and `[train] threads`, read the same way by every command."""

from __future__ import annotations

import torch

from .errors import MinigptError


def pick_device(name: str) -> str:
    """`auto` -> cuda when present, then mps, else cpu; an explicit device must exist."""
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if (name == "cuda" and not cuda) or (name == "mps" and not mps):
        raise MinigptError(f"[train] device = {name!r} but this machine has no {name}; "
                           f"use --set train.device=auto (or cpu)")
    return name


def use_threads(threads: int) -> None:
    """`[train] threads`: 0 keeps torch's default (one per core)."""
    if threads:
        torch.set_num_threads(threads)
