"""`minigpt exercise list | start NAME | check NAME`: a learner's files in exercises/ (or --dir),
each written from a starter, checked against minigpt's own modules, then trained with
(`minigpt train --exercise NAME`). A check's lines go to stdout, one per check; it exits 0 when
every check passes; when one fails, the last line says how many, as an error line on stderr, and
it exits 1. A file that cannot be checked (missing, not importable, lacking a name) is one refusal
line, exit 2; one whose code tries to end the program, ends the process checking it, or hangs is
one line too, the file's fault, exit 1. `list` runs none of the files: it says which are there;
`check` runs one (in a child process, with a time limit on each step)."""

from __future__ import annotations

import difflib
from pathlib import Path

import typer

from ..api.exercises import EXERCISES, check, learner_path, start, status
from ..errors import MinigptError
from .common import command_line, refuse, shown_path, user_errors
from .options_make import ExerciseCheckOptions, ExerciseListOptions, ExerciseStartOptions

DEFAULT_DIR = Path("exercises")


def main(o: ExerciseListOptions | ExerciseStartOptions | ExerciseCheckOptions) -> None:
    with user_errors():
        if isinstance(o, ExerciseListOptions):
            _list(o)
        elif isinstance(o, ExerciseStartOptions):
            _start(o)
        else:
            _check(o)


def _known(name: str) -> str:
    if name not in EXERCISES:
        close = difflib.get_close_matches(name, list(EXERCISES), n=1)
        raise MinigptError(
            "there is no exercise {name!r}{hint}; the exercises are {join}",
            name=name,
            hint=f" (did you mean {close[0]!r}?)" if close else "",
            join=", ".join(EXERCISES),
        )
    return name


def _dir_words(folder: Path) -> list[str]:
    """`--dir DIR` when it is not the default, to repeat it in a command shown."""
    return [] if Path(folder) == DEFAULT_DIR else ["--dir", str(folder)]


# A name up to this long shares its line with what follows; a longer one has a line of its own, the
# text under it (as argparse lays out a long option's help), so one long name does not push every
# line of the list to the right.
NAME_COLUMN = 9


def _list(o: ExerciseListOptions) -> None:
    width = NAME_COLUMN
    lines = [
        f"exercises in {o.dir}/ (start one with: "
        f"{command_line('minigpt', 'exercise', 'start', 'NAME', *_dir_words(o.dir))}; "
        f"run your file's checks with: {command_line('minigpt', 'exercise', 'check', 'NAME', *_dir_words(o.dir))})"
    ]
    for name, exercise in EXERCISES.items():
        yours = status(name, o.dir)
        shown = name
        if len(name) > width:
            lines.append(f"  {name}")
            shown = ""
        lines.append(f"  {shown:<{width}}  {exercise.source}: {exercise.title}")
        lines.append(
            f"  {'':<{width}}  yours: {yours}" + (f", {shown_path(yours.path)}" if yours.word == "started" else "")
        )
        lines.append(f"  {'':<{width}}  in a model: {exercise.replaces}")
    typer.echo("\n".join(lines))


def _start(o: ExerciseStartOptions) -> None:
    name = _known(o.name)
    path = start(name, o.dir, o.force)
    exercise = EXERCISES[name]
    typer.echo(
        f"wrote {shown_path(path)}: {exercise.title} ({exercise.source}); its docstring says what to implement\n"
        f"check it with: {command_line('minigpt', 'exercise', 'check', name, *_dir_words(o.dir))}"
    )


def _check(o: ExerciseCheckOptions) -> None:
    name = _known(o.name)
    path = learner_path(name, o.dir)
    if not path.exists():
        raise MinigptError(
            "there is no {path}; start the exercise with: {command}",
            path=path,
            command=command_line("minigpt", "exercise", "start", name, *_dir_words(o.dir)),
        )
    exercise = EXERCISES[name]
    report = check(name, o.dir)
    lines = [f"checking {shown_path(path)} ({exercise.source}: {exercise.title})"]
    lines += [f"  {'ok  ' if r.passed else 'FAIL'}  {r.line}" for r in report.results]
    if report.passed:
        file_words = [] if Path(o.dir) == DEFAULT_DIR else ["--exercise-file", str(path)]
        lines.append(
            f"{name}: all {report.total} checks pass; train with it: "
            f"{command_line('minigpt', 'train', '--exercise', name, *file_words)}"
        )
        typer.echo("\n".join(lines))
        return
    typer.echo("\n".join(lines))
    # exit status 1: the file was checked, and failed (a file that cannot be checked is a refusal, 2)
    refuse(f"{name}: {report.summary}; fix the first, then check again", code=1)
