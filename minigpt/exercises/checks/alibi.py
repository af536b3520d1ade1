"""The checks of the `alibi` exercise: ALiBi's slopes and bias (Press et al. 2022), against minigpt's
`alibi_slopes` and `Alibi` (minigpt/model/positions.py).

The slopes are checked for head counts that are powers of two (4 and 8: the geometric sequence
2^(-8/n), ..., 2^-8) and for one that is not (6: those of 4, then every other one of 8's), a wrong
list explained by the known mistakes that reproduce it: the sequence started at 2^0, turned round,
halving whatever n is; for 6 heads, the geometric sequence of 6 itself (the naive one the paper's
code warns of), the first six of 8's, 8's taken consecutively or from its second, or Press et
al.'s slopes sorted.

The bias is checked on three heads' slopes, the last 3 of 5 positions (a KV cache's: queries at
2, 3, 4), a wrong output explained by its sign (+slope (i - j)), its causal side (no mask, the
earlier keys masked, each query's own key masked too, the transposed triangle) and the queries
taken as positions 0 .. T - 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...model.positions import Alibi, alibi_slopes
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    Stop,
    agrees_check,
    apart,
    close,
    device_check,
    explain,
    number,
    shape,
)

SLOPES, BIAS = "alibi_slopes", "alibi_bias"
QUERIES, KEYS = 3, 5  # the probe's T and S: queries at positions 2, 3, 4
PROBE_SLOPES = (0.5, 0.25, 0.125)


def geometric(n: int, first: int = 1) -> list[float]:
    """2^(-8 (h + first) / n) for h = 0 .. n - 1: the paper's sequence for n a power of two (first = 1)."""
    return [2 ** (-8 * (h + first) / n) for h in range(n)]


def slopes_with(n: int, *, first: int, order: str, ratio: str, rest: str) -> list[float]:
    """Slopes of n heads with the choices a learner may have made (each option's first value right)."""
    below = 2 ** math.floor(math.log2(n))
    base, twice = geometric(below, first), geometric(2 * below, first)
    if ratio == "halving":  # 2^-(h + 1) whatever n is
        slopes = [2.0 ** -(h + first) for h in range(n)]
    elif below == n or rest == "press":
        slopes = base + twice[0::2][: n - below]
    elif rest == "naive":  # the geometric sequence of n itself
        slopes = geometric(n, first)
    elif rest == "next_power":  # the first n of twice the power's
        slopes = twice[:n]
    elif rest == "consecutive":  # the rest from twice the power's, one after the other
        slopes = base + twice[: n - below]
    elif rest == "second":  # every other from twice the power's second
        slopes = base + twice[1::2][: n - below]
    else:  # Press et al.'s, sorted from the largest
        slopes = sorted(base + twice[0::2][: n - below], reverse=True)
    return slopes[::-1] if order == "ascending" else slopes


SLOPE_OPTIONS = {
    "first": [1, 0],
    "order": ["descending", "ascending"],
    "ratio": ["geometric", "halving"],
    "rest": ["press", "naive", "next_power", "consecutive", "second", "sorted"],
}


def biased(slopes: Tensor, theirs, *, sign: str, side: str, offset: str) -> Tensor:
    """The bias with the choices a learner may have made (each option's first value right)."""
    i = (torch.arange(KEYS - QUERIES, KEYS) if offset == "last" else torch.arange(QUERIES))[:, None]
    j = torch.arange(KEYS)[None, :]
    distance = (i - j).to(slopes.dtype)
    if side == "transposed":  # the keys after the query, penalised by j - i; the earlier ones masked
        distance = -distance
    bias = (-1.0 if sign == "minus" else 1.0) * slopes[:, None, None] * distance
    hidden = {"later": j > i, "none": j < -1, "earlier": j < i, "own": j >= i, "transposed": j < i}[side]
    return bias.masked_fill(hidden, float("-inf"))


BIAS_OPTIONS = {
    "sign": ["minus", "plus"],
    "side": ["later", "none", "earlier", "own", "transposed"],
    "offset": ["last", "first"],
}


def minigpt_bias(slopes: Tensor, T: int = QUERIES, S: int = KEYS) -> Tensor:
    """minigpt's Alibi, given these slopes, for the last T of S positions."""
    alibi = Alibi(len(slopes), S)
    alibi.slopes = slopes.tolist()
    return alibi.bias(T, S, S - T, slopes.device, slopes.dtype)


