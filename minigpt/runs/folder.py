"""Making a run folder: checked before any expensive work, created (or a run in it replaced) whole,
its files written, the temporary files a killed writer left removed. A failure while creating
removes what was made, so no half-written run is left behind, and a run being replaced stays as it
was until the new one is complete.

A run folder holds what its run writes (layout.py) and nothing else, so `--force` replaces a run
and nothing more: an output folder holding anything else, or holding, being or lying inside what
the command reads (the model imported, the run fine-tuned, the training text), is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import MinigptError
from ..io import atomic_folder, atomic_write_text
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer
from .checkpoints import model_payload, save_checkpoint
from .layout import (
    BEST_FILE,
    CHECKPOINT_FILE,
    CONFIG_FILE,
    EXERCISE_COPIES,
    METRICS_FILE,
    ORIGIN_FILE,
    TENSORBOARD_FOLDER,
    TOKENIZER_FILE,
)
from .lock import RunLock

# ---------------------------------------------------------------- what a run folder holds

# What a run writes (layout.py): these files at its top, and in these folders of its own the files
# whose names match. Anything else is not a run's, and no command removes it.
RUN_FILES = {CONFIG_FILE, TOKENIZER_FILE, CHECKPOINT_FILE, BEST_FILE, METRICS_FILE, ORIGIN_FILE}
RUN_FOLDERS = {EXERCISE_COPIES: "*.py", TENSORBOARD_FOLDER: "events.out.tfevents.*"}
TEMPORARY = ".*.tmp"  # a file being written atomically (io.py), or one a killed writer left

# What `create` writes before the first checkpoint, removed again when writing in place fails.
UNFINISHED_RUN = {CONFIG_FILE, TOKENIZER_FILE, ORIGIN_FILE}


def foreign_entry(run_dir: Path) -> str | None:
    """The first thing in `run_dir` that no run writes (its name; `exercises/notes.txt` inside one
    of a run's folders), or None: a folder whose every entry is a run's. A folder without a
    checkpoint holds no run, so there every entry but a temporary file is foreign: a config.toml,
    a tokenizer.json or an exercises/ffn.py there is the user's own, whatever its name."""
    run = holds_run(run_dir)
    for entry in sorted(Path(run_dir).iterdir()):
        name = entry.name
        if fnmatch(name, TEMPORARY) and not entry.is_symlink():  # a file being written, or a creation's folder
            continue
        if not run:
            return name
        if name in RUN_FILES and entry.is_file():
            continue
        if name not in RUN_FOLDERS or not entry.is_dir() or entry.is_symlink():
            return name
        for inner in sorted(entry.iterdir()):
            if not (inner.is_file() and (fnmatch(inner.name, RUN_FOLDERS[name]) or fnmatch(inner.name, TEMPORARY))):
                return f"{name}/{inner.name}"
    return None


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run: its checkpoint, which every run has from its step 0 on (a run
    is written whole, or in an empty folder, before anyone reads it: `create`)."""
    return (Path(run_dir) / CHECKPOINT_FILE).is_file()


def source_relation(out: Path, source: Path) -> str | None:
    """How the folder `out` stands to a path a command reads: "is" it, "holds" it, "lies inside"
    it, or None (apart)."""
    out, source = Path(out).resolve(), Path(source).resolve()
    if out == source:
        return "is"
    if source.is_relative_to(out):
        return "holds"
    return "lies inside" if out.is_relative_to(source) else None


# ---------------------------------------------------------------- creating a run folder


def check_out(run_dir: Path, force: bool, sources: Sequence[tuple[str, Path]] = (), resume: bool | None = None) -> None:
    """Refuse an output folder that a new run (or `force`) must not write over, before anything is
    read or written: a file; the same path as, or a folder holding or inside, a source the command
    reads (`sources`: (what it is, its path) pairs); a folder holding anything no run writes (named:
    `force` replaces a run, and nothing else); a run, unless `force`. `resume`: None where the
    command cannot resume; True keeps the run that is there, so only a file is refused."""
    run_dir = Path(run_dir)
    for what, source in () if resume else sources:
        relation = source_relation(run_dir, source)
        if relation is not None:
            raise MinigptError(
                "run folder {run_dir} {relation} {what} {source}, which this command reads; choose an {out} "
                "apart from it",
                run_dir=run_dir,
                relation=relation,
                what=what,
                source=source,
            )
    if run_dir.is_symlink():  # replacing it would replace the link, and leave the folder it names as it was
        raise MinigptError(
            "run folder {run_dir} is a symbolic link to {target}; give the folder itself as {out}",
            run_dir=run_dir,
            target=run_dir.resolve(),
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError("run folder {run_dir} is a file; choose another {out}", run_dir=run_dir)
    if resume or not run_dir.is_dir():
        return
    foreign = foreign_entry(run_dir)
    if foreign is not None and not holds_run(run_dir):
        raise MinigptError(
            "run folder {run_dir} holds {foreign} and no checkpoint.pt, so no run (a run holds its checkpoint from "
            "step 0 on): what is there is not a run's to replace, and {force:on} replaces a run and nothing else; "
            "choose another {out} (a new or empty folder), or empty this one yourself",
            run_dir=run_dir,
            foreign=foreign,
        )
    if foreign is not None:
        raise MinigptError(
            "run folder {run_dir} holds {foreign}, which no run writes: it is not a run folder, and {force:on} "
            "replaces a run and nothing else; choose another {out} (a new or empty folder)",
            run_dir=run_dir,
            foreign=foreign,
        )
    if holds_run(run_dir) and not force:
        continues = "" if resume is None else "{resume:on} to continue it, "
        raise MinigptError(
            "run folder {run_dir} already holds a run; pass "
            + continues
            + "{force:on} to replace it, or another {out}",
            run_dir=run_dir,
        )


def check_writable(run_dir: Path, resume: bool, force: bool, sources: Sequence[tuple[str, Path]] = ()) -> None:
    """What `train` checks of its run folder before any expensive work and before anything is
    written: a resume's checkpoint, `check_out`, and that the folder can be written."""
    try:
        _check_run_dir(run_dir, resume, force, sources)
    except OSError as exc:  # e.g. a name too long for the file system, a folder under /proc
        raise MinigptError(
            "run folder {run_dir} cannot be used ({reason}); choose another {out}",
            run_dir=run_dir,
            reason=exc.strerror or exc,
        ) from None


def _check_run_dir(run_dir: Path, resume: bool, force: bool, sources: Sequence[tuple[str, Path]]) -> None:
    if resume and not (run_dir / CHECKPOINT_FILE).is_file():
        raise MinigptError("{resume:on}: no checkpoint in {run_dir}; train without {resume:on} first", run_dir=run_dir)
    check_out(run_dir, force, sources, resume)
    # A run is replaced by a rename beside it (create), so its parent must be writable as well.
    probes = [run_dir] if run_dir.exists() else []
    if not run_dir.exists() or holds_run(run_dir) and not resume:
        probes.append(next(p for p in run_dir.parents if p.exists()))
    for probe in probes:
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            raise MinigptError(
                "run folder {run_dir} cannot be written ({probe} is not writable); choose another {out}",
                run_dir=run_dir,
                probe=probe,
            )


def restore_missing(run_dir: Path, cfg: Config, tokenizer: TextTokenizer) -> None:
    """On resume: write back the config or tokenizer file if one was deleted (the checkpoint's
    identity check has shown these are the run's), so the run folder stays self-describing."""
    for name, text in ((CONFIG_FILE, cfg.to_toml), (TOKENIZER_FILE, tokenizer.to_str)):
        if not (run_dir / name).exists():
            atomic_write_text(run_dir / name, text())


class RunNotWritten(MinigptError):
    """A run folder that could not be written (a full disk): a failure, not a refusal, so the
    command exits 1 as train does when a checkpoint cannot be written. Nothing of the new run is
    left, and a run it was to replace is as it was."""

    exit_code = 1

    def __init__(self, run_dir: Path, exc: OSError, replacing: bool):
        super().__init__(
            "could not write the run folder {run_dir} ({reason}); nothing of the new run was kept{kept}: make room "
            "(or choose another {out}), then run the command again",
            run_dir=run_dir,
            reason=exc.strerror or exc,
            kept=", and the run it was to replace is intact" if replacing else "",
        )


def create(run_dir: Path, cfg: Config, tokenizer: TextTokenizer, first_checkpoint: dict[str, Any]) -> None:
    """Make the run folder (or replace the run in it: `check_writable` has seen `force`), write
    what never changes during the run, then the step-0 checkpoint.

    A run is replaced whole: the new folder is written under a temporary name beside it and swapped
    in once its step-0 checkpoint is there (io.atomic_folder), so a failure here (a full disk) or
    a kill leaves the old run as it was, never a folder holding neither. Every check that can
    refuse has run before this (session.py), so nothing is written for a run that would be refused.
    An empty folder is written in place (its parent may not be writable), and what this wrote is
    removed again on a failure."""
    replacing = holds_run(run_dir)

    def fill(folder: Path) -> None:
        write_run_files(folder, cfg, tokenizer, first_checkpoint)

    try:
        if run_dir.is_dir() and not replacing:
            remove_stale_temporaries(run_dir)
            _fill_in_place(run_dir, fill)
        else:
            atomic_folder(run_dir, fill)
    except OSError as exc:
        raise RunNotWritten(run_dir, exc, replacing) from None


def _fill_in_place(run_dir: Path, fill: Callable[[Path], None]) -> None:
    """An empty run folder filled: the files written in a temporary folder inside it, then moved into
    place with the checkpoint last. A kill while they are written (the checkpoint's write takes the
    time) leaves that temporary folder alone, which the next writer removes: never a config.toml
    without its checkpoint, which could not be told from a user's own."""
    staging = Path(tempfile.mkdtemp(prefix=".run.", suffix=".tmp", dir=run_dir))
    try:
        fill(staging)
        for entry in sorted(staging.iterdir(), key=lambda p: p.name == CHECKPOINT_FILE):
            os.replace(entry, run_dir / entry.name)
    except BaseException:
        _remove_run_files(run_dir)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_run_files(run_dir: Path) -> None:
    """What a creation wrote into a folder that held no run (and nothing but a run's files)."""
    for name in UNFINISHED_RUN | {CHECKPOINT_FILE}:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / EXERCISE_COPIES, ignore_errors=True)
    remove_stale_temporaries(run_dir)


