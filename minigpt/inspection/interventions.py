"""Interventions on the residual stream, as typed values and as parsed from text (`parse`): change
one stage of the forward pass and see what follows.

interventions_apply.py checks them against the model and turns each into a replacement on the
model's own Recorder (model.py), so it runs through the same forward pass the trace reads; nothing
computes a block a second time. put_back.py reads a patch's mapping for PutBack.

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

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import Tensor

from ..errors import MinigptError, Phrase, parameter


@dataclass(frozen=True)
class Scale:
    block: int | None
    stage: str
    factor: float

    def __str__(self) -> str:
        return f"scale {block_label(self.block)}.{self.stage}={self.factor:g}"


@dataclass(frozen=True)
class ReplaceResidual:
    block: int | None

    def __str__(self) -> str:
        return f"replace-residual {block_label(self.block)}"


@dataclass(frozen=True)
class AblateHead:
    block: int | None
    head: int

    def __str__(self) -> str:
        return f"ablate-head {block_label(self.block)}.{self.head}"


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
        return f"broadcast-update {block_label(self.block)}.{self.stage}"


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


def block_label(block: int | None) -> str:
    return "all" if block is None else str(block)


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
