"""The learner's folder of exercises (exercises/ by default): a starter written there, and where
each exercise stands (not started, failing, passing, or a file that does not import)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import MinigptError
from .catalogue import EXERCISES
from .checks import Report, check_file
from .learner import learner_path, read_learner


def starter_text(name: str) -> str:
    """The starter file of exercise `name` (package data: minigpt/exercises/starters/NAME.py)."""
    return (resources.files(__package__) / "starters" / f"{name}.py").read_text(encoding="utf-8")


def start(name: str, folder: str | Path | None = None, force: bool = False) -> Path:
    """Write the starter of `name` into the folder (made if needed); a file already there is the
    learner's work, refused unless `force`."""
    path = learner_path(name, folder)
    if path.exists() and not force:
        raise MinigptError(
            "{path} already exists (your work on {name}); check it as it is, or start again from the starter with "
            "{force:on}, which replaces it",
            path=path,
            name=name,
        )
    if path.parent.exists() and not path.parent.is_dir():
        raise MinigptError(
            "{folder} is a file, not a folder; choose another folder for the exercises", folder=path.parent
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(starter_text(name), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Status:
    """Where one exercise stands in the folder: `word` is not started, failing, passing or broken."""

    word: str
    path: Path
    report: Report | None = None
    reason: str = ""  # broken: why the file cannot be checked

    def __str__(self) -> str:
        if self.report is None:
            return self.word if not self.reason else f"{self.word} ({self.reason})"
        failing = sum(not r.passed for r in self.report.results) + self.report.not_run
        if self.report.passed:
            return f"passing: all {self.report.total} checks"
        return f"failing: {failing} of {self.report.total} checks"


def status(name: str, folder: str | Path | None = None) -> Status:
    path = learner_path(name, folder)
    if not path.exists():
        return Status("not started", path)
    try:
        return Status("checked", path, check_file(read_learner(name, path)))
    except MinigptError as refused:
        return Status("broken", path, reason=_reason(refused, path))


def _reason(refused: MinigptError, path: Path) -> str:
    """Why a file cannot be checked, without its path (the listing names it)."""
    text = refused.render()
    for shown in (str(path.resolve()), str(path)):
        text = text.replace(f"{shown} ", "", 1)
    return text.split(";")[0]


__all__ = ["EXERCISES", "Status", "start", "starter_text", "status"]
