"""Exercise rope: rotary positions (Su et al. 2021, RoFormer), in the half-split layout of Hugging
Face's Llama that minigpt uses (minigpt/model/positions.py).

Implement, keeping this name and signature:

    apply_rope(q, k, v, start, theta) -> (q, k, v)
        q [B, H, T, d], k and v [B, K, T, d]: the queries, keys and values of the positions
        start .. start + T - 1 of one attention (start > 0 under a KV cache: the positions
        before are cached, turned when they were new), returned with every query and key row
        turned by its position t, the values as they are:
            pair i = coordinates i and i + d/2 (the half-split layout), i = 0 .. d/2 - 1
            inv_freq_i = theta^(-2i/d)            (radians per position)
            rotated    = x cos(t inv_freq) + rotate_half(x) sin(t inv_freq),
            rotate_half([x1, x2]) = [-x2, x1]     (x1, x2: the two halves of the row)
        with the angle of pair i at coordinates i and i + d/2 both. Then q_m . k_n depends on the
        distance m - n alone.

This starter turns the pairs of the RoFormer paper's own layout, coordinates 2i and 2i + 1: a rope
too, but not the one minigpt's (and Llama's) weights were trained with. Make every tensor you
create on q's device and in q's dtype (torch.arange(..., device=q.device, dtype=q.dtype)).

Check your file with

    minigpt exercise check rope

Each failing check names one mistake. Once every check passes, train a model whose every attention
turns its queries and keys with your apply_rope:

    minigpt train --exercise rope
"""

import torch


def apply_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, theta: float):
    T, d = q.shape[-2], q.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=q.device, dtype=q.dtype) / d)  # [d/2]
    t = torch.arange(start, start + T, device=q.device, dtype=q.dtype)  # the positions
    angles = t[:, None] * inv_freq[None, :]  # [T, d/2]
    cos, sin = angles.cos(), angles.sin()

    def turn(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0::2], x[..., 1::2]  # pair i: coordinates 2i and 2i + 1
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    return turn(q), turn(k), v
