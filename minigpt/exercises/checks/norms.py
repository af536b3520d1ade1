"""The checks of the norm exercises: `rmsnorm` (lesson 09: RMSNorm and a residual sublayer) and
`layernorm` (chapter 17.3), each against minigpt's own module (minigpt/model/layers.py).

A wrong norm is explained by the known mistakes that reproduce its output on random rows, with a
large epsilon (0.1) so that where it is added shows: mean-centring, a statistic other than the
chapter's (RMSNorm's mean square, LayerNorm's variance divided by C), epsilon outside the square
root or left out, another axis than the last, the gain (or bias) ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...model.layers import LayerNorm, RMSNorm
from .common import (
    Check,
    Group,
    Probe,
    close,
    device_check,
    fit_check,
    fitting,
    gradient_check,
    number,
    parameters_check,
    randn,
    row,
    shape,
    unchanged_input_check,
)

# The axes a norm might wrongly take its statistics over, for [B, T, C] rows: the chapter's is the last alone.
AXES = {"last": (-1,), "positions": (-2,), "row": (-2, -1), "batch": (0,)}
AXIS_WORDS = {
    "positions": "the positions (axis -2)",
    "row": "each example's whole [T, C] block",
    "batch": "the batch (axis 0)",
}
PROBE_EPS = 0.1  # large, so that where epsilon is added shows in the output


def normalised(
    x: Tensor,
    gain: Tensor,
    bias: Tensor | None,
    eps: float,
    *,
    centre: bool,
    statistic: str,
    eps_at: str,
    axis: str,
    gain_used: bool = True,
    bias_used: bool = True,
) -> Tensor:
    """A norm computed with the choices a learner may have made: `centre` subtracts the mean first;
    `statistic` is mean_square (RMSNorm's), biased (LayerNorm's variance, divided by C) or unbiased
    (divided by C - 1); `eps_at` inside, outside or none; `axis` one of AXES."""
    dims = AXES[axis]
    mu = x.mean(dims, keepdim=True)
    top = x - mu if centre else x
    if statistic == "mean_square":
        spread2 = x.pow(2).mean(dims, keepdim=True)
    elif statistic == "biased":
        spread2 = (x - mu).pow(2).mean(dims, keepdim=True)
    else:
        spread2 = (x - mu).pow(2).sum(dims, keepdim=True) / (math.prod(x.shape[d] for d in dims) - 1)
    spread = {"inside": lambda: torch.sqrt(spread2 + eps), "outside": lambda: torch.sqrt(spread2) + eps}.get(
        eps_at, lambda: torch.sqrt(spread2)
    )()
    y = top / spread
    if gain_used:
        y = y * gain
    if bias is not None and bias_used:
        y = y + bias
    return y


def probe_rows() -> Tensor:
    """[2, 3, 4] rows of different means and scales, so that centring, the statistic and the axis show."""
    return randn(2, 3, 4, seed=1) * (0.5 + randn(2, 3, 1, seed=2).abs()) + randn(2, 3, 1, seed=3)


def with_weights(module: nn.Module, seed: int = 4) -> nn.Module:
    """`module` with weights of its own: a norm's gains about 0.5 .. 2.5, biases about 0.5 either way,
    matrices of either sign (a check whose weights were ones and zeros could not see one ignored)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(module.named_parameters()):
            drawn = randn(*p.shape, seed=seed + i)
            p.copy_(0.5 + drawn.abs() if p.dim() == 1 and not name.endswith("bias") else 0.5 * drawn)
    return module


def pair(
    build: Callable[[], nn.Module], reference: Callable[[], nn.Module]
) -> Callable[[], tuple[nn.Module, nn.Module]]:
    """The learner's module and minigpt's, with the same (non-trivial) weights."""

    def both() -> tuple[nn.Module, nn.Module]:
        theirs = with_weights(reference())
        mine = build()
        mine.load_state_dict(theirs.state_dict())
        return mine, theirs

    return both


def _eps_words(name: str) -> Callable[[dict], str | None]:
    def words(choices: dict) -> str | None:
        if choices["eps_at"] == "inside":
            return None
        if choices["eps_at"] == "outside":
            return (
                f"your {name} adds epsilon outside the square root, sqrt(...) + eps: it belongs inside, "
                f"sqrt(... + eps) (with eps = {PROBE_EPS} the two differ in every row)"
            )
        return f"your {name} leaves epsilon out: a row of zeros divides by zero; add eps inside the square root"

    return words


def _axis_words(name: str) -> Callable[[dict], str | None]:
    def words(choices: dict) -> str | None:
        if choices["axis"] == "last":
            return None
        return (
            f"your {name} takes its statistics over {AXIS_WORDS[choices['axis']]} instead of each row's own "
            "coordinates (the last axis): one position's row must not depend on another's (chapter 17.3)"
        )

    return words


