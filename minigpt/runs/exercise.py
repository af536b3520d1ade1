"""A learner's file in a run: what training checks and records, and what every reading verifies.

Training with `[model] exercise = NAME` reads `[train] exercise_file`, refuses a file that does not
pass every check (run in a child process, exercises/isolated.py, so that code that exits or hangs is
said as the file's fault), builds the model with the learner's module (minigpt/exercises/plug.py),
and runs it once on a batch of the run's own shape before anything is written. Every checkpoint the
run writes records the file (`exercise`: name, path, sha256 and the source itself, so the run
describes itself), and the run folder keeps a copy, `exercises/NAME.py`.

A reading builds the model with the module imported from the recorded file, and importing it runs
its code. A hash proves a file is the one recorded, not that the reader chose to run it: a run folder
someone hands over can carry a module of its own with a checkpoint that records it. So a reading
imports a learner's file without asking only when it is the learner's own, as training left it: at
the absolute path recorded, outside the run folder being read, with the recorded sha256. Anything
else is refused by name until the reader trusts it (`trust_exercise`, as transformers asks for
`trust_remote_code`), and then the recorded file or the run folder's copy runs, whichever is the
one trained with. A file that is missing or has changed since is refused by name, as a resume
refuses a changed corpus: the weights belong to the code they were trained with. Whenever a file is
imported for a run, its note (`learner_note`) says which, for the command to say.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..config import Config, ModelConfig
from ..device import autocast
from ..errors import MinigptError, Phrase
from ..exercises.isolated import check_isolated
from ..exercises.learner import describe, learner_path, raised_line, read_learner, shown_here
from ..exercises.plug import parts_of
from ..io import file_sha256
from ..model.gpt import MiniGPT, Parts
from .layout import EXERCISE_COPIES
from .outputs import run_folder_around


def copy_in_run(run_dir: Path, name: str) -> Path:
    """Where a run folder keeps the learner's file it was trained with."""
    return Path(run_dir) / EXERCISE_COPIES / f"{name}.py"


def learner_note(parts: Parts) -> str:
    """The line that says which learner's file a model runs (a command says it on stderr)."""
    source = parts.source
    return (
        f"note: the model runs the learner's file {shown_here(Path(source['file']))} (exercise {source['name']}, "
        f"sha256 {source['sha256'][:12]}...)"
    )


# ---------------------------------------------------------------- training


def training_parts(cfg: Config, payload: dict[str, Any] | None = None, trust: bool = False) -> Parts | None:
    """The learner's module a run of `cfg` trains with (None without an exercise), refused unless its
    file passes every check and, on a resume (`payload`), is the file the run was trained with. A file
    inside a run folder (a run's own copy, or one a folder handed over carries, which its config.toml
    names) runs only with `trust`, as a reading's does."""
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
        if cfg.train.init_from and not cfg.train.exercise_file:
            raise MinigptError(
                "the run {source} this fine-tunes was trained with exercise {name}, and its model holds the learner's "
                "module, so the fine-tune trains with the learner's file {path}, which is not there; run it from "
                "the folder that holds exercises/{name}.py, or name the file with {exercise_file}",
                source=shown_here(Path(cfg.train.init_from)),
                name=name,
                path=shown_here(path),
            )
        raise MinigptError(
            "{exercise} {name} trains with the learner's file {path}, and there is none; write it first (the "
            "exercise command's start writes a starter there), or name yours with {exercise_file}",
            name=name,
            path=shown_here(path),
        )
    inside = run_folder_around(path)
    if inside is not None and not trust:
        raise MinigptError(
            "the learner's file {path} lies inside the run folder {run}: a run folder handed to you can carry code of "
            "its own (its config.toml may name it), and training with the file would run it; train with your own "
            "file ({exercise_file} FILE), or read this one and, to run it, pass {trust_exercise:on}",
            path=shown_here(path),
            run=shown_here(inside),
        )
    recorded = (payload or {}).get("exercise")
    if recorded is not None and file_sha256(path) != recorded["sha256"]:
        raise MinigptError(
            "{resume:on} refused: {path} has changed since this run was trained with it (sha256 {now}... != "
            "{then}...); restore it (the run folder keeps the file it was trained with: {copy}), or train a new "
            "run with {force:on}",
            path=shown_here(path),
            now=file_sha256(path)[:12],
            then=recorded["sha256"][:12],
            copy=shown_here(copy_in_run(cfg.run_dir, name)),
        )
    report = check_isolated(name, shown_here(path))  # whatever its code does, in another process
    if not report.passed:
        raise MinigptError(
            "{exercise} {name}: {path} does not pass its checks ({summary}; the first: {first}); a model is "
            "trained only with a module that passes every check",
            name=name,
            path=shown_here(path),
            summary=report.summary,
            first=report.failures[0].line,
        )
    learner = read_learner(name, path)
    if learner.sha256 != report.sha256:
        raise MinigptError(
            "{path} changed while its checks ran (sha256 {then}... checked, {now}... now); train again once it is "
            "saved",
            path=shown_here(path),
            then=report.sha256[:12],
            now=learner.sha256[:12],
        )
    return parts_of(learner)


