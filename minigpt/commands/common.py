"""What every command shares: the one-line refusal, and messages on stderr."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer

from ..errors import MinigptError


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
