"""`minigpt export`: a run's weights as safetensors, as a Hugging Face folder (GPT-2's or the Llama
family's), or a LoRA run's adapters as PEFT's."""

from __future__ import annotations

import typer

from .. import api
from .common import user_errors
from .options import ExportOptions


def main(o: ExportOptions) -> None:
    with user_errors():
        written = api.export(
            o.run, format=o.format, out=o.out, checkpoint=o.checkpoint, config=o.config, set=o.overrides
        )
    typer.echo(f"wrote {', '.join(p.name for p in written)} to {o.out}")
