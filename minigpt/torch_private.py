"""The private parts of torch that minigpt reads, kept here alone, each because torch offers no
public way to the same answer, so that a torch which changes one breaks this small module and one
test (tests/test_torch_private.py), which say so by name.

- Muon's learning-rate scale per matrix shape. torch.optim.Muon scales its learning rate by each
  matrix's shape (`adjust_lr_fn`: "original", Keller Jordan's sqrt(max(1, A/B)), or
  "match_rms_adamw", Moonshot's 0.2 sqrt(max(A, B)), as its docstring gives them), but offers that
  scale only inside Muon.step: `adjust_lr_fn` takes one of those two names, not a function, and no
  public function returns the scale. BatchedMuon (training/optimizers.py) steps many matrices in
  one batched update and has to scale each one exactly as torch.optim.Muon does, so it calls
  torch's own function rather than a copy that could drift from the optimizer it must equal.
- The CPU's bfloat16 instructions. `torch.backends.cpu.get_cpu_capability()` names the widest
  vector unit only ("AVX512"), not whether it has AVX-512 BF16 or AMX, which decide whether
  bfloat16 matmuls are native (device.py's precision = "auto").
- Which forward hooks a module holds. nn.Module keeps them in a dict per module (and torch in
  module-level dicts for the hooks on every module); nothing public lists them, and sampling must
  know whether anyone listens (model/hooks.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as torch_module

MUON_SCALE = "torch.optim._muon._adjust_lr"
CPU_CAPABILITY = "torch._C._cpu._get_cpu_capability"
# The per-module dicts of forward hooks and pre-hooks, and their counterparts for every module.
MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def muon_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The learning rate torch.optim.Muon steps a matrix of `shape` with: `lr` scaled as `adjust_lr_fn` says."""
    try:
        from torch.optim._muon import _adjust_lr
    except ImportError as exc:  # a torch that moved or removed it
        raise ImportError(
            f"minigpt's Muon needs {MUON_SCALE}, which torch {torch.__version__} does not have; "
            f"reinstall minigpt so that pip picks a torch its dependencies admit"
        ) from exc
    return _adjust_lr(lr, adjust_lr_fn, shape)


def cpu_flags() -> dict[str, bool] | None:
    """The CPU's instruction-set flags as torch sees them ({"avx512_bf16": True, ...}), or None
    where this torch does not say."""
    capability = getattr(torch._C._cpu, CPU_CAPABILITY.rpartition(".")[2], None)
    return capability() if capability is not None else None


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether `module` itself holds a forward hook or pre-hook."""
    return any(getattr(module, name) for name in MODULE_HOOKS)


def has_global_forward_hooks() -> bool:
    """Whether a forward hook or pre-hook is registered on every module."""
    return any(getattr(torch_module, name) for name in GLOBAL_HOOKS)
