"""The folded model: sampling's full-window recompute, the same arithmetic with less around it.

Past the position table every new token recomputes the last `context` positions through every
block (generate.py says why no cached key or value survives the window moving). That pass is all
small matmuls, so its cost is fixed by the shapes; what can go is the work around them. Built once
from a MiniGPT, in float64 and rounded to float32 once:

    LN(x) W + b = norm(x) (diag(g) W) + (beta W + b)   each LayerNorm's gain g and bias beta folded
                                                        into the matrix that reads its output
                                                        (norm1 -> qkv, norm2 -> W1, final_norm ->
                                                        head), so a norm is a bare F.layer_norm
    (x W_Q + b_Q) / sqrt(d)                             1/sqrt(d) folded into W_Q's columns and b_Q
    x W + b                                             one torch.addmm on a pre-transposed W
    causal mask                                         prebuilt, added by the scores' baddbmm

and only the rows sampling reads: the last block's query, W_O, residual and FFN run for the last
position alone (its keys and values still come from every row), and so do the final norm and the
head. Row vectors as in model.py: a Linear's weight is [out, in], so `x @ W` is `x @ weight.T`.

The result is the same model up to float32 rounding (tests/test_fastpath.py states the tolerance).
Eager on purpose: torch.jit.trace of this forward (fixed [1, context] shape, with or without freeze)
measured no clear gain over it on one CPU thread, and tracing is deprecated in torch 2.x.
Inference only: no recorder, no cache, no dropout, no autograd. `supports(model)` says when it
applies; everywhere else sampling calls the model itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import MiniGPT, check_context

# The forward pass this module folds. A model whose forward has since been replaced (a subclass,
# a test's spy or scripted scores) computes something else, and sampling must call that instead.
_FOLDED_FORWARD = MiniGPT.forward


def supports(model: MiniGPT) -> bool:
    """Whether FoldedModel(model) computes what model(ids, last_only=True) does: pre-norm LayerNorm
    in float32 (any activation, bias or not, tied or untied head), no active dropout, and the
    forward pass this module copies."""
    cfg = model.cfg
    return (
        cfg.norm == "layernorm"
        and cfg.norm_position == "pre"
        and all(p.dtype == torch.float32 for p in model.parameters())
        and not (model.training and cfg.dropout > 0)
        and type(model).forward is _FOLDED_FORWARD
        and "forward" not in vars(model)
    )


@dataclass
class FoldedBlock:
    """One block's matrices, transposed to [in, out] for torch.addmm; a bias is None when the
    model has none (bias = false folds to no bias: the norm has no beta either)."""

    qkv: Tensor  # [C, 3C]: norm1's gain folded in, W_Q's columns scaled by 1/sqrt(d)
    qkv_bias: Tensor | None  # [3C]: b + beta W, b_Q scaled by 1/sqrt(d)
    out: Tensor  # [C, C]: W_O
    out_bias: Tensor | None
    w1: Tensor  # [C, F] or [C, 2F] (swiglu): norm2's gain folded in
    b1: Tensor | None
    w2: Tensor  # [F, C]
    b2: Tensor | None


def _fold_norm(norm, linear) -> tuple[Tensor, Tensor | None]:
    """linear(norm(x)) as one matrix on the bare norm: weight [out, in] and bias [out], in float64.
    LN(x) = n g + beta, so n g W^T + beta W^T + b = n (W diag(g))^T + (W beta + b)."""
    weight = _wide(linear.weight) * _wide(norm.weight)[None, :]
    bias = _wide(linear.bias)
    if norm.bias is not None:
        shift = _wide(linear.weight) @ _wide(norm.bias)
        bias = shift if bias is None else bias + shift
    return weight, bias


def _wide(t: Tensor | None) -> Tensor | None:
    """float64 on the CPU, where every device's weights can be folded (MPS has no float64)."""
    return None if t is None else t.detach().to("cpu", torch.float64)


