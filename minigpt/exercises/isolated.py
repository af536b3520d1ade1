"""A learner's file checked in a child process, with a time limit on each step: how `exercise check`
and the check `train --exercise` runs before training run the learner's code.

In this process the learner's code could end everything and look like success: sys.exit(0) or
os._exit(0) in a forward pass made the command exit 0 printing nothing, and a loop that never ends
hung it. In a child process (a fresh `python -m minigpt.exercises.child`, simpler and more
predictable than multiprocessing, which would re-import the caller's main module) whatever the code
does ends or hangs only the child, and this side says it as the file's fault, in one line with the
line of the file where it can be known, as a LearnerFault (exit status 1). The child is in a
session of its own, so a terminal's Ctrl-C reaches this process alone, which stops the child and
stops (KeyboardInterrupt) as before.

Each step (the import, then each check) may take TIME_LIMIT seconds (MINIGPT_CHECK_SECONDS sets
another limit): a check runs the module on a few small tensors, in far less.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ..errors import MinigptError
from .checks import Report, Result
from .learner import LearnerFault, program_ended

TIME_LIMIT = 30.0  # seconds per step of a check: the import, then each check
LIMIT_VARIABLE = "MINIGPT_CHECK_SECONDS"
# A backstop only: the child's own timer ends it after the limit; starting it (importing torch) on a
# busy machine can take a while before its first answer.
GRACE = 120.0
LONGEST = 86_400.0  # a day: a time limit longer than any check needs, and one the clocks can count


def time_limit() -> float:
    """The seconds each step of a check may take: MINIGPT_CHECK_SECONDS, else TIME_LIMIT."""
    given = os.environ.get(LIMIT_VARIABLE)
    if given is None:
        return TIME_LIMIT
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= LONGEST:
        raise MinigptError(
            "{variable}={given} is not a number of seconds from 0 to {longest:g} (a day); give one (the default "
            "is {default:g})",
            variable=LIMIT_VARIABLE,
            given=given,
            longest=LONGEST,
            default=TIME_LIMIT,
        )
    return seconds


def check_isolated(exercise: str, path: str | Path, seconds: float | None = None) -> Report:
    """Every check of the learner's file at `path` (shown as given), run in a child process: the
    Report; refused in one line when the file cannot be checked (as read_learner refuses), and a
    LearnerFault when its code tries to end the program, ends the child or takes more than
    `seconds` (default: time_limit()) for one step."""
    seconds = time_limit() if seconds is None else seconds
    with tempfile.TemporaryDirectory(prefix="minigpt-check-") as scratch:
        timeout_file = Path(scratch) / "timeout.txt"
        request = {"exercise": exercise, "path": str(path), "seconds": seconds, "timeout_file": str(timeout_file)}
        process = subprocess.Popen(
            [sys.executable, "-m", "minigpt.exercises.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_environment(),
            start_new_session=True,
        )
        try:
            with contextlib.suppress(BrokenPipeError):  # a child that ended at once is said below
                process.stdin.write(json.dumps(request).encode())
                process.stdin.close()
            step, answer, silent = _answers(process, seconds + GRACE)
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
        if answer is not None:
            return _report(answer, path)
        if step is None and not silent:  # it ended before it began: minigpt's own start, not the file
            raise RuntimeError(
                f"the process that checks {path} ended before it began ({_how_ended(process.returncode)})"
            )
        timed_out = timeout_file.read_text(encoding="utf-8", errors="replace") if timeout_file.exists() else ""
    during = f"while checking that {step}" if step else "while importing it"
    if timed_out or silent:
        line = _timeout_line(timed_out, Path(path).resolve())
        raise LearnerFault(
            "{path} did not return within {seconds:g} s{where}, {during}; {seconds:g} s is the time limit of each step "
            "of a check ({variable} sets another), and a check runs the module on a few small tensors in far less: "
            "look there for a loop that never ends, or for code that waits",
            path=path,
            during=during,
            seconds=seconds,
            where="" if line is None else f" at line {line}",
            variable=LIMIT_VARIABLE,
        )
    raise LearnerFault(
        "{path} ended the process that checked it ({how}) {during}: a module returns its result, or raises an "
        "Exception that says what is wrong, and never ends the program; look for os.kill, os.abort, or code "
        "outside Python that crashes",
        path=path,
        how=_how_ended(process.returncode),
        during=during,
    )


def _environment() -> dict[str, str]:
    """The child's: this minigpt first on its path, one thread (the checks' tensors are tiny)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the minigpt package
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _answers(process: subprocess.Popen, backstop: float) -> tuple[str | None, dict[str, Any] | None, bool]:
    """What the child said: the step it was at last (its `checking`: "" for the import, None before
    it began), its answer (None when it ended without one), and whether it fell silent for
    `backstop` seconds instead."""
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    step = None
    while True:
        try:
            line = lines.get(timeout=backstop)
        except queue.Empty:  # its own timer did not end it: it is stopped by the caller
            return step, None, True
        if line is None:
            return step, None, False
        message = json.loads(line)
        if "checking" not in message:
            return step, message, False
        step = message["checking"]


def _report(answer: dict[str, Any], path: str | Path) -> Report:
    if "report" in answer:
        r = answer["report"]
        results = [Result(passed, line) for passed, line in r["results"]]
        return Report(r["exercise"], Path(r["path"]), r["sha256"], results, r["not_run"])
    if "refused" in answer:
        refused = answer["refused"]
        raise (LearnerFault if refused["fault"] else MinigptError)(refused["template"], **refused["values"])
    ended = answer["ended"]
    if not ended["exception"]:
        raise program_ended(path, ended["what"], ended["line"], "it was checked")
    if ended["line"] is None:  # raised outside a check's guard, and not by the file: minigpt's own mistake
        raise RuntimeError(f"checking {path} raised {ended['what']}")
    raise MinigptError(
        "{path} raised {what} at line {line} while it was checked; fix it and check it again",
        path=path,
        what=ended["what"],
        line=ended["line"],
    )


def _timeout_line(frames: str, path: Path) -> int | None:
    """The line of the learner's file the child was at when its timer ended it (faulthandler lists
    the most recent call first)."""
    found = re.search(rf'File "{re.escape(str(path))}", line (\d+)', frames)
    return int(found[1]) if found else None


def _how_ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
