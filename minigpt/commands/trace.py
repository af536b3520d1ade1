"""`minigpt trace`: open a run, follow one position through every block, print tables or JSON."""

from __future__ import annotations

import typer

from ..api import Comparison
from ..inspection.trace_text import check_digits, render_comparison, render_text
from .common import opened, user_errors
from .options import TraceOptions


def main(o: TraceOptions) -> None:
    with user_errors():
        check_digits(o.digits)
        run = opened(o)
        result = run.trace(
            o.prompt,
            ids=o.ids,
            position=o.position,
            block=o.block,
            top=o.top,
            scale=o.scale,
            replace_residual=o.replace_residual,
            ablate_head=o.ablate_head,
            set_input=o.set_input,
            at_position=o.at_position,
            compare=o.compare,
        )
        if isinstance(result, Comparison):
            typer.echo(result.to_json() if o.as_json else render_comparison(result, digits=o.digits))
            return
        if o.png is not None:
            from ..inspection.plot import attention_figure, save_png

            save_png(attention_figure(result), o.png)
        typer.echo(result.to_json() if o.as_json else render_text(result, digits=o.digits))
