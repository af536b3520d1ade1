"""The command line: the Typer app and its commands. Nothing else: each command's options are
declared once, as the fields of its dataclass in commands/options_make.py, options_read.py or
options_inspect.py (built on commands/options.py, where the flags that set a config key are built
from config.py's fields); COMMANDS below lists them. Typer reads a command's parameters from that
dataclass's own constructor, so what a command line parses into is the filled-in dataclass, which
`_run` hands to the command's module in minigpt/commands/, imported only then, so `minigpt --help`
answers without loading torch.

A command-line mistake (unknown option, a value of the wrong type) ends, like every other user
error, in one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Annotated, Any

import typer

from . import __version__
from .commands.common import wait_to_be_stopped
from .commands.options import Options
from .commands.options_inspect import ExploreOptions, PatchOptions, TraceOptions
from .commands.options_make import (
    ExerciseCheckOptions,
    ExerciseListOptions,
    ExerciseStartOptions,
    ExportOptions,
    ImportHfOptions,
    ImportNanogptOptions,
    SweepOptions,
    TrainOptions,
)
from .commands.options_read import EvalOptions, InfoOptions, PlotOptions, SampleOptions
from .commands.usage_errors import NoArgsIsHelpError, UsageError

# The command line: each command's name, its options, and the module in minigpt/commands/ that runs it.
# A name of two words is a subcommand ("import hf"): the first word groups them.
COMMANDS: dict[str, tuple[type[Options], str]] = {
    "train": (TrainOptions, "train"),
    "sweep": (SweepOptions, "sweep"),
    "sample": (SampleOptions, "sample"),
    "trace": (TraceOptions, "trace"),
    "patch": (PatchOptions, "patch"),
    "eval": (EvalOptions, "eval"),
    "export": (ExportOptions, "export"),
    "plot": (PlotOptions, "plot"),
    "explore": (ExploreOptions, "explore"),
    "info": (InfoOptions, "info"),
    "import hf": (ImportHfOptions, "imports"),
    "import nanogpt": (ImportNanogptOptions, "imports"),
    "exercise list": (ExerciseListOptions, "exercise"),
    "exercise start": (ExerciseStartOptions, "exercise"),
    "exercise check": (ExerciseCheckOptions, "exercise"),
}
GROUPS = {
    "import": "Bring a model from elsewhere into a run folder: a Hugging Face GPT-2 folder, or a nanoGPT checkpoint.",
    "exercise": "Implement a part of the model, get it checked, then train with it: list, start NAME, check NAME.",
}


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train a small GPT on a text file, sample from it, and trace one position through every block.",
)
MODULES = {options: module for options, module in COMMANDS.values()}


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"minigpt {__version__}")
        raise typer.Exit()


def _run(options: Options, **root: Any) -> None:
    """After Typer has parsed a command line into a command's options (`root` holds the options
    given before the command, which root() reads): run the command, minigpt.commands.<module>.main."""
    command = importlib.import_module(f"{__package__}.commands.{MODULES[type(options)]}")
    try:
        command.main(options)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) outside the training loop; Typer would end silently
        if _speaks_for_all():
            typer.echo("minigpt: interrupted", err=True)
        raise typer.Exit(130) from None


@app.callback(result_callback=_run)
def root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an internal error (also MINIGPT_DEBUG=1).")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Train a small GPT on a text file, sample from it, and trace one position through every block."""


def add_command(name: str, options: type[Options]) -> None:
    """The command `name` ("train", or "import hf" under the group "import"): its parameters are the
    fields of `options`, and a command line of it parses into one `options` (the dataclass itself is
    the command's callable: Typer reads its constructor's parameters)."""
    *group, command = name.split()
    (_group(group[0]) if group else app).command(name=command, help=_paragraphs(options.__doc__ or ""))(options)


_groups: dict[str, typer.Typer] = {}


def _group(name: str) -> typer.Typer:
    if name not in _groups:
        _groups[name] = typer.Typer(no_args_is_help=True, help=GROUPS[name])
        app.add_typer(_groups[name], name=name)
    return _groups[name]


def _paragraphs(text: str) -> str:
    """A docstring's paragraphs each on one line, so that the help reflows them to the terminal."""
    return "\n\n".join(
        " ".join(line.strip() for line in part.splitlines()) for part in inspect.cleandoc(text).split("\n\n")
    )


for _name, (_options, _) in COMMANDS.items():
    add_command(_name, _options)


def _speaks_for_all() -> bool:
    """False on all but the first process of each machine in a torchrun job: they read the same
    command line, so a mistake in it is said once per machine (the first process of a machine
    other than rank 0's is the only one whose output that machine shows). Read from torchrun's
    environment here rather than through distributed.py: a mistake is found before any command
    module, torch included, is imported."""
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1 or os.environ.get("LOCAL_RANK", "0") == "0"


def main() -> None:
    """Run the app; a command-line mistake ends in one line on stderr and exit status 2, not Click's
    multi-line box."""
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:  # its message is the help, unless the help was printed already (rich)
        if exc.format_message():
            typer.echo(exc.format_message())
        code = 0
    except UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "minigpt"
        message = " ".join(exc.format_message().split()).rstrip(".")
        if _speaks_for_all():
            typer.echo(f"minigpt: error: {message}; see '{command} --help'", err=True)
        else:
            wait_to_be_stopped()
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # Ctrl-C while the command line is read
        if _speaks_for_all():
            typer.echo("minigpt: interrupted", err=True)
        code = 130
    except Exception as exc:  # not a refusal: a bug, or the machine failing under us
        if "--debug" in sys.argv[1:] or os.environ.get("MINIGPT_DEBUG", "") not in ("", "0"):
            raise
        detail = " ".join(str(exc).split())[:300]
        typer.echo(
            f"minigpt: internal error: {type(exc).__name__}{': ' + detail if detail else ''} "
            f"(run with --debug for the traceback)",
            err=True,
        )
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
