"""`minigpt info`: open a run, print where its parameters and its arithmetic are, part by part,
with the formula beside each count, training's memory, and what its `auto` settings chose."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from ..inspection.counting_text import render_text
from .common import opened, shown_path, user_errors
from .options_read import InfoOptions


def main(o: InfoOptions) -> None:
    with user_errors():
        run = opened(o, learner_code=False)  # counts: a learner's file is never run for them
        info = run.info(context=o.context)
        if o.as_json:
            typer.echo(json.dumps(info.to_json(), indent=2, ensure_ascii=False))
            return
        typer.echo(render_text(replace(info, run=Path(shown_path(info.run)))))  # the folder as typed here
