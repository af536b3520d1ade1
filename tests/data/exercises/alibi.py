"""A correct solution of the alibi exercise."""

import math

import torch


def _geometric(n: int) -> list[float]:
    return [2 ** (-8 * (h + 1) / n) for h in range(n)]


def alibi_slopes(n_head: int) -> torch.Tensor:
    below = 2 ** math.floor(math.log2(n_head))
    slopes = _geometric(below) + _geometric(2 * below)[0::2][: n_head - below]
    return torch.tensor(slopes, dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, T: int, S: int) -> torch.Tensor:
    i = torch.arange(S - T, S, device=slopes.device)[:, None]
    j = torch.arange(S, device=slopes.device)[None, :]
    bias = -slopes[:, None, None] * (i - j).to(slopes.dtype)
    return bias.masked_fill(j > i, float("-inf"))
