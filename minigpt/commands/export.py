"""`minigpt export`: a run's weights as safetensors, or as a Hugging Face GPT-2 folder."""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import MinigptError
from ..export import export_hf, export_safetensors
from ..run import load_model, reading_config
from .common import user_errors

FORMATS = ("safetensors", "hf")


def main(
    config: Path | None, run: Path | None, format: str, out: Path, overrides: list[str], checkpoint: str = "last"
) -> None:
    with user_errors():
        if format not in FORMATS:
            raise MinigptError(f"--format {format!r} is not one of: {', '.join(FORMATS)}")
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise MinigptError(f"--out {out} already exists and is not an empty folder; choose another --out")
        cfg, run_dir = reading_config(config, run, overrides)
        model, tokenizer = load_model(cfg, run_dir, "cpu", checkpoint)
        try:
            written = export_safetensors(model, out) if format == "safetensors" else export_hf(model, tokenizer, out)
        except OSError as exc:
            raise MinigptError(f"--out {out} cannot be written ({exc.strerror or exc}); choose another --out") from None
    typer.echo(f"wrote {', '.join(p.name for p in written)} to {out}")
