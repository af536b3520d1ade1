"""Whether anyone is listening to a model through PyTorch's hooks.

Sampling past the position table runs a folded copy of the model (fold.py), which no user holds:
a hook registered on the user's model would not see those passes, and one copied onto the folded
model would see activations the user's model never computes (plain norms, folded matrices). So a
model with hooks is sampled as it is, and `hooked` is how sampling knows.

PyTorch has no public way to ask which hooks a module holds; the answer lives in nn.Module's own
attributes (one dict per kind on every module) and in module-level dicts for the hooks registered
on every module (`torch.nn.modules.module.register_module_forward_hook`). This module is the one
place minigpt reads them; tests/test_hooks.py fails, naming the attribute, if torch renames one.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules import module as torch_module

# The per-module dicts of forward hooks and forward pre-hooks, and their global counterparts.
MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks")
GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks")


def hooked(model: nn.Module) -> bool:
    """True when a forward hook or pre-hook would fire on `model` or any of its submodules."""
    if any(getattr(torch_module, name) for name in GLOBAL_HOOKS):
        return True
    return any(getattr(module, name) for module in model.modules() for name in MODULE_HOOKS)
