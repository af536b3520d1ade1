"""The learner's folder of exercises (exercises/ by default): a starter written there, and which
exercises are started (a file there); nothing here imports a learner's file."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import MinigptError
from .catalogue import EXERCISES
from .learner import learner_path


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
    """Whether the learner's file of one exercise is in the folder: `word` is "not started" or
    "started". Only `check` runs a file: listing a folder imports none of them, since a folder's
    files are code, and the folder a command runs in may be anyone's."""

    word: str
    path: Path

    def __str__(self) -> str:
        return self.word


def status(name: str, folder: str | Path | None = None) -> Status:
    path = learner_path(name, folder)
    return Status("started" if path.exists() else "not started", path)


__all__ = ["EXERCISES", "Status", "start", "starter_text", "status"]
