"""`minigpt eval`: score every token of a text file with a trained run; print tokens, bytes, nats
per token, bits per byte and perplexity (or one JSON object), and optionally every token's
surprisal as JSON lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from ..data import read_text
from ..device import pick_device, use_threads
from ..errors import MinigptError
from ..io import atomic_write_text
from ..run import load_model, reading_config
from ..scoring import score
from .common import user_errors


def main(
    config: Path | None,
    run: Path | None,
    data: Path,
    as_json: bool,
    per_token: Path | None,
    overrides: list[str],
    checkpoint: str = "last",
) -> None:
    with user_errors():
        cfg, run_dir = reading_config(config, run, overrides)
        text, _ = read_text(data, what="text to score")
        use_threads(cfg.train.threads)
        model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device), checkpoint)
        ids = tokenizer.encode(text)  # a char tokenizer names the characters it never saw
        if len(ids) < 2:
            raise MinigptError(
                f"text to score {data} has {len(ids)} token(s); scoring needs at least two "
                f"(the first token has no prediction)"
            )
        scores = score(model, ids, len(text.encode("utf-8")))
        if per_token is not None:
            lines = (
                json.dumps(
                    {
                        "position": i + 1,
                        "id": ids[i + 1],
                        "token": tokenizer.token_text(ids[i + 1]),
                        "surprisal_bits": nats / math.log(2),
                    },
                    ensure_ascii=False,
                )
                for i, nats in enumerate(scores.surprisal)
            )
            try:
                atomic_write_text(per_token, "".join(line + "\n" for line in lines))
            except OSError as exc:
                raise MinigptError(
                    f"--per-token {per_token} cannot be written ({exc.strerror or exc}); choose another path"
                ) from None
        summary = {
            "tokens": scores.tokens,
            "bytes": scores.bytes,
            "nats_per_token": scores.nats_per_token,
            "bits_per_byte": scores.bits_per_byte,
            "perplexity": scores.perplexity,
            "context": model.context,
            "run": str(run_dir),
            "data": str(data),
        }
        if as_json:
            typer.echo(json.dumps(summary))
            return
        typer.echo(
            f"{data}: {scores.tokens:,} tokens scored ({scores.bytes:,} bytes), each with at least "
            f"{model.context // 2} tokens of left context after the first window\n"
            f"nats/token {scores.nats_per_token:.4f}   bits/byte {scores.bits_per_byte:.4f}   "
            f"perplexity {scores.perplexity:.2f}"
        )
