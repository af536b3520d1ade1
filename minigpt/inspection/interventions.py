"""Interventions on the residual stream: change one stage of the forward pass and see what follows.

Each intervention becomes a replacement on the model's own Recorder (model.py), so it runs through
the same forward pass the trace reads; nothing here computes a block a second time.

    Scale(block, "attention" | "ffn", K)   that sublayer's update times K (0 removes it)
    ReplaceResidual(block)                 the broken mode: residual1 = attention and the second sum
                                           (pre-norm: output; post-norm: residual2) = ffn
    AblateHead(block, H)                   head H's mixed values set to zero before W_O
    SetInput(vector)                       the traced position's block-0 input row replaced
    BroadcastUpdate(block, stage)          a sublayer's update replaced by its position-0 row alone,
                                           [B, 1, C]: the residual add refuses it (chapter 17.2)
    SetRow(table, row, vector)             a row of the token or position table set, in a copy of
                                           the weights (weight_edits.py; never the run's own)
    NormOverPositions()                    every block's norms averaging over the positions, broken
                                           on purpose (chapter 17.3), in a copy of the model
    PutBack(block, stage, position, head, values)
                                           a patch (patching.py) traced: the clean prompt's recorded
                                           activation written into this pass (trace.put_back reads
                                           Run.trace's `patch` and records it)

`block` is an index or None for every block. They apply at every position of the prompt, or at the
traced position only when asked (SetInput always applies at the traced position; PutBack where its
own position says). The stages they change are named by stages.py, and the Recorder refuses any
name the model does not compute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..config import Residual
from ..errors import MinigptError, Phrase, parameter
from ..model import stages
from ..model.gpt import MiniGPT
from ..model.recorder import Replacement


@dataclass(frozen=True)
class Scale:
    block: int | None
    stage: str
    factor: float

    def __str__(self) -> str:
        return f"scale {_block(self.block)}.{self.stage}={self.factor:g}"


@dataclass(frozen=True)
class ReplaceResidual:
    block: int | None

    def __str__(self) -> str:
        return f"replace-residual {_block(self.block)}"


@dataclass(frozen=True)
class AblateHead:
    block: int | None
    head: int

    def __str__(self) -> str:
        return f"ablate-head {_block(self.block)}.{self.head}"


@dataclass(frozen=True)
class SetInput:
    vector: tuple[float, ...]

    def __str__(self) -> str:
        return "set-input " + ",".join(f"{v:g}" for v in self.vector)


@dataclass(frozen=True)
class BroadcastUpdate:
    """Block `block`'s `stage` update (attention or ffn) replaced by its row at position 0 alone,
    shape [B, 1, C], for the residual add to broadcast over every position: which it refuses."""

    block: int | None
    stage: str

    def __str__(self) -> str:
        return f"broadcast-update {_block(self.block)}.{self.stage}"


@dataclass(frozen=True)
class SetRow:
    """A row of `table` (token_table: `row` a token's text or #ID; position_table: a position) set
    to `vector` in a copy of the weights: every position that reads the row gets it, and with a
    tied head the head reads it too. `row` as given; weight_edits.py resolves it."""

    table: str
    row: str
    vector: tuple[float, ...]
    index: int | None = None  # a token_table row's id, once resolved with the run's tokenizer (Run.trace)

    def __str__(self) -> str:
        return f"set-row {self.table}.{self.row}=" + ",".join(f"{v:g}" for v in self.vector)

    @property
    def where(self) -> Phrase:
        """How the user wrote it, for a refusal: `--set-row token_table.a=2,1`."""
        return Phrase("{set_row} {text}", text=str(self).removeprefix("set-row "))


@dataclass(frozen=True)
class NormOverPositions:
    """Every block's norm1 and norm2 computing their statistics over the positions instead of the
    coordinates (chapter 17.3's wrong axis, exercise 3), in a copy of the model: for watching a
    later token change an earlier row, never for training."""

    def __str__(self) -> str:
        return "norm-over positions"


@dataclass(frozen=True)
class PutBack:
    """One patch of `Run.patch` in a traced pass: block `block`'s `stage` (`input`: what enters the
    block; `heads`: head `head`'s mixed values before W_O) at `position` (None: every position) set
    to the clean prompt's, whose pass recorded that stage whole in `values` ([1, T, C]; heads
    [1, H, T, d])."""

    block: int
    stage: str
    position: int | None
    head: int | None
    values: Tensor = field(compare=False, repr=False)

    def __str__(self) -> str:
        head = "" if self.head is None else f".{self.head}"
        at = "all" if self.position is None else self.position
        return f"patch {self.block}.{self.stage}{head}@{at} from clean"


Intervention = Scale | ReplaceResidual | AblateHead | SetInput | PutBack | BroadcastUpdate | SetRow | NormOverPositions
# Interventions that change the model itself, carried out on a copy of it (weight_edits.py), not
# by a replacement of a stage.
MODEL_EDITS = (SetRow, NormOverPositions)
TABLES = ("token_table", "position_table")


def _block(block: int | None) -> str:
    return "all" if block is None else str(block)


def _blocks(block: int | None, n_layer: int, what: str | Phrase) -> list[int]:
    if block is None:
        return list(range(n_layer))
    if not 0 <= block < n_layer:
        raise MinigptError(
            "{what}: block {block} does not exist; the model has {n_layer} block(s), 0..{last}, or use 'all'",
            what=what,
            block=block,
            n_layer=n_layer,
            last=n_layer - 1,
        )
    return [block]


def check(interventions: list[Intervention], model: MiniGPT) -> None:
    """Refuse what this model cannot take, in one line each: blocks, heads, widths, factors."""
    cfg = model.cfg
    for item in interventions:
        if isinstance(item, Scale):
            if item.stage not in stages.SCALABLE:
                raise MinigptError(
                    "{scale} {block}.{stage}: unknown stage {stage!r}; scale one of: {join}",
                    block=_block(item.block),
                    stage=item.stage,
                    join=", ".join(stages.SCALABLE),
                )
            if item.stage == stages.FFN and cfg.ffn_hidden == 0:
                raise MinigptError(
                    "{scale} {block}.ffn: this model has no FFN ([model] ffn_hidden = 0), so there is no ffn "
                    "update to scale; scale attention",
                    block=_block(item.block),
                )
            if not math.isfinite(item.factor):
                raise MinigptError(
                    "{scale} {block}.{stage}={factor}: the factor must be a finite number, e.g. 0, 0.5 or 2",
                    block=_block(item.block),
                    stage=item.stage,
                    factor=item.factor,
                )
        if isinstance(item, ReplaceResidual) and cfg.residual_kind is Residual.ATTENTION:
            raise MinigptError(
                '{replace_residual}: this model has no residual stream ([model] residual = "attention"): each '
                "sublayer reads a learned mix of the embedding and the earlier sublayers' outputs, with no sum "
                "to replace; scale a sublayer's output ({scale}) to change what every later read mixes"
            )
        if isinstance(item, ReplaceResidual) and cfg.residual_kind is Residual.NONE:
            raise MinigptError(
                "{replace_residual}: this model has no residual ([model] residual = false); each sum is already "
                "its update alone, so there is no residual to replace"
            )
        if isinstance(item, BroadcastUpdate):
            _check_broadcast(item, cfg)
        if isinstance(item, (Scale, ReplaceResidual, AblateHead, BroadcastUpdate)):
            _blocks(item.block, cfg.n_layer, parameter(str(item).split(" ")[0].replace("-", "_")))
        if isinstance(item, AblateHead) and not 0 <= item.head < cfg.n_head:
            raise MinigptError(
                "{ablate_head} {block}.{head}: head {head} does not exist; the model has {n_head} heads, 0..{last}",
                block=_block(item.block),
                head=item.head,
                n_head=cfg.n_head,
                last=cfg.n_head - 1,
            )
        if isinstance(item, SetInput) and len(item.vector) != cfg.n_embd:
            raise MinigptError(
                "{set_input} has {n_vector} numbers but the model's width is {n_embd}; give exactly {n_embd} "
                "comma-separated numbers",
                n_vector=len(item.vector),
                n_embd=cfg.n_embd,
            )
        if isinstance(item, SetInput) and not all(math.isfinite(v) for v in item.vector):
            raise MinigptError("{set_input}: every number must be finite")
        if isinstance(item, PutBack):
            length = item.values.shape[2 if item.stage == stages.HEADS else 1]
            _check_put_back(item.block, item.stage, item.position, item.head, model, length)


def _check_broadcast(item: BroadcastUpdate, cfg) -> None:
    if item.stage not in stages.SCALABLE:
        raise MinigptError(
            "{broadcast_update} {block}.{stage}: unknown update {stage!r}; broadcast one of: {join}",
            block=_block(item.block),
            stage=item.stage,
            join=", ".join(stages.SCALABLE),
        )
    if item.stage == stages.FFN and cfg.ffn_hidden == 0:
        raise MinigptError(
            "{broadcast_update} {block}.ffn: this model has no FFN ([model] ffn_hidden = 0); broadcast "
            "the attention update",
            block=_block(item.block),
        )
    if cfg.residual_kind is Residual.ATTENTION:
        raise MinigptError(
            '{broadcast_update}: this model has no residual add ([model] residual = "attention") to refuse the '
            "broadcast: each sublayer's output is weighed by a mix over depth, not added to a stream; use a run "
            "with the residual"
        )
    if cfg.residual_kind is Residual.NONE:
        raise MinigptError(
            "{broadcast_update}: this model has no residual add ([model] residual = false) to refuse the "
            "broadcast; use a run with the residual"
        )


def replacements(
    interventions: list[Intervention], model: MiniGPT, position: int, only_at_position: bool = False
) -> dict[str, Replacement]:
    """The Recorder replacements that carry out `interventions` (checked first)."""
    check(interventions, model)
    cfg = model.cfg
    second_sum = stages.second_sum(cfg.norm_position)
    found: dict[str, list[Replacement]] = {}

    def add(stage: str, change: Replacement, time_axis: int = 1, everywhere: bool = not only_at_position) -> None:
        found.setdefault(stage, []).append(change if everywhere else _at(position, time_axis, change))

    for item in interventions:
        if isinstance(item, SetInput):
            add(stages.INPUT, _set_row(position, item.vector), everywhere=False)
            continue
        if isinstance(item, PutBack):  # at its own position, never moved to the traced one
            add(put_back_name(item.block, item.stage), _put_clean(item), everywhere=True)
            continue
        if isinstance(item, MODEL_EDITS):  # carried out on a copy of the model (weight_edits.py)
            continue
        for i in _blocks(item.block, cfg.n_layer, str(item)):
            if isinstance(item, Scale):
                add(stages.block_name(i, item.stage), lambda value, recorded, k=item.factor: value * k)
            elif isinstance(item, BroadcastUpdate):  # one row for every position: never at one position only
                add(stages.block_name(i, item.stage), _first_row, everywhere=True)
            elif isinstance(item, ReplaceResidual):  # each sum replaced by its update alone
                attention, ffn = stages.block_name(i, stages.ATTENTION), stages.block_name(i, stages.FFN)
                add(stages.block_name(i, stages.RESIDUAL1), lambda value, recorded, n=attention: recorded[n])
                if cfg.ffn_hidden > 0:  # without an FFN the block's one sum is residual1
                    add(stages.block_name(i, second_sum), lambda value, recorded, n=ffn: recorded[n])
            else:
                add(stages.block_name(i, stages.HEADS), _zero_head(item.head), time_axis=2)
    return {stage: _chain(changes) for stage, changes in found.items()}


def _chain(changes: list[Replacement]) -> Replacement:
    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
        for change in changes:
            value = change(value, recorded)
        return value

    return apply


def _at(position: int, time_axis: int, change: Replacement) -> Replacement:
    """`change` at one position only; every other position keeps the value the pass computed."""

    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
        changed = change(value, recorded)
        keep = torch.arange(value.shape[time_axis], device=value.device) == position
        shape = [1] * value.dim()
        shape[time_axis] = value.shape[time_axis]
        return torch.where(keep.view(shape), changed, value)

    return apply


def _set_row(position: int, vector: tuple[float, ...]) -> Replacement:
    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
        value = value.clone()
        value[:, position] = torch.tensor(vector, dtype=value.dtype, device=value.device)
        return value

    return apply


def _first_row(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
    """The update at position 0 alone, [B, 1, C]: what a broadcast would add at every position."""
    return value[:, :1]


def _zero_head(head: int) -> Replacement:
    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:  # [B, H, T, d]
        value = value.clone()
        value[:, head] = 0
        return value

    return apply


def put_back_name(block: int, stage: str) -> str:
    """The name a pass records block `block`'s `stage` under, which a patch reads from the clean
    pass and writes into the traced one: a block's input is the `input` entering block 0, else the
    previous block's `output` (one tensor, as patching.Pass reads it; Attention Residuals has none
    past block 0, which _check_put_back refuses)."""
    if stage == stages.INPUT:
        return stages.INPUT if block == 0 else stages.block_name(block - 1, stages.OUTPUT)
    return stages.block_name(block, stage)


def _put_clean(item: PutBack) -> Replacement:
    rows = slice(None) if item.position is None else item.position

    def apply(value: Tensor, recorded: dict[str, Tensor]) -> Tensor:
        value = value.clone()
        if item.stage == stages.HEADS:  # [B, H, T, d]: one head's mixed values
            value[:, item.head, rows] = item.values[:, item.head, rows]
        else:
            value[:, rows] = item.values[:, rows]
        return value

    return apply


# ---------------------------------------------------------------- a patch, from Run.trace's mapping

PATCH_KEYS = ("clean", "block", "stage", "position", "head")


def read_patch(patch: Any, model: MiniGPT, length: int) -> tuple[str | list[int], int, str, int | None, int | None]:
    """Run.trace's `patch` mapping as (clean, block, stage, position, head), each of the type it
    must have and where this model and a traced prompt of `length` tokens have it (the clean
    prompt is checked where it is read: trace.put_back)."""
    clean, block, stage, position, head = _patch_fields(patch)
    _check_put_back(block, stage, position, head, model, length)
    return clean, block, stage, position, head


def _patch_fields(patch: Any) -> tuple[str | list[int], int, str, int | None, int | None]:
    """The patch's fields, each of the type it must have (no parameter is named: the command line
    has no patch)."""
    if not isinstance(patch, Mapping):
        raise MinigptError(
            "the patch {given!r} must be a mapping of {keys}: the clean prompt (a text or token ids), "
            "where to put its activation back, and for a patch of heads which head",
            given=patch,
            keys=", ".join(PATCH_KEYS),
        )
    unknown = [key for key in patch if key not in PATCH_KEYS]
    if unknown:
        raise MinigptError(
            "the patch has unknown key(s) {unknown}; it takes: {keys}",
            unknown=", ".join(map(repr, unknown)),
            keys=", ".join(PATCH_KEYS),
        )
    clean, block, stage = patch.get("clean"), patch.get("block"), patch.get("stage")
    position, head = patch.get("position"), patch.get("head")
    if not clean or not (isinstance(clean, str) or (isinstance(clean, Sequence) and all(map(_is_integer, clean)))):
        raise MinigptError(
            "the patch's clean prompt {given!r} must be a non-empty text or list of token ids", given=clean
        )
    for name, value, optional in (("block", block, False), ("position", position, True), ("head", head, True)):
        if not (_is_integer(value) or (optional and value is None)):
            raise MinigptError(
                "the patch's {name} {given!r} must be an integer{or_none}",
                name=name,
                given=value,
                or_none=" or None" if optional else "",
            )
    return clean, block, stage, position, head


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_put_back(block: int, stage: str, position: int | None, head: int | None, model: MiniGPT, length: int):
    """Refuse a patch this model and a prompt of `length` tokens cannot take, in one line each."""
    cfg = model.cfg
    known = (stages.INPUT, *stages.block_stages(**stages.of(cfg)), stages.HEADS)  # what a block's pass records
    if stage not in known:
        raise MinigptError(
            "the patch's stage {given!r} is not one of this model's block stages: {known}",
            given=stage,
            known=", ".join(known),
        )
    if not 0 <= block < cfg.n_layer:
        raise MinigptError(
            "the patch's block {given} does not exist; the model has {n_layer} block(s), 0..{last}",
            given=block,
            n_layer=cfg.n_layer,
            last=cfg.n_layer - 1,
        )
    if stage == stages.INPUT and block > 0 and cfg.residual_kind is Residual.ATTENTION:
        raise MinigptError(
            "the patch's stage input: block {given} of this model has no input row ([model] residual = "
            '"attention": each sublayer reads its own mix over depth); patch block 0\'s input (the embedding), '
            "a sublayer's output (attention, ffn) or a read (read1, read2)",
            given=block,
        )
    if position is not None and not 0 <= position < length:
        raise MinigptError(
            "the patch's position {given} is beyond the prompt: it has {length} token(s), positions 0..{last}, "
            "or None for every position at once",
            given=position,
            length=length,
            last=length - 1,
        )
    if stage == stages.HEADS and head is None:
        raise MinigptError(
            "a patch of heads puts back one head's mixed values: give the patch's head, 0..{last}",
            last=cfg.n_head - 1,
        )
    if stage == stages.HEADS and not 0 <= head < cfg.n_head:
        raise MinigptError(
            "the patch's head {given} does not exist; the model has {n_head} heads, 0..{last}",
            given=head,
            n_head=cfg.n_head,
            last=cfg.n_head - 1,
        )
    if stage != stages.HEADS and head is not None:
        raise MinigptError(
            "the patch's head {given} is for a patch of heads; a patch of {stage} puts back the whole row: "
            "leave the head out (None)",
            given=head,
            stage=stage,
        )


# ---------------------------------------------------------------- from text


def parse(
    scale: Sequence[str] = (),
    replace_residual: Sequence[str] = (),
    ablate_head: Sequence[str] = (),
    set_input: str | None = None,
    set_row: Sequence[str] = (),
    norm_over: str | None = None,
    broadcast_update: Sequence[str] = (),
) -> list[Intervention]:
    """Interventions written as text: scale `B.attention=K`, replace_residual `B`, ablate_head
    `B.H`, set_input `"2,2,2,2"`, set_row `token_table.a=2,1` (a token's text or #ID) or
    `position_table.1=0,1`, norm_over `positions` (`coordinates`: the model's own norm, no
    intervention), broadcast_update `B.attention` (B: a block index or `all`). Whether they fit the
    model (blocks, heads, width, rows) is checked when the model is known (`check`, weight_edits)."""
    out: list[Intervention] = []
    for text in scale:
        where = Phrase("{scale} {text}", text=text)
        target, sep, factor = text.partition("=")
        block, dot, stage = target.partition(".")
        if not sep or not dot:
            raise MinigptError(
                "{scale} {text!r}: expected BLOCK.STAGE=FACTOR, e.g. {scale} 0.attention=0 or {scale} all.ffn=0.5",
                text=text,
            )
        out.append(Scale(_block_index(block, where), stage.strip(), _number(factor, where)))
    for text in replace_residual:
        out.append(ReplaceResidual(_block_index(text, Phrase("{replace_residual} {text}", text=text))))
    for text in ablate_head:
        where = Phrase("{ablate_head} {text}", text=text)
        block, dot, head = text.partition(".")
        if not dot:
            raise MinigptError("{ablate_head} {text!r}: expected BLOCK.HEAD, e.g. {ablate_head} 0.1", text=text)
        out.append(AblateHead(_block_index(block, where), _integer(head, where, "head")))
    if set_input is not None:
        out.append(SetInput(tuple(_number(v, parameter("set_input")) for v in set_input.split(","))))
    out += [_parse_set_row(text) for text in set_row]
    if norm_over not in (None, "coordinates", "positions"):
        raise MinigptError(
            "{norm_over} {given!r}: expected coordinates (the model's own norm, chapter 17.3) or positions "
            "(the broken norm of exercise 3, for watching)",
            given=norm_over,
        )
    if norm_over == "positions":
        out.append(NormOverPositions())
    for text in broadcast_update:
        block, dot, stage = text.partition(".")
        if not dot:
            raise MinigptError(
                "{broadcast_update} {text!r}: expected BLOCK.UPDATE, e.g. {broadcast_update} 0.attention", text=text
            )
        where = Phrase("{broadcast_update} {text}", text=text)
        out.append(BroadcastUpdate(_block_index(block, where), stage.strip()))
    return out


def _parse_set_row(text: str) -> SetRow:
    """`TABLE.ROW=NUMBERS`: the numbers hold no `=`, so the last one splits (a token may be `=`)."""
    target, sep, numbers = text.rpartition("=")
    table, dot, row = target.partition(".")
    if not sep or not dot or not row:
        raise MinigptError(
            "{set_row} {text!r}: expected TABLE.ROW=NUMBERS, e.g. {set_row} token_table.a=2,1 (a token's text "
            "or #ID) or {set_row} position_table.1=0,1",
            text=text,
        )
    if table not in TABLES:
        raise MinigptError(
            "{set_row} {text!r}: unknown table {table!r}; set a row of {tables}",
            text=text,
            table=table,
            tables=" or ".join(TABLES),
        )
    where = Phrase("{set_row} {text}", text=text)
    return SetRow(table, row, tuple(_number(v, where) for v in numbers.split(",")))


def _block_index(text: str, where: str | Phrase) -> int | None:
    text = text.strip()
    return None if text == "all" else _integer(text, where, "block")


def _integer(text: str, where: str | Phrase, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        advice = "; give a block index or 'all'" if what == "block" else ""
        raise MinigptError(
            "{where}: {what} {strip!r} is not an integer{advice}",
            where=where,
            what=what,
            strip=text.strip(),
            advice=advice,
        ) from None


def _number(text: str, where: str | Phrase) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise MinigptError("{where}: {strip!r} is not a number", where=where, strip=text.strip()) from None
