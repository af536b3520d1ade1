"""Exercise block: the pre-norm block (chapter 17.5, "Follow one complete pre-norm block"; Table 17.1).

Implement, keeping these names and signatures:

    class Block(nn.Module)
        __init__(self, norm1, attention, norm2, ffn)
                                     given below: the four parts, each a module from [B, T, C] to
                                     [B, T, C], kept under these names (a run's checkpoint stores
                                     blocks.0.norm1.weight, blocks.0.attention.qkv.weight, ...)
        forward(self, x)             x [B, T, C] -> Y [B, T, C], pre-norm:
                                         N1 = norm1(X);  U = attention(N1);  R = X + U
                                         N2 = norm2(R);  Y = R + ffn(N2)

The check runs your block on chapter 17's own weights: Table 17.1 is the test (the first position's
Y row is [1.999980, 2.999940]).

This starter normalises the stream itself. Check your file with

    minigpt exercise check block

Each failing check names one mistake. Once every check passes, train a model whose every block is
yours (minigpt's norms, attention and FFN, wired by your forward):

    minigpt train --exercise block
"""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, norm1: nn.Module, attention: nn.Module, norm2: nn.Module, ffn: nn.Module):
        super().__init__()
        self.norm1, self.attention, self.norm2, self.ffn = norm1, attention, norm2, ffn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x)
        x = x + self.attention(x)
        x = self.norm2(x)
        return x + self.ffn(x)
