"""Exercise attention_residual: the softmax over depth of Attention Residuals (Kimi Team, arXiv
2603.15031), as minigpt computes it (minigpt/model/depth.py).

With Attention Residuals a sublayer does not read the sum of everything before it: it reads a mix
of the embedding v_0 and the earlier layers' outputs v_1 .. v_{S-1}, weighted by a softmax over
depth. Implement one layer's read, keeping these names and signatures:

    class DepthAttention(nn.Module)
        __init__(self, width, eps)   given below: the layer's pseudo-query w, `self.query` [width],
                                     starting at zeros, so that a fresh layer reads the plain
                                     average of its sources (keep the name: a run's checkpoint
                                     stores blocks.0.depth1.query, ..., final_depth.query)
        forward(self, sources)       sources [S, B, T, C]: v_0, v_1, ..., stacked -> h [B, T, C]:
                                         key_i   = RMSNorm(v_i) = v_i / sqrt(mean(v_i^2) + eps)
                                                   (over the last axis, without a gain)
                                         alpha_i = softmax over the S sources of w . key_i
                                         h       = sum_i alpha_i v_i     (the sources themselves)

This starter scores each source by w . v_i itself, the key norm left out: the paper normalises the
keys so that a source whose outputs are larger does not outweigh the others whatever w says. Check
your file with

    minigpt exercise check attention_residual

Each failing check names one mistake. Once every check passes, train a model whose every read over
depth is yours:

    minigpt train --exercise attention_residual
"""

import torch
from torch import nn


class DepthAttention(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.zeros(width))  # w: zeros, a uniform start

    def forward(self, sources: torch.Tensor) -> torch.Tensor:
        logits = sources @ self.query  # [S, B, T]: w . v_i
        alpha = torch.softmax(logits, dim=0)  # over the sources
        return (alpha.unsqueeze(-1) * sources).sum(dim=0)  # [B, T, C]
