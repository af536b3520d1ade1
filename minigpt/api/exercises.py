"""Exercises (`minigpt exercise`) from Python: the catalogue, a starter written into the learner's
folder, a learner's file checked (in a child process, with a time limit on each step), and which
exercises are started.

    minigpt.api.exercises.start("rmsnorm")                 # exercises/rmsnorm.py, from the starter
    report = minigpt.api.exercises.check("rmsnorm")         # report.passed, report.results
    minigpt.train(exercise="rmsnorm", steps=50)             # a model with the learner's RMSNorm
"""

from __future__ import annotations

from pathlib import Path

from ..exercises.catalogue import EXERCISES, Exercise
from ..exercises.checks import Report, Result
from ..exercises.folder import Status, start, starter_text, status
from ..exercises.isolated import LIMIT_VARIABLE, TIME_LIMIT, check_isolated
from ..exercises.learner import LearnerFault, learner_path


def check(name: str, folder: str | Path | None = None, seconds: float | None = None) -> Report:
    """Every check of the learner's FOLDER/NAME.py (default: exercises/NAME.py here), run in a child
    process; refused in one line when the file cannot be checked (missing, not importable, lacking a
    name), and a LearnerFault (exit status 1 on the command line) when its code tries to end the
    program, ends that process, or takes more than `seconds` (default: 30, or MINIGPT_CHECK_SECONDS)
    for one step of the check."""
    return check_isolated(name, learner_path(name, folder), seconds)


__all__ = [
    "EXERCISES",
    "LIMIT_VARIABLE",
    "TIME_LIMIT",
    "Exercise",
    "LearnerFault",
    "Report",
    "Result",
    "Status",
    "check",
    "learner_path",
    "start",
    "starter_text",
    "status",
]
