"""`minigpt plot RUN [RUN ...]`: the training curves of runs, overlaid (a PNG with -o, else a text plot)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import MinigptError
from ..plot import curves_figure, save_png, text_curves
from ..run import read_metrics
from .common import shown_path, user_errors


def main(runs: list[Path], out: Path | None, x: str) -> None:
    with user_errors():
        if x not in ("step", "time"):
            raise MinigptError(f"--x {x!r} is not one of: step, time")
        names = [shown_path(run) for run in runs]
        if len(set(names)) < len(names):
            raise MinigptError("the same run is given twice; name each run once")
        data = {name: read_metrics(run) for name, run in zip(names, runs)}
        if out is None:
            typer.echo(text_curves(data))
            return
        save_png(curves_figure(data, x), out)
    typer.echo(f"wrote {out}")
