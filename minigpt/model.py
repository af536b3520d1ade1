"""MiniGPT: chapter 17's model, in the chapter's order and with the trace's names.

    x = token_table[ids] + position_table[start : start + T]     refuses start + T > context
    for block in blocks (pre-norm, chapter 17.5):
        norm1 = LN1(x);  attention = MHA(norm1);  residual1 = x + attention
        norm2 = LN2(residual1);  hidden = act(norm2 W1 + b1);  ffn = hidden W2 + b2
        output = residual1 + ffn;  x = output
    logits = final_norm(x) W_head

Row vectors throughout: a Linear stores W as [out, in], so `x @ W` in the chapter is `x @ weight.T`.
A `Recorder` passed to `forward` records every named stage of this same pass as it is computed
(the names come from stages.py); there is no second implementation for the trace to drift from, and
none for sampling either: its speed-up is a transformation of the weights (fold.py) that this same
forward runs. Without a recorder attention takes the fused scaled-dot-product kernel; with one it
computes the weights explicitly so they can be shown.

The forward pass has no host synchronisation: token ids are checked where they enter (prompt, trace
ids, corpus: `check_token_ids`), and the only check inside is the context length, a shape.

This forward is also sampling's inner loop: past the position table each new token is one pass of
about sixty small ops (a millisecond at the default shape on one CPU thread), where Python's own
work is a tenth of the time. So inside the model each submodule is applied through its `forward`
and each matrix through `linear` (F.linear on the layer's own weight and bias) rather than through
nn.Module.__call__, whose hook machinery costs about a microsecond a call and thirty-five calls a
pass; hooks on submodules therefore do not fire (the Recorder is how a pass is tapped; hooks on the
model itself still do). Dropout is called only where it acts (in eval mode or at p = 0 it returns
its input and draws nothing), and each submodule is looked up once per pass (a module's attribute
lookup is a Python call).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import stages
from .config import ModelConfig
from .errors import MinigptError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class ContextTooLongError(MinigptError):
    """A sequence needs a position row the learned table does not have."""


def check_context(length: int, context: int, what: str = "the sequence", advice: str = "") -> None:
    """The one refusal for anything longer than the position table, whoever notices it first
    (forward, sampling, trace), so it reads the same wherever it is raised."""
    if length > context:
        raise ContextTooLongError(
            f"{what} has {length} tokens but the position table has {context} rows ([model] context = {context}); "
            f"the model has no row for position {context} and will not invent one, so use at most {context} tokens"
            + (f": {advice}" if advice else "")
        )


class TokenOutOfRangeError(MinigptError):
    """A token id outside [0, vocab_size)."""


def check_token_ids(ids, vocab_size: int) -> None:
    """Refuse ids outside the vocabulary where they enter (a prompt, trace ids, a corpus), once,
    so the forward pass itself never has to look at their values. `ids`: a list, tensor or array."""
    if len(ids) == 0:
        return
    low, high = (int(ids.min()), int(ids.max())) if hasattr(ids, "min") else (min(ids), max(ids))
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise TokenOutOfRangeError(
            f"token id {bad} is not in the vocabulary: this model has {vocab_size} "
            f"tokens, ids 0..{vocab_size - 1}; use ids the tokenizer produced"
        )


class ResidualShapeError(ValueError):
    """A residual add whose operands differ in shape (chapter 17.2: no broadcasting)."""


Replacement = Callable[[Tensor, dict[str, Tensor]], Tensor]


class UnknownStageError(MinigptError):
    """A replacement (or a record) for a stage name the model never computes."""


class Recorder:
    """Named stages of one forward pass: `input`, `blocks.{i}.{stage}`, `blocks.{i}.attention_weights`,
    `final_norm` and `logits` (stages.recorded_names), each the whole [B, T, ...] tensor, detached,
    in the order computed.

    A tap as well as a record: `replacements` maps a full stage name to a function of (the value
    the pass computed, the stages recorded so far) that returns what the pass continues with, so
    an intervention runs through the model's own forward pass. `blocks.{i}.heads` ([B, H, T, d],
    each head's mixed values before W_O) can be replaced but is not recorded.

    Built for one model's config, it knows every name that model computes: a replacement for any
    other name is refused here, where it is made, instead of being silently never applied."""

    def __init__(self, cfg: ModelConfig, replacements: dict[str, Replacement] | None = None):
        self.prefix = ""
        self.stages: dict[str, Tensor] = {}
        self.replacements: dict[str, Replacement] = dict(replacements or {})
        self.known = frozenset(stages.replaceable_names(cfg.n_layer, cfg.norm_position))
        self.cfg = cfg
        unknown = [name for name in self.replacements if name not in self.known]
        if unknown:
            raise UnknownStageError(self._unknown(unknown, "a replacement"))

    def _unknown(self, names: list[str], what: str) -> str:
        cfg = self.cfg
        per_block = [stages.ATTENTION_WEIGHTS, *stages.block_stages(cfg.norm_position), stages.HEADS]
        return (
            f"{what} for {', '.join(map(repr, names))}: this model computes no such stage; it has "
            f"{stages.INPUT}, {stages.FINAL_NORM}, {stages.LOGITS} and blocks.I.STAGE for I in 0..{cfg.n_layer - 1} "
            f"with STAGE one of {', '.join(per_block)} ({cfg.norm_position}-norm)"
        )

    def _check(self, name: str) -> str:
        full = self.prefix + name
        if full not in self.known:  # a name model.py records that stages.py does not define
            raise UnknownStageError(self._unknown([full], "a record"))
        return full

    def modify(self, name: str, value: Tensor) -> Tensor:
        """`value`, or what a replacement for this stage makes of it."""
        replace = self.replacements.get(self._check(name))
        return value if replace is None else replace(value, self.stages)

    def record(self, name: str, value: Tensor) -> Tensor:
        """Keep `value` (or its replacement) under `name` and hand it back, so the forward pass reads
        `x = tap(name, f(...))`."""
        value = self.modify(name, value)
        self.stages[self.prefix + name] = value.detach()
        return value

    def scoped(self, prefix: str) -> Recorder:
        """A view that writes into the same dict under `prefix.`, with the same replacements."""
        view = copy.copy(self)  # shallow: the stages and replacements stay shared
        view.prefix = self.prefix + prefix + "."
        return view

    def __getitem__(self, name: str) -> Tensor:
        return self.stages[name]

    def block(self, index: int) -> dict[str, Tensor]:
        """The stages of block `index`, keyed by their bare names (`norm1`, ...)."""
        head = stages.block_prefix(index) + "."
        return {k[len(head) :]: v for k, v in self.stages.items() if k.startswith(head)}


def residual(stream: Tensor, update: Tensor) -> Tensor:
    """stream + update, refusing any broadcast: one update per example and position (chapter 17.2)."""
    if stream.shape != update.shape:
        raise ResidualShapeError(
            f"residual add needs equal shapes, got {list(stream.shape)} + "
            f"{list(update.shape)}; broadcasting would reuse one update for many rows"
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


def make_norm(cfg: ModelConfig, affine: bool = True) -> nn.Module:
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.n_embd, cfg.norm_eps, cfg.bias, affine)
    return RMSNorm(cfg.n_embd, cfg.norm_eps, affine)


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """x W + b with the layer's own weight and bias: what `layer(x)` computes, without nn.Module's
    call machinery (see the module's docstring). The two are read from `_parameters`, the dict
    nn.Module keeps them in: `layer.weight` reaches it only after Python's own attribute lookup has
    failed, through nn.Module.__getattr__, which costs as much as a small op (34 reads a pass)."""
    parameters = layer._parameters
    return F.linear(x, parameters["weight"], parameters["bias"])


class LayerCache:
    """Keys and values one block has computed so far, in buffers sized to the position table."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.length = 0

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.keys is None:
            shape = (k.shape[0], k.shape[1], self.capacity, k.shape[3])
            self.keys = k.new_empty(shape)
            self.values = v.new_empty(shape)
        end = self.length + k.shape[2]
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class KVCache:
    """One LayerCache per block; `length` is how many positions the model has already seen."""

    def __init__(self, n_layer: int, capacity: int):
        self.layers = [LayerCache(capacity) for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention: project, split into heads, mask, softmax, mix values, join, W_O."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.head_width = cfg.n_embd // cfg.n_head
        # W_Q, W_K and W_V stacked into one matrix: one matmul instead of three on the hot path.
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.out = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # W_O
        self.dropout = cfg.dropout

    def forward(
        self, x: Tensor, recorder: Recorder | None = None, cache: LayerCache | None = None, last_only: bool = False
    ) -> Tensor:
        """x: [B, T, C] -> [B, T, C]; with `last_only`, the last position's row alone ([B, 1, C]),
        which still reads every key and value (and stores them all in the cache)."""
        B, T, C = x.shape  # batch, new positions, width
        qkv = linear(x, self.qkv)  # x [W_Q | W_K | W_V] + b: [B, T, 3C]
        # Q, K, V, each split into heads [B, H, T, d]: head h reads coordinates h*d .. (h+1)*d - 1
        # of its third (one view and one permute, no copy)
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_width).permute(2, 0, 3, 1, 4).unbind(0)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.extend(k, v)  # [B, H, S, d]: the cached keys and values, then these T
        S = k.shape[2]  # keys visible in total: the cached ones plus these T
        if last_only:  # one query, the last position: it may read every key, so no mask is needed
            q, past, T = q[:, :, -1:], S - 1, 1
        p = self.dropout if self.training else 0.0
        # Written out when the weights are recorded, and under bfloat16 autocast, where the fused
        # kernel's backward is slow on the CPU; otherwise the fused scaled-dot-product kernel.
        if recorder is None and not _lowered_precision(x):
            if past == 0:
                mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=T > 1)  # [B, H, T, d]
            else:
                mask = None if T == 1 else _causal_mask(T, S, past, x.device)
                mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        else:
            scores = q @ k.transpose(-2, -1)  # [B, H, T, S]
            if scores.dtype in (torch.bfloat16, torch.float16):
                scores = scores.float()  # scale, mask and softmax in float32: only the matmuls are lowered
            scores = (scores / math.sqrt(self.head_width)).masked_fill(
                ~_causal_mask(T, S, past, x.device), float("-inf")
            )
            weights = torch.softmax(scores, dim=-1)  # [B, H, T, S]
            if recorder is not None:
                recorder.record(stages.ATTENTION_WEIGHTS, weights)
            if p > 0:
                weights = F.dropout(weights, p)
            mixed = weights.to(v.dtype) @ v  # [B, H, T, d]
        if recorder is not None:
            mixed = recorder.modify(stages.HEADS, mixed)  # e.g. one head ablated
        joined = mixed.transpose(1, 2).reshape(B, T, C)  # join the heads back to [B, T, C]
        attention = linear(joined, self.out)  # W_O: [B, T, C]
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
        self.W1 = nn.Linear(cfg.n_embd, widen * cfg.ffn_hidden, bias=cfg.bias)
        self.W2 = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def hidden(self, x: Tensor) -> Tensor:
        pre = linear(x, self.W1)
        if self.activation == "relu":
            return F.relu(pre, inplace=True)  # `pre` is W1's fresh output, read by nothing else
        if self.activation == "gelu":
            return F.gelu(pre)
        if self.activation == "gelu_tanh":  # GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            return F.gelu(pre, approximate="tanh")
        gate, value = pre.chunk(2, dim=-1)
        return F.silu(gate) * value

    def project(self, hidden: Tensor) -> Tensor:
        ffn = linear(hidden, self.W2)
        return F.dropout(ffn, self.dropout) if self.training and self.dropout > 0 else ffn


