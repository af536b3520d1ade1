"""Exercise alibi: ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long"),
as minigpt computes it (minigpt/model/positions.py).

Implement, keeping these names and signatures:

    alibi_slopes(n_head) -> tensor [n_head]
        head h's slope, head 0's first. For n_head a power of two, the geometric sequence
            2^(-8/n), 2^(-16/n), ..., 2^(-8)          (8 heads: 1/2, 1/4, ..., 1/256)
        For any other head count, Press et al. keep the sequence of the power of two just below it
        and take the rest from the sequence of twice that power, every other slope from its first:
            6 heads: those of 4 (2^-2, 2^-4, 2^-6, 2^-8), then 2^-1 and 2^-3 of 8's

    alibi_bias(slopes, T, S) -> tensor [n_head, T, S]
        the bias each head adds to its scaled scores, for the last T of S positions (queries at
        positions i = S - T .. S - 1: under a KV cache the first S - T are cached) reading the keys
        j = 0 .. S - 1:
            -slope_h (i - j)    where j <= i (0 for the query's own key, more negative farther back)
            -inf                where j > i  (the causal mask rides in the bias)
        in slopes' dtype, made on slopes' device

This starter's bias is right; its slopes are the geometric sequence for every head count, which is
what the paper warns works only for a power of two. Check your file with

    minigpt exercise check alibi

Each failing check names one mistake. Once every check passes, train a model whose every attention
adds your bias with your slopes:

    minigpt train --exercise alibi
"""

import torch


def alibi_slopes(n_head: int) -> torch.Tensor:
    return torch.tensor([2 ** (-8 * (h + 1) / n_head) for h in range(n_head)], dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, T: int, S: int) -> torch.Tensor:
    i = torch.arange(S - T, S, device=slopes.device)[:, None]  # the queries' positions
    j = torch.arange(S, device=slopes.device)[None, :]  # the keys'
    bias = -slopes[:, None, None] * (i - j).to(slopes.dtype)  # [H, T, S]
    return bias.masked_fill(j > i, float("-inf"))
