"""A learner's file in a run: what training checks and records, and what every reading verifies.

Training with `[model] exercise = NAME` reads `[train] exercise_file`, refuses a file that does not
pass every check, and builds the model with the learner's module (minigpt/exercises/plug.py). Every checkpoint the
run writes records the file (`exercise`: name, path, sha256 and the source itself, so the run
describes itself), and the run folder keeps a copy, `exercises/NAME.py`. Every command that reads
the run builds the model with the module imported from the recorded file, and refuses the file by
name when it is missing or has changed since (its sha256), as a resume refuses a changed corpus:
the weights belong to the code they were trained with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config, ModelConfig
from ..errors import MinigptError
from ..exercises.checks import check_file
from ..exercises.learner import learner_path, read_learner
from ..exercises.plug import parts_of
from ..io import file_sha256
from ..model.gpt import Parts
from .layout import EXERCISE_COPIES


def _shown(path: Path) -> Path:
    """A path as the user would type it here: relative when it lies under the current folder."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def copy_in_run(run_dir: Path, name: str) -> Path:
    """Where a run folder keeps the learner's file it was trained with."""
    return Path(run_dir) / EXERCISE_COPIES / f"{name}.py"


def training_parts(cfg: Config, payload: dict[str, Any] | None = None) -> Parts | None:
    """The learner's module a run of `cfg` trains with (None without an exercise), refused unless its
    file passes every check and, on a resume (`payload`), is the file the run was trained with."""
    name = cfg.model.exercise
    if name == "none":
        return None
    if cfg.train.lora_rank:
        raise MinigptError(
            "[model] exercise = {name} with [train] lora_rank = {rank} is refused: LoRA adapts minigpt's own matrices, "
            "and this model holds a learner's module; fine-tune it whole (lora_rank = 0)",
            name=name,
            rank=cfg.train.lora_rank,
        )
    # Empty where the [model] came from another run (a fine-tune keeps its source's): exercises/NAME.py here.
    path = Path(cfg.train.exercise_file or learner_path(name)).resolve()
    if not path.is_file():
        raise MinigptError(
            "{exercise} {name} trains with the learner's file {path}, and there is none; write it first (the "
            "exercise command's start writes a starter there), or name yours with {exercise_file}",
            name=name,
            path=_shown(path),
        )
    recorded = (payload or {}).get("exercise")
    if recorded is not None and file_sha256(path) != recorded["sha256"]:
        raise MinigptError(
            "{resume:on} refused: {path} has changed since this run was trained with it (sha256 {now}... != "
            "{then}...); restore it (the run folder keeps the file it was trained with: {copy}), or train a new "
            "run with {force:on}",
            path=_shown(path),
            now=file_sha256(path)[:12],
            then=recorded["sha256"][:12],
            copy=_shown(copy_in_run(cfg.run_dir, name)),
        )
    learner = read_learner(name, path)
    report = check_file(learner)
    if not report.passed:
        failing = report.failures
        raise MinigptError(
            "{exercise} {name}: {path} does not pass its checks ({count} of {total} fail; the first: {first}); a "
            "model is trained only with a module that passes every check",
            name=name,
            path=_shown(learner.path),
            count=len(failing) + report.not_run,
            total=report.total,
            first=failing[0].line,
        )
    return parts_of(learner)


def recorded_parts(payload: dict[str, Any], model: ModelConfig, checkpoint: Path) -> Parts | None:
    """The learner's module a checkpoint's model was trained with, from the file it records, as it
    was then (None without an exercise)."""
    name = model.exercise
    if name == "none":
        return None
    record = payload.get("exercise")
    if not isinstance(record, dict) or record.get("name") != name:
        raise MinigptError(
            "checkpoint {checkpoint} says [model] exercise = {name} but records no learner's file; it cannot be "
            "rebuilt: train it again",
            checkpoint=_shown(checkpoint),
            name=name,
        )
    path, copy = Path(record["file"]), copy_in_run(Path(checkpoint).parent, name)
    if not path.is_file():
        raise MinigptError(
            "the run {run_dir} was trained with the learner's file {path}, which is not there any more; put it "
            "back (the run folder keeps a copy: {copy})",
            run_dir=_shown(Path(checkpoint).parent),
            path=_shown(path),
            copy=_shown(copy),
        )
    sha = file_sha256(path)
    if sha != record["sha256"]:
        raise MinigptError(
            "the run {run_dir} was trained with {path} as it was then (sha256 {then}...), and the file has changed "
            "since (sha256 {now}...): its weights belong to that code; restore it (the run folder keeps the file "
            "it was trained with: {copy}), or train a new run with the file as it is now",
            run_dir=_shown(Path(checkpoint).parent),
            path=_shown(path),
            then=record["sha256"][:12],
            now=sha[:12],
            copy=_shown(copy),
        )
    return parts_of(read_learner(name, path))
