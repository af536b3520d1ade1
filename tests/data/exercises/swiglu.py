"""A correct solution of the swiglu exercise."""

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int, bias: bool = True):
        super().__init__()
        self.W1 = nn.Linear(width, 2 * hidden, bias=bias)
        self.W2 = nn.Linear(hidden, width, bias=bias)

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        gate, value = self.W1(n).chunk(2, dim=-1)
        return self.W2(F.silu(gate) * value)
