"""The checks of the norm exercises: `rmsnorm` (lesson 09: RMSNorm and a residual sublayer) and
`layernorm` (chapter 17.3), each against minigpt's own module (minigpt/model/layers.py).

A wrong norm is explained by the known mistakes that reproduce its output on random rows, with a
large epsilon (0.1) so that where it is added shows: mean-centring, a statistic other than the
chapter's (RMSNorm's mean square, LayerNorm's variance divided by C: a sum, a mean of x or of |x|, a
spread divided by C - 1), no square root, epsilon outside the square root or left out, another axis
than the last, the gain (or bias) ignored. Each mistake is then shown on a row made to expose it:
[2, 2, 2, 2] (centring takes it to zeros), [1, -3, 5, -7] (its mean is negative, its mean of |x| is 4,
its mean square 21).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...model.layers import LayerNorm, RMSNorm
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    against,
    agrees_check,
    close,
    module_checks,
    number,
    parameters_check,
    randn,
    row,
    shape,
)
from .residual import residual_sublayer_checks

# The axes a norm might wrongly take its statistics over, for [B, T, C] rows: the chapter's is the last alone.
AXES = {"last": (-1,), "positions": (-2,), "row": (-2, -1), "batch": (0,), "all": (0, 1, 2)}
AXIS_WORDS = {
    "positions": "the positions (axis -2)",
    "row": "each example's whole [T, C] block",
    "batch": "the batch (axis 0)",
    "all": "the whole tensor at once (no dim given)",
}
THEIRS = "minigpt's (minigpt/model/layers.py)"
PROBE_EPS = 0.1  # large, so that where epsilon is added shows in the output

# What a norm may divide by, before the square root: each from x, its mean mu over the axes, and
# how many numbers n those axes hold.
STATISTICS: dict[str, Callable[[Tensor, Tensor, tuple[int, ...], int], Tensor]] = {
    "mean_square": lambda x, mu, dims, n: x.pow(2).mean(dims, keepdim=True),
    "sum_square": lambda x, mu, dims, n: x.pow(2).sum(dims, keepdim=True),
    "mean": lambda x, mu, dims, n: mu,
    "mean_abs": lambda x, mu, dims, n: x.abs().mean(dims, keepdim=True),
    "biased": lambda x, mu, dims, n: (x - mu).pow(2).mean(dims, keepdim=True),
    "unbiased": lambda x, mu, dims, n: (x - mu).pow(2).sum(dims, keepdim=True) / (n - 1),
    "sum_deviation": lambda x, mu, dims, n: (x - mu).pow(2).sum(dims, keepdim=True),
    "mean_abs_deviation": lambda x, mu, dims, n: (x - mu).abs().mean(dims, keepdim=True),
}


def normalised(
    x: Tensor,
    gain: Tensor,
    bias: Tensor | None,
    eps: float,
    *,
    centre: bool,
    statistic: str,
    root: bool,
    eps_at: str,
    axis: str,
    gain_used: bool = True,
    bias_used: bool = True,
) -> Tensor:
    """A norm computed with the choices a learner may have made: `centre` subtracts the mean first;
    `statistic` one of STATISTICS; `root` takes its square root; `eps_at` inside, outside or none;
    `axis` one of AXES."""
    dims = AXES[axis]
    mu = x.mean(dims, keepdim=True)
    top = x - mu if centre else x
    spread2 = STATISTICS[statistic](x, mu, dims, math.prod(x.shape[d] for d in dims))
    if not root:
        spread = spread2 + eps if eps_at != "none" else spread2
    else:
        spread = {"inside": lambda: torch.sqrt(spread2 + eps), "outside": lambda: torch.sqrt(spread2) + eps}.get(
            eps_at, lambda: torch.sqrt(spread2)
        )()
    y = top / spread
    if gain_used:
        y = y * gain
    if bias is not None and bias_used:
        y = y + bias
    return y


def keepdim_hint(exc: BaseException) -> str | None:
    """A statistic taken without keepdim=True ([2, 3] from [2, 3, 4]) cannot divide the rows it came from."""
    if isinstance(exc, RuntimeError) and "must match the size of tensor" in str(exc):
        return "a statistic over the last axis must keep that axis to divide each row by its own: keepdim=True"
    return None


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
        if choices["eps_at"] == "inside" or not choices["root"]:
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


def _root_words(name: str, on: Callable[[list[float]], Tensor], given: list[float], right: str):
    """No square root, shown on `given` (whose statistic is not 1, so the root shows), `right` its norm."""

    def words(choices: dict) -> str | None:
        if choices["root"]:
            return None
        spread = "the mean square" if name == "RMSNorm" else "the variance"
        return (
            f"your {name} divides by {spread} itself, not by its square root: {row(given)} became "
            f"{_shown(on(given))}, not {right}; divide by torch.sqrt({spread.removeprefix('the ')} + eps)"
        )

    return words


def _shown(out) -> str:
    return row(out) if isinstance(out, Tensor) else shape(out)


def _learner_on(probe: Probe, name: str, build: Callable[..., nn.Module]):
    """`on(values, gamma, beta)`: the learner's module (eps 1e-5, gains ones unless given) on one row."""

    def on(values: list[float], gamma: list[float] | None = None, beta: list[float] | None = None) -> Tensor:
        module = build(len(values), 1e-5)
        with torch.no_grad():
            if gamma is not None:
                module.weight.copy_(torch.tensor(gamma))
            if beta is not None:
                module.bias.copy_(torch.tensor(beta))
            return probe.forward(name, module, torch.tensor([[values]], dtype=torch.float64))

    return on


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