def _linear(x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _residual_linear(stream: Tensor, x: Tensor, weight_t: Tensor, bias: Tensor | None) -> Tensor:
    """stream + (x W + b) as one addmm: the residual add rides in the matmul's accumulator."""
    return torch.addmm(stream if bias is None else stream + bias, x, weight_t)


class FoldedModel:
    """ids [B, T] (T <= context) -> logits [B, V] of the last position: model(ids, last_only=True)
    up to float32 rounding. Built from the model's current weights; rebuild after they change."""

    def __init__(self, model: MiniGPT):
        if not supports(model):
            raise ValueError(
                "FoldedModel needs a float32 pre-norm LayerNorm MiniGPT with MiniGPT's own "
                "forward and no active dropout; check fastpath.supports(model) first"
            )
        cfg = model.cfg
        device = model.head.weight.device
        self.context, self.n_head, self.width = cfg.context, cfg.n_head, cfg.n_embd
        self.head_width = cfg.n_embd // cfg.n_head
        self.eps, self.activation = cfg.norm_eps, cfg.activation

        def narrow(t: Tensor | None) -> Tensor | None:  # the one rounding to float32
            return None if t is None else t.to(device, torch.float32).contiguous()

        with torch.no_grad():
            self.token_table = narrow(_wide(model.token_table.weight))  # [V, C]
            self.position_table = narrow(_wide(model.position_table.weight))  # [context, C]
            query_scale = torch.ones(3 * cfg.n_embd, dtype=torch.float64)
            query_scale[: cfg.n_embd] = 1.0 / math.sqrt(self.head_width)  # W_Q's outputs only
            self.blocks: list[FoldedBlock] = []
            for block in model.blocks:
                qkv, qkv_bias = _fold_norm(block.norm1, block.attention.qkv)
                qkv = qkv * query_scale[:, None]
                qkv_bias = None if qkv_bias is None else qkv_bias * query_scale
                w1, b1 = _fold_norm(block.norm2, block.ffn.W1)
                self.blocks.append(
                    FoldedBlock(
                        narrow(qkv.T),
                        narrow(qkv_bias),
                        narrow(_wide(block.attention.out.weight).T),
                        narrow(_wide(block.attention.out.bias)),
                        narrow(w1.T),
                        narrow(b1),
                        narrow(_wide(block.ffn.W2.weight).T),
                        narrow(_wide(block.ffn.W2.bias)),
                    )
                )
            head, head_bias = _fold_norm(model.final_norm, model.head)  # a tied head folds a copy
            self.head, self.head_bias = narrow(head.T), narrow(head_bias)  # [C, V], [V]
            # Added to the scores: query i may read key j iff j <= i.
            self.mask = torch.full((cfg.context, cfg.context), float("-inf"), device=device).triu(1)

    def __call__(self, ids: Tensor) -> Tensor:
        B, T = ids.shape
        check_context(T, self.context)  # a shape, no host sync
        with torch.inference_mode():
            x = F.embedding(ids, self.token_table) + self.position_table[:T]  # [B, T, C]
            x = x.view(B * T, self.width)  # rows of every sample stacked: each matmul is one addmm
            last = len(self.blocks) - 1
            for i, block in enumerate(self.blocks):
                x = self._block(x, B, T, block, last_only=i == last)
            final = F.layer_norm(x, (self.width,), eps=self.eps)  # [B, C]: the last positions only
            return _linear(final, self.head, self.head_bias)  # [B, V]

    def _block(self, x: Tensor, B: int, T: int, block: FoldedBlock, last_only: bool) -> Tensor:
        """x [B*T, C] -> [B*T, C]; with `last_only`, [B, C]: the last position of each sample."""
        mixed = self._attention(F.layer_norm(x, (self.width,), eps=self.eps), B, T, block, last_only)
        stream = x.view(B, T, self.width)[:, -1] if last_only else x
        residual1 = _residual_linear(stream, mixed, block.out, block.out_bias)
        pre = _linear(F.layer_norm(residual1, (self.width,), eps=self.eps), block.w1, block.b1)
        if self.activation == "relu":
            hidden = pre.relu_()
        elif self.activation == "gelu":
            hidden = F.gelu(pre)
        elif self.activation == "gelu_tanh":
            hidden = F.gelu(pre, approximate="tanh")
        else:
            gate, value = pre.chunk(2, dim=-1)
            hidden = F.silu(gate) * value
        return _residual_linear(residual1, hidden, block.w2, block.b2)

    def _attention(self, norm1: Tensor, B: int, T: int, block: FoldedBlock, last_only: bool) -> Tensor:
        """Causal attention written out, heads joined: [B*T, C] -> [B*T, C] (or [B, C]).
        At the default shape (32 rows, 4 heads of 32, one CPU thread) a baddbmm with the prebuilt
        mask, softmax and a bmm measured the same as F.scaled_dot_product_attention (within noise,
        ~1.5 ms a forward either way): the matmuls dominate, so the plainer form stays."""
        H, d = self.n_head, self.head_width
        qkv = _linear(norm1, block.qkv, block.qkv_bias).view(B, T, 3 * H, d).transpose(1, 2)  # [B, 3H, T, d]
        q, k, v = (part.reshape(B * H, T, d) for part in qkv.split(H, dim=1))  # views when B = 1
        if last_only:  # the last query reads every key, so it needs no mask
            scores = torch.bmm(q[:, -1:], k.transpose(1, 2))  # [B*H, 1, T]
        else:
            scores = torch.baddbmm(self.mask[:T, :T], q, k.transpose(1, 2))  # [B*H, T, T]
        mixed = torch.bmm(scores.softmax(dim=-1), v)  # [B*H, T or 1, d]
        rows = mixed.shape[1]
        return mixed.view(B, H, rows, d).transpose(1, 2).reshape(B * rows, self.width)
