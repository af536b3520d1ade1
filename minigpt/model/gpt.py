"""MiniGPT: chapter 17's model, in the chapter's order and with the trace's names.

    x = token_table[ids] + position_table[start : start + T]     refuses start + T > context
        (positions = "sinusoidal": + the fixed rows PE[start : start + T] instead; "none", "rope",
        "alibi" or "t5": x = token_table[ids] alone, and rope turns each query and key by its
        position inside attention, alibi and t5 bias each score by its distance: positions.py;
        context is still the trained length, crossed only on purpose: reading.py)
    for block in blocks (pre-norm, chapter 17.5):
        norm1 = LN1(x);  attention = MHA(norm1);  residual1 = x + attention
        norm2 = LN2(residual1);  hidden = act(norm2 W1 + b1);  ffn = hidden W2 + b2
        output = residual1 + ffn;  x = output
    logits = final_norm(x) W_head

The [model] switches remove a part (docs/guide/remove-it-and-watch.md): residual = false computes
x = sublayer(norm(x)) for both sublayers; norm = "none" puts the identity where each norm stands
(the final norm too); ffn_hidden = 0 builds no FFN (no norm2, hidden, ffn; output = residual1).
residual = "attention" (Attention Residuals, depth.py) passes no stream from block to block: each
sublayer reads read = a softmax mix over depth of the embedding and the earlier sublayers' outputs,
norm1 = LN1(read1), ..., and the final norm reads such a mix too.

Every submodule is called through nn.Module's `__call__`, once per use, so a forward hook or
pre-hook a user (or nnsight, or any hook-based tool) registers on a block, its attention, a norm, a
Linear or a table fires in training, trace, eval and sampling alike. A `Recorder` passed to
`forward` records every named stage of this same pass as it is computed (the names come from
stages.py); there is no second implementation for the trace to drift from, and none for sampling
either: its speed-up is a transformation of the weights (fold.py) that this same forward runs.

How the model is read (its trained length, its own rope rule, a reader's rule, extrapolation, a
sliding window) is one frozen Reading (reading.py), which `forward` takes: one model read two ways
at once is two Readings, and nothing the two share is changed. Without one, a pass reads the model
as `read` (or `read_with`) last said: the model's default reading, which its blocks' attention holds.

The forward pass has no host synchronisation: token ids are checked where they enter (prompt, trace
ids, corpus: `check_token_ids`), and the only check inside is the context length, a shape. Dropout
is called only where it acts (in eval mode or at p = 0 it returns its input and draws nothing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..config import ModelConfig, Residual
from ..errors import MinigptError
from ..rope_scaling import RopeScaling
from . import stages
from .cache import KVCache, LayerCache
from .depth import Depth, DepthAttention
from .init import initialise
from .layers import CausalSelfAttention, FeedForward, make_norm
from .layers import residual as residual_add
from .positions import Alibi, RelativeBias, Rotary, Rotation, ScoreBias, Sinusoids
from .reading import ContextTooLongError as ContextTooLongError  # where callers have always found it
from .reading import Reading
from .reading import check_context as check_context
from .recorder import Recorder

DTYPES = {"float32": torch.float32, "float64": torch.float64}


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
            "token id {bad} is not in the vocabulary: this model has {vocab_size} tokens, ids 0..{value}; "
            "use ids the tokenizer produced",
            bad=bad,
            vocab_size=vocab_size,
            value=vocab_size - 1,
        )


def _untapped(name: str, value: Tensor) -> Tensor:
    return value


def _skip(stream: Tensor, update: Tensor) -> Tensor:
    """`[model] residual = false`: the sublayer's update alone, no skip connection."""
    return update


@dataclass(frozen=True)
class Parts:
    """Modules the model builds in place of its own: a learner's (`minigpt exercise`, whose plug.py
    makes these). Each is a function of the [model] section returning the module, called where minigpt
    would build its own, so its parameters are named where minigpt's are (blocks.0.norm1.weight).
    `block` replaces a whole Block (called as Block.forward is); `rope` minigpt's Rotary (a Rotation,
    which attention hands the heads), `alibi` its Alibi (a ScoreBias), `depth` each DepthAttention
    (called as DepthAttention.forward is). `source`: where they came from, which the checkpoints record."""

    norm: Callable[[ModelConfig], nn.Module] | None = None
    attention: Callable[[ModelConfig], nn.Module] | None = None
    ffn: Callable[[ModelConfig], nn.Module] | None = None
    block: Callable[[ModelConfig], nn.Module] | None = None
    rope: Callable[[ModelConfig], Rotation] | None = None
    alibi: Callable[[ModelConfig], ScoreBias] | None = None
    depth: Callable[[ModelConfig], nn.Module] | None = None
    source: dict[str, Any] = field(default_factory=dict)


