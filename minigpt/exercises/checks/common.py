"""What every exercise's checks share: a check (what it says when it passes, and a function that
names the mistake in words when it does not), the learner's code called so that what it raises is
one line, numbers written as a learner reads them, and the explanation of a wrong output by the
known mistakes that reproduce it.

A check compares the learner's module with minigpt's own (minigpt/model/layers.py) on the same
weights; to say *which* mistake made a difference, `explain` recomputes the part with each known
mistake (and each combination of them, fewest first) and keeps the first that gives what the
learner's code gave.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..learner import LearnerFile, describe, where_raised


@dataclass(frozen=True)
class Check:
    """One check: `says` when it passes; `run()` returns None when it passes, else the mistake."""

    says: str
    run: Callable[[], str | None]


@dataclass(frozen=True)
class Group:
    """The checks of one name the learner defines, in order: once the learner's code raises in one of
    them, the rest of the group is not run (each would raise the same)."""

    subject: str
    checks: list[Check]


class Stop(Exception):
    """A mistake after which the rest of the group cannot run (its message is the check's line)."""


class Raised(Stop):
    """The learner's code raised while a check called it: said in one line, with the file's line."""

    def __init__(self, what: str, exc: BaseException, path: Path):
        super().__init__(f"{what} raised {describe(exc)}{where_raised(exc, path)}")


class Probe:
    """Calls into one learner's file; whatever the code raises becomes a Raised naming the call."""

    def __init__(self, learner: LearnerFile):
        self.learner, self.path = learner, learner.path

    def call(self, what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:  # the learner's code, whatever it raises
            raise Raised(what, exc, self.path) from None

    def build(self, name: str, *args: Any) -> nn.Module:
        """The learner's class `name` built with `args`, in float64 (the checks' precision)."""
        shown = f"{name}({', '.join(map(_arg, args))})"
        module = self.call(shown, self.learner[name], *args)
        if not isinstance(module, nn.Module):
            raise Raised(shown, TypeError(f"it is a {type(module).__name__}, not an nn.Module"), self.path)
        return module.double()

    def forward(self, name: str, module: nn.Module, *args: Any) -> Any:
        return self.call(f"{name}.forward", module, *args)


def _arg(value: Any) -> str:
    return type(value).__name__ if isinstance(value, nn.Module) else repr(value)


# ---------------------------------------------------------------- numbers as a learner reads them


def number(value: float, digits: int = 4) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def row(values: Tensor | list, digits: int = 4) -> str:
    """`[1, -0.5, 2.25]`: a tensor's numbers, flattened."""
    flat = values.detach().reshape(-1).tolist() if isinstance(values, Tensor) else list(values)
    return "[" + ", ".join(number(float(v), digits) for v in flat) + "]"


def shape(t: Any) -> str:
    return str(list(t.shape)) if isinstance(t, Tensor) else type(t).__name__


def close(a: Any, b: Tensor, tolerance: float = 1e-6, nan_equal: bool = False) -> bool:
    """`a` is a tensor of `b`'s shape with the same values, within `tolerance` (relative and absolute)."""
    if not isinstance(a, Tensor) or a.shape != b.shape:
        return False
    return bool(
        torch.allclose(a.detach().double(), b.detach().double(), rtol=tolerance, atol=tolerance, equal_nan=nan_equal)
    )


def explain(output: Any, compute: Callable[..., Tensor], options: dict[str, list]) -> dict[str, Any] | None:
    """The choices under which `compute(**choices)` gives `output`: each option's first value is the
    right one, and the combination with the fewest wrong choices is found first; None when no
    combination of the known mistakes reproduces it."""
    if not isinstance(output, Tensor):
        return None
    names = list(options)
    combinations = sorted(
        itertools.product(*(range(len(options[n])) for n in names)), key=lambda c: sum(i > 0 for i in c)
    )
    for combination in combinations:
        choices = {n: options[n][i] for n, i in zip(names, combination)}
        try:
            expected = compute(**choices)
        except (RuntimeError, ValueError):  # a mistake that cannot be computed at this shape
            continue
        if close(output, expected, nan_equal=True):
            return choices
    return None


def randn(*size: int, seed: int) -> Tensor:
    return torch.randn(*size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------- checks every module gets


def linear_calls(module: nn.Module, names: tuple[str, ...], run: Callable[[], Any]) -> dict[str, int]:
    """How many times each named Linear of `module` is called while `run()` runs. A trace records
    what enters each Linear (a hook on the call), so a product with its weight instead goes unseen."""
    calls = dict.fromkeys(names, 0)
    handles = [
        getattr(module, linear).register_forward_pre_hook(
            lambda m, args, linear=linear: calls.__setitem__(linear, calls[linear] + 1)
        )
        for linear in names
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return calls


def parameters_check(build: Callable[[], nn.Module], shown: str, expected: dict[str, list[int]], why: str) -> Check:
    """The module builds and its parameters are named and shaped as minigpt's are (what a run's
    checkpoint stores, and what the model's initialisation and the trace find); without them the
    other checks, which load minigpt's weights into it, cannot run."""

    def run() -> str | None:
        module = build()
        got = {name: list(t.shape) for name, t in module.state_dict().items()}
        if got != expected:
            raise Stop(
                f"{shown} has the parameters {_names(got)}; a run's checkpoint names them {_names(expected)}: "
                f"keep the starter's names and shapes ({why})"
            )
        return None

    return Check(f"{shown} builds, with the parameters {_names(expected)}", run)


def _names(shapes: dict[str, list[int]]) -> str:
    return ", ".join(f"{name} {size}" for name, size in shapes.items()) or "none"


def unchanged_input_check(probe: Probe, name: str, run_on: Callable[[Tensor], Any], x: Tensor) -> Check:
    """The lesson's last failure mode: an in-place edit of the saved input."""

    def run() -> str | None:
        given, before = x.clone(), x.clone()
        probe.forward(name, lambda t: run_on(t), given)
        if not torch.equal(given, before):
            changed = (given != before).reshape(-1).nonzero()[0].item()
            return (
                f"your {name} changes its input in place: its input's number {changed} was "
                f"{number(before.reshape(-1)[changed].item())} and is now {number(given.reshape(-1)[changed].item())}; "
                "compute new tensors (x * s, not x *= s or x.mul_(s)), so that x + update adds to the untouched x"
            )
        return None

    return Check(f"{name} leaves its input unchanged (no in-place edit of x)", run)


def device_check(probe: Probe, name: str, build: Callable[[], nn.Module], x: Tensor) -> Check:
    """The module runs on the device its input is on: a tensor made without `device=x.device` (a
    mask, a constant) stays on the CPU, and on a GPU the model would stop. Run on PyTorch's `meta`
    device, which has no numbers, so a CPU tensor mixed in is refused without a GPU."""

    def run() -> str | None:
        module = build().to("meta")
        try:
            with torch.no_grad():
                module(x.to("meta"))
        except Exception as exc:  # the learner's code, whatever it raises off the CPU
            return (
                f"your {name} does not run on another device than the CPU ({describe(exc)}"
                f"{where_raised(exc, probe.path)}): make every tensor you create on x's device, "
                "e.g. torch.ones(T, T, dtype=torch.bool, device=x.device)"
            )
        return None

    return Check(f"{name} runs on its input's device (every tensor it makes is made there)", run)


def gradient_check(
    probe: Probe, name: str, pair: Callable[[], tuple[nn.Module, nn.Module]], x: Tensor, parameters: tuple[str, ...]
) -> Check:
    """Gradients reach the input and every named parameter as they reach minigpt's module (`pair()`:
    the learner's and minigpt's, with the same weights): a .detach(), .data or .item() inside forward
    cuts the graph, and training would not learn through it."""

    def run() -> str | None:
        mine, theirs = pair()
        grads, outputs = [], []
        for module in (theirs, mine):
            given = x.clone().requires_grad_(True)
            out = probe.forward(name, module, given) if module is mine else module(given)
            if not isinstance(out, Tensor) or not out.requires_grad:
                return (
                    f"no gradient flows through your {name}: forward must compute its output from x and the "
                    "parameters with torch operations (no .detach(), .data, .item() or .numpy())"
                )
            (out * randn(*out.shape, seed=9)).sum().backward()
            grads.append((given.grad, {p: module.get_parameter(p).grad for p in parameters}))
            outputs.append(out.detach())
        (x_theirs, p_theirs), (x_mine, p_mine) = grads
        for p in parameters:
            if p_mine[p] is None:
                return (
                    f"no gradient reaches your {name}'s {p}: forward must use it through torch operations "
                    "(no .detach() or .data), or training cannot learn it"
                )
        if not close(outputs[1], outputs[0], 1e-9):  # other values: other gradients, said by the checks above
            return None
        for p in parameters:
            if not close(p_mine[p], p_theirs[p], 1e-5):
                return (
                    f"the gradient of your {name}'s {p} differs from minigpt's: part of forward is cut from "
                    "the graph (.detach(), .data)"
                )
        if x_mine is None or not close(x_mine, x_theirs, 1e-5):
            return (
                f"the gradient reaching your {name}'s input differs from minigpt's: part of forward is cut "
                "from the graph (.detach(), .data)"
            )
        return None

    return Check(f"gradients reach {name}'s input and {', '.join(parameters)}, as minigpt's", run)


def fit_check(says: str, fitted: Callable[[], Fitted], words: Callable[[dict], str | None]) -> Check:
    """A check read from the explanation of a wrong output (`fitted`): it passes when the output is
    minigpt's, names its own mistake when the explanation has it, and says how the output differs
    when no known mistake explains it (the same line for every such check: said once)."""

    def run() -> str | None:
        fit = fitted()
        if close(fit.output, fit.expected):
            return None
        if fit.choices is None:
            return fit.unexplained()
        return words(fit.choices)

    return Check(says, run)


@dataclass(frozen=True)
class Fitted:
    """The learner's output on one probe, minigpt's, and the known mistakes that explain the difference."""

    given: Tensor
    output: Any
    expected: Tensor
    choices: dict[str, Any] | None
    name: str
    formula: str

    def unexplained(self) -> str:
        first = self.given.reshape(-1, self.given.shape[-1])[0]
        out = self.output
        shown = row(out.reshape(-1, out.shape[-1])[0]) if isinstance(out, Tensor) and out.dim() else shape(out)
        return (
            f"your {self.name} differs from {self.formula} in a way these checks do not name: on the row {row(first)} "
            f"it gave {shown}, minigpt's gives {row(self.expected.reshape(-1, self.expected.shape[-1])[0])}"
        )


def fitting(probe: Probe, name: str, formula: str, pair, given: Tensor, compute, options) -> Callable[[], Fitted]:
    """`fitted()`: the learner's output on `given` (`pair()` builds the learner's module and minigpt's with
    the same weights), minigpt's, and the explanation by `compute(given, theirs, **choices)` over
    `options` (see `explain`); computed once."""
    memo: list[Fitted] = []

    def fitted() -> Fitted:
        if not memo:
            mine, theirs = pair()
            with torch.no_grad():
                output = probe.forward(name, mine, given.clone())
                expected = theirs(given.clone())
                choices = None
                if not close(output, expected):
                    choices = explain(output, lambda **c: compute(given, theirs, **c), options)
            memo.append(Fitted(given, output, expected, choices, name, formula))
        return memo[0]

    return fitted
