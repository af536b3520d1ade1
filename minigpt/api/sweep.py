"""`minigpt.sweep`: a grid of runs, trained one after another by `minigpt.train` into one folder.

    minigpt.sweep({"model.n_layer": [2, 4, 8], "model.norm_position": ["pre", "post"]}, "runs/depth",
                  config="configs/default.toml", steps=300, seeds=3)

Every cell is the base config (the config file, `set` and the arguments train takes) with one
value of each grid key, trained into an ordinary run folder named from those values
(DIR/n_layer=8,norm_position=post,seed=1337), so every command that reads a run reads it. The
folder also holds:

    DIR/sweep.toml    the grid: each key's values, in order (`seeds` adds train.seed last)
    DIR/base.toml     the resolved config every cell starts from: train -c DIR/base.toml with the
                      cell's values as `set` trains that cell again
    DIR/sweep.jsonl   one JSON object per finished cell: its values, final and best validation
                      loss, where it diverged and by which rule, wall seconds, what `auto` chose

Every grid value, and every cell's whole config, is checked by config.py before anything runs.
Calling it again with the same definition continues the sweep: a finished cell (recorded, its run
folder's checkpoint in place) is skipped, an interrupted one resumes from its checkpoint, and a
different definition is refused, naming the difference.

A cell diverges in one of two ways, and stops there with its run folder intact:

- non-finite: a step's loss or gradient norm is not finite (the trainer's own guard: the step is
  not applied, the last checkpoint stands);
- exploded: a step's training loss is above twice ln V, V the tokenizer's vocabulary size: twice
  the loss of guessing uniformly, where minigpt's models start (their head starts near zero).
  Every step's loss is checked, not only the logged ones; training stops after that step, with a
  checkpoint, as an interruption stops it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from hashlib import sha256
from pathlib import Path
from typing import Any

from ..config import PATH_KEYS, Config, ConfigError, load_config, parse_override
from ..errors import MinigptError, Phrase
from ..inspection.counting import recorded_choices
from ..inspection.sweep_plot import SEED_KEY, short_names, value_text
from ..io import atomic_write_text
from ..runs.identity import sections_differences, training_identity
from ..runs.layout import CHECKPOINT_FILE
from ..training.events import StepDone
from ..training.trainer import DivergedError
from .arguments import overrides, plain
from .reading import metrics
from .training import train

SWEEP_FILE = "sweep.toml"
BASE_FILE = "base.toml"
RECORDS_FILE = "sweep.jsonl"
EXPLODED_FACTOR = 2.0  # a loss above this many times ln V has exploded
NON_FINITE, EXPLODED = "non-finite", "exploded"


def explosion_threshold(vocab_size: int) -> float:
    """The training loss above which a step has exploded: twice ln V (see the module's docstring)."""
    return EXPLODED_FACTOR * math.log(max(vocab_size, 2))


def exploded(loss: float, vocab_size: int) -> bool:
    """Whether a finite training loss has exploded (a non-finite one is the trainer's to stop)."""
    return math.isfinite(loss) and loss > explosion_threshold(vocab_size)


@dataclass(frozen=True)
class Cell:
    """One run of the grid: a value for every grid key, and the folder it trains into."""

    values: dict[str, Any]  # grid key ("model.n_layer") -> its value, as the config took it; grid order
    name: str  # its run folder's name under the sweep's folder

    @property
    def overrides(self) -> list[str]:
        """The cell's values as `section.key=value` overrides."""
        return [f"{key}={_toml(value)}" for key, value in self.values.items()]


@dataclass(frozen=True)
class Stopped:
    """Where an interruption stopped a sweep: inside this cell, at this step (a checkpoint there)."""

    cell: Cell
    step: int
    total: int


@dataclass
class Sweep:
    """A sweep folder: its grid, its cells in grid order (the first key's values outermost), and the
    records of the cells finished so far. `stopped` says where an interruption stopped it."""

    folder: Path
    grid: dict[str, list[Any]]
    cells: list[Cell]
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # by cell name
    stopped: Stopped | None = None

    @property
    def finished(self) -> bool:
        return all(cell.name in self.records for cell in self.cells)

    def labels(self) -> dict[str, str]:
        """Each grid key as the table and the folder names show it (see short_names)."""
        return short_names(list(self.grid))

    def rows(self) -> list[list[str]]:
        """The table: a header, then one row per finished cell in grid order: its values, final and
        best validation loss, where it diverged and by which rule ("-": it did not), wall time and
        the optimizer it trained with."""
        labels = self.labels()
        rows = [[*labels.values(), "final val", "best val", "diverged", "wall", "optimizer"]]
        for cell in self.cells:
            record = self.records.get(cell.name)
            if record is None:
                continue
            diverged = f"step {record['diverged_at']} {record['diverged_by']}" if record["diverged_by"] else "-"
            rows.append(
                [_table_text(key, value) for key, value in cell.values.items()]
                + [_loss(record["final_val_loss"]), _loss(record["best_val_loss"]), diverged]
                + [f"{record['wall_s']:.1f}s", (record.get("chosen") or {}).get("optimizer", "?")]
            )
        return rows


def sweep(
    grid: Mapping[str, Sequence[Any]] | Sequence[str],
    out: str | Path,
    *,
    seeds: int | None = None,
    data: str | Path | Sequence[str | Path] | None = None,
    steps: int | None = None,
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
    init_from: str | Path | None = None,
    init_checkpoint: str | None = None,
    task: str | None = None,
    task_length: int | None = None,
    exercise: str | None = None,
    exercise_file: str | Path | None = None,
    progress: bool = True,
    on_cell: Callable[[Cell, str, Sweep], None] | None = None,
    on_done: Callable[[Cell, dict[str, Any]], None] | None = None,
) -> Sweep:
    """Train every cell of `grid` ({"model.n_layer": [2, 4]}, or texts "model.n_layer=2,4") into
    the sweep folder `out`, one after another, each as `train` trains a run from `config`, `set`
    and the arguments train takes; `seeds` K adds train.seed, train.seed + 1, ... (K values) as the
    last grid key. Calling it again continues: finished cells are skipped, an interrupted one
    resumes. `on_cell(cell, how, sweep)` is called before each cell, how being "skip", "start" or
    "resume" (`sweep.cells` is every cell); `on_done(cell, record)` once it has finished.
    Interrupting (Ctrl-C, SIGTERM) stops inside the cell as `train` stops (a checkpoint), and the
    sweep returns with `stopped`. Returns the Sweep: its records in `records`, the table `rows()`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise MinigptError(
            "a sweep trains its cells one after another in one process, and this one is one of a torchrun job's; "
            "run the sweep without torchrun"
        )
    given_train = {"data": data, "steps": steps, "init_from": init_from, "init_checkpoint": init_checkpoint}
    given_train |= {"task": task, "task_length": task_length, "exercise_file": exercise_file}
    given = {
        "train": {key: plain(value) for key, value in given_train.items() if value is not None},
        "model": {"exercise": exercise} if exercise is not None else {},
    }
    sets = overrides(set)
    axes = _axes(grid, seeds)
    _refuse_conflicts(axes, sets, given)
    base = load_config(config, sets, given)  # the config, set and the arguments, checked as train checks them
    if seeds is not None:
        axes[SEED_KEY] = [f"{SEED_KEY}={base.train.seed + k}" for k in range(seeds)]
    grid_values = {key: [_value(config, sets, given, text) for text in texts] for key, texts in axes.items()}
    _refuse_repeated_values(grid_values)
    cells = _cells(grid_values)
    for cell in cells:  # every combination's whole config (n_embd a multiple of n_head, ...), before any runs
        _checked(config, [*sets, *cell.overrides], given, Phrase("{grid} cell {name}", name=cell.name))
    folder = Path(out)
    found = Sweep(folder, grid_values, cells, _open_folder(folder, grid_values, base))
    for cell in cells:
        run = folder / cell.name
        has_checkpoint = (run / CHECKPOINT_FILE).is_file()
        if cell.name in found.records and has_checkpoint:
            if on_cell is not None:
                on_cell(cell, "skip", found)
            continue
        if on_cell is not None:
            on_cell(cell, "resume" if has_checkpoint else "start", found)
        record = _train_cell(cell, run, has_checkpoint, config, sets, given, progress)
        if isinstance(record, Stopped):
            found.stopped = record
            return found
        found.records[cell.name] = record
        _write_records(folder, found.records)
        if on_done is not None:
            on_done(cell, record)
    return found


def read_sweep(folder: str | Path) -> Sweep:
    """The sweep in `folder` as its grid and the records of its finished cells (for the table and
    `minigpt plot DIR`)."""
    folder = Path(folder)
    if not (folder / SWEEP_FILE).is_file():
        raise MinigptError(
            "{folder} holds no sweep ({file} is what a sweep writes there); give the {out} of a sweep",
            folder=folder,
            file=SWEEP_FILE,
        )
    grid = _read_grid(folder)
    return Sweep(folder, grid, _cells(grid), _read_records(folder))


# ---------------------------------------------------------------- the grid, checked


def _axes(grid: Mapping[str, Sequence[Any]] | Sequence[str], seeds: int | None) -> dict[str, list[str]]:
    """Each grid key with its values as `key=value` override texts, in the order given; a key given
    twice, a key without values and a malformed entry are refused."""
    if isinstance(grid, str):
        grid = [grid]
    if isinstance(grid, Mapping):
        entries = [
            (str(key), [f"{key}={_toml(value)}" for value in _listed(values)], str(key)) for key, values in grid.items()
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
    """`model.n_layer=2,4,8` (or a TOML array after '=', for values with commas in them) as its key
    and one override text per value."""
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
        return name, [f"{name}={_toml(value)}" for value in values], text
    pieces = [piece.strip() for piece in raw.split(",")] if raw else []
    if any(not piece for piece in pieces) and pieces:
        raise MinigptError(
            "{grid} {text} has an empty value; separate the values with single commas, e.g. {grid} model.n_layer=2,4,8",
            text=text,
        )
    return name, [f"{name}={piece}" for piece in pieces], text


def _refuse_conflicts(axes: dict[str, list[str]], sets: list[str], given: dict[str, dict[str, Any]]) -> None:
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


def _value(config: str | Path | None, sets: list[str], given: dict[str, dict[str, Any]], text: str) -> Any:
    """One grid value (`section.key=value`), checked as config.py checks an override (key, type,
    range, and the whole config it makes), as the config took it."""
    cfg = _checked(config, [*sets, text], given, Phrase("{grid} {text}", text=text))
    section, key, _ = parse_override(text)
    return getattr(getattr(cfg, section), key)


def _checked(config: str | Path | None, sets: list[str], given: dict[str, dict[str, Any]], where: Phrase) -> Config:
    """The config with these overrides, checked by config.py; a refusal says it of `where` (the
    grid value, or the cell), since the base config was found valid before."""
    try:
        return load_config(config, sets, given)
    except ConfigError as exc:
        if "where" not in exc.values:
            raise
        raise ConfigError(exc.template, **{**exc.values, "where": where}) from None


def _refuse_repeated_values(grid: dict[str, list[Any]]) -> None:
    for key, values in grid.items():
        for k, value in enumerate(values):
            if value in values[:k]:
                raise MinigptError(
                    "{grid} {key} gives the value {value} twice; list each value once",
                    key=key,
                    value=_toml(value),
                )


def _cells(grid: dict[str, list[Any]]) -> list[Cell]:
    """Every combination of the grid's values, the first key's outermost, each named."""
    labels = short_names(list(grid))
    cells, names = [], {}
    for combination in itertools.product(*grid.values()):
        values = dict(zip(grid, combination))
        name = ",".join(f"{labels[key]}={_name_text(key, value)}" for key, value in values.items())
        if len(name) > 200:  # a file name has at most 255 bytes
            name = f"{name[:180]}-{sha256(name.encode()).hexdigest()[:12]}"
        if name in names:
            raise MinigptError(
                "two cells would share the folder name {name} ({a} and {b}); give values that differ in letters, "
                "digits or . + -",
                name=name,
                a=names[name],
                b=_described(values),
            )
        names[name] = _described(values)
        cells.append(Cell(values, name))
    return cells


def _name_text(key: str, value: Any) -> str:
    """A value as its cell's folder name shows it: as the table does, with any character but
    letters, digits and . + - as _."""
    return re.sub(r"[^A-Za-z0-9.+-]", "_", _table_text(key, value)) or "_"


def _table_text(key: str, value: Any) -> str:
    """A value as the table shows it: a path by its last part."""
    section, _, name = key.partition(".")
    if (section, name) in PATH_KEYS:
        return "+".join(Path(v).name for v in _listed(value))
    return value_text(value)


def _described(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={_toml(value)}" for key, value in values.items())


def _toml(value: Any) -> str:
    """A value as TOML writes it (so that config.py reads back exactly it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


# ---------------------------------------------------------------- the folder: definition and records


def _open_folder(folder: Path, grid: dict[str, list[Any]], base: Config) -> dict[str, dict[str, Any]]:
    """The sweep folder for this definition, made (sweep.toml and base.toml written) when new, or
    the one there, whose definition must be this one: the records of its finished cells."""
    if folder.exists() and not folder.is_dir():
        raise MinigptError("{out} {folder} is a file; give a folder for the sweep", folder=folder)
    base_text = _base_toml(base)
    if (folder / SWEEP_FILE).is_file():
        differences = _differences(folder, grid, base)
        if differences:
            raise MinigptError(
                "{out} {folder} holds a sweep of another definition ({differences}); run the command that made it "
                "to continue it (its {sweep_file} and {base_file} say what it was), or give another {out}",
                folder=folder,
                differences="; ".join(differences),
                sweep_file=SWEEP_FILE,
                base_file=BASE_FILE,
            )
        return _read_records(folder)
    if folder.is_dir() and any(not p.name.endswith(".tmp") for p in folder.iterdir()):
        raise MinigptError(
            "{out} {folder} is not empty and holds no sweep (no {file}); give a new or empty folder",
            folder=folder,
            file=SWEEP_FILE,
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / BASE_FILE, base_text)
        atomic_write_text(folder / SWEEP_FILE, _grid_toml(grid))  # last: its presence says the folder is a sweep
    except OSError as exc:
        raise MinigptError(
            "{out} {folder} cannot be written ({reason}); give another folder",
            folder=folder,
            reason=exc.strerror or exc,
        ) from None
    return {}


def _base_toml(base: Config) -> str:
    """The base config as a config file (out left empty: each cell's is its folder under the sweep's)."""
    return replace(base, train=replace(base.train, out="")).to_toml()


def _grid_toml(grid: dict[str, list[Any]]) -> str:
    lines = [
        "# minigpt sweep: every cell is base.toml with one value of each key below, the first key's values",
        "# outermost; its run folder is named from its values. Rerunning the command continues the sweep.",
        "[grid]",
    ]
    lines += [f"{json.dumps(key)} = {_toml(values)}" for key, values in grid.items()]
    return "\n".join(lines) + "\n"


def _read_grid(folder: Path) -> dict[str, list[Any]]:
    try:
        grid = tomllib.loads((folder / SWEEP_FILE).read_text(encoding="utf-8")).get("grid")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        grid = None
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise MinigptError(
            "{path} is damaged: it is not a [grid] of keys and their values; remove the sweep folder or give another",
            path=folder / SWEEP_FILE,
        )
    return grid


def _differences(folder: Path, grid: dict[str, list[Any]], base: Config) -> list[str]:
    """How this definition differs from the one the folder holds: grid keys and values, then the
    base config's keys that decide a run's numbers (and its data)."""
    stored = _read_grid(folder)
    found = []
    if list(stored) != list(grid):
        found.append(f"grid keys {', '.join(stored)} there, {', '.join(grid)} here")
    else:
        found += [
            f"grid {key} = {_toml(stored[key])} there, {_toml(values)} here"
            for key, values in grid.items()
            if stored[key] != values
        ]
    if not (folder / BASE_FILE).is_file():
        raise MinigptError(
            "{path} is missing, and it says what the sweep's cells start from; the sweep folder is damaged: remove "
            "it or give another",
            path=folder / BASE_FILE,
        )
    then = load_config(folder / BASE_FILE)
    found += [
        d.replace(" != ", " there, ", 1) + " here" for d in sections_differences(_identity(then), _identity(base))
    ]
    return found


def _identity(cfg: Config) -> dict[str, dict[str, Any]]:
    """The base config's keys that decide what a cell computes, and the text it trains on."""
    identity = training_identity(cfg)
    identity["train"]["data"] = cfg.train.data
    return identity


def _read_records(folder: Path) -> dict[str, dict[str, Any]]:
    """sweep.jsonl's records by cell name (a later record of a cell replaces an earlier one)."""
    path = folder / RECORDS_FILE
    if not path.is_file():
        return {}
    records = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
            records[record["cell"]] = record
        except (ValueError, KeyError, TypeError):
            raise MinigptError(
                "{path} line {number} is not a cell's record; the sweep folder is damaged: remove that line "
                "(its cell is trained again)",
                path=path,
                number=number,
            ) from None
    return records


def _write_records(folder: Path, records: dict[str, dict[str, Any]]) -> None:
    """sweep.jsonl, written whole (atomically: a killed sweep leaves the previous one)."""
    atomic_write_text(folder / RECORDS_FILE, "".join(json.dumps(record) + "\n" for record in records.values()))


# ---------------------------------------------------------------- one cell


class _Explosion:
    """The exploded rule, asked after every step of a cell (train's stop_when)."""

    def __init__(self) -> None:
        self.vocab_size: int | None = None
        self.step: int | None = None  # where it exploded

    def __call__(self, event: StepDone) -> bool:
        if self.step is None and self.vocab_size is not None and exploded(event.loss, self.vocab_size):
            self.step = event.step
        return self.step is not None


def _train_cell(
    cell: Cell,
    run: Path,
    resume: bool,
    config: str | Path | None,
    sets: list[str],
    given: dict[str, dict[str, Any]],
    progress: bool,
) -> dict[str, Any] | Stopped:
    """Train (or resume) one cell into `run`; its record, or where an interruption stopped it."""
    explosion = _Explosion()

    def started(session) -> None:
        explosion.vocab_size = session.corpus.tokenizer.vocab_size

    # A folder without a checkpoint is a cell whose creation was cut short: made again.
    force = run.exists() and not resume
    began = time.perf_counter()
    diverged: tuple[int, str] | None = None
    try:
        result = train(
            **given["train"],
            **given["model"],
            out=run,
            config=config,
            set=[*sets, *cell.overrides],
            resume=resume,
            force=force,
            progress=progress,
            on_start=started,
            stop_when=explosion,
        )
    except DivergedError as exc:
        diverged = (int(exc.values["step"]), NON_FINITE)
    else:
        if explosion.step is not None:
            diverged = (explosion.step, EXPLODED)
        elif result.stopped:
            return Stopped(cell, result.step, result.total)
    seconds = time.perf_counter() - began
    evals = metrics(run)["eval"]
    choices, step = recorded_choices(run)
    return {
        "cell": cell.name,
        "values": cell.values,
        "checkpoint_step": step,  # where its run folder's checkpoint is (before a non-finite step)
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "best_val_loss": min(r["val_loss"] for r in evals) if evals else None,
        "diverged_at": diverged[0] if diverged else None,
        "diverged_by": diverged[1] if diverged else None,
        "wall_s": round(seconds, 3),
        "chosen": choices,
    }
