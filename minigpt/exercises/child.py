"""The process a learner's file is checked in (`python -m minigpt.exercises.child`), started by
isolated.py: whatever the learner's code does, it can end or hang only this process, and the one
that started it says so as the file's fault.

It reads its request as one JSON object on stdin ({"exercise", "path", "seconds", "timeout_file"}),
imports the file and runs every check, and answers in JSON lines on the stdout it was given: a
{"checking": WHAT} before the import and before each check, then one of {"report": ...},
{"refused": ...} (the file cannot be checked) or {"ended": ...} (its code tried to end the program).
Whatever the learner's code prints goes to stderr, so that nothing it writes is read as an answer.

Two stand-ins make the learner's way out nameable by its line: os._exit raises ProcessExit here
(the parent would otherwise see the process end, with no line to name), and each step has
faulthandler's timer armed, which, after `seconds`, writes every frame to `timeout_file` and ends
the process: the parent reads the learner's line there.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from ..errors import MinigptError
from .checks import Report, check_file
from .learner import LearnerFault, describe, exits_raise, raised_line, read_learner


def _report_message(report: Report) -> dict[str, Any]:
    return {
        "exercise": report.exercise,
        "path": str(report.path),
        "sha256": report.sha256,
        "results": [[r.passed, r.line] for r in report.results],
        "not_run": report.not_run,
    }


def main(request: dict[str, Any], answers: IO[str]) -> None:
    path = Path(request["path"])
    timeout_file = open(request["timeout_file"], "w", encoding="utf-8")  # noqa: SIM115 - held until the end

    def send(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    def step(says: str) -> None:
        """Each step (the import, each check) gets the whole time limit: the timer starts again."""
        faulthandler.dump_traceback_later(request["seconds"], exit=True, file=timeout_file)
        send({"checking": says})

    try:
        step("")
        report = check_file(read_learner(request["exercise"], path), before_each=step)
    except MinigptError as refused:  # the file cannot be checked (or its import tried to exit)
        values = {key: str(value) for key, value in refused.values.items()}
        send({"refused": {"template": refused.template, "values": values, "fault": isinstance(refused, LearnerFault)}})
    except BaseException as exc:  # noqa: BLE001 - the learner's code: no terminal's Ctrl-C reaches this process
        line = raised_line(exc, path.resolve())
        send({"ended": {"what": describe(exc), "line": line, "exception": isinstance(exc, Exception)}})
    else:
        send({"report": _report_message(report)})
    finally:
        faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    # The answers keep the stdout this process was given; fd 1 becomes stderr, for the learner's prints.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    # The learner's os._exit raises, so its line can be named (above).
    with exits_raise():
        main(json.loads(sys.stdin.read()), answers)
