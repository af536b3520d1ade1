"""A sweep's grid (api/sweep.py): the `--grid` texts read into each key's values, every value checked
on its own by minigpt.config and every cell's whole config as `train` checks it, and the cells themselves,
made when they are read (a grid of a million cells costs the memory of one), each named from its
values for its run folder and its row of the table.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any

from ..config import PATH_KEYS, Config, checked_override, parse_override, read_config, resolved
from ..errors import MinigptError, Phrase
from ..inspection.sweep_plot import SEED_KEY, short_names, value_text


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a value for every grid key, and the folder it trains into."""

    values: dict[str, Any]  # grid key ("model.n_layer") -> its value, as the config took it; grid order
    name: str  # its run folder's name under the sweep's folder

    @property
    def overrides(self) -> list[str]:
        """The cell's values as `section.key=value` overrides."""
        return [f"{key}={toml_value(value)}" for key, value in self.values.items()]


class Cells(Sequence[Cell]):
    """Every combination of a grid's values, in grid order (the first key's values outermost), each
    cell made when it is read: its index is a number written in the mixed radix of the keys' value
    counts, so neither iterating nor indexing ever holds more than one cell."""

    def __init__(self, grid: dict[str, list[Any]]):
        self.grid = grid
        self.labels = short_names(list(grid))

    @property
    def count(self) -> int:
        """How many cells: len() too, where Python's len can say it (below 2^63)."""
        return math.prod(len(values) for values in self.grid.values())

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[Cell]:
        return (self._cell(combination) for combination in itertools.product(*self.grid.values()))

    def __getitem__(self, index: int) -> Cell:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        index %= self.count
        combination = []
        for values in reversed(self.grid.values()):  # the last key's values change fastest
            index, position = divmod(index, len(values))
            combination.append(values[position])
        return self._cell(reversed(combination))

    def index(self, cell: Cell, *_) -> int:
        """The cell's place in grid order (ValueError for a cell of another grid)."""
        index = 0
        for key, values in self.grid.items():
            index = index * len(values) + values.index(cell.values[key])
        return index

    def _cell(self, combination) -> Cell:
        values = dict(zip(self.grid, combination))
        return Cell(values, _cell_name(values, self.labels))


def grid_axes(grid: Mapping[str, Sequence[Any]] | Sequence[str], seeds: int | None) -> dict[str, list[str]]:
    """Each grid key with its values as `key=value` override texts, in the order given; a key given
    twice, a key without values and a malformed entry are refused."""
    if isinstance(grid, str):
        grid = [grid]
    if isinstance(grid, Mapping):
        entries = [
            (str(key), [f"{key}={toml_value(value)}" for value in _listed(values)], str(key))
            for key, values in grid.items()
        ]
    else:
        entries = [_parsed_entry(str(text)) for text in grid]
    axes: dict[str, list[str]] = {}
    for key, texts, shown in entries:
        if key in axes:
            raise MinigptError(
                "{grid} {key} is given twice; give each key once, with all its values (e.g. {grid} {key}=V1,V2)",
                key=key,
            )
        if not texts:
            raise MinigptError(
                "{grid} {text} lists no values; list one or more after '=', e.g. {grid} model.n_layer=2,4,8",
                text=shown,
            )
        axes[key] = texts
    if seeds is not None and seeds < 1:
        raise MinigptError("{seeds} {given} is not a number of seeds; give 1 or more", given=seeds)
    if seeds is not None and SEED_KEY in axes:
        raise MinigptError("{seeds} and {grid} {key} both give the seeds; give one of them", key=SEED_KEY)
    if not axes and seeds is None:
        raise MinigptError("nothing to sweep: give {grid} KEY=V1,V2,... (repeatable), or {seeds} K")
    return axes


def _listed(values: Any) -> list[Any]:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _parsed_entry(text: str) -> tuple[str, list[str], str]:
    """`model.n_layer=2,4,8` as its key and one override text per value. A value with commas in it
    (a rope scaling rule with settings) is written in double quotes, a TOML string:
    `model.rope_scaling="yarn:4,beta_fast=16",linear:2`; or the values as a TOML array after '='."""
    name, equals, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not equals or not dot or not section or not key:
        raise MinigptError(
            "{grid} {text} is not a grid key and its values; write section.key=V1,V2,... (e.g. {grid} "
            "model.n_layer=2,4,8)",
            text=text,
        )
    name, raw = name.strip(), raw.strip()
    if raw.startswith("["):
        try:
            values = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise MinigptError("{grid} {text}: not a TOML array ({exc})", text=text, exc=exc) from None
        return name, [f"{name}={toml_value(value)}" for value in values], text
    if raw.count('"') % 2:
        raise MinigptError(
            "{grid} {text} has a double quote that is never closed; write a value with commas in it between two, "
            'e.g. {grid} model.rope_scaling="yarn:4,beta_fast=16",linear:2',
            text=text,
        )
    pieces = [piece.strip() for piece in _OUTSIDE_QUOTES.split(raw)] if raw else []
    if any(not piece for piece in pieces) and pieces:
        raise MinigptError(
            "{grid} {text} has an empty value; separate the values with single commas, e.g. {grid} model.n_layer=2,4,8",
            text=text,
        )
    return name, [f"{name}={piece}" for piece in pieces], text