def _shape_and_dtype(probe: Probe, name: str, build: Callable[[], nn.Module]) -> Check:
    def run() -> str | None:
        for dtype in (torch.float32, torch.float64):
            x = probe_rows().to(dtype)
            with torch.no_grad():
                out = probe.forward(name, build().to(dtype), x)
            if not isinstance(out, Tensor) or out.shape != x.shape:
                return (
                    f"your {name} turns a {list(x.shape)} input into {shape(out)}: a norm keeps the shape, "
                    "one row per position"
                )
            if out.dtype != dtype:
                return (
                    f"your {name} turns a {str(dtype).removeprefix('torch.')} input into "
                    f"{str(out.dtype).removeprefix('torch.')}: make every tensor from x, so a float32 model "
                    "stays float32"
                )
        return None

    return Check(f"{name} keeps the shape and dtype: [2, 3, 4] in, [2, 3, 4] out, in float32 and float64", run)


def _agrees(probe: Probe, name: str, both: Callable[[], tuple[nn.Module, nn.Module]]) -> Check:
    def run() -> str | None:
        for dtype, tolerance in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
            mine, theirs = (m.to(dtype) for m in both())
            x = (probe_rows() * 3).to(dtype)
            with torch.no_grad():
                out, expected = probe.forward(name, mine, x.clone()), theirs(x)
            if not close(out, expected, tolerance):
                shown = row(out.reshape(-1, 4)[0]) if isinstance(out, Tensor) and out.numel() % 4 == 0 else shape(out)
                return (
                    f"your {name} differs from minigpt's (minigpt/model/layers.py) in "
                    f"{str(dtype).removeprefix('torch.')}: "
                    f"on {row(x.reshape(-1, 4)[0])} it gave {shown}, minigpt's gives {row(expected.reshape(-1, 4)[0])}"
                )
        return None

    return Check(
        f"{name} agrees with minigpt's (minigpt/model/layers.py) on random rows and weights, in float64 and float32",
        run,
    )


def _starts_at(module: nn.Module, name: str, values: dict[str, float]) -> str | None:
    for parameter, value in values.items():
        tensor = module.state_dict()[parameter]
        if not torch.all(tensor == value):
            return (
                f"your {name} starts self.{parameter} at {row(tensor)}: start it at {number(value)}s "
                f"(torch.{'ones' if value else 'zeros'}(width))"
            )
    return None


# ---------------------------------------------------------------- rmsnorm


def rmsnorm(probe: Probe) -> list[Group]:
    def build(width: int = 4, eps: float = PROBE_EPS) -> nn.Module:
        return probe.build("RMSNorm", width, eps)

    both = pair(build, lambda: RMSNorm(4, PROBE_EPS).double())
    fitted = fitting(
        probe,
        "RMSNorm",
        "g_i x_i / sqrt(mean(x^2) + eps)",
        both,
        probe_rows(),
        lambda x, theirs, **c: normalised(x, theirs.weight, None, PROBE_EPS, **c),
        {
            "centre": [False, True],
            "statistic": ["mean_square", "biased", "unbiased"],
            "eps_at": ["inside", "outside", "none"],
            "axis": list(AXES),
            "gain_used": [True, False],
        },
    )

    def constant() -> str | None:
        x = torch.full((1, 1, 4), 2.0, dtype=torch.float64)
        with torch.no_grad():
            out = probe.forward("RMSNorm", build(4, 1e-5), x)
        if close(out, torch.ones_like(x), 1e-3):
            return None
        if close(out, torch.zeros_like(x), 1e-3):
            return (
                f"your RMSNorm subtracts the mean: {row(x)} became {row(out)}; RMSNorm divides by the root mean "
                "square without centring, which keeps it [1, 1, 1, 1]"
            )
        shown = row(out) if isinstance(out, Tensor) else shape(out)
        return f"{row(x)} became {shown}; RMSNorm with unit gains makes it [1, 1, 1, 1] (2 / sqrt(4 + eps))"

    def statistic(choices: dict) -> str | None:
        if choices["statistic"] == "mean_square":
            return None
        if choices["statistic"] == "biased":
            return (
                "your RMSNorm divides by the spread around the mean (a standard deviation, as LayerNorm does): "
                "RMSNorm divides by sqrt(mean of x_i^2 + eps), the root mean square of x itself"
            )
        return "your RMSNorm divides the sum of squares by d - 1: the mean square divides by d"

    def gain(choices: dict) -> str | None:
        if choices["gain_used"]:
            return None
        return "your RMSNorm ignores its gain: multiply each coordinate by self.weight (g_i x_i / rms(x))"

    checks = [
        parameters_check(lambda: build(4, 1e-5), "RMSNorm(4, 1e-05)", {"weight": [4]}, "one gain per coordinate"),
        Check("RMSNorm's gain starts at ones", lambda: _starts_at(build(4, 1e-5), "RMSNorm", {"weight": 1.0})),
        _shape_and_dtype(probe, "RMSNorm", build),
        Check("RMSNorm keeps a constant vector's sign: [2, 2, 2, 2] becomes [1, 1, 1, 1] (no mean-centring)", constant),
        fit_check("RMSNorm divides by the root mean square, sqrt(mean of x_i^2 + eps)", fitted, statistic),
        fit_check("RMSNorm adds epsilon inside the square root", fitted, _eps_words("RMSNorm")),
        fit_check("RMSNorm normalises each row over its last axis only", fitted, _axis_words("RMSNorm")),
        fit_check("RMSNorm multiplies by its gain", fitted, gain),
        _agrees(probe, "RMSNorm", both),
        unchanged_input_check(probe, "RMSNorm", lambda x: build()(x), probe_rows()),
        device_check(probe, "RMSNorm", build, probe_rows()),
        gradient_check(probe, "RMSNorm", both, probe_rows(), ("weight",)),
    ]
    return [Group("RMSNorm", checks), Group("residual_sublayer", _residual_sublayer(probe))]


