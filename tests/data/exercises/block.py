"""A correct solution of the block exercise."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, norm1: nn.Module, attention: nn.Module, norm2: nn.Module, ffn: nn.Module):
        super().__init__()
        self.norm1, self.attention, self.norm2, self.ffn = norm1, attention, norm2, ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual1 = x + self.attention(self.norm1(x))
        return residual1 + self.ffn(self.norm2(residual1))
