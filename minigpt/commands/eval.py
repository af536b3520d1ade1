"""`minigpt eval`: score every token of a text file with a trained run; print tokens, bytes, nats
per token, bits per byte and perplexity (or one JSON object), and optionally every token's
surprisal as JSON lines. On a task run, or with a .jsonl file of pairs: exact-match accuracy, per
answer position, and a few wrong answers; with --task-length, a task run's task at other lengths
(a table of one row per length for a range)."""

from __future__ import annotations

import json
import math

import typer

from ..api import JSON_LINES, check_output, write_output
from ..errors import MinigptError, Phrase, parameter
from . import eval_positions
from .common import check_png, opened, user_errors
from .options_read import EvalOptions


def main(o: EvalOptions) -> None:
    with user_errors():
        _check_outputs(o)  # before the run is loaded and the text scored
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
        _check_reads_within_context(o, run.model.context)
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
            text = "".join(line + "\n" for line in lines)
            write_output(o.per_token, "per_token", JSON_LINES, force=o.force, write=lambda f: f.write(text))
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
        left = _left_context(scores.least_left_context, context)
        typer.echo(
            f"{o.data}: {scores.tokens:,} tokens scored ({scores.bytes:,} bytes), {left}\n"
            f"nats/token {scores.nats_per_token:.4f}   bits/byte {scores.bits_per_byte:.4f}   "
            f"perplexity {scores.perplexity:.2f}"
        )


def _left_context(least: int | None, context: int) -> str:
    """What the windows gave each token to its left, as they fell on this text (Scores.least_left_context):
    a text that fits one window gives every token all the tokens before it."""
    if least is None:
        return f"each with every token before it as context: the text fits one window of {context} tokens"
    return f"each with at least {least} tokens of left context after the first window"


def _check_outputs(o: EvalOptions) -> None:
    """The files --per-token and --png would write, and --force with one of them."""
    if o.force and o.per_token is None and o.png is None:
        raise MinigptError(
            "{force:on} replaces an existing {per_token} or {png} file, and neither is given; leave out {force:on}"
        )
    if o.per_token is not None:
        check_output(o.per_token, "per_token", JSON_LINES, force=o.force)
    if o.png is not None:
        check_png(o.png, "png", o.force)


def _check_reads_within_context(o: EvalOptions, context: int) -> None:
    """A text is scored in windows of the trained length and never past it, so a way of reading
    past it (--rope-scaling, --extrapolate) would be taken and do nothing eval shows: refused."""
    if o.rope_scaling is None and not o.extrapolate:
        return
    given = (
        Phrase("{rope_scaling} {rule}", rule=o.rope_scaling)
        if o.rope_scaling is not None
        else parameter("extrapolate", "on")
    )
    raise MinigptError(
        "{given} reads a model past the length it was trained at, and eval scores a text in windows of that "
        "length ({context} tokens), never past it; leave it out, or give it with {by_position:on} {length} N "
        "to see the loss at positions past {context}",
        given=given,
        context=context,
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
