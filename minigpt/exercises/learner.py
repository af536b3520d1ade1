"""A learner's file: read, imported, its names found, its sha256.

Anything wrong with the file itself (missing, not UTF-8, does not import, lacks a name the exercise
needs) is one refusal naming the file and, where the file has one, the line; never a traceback. The
code runs as the learner wrote it: importing it is running it, which is the point of the exercise.
Code that tries to end the program (sys.exit, os._exit, raising a BaseException that is no
Exception) is the file's fault, said as a LearnerFault naming the file and the line (exit status 1),
never a silent exit that looks like success. Ctrl-C (KeyboardInterrupt) still stops minigpt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import MinigptError
from .catalogue import EXERCISES

FOLDER = "exercises"  # where `exercise start` writes NAME.py, under the current folder by default


def learner_path(name: str, folder: str | Path | None = None) -> Path:
    """Where the learner's file of exercise `name` is: FOLDER/NAME.py (default folder: exercises/)."""
    return Path(folder if folder is not None else FOLDER) / f"{name}.py"


def shown_here(path: Path) -> Path:
    """A path as the user would type it here: relative when it lies under the current folder."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return Path(path)


def raised_line(exc: BaseException, path: Path) -> int | None:
    """The line of the learner's file where `exc` was raised (its last frame there), or None."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if Path(frame.filename) == path]
    if isinstance(exc, SyntaxError) and exc.lineno and Path(exc.filename or "") == path:
        lines.append(exc.lineno)
    return lines[-1] if lines else None


def where_raised(exc: BaseException, path: Path) -> str:
    """`, line N` of the learner's file where `exc` was raised (its last frame there), or nothing."""
    line = raised_line(exc, path)
    return f", line {line}" if line is not None else ""


def describe(exc: BaseException) -> str:
    """An exception in a few words: `NotImplementedError: implement forward`, `os._exit(0)`."""
    if isinstance(exc, ProcessExit):
        return f"os._exit({exc.code})"
    text = " ".join(str(exc.msg if isinstance(exc, SyntaxError) else exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class ProcessExit(BaseException):
    """os._exit(code) called by the learner's code where minigpt checks it: in that child process
    (exercises/child.py) os._exit raises this instead, so that the line can be named."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _exit_raises(code: int) -> None:
    raise ProcessExit(code)


@contextmanager
def exits_raise() -> Iterator[None]:
    """Within: os._exit raises ProcessExit instead of ending the process where it stands, so a
    learner's os._exit is said as the file's fault with its line wherever minigpt runs the file (the
    checking child, training, every reading). getattr and setattr: library code never names os._exit
    (tests/test_layers.py), and this replaces it rather than calling it."""
    real = getattr(os, "_exit")  # noqa: B009
    if real is _exit_raises:  # already inside (a learner's forward calls its own submodules)
        yield
        return
    setattr(os, "_exit", _exit_raises)  # noqa: B010
    try:
        yield
    finally:
        setattr(os, "_exit", real)  # noqa: B010


class LearnerFault(MinigptError):
    """The learner's code tried to end the program, ended the process checking it, or hung: the
    file's fault, not a refusal of what the user asked (exit status 1)."""

    exit_code = 1


def ended_program(exc: BaseException) -> bool:
    """`exc` would end the program, and the learner's code raised it: a BaseException that is no
    Exception (sys.exit's, os._exit's in the child, a GeneratorExit), Ctrl-C's KeyboardInterrupt
    aside, which is the user's and must still stop minigpt."""
    return not isinstance(exc, (Exception, KeyboardInterrupt))


def program_ended(shown: Path | str, what: str, line: int | None, doing: str) -> LearnerFault:
    """The LearnerFault of the learner's file `shown` whose code tried to end the program (`what`: the
    exception described, at `line`) while `doing` ("it was checked", "the model ran it")."""
    return LearnerFault(
        "{path} tried to end the program{where} ({what}) while {doing}: a module returns its result, or raises an "
        "Exception that says what is wrong, and never exits; remove that, then try again",
        path=shown,
        where="" if line is None else f" at line {line}",
        what=what,
        doing=doing,
    )


def ending_fault(exc: BaseException, path: Path, shown: Path | str, doing: str) -> LearnerFault:
    """program_ended for `exc`, raised by the code of the learner's file at `path` (absolute)."""
    return program_ended(shown, describe(exc), raised_line(exc, path), doing)


@dataclass(frozen=True)
class LearnerFile:
    """One exercise's file as it is now: where, its text and sha256, and the module it imports as."""

    exercise: str
    path: Path  # absolute
    source: str
    sha256: str
    module: ModuleType

    def __getitem__(self, name: str):
        return getattr(self.module, name)


_imported: dict[tuple[Path, str], ModuleType] = {}  # (path, sha256): a file imported once per process


def read_learner(exercise: str, path: str | Path) -> LearnerFile:
    """The learner's file at `path` for `exercise`, imported; refused in one line when it is not
    there, not UTF-8, does not import, or lacks one of the names the exercise needs."""
    shown, path = Path(path), Path(path).resolve()  # messages name the file as given
    if not path.is_file():
        raise MinigptError(
            "there is no {path}: the exercise {exercise} is written in that file", path=shown, exercise=exercise
        )
    data = path.read_bytes()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MinigptError("{path} is not UTF-8 text; save it as UTF-8", path=shown) from None
    sha = hashlib.sha256(data).hexdigest()
    module = _imported.get((path, sha))
    if module is None:
        module = _import(exercise, path, shown, source, sha)
        _imported[(path, sha)] = module
    needed = EXERCISES[exercise].names
    missing = [name for name in needed if not hasattr(module, name)]
    if missing:
        raise MinigptError(
            "{path} defines no {missing}; the exercise {exercise} needs {needed} (keep the names of the starter)",
            path=shown,
            missing=" and no ".join(missing),
            exercise=exercise,
            needed=", ".join(needed),
        )
    return LearnerFile(exercise, path, source, sha, module)


def _import(exercise: str, path: Path, shown: Path, source: str, sha: str) -> ModuleType:
    name = f"minigpt_exercise_{exercise}_{sha[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # what a dataclass or a pickle in the file looks itself up in
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except KeyboardInterrupt:  # Ctrl-C: the user's, not the file's
        del sys.modules[name]
        raise
    except BaseException as exc:  # whatever the learner's code raises while it is imported, exits too
        del sys.modules[name]
        if ended_program(exc):
            raise ending_fault(exc, path, shown, "it was imported") from None
        raise MinigptError(
            "{path} does not import: {what}{where}; fix it and check it again",
            path=shown,
            what=describe(exc),
            where=where_raised(exc, path),
        ) from None
    return module