def _temporaries(run_dir: Path) -> list[Path]:
    """The run folder's temporary files (`.NAME.*.tmp`, see io.py)."""
    return sorted(Path(run_dir).glob(TEMPORARY))


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files a killed writer left in the run folder (`.NAME.*.tmp`, see io.py; a creation's
    temporary folder, `_fill_in_place`): never renamed into place, so never read; removed by the next
    writer, which holds the run's lock."""
    stale = _temporaries(run_dir)
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def write_model_run(run_dir: Path, cfg: Config, model: MiniGPT, tokenizer: TextTokenizer) -> None:
    """A run folder that sample and trace can load, from a model made outside `minigpt train`
    (the chapter-17 teaching weights, test fixtures)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_files(run_dir, cfg, tokenizer, model_payload(cfg, model))


def write_run_files(run_dir: Path, cfg: Config, tokenizer: TextTokenizer, payload: dict[str, Any]) -> None:
    """config.toml, tokenizer.json and checkpoint.pt (all that `load_model` reads), and origin.json
    when the weights came from somewhere (an import, the run a fine-tune started from)."""
    atomic_write_text(run_dir / CONFIG_FILE, cfg.to_toml())
    atomic_write_text(run_dir / TOKENIZER_FILE, tokenizer.to_str())
    if "origin" in payload:
        atomic_write_text(run_dir / ORIGIN_FILE, json.dumps(payload["origin"], indent=2) + "\n")
    save_checkpoint(run_dir / CHECKPOINT_FILE, payload)
    if "exercise" in payload:  # the learner's file the model runs, as trained: the run describes itself
        record = payload["exercise"]
        copy = run_dir / EXERCISE_COPIES / f"{record['name']}.py"
        copy.parent.mkdir(exist_ok=True)
        atomic_write_text(copy, record["source"])


def create_model_run(
    run_dir: Path, force: bool, cfg: Config, tokenizer: TextTokenizer, payload: dict[str, Any]
) -> None:
    """A whole new run folder holding `payload` (an imported model), or nothing at all: it is
    written under a temporary name beside `run_dir` and renamed into place once complete, and
    with `force` the run it replaces is removed only then. `check_out` refuses what is not a run
    to replace; a train writing it (its lock is held) is refused even with `force`."""
    run_dir = Path(run_dir)
    check_out(run_dir, force)
    replacing = holds_run(run_dir)
    made = [p for p in run_dir.parents if not p.exists()][-1:]  # the outermost folder this call makes
    lock = RunLock(run_dir)
    try:
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            atomic_folder(run_dir, lambda folder: write_run_files(folder, cfg, tokenizer, payload))
        finally:
            lock.release()  # before the folders its file lies in are removed
    except BaseException as exc:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, OSError):
            raise RunNotWritten(run_dir, exc, replacing) from None
        raise