RMS_STATISTIC_WORDS = {
    "sum_square": "the root of the sum of the squares, not of their mean (the sum divided by d)",
    "mean": "the root of the mean of x, not of the mean of the squares x_i^2 (a row of negative mean gives nan)",
    "mean_abs": "the root of the mean of |x|, not of the mean of the squares x_i^2",
    "unbiased": "x.std(), the spread around the mean divided by d - 1 (torch's default), not the root mean square of "
    "x itself",
}


def rmsnorm(probe: Probe) -> list[Group]:
    probe.hints = keepdim_hint

    def build(width: int = 4, eps: float = PROBE_EPS) -> nn.Module:
        return probe.build("RMSNorm", width, eps)

    on = _learner_on(probe, "RMSNorm", build)
    both = pair(build, lambda: RMSNorm(4, PROBE_EPS).double())
    fitting = Fitting(
        probe,
        "RMSNorm",
        "g_i x_i / sqrt(mean(x^2) + eps)",
        both,
        probe_rows(),
        lambda x, theirs, **c: normalised(x, theirs.weight, None, PROBE_EPS, **c),
        {
            "centre": [False, True],
            "statistic": ["mean_square", "sum_square", "mean", "mean_abs", "biased", "unbiased"],
            "root": [True, False],
            "eps_at": ["inside", "outside", "none"],
            "axis": list(AXES),
            "gain_used": [True, False],
        },
    )

    def centre(choices: dict) -> str | None:
        if not choices["centre"]:
            return None
        return (
            f"your RMSNorm subtracts the mean: [2, 2, 2, 2] became {_shown(on([2.0] * 4))}; RMSNorm divides by the "
            "root mean square without centring, which keeps it [1, 1, 1, 1]"
        )

    def statistic(choices: dict) -> str | None:
        kind = choices["statistic"]
        if kind == "mean_square":
            return None
        if kind == "biased":
            return (
                "your RMSNorm divides by the spread around the mean (a standard deviation, as LayerNorm does): "
                "RMSNorm divides by sqrt(mean of x_i^2 + eps), the root mean square of x itself"
            )
        given = [1.0, -3.0, 5.0, -7.0]
        return (
            f"your RMSNorm divides by {RMS_STATISTIC_WORDS[kind]}: {row(given)} became {_shown(on(given))}, where "
            "dividing by sqrt(mean of x_i^2 + eps) = sqrt(21) gives [0.2182, -0.6547, 1.0911, -1.5275]; "
            "x.pow(2).mean(dim=-1, keepdim=True)"
        )

    def gain(choices: dict) -> str | None:
        if choices["gain_used"]:
            return None
        return "your RMSNorm ignores its gain: multiply each coordinate by self.weight (g_i x_i / rms(x))"

    def constant() -> str | None:
        out = on([2.0] * 4)
        if close(out, torch.ones(1, 1, 4, dtype=torch.float64), 1e-3):
            return None
        return f"[2, 2, 2, 2] became {_shown(out)}; RMSNorm with unit gains makes it [1, 1, 1, 1] (2 / sqrt(4 + eps))"

    checks = [
        parameters_check(lambda: build(4, 1e-5), "RMSNorm(4, 1e-05)", {"weight": [4]}, "one gain per coordinate"),
        Check("RMSNorm's gain starts at ones", lambda: _starts_at(build(4, 1e-5), "RMSNorm", {"weight": 1.0})),
        _shape_and_dtype(probe, "RMSNorm", build),
        fitting.check("centre", "RMSNorm does not subtract the mean (no centring)", centre),
        fitting.check("statistic", "RMSNorm divides by the root mean square, sqrt(mean of x_i^2 + eps)", statistic),
        fitting.check(
            "root",
            "RMSNorm takes the square root of the mean square",
            _root_words("RMSNorm", on, [2.0] * 4, "[1, 1, 1, 1]"),
        ),
        fitting.check("eps_at", "RMSNorm adds epsilon inside the square root", _eps_words("RMSNorm")),
        fitting.check("axis", "RMSNorm normalises each row over its last axis only", _axis_words("RMSNorm")),
        fitting.check("gain_used", "RMSNorm multiplies by its gain", gain),
        Check("RMSNorm keeps a constant vector's sign: [2, 2, 2, 2] becomes [1, 1, 1, 1]", constant),
        agrees_check(probe, "RMSNorm", both, probe_rows() * 3, THEIRS),
        *module_checks(probe, "RMSNorm", build, both, probe_rows(), ("weight",)),
    ]
    return [Group("RMSNorm", checks), Group("residual_sublayer", residual_sublayer_checks(probe))]


