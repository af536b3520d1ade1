"""`minigpt trace`: open a run, follow one position through every block, print tables or JSON; or,
with --feed, run one part on the user's own numbers."""

from __future__ import annotations

import json
from dataclasses import replace

import typer

from ..api import Comparison, Trace, TraceRequest
from ..errors import MinigptError, as_flag, parameter
from ..inspection.comparison_text import render_comparison
from ..inspection.feed_text import render_feed
from ..inspection.text_format import check_digits
from ..inspection.trace_text import render_text
from ..inspection.why_text import render_attribution, render_attribution_pair
from .common import (
    check_png,
    compare_run_given,
    opened,
    say,
    say_notes,
    shown_path,
    user_errors,
)
from .options_inspect import TraceOptions


def main(o: TraceOptions) -> None:
    with user_errors():
        check_digits(o.digits)
        check_png(o.png, "png", o.force)  # before the model is read
        if o.feed:
            _feed(o)
            return
        run = opened(o)
        request = replace(TraceRequest.from_options(o), compare_run=compare_run_given(run, o.compare_run))
        result = run.trace(request)
        say_notes(run.notes)  # a compared run's learner's file
        _note_past(run, result.after if isinstance(result, Comparison) else result)
        if isinstance(result, Comparison):
            if o.png is not None and result.after.attribution is None:  # nothing to draw: refused, not ignored
                raise MinigptError(
                    "{png} draws a comparison of two passes only as its attribution's parts; add {attribute} TOKEN, "
                    "or leave out {png}"
                )
            if o.png is not None:
                _save(result.after, o.png, o.force)
            text = render_comparison(_folders_shown(result), digits=o.digits)
            if result.after.attribution is not None:
                text += "\n\n" + "\n".join(
                    render_attribution_pair(result.before.attribution, result.after.attribution, digits=o.digits)
                )
            typer.echo(result.to_json() if o.as_json else text)
            return
        if o.png is not None:
            _save(result, o.png, o.force)
        text = render_text(result, digits=o.digits)
        if not o.as_json and run.example_format:  # a task run: the example format the prompt should follow
            text = f"trained on {run.example_format}\n" + text
        if result.attribution is not None:
            text += "\n\n" + "\n".join(render_attribution(result.attribution, digits=o.digits))
        typer.echo(result.to_json() if o.as_json else text)


# What a trace takes that a fed part has no use for: --feed runs a part alone, on the numbers given.
TRACE_ONLY = (*(name for name in TraceRequest.fields() if name != "top"), "png", "force")


def _feed(o: TraceOptions) -> None:
    """--feed: each part run on its row, every step shown (one JSON list with --json)."""
    # a flag left out is None, False or an empty list (`--position 0` is given: 0 is not False here)
    given = [n for n in TRACE_ONLY if (v := getattr(o, n, None)) is not None and v is not False and v not in ([], ())]
    if given:
        raise MinigptError(
            "{feed} runs one part on the numbers given, with no prompt and no pass to trace; leave out {given}, "
            "or trace without {feed}",
            given=parameter(given[0]),
        )
    run = opened(o)
    fed = [run.feed(text) for text in o.feed]
    if o.as_json:
        typer.echo(json.dumps([item.as_dict() for item in fed]))
    else:
        typer.echo("\n\n".join(render_feed(item, digits=o.digits) for item in fed))


def _note_past(run, result: Trace) -> None:
    """One line on stderr when the traced position lies past the length the model was trained at
    (its --json says so too): what it shows there comes from positions the model never trained on."""
    if result.past_trained_length:
        note = run.model.reading.past_note("traced", f"position {result.position} of {len(result.ids)} tokens")
        say(f"minigpt: note: {note.render(as_flag)}")


def _folders_shown(result: Comparison) -> Comparison:
    """Two runs compared: their folders in the text as the user would type them here (the JSON
    keeps them whole)."""
    if result.compared_run is None:
        return result
    return replace(result, run=shown_path(result.run), compared_run=shown_path(result.compared_run))


def _save(result: Trace, path, force: bool) -> None:
    """--png: the attribution's parts as bars when one was asked for, else the attention weights."""
    from ..inspection.plot import attention_figure, attribution_figure, save_png

    figure = attribution_figure(result.attribution) if result.attribution else attention_figure(result)
    save_png(figure, path, "png", force=force)
