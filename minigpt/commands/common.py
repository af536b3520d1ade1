"""What every command shares: the one-line refusal, and messages on stderr."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from ..errors import MinigptError, parameter

if TYPE_CHECKING:
    from ..api import Run


def refuse(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit non-zero."""
    typer.echo(f"minigpt: error: {message}", err=True)
    raise typer.Exit(code)


def compare_run_given(run: Run, given: str | None) -> str | None:
    """--compare-run as given; for a LoRA run, its base ("origin"), which is there whenever the
    LoRA run can be read at all, unless told otherwise ("none")."""
    if given is None and run.cfg.train.lora_rank:
        return "origin"
    return None if given == "none" else given


def wait_to_be_stopped() -> None:
    """On a torchrun process that leaves what went wrong to another one to say (the first process,
    which found the same mistake or was told of it): wait to be stopped instead of exiting.
    torchrun stops every process as soon as one fails, so exiting first could kill the one that
    speaks before it printed its line, leaving torchrun's report with no reason in it. torchrun
    sends the signal once that process has failed; the wait is bounded for a launcher that never
    does."""
    time.sleep(60)


@contextmanager
def user_errors() -> Iterator[None]:
    """A refusal from anywhere below becomes the one-line error, with every parameter it names
    written as its flag; anything else is a bug and keeps its traceback."""
    try:
        yield
    except MinigptError as exc:
        refuse(exc.for_command_line, exc.exit_code)


@contextmanager
def transient(message: str, quiet: bool = False) -> Iterator[None]:
    """Say what a slow step is doing on a terminal, then erase the line, so that what stays on the
    screen (a refusal above all) is unchanged. Off a terminal nothing is written."""
    show = not quiet and sys.stderr.isatty()
    if show:
        sys.stderr.write(message + "\r")
        sys.stderr.flush()
    try:
        yield
    finally:
        if show:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def check_png(path: Path | None, flag: str, force: bool) -> None:
    """The PNG an output flag names (`--png`, `plot -o`), checked before the work that draws it
    (check_output), and matplotlib, which draws it, there too; `--force` without that flag is refused,
    not ignored."""
    from ..api import PNG, check_output
    from ..inspection.plot import require_matplotlib

    if path is not None:
        require_matplotlib()
        check_output(path, flag, PNG, force=force)
    elif force:
        raise MinigptError(
            "{force:on} replaces an existing {what} file, and no {what} is given; leave out {force:on}",
            what=parameter(flag),
        )


def opened(o, learner_code: bool = True) -> Run:
    """The run a reading command's options name (`--run`, `-c`, `--set`, `--checkpoint`,
    `--trust-exercise`), with a line on a terminal while a large one loads, and a note on stderr when
    it runs a learner's file. `learner_code` False: none runs (a command that only counts)."""
    from ..api import load

    with transient(f"loading {o.run or o.config or 'the default run'} ..."):
        run = load(
            o.run,
            config=o.config,
            set=o.overrides,
            checkpoint=o.checkpoint,
            trust_exercise=getattr(o, "trust_exercise", False),
            learner_code=learner_code,
        )
    say_notes(run.notes)
    # how the model is read: past its trained length, or with rope scaled (the commands that take it)
    run.read_with(extrapolate=getattr(o, "extrapolate", False), rope_scaling=getattr(o, "rope_scaling", None))
    return run


def say_notes(notes: list[str]) -> None:
    """The library's notes (`note: ...`: which learner's file runs), each said once on stderr."""
    while notes:
        say(f"minigpt: {notes.pop(0)}")


def say(message: str, quiet: bool = False) -> None:
    """A message for the user on stderr (stdout carries only a command's result)."""
    if not quiet:
        typer.echo(message, err=True)


def shown_path(path: Path) -> str:
    """A path as the user would type it here: relative when it lies under the current folder."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def command_line(*words: Any) -> str:
    return shlex.join(str(w) for w in words)
