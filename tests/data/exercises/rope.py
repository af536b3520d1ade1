"""A correct solution of the rope exercise."""

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, theta: float):
    T, d = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=q.device, dtype=q.dtype) / d)
    t = torch.arange(start, start + T, device=q.device, dtype=q.dtype)
    angles = t[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v
