"""Checking a learner's file: every check of its exercise, one line each, the mistake in words.

    report = check_file(read_learner("rmsnorm", "exercises/rmsnorm.py"))
    report.passed, [result.line for result in report.results]

A check's line says what it verified when it passes, and the mistake (with the input that exposes
it) when it fails. Once the learner's code raises in a check, the rest of that name's checks are
not run (each would raise the same), and the line says so; so are the checks that wait on a wrong
output no known mistake explains (common.Fitting). Every check that runs has its line: the count of
failing checks is the count of FAIL lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..learner import LearnerFile
from . import alibi, attention, block, depth, ffn, gqa, norms, rope
from .common import Group, Probe, Stop, Undecided

SUITES: dict[str, Callable[[Probe], list[Group]]] = {
    "rmsnorm": norms.rmsnorm,
    "layernorm": norms.layernorm,
    "ffn": ffn.ffn,
    "attention": attention.attention,
    "block": block.block,
    "swiglu": ffn.swiglu,
    "rope": rope.rope,
    "alibi": alibi.alibi,
    "gqa": gqa.gqa,
    "attention_residual": depth.attention_residual,
}


@dataclass(frozen=True)
class Result:
    passed: bool
    line: str


@dataclass(frozen=True)
class Report:
    exercise: str
    path: Path
    sha256: str
    results: list[Result]
    not_run: int  # checks skipped after the learner's code raised, or waiting on an unexplained output

    @property
    def passed(self) -> bool:
        return self.not_run == 0 and all(result.passed for result in self.results)

    @property
    def failures(self) -> list[Result]:
        return [result for result in self.results if not result.passed]

    @property
    def total(self) -> int:
        return len(self.results) + self.not_run

    @property
    def summary(self) -> str:
        """`3 of 16 checks fail`, `1 of 13 checks fails, and 10 were not run`: what the lines show."""
        failing = len(self.failures)
        verb = "fails" if failing == 1 else "fail"
        skipped = f", and {self.not_run} {'was' if self.not_run == 1 else 'were'} not run" if self.not_run else ""
        return f"{failing} of {self.total} checks {verb}{skipped}"


def check_file(learner: LearnerFile, before_each: Callable[[str], None] | None = None) -> Report:
    """Every check of the learner's file, in order, in this process: what its code does, this process
    does (exercises/isolated.py checks a file in a child process, as the commands do).
    `before_each(says)` is told of each check before it runs."""
    results: list[Result] = []
    probe = Probe(learner)
    threads = torch.get_num_threads()
    # One thread: the checks' tensors are tiny, and waking a second thread per operation costs more
    # than the operation (far more on a busy machine).
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):  # a learner's random init must not move the caller's stream
            torch.manual_seed(0)
            not_run = _run(SUITES[learner.exercise](probe), results, before_each or (lambda says: None))
    finally:
        torch.set_num_threads(threads)
    return Report(learner.exercise, learner.path, learner.sha256, results, not_run)


def _run(groups: list[Group], results: list[Result], before_each: Callable[[str], None]) -> int:
    """Each group's checks in order, their results appended; returns how many were not run."""
    not_run = 0
    for group in groups:
        for index, check in enumerate(group.checks):
            before_each(check.says)
            try:
                mistake = check.run()
            except Undecided:
                not_run += 1
                continue
            except Stop as stop:
                rest = len(group.checks) - index - 1
                more = (
                    f"; the other {rest} checks of {group.subject} were not run"
                    if rest > 1
                    else f"; the other check of {group.subject} was not run"
                    if rest
                    else ""
                )
                results.append(Result(False, f"{stop}{more}"))
                not_run += rest
                break
            results.append(Result(mistake is None, check.says if mistake is None else mistake))
    return not_run
