"""Activation patching: run the corrupt prompt, put back one activation of the clean prompt's pass,
and measure how much of the clean logit difference (answer minus versus, at the last position)
comes back:

    effect = (patched - corrupt) / (clean - corrupt)     0: the corrupt run's, 1: the clean run's

`by="stage"` patches every block's residual stream (its `input`, `residual1`, `output`) and
sublayer updates (`attention`, `ffn`) at each position; `by="head"` patches each head's mixed
values (`heads`, before W_O) at every position at once and at each position alone.

A patched pass is the corrupt pass up to the first activation the patch changes, so only what
follows is computed: the blocks from the patched one on, at the positions from the first changed
row on (a causal model's earlier rows cannot see it), reading the corrupt pass's keys and values
for the rows before. Patches that share a block and a first changed row run as one batch through
the model's own blocks (hooks fire as in any pass). What the arithmetic decides is not computed:
a patch that changes no row (the clean and corrupt rows are equal) leaves the corrupt run exactly,
effect 0; a row after the last block's attention at an earlier position reaches nothing, effect 0;
the metric is one function of the last position's final-norm input, so a patch that makes that row
the clean run's gives exactly 1.

With `[model] residual = "attention"` (Attention Residuals, model/depth.py) there is no stream to
put back: `by="stage"` patches the embedding (`input`, block 0's row: every layer reads it), each
block's depth reads (`read1`, `read2`: what its attention and its FFN read) and its sublayer outputs
(`attention`, `ffn`: what later layers read), and the final norm's read (`final_read`, listed with
the last block). The end points are the same: `final_read` at the last position is the final norm's
input, so putting it back gives exactly 1, and a row before the first token the prompts differ in
is equal in both, so putting it back gives exactly 0. A patched pass starts from the corrupt pass's
recorded embedding and sublayer outputs (what the blocks before the patched one wrote).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from ..config import Residual
from ..errors import MinigptError
from ..model import stages
from ..model.cache import KVCache, LayerCache
from ..model.depth import Depth
from ..model.gpt import MiniGPT
from ..model.recorder import Recorder
from ..text.tokenizer import TextTokenizer
from .attribution import check_decomposable
from .trace import kept_heads
from .trace_input import check_ids

BY = ("stage", "head")
# The stages `by="stage"` patches, in the order a pre-norm block computes them: the stream entering
# the block, the attention update, the stream after it, the FFN update, the stream leaving.
PATCHED_STAGES = (stages.INPUT, stages.ATTENTION, stages.RESIDUAL1, stages.FFN, stages.OUTPUT)
# With Attention Residuals (no stream): the embedding (block 0 only), each block's two reads over
# depth and its two sublayer outputs, and the final norm's read (with the last block's index).
DEPTH_PATCHED_STAGES = (stages.INPUT, stages.READ1, stages.ATTENTION, stages.READ2, stages.FFN, stages.FINAL_READ)
# Stages whose row at a position reaches other positions only through a later block's attention:
# in the last block, at a position before the last, they reach nothing.
BEFORE_ATTENTION = (stages.INPUT, stages.READ1, stages.NORM1)


def patched_stages(cfg) -> tuple[str, ...]:
    """The stages `by="stage"` patches in a model of this [model] section, in the order swept."""
    names = DEPTH_PATCHED_STAGES if cfg.residual_kind is Residual.ATTENTION else PATCHED_STAGES
    return tuple(s for s in names if cfg.ffn_hidden > 0 or s not in (stages.READ2, stages.FFN))


@dataclass
class Prompt:
    """One of the two prompts: its tokens and the logit difference its own pass ends in."""

    text: str | None
    ids: list[int]
    tokens: list[str]
    logit_difference: float  # answer's logit minus versus's at the last position


@dataclass
class Effect:
    """One patch and how much of the clean logit difference it restores."""

    block: int  # final_read (residual = "attention"): the last block's index, the block it follows
    stage: str  # input, attention, residual1, ffn, output (read1, read2, final_read); heads for a head's mixed values
    position: int | None  # None: every position at once
    head: int | None
    effect: float


@dataclass
class Patching:
    clean: Prompt
    corrupt: Prompt
    answer: str
    answer_id: int
    versus: str
    versus_id: int
    by: str
    effects: list[Effect]

    def as_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    def effect(self, block: int, stage: str, position: int | None = None, head: int | None = None) -> float:
        """The effect of one patch of this sweep, by where it was made."""
        for item in self.effects:
            if (item.block, item.stage, item.position, item.head) == (block, stage, position, head):
                return item.effect
        raise KeyError((block, stage, position, head))


@dataclass(frozen=True)
class Patch:
    """Where a patch puts back the clean value: a block's stage at one position (None: all), and
    for `heads` which head."""

    block: int
    stage: str
    position: int | None = None
    head: int | None = None


def swept_stages(effects: list[Effect]) -> dict[str, list[int]]:
    """The stages a `by="stage"` sweep patched, in the order swept, each with the blocks it was
    patched in (Attention Residuals: `input` in block 0 alone, `final_read` with the last block)."""
    found: dict[str, list[int]] = {}
    for e in effects:
        blocks = found.setdefault(e.stage, [])
        if e.block not in blocks:
            blocks.append(e.block)
    return found


def sweep(n_layer: int, n_head: int, length: int, by: str, ffn: bool = True, depth: bool = False) -> list[Patch]:
    """Every patch of one sweep, block by block (no `ffn` patches for a model without an FFN).
    `depth` (Attention Residuals): the embedding in block 0 alone, each block's reads and sublayer
    outputs, then `final_read` after the last block."""
    if by == "head":
        return [
            Patch(i, stages.HEADS, p, h) for i in range(n_layer) for h in range(n_head) for p in (None, *range(length))
        ]
    if not depth:
        names = [s for s in PATCHED_STAGES if ffn or s != stages.FFN]
        return [Patch(i, s, p) for i in range(n_layer) for s in names for p in range(length)]
    inside = (stages.READ1, stages.ATTENTION, stages.READ2, stages.FFN) if ffn else (stages.READ1, stages.ATTENTION)
    found = [Patch(0, stages.INPUT, p) for p in range(length)]
    found += [Patch(i, s, p) for i in range(n_layer) for s in inside for p in range(length)]
    return found + [Patch(n_layer - 1, stages.FINAL_READ, p) for p in range(length)]


class Pass:
    """One prompt's recorded pass: every stage (heads kept), and each block's keys and values."""

    def __init__(self, model: MiniGPT, ids: list[int]):
        self.ids = list(ids)
        n_layer, T = len(model.blocks), len(ids)
        self.depth = model.cfg.residual_kind is Residual.ATTENTION
        self.recorder = Recorder(model.cfg, kept_heads({}, model))
        self.keys, self.values = [], []
        cache = KVCache(n_layer, T)
        model(torch.tensor([ids], device=model.token_table.weight.device), recorder=self.recorder, cache=cache)
        for layer in cache.layers:
            self.keys.append(layer.keys[:, :, :T])
            self.values.append(layer.values[:, :, :T])
        # the final norm's input: the last block's output, or (Attention Residuals) the final read
        entering = stages.FINAL_READ if self.depth else stages.block_name(n_layer - 1, stages.OUTPUT)
        self.final = self.recorder[entering][0, -1]

    def stage(self, block: int, stage: str) -> Tensor:
        """A block's stage at every position ([1, T, C]; heads [1, H, T, d]); `input` is what enters
        it (Attention Residuals: the embedding, block 0's), `final_read` the final norm's read."""
        if stage in (stages.INPUT, stages.FINAL_READ) and (self.depth or block == 0):
            return self.recorder[stage]
        if stage == stages.INPUT:
            return self.recorder[stages.block_name(block - 1, stages.OUTPUT)]
        return self.recorder[stages.block_name(block, stage)]

    def depth_entering(
        self, model: MiniGPT, block: int, start: int, batch: int, embedding: Tensor | None = None
    ) -> Depth:
        """Attention Residuals: what block `block` reads over depth, rows `start` on, `batch` times:
        the embedding (or `embedding`, [batch, T - start, C]) and the outputs of the blocks before
        it, added in the order the pass added them."""
        rows = (slice(None), slice(start, None))
        x = self.recorder[stages.INPUT][rows].expand(batch, -1, -1) if embedding is None else embedding
        depth = model.depth_from(x)
        for i in range(block):
            for stage in (stages.ATTENTION, stages.FFN) if model.cfg.ffn_hidden > 0 else (stages.ATTENTION,):
                depth = depth.add(self.recorder[stages.block_name(i, stage)][rows].expand(batch, -1, -1))
        return depth


def patch(
    model: MiniGPT,
    tokenizer: TextTokenizer,
    clean: list[int],
    corrupt: list[int],
    answer: int,
    versus: int,
    by: str = "stage",
    clean_text: str | None = None,
    corrupt_text: str | None = None,
    patches: list[Patch] | None = None,
) -> Patching:
    """Every patch of the `by` sweep (or the `patches` given), each put back alone into the corrupt run."""
    check_decomposable(model)
    if by not in BY:
        raise MinigptError("{by} {given!r}: patch by one of: {known}", given=by, known=", ".join(BY))
    for ids in (clean, corrupt):
        check_ids(model, ids)
    if len(clean) != len(corrupt):
        raise MinigptError(
            "the clean prompt has {n_clean} tokens and the corrupt one {n_corrupt}; patching puts back one "
            "position's activation at the same position, so give prompts of the same token length "
            "(clean: {clean_tokens}; corrupt: {corrupt_tokens})",
            n_clean=len(clean),
            n_corrupt=len(corrupt),
            clean_tokens=" ".join(repr(tokenizer.token_text(i)) for i in clean),
            corrupt_tokens=" ".join(repr(tokenizer.token_text(i)) for i in corrupt),
        )
    if answer == versus:
        raise MinigptError(
            "{answer} and {versus} are the same token ({token!r}, #{id}); the metric is their logit "
            "difference, so give two different tokens",
            token=tokenizer.token_text(answer),
            id=answer,
        )
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            direction = (model.head.weight[answer] - model.head.weight[versus]).detach().double()

            def metric(row: Tensor) -> float:  # one function of the final norm's input row, so equal rows score equally
                return float(model.final_norm(row.unsqueeze(0))[0].double() @ direction)

            clean_pass, corrupt_pass = Pass(model, clean), Pass(model, corrupt)
            high, low = metric(clean_pass.final), metric(corrupt_pass.final)
            if high == low:
                raise MinigptError(
                    "the clean and the corrupt prompt end in the same logit difference ({value:.6g}) between "
                    "{answer} and {versus}; there is nothing for a patch to restore: give prompts the model "
                    "answers differently",
                    value=high,
                )
            chosen = (
                patches
                if patches is not None
                else sweep(
                    len(model.blocks),
                    model.cfg.n_head,
                    len(clean),
                    by,
                    model.cfg.ffn_hidden > 0,
                    model.cfg.residual_kind is Residual.ATTENTION,
                )
            )
            finals = patched_finals(model, clean_pass, corrupt_pass, chosen)
            effects = [
                Effect(
                    item.block, item.stage, item.position, item.head, (metric(row) - low) / (high - low) + 0.0
                )  # + 0.0: no -0.0
                for item, row in zip(chosen, finals)
            ]
    finally:
        model.train(was_training)
    return Patching(
        clean=Prompt(clean_text, list(clean), [tokenizer.token_text(i) for i in clean], high),
        corrupt=Prompt(corrupt_text, list(corrupt), [tokenizer.token_text(i) for i in corrupt], low),
        answer=tokenizer.token_text(answer),
        answer_id=answer,
        versus=tokenizer.token_text(versus),
        versus_id=versus,
        by=by,
        effects=effects,
    )


def _share(value: float, low: float, high: float) -> float:
    """Where `value` lies from `low` (0) to `high` (1); + 0.0 turns a -0.0 into 0.0."""
    return (value - low) / (high - low) + 0.0


def _changed_rows(model: MiniGPT, clean: Pass, corrupt: Pass, item: Patch, length: int) -> list[int]:
    """The positions whose row the patch changes and from which a change can reach the last
    position's final row; none: the patched run is the corrupt run."""
    positions = range(length) if item.position is None else [item.position]
    # its row reaches other positions only through later blocks (final_read: none; the final norm reads it row by row)
    after_attention = item.stage not in BEFORE_ATTENTION
    if after_attention and (item.block == len(model.blocks) - 1 or item.stage == stages.FINAL_READ):
        positions = [p for p in positions if p == length - 1]
    a, b = clean.stage(item.block, item.stage), corrupt.stage(item.block, item.stage)
    if item.stage == stages.HEADS:
        return [p for p in positions if not torch.equal(a[0, item.head, p], b[0, item.head, p])]
    return [p for p in positions if not torch.equal(a[0, p], b[0, p])]


def patched_finals(model: MiniGPT, clean: Pass, corrupt: Pass, chosen: list[Patch]) -> list[Tensor]:
    """The last position's final-norm input in each patched run (a patch that changes nothing: the
    corrupt pass's own row)."""
    length, last = len(corrupt.ids), len(model.blocks) - 1
    # A block's output is the next block's input (the same tensor): patched once, read by both. With
    # Attention Residuals every block's `input` is the one embedding, block 0's.
    same = [
        Patch(p.block + 1, stages.INPUT, p.position)
        if p.stage == stages.OUTPUT and p.block < last
        else Patch(0, stages.INPUT, p.position)
        if p.stage == stages.INPUT and corrupt.depth
        else p
        for p in chosen
    ]
    unique = list(dict.fromkeys(same))
    found: dict[Patch, Tensor] = {}
    by_block: dict[int, list[tuple[Patch, list[int]]]] = defaultdict(list)
    for item in unique:
        rows = _changed_rows(model, clean, corrupt, item, length)
        if item.stage == stages.FINAL_READ:  # the final norm's input itself: the clean row, if it differs
            found[item] = clean.final if rows else corrupt.final
        elif rows:
            by_block[item.block].append((item, rows))
        else:
            found[item] = corrupt.final
    for block, members in by_block.items():
        for start, batch in _batches(members, length):
            found.update(
                zip([item for item, _ in batch], _run_group(model, clean, corrupt, block, start, batch, length))
            )
    return [found[item] for item in same]


MERGE = 2.0  # a patch joins a batch that starts earlier if that computes at most this many times its own rows


def _batches(members: list[tuple[Patch, list[int]]], length: int) -> list[tuple[int, list]]:
    """One block's patches as batches that each run from one row on: patches that first change
    rows close together share a batch (the rows between are the corrupt rows, recomputed), so the
    matmuls are few and large rather than many and small."""
    ordered = sorted(members, key=lambda member: member[1][0])
    batches: list[tuple[int, list]] = []
    for member in ordered:
        first = member[1][0]
        if batches and length - batches[-1][0] <= MERGE * (length - first):
            batches[-1][1].append(member)
        else:
            batches.append((first, [member]))
    return batches


def _run_group(
    model: MiniGPT,
    clean: Pass,
    corrupt: Pass,
    block: int,
    start: int,
    members: list[tuple[Patch, list[int]]],
    length: int,
) -> Tensor:
    """Patched runs that change block `block` first at row `start`, as one batch: the corrupt
    stream entering the block from `start` on (Attention Residuals: the corrupt embedding and
    sublayer outputs before the block), the corrupt keys and values before it."""
    B, last = len(members), len(model.blocks) - 1
    x = None  # Attention Residuals past block 0: no one row enters the block (depth_entering below)
    if block == 0 or not corrupt.depth:
        x = corrupt.stage(block, stages.INPUT)[:, start:].expand(B, -1, -1).clone()  # [B, T - start, C]
    puts: dict[str, list[tuple[int, int, int | None, Tensor]]] = defaultdict(list)
    for b, (item, rows) in enumerate(members):
        value = clean.stage(item.block, item.stage)
        for p in rows:
            if item.stage == stages.INPUT:
                x[b, p - start] = value[0, p]
            else:
                row = value[0, item.head, p] if item.stage == stages.HEADS else value[0, p]
                puts[stages.block_name(block, item.stage)].append((b, p, item.head, row))
    recorder = Recorder(model.cfg, {name: _put(rows, length) for name, rows in puts.items()})
    if corrupt.depth:  # no stream: the block reads the embedding and the outputs before it
        x = corrupt.depth_entering(model, block, start, B, x if block == 0 else None)
    for i in range(block, last + 1):
        cache = LayerCache(length)
        if start:
            cache.extend(
                corrupt.keys[i][:, :, :start].expand(B, -1, -1, -1),
                corrupt.values[i][:, :, :start].expand(B, -1, -1, -1),
            )
        scoped = recorder.scoped(stages.block_prefix(i)) if i == block else None
        x = model.blocks[i](x, scoped, cache, i == last)
    if corrupt.depth:  # the final norm's read over everything the blocks wrote
        x = model.final_depth(x)
    return x[:, -1]


def _put(rows: list[tuple[int, int, int | None, Tensor]], length: int):
    """A replacement that writes clean rows into the batch: (member, position, head, row). The
    value holds the last rows of the prompt (from the group's first changed row, or the last one
    alone past the last block's attention), so position p is at p - (length - rows held)."""

    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
        value = value.clone()
        heads = value.dim() == 4  # [B, H, T, d]
        offset = length - value.shape[2 if heads else 1]
        for b, p, h, row in rows:
            if p >= offset:
                if heads:
                    value[b, h, p - offset] = row
                else:
                    value[b, p - offset] = row
        return value

    return apply
