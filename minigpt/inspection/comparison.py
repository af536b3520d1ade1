"""Two passes side by side, stage by stage at one position (`trace --compare`, `--compare-run`,
`--compare-ids`): the unmodified and the modified pass of one model, two runs of one shape, or two
prompts of one length; each stage's norms before and after, the norm of the change, and the KL
divergence of the two next-token distributions. Two runs are aligned by stage name, so a pre-norm
run can be compared with its post-norm copy (chapter 17.6)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import MinigptError
from ..model import stages
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer
from .gradients import Target
from .interventions import Intervention
from .trace import BlockTrace, Trace, plain, trace_position


@dataclass
class StageChange:
    """One stage at the traced position, before and after the interventions. Two runs whose blocks
    compute in another order (pre-norm and post-norm) each have a stage the other has not
    (post-norm's residual2): None on the side that has none."""

    before: list[float] | None
    after: list[float] | None
    norm_before: float | None
    norm_after: float | None
    change: float | None  # the norm of after - before


@dataclass
class Comparison:
    """Two passes, stage by stage at one position: the unmodified and the modified pass of one model;
    or (`compared_run` set) another run's pass and this run's; or (`compared_ids`) another prompt's
    pass and this one's; the last two each with the same `interventions`."""

    interventions: list[str]
    before: Trace
    after: Trace
    stages: list[dict[str, StageChange]]  # per shown block: "input" and each stage
    kl_divergence: float  # KL(before || after) of the two next-token distributions, in nats
    run: str | None = None  # comparing runs: the run folder of `after`
    compared_run: str | None = None  # and of `before`; in the JSON only then
    compared_ids: list[int] | None = None  # comparing prompts: `before`'s ids; in the JSON only then

    def as_dict(self) -> dict[str, Any]:
        runs = {} if self.compared_run is None else {"run": self.run, "compared_run": self.compared_run}
        if self.compared_ids is not None:
            runs["compared_ids"] = self.compared_ids
        return {
            **runs,
            "interventions": self.interventions,
            "before": self.before.as_dict(),
            "after": self.after.as_dict(),
            "kl_divergence": self.kl_divergence,
            "stages": [{name: plain(change) for name, change in block.items()} for block in self.stages],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


def compare(
    model: MiniGPT,
    tokenizer: TextTokenizer,
    ids: list[int],
    interventions: Sequence[Intervention],
    position: int | None = None,
    block: int | None = None,
    top: int = 5,
    only_at_position: bool = False,
    grad: bool = False,
    target: int | None = None,
    *,
    before_model: MiniGPT | None = None,
    before_ids: list[int] | None = None,
) -> Comparison:
    """The same prompt traced without and with `interventions`: each stage's row at the traced
    position before and after, their norms and the norm of the change, and how far the next-token
    distribution moved (KL divergence, nats). `grad`: each pass's gradient, both of the loss of
    one target (at the last position by default the `before` pass's top prediction).

    `before_model`: another model of `model`'s shape (no shape_differences; its blocks may compute
    in the other order, `norm_position`) and tokenizer, another run's: `before` is then its pass
    and `after` this model's, both with `interventions`, so the changes are what the other weights
    compute differently. `before_ids`: another prompt of as many tokens, traced before with the
    same `interventions`, so the changes are what the other tokens change at this position (a
    later token changes nothing at an earlier position, unless something reads across positions
    without the causal mask: norm-over positions)."""
    if before_ids is not None and len(before_ids) != len(ids):
        raise MinigptError(
            "{compare_ids} has {n_before} tokens and the traced prompt {n_ids}; the two passes are compared "
            "position by position, so give as many tokens",
            n_before=len(before_ids),
            n_ids=len(ids),
        )
    edits_before = () if before_model is None and before_ids is None else interventions
    before = trace_position(
        model if before_model is None else before_model,
        tokenizer,
        ids if before_ids is None else before_ids,
        position,
        block,
        top,
        edits_before,
        only_at_position,
        grad=grad,
        target=target,
    )
    chosen = None if before.gradient is None else Target(before.gradient.target_id, before.gradient.target_from)
    after = trace_position(
        model, tokenizer, ids, position, block, top, interventions, only_at_position, grad=grad, target=chosen
    )
    changes = []
    for first, second in zip(before.blocks, after.blocks):
        rows = {} if first.input is None and second.input is None else {stages.INPUT: (_row(first), _row(second))}
        rows.update({name: (first.stages.get(name), second.stages.get(name)) for name in _aligned(first, second)})
        changes.append({name: _change(a, b) for name, (a, b) in rows.items()})
    kl = math.fsum(
        0.0 if p == 0 else math.inf if q == 0 else p * (math.log(p) - math.log(q))
        for p, q in zip(before.probabilities, after.probabilities)
    )
    compared_ids = None if before_ids is None else list(before_ids)
    return Comparison([str(item) for item in interventions], before, after, changes, kl, compared_ids=compared_ids)


def _row(block: BlockTrace) -> list[float] | None:
    """What enters the block, where one row does."""
    return None if block.input is None else block.input.row


def _aligned(first: BlockTrace, second: BlockTrace) -> list[str]:
    """Both blocks' stage names, in the order `second` computes them, a stage only `first` has
    (post-norm's residual2 beside a pre-norm block) after the stage it follows there."""
    names = list(second.stages)
    previous = None
    for name in first.stages:
        if name not in names:
            names.insert(names.index(previous) + 1 if previous in names else len(names), name)
        previous = name
    return names


# What two models must share for their passes to be compared stage by stage: the stages recorded
# (blocks, the FFN's, their order, the position row) and each one's shape, the heads whose weights
# are listed, and the vocabulary the next-token distributions are over. Everything else in [model]
# (the norm's kind, the activation, biases, the residual, the tied head, the dtype) changes what is
# computed, not what is recorded: the comparison shows it. The order (`norm_position`) may differ
# where the reader of the comparison aligns the stages by name (a trace's text and JSON: post-norm's
# residual2 has no pre-norm row beside it); ORDER_KEYS are the keys that allows.
SHAPE_KEYS = (
    "n_layer",
    "n_head",
    "n_kv_head",
    "head_width",
    "n_embd",
    "ffn_hidden",
    "context",
    "vocab_size",
    "norm_position",
    "positions",
)
# What architecture() leaves out at its default: the key and value heads (n_head's), a head's width
# (n_embd / n_head's)
SHAPE_DEFAULTS = {"n_kv_head": lambda arch: arch["n_head"], "head_width": lambda arch: arch["n_embd"] // arch["n_head"]}
ORDER_KEYS = ("norm_position",)


def shape_differences(model: MiniGPT, other: MiniGPT, order_may_differ: bool = False) -> list[str]:
    """`key this != other` for each SHAPE_KEYS entry where the two models differ (none: comparable);
    `order_may_differ`: not the ORDER_KEYS (pre-norm beside post-norm: the same parameters)."""
    given = model.architecture().keys() | other.architecture().keys()
    this, that = (_with_defaults(m.architecture()) for m in (model, other))
    # n_kv_head and head_width only where either run sets one (a head's width follows n_embd otherwise)
    keys = [key for key in SHAPE_KEYS if not (order_may_differ and key in ORDER_KEYS)]
    keys = [key for key in keys if key not in SHAPE_DEFAULTS or key in given]
    # Attention Residuals records other stages (read1 and read2; no residual1 and no output): beside
    # a model with a residual stream, or without one, half the rows would have nothing to compare with
    if "attention" in (this["residual"], that["residual"]):
        keys.append("residual")
    return [f"{key} {this[key]!r} != {that[key]!r}" for key in keys if this[key] != that[key]]


def _with_defaults(arch: dict[str, Any]) -> dict[str, Any]:
    return {**{key: default(arch) for key, default in SHAPE_DEFAULTS.items()}, **arch}


def row_norm(row: list[float]) -> float:
    """A row's Euclidean norm, its squares summed exactly (math.fsum)."""
    return math.sqrt(math.fsum(v * v for v in row))


def _change(before: list[float] | None, after: list[float] | None) -> StageChange:
    if before is None or after is None:  # a stage one of two runs' blocks does not compute
        return StageChange(before, after, _norm(before), _norm(after), None)
    return StageChange(
        before, after, row_norm(before), row_norm(after), row_norm([b - a for a, b in zip(before, after)])
    )


def _norm(row: list[float] | None) -> float | None:
    return None if row is None else row_norm(row)
