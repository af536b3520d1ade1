"""A correct solution of the attention_residual exercise."""

import torch
from torch import nn


class DepthAttention(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.zeros(width))

    def forward(self, sources: torch.Tensor) -> torch.Tensor:
        keys = sources * torch.rsqrt(sources.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        alpha = torch.softmax(keys @ self.query, dim=0)  # [S, B, T]
        return (alpha.unsqueeze(-1) * sources).sum(dim=0)
