"""What the API takes as Python values (a mapping of overrides, paths, lists of paths), written as
the texts the config reads from a command line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def overrides(values: Mapping[str, Any] | Sequence[str]) -> list[str]:
    """{"model.n_layer": 2} or ["model.n_layer=2"] as the `section.key=value` texts config reads."""
    if isinstance(values, Mapping):
        return [f"{key}={_toml(value)}" for key, value in values.items()]
    return [str(v) for v in values]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plain(value: Any) -> Any:
    """A path as the text config reads, a list of paths (several `data`) as a list of texts."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return str(value) if isinstance(value, Path) else value