OWN_PARTS = Parts()


def _depth_attention(cfg: ModelConfig, parts: Parts) -> nn.Module:
    """One layer's read over depth (Attention Residuals): minigpt's, or what `parts` builds in its place."""
    return parts.depth(cfg) if parts.depth else DepthAttention(cfg.n_embd)


class Block(nn.Module):
    def __init__(
        self, cfg: ModelConfig, parts: Parts = OWN_PARTS, positions: Rotary | Rotation | ScoreBias | None = None
    ):
        """`positions`: the model's rope or ALiBi tables as its default reading reads them, which its
        attention holds (positions.py)."""
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.residual = _skip if cfg.residual_kind is Residual.NONE else residual_add
        # Attention Residuals: each sublayer reads a mix (depth.py)
        self.over_depth = cfg.residual_kind is Residual.ATTENTION
        if self.over_depth:
            self.depth1 = _depth_attention(cfg, parts)  # attention's pseudo-query
        self.norm1 = make_norm(cfg, substitute=parts.norm)
        self.attention = parts.attention(cfg) if parts.attention else CausalSelfAttention(cfg, positions)
        if cfg.ffn_hidden > 0:  # ffn_hidden = 0: attention only, no norm2 and no ffn module at all
            if self.over_depth:
                self.depth2 = _depth_attention(cfg, parts)  # the FFN's
            self.norm2 = make_norm(cfg, substitute=parts.norm)
            self.ffn = parts.ffn(cfg) if parts.ffn else FeedForward(cfg)

    def forward(
        self,
        x: Tensor,
        recorder: Recorder | None = None,
        cache: LayerCache | None = None,
        last_only: bool = False,
        positions: Rotary | None = None,
    ) -> Tensor:
        """x: [B, T, C] -> output [B, T, C]. Each stage is recorded (tapped) as it is computed, so the
        recorded order is the computation order, which stages.PRE_NORM / stages.POST_NORM name.
        `last_only` (sampling's last block): every row feeds the keys and values, but only the last
        row goes on through the residual and the FFN, so T = 1 from `attention` on. `positions`:
        rope's tables as a reading other than the model's default reads them (MiniGPT.forward)."""
        if positions is not None:  # only minigpt's own attention turns by rope (a learner's is refused with it)
            attend = functools.partial(self.attention, positions=positions)
        else:
            attend = self.attention
        if self.over_depth:
            return self._over_depth(x, recorder, cache, last_only, attend)
        tap = recorder.record if recorder is not None else _untapped
        residual = self.residual  # x + update, or (residual = false) the update alone
        stream = x[:, -1:] if last_only else x  # the rows that continue past attention
        has_ffn = hasattr(self, "ffn")  # ffn_hidden = 0: attention only, `output` is what attention leaves
        if self.pre_norm:  # chapter 17.5
            norm1 = tap(stages.NORM1, self.norm1(x))  # [B, T, C]
            attention = tap(stages.ATTENTION, attend(norm1, recorder, cache, last_only))  # [B, T, C]
            residual1 = tap(stages.RESIDUAL1, residual(stream, attention))  # [B, T, C]
            if not has_ffn:
                return tap(stages.OUTPUT, residual1)  # no FFN: output = residual1
            norm2 = tap(stages.NORM2, self.norm2(residual1))  # [B, T, C]
            ffn = tap(stages.FFN, self.ffn(norm2, recorder))  # [B, T, C]; records hidden [B, T, F]
            return tap(stages.OUTPUT, residual(residual1, ffn))  # [B, T, C]
        # chapter 17.6: R = LN1(X + MHA(X)), Y = LN2(R + FFN(R))
        attention = tap(stages.ATTENTION, attend(x, recorder, cache, last_only))  # [B, T, C]
        residual1 = tap(stages.RESIDUAL1, residual(stream, attention))  # [B, T, C]
        norm1 = tap(stages.NORM1, self.norm1(residual1))  # [B, T, C]
        if not has_ffn:
            return tap(stages.OUTPUT, norm1)  # no FFN: output = norm1
        ffn = tap(stages.FFN, self.ffn(norm1, recorder))  # [B, T, C]; records hidden [B, T, F]
        residual2 = tap(stages.RESIDUAL2, residual(norm1, ffn))  # [B, T, C]
        norm2 = tap(stages.NORM2, self.norm2(residual2))  # [B, T, C]
        return tap(stages.OUTPUT, norm2)  # post-norm's output is LN2's: the same values as norm2

    def _over_depth(
        self, depth: Depth, recorder: Recorder | None, cache: LayerCache | None, last_only: bool, attend: Callable
    ) -> Depth:
        """Attention Residuals (depth.py): `depth` (the embedding and the outputs so far) -> the same
        with this block's attention and FFN outputs added. Each sublayer reads its own mix over depth
        through its own pre-norm; nothing is added to a stream."""
        tap = recorder.record if recorder is not None else _untapped
        read1 = tap(stages.READ1, self.depth1(depth, recorder, stages.DEPTH_WEIGHTS1))  # [B, T, C]
        norm1 = tap(stages.NORM1, self.norm1(read1))
        attention = tap(stages.ATTENTION, attend(norm1, recorder, cache, last_only))  # [B, T or 1, C]
        depth = (depth.last_row() if last_only else depth).add(attention)
        if not hasattr(self, "ffn"):
            return depth
        read2 = tap(stages.READ2, self.depth2(depth, recorder, stages.DEPTH_WEIGHTS2))
        norm2 = tap(stages.NORM2, self.norm2(read2))
        ffn = tap(stages.FFN, self.ffn(norm2, recorder))  # records hidden [B, T, F]
        return depth.add(ffn)


class MiniGPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, parts: Parts | None = None):
        """`parts`: modules built in place of minigpt's (a learner's); a [model] section that names an
        exercise needs them, so that no model of it is ever built with minigpt's parts instead."""
        super().__init__()
        if vocab_size < 1:
            raise MinigptError("vocab_size = {vocab_size}; a model needs at least one token", vocab_size=vocab_size)
        if (cfg.exercise != "none") != (parts is not None):
            raise ValueError(f"[model] exercise = {cfg.exercise!r} goes with a learner's Parts, and only it does")
        self.parts = parts
        parts = parts or OWN_PARTS
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.context = cfg.context
        self.token_table = nn.Embedding(vocab_size, cfg.n_embd)  # E: [V, C]
        if cfg.positions == "learned":  # positions = "none": no table, the input is the token row alone
            self.position_table = nn.Embedding(cfg.context, cfg.n_embd)  # P: [context, C]
        self.head_width = cfg.resolved_head_width  # d: [model] head_width, or n_embd / n_head where that is 0
        # rope and alibi: no parameters, tables inside attention, computed once per length: ALiBi's one
        # for every reading, rope's one per rule a reading asks for (positions_for); t5: a learned
        # table of biases [buckets, H], one for every block; sinusoidal: fixed rows added to the input
        self._score_bias: ScoreBias | None = None
        if cfg.positions == "alibi":
            self._score_bias = parts.alibi(cfg) if parts.alibi else Alibi(cfg.n_head, cfg.context)
        if cfg.positions == "t5":
            self.relative_bias = nn.Embedding(cfg.t5_buckets, cfg.n_head)  # b: [buckets, H]
            self._score_bias = RelativeBias(self.relative_bias, cfg.t5_max_distance, cfg.context)
        self._sinusoids = Sinusoids(cfg.n_embd, cfg.context) if cfg.positions == "sinusoidal" else None
        self._rotaries: dict[RopeScaling | None, Rotary | Rotation] = {}
        # how the model is read where a pass is not handed a reading: as trained, its own rule applied
        self.reading = Reading.of(cfg)  # refuses an own rule it cannot compute, naming the key
        self.blocks = nn.ModuleList(
            parts.block(cfg) if parts.block else Block(cfg, parts, self.positions_for(self.reading))
            for _ in range(cfg.n_layer)
        )
        # [train] recompute: training keeps each block's input alone and computes the block again in
        # the backward pass (torch.utils.checkpoint), trading arithmetic for activation memory.
        self.recompute = False
        if cfg.residual_kind is Residual.ATTENTION:  # the final norm reads a mix over depth too, with its own query
            self.final_depth = _depth_attention(cfg, parts)
            self.layers = cfg.layers  # every attention and FFN
            self.per_block = cfg.layers_per_residual_block  # outputs summed per block
        self.final_norm = make_norm(cfg, substitute=parts.norm)
        self.head = nn.Linear(cfg.n_embd, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.token_table.weight
        initialise(self, cfg)  # [model] init: GPT-2's scheme, or Xavier's (init.py)
        self.to(DTYPES[cfg.dtype])

    def read_with(self, extrapolate: bool = False, rope_scaling: RopeScaling | str | None = None) -> MiniGPT:
        """Read this model from now on as `extrapolate` (texts past the trained length, `context`, on
        purpose: every positions but learned) and `rope_scaling` (a RopeScaling or text such as "yarn:4",
        on a rope model without a rule of its own: factor x context positions accepted) say
        (Reading.of refuses what cannot be read so; nothing it trains changes). Returns the model."""
        return self.read(Reading.of(self.cfg, extrapolate, rope_scaling))

    def read(self, reading: Reading) -> MiniGPT:
        """Make `reading` this model's default reading: what every pass not handed one reads it as
        (its blocks' attention holds the tables it implies). Returns the model."""
        self._own(reading)
        self.reading = reading
        if self.cfg.positions == "rope":  # rope's tables are the only part of a pass a reading changes
            positions = self.positions_for(reading)
            for block in self.blocks:
                block.attention.positions = positions
        return self

    def _own(self, reading: Reading) -> None:
        """Refuse a Reading of another model (it would read the wrong rule, or the wrong length)."""
        mine = self.reading
        made = (reading.positions, reading.trained_length, reading.own_rule, reading.sliding_window)
        if made != (mine.positions, mine.trained_length, mine.own_rule, mine.sliding_window):
            raise ValueError(f"{reading} reads another model than this one ({mine})")

    def positions_for(self, reading: Reading) -> Rotary | Rotation | ScoreBias | None:
        """The position tables a pass read as `reading` uses inside attention: rope's for its rule
        (one Rotary per rule, made once and never changed: two readings never share tables; a
        learner's rope, which Reading lets no rule reach), ALiBi's or T5's biases (the same for every
        reading), or None (learned, sinusoidal, none)."""
        if self.cfg.positions != "rope":
            return self._score_bias
        rotary = self._rotaries.get(reading.rule)
        if rotary is None and self.parts is not None and self.parts.rope:
            rotary = self._rotaries[reading.rule] = self.parts.rope(self.cfg)
        if rotary is None:
            cfg = self.cfg
            rotary = Rotary(
                self.head_width,
                cfg.rope_theta,
                cfg.context,
                cfg.rope_angles == "float32",
                reading.rule,
                cfg.rotary_width,
            )
            self._rotaries[reading.rule] = rotary
        return rotary

    # What the default reading answers, asked of the model (sampling, trace, eval, the explore page).
    @property
    def positions(self) -> Rotary | Rotation | ScoreBias | None:
        return self.positions_for(self.reading)

    @property
    def own_scaling(self) -> RopeScaling | None:
        """The model's own rope rule ([model] rope_scaling), always applied."""
        return self.reading.own_rule

    @property
    def window(self) -> int | None:
        return self.reading.window

    @property
    def cache_reach(self) -> int | None:
        return self.reading.cache_reach

    def check_length(self, length: int, what: str = "the sequence", advice: str = "") -> None:
        self.reading.refuse_length(length, what, advice)

    def depth_from(self, embedding: Tensor) -> Depth:
        """Attention Residuals: what the first layer reads over depth, `embedding` ([B, T, C]) alone,
        to which each sublayer's output is added (Depth.add) as this model adds them. The forward
        pass starts from it; the trace's logit lens and patching rebuild a pass's depth with it."""
        return Depth.start(embedding, self.per_block, self.cfg.norm_eps, self.layers)

    def position_rows(self, start: int, T: int) -> Tensor | None:
        """The rows the forward pass adds to the token rows of positions start .. start + T - 1 ([T,
        C]), read for showing them (the trace, the attribution; no module is called, so no hook
        fires): the learned table's or the fixed sinusoids; None where no position enters the stream
        (none, rope, alibi, t5)."""
        device = self.token_table.weight.device
        if self.cfg.positions == "learned":
            return self.position_table.weight[start : start + T]
        if self._sinusoids is not None:
            return self._sinusoids.rows(start, T, device, self.token_table.weight.dtype)
        return None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def architecture(self) -> dict[str, Any]:
        """What this model computes, in plain values (a trace's JSON and the explore page show it)."""
        cfg = self.cfg
        return {
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_embd": cfg.n_embd,
            "ffn_hidden": cfg.ffn_hidden,
            "context": cfg.context,
            "vocab_size": self.vocab_size,
            "norm": cfg.norm,
            "norm_position": cfg.norm_position,
            "activation": cfg.activation,
            "bias": cfg.bias,
            **{key: True for key in ("qkv_bias", "out_bias", "ffn_bias") if getattr(cfg, key)},
            **({"n_kv_head": cfg.n_kv_head} if cfg.n_kv_head else {}),
            **({"head_width": cfg.head_width} if cfg.head_width else {}),
            "tie_embeddings": cfg.tie_embeddings,
            "dtype": cfg.dtype,
            "positions": cfg.positions,
            **({"rope_theta": cfg.rope_theta} if cfg.positions == "rope" else {}),
            **({"rope_fraction": cfg.rope_fraction} if cfg.rope_fraction != 1.0 else {}),
            **({"t5_buckets": cfg.t5_buckets, "t5_max_distance": cfg.t5_max_distance} if cfg.positions == "t5" else {}),
            **({"rope_scaling": cfg.rope_scaling} if cfg.rope_scaling else {}),
            **({"sliding_window": cfg.sliding_window} if cfg.sliding_window else {}),
            "residual": cfg.residual,
            **(
                {"attention_residual_blocks": cfg.attention_residual_blocks}
                if cfg.residual_kind is Residual.ATTENTION
                else {}
            ),
        }

    def forward(
        self,
        ids: Tensor,
        targets: Tensor | None = None,
        recorder: Recorder | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        reading: Reading | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """ids [B, T] -> logits [B, T, V], and the mean cross-entropy in nats when targets are given.
        `last_only` computes the last block past its attention, the final norm and the head for the
        last position alone ([B, 1, V]): all that sampling reads (every block's keys and values are
        still computed for every position). `reading`: how the model is read in this pass (Reading),
        by default its default reading (`read`); a cache must be filled under one reading."""
        if last_only and targets is not None:
            raise ValueError("last_only computes one position's logits; the loss needs all of them")
        # rope's tables for a reading other than the default (whose tables the blocks hold)
        positions = None
        if reading is None:
            reading = self.reading
        elif reading is not self.reading:
            self._own(reading)
            if self.cfg.positions == "rope":
                positions = self.positions_for(reading)
        start = cache.length if cache is not None else 0
        T = ids.shape[1]
        # A shape check, no host sync: the position table has no row past `context`.
        what = f"the sequence ({start} cached + {T} new)" if start else "the sequence"
        reading.refuse_length(start + T, what)
        tap = recorder.record if recorder is not None else _untapped
        x = self.token_table(ids)  # E[ids]: [B, T, C]
        if self.cfg.positions == "learned":  # through the module, so that its hooks fire
            x = x + self.position_table(torch.arange(start, start + T, device=ids.device))  # + P[start : start + T]
        elif self._sinusoids is not None:  # + PE[start : start + T], fixed
            x = x + self._sinusoids.rows(start, T, ids.device, x.dtype)
        if self.training and self.cfg.dropout > 0:
            x = F.dropout(x, self.cfg.dropout)
        x = tap(stages.INPUT, x)
        if self.cfg.residual_kind is Residual.ATTENTION:  # the blocks pass on what each sublayer wrote (depth.py)
            x = self.depth_from(x)
        last = len(self.blocks) - 1
        read = {} if positions is None else {"positions": positions}  # a learner's Block takes no positions
        recomputed = self.recompute and self.training and torch.is_grad_enabled() and recorder is None
        for i, block in enumerate(self.blocks):
            if recomputed and cache is None:  # the dropout masks drawn again the same (RNG state kept)
                x = checkpoint(block, x, use_reentrant=False, **read)
                continue
            x = block(
                x,
                recorder.scoped(stages.block_prefix(i)) if recorder is not None else None,
                cache.layers[i] if cache is not None else None,
                last_only and i == last,
                **read,
            )
        if isinstance(x, Depth):  # h = the final query's mix over depth
            x = tap(stages.FINAL_READ, self.final_depth(x, recorder, stages.FINAL_DEPTH_WEIGHTS))
        final = tap(stages.FINAL_NORM, self.final_norm(x))  # [B, T or 1, C]
        logits = tap(stages.LOGITS, self.head(final))  # [B, T or 1, V]
        loss = None
        if targets is not None:  # in float32 at least, whatever precision the matmuls ran in
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).to(torch.promote_types(logits.dtype, torch.float32)),
                targets.reshape(-1),
            )
        return logits, loss
