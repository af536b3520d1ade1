"""`minigpt eval`: score every token of a text file with a trained run; print tokens, bytes, nats
per token, bits per byte and perplexity (or one JSON object), and optionally every token's
surprisal as JSON lines."""

from __future__ import annotations

import json
import math

import typer

from ..errors import MinigptError
from ..io import atomic_write_text
from .common import opened, user_errors
from .options import EvalOptions


def main(o: EvalOptions) -> None:
    with user_errors():
        run = opened(o)
        scores = run.eval(o.data)
        if o.per_token is not None:
            ids = scores.ids
            lines = (
                json.dumps(
                    {
                        "position": i + 1,
                        "id": ids[i + 1],
                        "token": run.tokenizer.token_text(ids[i + 1]),
                        "surprisal_bits": nats / math.log(2),
                    },
                    ensure_ascii=False,
                )
                for i, nats in enumerate(scores.surprisal)
            )
            try:
                atomic_write_text(o.per_token, "".join(line + "\n" for line in lines))
            except OSError as exc:
                raise MinigptError(
                    "{per_token} {given} cannot be written ({reason}); choose another path",
                    given=o.per_token,
                    reason=exc.strerror or exc,
                ) from None
        context = run.model.context
        summary = {
            "tokens": scores.tokens,
            "bytes": scores.bytes,
            "nats_per_token": scores.nats_per_token,
            "bits_per_byte": scores.bits_per_byte,
            "perplexity": scores.perplexity,
            "context": context,
            "run": str(run.path),
            "data": str(o.data),
        }
        if o.as_json:
            typer.echo(json.dumps(summary))
            return
        typer.echo(
            f"{o.data}: {scores.tokens:,} tokens scored ({scores.bytes:,} bytes), each with at least "
            f"{context // 2} tokens of left context after the first window\n"
            f"nats/token {scores.nats_per_token:.4f}   bits/byte {scores.bits_per_byte:.4f}   "
            f"perplexity {scores.perplexity:.2f}"
        )
