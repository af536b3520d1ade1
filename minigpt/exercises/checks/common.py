"""What every exercise's checks share: a check (what it says when it passes, and a function that
names the mistake in words when it does not), the learner's code called so that what it raises is
one line, numbers written as a learner reads them, and the explanation of a wrong output by the
known mistakes that reproduce it.

A check compares the learner's module with minigpt's own (minigpt/model/: layers.py, positions.py,
depth.py) on the same weights; to say *which* mistake made a difference, `explain` recomputes the
part with each known mistake (and each combination of them, fewest first) and keeps the
combinations with the fewest mistakes that give what the learner's code gave. A `Fitting` holds
that explanation for one probe: each of its facet checks names one choice (the statistic, the
mask), shown on a row made to expose it ([2, 2, 2, 2], [1, -3, 5, -7]), and the facets run before
the checks on hand-made inputs, so that the first failing line names the mistake. Two rows are
never shown as the same numbers: `apart` gives them the digits that tell them apart.
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


class Undecided(Exception):
    """A check that cannot be decided while an earlier one fails (that one's line says so): not run."""


class Raised(Stop):
    """The learner's code raised while a check called it: said in one line, with the file's line, and
    the likely cause where the exercise knows one (`hint`)."""

    def __init__(self, what: str, exc: BaseException, path: Path, hint: str | None = None):
        super().__init__(f"{what} raised {describe(exc)}{where_raised(exc, path)}" + (f"; {hint}" if hint else ""))


class Probe:
    """Calls into one learner's file; whatever the code raises becomes a Raised naming the call.
    `hints(exc)`: the exercise's reading of what its learners' code commonly raises (a statistic
    without keepdim, K not transposed), or None."""

    def __init__(self, learner: LearnerFile, hints: Callable[[BaseException], str | None] | None = None):
        self.learner, self.path = learner, learner.path
        self.hints = hints or (lambda exc: None)

    def call(self, what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:  # the learner's code, whatever it raises
            raise Raised(what, exc, self.path, self.hints(exc) or _in_place_hint(exc)) from None

    def build(self, name: str, *args: Any) -> nn.Module:
        """The learner's class `name` built with `args`, in float64 (the checks' precision)."""
        shown = f"{name}({', '.join(map(_arg, args))})"
        module = self.call(shown, self.learner[name], *args)
        if not isinstance(module, nn.Module):
            raise Raised(shown, TypeError(f"it is a {type(module).__name__}, not an nn.Module"), self.path)
        return module.double()

    def forward(self, name: str, module: nn.Module, *args: Any) -> Any:
        """`module(*args)`, what it raises said of `name.forward`, or of `name` itself where the
        learner's `name` is a function (rope's apply_rope, wrapped in a module to be checked)."""
        defined = getattr(self.learner.module, name, None)
        return self.call(
            name if callable(defined) and not isinstance(defined, type) else f"{name}.forward", module, *args
        )


def _in_place_hint(exc: BaseException) -> str | None:
    """Autograd refuses an in-place edit of a tensor it needs (the input, a parameter)."""
    if isinstance(exc, RuntimeError) and "in-place operation" in str(exc):
        return "an in-place edit (x /= ..., x.div_(...)) of a tensor the gradient needs; compute a new tensor"
    return None


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


def apart(got: Tensor, expected: Tensor, digits: int = 4) -> tuple[str, str]:
    """Two rows as a learner reads them, with enough digits (`digits` at least, up to 10) to tell them
    apart; rows that still print alike get the largest absolute difference and where it is after the first."""
    got, expected = got.detach().double().reshape(-1), expected.detach().double().reshape(-1)
    for shown in range(digits, max(digits, 10) + 1):
        a, b = row(got, shown), row(expected, shown)
        if a != b:
            return a, b
    gap = (got - expected).abs()
    at = int(gap.argmax())
    return f"{a} (the largest difference, {float(gap[at]):.1e}, at coordinate {at})", b


def against(got: Any, expected: Tensor, digits: int = 4) -> tuple[str, str, tuple[int, ...]]:
    """A learner's output and the expected one, shown where they differ most: the two rows as `apart`
    writes them, and that row's index (every axis but the last; () for a single row); a learner's
    output of another shape or kind is named by its shape, beside the expected first row."""
    if not isinstance(got, Tensor) or got.shape != expected.shape:
        first = (0,) * (expected.dim() - 1)
        return shape(got), row(expected[first], digits), first
    at = worst_row(got, expected)
    return *apart(got[at], expected[at], digits), at


def worst_row(got: Tensor, expected: Tensor) -> tuple[int, ...]:
    """The index (every axis but the last) of the row where `got` differs most from `expected`; nan
    where the other is a number counts as the largest difference, an infinity where the other is the
    same infinity as none (a mask's -inf)."""
    got, expected = got.detach().double(), expected.detach().double()
    gap = (got - expected).abs().masked_fill(got == expected, 0.0).nan_to_num(nan=math.inf)
    flat = int(gap.reshape(-1).argmax())
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), gap.shape)[:-1])


