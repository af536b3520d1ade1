"""`minigpt export`: a run's weights as safetensors, as a Hugging Face folder (GPT-2's or the Llama
family's), or a LoRA run's adapters as PEFT's; in the run's dtype, with a note on stderr where
transformers computes part of a float64 model in float32."""

from __future__ import annotations

import typer

from .. import api
from .common import opened, user_errors
from .options_make import ExportOptions


def main(o: ExportOptions) -> None:
    with user_errors():
        api.check_export(o.format, o.out)  # before the model is read (a large one takes a while)
        run = opened(o)
        written = run.export(o.format, o.out)
    typer.echo(f"wrote {', '.join(p.name for p in written)} to {o.out}")
    note = run.export_note(o.format)
    if note:
        typer.echo(f"minigpt: note: {note}", err=True)
