"""Exercise gqa: grouped-query attention (Ainslie et al. 2023, "GQA"), as minigpt's attention and
transformers' Llama compute it (minigpt/model/layers.py, `n_kv_head`).

Implement, keeping these names and signatures:

    class GroupedQueryAttention(nn.Module)
        __init__(self, width, heads, kv_heads, bias=True)
                                     given below: `self.qkv` holds W_Q (heads query heads), W_K and
                                     W_V (kv_heads heads each) side by side, d = width / heads
                                     coordinates a head; `self.out` is W_O (keep the names: a run's
                                     checkpoint stores blocks.0.attention.qkv.weight, ...)
        forward(self, x, cache=None) x [B, T, C] -> [B, T, C], causal attention in which each key and
                                     value head is shared by a group of heads / kv_heads adjacent
                                     query heads: query head h reads kv head h // (heads / kv_heads)
                                     (transformers' repeat_kv, torch.repeat_interleave)
            cache                    None, or a KV cache (minigpt/model/cache.py's LayerCache):
                                     k, v = cache.extend(k, v) stores these T positions' keys and
                                     values and returns those of every position so far, S of them,
                                     these T last. Store the kv_heads heads, not copies for each
                                     query head: that is the memory GQA saves.

This starter gives each query head the wrong key and value head (the kv heads tiled, as
torch.repeat does), and it caches the copies. Call the two Linear layers as modules, self.qkv(x)
and self.out(joined): a trace records each head where it enters W_O. Check your file with

    minigpt exercise check gqa

Each failing check names one mistake. Once every check passes, train a model whose every attention
is yours (n_kv_head = 2 unless your config sets another divisor of n_head):

    minigpt train --exercise gqa
"""

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
        k, v = k.repeat(1, H // K, 1, 1), v.repeat(1, H // K, 1, 1)  # [B, H, T, d]
        if cache is not None:
            k, v = cache.extend(k, v)  # every position so far: [B, heads, S, d]
        S = k.shape[2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # [B, H, T, S]
        later = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)  # the queries are the last T
        weights = torch.softmax(scores.masked_fill(later, float("-inf")), dim=-1)
        joined = (weights @ v).transpose(1, 2).reshape(B, T, C)
        return self.out(joined)
