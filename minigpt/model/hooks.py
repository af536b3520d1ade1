"""Whether anyone is listening to a model through PyTorch's hooks.

Sampling past the position table runs a folded copy of the model (fold.py), which no user holds:
a hook registered on the user's model would not see those passes, and one copied onto the folded
model would see activations the user's model never computes (plain norms, folded matrices). So a
model with hooks is sampled as it is, and `hooked` is how sampling knows (torch has no public way
to ask: torch_private.py reads it).
"""

from __future__ import annotations

from torch import nn

from ..torch_private import has_forward_hooks, has_global_forward_hooks


def hooked(model: nn.Module) -> bool:
    """True when a forward hook or pre-hook would fire on `model` or any of its submodules."""
    return has_global_forward_hooks() or any(has_forward_hooks(module) for module in model.modules())
