"""Making a run folder: checked before any expensive work, created (or replaced) whole, its files
written, the temporary files a killed writer left removed. A failure while creating removes what
was made, so no half-written run is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..config import Config
from ..errors import MinigptError
from ..io import atomic_folder, atomic_write_text
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer
from .checkpoints import model_payload, save_checkpoint
from .layout import CHECKPOINT_FILE, CONFIG_FILE, EXERCISE_COPIES, ORIGIN_FILE, TOKENIZER_FILE
from .lock import RunLock

# ---------------------------------------------------------------- creating a run folder


def check_writable(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to overwrite or to resume nothing, and prove the folder can be written, before any
    expensive work and before anything is written."""
    try:
        _check_run_dir(run_dir, resume, force)
    except OSError as exc:  # e.g. a name too long for the file system, a folder under /proc
        raise MinigptError(
            "run folder {run_dir} cannot be used ({reason}); choose another {out}",
            run_dir=run_dir,
            reason=exc.strerror or exc,
        ) from None


# What `create` writes before the first checkpoint: a folder holding only these (and temporary
# files) is a run whose creation was cut short, not a run to protect.
UNFINISHED_RUN = {CONFIG_FILE, TOKENIZER_FILE, ORIGIN_FILE}


def _check_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    has_run = run_dir.is_dir() and any(
        p.name not in UNFINISHED_RUN for p in set(run_dir.iterdir()) - set(_temporaries(run_dir))
    )
    if resume and not (run_dir / CHECKPOINT_FILE).is_file():
        raise MinigptError("{resume:on}: no checkpoint in {run_dir}; train without {resume:on} first", run_dir=run_dir)
    if has_run and not resume and not force:
        raise MinigptError(
            "run folder {run_dir} already holds a run; pass {resume:on} to continue it, {force:on} to "
            "replace it, or another {out}",
            run_dir=run_dir,
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError("run folder {run_dir} is a file; choose another {out}", run_dir=run_dir)
    probe = run_dir if run_dir.exists() else next(p for p in run_dir.parents if p.exists())
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


def create(run_dir: Path, force: bool, cfg: Config, tokenizer: TextTokenizer, first_checkpoint: dict[str, Any]) -> None:
    """Make (or, with `force`, replace) the run folder, write what never changes during the run,
    then the step-0 checkpoint. A failure here (a full disk) removes what it made, so no
    half-written run is left behind."""
    created = not run_dir.exists()
    try:
        if not created and not (run_dir / CHECKPOINT_FILE).exists():
            remove_stale_temporaries(run_dir)  # a creation cut short before its first checkpoint
        if force and not created:
            shutil.rmtree(run_dir)
            created = True
        run_dir.mkdir(parents=True, exist_ok=True)
        write_run_files(run_dir, cfg, tokenizer, first_checkpoint)
    except OSError as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise MinigptError(
            "run folder {run_dir} cannot be written ({reason}); make room there or choose another {out}",
            run_dir=run_dir,
            reason=exc.strerror or exc,
        ) from None


def _temporaries(run_dir: Path) -> list[Path]:
    """The run folder's temporary files (`.NAME.*.tmp`, see io.py)."""
    return sorted(Path(run_dir).glob(".*.tmp"))


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files a killed writer left in the run folder (`.NAME.*.tmp`, see io.py): never
    renamed into place, so never read; removed by the next writer, which holds the run's lock."""
    stale = _temporaries(run_dir)
    for path in stale:
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


def check_new_run(run_dir: Path, force: bool) -> None:
    """Refuse an `--out` that is a file, or a folder holding anything unless `force`: what an import
    checks before reading anything, and `create_model_run` again before writing."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError("{out} {run_dir} is a file; choose another {out}", run_dir=run_dir)
    if run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        raise MinigptError(
            "{out} {run_dir} already exists and is not empty; pass {force:on} to replace it, or choose another {out}",
            run_dir=run_dir,
        )


def create_model_run(
    run_dir: Path, force: bool, cfg: Config, tokenizer: TextTokenizer, payload: dict[str, Any]
) -> None:
    """A whole new run folder holding `payload` (an imported model), or nothing at all: it is
    written under a temporary name beside `run_dir` and renamed into place once complete, and
    with `force` the folder it replaces is removed only then. A folder that holds anything is
    refused without `force`; a train writing it (its lock is held) is refused even with it."""
    run_dir = Path(run_dir)
    check_new_run(run_dir, force)
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
            reason = exc.strerror or exc
            raise MinigptError(
                "run folder {run_dir} cannot be written ({reason}); make room there or choose another {out}",
                run_dir=run_dir,
                reason=reason,
            ) from None
        raise
