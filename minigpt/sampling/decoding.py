"""The KV-cache steps' own copy of a model: the same model with every matrix stored the other way
round in memory, called without nn.Module's hook machinery.

A cached step multiplies one row by every matrix of the model, so on a CPU it is a walk through
memory: a 135M-parameter model reads 540 MB of float32 per token, and the time goes to reading
them. nn.Linear keeps W as [out, in] and computes x W^T; the BLAS multiplies a single row by a
transposed matrix markedly slower than by one stored [in, out], which it reads as it lies (about
1.3x on the matrices of a SmolLM-shaped model here; scripts/bench.py --only llama measures it).
So the copy holds each Linear's weight as W^T made contiguous and viewed back as W: the same
[out, in] tensor, the same values, another layout (model/fold.py stores its folded matrices the
same way). Nothing else is copied: the token table, norms and biases are the model's own, and a
tied head gets the new layout for itself (the token table keeps the old one for its lookups).

The products are the same sums taken in another order, so a logit can differ from the model's own
in its last bits (float32: about 1e-6 relative): what float32 rounding allows, as with the folded
copy past the table. `decodable(model)` says why a model is sampled as it is instead: hooks that
must fire, a learner's modules, LoRA adapters (a LoRALinear's update is not in its weight), a
device other than the CPU (where the layouts run alike), or too little free memory for a second
copy of the matrices. The copy is made once per Generation, from the weights as they are then.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..device import available_memory
from ..errors import MinigptError
from ..model import lora
from ..model.fold import lean
from ..model.gpt import MiniGPT
from ..model.hooks import hooked

# The cached steps a copy must serve to pay for itself twice over. Making it writes every matrix
# once, transposed, into fresh memory: 0.5 s for GPT-2 small's shape and 0.7 s for SmolLM2-135M's
# here, which then save 8 and 15 ms a step (break-even at about 70 and 45 steps); 4 blocks of
# width 128 copy in 6 ms and save 0.2 ms a step (about 30).
WORTH_STEPS = 128


def laid_out(weight: torch.Tensor) -> bool:
    """Whether an [out, in] weight is already stored [in, out] (as the decoding copy stores it)."""
    return weight.dim() == 2 and weight.stride() == (1, weight.shape[0])


def matrix_bytes(model: nn.Module) -> int:
    """The bytes the copy allocates: every Linear's weight not yet laid out, counted once (a tied
    head is the table's)."""
    seen = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    return sum(w.numel() * w.element_size() for w in seen.values() if not laid_out(w))


def decodable(model: nn.Module) -> str | None:
    """Why the cached steps run `model` itself rather than a decoding copy, or None when they may."""
    if hooked(model):
        return "hooks are registered on it, and they see every pass"
    if type(model) is not MiniGPT or model.parts is not None:
        return "it runs modules other than MiniGPT's own (a subclass, or a learner's exercise)"
    if lora.has_adapters(model):
        return "it has LoRA adapters, whose update is not in the Linear's weight"
    if model.head.weight.device.type != "cpu":
        return "it is not on the CPU, where the layout of a matrix decides the speed of a one-row product"
    free = available_memory("cpu")
    if free is not None and 2 * matrix_bytes(model) > free:
        return "a second copy of its matrices would take more than half the free memory"
    return None


def decoding_copy(model: MiniGPT, dtype: torch.dtype | None = None) -> MiniGPT:
    """A copy of `model` computing the same forward, each Linear's weight stored [in, out] (as the
    [out, in] view of that), everything else shared, called without hooks (fold.lean). Same
    device, dtype and mode; the new weights take no gradients (the shared parameters are untouched).
    `dtype` (bfloat16, `[sample] precision`): the matrices copied in that dtype instead, as [out, in]
    (where the one-row bfloat16 product runs faster), each product taken in it and its result
    widened back (`_narrow_linear`): half the bytes a step reads, other numbers than the model's."""
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        relaid = {}  # one new matrix per distinct weight (a tied head's is the table's: copied for the head)
        for _, m in linears:
            w = m.weight
            if id(w) in relaid:
                continue
            if dtype is not None:
                relaid[id(w)] = nn.Parameter(w.detach().to(dtype).contiguous(), requires_grad=False)
            else:  # one stored that way already is shared, not copied
                relaid[id(w)] = w if laid_out(w) else nn.Parameter(w.detach().T.contiguous().T, requires_grad=False)
    # deepcopy finds every parameter in its memo, so nothing is copied: the Linears' weights are
    # the model's own until replaced below, and the token table keeps its row layout for lookups
    decoder = copy.deepcopy(model, {id(p): p for p in model.parameters()})
    for name, m in linears:
        decoder.get_submodule(name).weight = relaid[id(m.weight)]
    return lean(decoder, None if dtype is None else _narrow_linear)


def _narrow_linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x W^T + b with W in a narrower dtype than x: the product in W's dtype, widened back, then
    the bias (kept in the model's dtype) added."""
    parameters = self._parameters
    weight, bias = parameters["weight"], parameters["bias"]
    y = F.linear(x.to(weight.dtype), weight).to(x.dtype)
    return y if bias is None else y + bias


def check_precision(model: nn.Module, precision: str) -> None:
    """`[sample] precision = "bfloat16"` runs the cached steps on a bfloat16 decoding copy: refused,
    saying why, for a model that is not float32 or that cannot be copied (`decodable`)."""
    if precision == "float32":
        return
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise MinigptError(
            '[sample] precision = "bfloat16" narrows a float32 model\'s matrices, and this model is {dtype}; '
            'leave precision = "float32" (its own numbers)',
            dtype=str(dtype).removeprefix("torch."),
        )
    why = decodable(model)
    if why is not None:
        raise MinigptError(
            '[sample] precision = "bfloat16" runs the cached steps on a bfloat16 copy of the model, which '
            'this one cannot have: {why}; leave precision = "float32"',
            why=why,
        )