def try_training_batch(
    model: MiniGPT, windows: list[tuple[torch.Tensor, torch.Tensor]], rows: int, precision: str
) -> None:
    """A model holding a learner's module, run forward and backward once on `rows` rows as long as
    the widest of `windows` (the validation batches), before anything is written: the checks use small
    inputs, and a module wrong only at the run's shapes (a batch of 4) would otherwise fail at the
    first step and leave a run folder behind. Leaves no trace: the RNG is restored and the gradients
    are dropped."""
    if model.parts is None:
        return
    x, y = max(windows, key=lambda batch: batch[0].shape[1])
    take = torch.arange(rows, device=x.device) % x.shape[0]
    x, y = x[take], y[take]
    path = Path(model.parts.source["file"])
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        try:
            with autocast(str(x.device), precision):
                loss = model(x, y)[1]
            loss.backward()
            if not torch.isfinite(loss):  # before any step: not the learning rate's doing
                raise MinigptError(
                    "{path} passes its checks, but a model with it gives a loss of {loss} on a training batch of this "
                    "run, {shape}, before any step (so no learning rate made it): look in it for what makes a NaN or "
                    "inf (a division by zero, the square root or log of a negative number, an exp that overflows)",
                    path=shown_here(path),
                    loss=loss.item(),
                    shape=list(x.shape),
                )
        except MinigptError:  # a refusal, the learner's attempt to exit among them (plug.py says it)
            raise
        except Exception as exc:  # the learner's module at this shape, or what it hands on
            line = raised_line(exc, path)
            raise MinigptError(
                "{path} passes its checks, but a model with it fails on a training batch of this run, {shape}: "
                "{what}{where}; the checks use small inputs: make it work for any batch size and length, then "
                "train again",
                path=shown_here(path),
                shape=list(x.shape),
                what=describe(exc),
                where="" if line is None else f", at line {line} of it",
            ) from None
        finally:
            model.zero_grad(set_to_none=True)


def divergence_hint(model: MiniGPT) -> str:
    """For a run whose loss or gradient is not finite: where to look first when the model holds a
    learner's module (its code, before the learning rate); nothing otherwise."""
    if model.parts is None:
        return ""
    source = model.parts.source
    return (
        f"The model runs the learner's file {shown_here(Path(source['file']))} (exercise {source['name']}): look "
        "there first, for what makes its forward give a NaN or inf (a division by zero, the square root or log of a "
        "negative number, an exp that overflows). If it is not that: "
    )


# ---------------------------------------------------------------- reading


def recorded_parts(payload: dict[str, Any], model: ModelConfig, run_dir: Path, trust: bool = False) -> Parts | None:
    """The learner's module a checkpoint's model of the run folder `run_dir` was trained with, from
    the file it records, as it was then (None without an exercise); `trust` accepts a file that is not
    the learner's own (the module's docstring)."""
    name = model.exercise
    if name == "none":
        return None
    record = payload.get("exercise")
    if not isinstance(record, dict) or record.get("name") != name:
        raise MinigptError(
            "a checkpoint of {run_dir} says [model] exercise = {name} but records no learner's file; it cannot be "
            "rebuilt: train it again",
            run_dir=shown_here(run_dir),
            name=name,
        )
    found = _trusted(record, run_dir) if trust else _learners_own(record, run_dir)
    return parts_of(read_learner(name, found))


