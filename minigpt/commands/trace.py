"""`minigpt trace`: load a run, follow one position through every block, print tables or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..device import pick_device, use_threads
from ..errors import MinigptError
from ..run import load_model, reading_config
from ..trace import prompt_ids, trace_position
from ..trace_text import check_display_options, render_text
from .common import user_errors


def main(config: Optional[Path], run: Optional[Path], prompt: Optional[str], ids: Optional[str],
         position: Optional[int], block: Optional[int], digits: int, top: int, as_json: bool,
         overrides: list[str]) -> None:
    with user_errors():
        if (prompt is None) == (ids is None):
            raise MinigptError("give the tokens to trace with exactly one of -p/--prompt TEXT or --ids 3,1,4")
        check_display_options(digits, top)
        token_ids = parse_ids(ids) if ids is not None else None
        cfg, run_dir = reading_config(config, run, overrides)
        use_threads(cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device))
        if token_ids is None:
            token_ids = prompt_ids(tokenizer, prompt)
        result = trace_position(model, tokenizer, token_ids, position=position, block=block, top=top)
        typer.echo(result.to_json() if as_json else render_text(result, digits=digits))


def parse_ids(text: str) -> list[int]:
    """`3,1,4` -> [3, 1, 4]; anything but comma-separated integers is refused."""
    if not text.strip():
        raise MinigptError("--ids is empty; trace needs at least one token id, e.g. --ids 3,1,4")
    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise MinigptError(f"--ids {text!r}: {part.strip()!r} is not an integer; give comma-separated "
                               f"token ids, e.g. --ids 3,1,4") from None
    return ids
