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

Every grid value is checked by the config on its own (its key, type and range), then every cell's
whole config (the base with that cell's values: n_embd a multiple of n_head, ...), before anything
runs; a grid is refused only for a cell that cannot run, named with its values. The cells are made
as they are read, never listed: a grid of a million cells costs the memory of one.
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

import json
import math
import os
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..errors import MinigptError, Phrase
from ..inspection.counting import recorded_choices
from ..inspection.sweep_plot import SEED_KEY, short_names
from ..io import atomic_write_text
from ..runs.folder import source_relation
from ..runs.identity import sections_differences, training_identity
from ..runs.layout import CHECKPOINT_FILE
from ..training.checks import check_trainable, read_sources
from ..training.events import StepDone
from ..training.trainer import DivergedError, WriteFailed
from .arguments import overrides, plain
from .reading import metrics
from .sweep_grid import (
    Cell,
    Cells,
    cells_of,
    checked_cell,
    grid_axes,
    grid_value,
    refuse_conflicts,
    refuse_repeated_values,
    table_text,
    toml_value,
)
from .training import train

SWEEP_FILE = "sweep.toml"
BASE_FILE = "base.toml"
RECORDS_FILE = "sweep.jsonl"
EXPLODED_FACTOR = 2.0  # a loss above this many times ln V has exploded
NON_FINITE, EXPLODED = "non-finite", "exploded"
MANY_CELLS = 1_000  # a grid above this many cells is said before it runs (its count): a typo can multiply it


def explosion_threshold(vocab_size: int) -> float:
    """The training loss above which a step has exploded: twice ln V (see the module's docstring)."""
    return EXPLODED_FACTOR * math.log(max(vocab_size, 2))


def exploded(loss: float, vocab_size: int) -> bool:
    """Whether a finite training loss has exploded (a non-finite one is the trainer's to stop)."""
    return math.isfinite(loss) and loss > explosion_threshold(vocab_size)


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
    cells: Cells
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
                [table_text(key, value) for key, value in cell.values.items()]
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
    trust_exercise: bool = False,
    progress: bool = True,
    on_cell: Callable[[Cell, str, Sweep], None] | None = None,
    on_done: Callable[[Cell, dict[str, Any]], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> Sweep:
    """Train every cell of `grid` ({"model.n_layer": [2, 4]}, or texts "model.n_layer=2,4") into
    the sweep folder `out`, one after another, each as `train` trains a run from `config`, `set`
    and the arguments train takes; `seeds` K adds train.seed, train.seed + 1, ... (K values) as the
    last grid key. Calling it again continues: finished cells are skipped, an interrupted one
    resumes. `on_cell(cell, how, sweep)` is called before each cell, how being "skip", "start" or
    "resume" (`sweep.cells` is every cell); `on_done(cell, record)` once it has finished;
    `on_plan(count)` once the grid's values are checked, with the number of cells, before each
    cell's config is (a grid of more than MANY_CELLS takes a while to check, and longer to train).
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
    axes = grid_axes(grid, seeds)
    refuse_conflicts(axes, sets, given)
    base = load_config(config, sets, given)  # the config, set and the arguments, checked as train checks them
    if seeds is not None:
        axes[SEED_KEY] = [f"{SEED_KEY}={base.train.seed + k}" for k in range(seeds)]
    grid_values = {key: [grid_value(text) for text in texts] for key, texts in axes.items()}
    refuse_repeated_values(grid_values)
    cells = cells_of(grid_values)
    if on_plan is not None:
        on_plan(cells.count)
    for cell in cells:  # every combination's whole config (n_embd a multiple of n_head, ...), before any runs
        where = Phrase("{grid} cell {name}", name=cell.name)
        check_trainable(checked_cell(config, [*sets, *cell.overrides], given, where), where)
    folder = Path(out)
    _refuse_reading_inside(folder, base)
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
        try:
            record = _train_cell(
                cell, run, has_checkpoint, config, sets, given, progress, trust_exercise=trust_exercise
            )
        except WriteFailed:  # said with the command that continues the sweep
            raise
        except MinigptError as exc:  # what only training could find (a text the cell's data names): which cell
            raise in_cell(exc, cell) from None
        if isinstance(record, Stopped):
            found.stopped = record
            return found
        found.records[cell.name] = record
        _write_records(folder, found.records)
        if on_done is not None:
            on_done(cell, record)
    return found


def in_cell(exc: MinigptError, cell: Cell) -> MinigptError:
    """A refusal met while a cell trained (what only training finds, such as a text its data names),
    said with the cell it came from; its exit status kept."""
    said = MinigptError("{grid} cell {sweep_cell}: " + exc.template, sweep_cell=cell.name, **exc.values)
    said.exit_code = exc.exit_code
    return said


def _refuse_reading_inside(folder: Path, base: Config) -> None:
    """The sweep's folder (where sweep.toml, base.toml and every cell's run are written) apart from
    what its cells read: the training text, the run they fine-tune, the learner's file; checked
    before the folder's first file is written."""
    for what, source in read_sources(base):
        relation = source_relation(folder, source) if what != "the config file" else None
        if relation is not None:
            raise MinigptError(
                "the sweep's folder {folder} {relation} {what} {source}, which its cells read; choose an {out} apart "
                "from it",
                folder=folder,
                relation=relation,
                what=what,
                source=source,
            )


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
    return Sweep(folder, grid, cells_of(grid), _read_records(folder))


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
    lines += [f"{json.dumps(key)} = {toml_value(values)}" for key, values in grid.items()]
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
            f"grid {key} = {toml_value(stored[key])} there, {toml_value(values)} here"
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
    *,
    trust_exercise: bool = False,
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
            trust_exercise=trust_exercise,
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
