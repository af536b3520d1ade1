"""Folding the norms: a weight transform, so that sampling can run a cheaper model through the one
forward pass (model.py) instead of a second implementation of it.

A pre-norm block only ever reads a norm's output through one matrix, so the norm's learned gain g
and bias beta can move into that matrix (TransformerLens's `fold_ln`). Row vectors as in model.py,
with `n` the plain norm (no gain, no bias) and a Linear's weight stored as [out, in]:

    LN(x) W + b  =  (n g + beta) W + b  =  n (diag(g) W) + (beta W + b)

    norm1 -> qkv        norm2 -> W1        final_norm -> head (a tied head becomes an untied copy)

`fold_norms(model)` returns a new MiniGPT running the same forward, whose norms are plain and
whose matrices carry what they held (each stored [in, out] in memory, the layout a row-vector
product reads fastest); the original is untouched. The copy is sampling's own, a model no user
holds, so no hook can be on it: its modules are called straight through their `forward`, without
nn.Module's hook machinery (a cost on every call, dozens of calls a token), and its Linears
read their weight and bias from where nn.Module keeps them rather than through its attribute
lookup (`lean`). The user's model is always called through `__call__`, so its hooks fire. Every folded value
is computed in float64 on the CPU (where every device's weights can be, MPS has no float64) and
rounded once to the model's dtype, so the two models agree up to that dtype's rounding
(tests/test_fold.py states the tolerance). RMSNorm's gain folds the same way (it has no bias).
The [model] switches fold too: `norm = "none"` has no gain to fold (its identities stay), a block
without an FFN has no norm2, and neither the position table nor the residual add holds a norm.

What does not fold: post-norm (chapter 17.6), where LN1's output is read by the FFN and by the
second residual add, and LN2's output is the stream itself, read by the next block and its
residual; no single matrix reads either. `unfoldable(model)` says why, and callers (sampling) then
run the model itself.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import MinigptError
from . import lora
from .gpt import MiniGPT
from .layers import NoNorm, make_norm


def unfoldable(model: MiniGPT) -> str | None:
    """Why `fold_norms` cannot fold this model, or None when it can."""
    if type(model) is not MiniGPT:  # a subclass may read its norms some other way
        return f"{type(model).__name__} is not a MiniGPT; only MiniGPT's own blocks are known to fold"
    if model.parts is not None:  # a learner's module (an exercise) runs as it is written, never replaced
        return "it runs a learner's module (an exercise), which is run as written, not replaced by a plain norm"
    if model.cfg.norm_position != "pre":
        return (
            "a post-norm block's norms are not read by one matrix each (LN2's output is the residual "
            "stream itself), so their gains cannot be folded into one"
        )
    return None


def fold_norms(model: MiniGPT) -> MiniGPT:
    """A new MiniGPT computing what `model` computes, with every norm plain and its gain and bias
    folded into the matrix that reads it; built from the weights as they are now (a snapshot: fold
    again after training). Same device, dtype and train/eval mode as `model`; no gradients. A model
    with LoRA adapters (a LoRA run's samples while it trains) is folded as its merged copy."""
    if lora.has_adapters(model):
        model = lora.merged(model)
    reason = unfoldable(model)
    if reason is not None:
        raise MinigptError("cannot fold this model's norms: {reason}", reason=reason)
    dtype, device = model.head.weight.dtype, model.head.weight.device
    folded = copy.deepcopy(model)  # the same class and modules; every changed weight is replaced below
    folded.cfg = replace(model.cfg, tie_embeddings=False)  # the head gets its own folded matrix
    with torch.no_grad():
        for block, source in zip(folded.blocks, model.blocks):
            block.norm1 = _fold(source.norm1, source.attention.qkv, block.attention.qkv, folded.cfg)
            if hasattr(source, "ffn"):  # ffn_hidden = 0: no norm2, nothing reads one
                block.norm2 = _fold(source.norm2, source.ffn.W1, block.ffn.W1, folded.cfg)
        folded.head.weight = nn.Parameter(torch.empty_like(model.head.weight))  # untied from the token table
        folded.final_norm = _fold(model.final_norm, model.head, folded.head, folded.cfg)
        folded = folded.to(device, dtype)
        for linear in folded.modules():
            if isinstance(linear, nn.Linear):
                # The same [out, in] matrix stored as [in, out]: `x W` then reads W row by row and
                # the BLAS multiplies a single row by it as it lies, faster than through a transpose.
                linear.weight = nn.Parameter(linear.weight.T.contiguous().T)
    return lean(folded.requires_grad_(False))


def lean(model: nn.Module, linear: Callable[[nn.Linear, Tensor], Tensor] | None = None) -> nn.Module:
    """`model` (in place) with every module of it called straight through its own `forward`, its
    hooks never consulted: only for a model nobody else holds. `linear`: what a Linear computes
    instead of F.linear on its parameters (the decoding copy's bfloat16 product)."""
    classes: dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        if cls not in classes:
            classes[cls] = _lean_class(cls, linear or _linear)
        module.__class__ = classes[cls]
    return model


def _lean_class(cls: type, linear: Callable[[nn.Linear, Tensor], Tensor]) -> type:
    """`cls` itself, but called without nn.Module's hook machinery (a Linear: `linear`, by default
    F.linear on its own parameters). The forward that runs is `cls`'s own, as it is when the copy
    is made: nothing is computed another way."""
    forward = linear if issubclass(cls, nn.Linear) else cls.forward
    # `module(x)` is then `forward(module, x)`: not even a frame between the call and the forward
    body = {"__call__": forward, "forward": forward, "lean": True}
    return type(cls.__name__, (cls,), {**body, "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def _linear(self, x: Tensor) -> Tensor:
    parameters = self._parameters
    return F.linear(x, parameters["weight"], parameters["bias"])


def _fold(norm: nn.Module, reader: nn.Linear, target: nn.Linear, cfg) -> nn.Module:
    """Write `reader(norm(x))`'s folded matrix and bias into `target` (the folded model's copy of
    `reader`); return the plain norm that takes `norm`'s place. `norm = "none"` has nothing to fold:
    the identity stays and `target` keeps `reader`'s matrix as it is."""
    if isinstance(norm, NoNorm):
        target.weight.copy_(reader.weight.detach())  # the head, untied above, gets the token table's copy
        return norm
    matrix = _wide(reader.weight)  # [out, in]
    weight = matrix * _wide(norm.weight)[None, :]  # W diag(g), as [out, in]
    bias = _wide(reader.bias)
    if getattr(norm, "bias", None) is not None:
        shift = matrix @ _wide(norm.bias)  # beta W, as [out]
        bias = shift if bias is None else bias + shift
    target.weight.copy_(weight.to(target.weight.dtype))  # the one rounding
    if bias is not None:
        if target.bias is None:  # the head has no bias of its own: final_norm's beta becomes one
            target.bias = nn.Parameter(torch.empty(bias.shape, dtype=target.weight.dtype, device=target.weight.device))
        target.bias.copy_(bias.to(target.bias.dtype))
    return make_norm(cfg, affine=False)  # no tensors of its own


def _wide(t: Tensor | None) -> Tensor | None:
    """float64 on the CPU: every product and sum of the fold is computed there."""
    return None if t is None else t.detach().to("cpu", torch.float64)
