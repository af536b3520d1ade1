"""A sweep drawn: one metric of its cells against one grid key, a line per combination of the other
keys, each point the mean over the seeds (train.seed, the key `--seeds` adds) with every seed's
value drawn beside it. As text (a terminal), or as a figure (matplotlib: plot.py's extra).

It reads what sweep.jsonl records of each cell (`values`, `final_val_loss`, `best_val_loss`,
`diverged_at`, `diverged_by`, `wall_s`) and the grid (each key's values, in order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .plot import _pyplot

SEED_KEY = "train.seed"
# --metric -> the record's field and how an axis names it
METRICS = {
    "final": ("final_val_loss", "final validation loss (nats/token)"),
    "best": ("best_val_loss", "best validation loss (nats/token)"),
    "diverged_at": ("diverged_at", "step at which it diverged"),
    "wall": ("wall_s", "wall time (seconds)"),
}


@dataclass
class SweepLine:
    """One combination of the other keys: at each value of the key drawn against (in grid order),
    every seed's value and their mean (None where no cell has one)."""

    label: str
    points: list[list[float]] = field(default_factory=list)  # per x: the seeds' values
    left_out: list[str] = field(default_factory=list)  # cells not drawn: they diverged before the end

    @property
    def means(self) -> list[float | None]:
        return [sum(values) / len(values) if values else None for values in self.points]


def sweep_lines(
    grid: dict[str, list[Any]], records: list[dict[str, Any]], metric: str, against: str
) -> list[SweepLine]:
    """The lines of `metric` ("final", "best", "diverged_at", "wall") against the grid key `against`.
    A cell that diverged has no final validation loss (it stopped before the end) and is left out
    of "final"; one that did not has no step of divergence."""
    field_name = METRICS[metric][0]
    xs = grid[against]
    others = [key for key in grid if key not in (against, SEED_KEY)]
    lines: dict[tuple, SweepLine] = {}
    labels = short_names(others)
    for combination in _product([grid[key] for key in others]):
        label = ", ".join(f"{labels[key]}={value_text(v)}" for key, v in zip(others, combination)) or "all cells"
        lines[tuple(_hashable(v) for v in combination)] = SweepLine(label, [[] for _ in xs])
    for record in records:
        values = record["values"]
        line = lines[tuple(_hashable(values[key]) for key in others)]
        value = record.get(field_name)
        if metric == "final" and record.get("diverged_by"):
            line.left_out.append(
                f"{record['cell']} (diverged at step {record['diverged_at']}, {record['diverged_by']})"
            )
        elif value is not None and math.isfinite(value):
            line.points[[_hashable(x) for x in xs].index(_hashable(values[against]))].append(float(value))
    return list(lines.values())


def _product(lists: list[list[Any]]) -> list[tuple]:
    result: list[tuple] = [()]
    for values in lists:
        result = [(*r, v) for r in result for v in values]
    return result


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def short_names(keys: list[str]) -> dict[str, str]:
    """Each grid key by its name alone (n_layer), or whole (train.seed) where two keys share a name:
    as a sweep's folder names, its table and its plots show them."""
    names = [key.partition(".")[2] for key in keys]
    return {key: name if names.count(name) == 1 else key for key, name in zip(keys, names)}


