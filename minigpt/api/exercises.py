"""Exercises (`minigpt exercise`) from Python: the catalogue, a starter written into the learner's
folder, a learner's file checked, and where each exercise stands.

    minigpt.api.exercises.start("rmsnorm")                 # exercises/rmsnorm.py, from the starter
    report = minigpt.api.exercises.check("rmsnorm")         # report.passed, report.results
    minigpt.train(exercise="rmsnorm", steps=50)             # a model with the learner's RMSNorm
"""

from __future__ import annotations

from pathlib import Path

from ..exercises.catalogue import EXERCISES, Exercise
from ..exercises.checks import Report, Result, check_file
from ..exercises.folder import Status, start, starter_text, status
from ..exercises.learner import learner_path, read_learner


def check(name: str, folder: str | Path | None = None) -> Report:
    """Every check of the learner's FOLDER/NAME.py (default: exercises/NAME.py here); refused in one
    line when the file cannot be checked (missing, not importable, lacking a name)."""
    return check_file(read_learner(name, learner_path(name, folder)))


__all__ = [
    "EXERCISES",
    "Exercise",
    "Report",
    "Result",
    "Status",
    "check",
    "learner_path",
    "start",
    "starter_text",
    "status",
]