# ---------------------------------------------------------------- layernorm


def layernorm(probe: Probe) -> list[Group]:
    probe.hints = keepdim_hint

    def build(width: int = 4, eps: float = PROBE_EPS) -> nn.Module:
        return probe.build("LayerNorm", width, eps)

    on = _learner_on(probe, "LayerNorm", build)
    both = pair(build, lambda: LayerNorm(4, PROBE_EPS).double())
    fitting = Fitting(
        probe,
        "LayerNorm",
        "gamma_c (x_c - mu) / sqrt(sigma^2 + eps) + beta_c",
        both,
        probe_rows(),
        lambda x, theirs, **c: normalised(x, theirs.weight, theirs.bias, PROBE_EPS, **c),
        {
            "centre": [True, False],
            "statistic": ["biased", "unbiased", "mean_square", "sum_deviation", "mean_abs_deviation"],
            "root": [True, False],
            "eps_at": ["inside", "outside", "none"],
            "axis": list(AXES),
            "gain_used": [True, False],
            "bias_used": [True, False],
        },
    )

    def chapter_rows() -> str | None:
        for given, expected in (([1.0, 3.0], [-0.999995, 0.999995]), ([10.0, 10.0], [0.0, 0.0])):
            out = on(given)
            if not close(out, want := torch.tensor([[expected]], dtype=torch.float64), 1e-6):
                shown, chapter, _ = against(out, want, 6)
                return (
                    f"chapter 17.3's row {row(given)} became {shown}; with gamma = 1, beta = 0 and eps = 0.00001 "
                    f"it is {chapter}"
                )
        return None

    def centre(choices: dict) -> str | None:
        if choices["centre"]:
            return None
        return (
            f"your LayerNorm does not subtract the mean: [10, 10] became {_shown(on([10.0, 10.0]))}; "
            "(x_c - mu) / sqrt(sigma^2 + eps) makes it [0, 0]"
        )

    def statistic(choices: dict) -> str | None:
        kind = choices["statistic"]
        if kind == "biased":
            return None
        if kind == "unbiased":
            return (
                "your LayerNorm divides the squared deviations by C - 1 (torch's x.std() and x.var() do by default): "
                f"[1, 3] became {row(on([1.0, 3.0]), 6)}; chapter 17.3 divides by C (x.var(dim=-1, unbiased=False))"
            )
        if kind == "mean_square":
            return (
                "your LayerNorm divides by the root mean square of x, not by the spread around the mean: "
                "sigma^2 = mean((x_c - mu)^2)"
            )
        what = {
            "sum_deviation": "the sum of the squared deviations, not their mean",
            "mean_abs_deviation": "the mean of |x_c - mu|, not of (x_c - mu)^2",
        }[kind]
        return (
            f"your LayerNorm's sigma^2 is {what}: [1, 3, 5, 7] became {row(on([1.0, 3.0, 5.0, 7.0]))}; chapter "
            "17.3's sigma^2 = mean((x_c - mu)^2) = 5 makes it [-1.3416, -0.4472, 0.4472, 1.3416]"
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
        fitting.check("centre", "LayerNorm subtracts each row's mean", centre),
        fitting.check("statistic", "LayerNorm's variance divides by C (biased), as chapter 17.3 defines it", statistic),
        fitting.check(
            "root",
            "LayerNorm takes the square root of the variance",
            _root_words("LayerNorm", on, [1.0, 5.0], "[-1, 1]"),
        ),
        fitting.check("eps_at", "LayerNorm adds epsilon inside the square root", _eps_words("LayerNorm")),
        fitting.check("axis", "LayerNorm normalises each row over its last axis only", _axis_words("LayerNorm")),
        fitting.check("gain_used", "LayerNorm multiplies by gamma", gain),
        fitting.check("bias_used", "LayerNorm adds beta", bias),
        Check("LayerNorm gives chapter 17.3's rows: [1, 3] -> [-0.999995, 0.999995], [10, 10] -> [0, 0]", chapter_rows),
        agrees_check(probe, "LayerNorm", both, probe_rows() * 3, THEIRS),
        *module_checks(probe, "LayerNorm", build, both, probe_rows(), ("weight", "bias")),
    ]
    return [Group("LayerNorm", checks)]
