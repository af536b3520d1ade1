"""The parts a block is built from, each an nn.Module called through `__call__` so that PyTorch's
forward hooks (and pre-hooks) on it fire: the norms (chapter 17.3, and RMSNorm), causal multi-head
attention, the position-wise FFN (chapter 17.4), and the residual add (chapter 17.2).

Row vectors throughout: a Linear stores W as [out, in], so `x W` in the chapter is `x @ weight.T`.
A `Recorder` handed to attention or the FFN records the stages computed inside them
(`attention_weights`, `hidden`) as they are computed; without one, attention takes the fused
scaled-dot-product kernel, with one it computes its weights explicitly so they can be shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from . import stages
from .cache import LayerCache
from .positions import Rotary, Rotation, ScoreBias
from .recorder import Recorder


class ResidualShapeError(ValueError):
    """A residual add whose operands differ in shape (chapter 17.2: no broadcasting)."""


def residual(stream: Tensor, update: Tensor) -> Tensor:
    """stream + update, refusing any broadcast: one update per example and position (chapter 17.2)."""
    if stream.shape != update.shape:
        raise ResidualShapeError(
            f"residual add needs equal shapes, got {list(stream.shape)} + {list(update.shape)}; broadcasting "
            f"would reuse one update for many rows"
        )
    return stream + update


class LayerNorm(nn.Module):
    """LN(x)_c = gamma_c (x_c - mu) / sqrt(sigma^2 + eps) + beta_c over the last axis only, with the
    biased variance (divide by C): chapter 17.3. Computed by torch's fused kernel, which a test checks
    against the formula. `affine=False` leaves out gamma and beta (the plain norm of a folded model,
    fold.py, whose gain and bias live in the matrix that reads the norm)."""

    def __init__(self, width: int, eps: float, bias: bool = True, affine: bool = True):
        super().__init__()
        self.width, self.eps = width, eps
        self.weight = nn.Parameter(torch.ones(width)) if affine else None
        self.bias = nn.Parameter(torch.zeros(width)) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        # torch.layer_norm is what F.layer_norm calls after its Python checks for tensor subclasses,
        # which cost as much as a small kernel here (nine norms a pass)
        return torch.layer_norm(x, (self.width,), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(x)_i = g_i x_i / sqrt(mean(x^2) + eps): rescales without subtracting the mean, and
    has no bias by definition (so `[model] bias` does not apply to it). `affine=False`: no gain."""

    def __init__(self, width: int, eps: float, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed if self.weight is None else normed * self.weight


class NoNorm(nn.Module):
    """`[model] norm = "none"`: the identity where a norm stands, no parameters (its `weight` is None
    like a plain norm's, so whoever reads a norm's gain finds none)."""

    weight = None
    bias = None

    def forward(self, x: Tensor) -> Tensor:
        return x


def make_norm(
    cfg: ModelConfig, affine: bool = True, substitute: Callable[[ModelConfig], nn.Module] | None = None
) -> nn.Module:
    """The norm `[model] norm` names, or what `substitute` builds in its place (a learner's: gpt.Parts)."""
    if substitute is not None:
        return substitute(cfg)
    if cfg.norm == "none":
        return NoNorm()
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.n_embd, cfg.norm_eps, cfg.bias, affine)
    return RMSNorm(cfg.n_embd, cfg.norm_eps, affine)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention: project, split into heads, mask, softmax, mix values, join, W_O.
    With grouped-query attention (`n_kv_head` < `n_head`) query head h reads key and value head
    h // (n_head / n_kv_head): a group of adjacent query heads shares one, as transformers' Llama does."""

    def __init__(self, cfg: ModelConfig, positions: Rotary | Rotation | ScoreBias | None = None):
        """`positions`: the model's rope tables (or a learner's rope, a Rotation) or ALiBi's or T5's
        biases (positions.py) as its default reading reads them, shared by every block; None for
        positions added to the stream before block 0 (learned, sinusoidal) or none."""
        super().__init__()
        self.positions = positions
        self.n_head, self.n_kv_head = cfg.n_head, cfg.kv_heads
        self.head_width = cfg.resolved_head_width  # d: [model] head_width, or n_embd / n_head where that is 0
        # W_Q, W_K and W_V stacked into one matrix: one matmul instead of three on the hot path. Its
        # rows: n_head query heads, then n_kv_head key heads, then n_kv_head value heads, d rows each.
        inner = self.n_head * self.head_width
        self.qkv = nn.Linear(cfg.n_embd, inner + 2 * self.n_kv_head * self.head_width, bias=cfg.biased("qkv"))
        self.out = nn.Linear(inner, cfg.n_embd, bias=cfg.biased("out"))  # W_O
        self.dropout = cfg.dropout

    def forward(
        self,
        x: Tensor,
        recorder: Recorder | None = None,
        cache: LayerCache | None = None,
        last_only: bool = False,
        positions: Rotary | None = None,
    ) -> Tensor:
        """x: [B, T, C] -> [B, T, C]; with `last_only`, the last position's row alone ([B, 1, C]),
        which still reads every key and value (and stores them all in the cache). `positions`:
        rope's tables for a reading other than the model's default (whose tables it holds)."""
        B, T, C = x.shape  # batch, new positions, width
        H, K, d = self.n_head, self.n_kv_head, self.head_width
        qkv = self.qkv(x)  # x [W_Q | W_K | W_V] + b: [B, T, (H + 2K) d]
        # Q, K, V, each split into heads [B, heads, T, d]: head h reads coordinates h*d .. (h+1)*d - 1
        # of its part (views and permutes, no copy)
        past = cache.length if cache is not None else 0  # the absolute position of this x's first row
        positions = self.positions if positions is None else positions
        rotary = positions if isinstance(positions, Rotary) else None
        if rotary is None and H == K:
            q, k, v = qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4).unbind(0)
        elif rotary is None:
            q, k, v = qkv.view(B, T, H + 2 * K, d).transpose(1, 2).split((H, K, K), dim=1)
        else:  # rope: the queries and keys (one [B, T, H + K, d] slab) turned by their positions, the values not
            # split, not sliced: its backward is one concatenation, a slice's a zero fill and an add
            qk, v = qkv.view(B, T, H + 2 * K, d).split((H + K, K), dim=2)
            q, k = rotary.rotate(qk, past).transpose(1, 2).split((H, K), dim=1)
            v = v.transpose(1, 2)
        if isinstance(positions, Rotation):  # rope by a learner's code (exercise rope), on the heads as split
            q, k, v = positions.turn(q, k, v, past)
        if recorder is not None and isinstance(positions, (Rotary, Rotation)):
            q = recorder.record(stages.ROTATED_QUERY, q)  # [B, H, T, d]
            k = recorder.record(stages.ROTATED_KEY, k)  # [B, K, T, d]
        if cache is not None:
            k, v = cache.extend(k, v)  # [B, K, S, d]: the cached keys and values, then these T
        S = k.shape[2]  # keys visible in total: the cached ones plus these T
        if last_only:  # one query, the last position: it may read every key, so no mask is needed
            q, past, T = q[:, :, -1:], S - 1, 1
        p = self.dropout if self.training else 0.0
        # grouped: the fused kernel reads each key and value head for its group of query heads itself
        grouped = {"enable_gqa": True} if K != H else {}
        # Written out when the weights are recorded, and under bfloat16 autocast, where the fused
        # kernel's backward is slow on the CPU; otherwise the fused scaled-dot-product kernel.
        score_bias = positions if isinstance(positions, ScoreBias) else None  # ALiBi's or T5's
        if recorder is None and not _lowered_precision(x):
            if score_bias is not None:  # the bias carries the causal mask (-inf past the query)
                bias = score_bias.bias(T, S, past, x.device, q.dtype)
                mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, **grouped)  # [B, H, T, d]
            elif past == 0:
                mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=T > 1, **grouped)
            else:
                mask = None if T == 1 else _causal_mask(T, S, past, x.device)
                mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, **grouped)
        else:
            # [B, K, H/K, T, d] against [B, K, 1, S, d]: each group of query heads reads its key head by
            # broadcasting, no copy of the keys or values per query head
            grouped_q = q.unflatten(1, (K, H // K))
            scores = (grouped_q @ k.unsqueeze(2).transpose(-2, -1)).flatten(1, 2)  # [B, H, T, S]
            if scores.dtype in (torch.bfloat16, torch.float16):
                scores = scores.float()  # scale, mask and softmax in float32: only the matmuls are lowered
            scores = scores / math.sqrt(self.head_width)
            if score_bias is not None:  # -slope_h (i - j) or b[bucket(i - j), h], and -inf past the query
                scores = scores + score_bias.bias(T, S, past, x.device, scores.dtype)
            else:
                scores = scores.masked_fill(~_causal_mask(T, S, past, x.device), float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # [B, H, T, S]
            if recorder is not None:
                recorder.record(stages.ATTENTION_WEIGHTS, weights)
            if p > 0:
                weights = F.dropout(weights, p)
            mixed = (weights.to(v.dtype).unflatten(1, (K, H // K)) @ v.unsqueeze(2)).flatten(1, 2)  # [B, H, T, d]
        if recorder is not None:
            mixed = recorder.modify(stages.HEADS, mixed)  # e.g. one head ablated
        joined = mixed.transpose(1, 2).reshape(B, T, H * d)  # join the heads back to [B, T, H d]
        attention = self.out(joined)  # W_O: [B, T, C]
        return F.dropout(attention, p) if p > 0 else attention


def _lowered_precision(x: Tensor) -> bool:
    """Whether autocast runs this pass's matmuls in a lower precision (bfloat16 training)."""
    try:  # x.is_cpu first: building x.device costs more than the check itself
        return torch.is_autocast_enabled("cpu" if x.is_cpu else x.device.type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_cpu_enabled() if x.device.type == "cpu" else torch.is_autocast_enabled()


def _causal_mask(T: int, S: int, past: int, device) -> Tensor:
    """[T, S] booleans: query i (absolute position past + i) may read key j iff j <= past + i."""
    rows = torch.arange(T, device=device).unsqueeze(1) + past
    return torch.arange(S, device=device).unsqueeze(0) <= rows


class FeedForward(nn.Module):
    """Position-wise FFN: hidden = act(x W1 + b1), ffn = hidden W2 + b2 (chapter 17.4).
    With swiglu, W1 holds the gate and value projections side by side: hidden = SiLU(gate) * value."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.activation = cfg.activation
        widen = 2 if cfg.activation == "swiglu" else 1
        self.W1 = nn.Linear(cfg.n_embd, widen * cfg.ffn_hidden, bias=cfg.biased("W1"))
        self.W2 = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=cfg.biased("W2"))
        self.dropout = cfg.dropout

    def forward(self, x: Tensor, recorder: Recorder | None = None) -> Tensor:
        """x: [B, T, C] -> ffn [B, T, C]; the recorder, if any, records (and may replace) `hidden`, and
        may replace (or keep, when asked) `pre_activation`, x W1 + b1."""
        pre = self.W1(x)  # x W1 + b1: [B, T, F]
        if recorder is not None:
            pre = recorder.modify(stages.PRE_ACTIVATION, pre)
        # a recorder may have kept `pre`: then ReLU must not overwrite it in place
        hidden = self.activate(pre, inplace=recorder is None)  # [B, T, F]
        if recorder is not None:
            hidden = recorder.record(stages.HIDDEN, hidden)
        ffn = self.W2(hidden)  # [B, T, C]
        return F.dropout(ffn, self.dropout) if self.training and self.dropout > 0 else ffn

    def activate(self, pre: Tensor, inplace: bool = True) -> Tensor:
        """hidden from W1's output: the non-linearity (SwiGLU: the gate times the value). `inplace`
        (ReLU): `pre` is W1's fresh output, read by nothing else, so ReLU may overwrite it."""
        if self.activation == "relu":
            return F.relu(pre, inplace=inplace)
        if self.activation == "gelu":
            return F.gelu(pre)
        if self.activation == "gelu_tanh":  # GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            return F.gelu(pre, approximate="tanh")
        gate, value = pre.chunk(2, dim=-1)
        return F.silu(gate) * value