def _residual_sublayer(probe: Probe) -> list[Check]:
    x = torch.tensor([[[1.0, -2.0, 3.0, 0.5]]], dtype=torch.float64)
    norm = RMSNorm(4, 1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 1.0, 0.5, 1.0]))  # gains of its own: the norm handed in, not another
    normed = norm(x).detach()
    update = torch.tensor([[[0.5, 0.5, -1.0, 2.0]]], dtype=torch.float64)

    def residual_sublayer(sublayer, given: Tensor | None = None):
        given = x.clone() if given is None else given
        with torch.no_grad():
            return probe.call("residual_sublayer", probe.learner["residual_sublayer"], given, sublayer, norm)

    def shown(out) -> str:
        return row(out) if isinstance(out, Tensor) else shape(out)

    def zero_update() -> str | None:
        out = residual_sublayer(lambda n: torch.zeros_like(n))
        if close(out, x):
            return None
        if close(out, torch.zeros_like(x)):
            return (
                f"your residual_sublayer replaces instead of adding: with a zero update, {row(x)} became {row(out)}; "
                "return x + sublayer(norm(x)), so a sublayer with nothing to add leaves x as it is"
            )
        if close(out, normed):
            return (
                f"with a zero update your residual_sublayer returned norm(x) = {row(out)}, not x = {row(x)}: "
                "the addition must keep the untouched input"
            )
        return f"with a zero update your residual_sublayer turned x = {row(x)} into {shown(out)}: x + 0 is x"

    def reads_normalised() -> str | None:
        seen: list[Tensor] = []
        residual_sublayer(lambda n: seen.append(n.detach().clone()) or torch.zeros_like(n))
        if not seen:
            return "your residual_sublayer never calls the sublayer: its update is sublayer(norm(x))"
        if close(seen[0], x):
            return (
                "your residual_sublayer hands the sublayer x itself: it must read the normalised view "
                f"norm(x) = {row(normed)} (pre-norm)"
            )
        if not close(seen[0], normed):
            return (
                f"the sublayer received {shown(seen[0])}; it must receive norm(x) = {row(normed)}, from the norm given"
            )
        return None

    def keeps_input() -> str | None:
        out = residual_sublayer(lambda n: n * 0 + update)
        if close(out, x + update):
            return None
        if close(out, normed + update):
            return (
                "your residual_sublayer adds the update to norm(x), not to the untouched x (it normalises the "
                f"residual branch itself): x = {row(x)} plus {row(update)} must give {row(x + update)}"
            )
        if close(out, update):
            return f"your residual_sublayer returns only the sublayer's update {row(update)}: add it to x = {row(x)}"
        return f"with the update {row(update)}, x = {row(x)} became {shown(out)}; x + update is {row(x + update)}"

    def in_place() -> str | None:
        given = x.clone()
        residual_sublayer(lambda n: n * 0 + update, given)
        if not torch.equal(given, x):
            return (
                f"your residual_sublayer changes x in place (x += ...): the caller's x is now {row(given)}, not "
                f"{row(x)}; return a new tensor, x + update"
            )
        return None

    return [
        Check("residual_sublayer: a zero update leaves x unchanged (it adds, it does not replace)", zero_update),
        Check("residual_sublayer: the sublayer reads norm(x), the normalised view", reads_normalised),
        Check("residual_sublayer: the update is added to the untouched x", keeps_input),
        Check("residual_sublayer leaves x unchanged (no in-place edit)", in_place),
    ]


# ---------------------------------------------------------------- layernorm