def _learners_own(record: dict[str, Any], run_dir: Path) -> Path:
    """The recorded file, when it is the learner's own as training left it; else refused by name."""
    recorded, run_dir = Path(record["file"]), Path(run_dir).resolve()
    copy = copy_in_run(run_dir, record["name"])
    would_run = _trusted_file(record, run_dir)  # what the flag would run: the file a refusal names
    if not recorded.is_absolute():
        raise MinigptError(
            "the run {run_dir} records its learner's file as {path}, a relative path, found from wherever the run "
            "is read: reading the run would run that code, and a run runs without asking only the learner's own "
            "file, at the absolute path it was trained with; {trusting}",
            run_dir=shown_here(run_dir),
            path=recorded,
            trusting=_trusting(would_run),
        )
    # Trained, a learner's file is recorded as its real path (resolved): a link, `..` or /proc/self
    # on the way may lead anywhere, the run folder a reader is given included.
    if os.path.realpath(recorded) != str(recorded):
        raise MinigptError(
            "the run {run_dir} records its learner's file as {path}, which leads to {real}: training records the "
            "file's own path, and a path through a link may lead into a folder handed to you; {trusting}",
            run_dir=shown_here(run_dir),
            path=recorded,
            real=os.path.realpath(recorded),
            trusting=_trusting(would_run),
        )
    inside = recorded.is_relative_to(run_dir) or run_folder_around(recorded) is not None
    if inside:
        raise MinigptError(
            "the run {run_dir} records its learner's file as {path}, inside a run folder: a folder handed to you "
            "can carry code of its own, and reading the run would run it; a run runs without asking only the "
            "learner's own file, outside run folders; {trusting}",
            run_dir=shown_here(run_dir),
            path=shown_here(recorded),
            trusting=_trusting(would_run),
        )
    if not recorded.is_file():
        raise MinigptError(
            "the run {run_dir} was trained with the learner's file {path}, which is not there any more; put it "
            "back (the run folder keeps a copy: {copy})",
            run_dir=shown_here(run_dir),
            path=shown_here(recorded),
            copy=shown_here(copy),
        )
    sha = file_sha256(recorded)
    if sha != record["sha256"]:
        raise MinigptError(
            "the run {run_dir} was trained with {path} as it was then (sha256 {then}...), and the file has changed "
            "since (sha256 {now}...): its weights belong to that code; restore it (the run folder keeps the file "
            "it was trained with: {copy}), or train a new run with the file as it is now",
            run_dir=shown_here(run_dir),
            path=shown_here(recorded),
            then=record["sha256"][:12],
            now=sha[:12],
            copy=shown_here(copy),
        )
    return recorded


def _trusting(would_run: Path | None) -> Phrase:
    """The end of a refusal of an untrusted file: which file the flag would run, or that none would."""
    if would_run is None:
        return Phrase(
            "neither it nor the run folder's copy is the file it was trained with, so {trust_exercise:on} would run "
            "nothing either; train the run again"
        )
    return Phrase(
        "the file that would run is {would_run}: read it, and to run it, pass {trust_exercise:on}",
        would_run=shown_here(would_run),
    )


def _trusted_file(record: dict[str, Any], run_dir: Path) -> Path | None:
    """The file `trust_exercise` runs: the recorded file (a relative one found from here), else the run
    folder's copy, whichever is the file the run was trained with (its sha256); None if neither is."""
    recorded, copy = Path(record["file"]), copy_in_run(run_dir, record["name"])
    for candidate in (recorded, copy):
        if candidate.is_file() and file_sha256(candidate) == record["sha256"]:
            return candidate
    return None


def _trusted(record: dict[str, Any], run_dir: Path) -> Path:
    """Trusted: the recorded file, else the run folder's copy (`_trusted_file`)."""
    found = _trusted_file(record, run_dir)
    if found is not None:
        return found
    recorded, copy = Path(record["file"]), copy_in_run(run_dir, record["name"])
    raise MinigptError(
        "{trust_exercise:on}: neither the learner's file the run {run_dir} records ({path}) nor the run folder's "
        "copy ({copy}) is the file it was trained with (sha256 {then}...), and its weights belong to that code; "
        "restore one of them, or train a new run",
        run_dir=shown_here(run_dir),
        path=shown_here(recorded),
        copy=shown_here(copy),
        then=record["sha256"][:12],
    )
