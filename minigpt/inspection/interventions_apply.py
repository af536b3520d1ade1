"""Interventions carried out: each one checked against the model (`check`, one line a refusal)
and turned into a replacement on the model's own Recorder (model.py), so it runs through the same
forward pass the trace reads (`replacements`); nothing here computes a block a second time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..config import Residual
from ..errors import MinigptError, Phrase, parameter
from ..model import stages
from ..model.gpt import MiniGPT
from ..model.recorder import Replacement
from .interventions import (
    MODEL_EDITS,
    AblateHead,
    BroadcastUpdate,
    Intervention,
    PutBack,
    ReplaceResidual,
    Scale,
    SetInput,
    block_label,
)
from .put_back import check_put_back, put_back_name


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
                    block=block_label(item.block),
                    stage=item.stage,
                    join=", ".join(stages.SCALABLE),
                )
            if item.stage == stages.FFN and cfg.ffn_hidden == 0:
                raise MinigptError(
                    "{scale} {block}.ffn: this model has no FFN ([model] ffn_hidden = 0), so there is no ffn "
                    "update to scale; scale attention",
                    block=block_label(item.block),
                )
            if not math.isfinite(item.factor):
                raise MinigptError(
                    "{scale} {block}.{stage}={factor}: the factor must be a finite number, e.g. 0, 0.5 or 2",
                    block=block_label(item.block),
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
                block=block_label(item.block),
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
            check_put_back(item.block, item.stage, item.position, item.head, model, length)


def _check_broadcast(item: BroadcastUpdate, cfg) -> None:
    if item.stage not in stages.SCALABLE:
        raise MinigptError(
            "{broadcast_update} {block}.{stage}: unknown update {stage!r}; broadcast one of: {join}",
            block=block_label(item.block),
            stage=item.stage,
            join=", ".join(stages.SCALABLE),
        )
    if item.stage == stages.FFN and cfg.ffn_hidden == 0:
        raise MinigptError(
            "{broadcast_update} {block}.ffn: this model has no FFN ([model] ffn_hidden = 0); broadcast "
            "the attention update",
            block=block_label(item.block),
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