def _untapped(name: str, value: Tensor) -> Tensor:
    return value


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.norm1 = make_norm(cfg)
        self.attention = CausalSelfAttention(cfg)
        self.norm2 = make_norm(cfg)
        self.ffn = FeedForward(cfg)

    def forward(
        self, x: Tensor, recorder: Recorder | None = None, cache: LayerCache | None = None, last_only: bool = False
    ) -> Tensor:
        """x: [B, T, C] -> output [B, T, C]. Each stage is recorded (tapped) as it is computed, so the
        recorded order is the computation order, which stages.PRE_NORM / stages.POST_NORM name.
        `last_only` (sampling's last block): every row feeds the keys and values, but only the last
        row goes on through the residual and the FFN, so T = 1 from `attention` on."""
        tap = recorder.record if recorder is not None else _untapped
        stream = x[:, -1:] if last_only else x  # the rows that continue past attention
        feed = self.ffn
        if self.pre_norm:  # chapter 17.5
            norm1 = tap(stages.NORM1, self.norm1.forward(x))  # [B, T, C]
            attention = tap(stages.ATTENTION, self.attention.forward(norm1, recorder, cache, last_only))  # [B, T, C]
            residual1 = tap(stages.RESIDUAL1, residual(stream, attention))  # [B, T, C]
            norm2 = tap(stages.NORM2, self.norm2.forward(residual1))  # [B, T, C]
            hidden = tap(stages.HIDDEN, feed.hidden(norm2))  # [B, T, F]
            ffn = tap(stages.FFN, feed.project(hidden))  # [B, T, C]
            return tap(stages.OUTPUT, residual(residual1, ffn))  # [B, T, C]
        # chapter 17.6: R = LN1(X + MHA(X)), Y = LN2(R + FFN(R))
        attention = tap(stages.ATTENTION, self.attention.forward(x, recorder, cache, last_only))  # [B, T, C]
        residual1 = tap(stages.RESIDUAL1, residual(stream, attention))  # [B, T, C]
        norm1 = tap(stages.NORM1, self.norm1.forward(residual1))  # [B, T, C]
        hidden = tap(stages.HIDDEN, feed.hidden(norm1))  # [B, T, F]
        ffn = tap(stages.FFN, feed.project(hidden))  # [B, T, C]
        residual2 = tap(stages.RESIDUAL2, residual(norm1, ffn))  # [B, T, C]
        norm2 = tap(stages.NORM2, self.norm2.forward(residual2))  # [B, T, C]
        return tap(stages.OUTPUT, norm2)  # post-norm's output is LN2's: the same values as norm2


class MiniGPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        if vocab_size < 1:
            raise MinigptError(f"vocab_size = {vocab_size}; a model needs at least one token")
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.context = cfg.context
        self.token_table = nn.Embedding(vocab_size, cfg.n_embd)  # E: [V, C]
        self.position_table = nn.Embedding(cfg.context, cfg.n_embd)  # P: [context, C]
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.final_norm = make_norm(cfg)
        self.head = nn.Linear(cfg.n_embd, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.token_table.weight
        self._init_weights(cfg)
        self.to(DTYPES[cfg.dtype])

    def _init_weights(self, cfg: ModelConfig) -> None:
        # GPT-2's scheme: N(0, 0.02) everywhere, and the two projections that write into the residual
        # stream scaled by 1/sqrt(2 n_layer) so the stream's variance does not grow with depth.
        std = 0.02
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attention.out, block.ffn.W2):
                nn.init.normal_(proj.weight, 0.0, std / math.sqrt(2 * cfg.n_layer))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        recorder: Recorder | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """ids [B, T] -> logits [B, T, V], and the mean cross-entropy in nats when targets are given.
        `last_only` computes the last block past its attention, the final norm and the head for the
        last position alone ([B, 1, V]): all that sampling reads (every block's keys and values are
        still computed for every position)."""
        if last_only and targets is not None:
            raise ValueError("last_only computes one position's logits; the loss needs all of them")
        start = cache.length if cache is not None else 0
        T = ids.shape[1]
        # A shape check, no host sync: the position table has no row past `context`.
        check_context(start + T, self.context, f"the sequence ({start} cached + {T} new)" if start else "the sequence")
        tap = recorder.record if recorder is not None else _untapped
        # The position rows are a slice of the table: the same values (and gradient) as looking
        # up arange(start, start + T), without building the indices.
        tokens = F.embedding(ids, self.token_table.weight)  # E[ids]: [B, T, C]
        x = tokens + self.position_table.weight[start : start + T]  # + P[start : start + T]: [T, C]
        if self.training and self.cfg.dropout > 0:
            x = F.dropout(x, self.cfg.dropout)
        x = tap(stages.INPUT, x)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block.forward(
                x,
                recorder.scoped(stages.block_prefix(i)) if recorder is not None else None,
                cache.layers[i] if cache is not None else None,
                last_only and i == last,
            )
        final = tap(stages.FINAL_NORM, self.final_norm.forward(x))  # [B, T or 1, C]
        logits = tap(stages.LOGITS, linear(final, self.head))  # [B, T or 1, V]
        loss = None
        if targets is not None:  # in float32 at least, whatever precision the matmuls ran in
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).to(torch.promote_types(logits.dtype, torch.float32)),
                targets.reshape(-1),
            )
        return logits, loss