def _where(slopes: Tensor, at: tuple[int, ...]) -> str:
    """Where a row of the probe's bias comes from: its head's slope and its query's position."""
    return f"for slope {number(float(slopes[at[0]]))} at the query of position {KEYS - QUERIES + at[1]}"


class _Bias(nn.Module):
    """A bias function as a module of the slopes alone (T and S fixed), so the checks every module gets read it."""

    def __init__(self, bias, T: int = QUERIES, S: int = KEYS):
        super().__init__()
        self.bias, self.T, self.S = bias, T, S

    def forward(self, slopes: Tensor):
        return self.bias(slopes, self.T, self.S)


def _powers(n: int) -> str:
    """2^-2, 2^-4, ...: a list of slopes that are powers of two, as the paper writes them."""
    exponents = [-math.log2(s) for s in alibi_slopes(n)]
    return ", ".join(f"2^-{number:g}" for number in exponents)


def alibi(probe: Probe) -> list[Group]:
    return [Group(SLOPES, _slope_checks(probe)), Group(BIAS, _bias_checks(probe))]


def _slope_checks(probe: Probe) -> list[Check]:
    def returned(n: int):
        with torch.no_grad():
            return probe.call(f"{SLOPES}({n})", probe.learner[SLOPES], n)

    def slopes_of(n: int) -> Tensor | None:
        """The learner's slopes of n heads as float64 numbers, or None where they are none."""
        try:
            return torch.as_tensor(returned(n), dtype=torch.float64).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            return None

    def returns() -> str | None:
        for n in (8, 6, 1):
            out = slopes_of(n)
            if out is None or out.numel() != n:
                raise Stop(
                    f"your {SLOPES}({n}) returned {shape(out) if out is not None else shape(returned(n))}; return "
                    f"the {n} slopes, one per head (a tensor [n_head])"
                )
        return None

    def named(n: int, mistakes: dict) -> str:
        """The words of the mistakes that make `n` heads' slopes, first found first."""
        words = []
        if mistakes["first"] == 0:
            words.append("starts the sequence at 2^0 = 1 (h from 0); head 0's slope is 2^(-8/n), h from 1")
        if mistakes["order"] == "ascending":
            words.append("lists the slopes from the smallest; head 0 takes the largest, 2^(-8/n)")
        if mistakes["ratio"] == "halving":
            words.append("halves each slope whatever n is (2^-1, 2^-2, ...); the ratio is 2^(-8/n)")
        rest = {
            "naive": f"takes the geometric sequence of {n} itself, 2^(-8/{n}), ..., 2^-8, which the paper gives for "
            "a power of two only",
            "next_power": "takes the first of the sequence of the power of two above",
            "consecutive": "takes the rest from twice the power's sequence one after the other, not every other",
            "second": "takes every other of twice the power's sequence from its second, not its first",
            "sorted": "sorts the slopes from the largest; the power of two's come first, then the rest",
        }
        if mistakes["rest"] in rest:
            words.append(rest[mistakes["rest"]])
        return "; and ".join(words)

    def matches(n: int) -> str | None:
        out = slopes_of(n)
        expected = torch.tensor(alibi_slopes(n), dtype=torch.float64)
        if close(out, expected):
            return None
        got, want = apart(out, expected)
        fits = explain(out, lambda **c: torch.tensor(slopes_with(n, **c), dtype=torch.float64), SLOPE_OPTIONS)
        below = 2 ** math.floor(math.log2(n))
        rule = (
            f"2^(-8/{n}), ..., 2^-8"
            if below == n
            else f"those of {below}, then every other one of {2 * below}'s from its first"
        )
        if not fits:
            return f"your {SLOPES}({n}) is {got}; Press et al.'s are {rule}: {_powers(n)} = {want}"
        return (
            f"your {SLOPES}({n}) {named(n, fits[0])}: it gave {got}; Press et al.'s are {rule}: {_powers(n)} = {want}"
        )

    return [
        Check(f"{SLOPES} returns one slope per head (8, 6 and 1 heads)", returns),
        Check(f"{SLOPES}(8) is 2^-1, 2^-2, ..., 2^-8, head 0's first", lambda: matches(8)),
        Check(f"{SLOPES}(4) is 2^-2, 2^-4, 2^-6, 2^-8", lambda: matches(4)),
        Check(f"{SLOPES}(6), not a power of two: those of 4, then 2^-1 and 2^-3 of 8's", lambda: matches(6)),
        Check(f"{SLOPES}(12): those of 8, then every other one of 16's", lambda: matches(12)),
    ]


