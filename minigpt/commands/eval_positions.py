"""`minigpt eval --by-position`: the mean loss at each position of a text's windows, as a compact
table with a bar per row (or one JSON object, or a curve with --png), the positions past the length
the model was trained at marked, so the cliff there can be seen."""

from __future__ import annotations

import json
import math

import typer

from ..api import PositionLosses
from ..errors import MinigptError, as_flag, parameter
from .common import say, shown_path
from .options_read import EvalOptions

EVERY_POSITION = 64  # up to this many positions, one row each; beyond, rows of a few positions
ROWS = 32  # about this many rows when positions are grouped
BAR = 40  # characters of the longest bar


def asked(o: EvalOptions) -> bool:
    """Whether the options ask for loss by position (or give one of its options without it)."""
    return o.by_position or o.length is not None or o.windows is not None or o.png is not None


def main(run, o: EvalOptions) -> None:
    """Refuse what does not go with loss by position, then compute and show it."""
    if not o.by_position:
        given = "length" if o.length is not None else "windows" if o.windows is not None else "png"
        raise MinigptError(
            "{given} goes with {by_position:on}, the loss at each position; give {by_position:on} too, "
            "or leave {given} out",
            given=parameter(given),
        )
    if o.per_token is not None:
        raise MinigptError(
            "{per_token} scores each token of the text once, {by_position:on} averages each position over "
            "windows; give one of them"
        )
    task = o.task is not None or getattr(o, "task_length", None) is not None or run.trained_on == "task"
    if task or (o.data is not None and o.data.suffix == ".jsonl"):
        raise MinigptError(
            "{by_position:on} scores the windows of a UTF-8 text with a run trained on text, not a task or a "
            ".jsonl file of pairs; give {data} a text file and a text run, or leave out {by_position:on} for "
            "exact-match accuracy"
        )
    if o.data is None:
        raise MinigptError("{data} is missing: give a UTF-8 text file whose windows are scored at each position")
    result = run.loss_by_position(o.data, length=o.length, windows=o.windows)
    if o.png is not None:
        from ..inspection.plot import position_figure, save_png

        save_png(position_figure(result, title=shown_path(run.path)), o.png, "png", force=o.force)
    if o.as_json:
        typer.echo(json.dumps({"run": str(run.path), "data": str(o.data), **result.to_json()}))
    else:
        typer.echo("\n".join(text_table(result, str(o.data), run.model.cfg.positions)))
    if result.length > result.trained_length:
        note = run.model.reading.past_note("read", f"windows of {result.length} tokens")
        say(f"minigpt: note: {note.render(as_flag)}")


def bins(length: int, trained_length: int) -> list[range]:
    """The positions each row shows: every position up to EVERY_POSITION of them, else groups of
    equal width (about ROWS rows), never one across the trained length."""
    width = 1 if length <= EVERY_POSITION else math.ceil(length / ROWS)
    edges = [(0, min(trained_length, length)), (trained_length, length)]
    return [range(a, min(a + width, end)) for start, end in edges for a in range(start, end, width)]


def text_table(result: PositionLosses, data: str, positions: str) -> list[str]:
    """The table: a row per position (or group of positions) with its mean loss and a bar, a line
    where the trained length ends, and the means inside and past it."""
    trained = result.trained_length
    read = [f"--rope-scaling {result.rope_scaling}"] if result.rope_scaling else []
    read = (["--extrapolate"] if result.extrapolate else []) + read
    rows = [(span, math.fsum(result.nats[p] for p in span) / len(span)) for span in bins(result.length, trained)]
    grouped = any(len(span) > 1 for span, _ in rows)
    # The bars start at a round number below the lowest row, so that a rise of a few tenths of a
    # nat is a visible difference in length; the line above the table says where they start.
    low, top = min(nats for _, nats in rows), max(nats for _, nats in rows)
    floor = math.floor(low * 2) / 2
    head = "positions" if grouped else "position"
    label = max(len(head), *(len(_span(span)) for span, _ in rows))
    count = f"  {'tokens':>9}" if grouped else ""
    lines = [
        f"{data}: mean loss at each position of {result.windows:,} windows of {result.length} tokens, each read "
        f"from position 0",
        f'trained at {trained} tokens ([model] context, positions = "{positions}")'
        + (f", read with {' and '.join(read)}" if read else ""),
        f"{head:>{label}}{count}  {'nats':>7}  {'bits':>7}  bar: nats above {floor:g}",
    ]
    for span, nats in rows:
        if span.start == trained:
            lines.append(f"{'':>{label}}  --- trained length {trained}: never trained from here on ---")
        bar = "#" * max(1, round(BAR * (nats - floor) / ((top - floor) or 1)))
        tokens = f"  {len(span) * result.windows:>9,}" if grouped else ""
        past = "  past" if result.past_trained_length(span.start) else ""
        lines.append(f"{_span(span):>{label}}{tokens}  {nats:>7.4f}  {nats / math.log(2):>7.4f}  {bar}{past}")
    inside = min(trained, result.length)
    lines.append(
        f"mean inside the trained length (positions 0-{inside - 1}): {result.mean_inside:.4f} nats, "
        f"{result.mean_inside / math.log(2):.4f} bits"
    )
    if result.mean_past is None:
        lines.append(f"no position past the trained length: give --length above {trained} to see some")
    else:
        lines.append(
            f"mean past it (positions {trained}-{result.length - 1}): {result.mean_past:.4f} nats, "
            f"{result.mean_past / math.log(2):.4f} bits ({result.mean_past - result.mean_inside:+.4f} nats)"
        )
    return lines


def _span(span: range) -> str:
    return str(span.start) if len(span) == 1 else f"{span.start}-{span.stop - 1}"
