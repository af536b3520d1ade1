"""The Recorder: every named stage of one forward pass (stages.py's names), recorded by the model's
own forward as it computes them, and the replacements an intervention makes of them. A recorder
knows every name its model computes, so a replacement for any other name is refused where it is
made instead of being silently never applied.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from torch import Tensor

from ..config import ModelConfig, Residual
from ..errors import MinigptError
from . import stages

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
    other name is refused here, where it is made, instead of being silently never applied.

    `keep_graph` (a trace's gradient, inspection/gradients.py): each stage is kept as a node of the
    pass's autograd graph instead, one of its own (a view of the value the pass continues with), so
    the gradient of a loss with respect to it is what a change of that stage alone would do (with
    `norm = "none"`, `norm1` is not the `input` it equals: only attention reads it); and a
    replacement that reads a recorded stage (replace-residual's `attention`) reads that node, so
    the gradient flows through it. `detach()` drops the graph once it has been differentiated."""

    def __init__(self, cfg: ModelConfig, replacements: dict[str, Replacement] | None = None, keep_graph: bool = False):
        self.prefix = ""
        self.stages: dict[str, Tensor] = {}
        self.keep_graph = keep_graph
        self.replacements: dict[str, Replacement] = dict(replacements or {})
        rotated = stages.rotated_names(cfg.n_layer) if cfg.positions == "rope" else ()
        self.known = frozenset(stages.replaceable_names(cfg.n_layer, **stages.of(cfg)) + rotated)
        self.cfg = cfg
        unknown = [name for name in self.replacements if name not in self.known]
        if unknown:
            raise UnknownStageError("{unknown}", unknown=self._unknown(unknown, "a replacement"))

    def _unknown(self, names: list[str], what: str) -> str:
        cfg = self.cfg
        rotated = stages.ROTATED if cfg.positions == "rope" else ()
        depth = (stages.DEPTH_WEIGHTS1, stages.DEPTH_WEIGHTS2) if cfg.residual_kind is Residual.ATTENTION else ()
        per_block = [*rotated, *depth, stages.ATTENTION_WEIGHTS, *stages.block_stages(**stages.of(cfg)), stages.HEADS]
        return (
            f"{what} for {', '.join(map(repr, names))}: this model computes no such stage; it has "
            f"{stages.INPUT}, {stages.FINAL_NORM}, {stages.LOGITS} and blocks.I.STAGE for I in 0..{cfg.n_layer - 1} "
            f"with STAGE one of {', '.join(per_block)} ({cfg.norm_position}-norm)"
        )

    def _check(self, name: str) -> str:
        full = self.prefix + name
        if full not in self.known:  # a name model.py records that stages.py does not define
            raise UnknownStageError("{unknown}", unknown=self._unknown([full], "a record"))
        return full

    def modify(self, name: str, value: Tensor) -> Tensor:
        """`value`, or what a replacement for this stage makes of it."""
        replace = self.replacements.get(self._check(name))
        return value if replace is None else replace(value, self.stages)

    def record(self, name: str, value: Tensor) -> Tensor:
        """Keep `value` (or its replacement) under `name` and hand it back, so the forward pass reads
        `x = tap(name, f(...))`."""
        value = self.modify(name, value)
        if self.keep_graph:
            value = _node(value)
        self.stages[self.prefix + name] = value if self.keep_graph else value.detach()
        return value

    def detach(self) -> None:
        """Every stage kept without its graph (after `keep_graph`'s gradient): the values alone."""
        for name, value in self.stages.items():
            self.stages[name] = value.detach()

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


def _node(value: Tensor) -> Tensor:
    """`value` as a node of the graph of its own: a view (the same numbers, no copy) that only what
    reads this stage reads; a leaf that requires a gradient where nothing before it did (a model
    whose parameters are all frozen), so the stages after it are differentiable still."""
    return value.view_as(value) if value.requires_grad else value.detach().requires_grad_(True)