def explain(output: Any, compute: Callable[..., Tensor], options: dict[str, list]) -> list[dict[str, Any]]:
    """The choices under which `compute(**choices)` gives `output`: each option's first value is the
    right one; the combinations with the fewest wrong choices that reproduce it, all of them (two
    that the probe cannot tell apart are both returned); none when no combination of the known
    mistakes reproduces it."""
    if not isinstance(output, Tensor):
        return []
    names = list(options)
    combinations = sorted(
        itertools.product(*(range(len(options[n])) for n in names)), key=lambda c: sum(i > 0 for i in c)
    )
    found: list[dict[str, Any]] = []
    for combination in combinations:
        wrong = sum(i > 0 for i in combination)
        if found and wrong > sum(found[0][n] != options[n][0] for n in names):
            break
        choices = {n: options[n][i] for n, i in zip(names, combination)}
        try:
            expected = compute(**choices)
        except (RuntimeError, ValueError):  # a mistake that cannot be computed at this shape
            continue
        if close(output, expected, nan_equal=True):
            found.append(choices)
    return found


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
            now, was = (text[1:-1] for text in apart(given.reshape(-1)[changed], before.reshape(-1)[changed]))
            return (
                f"your {name} changes its input in place: its input's number {changed} was {was} and is now {now}; "
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

    reach = f"{name}'s input" + (f" and {', '.join(parameters)}" if parameters else "")
    return Check(f"gradients reach {reach}, as minigpt's", run)


def module_checks(
    probe: Probe,
    name: str,
    build: Callable[[], nn.Module],
    pair: Callable[[], tuple[nn.Module, nn.Module]],
    x: Tensor,
    parameters: tuple[str, ...],
) -> list[Check]:
    """The checks every module gets, last: its input left as it was, the device it runs on, and the
    gradients that reach its input and `parameters` (`pair()`: the learner's module and minigpt's)."""
    return [
        unchanged_input_check(probe, name, lambda given: build()(given), x),
        device_check(probe, name, build, x),
        gradient_check(probe, name, pair, x, parameters),
    ]


def agrees_check(
    probe: Probe,
    name: str,
    both: Callable[[], tuple[nn.Module, nn.Module]],
    x: Tensor,
    theirs: str,
    where: Callable[[Tensor, tuple[int, ...]], str] = lambda x, at: f"on {row(x[at])}",
) -> Check:
    """The learner's module gives what minigpt's (`theirs`, in words) gives on `x`, with the same weights,
    in float64 (within 1e-9) and float32 (1e-5); a float64 difference of float32's size is named as
    the precision lost. The row shown is the one that differs most, `where(x, index)` in words."""

    def run() -> str | None:
        for dtype, tolerance in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
            mine, reference = (m.to(dtype) for m in both())
            given = x.to(dtype)
            with torch.no_grad():
                out, expected = probe.forward(name, mine, given.clone()), reference(given)
            if close(out, expected, tolerance):
                continue
            if not isinstance(out, Tensor) or out.shape != expected.shape:
                return f"your {name} turned {list(x.shape)} into {shape(out)}; {theirs} keeps {list(x.shape)}"
            at = worst_row(out, expected)
            got, want = apart(out[at], expected[at])
            short = theirs.split(" (minigpt/")[0]  # the file said once
            if dtype == torch.float64 and close(out, expected, 1e-5):
                return (
                    f"your {name} loses float64's precision: {where(given, at)} it gave {got}, {short} gives {want}, "
                    "a difference of float32's rounding; compute in x's dtype (no .float(), no float32 tensor made)"
                )
            return (
                f"your {name} differs from {theirs} in {str(dtype).removeprefix('torch.')}: {where(given, at)} it "
                f"gave {got}, {short} gives {want}"
            )
        return None

    return Check(f"{name} agrees with {theirs}, in float64 and float32", run)


@dataclass(frozen=True)
class Fitted:
    """The learner's output on one probe, minigpt's, and the known mistakes that explain the
    difference (`explanations`: the fewest wrong choices that reproduce it; two when the probe cannot
    tell them apart; none when nothing known does)."""

    given: Tensor
    output: Any
    expected: Tensor
    explanations: list[dict[str, Any]]

    @property
    def right(self) -> bool:
        return close(self.output, self.expected)


class Fitting:
    """One probe's explanation and the checks read from it. `fitted()` is computed once: the
    learner's output on `given` (`pair()` builds the learner's module and minigpt's with the same
    weights), minigpt's, and the explanation by `compute(given, theirs, **choices)` over `options`.

    Each facet check (`check`) names one choice (`words(choices)`: None when that choice is right),
    run in the order the checks were made, before any check on a hand-made input, so that the first
    failing line names the mistake. Where two explanations fit equally, a facet's line names its own
    choice and the other explanation's. When no known mistake explains the output, the first facet
    check says how it differs and the others wait (not run: they cannot be told while the output is
    unexplained), showing the row that differs most where `where(given, index)` says it comes from."""

    def __init__(
        self,
        probe: Probe,
        name: str,
        formula: str,
        pair,
        given: Tensor,
        compute,
        options,
        where: Callable[[Tensor, tuple[int, ...]], str] = lambda x, at: f"on the row {row(x[at])}",
    ):
        self.probe, self.name, self.formula, self.pair = probe, name, formula, pair
        self.given, self.compute, self.options, self.where = given, compute, options, where
        self.facets: dict[str, Callable[[dict], str | None]] = {}
        self._fitted: Fitted | None = None
        self._unexplained_said = False

    def fitted(self) -> Fitted:
        if self._fitted is None:
            mine, theirs = self.pair()
            with torch.no_grad():
                output = self.probe.forward(self.name, mine, self.given.clone())
                expected = theirs(self.given.clone())
                found = []
                if not close(output, expected):
                    found = explain(output, lambda **c: self.compute(self.given, theirs, **c), self.options)
            self._fitted = Fitted(self.given, output, expected, found)
        return self._fitted

    def check(self, facet: str, says: str, words: Callable[[dict], str | None]) -> Check:
        self.facets[facet] = words

        def run() -> str | None:
            fit = self.fitted()
            if fit.right:
                return None
            if not fit.explanations:
                if self._unexplained_said:
                    raise Undecided
                self._unexplained_said = True
                waiting = len(self.facets) - 1
                return self.unexplained() + (
                    f"; the other {waiting} checks of {self.name}'s formula wait until it matches" if waiting else ""
                )
            said = [w for c in fit.explanations if (w := words(c)) is not None]
            if not said:
                return None
            others = [self.named_in(c) for c in fit.explanations if words(c) is None]
            return _either(list(dict.fromkeys(said + [o for o in others if o])))

        return Check(says, run)

    def named_in(self, choices: dict) -> str | None:
        """The words of the first facet (in the order the checks run) that `choices` has wrong."""
        return next((w for words in self.facets.values() if (w := words(choices)) is not None), None)

    def unexplained(self) -> str:
        fit = self.fitted()
        out, expected = fit.output, fit.expected
        if not isinstance(out, Tensor) or out.shape != expected.shape:
            return (
                f"your {self.name} differs from {self.formula}: it gave {shape(out)}, minigpt's gives {shape(expected)}"
            )
        at = worst_row(out, expected)
        got, want = apart(out[at], expected[at])
        return (
            f"your {self.name} differs from {self.formula} in a way these checks do not name: "
            f"{self.where(fit.given, at)} it gave {got}, minigpt's gives {want}"
        )


def _either(said: list[str]) -> str | None:
    """One explanation, or two the checks cannot tell apart, named both."""
    if not said:
        return None
    if len(said) == 1:
        return said[0]
    return f"{said[0]}; or else (these checks cannot tell the two apart) {said[1]}"
