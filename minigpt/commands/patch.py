"""`minigpt patch`: activation patching between a clean and a corrupt prompt, as grids or JSON."""

from __future__ import annotations

import typer

from ..inspection.text_format import check_digits
from ..inspection.why_text import render_patching
from .common import check_png, opened, user_errors
from .options_inspect import PatchOptions


def main(o: PatchOptions) -> None:
    with user_errors():
        check_digits(o.digits)
        check_png(o.png, "png", o.force)  # before the patching runs
        run = opened(o)
        result = run.patch(clean=o.clean, corrupt=o.corrupt, answer=o.answer, versus=o.versus, by=o.by)
        if o.png is not None:
            from ..inspection.plot import patching_figure, save_png

            save_png(patching_figure(result), o.png, "png", force=o.force)
        typer.echo(result.to_json() if o.as_json else render_patching(result, digits=o.digits))
