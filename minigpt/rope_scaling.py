"""Rope scaling rules as text, read and written: `yarn:4`, `ntk:2`, or an imported model's own rule
with transformers' settings after it, `llama3:32.0,original_context=8192,high_freq_factor=4.0`.

No torch here: config.py checks `[model] rope_scaling` with it wherever a config is read (a file, a
`--set`, a sweep's grid value), and the `--rope-scaling` flag is read the same way, so a rule that
positions.py could not compute (a division by zero, a NaN angle, scores multiplied past float32)
is refused in one line before any model is built, naming where it was given.

Every setting has a stated range, the one its formula needs (transformers' modeling_rope_utils and
its checks of each rope_type's parameters); a setting the rule's formula does not read, or one given
twice, is refused naming it, since it would otherwise be silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ConfigError, MinigptError, Phrase

# the names a rule is written with -> transformers' rope_type
SCALING_KINDS = {"linear": "linear", "ntk": "dynamic", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
# Real models use 2 to 64. Far past this bound the dynamic rule's base, F x L / context - (F - 1), is lost
# to rounding (at F = 1e30 it is 0: every angle NaN).
MAX_FACTOR = 1_000_000.0
MAX_ATTENTION_FACTOR = 10.0  # YaRN's own is 0.1 ln F + 1: 2.4 at the largest factor
MAX_MSCALE = 10.0  # keeps the attention factor YaRN derives from mscale within 1 + ln(MAX_FACTOR)


@dataclass(frozen=True)
class RopeScaling:
    """A rope scaling rule as transformers' `rope_scaling` describes it. `original_context`: the
    length the model was trained at (None: the model's own `context`). The other fields keep
    transformers' defaults unless a checkpoint's config sets them."""

    kind: str  # "linear", "dynamic", "yarn" or "llama3" (transformers' rope_type)
    factor: float
    original_context: int | None = None
    attention_factor: float | None = None  # yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    name: str = field(default="", compare=False)  # as the user wrote it ("ntk:4")

    def __str__(self) -> str:
        return self.name or f"{self.kind}:{self.factor:g}"

    def accepts(self, context: int) -> int:
        """How many positions a model trained at `context` reads with this rule, unasked."""
        return int(math.floor(self.factor * (self.original_context or context)))


@dataclass(frozen=True)
class _Setting:
    """A `name=value` setting after kind:factor: its type, the rules whose formula reads it, and its
    range: `within(value, rule)`, said in `range` ({field}: another setting's value, as it stands)."""

    kind: type  # int, float or bool
    rules: tuple[str, ...]
    within: Callable[[Any, RopeScaling], bool]
    range: str
    meaning: str  # what the formula does with it
    example: str  # a value in range, for the message


_ALL, _YARN, _LLAMA3 = ("linear", "dynamic", "yarn", "llama3"), ("yarn",), ("llama3",)
_RATIO = (
    "with both mscale and mscale_all_dim above 0 the attention factor is (0.1 mscale ln F + 1) / "
    "(0.1 mscale_all_dim ln F + 1)"
)
# In spelled's order (an imported model's rule is written with them in this order).
SETTINGS = {
    "original_context": _Setting(
        int, _ALL, lambda v, s: v >= 1, "a whole number of at least 1", "the length the model was trained at", "8192"
    ),
    "attention_factor": _Setting(
        float,
        _YARN,
        lambda v, s: 0 < v <= MAX_ATTENTION_FACTOR,
        f"a number above 0 and at most {MAX_ATTENTION_FACTOR:g}",
        "it multiplies cos and sin, so every attention score by its square",
        "1.0",
    ),
    "beta_fast": _Setting(
        float,
        _YARN,
        lambda v, s: math.isfinite(v) and v > s.beta_slow,
        "a finite number above beta_slow ({beta_slow:g} here)",
        "a pair that turns this many times over the trained length keeps its angle",
        "32",
    ),
    "beta_slow": _Setting(
        float,
        _YARN,
        lambda v, s: 0 < v < s.beta_fast,
        "a number above 0 and below beta_fast ({beta_fast:g} here)",
        "a pair that turns this many times or fewer over the trained length is divided by the factor",
        "1",
    ),
    "mscale": _Setting(
        float, _YARN, lambda v, s: 0 <= v <= MAX_MSCALE, f"a number from 0 to {MAX_MSCALE:g}", _RATIO, "1.0"
    ),
    "mscale_all_dim": _Setting(
        float, _YARN, lambda v, s: 0 <= v <= MAX_MSCALE, f"a number from 0 to {MAX_MSCALE:g}", _RATIO, "1.0"
    ),
    "truncate": _Setting(
        bool, _YARN, lambda v, s: True, "true or false", "whether the ramp's ends are rounded to whole pairs", "true"
    ),
    "low_freq_factor": _Setting(
        float,
        _LLAMA3,
        lambda v, s: 0 < v < s.high_freq_factor,
        "a number above 0 and below high_freq_factor ({high_freq_factor:g} here)",
        "pairs whose wavelength is above original_context / low_freq_factor are divided by the factor",
        "1",
    ),
    "high_freq_factor": _Setting(
        float,
        _LLAMA3,
        lambda v, s: math.isfinite(v) and v > s.low_freq_factor,
        "a finite number above low_freq_factor ({low_freq_factor:g} here)",
        "pairs whose wavelength is below original_context / high_freq_factor keep their angle",
        "4",
    ),
}


class _Unreadable(Exception):
    """What is wrong with a rule's text, in words (the caller says where the text came from)."""


def parse_rope_scaling(text: str, where: str | Phrase | None = None) -> RopeScaling:
    """`linear:4`, `ntk:4`, `yarn:4` (or transformers' name `dynamic:4`; `llama3:8`) as a RopeScaling,
    optionally followed by `,name=value` settings of transformers' rope_scaling (an imported model's
    rule, as `spelled` writes it: `llama3:32,original_context=8192,high_freq_factor=4`).

    A rule that cannot be computed is refused: as the `rope_scaling` parameter (the command line's
    `--rope-scaling`), or, given `where` (a config file, a `--set`, a grid value), as the config key
    `[model] rope_scaling` there."""
    try:
        return _read(str(text))
    except _Unreadable as exc:
        if where is None:
            raise MinigptError("{rope_scaling} {given}: {problem}", given=text, problem=str(exc)) from None
        raise ConfigError(
            "{where}: [model] rope_scaling = {literal}: {problem}",
            where=where,
            literal=json.dumps(str(text), ensure_ascii=False),
            problem=str(exc),
        ) from None


def _read(text: str) -> RopeScaling:
    head, *written = text.split(",")
    kind, _, factor_text = head.strip().partition(":")
    rules = ", ".join(f"{name}:F" for name in SCALING_KINDS if name != "dynamic")
    if kind not in SCALING_KINDS:
        raise _Unreadable(f"{kind!r} is no scaling rule; expected one of {rules}, F a factor, e.g. yarn:4")
    try:
        factor = float(factor_text)
    except ValueError:
        factor = math.nan
    if not 1 <= factor <= MAX_FACTOR:
        given = f"the factor {factor_text} is out of range" if factor_text else "no factor is given"
        raise _Unreadable(
            f"{given}: F in {kind}:F is a number from 1 to {MAX_FACTOR:,.0f} (the rule reads F times the trained "
            f"length); write e.g. {kind}:4"
        )
    rule = SCALING_KINDS[kind]
    settings = {name: s for name, s in SETTINGS.items() if rule in s.rules}
    given: dict[str, Any] = {}
    texts: dict[str, str] = {}  # each setting as written, for the messages
    for piece in written:
        name, equals, raw = (part.strip() for part in piece.partition("="))
        setting = settings.get(name)
        if not equals or not name:
            raise _Unreadable(
                f"{piece.strip()!r} is not a setting: after {kind}:F come name=value settings, one after each comma"
            )
        if setting is None:
            reads = f"{kind} takes {', '.join(settings)}"
            if name in SETTINGS:
                raise _Unreadable(f"{name} is a setting of {' and '.join(SETTINGS[name].rules)}; {reads}: drop {name}")
            raise _Unreadable(f"{name} is not a setting of {kind}; {reads}: drop it, or check its spelling")
        if name in given:
            raise _Unreadable(f"{name} is given twice; give each setting once")
        texts[name] = raw or "(nothing)"
        try:
            given[name] = _value(setting, raw)
        except ValueError:
            raise _Unreadable(_out_of_range(kind, name, texts[name], RopeScaling(rule, factor, **given))) from None
    scaling = RopeScaling(rule, factor, name=text, **given)
    for name, value in given.items():  # a range may depend on another setting (beta_slow < beta_fast)
        if not SETTINGS[name].within(value, scaling):
            raise _Unreadable(_out_of_range(kind, name, texts[name], scaling))
    return scaling


def _value(setting: _Setting, raw: str) -> Any:
    """A setting's text as its type (ValueError if it is not one): an int a whole number, a bool
    true or false, a float any number Python reads (nan and inf too: the range refuses them)."""
    if setting.kind is bool:
        if raw not in ("true", "false"):
            raise ValueError(raw)
        return raw == "true"
    return setting.kind(raw)


def _out_of_range(kind: str, name: str, text: str, scaling: RopeScaling) -> str:
    """A setting refused: as written, and the range its rule allows (other settings as they stand)."""
    setting = SETTINGS[name]
    allowed = setting.range.format(**asdict(scaling))
    return (
        f"{name} = {text} is out of range: {kind}'s {name} is {allowed}: {setting.meaning}; give one in that "
        f"range, e.g. {name}={setting.example}"
    )


def _written(value: Any) -> str:
    """A setting's value as `spelled` writes it: true/false, or Python's repr of the number."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def spelled(scaling: RopeScaling) -> str:
    """The text `parse_rope_scaling` reads back as `scaling`: kind:factor, then every setting its
    rule reads that differs from its default (what an imported model's [model] rope_scaling holds)."""
    default = RopeScaling(scaling.kind, scaling.factor)
    parts = [f"{scaling.kind}:{scaling.factor!r}"]
    for name, setting in SETTINGS.items():
        value = getattr(scaling, name)
        if scaling.kind in setting.rules and value != getattr(default, name):
            parts.append(f"{name}={_written(value)}")
    return ",".join(parts)
