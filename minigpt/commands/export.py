"""`minigpt export`: a run's weights as safetensors, or as a Hugging Face GPT-2 folder."""

from __future__ import annotations

import typer

from ..interchange.export import check_export, export
from .common import opened, user_errors
from .options import ExportOptions


def main(o: ExportOptions) -> None:
    with user_errors():
        check_export(o.format, o.out)  # before loading: a large model takes a while to read
        run = opened(o)
        written = export(run.model, run.tokenizer, format=o.format, out=o.out)
    typer.echo(f"wrote {', '.join(p.name for p in written)} to {o.out}")
