"""Exercise layernorm: LayerNorm (chapter 17.3, "Normalize within one position, not across the sentence").

Implement, keeping these names and signatures:

    class LayerNorm(nn.Module)
        __init__(self, width, eps)   gamma as `self.weight` (ones) and beta as `self.bias` (zeros),
                                     each of shape [width] (keep those names: a run's checkpoint
                                     stores them as blocks.0.norm1.weight and blocks.0.norm1.bias)
        forward(self, x)             x [..., C] -> the same shape and dtype, for every row of C numbers:
                                         mu      = (x_1 + ... + x_C) / C
                                         sigma^2 = ((x_1 - mu)^2 + ... + (x_C - mu)^2) / C
                                         LN(x)_c = gamma_c (x_c - mu) / sqrt(sigma^2 + eps) + beta_c
                                     over the last axis only (each example and position by itself)

The chapter's rows, with gamma = 1, beta = 0 and eps = 0.00001: [1, 3] becomes about
[-0.999995, 0.999995] and [10, 10] becomes [0, 0].

This starter normalises with torch's standard deviation. Check your file with

    minigpt exercise check layernorm

Each failing check names one mistake. Once every check passes, train a model whose every norm is
your LayerNorm:

    minigpt train --exercise layernorm
"""

import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))  # gamma
        self.bias = nn.Parameter(torch.zeros(width))  # beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(dim=-1, keepdim=True)
        return (x - mu) / (x.std(dim=-1, keepdim=True) + self.eps)