def layernorm(probe: Probe) -> list[Group]:
    def build(width: int = 4, eps: float = PROBE_EPS) -> nn.Module:
        return probe.build("LayerNorm", width, eps)

    both = pair(build, lambda: LayerNorm(4, PROBE_EPS).double())
    fitted = fitting(
        probe,
        "LayerNorm",
        "gamma_c (x_c - mu) / sqrt(sigma^2 + eps) + beta_c",
        both,
        probe_rows(),
        lambda x, theirs, **c: normalised(x, theirs.weight, theirs.bias, PROBE_EPS, **c),
        {
            "centre": [True, False],
            "statistic": ["biased", "unbiased", "mean_square"],
            "eps_at": ["inside", "outside", "none"],
            "axis": list(AXES),
            "gain_used": [True, False],
            "bias_used": [True, False],
        },
    )

    def on(values: list[float], gamma: list[float] | None = None, beta: list[float] | None = None) -> Tensor:
        module = build(len(values), 1e-5)
        with torch.no_grad():
            if gamma is not None:
                module.weight.copy_(torch.tensor(gamma))
            if beta is not None:
                module.bias.copy_(torch.tensor(beta))
            return probe.forward("LayerNorm", module, torch.tensor([[values]], dtype=torch.float64))

    def chapter_rows() -> str | None:
        for given, expected in (([1.0, 3.0], [-0.999995, 0.999995]), ([10.0, 10.0], [0.0, 0.0])):
            out = on(given)
            if not close(out, torch.tensor([[expected]], dtype=torch.float64), 1e-6):
                shown = row(out, 6) if isinstance(out, Tensor) else shape(out)
                return (
                    f"chapter 17.3's row {row(given)} became {shown}; with gamma = 1, beta = 0 and eps = 0.00001 "
                    f"it is {row(expected, 6)}"
                )
        return None

    def centre(choices: dict) -> str | None:
        if choices["centre"]:
            return None
        return (
            f"your LayerNorm does not subtract the mean: [10, 10] became {row(on([10.0, 10.0]))}; "
            "(x_c - mu) / sqrt(sigma^2 + eps) makes it [0, 0]"
        )

    def statistic(choices: dict) -> str | None:
        if choices["statistic"] == "biased":
            return None
        if choices["statistic"] == "unbiased":
            return (
                f"your LayerNorm divides the squared deviations by C - 1 (torch's x.std() and x.var() do by default): "
                f"[1, 3] became {row(on([1.0, 3.0]), 6)}; chapter 17.3 divides by C (x.var(dim=-1, unbiased=False))"
            )
        return (
            "your LayerNorm divides by the root mean square of x, not by the spread around the mean: "
            "sigma^2 = mean((x_c - mu)^2)"
        )

    def gain(choices: dict) -> str | None:
        if choices["gain_used"]:
            return None
        return (
            f"your LayerNorm ignores gamma (self.weight): with gamma = [2, 3] and beta = 0, [1, 3] became "
            f"{row(on([1.0, 3.0], gamma=[2.0, 3.0]))}, not [-2, 3]"
        )

    def bias(choices: dict) -> str | None:
        if choices["bias_used"]:
            return None
        return (
            f"your LayerNorm ignores beta (self.bias): with beta = [0.5, -1], [10, 10] became "
            f"{row(on([10.0, 10.0], beta=[0.5, -1.0]))}, not beta itself, [0.5, -1]"
        )

    checks = [
        parameters_check(lambda: build(4, 1e-5), "LayerNorm(4, 1e-05)", {"weight": [4], "bias": [4]}, "gamma, beta"),
        Check(
            "LayerNorm's gamma starts at ones and beta at zeros",
            lambda: _starts_at(build(4, 1e-5), "LayerNorm", {"weight": 1.0, "bias": 0.0}),
        ),
        _shape_and_dtype(probe, "LayerNorm", build),
        Check("LayerNorm gives chapter 17.3's rows: [1, 3] -> [-0.999995, 0.999995], [10, 10] -> [0, 0]", chapter_rows),
        fit_check("LayerNorm subtracts each row's mean", fitted, centre),
        fit_check("LayerNorm's variance divides by C (biased), as chapter 17.3 defines it", fitted, statistic),
        fit_check("LayerNorm adds epsilon inside the square root", fitted, _eps_words("LayerNorm")),
        fit_check("LayerNorm normalises each row over its last axis only", fitted, _axis_words("LayerNorm")),
        fit_check("LayerNorm multiplies by gamma", fitted, gain),
        fit_check("LayerNorm adds beta", fitted, bias),
        _agrees(probe, "LayerNorm", both),
        unchanged_input_check(probe, "LayerNorm", lambda x: build()(x), probe_rows()),
        device_check(probe, "LayerNorm", build, probe_rows()),
        gradient_check(probe, "LayerNorm", both, probe_rows(), ("weight", "bias")),
    ]
    return [Group("LayerNorm", checks)]
