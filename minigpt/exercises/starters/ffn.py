"""Exercise ffn: the position-wise FFN (chapter 17.4, "Compute new combinations inside each position").

Implement, keeping these names and signatures:

    class FeedForward(nn.Module)
        __init__(self, width, hidden, bias=True)
                                     given below: W1 maps width C to hidden F, W2 maps F back to C
                                     (keep the names: a run's checkpoint stores blocks.0.ffn.W1.weight, ...)
        forward(self, x)             x [B, T, C] -> [B, T, C]:
                                         FFN(x) = ReLU(x W1 + b1) W2 + b2
                                     the same weights at every position, each position by itself

Call the two Linear layers as modules, self.W1(x) and self.W2(hidden): a trace records `hidden`
where it enters W2. The chapter's example: with its W1 and W2 and zero biases, [-1, 1] becomes
[-1, 2, 1], then [0, 2, 1] after ReLU, then [1, 1].

Check your file with

    minigpt exercise check ffn

Each failing check names one mistake. Once every check passes, train a model whose every FFN is
yours:

    minigpt train --exercise ffn
"""

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int, bias: bool = True):
        super().__init__()
        self.W1 = nn.Linear(width, hidden, bias=bias)  # x W1 + b1: C -> F
        self.W2 = nn.Linear(hidden, width, bias=bias)  # hidden W2 + b2: F -> C

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.relu(self.W1(x))
        return hidden
