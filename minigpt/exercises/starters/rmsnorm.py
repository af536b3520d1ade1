"""Exercise rmsnorm: RMSNorm and a residual sublayer (lesson 09, "The Transformer block").

Implement, keeping these names and signatures:

    class RMSNorm(nn.Module)
        __init__(self, width, eps)   one learned gain per coordinate, `self.weight`, shape [width],
                                     starting at ones (keep that name: a run's checkpoint stores it as
                                     blocks.0.norm1.weight, ..., final_norm.weight)
        forward(self, x)             x [..., width] -> the same shape and dtype:
                                         rms(x)       = sqrt((x_1^2 + ... + x_d^2) / d + eps)
                                         RMSNorm(x)_i = weight_i * x_i / rms(x)
                                     over the last axis only, without subtracting the mean

    residual_sublayer(x, sublayer, norm)
                                     x + sublayer(norm(x)): the sublayer reads a normalised view,
                                     and its update is added to the untouched input

This starter is the lesson's: it mean-centres like LayerNorm, and it returns only the sublayer's
result. Check your file with

    minigpt exercise check rmsnorm

Each failing check names one mistake, with the input that exposes it: decide from it whether the
error is in the normalisation or in the identity path, and do not change both blindly. Once every
check passes, train a model whose every norm is your RMSNorm (and trace it):

    minigpt train --exercise rmsnorm
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))  # the gains g_i

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        rms = torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * centred / rms


def residual_sublayer(x: torch.Tensor, sublayer, norm) -> torch.Tensor:
    return sublayer(norm(x))
