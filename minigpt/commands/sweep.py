"""`minigpt sweep`: options -> the API's sweep (every cell trained by the API's train, one after
another) -> a line per cell on stderr, then the table on stdout.

An interruption stops inside a cell as `train` stops (Ctrl-C or SIGTERM: a checkpoint at the next
step boundary) or between two cells; either way the sweep exits 130 saying that the same command
continues it.
"""

from __future__ import annotations

import signal

import typer

from .. import api
from ..api import WriteFailed
from ..api.sweep import MANY_CELLS
from .common import command_line, say, shown_path, user_errors
from .options_make import SweepOptions
from .train import _interrupt, _sigterm_interrupts


def main(o: SweepOptions) -> None:
    before = _sigterm_interrupts()  # before and between cells, SIGTERM stops as Ctrl-C does
    try:
        with user_errors():
            _sweep(o)
    except KeyboardInterrupt:  # between two cells, or a second Ctrl-C inside one
        say(f"minigpt sweep: interrupted; rerun the same command to continue: {_again(o)}")
        raise typer.Exit(130) from None
    finally:
        if before is not None:
            # After a SIGTERM stopped a cell, training leaves a handler that ignores its copies; keep
            # ignoring them while the process ends (see commands/train.py).
            stopped = signal.getsignal(signal.SIGTERM) is not _interrupt
            signal.signal(signal.SIGTERM, signal.SIG_IGN if stopped else before)


def _sweep(o: SweepOptions) -> None:
    def starting(cell, how: str, sweep: api.Sweep) -> None:
        what = {"skip": "finished, skipped", "start": "training", "resume": "resuming from its checkpoint"}[how]
        say(f"minigpt sweep: cell {sweep.cells.index(cell) + 1}/{sweep.cells.count} {cell.name}: {what}", o.quiet)

    def done(cell, record: dict) -> None:
        diverged = (
            f"diverged at step {record['diverged_at']} ({record['diverged_by']})" if record["diverged_by"] else "done"
        )
        final = "n/a" if record["final_val_loss"] is None else f"{record['final_val_loss']:.4f}"
        say(f"  {diverged}: final val loss {final}, {record['wall_s']:.1f}s", o.quiet)

    def planned(count: int) -> None:  # said even with --quiet: a grid this large is often a mistake
        if count > MANY_CELLS:
            say(
                f"minigpt: note: the grid has {count:,} cells (more than {MANY_CELLS:,}), trained one after "
                "another; each cell's config is checked before any runs"
            )

    try:
        result = api.sweep(
            o.grid,
            o.out,
            seeds=o.seeds,
            **o.config_values()["train"],
            **o.config_values()["model"],  # --exercise
            config=o.config,
            set=o.overrides,
            trust_exercise=o.trust_exercise,
            progress=not o.quiet,
            on_cell=starting,
            on_done=done,
            on_plan=planned,
        )
    except WriteFailed as exc:  # a full disk inside a cell: said with the command that continues the sweep
        raise WriteFailed(exc.reason, exc.run, exc.checkpoint_step, resume_with=_again(o)) from None
    if result.stopped is not None:
        s = result.stopped
        say(
            f"minigpt sweep: interrupted in cell {s.cell.name} at step {s.step}/{s.total}; its checkpoint is saved. "
            f"Rerun the same command to continue: {_again(o)}"
        )
        raise typer.Exit(130)
    typer.echo(table(result.rows()))
    say(
        f"sweep folder {shown_path(result.folder)}: {result.cells.count} cells, their records in sweep.jsonl; "
        f"plot with: {command_line('minigpt', 'plot', shown_path(result.folder))}",
        o.quiet,
    )


def table(rows: list[list[str]]) -> str:
    """Rows as aligned columns: a column of numbers (and dashes) to the right, any other to the left."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    numeric = [all(_number(row[k]) for row in rows[1:]) and len(rows) > 1 for k in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(row, widths, numeric)).rstrip()
        for row in rows
    )


def _number(text: str) -> bool:
    try:
        float(text.removesuffix("s"))
    except ValueError:
        return text == "-"
    return True


def _again(o: SweepOptions) -> str:
    """The command that continues this sweep: the same one."""
    words = ["-c", o.config] if o.config else []
    words += [w for grid in o.grid for w in ("--grid", grid)]
    words += ["--seeds", o.seeds] if o.seeds is not None else []
    words += [w for override in o.overrides for w in ("--set", override)]
    words += o.config_flag_words() + ["--out", o.out] + (["--quiet"] if o.quiet else [])
    return command_line("minigpt", "sweep", *words)
