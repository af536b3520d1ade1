"""What every command shares: the one-line refusal, and messages on stderr."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from ..errors import MinigptError

if TYPE_CHECKING:
    from ..api import Run


def refuse(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit non-zero."""
    typer.echo(f"minigpt: error: {message}", err=True)
    raise typer.Exit(code)


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


def opened(o) -> Run:
    """The run a reading command's options name (`--run`, `-c`, `--set`, `--checkpoint`), with a
    line on a terminal while a large one loads."""
    from ..api import load

    with transient(f"loading {o.run or o.config or 'the default run'} ..."):
        return load(o.run, config=o.config, set=o.overrides, checkpoint=o.checkpoint)


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
