"""A config key as a dataclass field that carries what is allowed (`spec`), and a value checked
against it: its type, finiteness, choices and range. Validation, messages and the key's
command-line flag (commands/options.py) all come from the field, so each is said once."""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import Field, field
from typing import Any

from ..errors import ConfigError, Phrase


def spec(
    default: Any,
    help: str,
    *,
    choices: tuple = (),
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_max: bool = False,
    positive: bool = False,
    short: str = "",
):
    """A dataclass field carrying what is allowed, so validation, messages and a key's command-line
    flag come from one place. The flag of a key is `--` + its name hyphenated (a bool's is the pair
    `--name/--no-name`), with `-` + `short` as its alias where it has one; its help is `help`."""
    return field(
        default=default,
        metadata=dict(
            help=help,
            choices=choices,
            minimum=minimum,
            maximum=maximum,
            exclusive_max=exclusive_max,
            positive=positive,
            short=short,
        ),
    )


def toml_value(value: Any) -> str:
    """A value as TOML writes it, so that a config reads back exactly it (and a message shows it so)."""
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # JSON string escapes are valid TOML basic strings; TOML also forbids a raw DEL character.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _type_name(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]


def checked_field(section: str, key: str, declared: Field, value: Any, where: str | Phrase) -> Any:
    """`value` for the key declared by the field `declared`, as the config takes it (an integer for a float key
    becomes a float); refused, naming `where`, where its type, choices or range are not the field's."""
    meta = declared.metadata
    literal = toml_value(value) if isinstance(value, (bool, int, float, str)) else repr(value)
    shown = f"[{section}] {key} = {literal}"
    if declared.type == "bool | str":  # a switch with a third, named setting: residual = true | false | "attention"
        if not isinstance(value, (bool, str)) or value not in meta["choices"]:
            allowed = ", ".join(toml_value(choice) for choice in meta["choices"])
            raise ConfigError(
                "{where}: {shown} is not allowed; choose one of: {allowed}", where=where, shown=shown, allowed=allowed
            )
        return value
    kind = {"int": int, "float": float, "bool": bool, "str": str}[declared.type]
    ok = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, int) and not isinstance(value, bool)
        if kind is int
        else isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, str)
    )
    if not ok:
        raise ConfigError(
            "{where}: {shown} is not {type_name}; expected {type_name} ({help})",
            where=where,
            shown=shown,
            type_name=_type_name(kind),
            help=meta["help"],
        )
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError("{where}: {shown} is not finite; expected a finite number", where=where, shown=shown)
    if meta["choices"] and value not in meta["choices"]:
        allowed = ", ".join(meta["choices"])
        close = difflib.get_close_matches(str(value), meta["choices"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            "{where}: {shown} is not allowed; choose one of: {allowed}{hint}",
            where=where,
            shown=shown,
            allowed=allowed,
            hint=hint,
        )
    if meta["positive"] and value <= 0:
        raise ConfigError("{where}: {shown} must be greater than 0", where=where, shown=shown)
    if meta["minimum"] is not None and value < meta["minimum"]:
        raise ConfigError(
            "{where}: {shown} must be at least {minimum}", where=where, shown=shown, minimum=meta["minimum"]
        )
    if meta["maximum"] is not None:
        too_big = value >= meta["maximum"] if meta["exclusive_max"] else value > meta["maximum"]
        if too_big:
            word = "below" if meta["exclusive_max"] else "at most"
            raise ConfigError(
                "{where}: {shown} must be {word} {maximum}",
                where=where,
                shown=shown,
                word=word,
                maximum=meta["maximum"],
            )
    return value
