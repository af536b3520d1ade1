"""`minigpt plot RUN [RUN ...]`: the training curves of runs, overlaid (a PNG with -o, else a text plot).
`minigpt plot DIR`, DIR a sweep's folder: a metric of its cells against one grid key."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import api
from ..api.sweep import SWEEP_FILE
from ..errors import MinigptError
from ..inspection.plot import curves_figure, save_png, text_curves
from ..inspection.sweep_plot import METRICS, sweep_figure, text_sweep
from .common import check_png, shown_path, user_errors
from .options_read import PlotOptions


def main(o: PlotOptions) -> None:
    with user_errors():
        check_png(o.out, "out", o.force)  # before any run is read
        if len(o.runs) == 1 and (Path(o.runs[0]) / SWEEP_FILE).is_file():
            _plot_sweep(o)
            return
        if o.metric is not None or o.against is not None:
            raise MinigptError(
                "{metric} and {against} plot a sweep's folder (one holding {file}), and {given} is not one; give "
                "the {out} of a sweep alone",
                file=SWEEP_FILE,
                given=" ".join(shown_path(run) for run in o.runs),
            )
        if o.x not in ("step", "time"):
            raise MinigptError("{x} {given!r} is not one of: step, time", given=o.x)
        names = [shown_path(run) for run in o.runs]
        if len(set(names)) < len(names):
            raise MinigptError("the same run is given twice; name each run once")
        data = {name: api.metrics(run) for name, run in zip(names, o.runs)}
        if o.out is None:
            typer.echo(text_curves(data))
            return
        save_png(curves_figure(data, o.x), o.out, "out", force=o.force)
    typer.echo(f"wrote {o.out}")


def _plot_sweep(o: PlotOptions) -> None:
    """A metric (default: final validation loss) against a grid key (default: the first)."""
    metric = o.metric or "final"
    if metric not in METRICS:
        raise MinigptError("{metric} {given!r} is not one of: {allowed}", given=metric, allowed=", ".join(METRICS))
    if o.x != "step":
        raise MinigptError("{x} draws runs' curves; a sweep is drawn with {metric} against {against}")
    sweep = api.read_sweep(o.runs[0])
    labels = sweep.labels()
    against = o.against or next(iter(sweep.grid))
    by_label = {label: key for key, label in labels.items()}
    against = by_label.get(against, against)
    if against not in sweep.grid:
        raise MinigptError(
            "{against} {given!r} is not a grid key of {folder}; its keys: {keys}",
            given=o.against,
            folder=shown_path(sweep.folder),
            keys=", ".join(sweep.grid),
        )
    records = [sweep.records[cell.name] for cell in sweep.cells if cell.name in sweep.records]
    if not records:
        raise MinigptError(
            "no cell of the sweep in {folder} has finished yet; there is nothing to plot",
            folder=shown_path(sweep.folder),
        )
    if o.out is None:
        typer.echo(text_sweep(sweep.grid, records, metric=metric, against=against))
        return
    figure = sweep_figure(sweep.grid, records, metric=metric, against=against, title=shown_path(sweep.folder))
    save_png(figure, o.out, "out", force=o.force)
    typer.echo(f"wrote {o.out}")
