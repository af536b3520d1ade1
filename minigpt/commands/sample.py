"""`minigpt sample`: open a run, continue a prompt, print the text as it is produced.

One sample streams to stdout as it is produced (prompt first); several are printed when done, each
under a `--- sample i ---` header; `--json` prints one JSON object per sample instead. A one-line
summary goes to stderr in text mode. The sampling itself is the API's (`Run.samples`).
"""

from __future__ import annotations

import json
import sys

from .. import api
from ..errors import MinigptError, as_flag
from .common import opened, user_errors
from .options_read import SampleOptions


def main(o: SampleOptions) -> None:
    with user_errors():
        if o.prompt is not None and o.prompt_file is not None:
            raise MinigptError("{prompt} and {prompt_file} were both given; pass the prompt one way")
        run = opened(o)
        settings = {key: value for key, value in o.config_values()["sample"].items() if key != "prompt"}
        prompt = (
            api.read_prompt(o.prompt_file)
            if o.prompt_file is not None
            else o.prompt
            if o.prompt is not None
            else run.cfg.sample.prompt
        )
        stream = not o.as_json
        results = run.samples(prompt, on_text=_write if stream else None, use_cache=o.kv_cache, **settings)
    if o.as_json:
        for i, result in enumerate(results, 1):
            _write(json.dumps(result.to_json(i), ensure_ascii=False) + "\n")
        _note_past(run, results)  # said even with --json (where each sample also says it)
        return
    if len(results) == 1:
        _write("" if results[0].text.endswith("\n") else "\n")
    else:
        for i, result in enumerate(results, 1):
            _write(f"--- sample {i} ---\n{result.text}{'' if result.text.endswith(chr(10)) else chr(10)}")
    _note_past(run, results)
    total = sum(len(r.token_ids) for r in results)
    seconds = max(r.seconds for r in results)
    reasons = ", ".join(dict.fromkeys(r.stop_reason for r in results))
    note = f" ({_filled(run)}; drop --no-slide to continue with a sliding window)" if "context_limit" in reasons else ""
    sys.stderr.write(
        f"minigpt: {len(results)} sample{'s' if len(results) > 1 else ''}, {total} new tokens in "
        f"{seconds:.2f} s ({total / seconds if seconds > 0 else 0.0:.1f} tokens/s); "
        f"stopped: {reasons}{note}\n"
    )
    sys.stderr.flush()


def _filled(run) -> str:
    """What the text filled when --no-slide stopped it: a learned table's rows, or the length the
    model reads at once (the length it was trained at, or what --rope-scaling stretches that to)."""
    reading = run.model.reading
    if run.model.cfg.positions == "learned":
        return f"the text fills the {reading.window}-row position table"
    if reading.user_rule is not None:
        return f"the text fills the {reading.window} tokens --rope-scaling {reading.user_rule} lets the model read"
    return f"the text reaches the {reading.window} tokens the model was trained at ([model] context)"


def _note_past(run, results) -> None:
    """One line on stderr when the text was read past the length the model was trained at: what
    followed came from positions it never trained on."""
    past = max((r for r in results if r.past_trained_length), key=lambda r: r.longest_read, default=None)
    if past is not None:
        note = run.model.reading.past_note("read", f"up to {past.longest_read} tokens at once")
        sys.stderr.write(f"minigpt: note: {note.render(as_flag)}\n")


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()
