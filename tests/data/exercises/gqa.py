"""A correct solution of the gqa exercise."""

import math

import torch
from torch import nn


class GroupedQueryAttention(nn.Module):
    def __init__(self, width: int, heads: int, kv_heads: int, bias: bool = True):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        d = width // heads
        self.qkv = nn.Linear(width, (heads + 2 * kv_heads) * d, bias=bias)  # W_Q | W_K | W_V
        self.out = nn.Linear(width, width, bias=bias)  # W_O

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        B, T, C = x.shape
        H, K = self.heads, self.kv_heads
        d = C // H
        q, k, v = self.qkv(x).split((H * d, K * d, K * d), dim=-1)
        q = q.view(B, T, H, d).transpose(1, 2)  # [B, H, T, d]
        k, v = (t.view(B, T, K, d).transpose(1, 2) for t in (k, v))  # [B, K, T, d]
        if cache is not None:
            k, v = cache.extend(k, v)  # every position so far: [B, K, S, d]
        k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)  # [B, H, S, d]
        S = k.shape[2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # [B, H, T, S]
        later = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)  # the queries are the last T
        weights = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1)
        joined = (weights @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(joined)
