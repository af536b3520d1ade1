"""Exercise swiglu: the SwiGLU MLP (lesson 09, "SwiGLU makes a gated MLP update").

Implement, keeping these names and signatures:

    class SwiGLU(nn.Module)
        __init__(self, width, hidden, bias=True)
                                     given below: `self.W1` holds the gate and value projections side
                                     by side (n W1 = [gate | value], the gate first, F columns each),
                                     `self.W2` is the down projection W_down (keep the names: a run's
                                     checkpoint stores blocks.0.ffn.W1.weight, ...)
        forward(self, n)             n [B, T, C] -> [B, T, C]:
                                         gate, value = the two F-wide halves of self.W1(n)
                                         hidden      = SiLU(gate) * value      (SiLU(s) = s * sigmoid(s))
                                         update      = self.W2(hidden)         (back to width C)

Call the two Linear layers as modules, self.W1(n) and self.W2(hidden): a trace records `hidden`
where it enters W2. The lesson's one-component example: a gate of 0 passes nothing, SiLU(0) = 0,
whatever the value.

Check your file with

    minigpt exercise check swiglu

Each failing check names one mistake. Once every check passes, train a model whose every FFN is
your SwiGLU:

    minigpt train --exercise swiglu
"""

import torch
import torch.nn.functional as F  # noqa: F401 (F.silu is yours to call)
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int, bias: bool = True):
        super().__init__()
        self.W1 = nn.Linear(width, 2 * hidden, bias=bias)  # [W_gate | W_value]: C -> 2F
        self.W2 = nn.Linear(hidden, width, bias=bias)  # W_down: F -> C

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("SwiGLU.forward: gate, value = halves of self.W1(n); SiLU(gate) * value; self.W2")