def _bias_checks(probe: Probe) -> list[Check]:
    function = probe.learner[BIAS]
    slopes = torch.tensor(PROBE_SLOPES, dtype=torch.float64)

    def both(T: int = QUERIES, S: int = KEYS):
        return lambda: (_Bias(function, T, S), _Bias(lambda s, t, k: minigpt_bias(s, t, k), T, S))

    fitting = Fitting(
        probe,
        BIAS,
        "minigpt's ALiBi bias (minigpt/model/positions.py)",
        both(),
        slopes,
        biased,
        BIAS_OPTIONS,
        _where,
    )

    def call(given: Tensor, T: int, S: int):
        with torch.no_grad():
            return probe.call(BIAS, function, given, T, S)

    def shapes() -> str | None:
        for dtype in (torch.float64, torch.float32):
            out = call(slopes.to(dtype), QUERIES, KEYS)
            if not isinstance(out, Tensor) or out.shape != (3, QUERIES, KEYS) or out.dtype != dtype:
                kind = f" {str(out.dtype).removeprefix('torch.')}" if isinstance(out, Tensor) else ""
                raise Stop(
                    f"your {BIAS}(slopes [3], {QUERIES}, {KEYS}) returned {shape(out)}{kind} for "
                    f"{str(dtype).removeprefix('torch.')} slopes; return [n_head, T, S] = [3, {QUERIES}, {KEYS}] in "
                    "the slopes' dtype"
                )
        return None

    def sign(choices: dict) -> str | None:
        if choices["sign"] == "minus":
            return None
        return (
            f"your {BIAS} adds +slope (i - j): the farther back a key, the more it is favoured; ALiBi penalises "
            "distance, -slope_h (i - j): 0 for the query's own key, more negative farther back"
        )

    def side(choices: dict) -> str | None:
        kind = choices["side"]
        if kind == "later":
            return None
        return {
            "none": f"your {BIAS} leaves the keys after the query unmasked: set -inf where j > i (the causal mask "
            "rides in the bias, no position reads a later one)",
            "earlier": f"your {BIAS} masks the keys before the query (j < i) and keeps the later ones: the causal "
            "side is j > i, masked with -inf",
            "own": f"your {BIAS} masks each query's own key too (j >= i): the first position is left no key at "
            "all; mask only the keys after the query, j > i",
            "transposed": f"your {BIAS} is the transposed triangle: it keeps the keys after the query, biased by "
            "-slope (j - i), and masks the earlier ones; query i reads the keys j <= i, biased by -slope (i - j)",
        }[kind]

    def offset(choices: dict) -> str | None:
        if choices["offset"] == "last":
            return None
        return (
            f"your {BIAS} takes the T queries as positions 0 .. T - 1; they are the last T of the S positions, "
            f"S - T .. S - 1 (under a KV cache the first S - T are cached): with T = {QUERIES}, S = {KEYS} the "
            f"first query is at position {KEYS - QUERIES}"
        )

    def step() -> str | None:
        out = call(slopes, 1, KEYS)
        expected = minigpt_bias(slopes, 1, KEYS)
        if close(out, expected, nan_equal=True):
            return None
        got, want = apart(out[0, 0], expected[0, 0])
        return (
            f"a sampling step, one query at position 4 reading keys 0 .. 4 ({BIAS}(slopes, 1, 5)), got {got} for "
            f"slope 0.5; it is -0.5 (4 - j), {want}"
        )

    return [
        Check(f"{BIAS}(slopes, T, S) is [n_head, T, S] in the slopes' dtype", shapes),
        fitting.check("sign", f"{BIAS} penalises distance: -slope_h (i - j)", sign),
        fitting.check("side", f"{BIAS} masks each key after its query (j > i) with -inf, and no other", side),
        fitting.check("offset", f"{BIAS}'s T queries are the last T of the S positions", offset),
        Check(f"{BIAS} of one query at position 4 (a sampling step) is -slope (4 - j) over keys 0 .. 4", step),
        agrees_check(
            probe,
            BIAS,
            both(),
            slopes,
            "minigpt's ALiBi bias (minigpt/model/positions.py)",
            _where,
        ),
        device_check(probe, BIAS, lambda: _Bias(function), slopes),
    ]