# a comma followed by an even number of double quotes up to the end: one outside every quoted value
_OUTSIDE_QUOTES = re.compile(r',(?=(?:[^"]*"[^"]*")*[^"]*$)')


def refuse_conflicts(axes: dict[str, list[str]], sets: list[str], given: dict[str, dict[str, Any]]) -> None:
    """A grid key set another way too (by `set`, or by an argument such as steps) is refused: the
    cells would not have the values the grid says."""
    if "train.out" in axes:
        raise MinigptError(
            "{grid} train.out is refused: each cell's run folder is named from its values, under the sweep's {out}"
        )
    for text in sets:
        section, key, _ = parse_override(text)
        if f"{section}.{key}" in axes:
            raise MinigptError(
                "{set} {text} sets a grid key; a grid key takes its values from {grid} alone: drop the {set}",
                text=text,
            )
    for section, keys in given.items():
        for key in keys:
            if f"{section}.{key}" in axes:
                raise MinigptError(
                    "{" + key + "} and {grid} {name} both set [{section}] {key_name}; give its values in {grid} alone",
                    name=f"{section}.{key}",
                    section=section,
                    key_name=key,
                )


def grid_value(text: str) -> Any:
    """One grid value (`section.key=value`) checked on its own as the config checks an override (key,
    type, range), as the config takes it. Not against the base config: with another grid key's value
    it may make a cell that runs (n_head = 3 with n_embd = 30), which the cells' checks decide."""
    return checked_override(text, Phrase("{grid} {text}", text=text))[2]


def checked_cell(config: str | Path | None, sets: list[str], given: dict[str, dict[str, Any]], where: Phrase) -> Config:
    """The config with these overrides, read as load_config reads it and resolved as it resolves one
    (the exercise's values, the table of cross-checks in config/cross_checks.py); a refusal says it of
    `where` (the cell), since the base config and each grid value on its own were found valid before."""
    return resolved(read_config(config, sets, given), where)


def refuse_repeated_values(grid: dict[str, list[Any]]) -> None:
    for key, values in grid.items():
        for k, value in enumerate(values):
            if value in values[:k]:
                raise MinigptError(
                    "{grid} {key} gives the value {value} twice; list each value once",
                    key=key,
                    value=toml_value(value),
                )


def cells_of(grid: dict[str, list[Any]]) -> Cells:
    """Every combination of the grid's values, the first key's outermost, each named; two cells
    whose folder names would be one are refused. A name is each key's label and value text, joined
    by , and = (which no value text holds), so two names are one only where some key has two values
    of one text: checked key by key, never cell by cell."""
    cells = Cells(grid)
    for key, values in grid.items():
        seen: dict[str, Any] = {}  # a value's text -> the value
        for value in values:
            text = _name_text(key, value)
            if text in seen:
                # the first cell with each of the two values (the other keys at their first values)
                a, b = ({**{k: v[0] for k, v in grid.items()}, key: each} for each in (seen[text], value))
                raise MinigptError(
                    "two cells would share the folder name {name} ({a} and {b}); give values that differ in "
                    "letters, digits or . + -",
                    name=_cell_name(a, cells.labels),
                    a=_described(a),
                    b=_described(b),
                )
            seen[text] = value
    return cells


def _cell_name(values: dict[str, Any], labels: dict[str, str]) -> str:
    """A cell's run folder name: each key's label and value, as short as a file name must be."""
    name = ",".join(f"{labels[key]}={_name_text(key, value)}" for key, value in values.items())
    if len(name) > 200:  # a file name has at most 255 bytes
        name = f"{name[:180]}-{sha256(name.encode()).hexdigest()[:12]}"
    return name


def _name_text(key: str, value: Any) -> str:
    """A value as its cell's folder name shows it: as the table does, with any character but
    letters, digits and . + - as _."""
    return re.sub(r"[^A-Za-z0-9.+-]", "_", table_text(key, value)) or "_"


def table_text(key: str, value: Any) -> str:
    """A value as the table shows it: a path by its last part."""
    section, _, name = key.partition(".")
    if (section, name) in PATH_KEYS:
        return "+".join(Path(v).name for v in _listed(value))
    return value_text(value)


def _described(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def toml_value(value: Any) -> str:
    """A value as TOML writes it (so that the config reads back exactly it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)
