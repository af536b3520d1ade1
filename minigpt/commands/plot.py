"""`minigpt plot RUN [RUN ...]`: the training curves of runs, overlaid (a PNG with -o, else a text plot)."""

from __future__ import annotations

import typer

from .. import api
from ..errors import MinigptError
from ..inspection.plot import curves_figure, save_png, text_curves
from .common import shown_path, user_errors
from .options import PlotOptions


def main(o: PlotOptions) -> None:
    with user_errors():
        if o.x not in ("step", "time"):
            raise MinigptError("{x} {given!r} is not one of: step, time", given=o.x)
        names = [shown_path(run) for run in o.runs]
        if len(set(names)) < len(names):
            raise MinigptError("the same run is given twice; name each run once")
        data = {name: api.metrics(run) for name, run in zip(names, o.runs)}
        if o.out is None:
            typer.echo(text_curves(data))
            return
        save_png(curves_figure(data, o.x), o.out)
    typer.echo(f"wrote {o.out}")
