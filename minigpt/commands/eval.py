"""`minigpt eval`: score every token of a text file with a trained run; print tokens, bytes, nats
per token, bits per byte and perplexity (or one JSON object), and optionally every token's
surprisal as JSON lines. On a task run, or with a .jsonl file of pairs: exact-match accuracy, per
answer position, and a few wrong answers; with --task-length, a task run's task at other lengths
(a table of one row per length for a range)."""

from __future__ import annotations

import json
import math

import typer

from ..errors import MinigptError
from ..io import atomic_write_text
from . import eval_positions
from .common import opened, user_errors
from .options import EvalOptions


def main(o: EvalOptions) -> None:
    with user_errors():
        run = opened(o)
        if eval_positions.asked(o):  # --by-position: the loss at each position of a text's windows
            eval_positions.main(run, o)
            return
        pairs = o.data is not None and o.data.suffix == ".jsonl"
        if o.task is not None or o.task_length is not None or pairs or (o.data is None and run.trained_on != "text"):
            if o.per_token is not None:
                raise MinigptError("{per_token} scores a text's tokens; it is not taken with a task or a .jsonl file")
            if o.task_length is not None and o.data is not None:
                raise MinigptError("{task_length} reads a task run's task at a length; it is not taken with {data}")
            if o.task_length is not None and "-" in o.task_length:  # A-B: a row per length
                _by_length(run.accuracy_by_length(o.task_length, o.task), o.as_json)
                return
            _accuracy(run.accuracy(task=o.task, data=o.data if pairs else None, task_length=o.task_length), o.as_json)
            return
        if o.data is None:
            raise MinigptError(
                "{data} is missing: give a UTF-8 text file to score, or a .jsonl file of prompt/completion pairs"
            )
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


def _by_length(table, as_json: bool) -> None:
    """Exact match per length: a table, or one JSON object (ByLength.to_json)."""
    if as_json:
        typer.echo(json.dumps(table.to_json(), ensure_ascii=False))
        return
    read = (
        "; read past it on purpose (--extrapolate)"
        if table.window is None
        else f"; read with rope scaling: {table.window} tokens"
        if table.window != table.context
        else ""
    )
    lines = [
        f"task {table.task}, trained on lengths {table.trained_text}; context {table.context} tokens{read}",
        f"{'length':>6}  {'exact match':>11}  {'examples':>8}  trained",
    ]
    for row in table.rows:
        lines.append(
            f"{row.length:>6}  {100 * row.accuracy:>10.2f}%  {row.examples:>8,}  {'yes' if row.trained else 'no'}"
        )
    typer.echo("\n".join(lines))


def _accuracy(result, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False))
        return
    lines = [
        f"{result.what}",
        f"exact match: {result.right:,} of {result.examples:,} = {100 * result.accuracy:.2f}%",
        "per answer position (right given the right answer before it): "
        + " ".join(f"{100 * p:.1f}" for p in result.per_position),
    ]
    for wrong in result.wrong:
        lines.append(f"  wrong: {wrong['prompt']!r} -> {wrong['got']!r} (expected {wrong['expected']!r})")
    typer.echo("\n".join(lines))