def value_text(value: Any) -> str:
    """A grid value as the sweep's table and folder names show it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # short where that is exact: 0.003, 1e+09
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


def _seeds(grid: dict[str, list[Any]], against: str) -> int:
    return len(grid[SEED_KEY]) if SEED_KEY in grid and against != SEED_KEY else 1


def text_sweep(
    grid: dict[str, list[Any]], records: list[dict[str, Any]], metric: str, against: str, height: int = 12
) -> str:
    """The lines as characters: one column band per value of `against`, each line's mean as its
    mark and each seed's value as a dot; a legend, then the numbers as a table below."""
    lines = sweep_lines(grid, records, metric, against)
    xs = [value_text(x) for x in grid[against]]
    values = [v for line in lines for per_x in line.points for v in per_x]
    title = f"{METRICS[metric][1]} against {against}"
    seeds = _seeds(grid, against)
    if seeds > 1:
        title += f" (mean of {seeds} seeds: marks; each seed: .)"
    if not values:
        return "\n".join([title, "no cell has a value to draw", *_left_out(lines)])
    marks = "*o+x#@%&"
    number = ".4f" if metric in ("final", "best") else ".4g"  # losses to 4 decimals, steps and seconds as they are
    band = max(6, *(len(x) + 2 for x in xs))
    low, high = min(values), max(values)
    if metric == "diverged_at":  # whole steps: a row each, where they are few
        height = min(height, round(high - low) + 1)
    height = height if high > low else 1  # every value the same: one row says it
    chart = [[" "] * (band * len(xs)) for _ in range(height)]

    def row(value: float) -> int:
        return round((high - value) / ((high - low) or 1) * (height - 1))

    for k, line in enumerate(lines):
        for i, per_x in enumerate(line.points):
            column = i * band + band // 2
            for value in per_x if seeds > 1 else []:
                if chart[row(value)][column] == " ":
                    chart[row(value)][column] = "."
            mean = line.means[i]
            if mean is not None:
                chart[row(mean)][column] = marks[k % len(marks)]
    out = [title]
    for i, chars in enumerate(chart):
        value = high - (high - low) * i / max(1, height - 1)
        out.append(f"{value:9{number}} |{''.join(chars).rstrip()}")
    out.append(" " * 10 + "+" + "-" * (band * len(xs)))
    out.append(" " * 11 + "".join(x.center(band) for x in xs).rstrip())
    out += [f"  {marks[k % len(marks)]} {line.label}" for k, line in enumerate(lines)]
    width = max(len(against), *(len(line.label) for line in lines))
    column = max(9, *(len(x) for x in xs))
    out += ["", f"  {against:<{width}}" + "".join(f"  {x:>{column}}" for x in xs)]
    for line in lines:
        cells = ["-" if mean is None else f"{mean:{number}}" for mean in line.means]
        out.append(f"  {line.label:<{width}}" + "".join(f"  {c:>{column}}" for c in cells))
    return "\n".join(out + _left_out(lines))


def _left_out(lines: list[SweepLine]) -> list[str]:
    gone = [cell for line in lines for cell in line.left_out]
    return ["", "not drawn, diverged before the end:", *(f"  {cell}" for cell in gone)] if gone else []


def sweep_figure(grid: dict[str, list[Any]], records: list[dict[str, Any]], metric: str, against: str, title: str = ""):
    """The lines as a figure: the against key's values evenly along x (in grid order), each line's
    means joined, each seed's value a faint point, diverged cells left out of "final" (the title
    says how many)."""
    plt = _pyplot()
    lines = sweep_lines(grid, records, metric, against)
    xs = [value_text(x) for x in grid[against]]
    figure, ax = plt.subplots(figsize=(7.5, 4.2), layout="constrained")
    seeds = _seeds(grid, against)
    for line in lines:
        drawn = [(i, mean) for i, mean in enumerate(line.means) if mean is not None]
        (mark,) = ax.plot([i for i, _ in drawn], [m for _, m in drawn], marker="o", label=line.label)
        if seeds > 1:
            points = [(i, v) for i, per_x in enumerate(line.points) for v in per_x]
            ax.scatter([i for i, _ in points], [v for _, v in points], color=mark.get_color(), alpha=0.35, s=14)
    ax.set_xticks(range(len(xs)), xs)
    ax.set_xlim(-0.5, len(xs) - 0.5)
    ax.set_xlabel(against)
    ax.set_ylabel(METRICS[metric][1])
    gone = sum(len(line.left_out) for line in lines)
    heading = f"{title + ': ' if title else ''}{metric} against {against}"
    heading += f" (mean of {seeds} seeds)" if seeds > 1 else ""
    heading += f"; {gone} diverged cell{'s' if gone != 1 else ''} not drawn" if gone else ""
    ax.set_title(heading, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure
