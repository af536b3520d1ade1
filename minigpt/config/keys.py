"""One key at a time: a section and a key the config knows (a typo gets the closest one
suggested), its value checked against the key's field, a path resolved; `section.key=value`
overrides and typed values given by name, checked the same way, so that no way of giving a value
can smuggle in one the file would be refused for."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Phrase
from ..rope_scaling import parse_rope_scaling
from .fields import checked_field, toml_value
from .sections import PATH_KEYS, PATH_LISTS, SECTIONS, Given

# The values read so far, per section ({"model": {"n_layer": 2}}), each already checked.
Values = dict[str, dict[str, Any]]


def _check_paths(section: str, key: str, value: Any, where: str | Phrase) -> str | list[str]:
    """A path or a non-empty list of paths; a list of one is that path (so `--data a.txt` and
    `data = ["a.txt"]` are the run `data = "a.txt"` is, and its config.toml says so)."""
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value[0] if len(value) == 1 else list(value)
    if isinstance(value, str):
        return value
    literal = toml_value(value) if isinstance(value, (bool, int, float, list)) else repr(value)
    raise ConfigError(
        '{where}: [{section}] {key} = {literal} is not a path or a list of paths; expected e.g. "my.txt" '
        'or ["a/", "b.txt"] (a file, a folder of *.txt files, or a list of them)',
        where=where,
        section=section,
        key=key,
        literal=literal,
    )


def _check_value(section: str, key: str, value: Any, where: str | Phrase) -> Any:
    if (section, key) in PATH_LISTS:
        return _check_paths(section, key, value, where)
    value = checked_field(section, key, {f.name: f for f in fields(SECTIONS[section])}[key], value, where)
    if (section, key) == ("model", "rope_scaling") and value:  # a rule rope can compute, or refused here
        parse_rope_scaling(value, where)
    return value


def unknown(name: str, known: list[str], what: str, where: str | Phrase) -> ConfigError:
    """The refusal of a section or key the config does not know, with the closest known one."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(
        "{where}: unknown {what} {name!r}; {hint}allowed: {join}",
        where=where,
        what=what,
        name=name,
        hint=hint,
        join=", ".join(known),
    )


def _resolve_path(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def apply(values: Values, section: str, key: str, value: Any, where: str | Phrase, base: Path) -> None:
    """[section] key = value, given in `where`, checked and set in `values`; a relative path is taken
    against `base` (a config file's folder, or the current directory for what the command line gives)."""
    if section not in SECTIONS:
        raise unknown(section, list(SECTIONS), "section", where)
    known = [f.name for f in fields(SECTIONS[section])]
    if key not in known:
        raise unknown(key, known, f"key in [{section}]:", where)
    value = _check_value(section, key, value, where)
    if (section, key) in PATH_KEYS and value:
        value = [_resolve_path(v, base) for v in value] if isinstance(value, list) else _resolve_path(value, base)
    values[section][key] = value


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value). The value is read as TOML, else as a bare string."""
    where = Phrase("{set} {text}", text=text)
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError("{where}: expected section.key=value, e.g. {set} model.n_layer=2", where=where)
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words such as tokenizer.kind=char
    return section, key.strip(), value


def checked_override(text: str, where: str | Phrase | None = None) -> tuple[str, str, Any]:
    """One `section.key=value` override checked on its own, as load_config checks each (the key, its
    type and range; not yet against the rest of a config): (section, key, the value as the config
    takes it). A refusal names it as `where` says (by default `--set TEXT`)."""
    section, key, value = parse_override(text)
    listed = isinstance(value, list) and (section, key) in PATH_LISTS  # train.data=["a/", "b.txt"]
    if _is_text_key(section, key) and not isinstance(value, str) and not listed:
        value = text.partition("=")[2].strip()  # sample.prompt=1 means the text "1"
    values: Values = {s: {} for s in SECTIONS}
    apply(values, section, key, value, where or Phrase("{set} {text}", text=text), Path.cwd())
    return section, key, values[section][key]


def _is_text_key(section: str, key: str) -> bool:
    cls = SECTIONS.get(section)
    return cls is not None and any(f.name == key and f.type in ("str", "str | list[str]") for f in fields(cls))


def apply_given(values: Values, given: Given) -> None:
    """Typed values for config keys, each named in messages as the parameter that gave it (a
    flag's name, an API argument's, an explore request's field: each is the key's own name)."""
    for section, keys in given.items():
        for key, value in keys.items():
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            apply(values, section, key, value, Phrase("{" + key + "} {shown}", shown=shown), Path.cwd())
