"""Exercise attention: causal multi-head attention (chapter 17.5's MHA: Example 16.3's heads, joined through W_O).

Implement, keeping these names and signatures:

    class CausalSelfAttention(nn.Module)
        __init__(self, width, heads, bias=True)
                                     given below: `self.qkv` holds W_Q, W_K and W_V side by side
                                     (x W_Q | x W_K | x W_V), `self.out` is W_O (keep the names: a
                                     run's checkpoint stores blocks.0.attention.qkv.weight, ...)
        forward(self, x)             x [B, T, C] -> [B, T, C]:
                                         Q, K, V = the three C-wide thirds of self.qkv(x)
                                         head h reads coordinates h*d .. (h+1)*d - 1 of each, d = C / heads
                                         weights = softmax(Q K^T / sqrt(d)) over the keys, with every key
                                                   after its query masked out (causal: no position reads
                                                   a later one)
                                         each head: weights V; the heads joined back to [B, T, C]
                                         (head h at coordinates h*d .. (h+1)*d - 1), then W_O

Call the two Linear layers as modules, self.qkv(x) and self.out(joined): a trace records each
head's values where they enter W_O. Make any tensor you create (a mask) on x's device,
torch.ones(T, T, dtype=torch.bool, device=x.device), so the model also runs on a GPU.

Check your file with

    minigpt exercise check attention

Each failing check names one mistake. Once every check passes, train a model whose every attention
is yours:

    minigpt train --exercise attention
"""

import math

import torch
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, bias: bool = True):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)  # W_Q | W_K | W_V
        self.out = nn.Linear(width, width, bias=bias)  # W_O

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        d = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=-1)  # each [B, T, C]
        q, k, v = (t.view(B, T, self.heads, d).transpose(1, 2) for t in (q, k, v))  # [B, H, T, d]
        scores = q @ k.transpose(-2, -1) / math.sqrt(C)  # [B, H, T, T]
        weights = torch.softmax(scores, dim=-1)
        mixed = weights @ v  # [B, H, T, d]
        joined = mixed.transpose(1, 2).reshape(B, T, C)
        return self.out(joined)
