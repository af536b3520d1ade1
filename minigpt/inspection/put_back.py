"""A patch (patching.py) put back into a traced pass: Run.trace's `patch` mapping read and checked
against the model and the prompt, and the name the stage it puts back is recorded under.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config import Residual
from ..errors import MinigptError
from ..model import stages
from ..model.gpt import MiniGPT


def put_back_name(block: int, stage: str) -> str:
    """The name a pass records block `block`'s `stage` under, which a patch reads from the clean
    pass and writes into the traced one: a block's input is the `input` entering block 0, else the
    previous block's `output` (one tensor, as patching.Pass reads it; Attention Residuals has none
    past block 0, which check_put_back refuses)."""
    if stage == stages.INPUT:
        return stages.INPUT if block == 0 else stages.block_name(block - 1, stages.OUTPUT)
    return stages.block_name(block, stage)


# ---------------------------------------------------------------- a patch, from Run.trace's mapping

PATCH_KEYS = ("clean", "block", "stage", "position", "head")


def read_patch(patch: Any, model: MiniGPT, length: int) -> tuple[str | list[int], int, str, int | None, int | None]:
    """Run.trace's `patch` mapping as (clean, block, stage, position, head), each of the type it
    must have and where this model and a traced prompt of `length` tokens have it (the clean
    prompt is checked where it is read: trace.put_back)."""
    clean, block, stage, position, head = _patch_fields(patch)
    check_put_back(block, stage, position, head, model, length)
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


def check_put_back(block: int, stage: str, position: int | None, head: int | None, model: MiniGPT, length: int):
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
