"""What `minigpt explore`'s page asks, answered by the library: the page draws, this computes.

    trace(request)        Run.trace's own JSON (what `minigpt trace --json [--compare]` prints); with
                          "views": true also every block's whole attention matrices and each row's norm;
                          with "patch" the traced prompt with one activation of the clean prompt's pass
                          put back (Run.trace's `patch`: a patching cell, traced); with "grad": true the
                          gradient of the traced position's next-token loss (or "target"'s) at every stage;
                          with "compare_run": true the run the server was given to compare with, before,
                          and this run, after (`minigpt trace --compare-run DIR --json`)
    next_tokens(request)  the next-token distribution at the traced position, reshaped by sampling's own
                          `next_token_distribution` (temperature, top-k, top-p) from the traced logits
    step(request)         the token `minigpt sample -n 1` would append (greedy, or seeded), by `generate`
    patch(request)        Run.patch's own JSON (what `minigpt patch --json` prints): the clean prompt's
                          activations put back into the corrupt run one at a time, by stage or by head

Every number the page shows comes from here; the page does no arithmetic on them. Refusals are
`MinigptError`s naming the request's fields as the Python API names its arguments. The model and
its recorder are not shared between threads: the caller holds one lock around each answer.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch

from ..api import SAMPLE_SETTINGS, Run
from ..config import SampleConfig, updated
from ..device import use_threads
from ..errors import MinigptError, parameter
from ..inspection import interventions_apply as edits
from ..inspection.attribution import check_decomposable, check_patch_attributable, resolve_token
from ..inspection.comparison import Comparison, row_norm
from ..inspection.depth_reads import model_readers
from ..inspection.interventions import ReplaceResidual
from ..inspection.legend_text import positions_note
from ..inspection.patching import patched_stages
from ..inspection.text_format import show_token
from ..inspection.trace import Trace
from ..inspection.trace_input import tokens_to_trace
from ..model import stages
from ..sampling.generate import generate, next_token_distribution

BARS = 12  # next-token candidates drawn as bars
CACHED_LOGITS = 16  # traced logit rows kept, so moving a sampling slider does not trace again


class Explorer:
    def __init__(self, run: Run, compared: Run | None = None):
        """`compared`: a run of `run`'s shape and tokenizer (Run.comparison_run) that a request's
        "compare_run": true traces beside it."""
        self.run, self.compared = run, compared
        self._logits: OrderedDict[str, tuple[torch.Tensor | None, torch.Tensor]] = OrderedDict()

    # ------------------------------------------------------------ what the page draws first

    def model_info(self) -> dict[str, Any]:
        cfg, s = self.run.model.cfg, self.run.cfg.sample
        return {
            "run": str(self.run.path),
            "compare_run": None if self.compared is None else str(self.compared.path),
            **self.run.model.architecture(),
            # where positions enter, for the diagram: the input (a learned table), attention (rope, alibi) or nowhere
            "positions_enter": positions_enter(self.run.model.architecture()),
            # Attention Residuals: where each sublayer mixes over depth (null: a residual stream or none)
            "depth": depth_mixing(self.run.model.architecture()),
            # the longest text the model reads as the server was started (null: any, --extrapolate)
            "window": self.run.model.window,
            "writable": min(self.run.tokenizer.vocab_size, self.run.model.vocab_size),
            # the page's skip connections and scale controls, from the names the model computes (stages.py);
            # the order of the stages the page reads from the trace's own `stages`, in computation order
            "residual_adds": stages.residual_adds(**stages.of(cfg), residual=cfg.residual),
            "scalable": [stage for stage in stages.SCALABLE if stage != stages.FFN or cfg.ffn_hidden > 0],
            # why the page's "replace instead of add" has nothing to replace, in the library's words (null: it has)
            "refused_replacing": _refusal(lambda: edits.check([ReplaceResidual(None)], self.run.model)),
            # The page's sampling controls start where `minigpt sample` starts for this run.
            "sample": asdict(s),
            "bars": BARS,
            "prompt": self.first_prompt(),
            # a task or pairs run: the example format a prompt should follow ("" for a text)
            "trained_on": self.run.example_format,
            # Attribution and patching split a residual-stream sum: the page says why not, in the library's words.
            "attribution": {
                "refused": _refusal(lambda: check_decomposable(self.run.model)),
                "refused_replacing": _refusal(lambda: check_decomposable(self.run.model, [ReplaceResidual(None)])),
                # by the stage a patch puts back, at the positions it puts it back (null: the sum stays exact)
                "refused_patching": {
                    stage: _refusal(lambda stage=stage: check_patch_attributable(stage))
                    for stage in (*patched_stages(self.run.cfg.model), stages.HEADS)
                },
            },
        }

    def first_prompt(self) -> str:
        """What the page traces first: a task's held-out prompt, "ROMEO:" where the tokenizer can
        write it, else the first tokens of the vocabulary (a teaching model's a, b, c)."""
        tokenizer = self.run.tokenizer
        if self.run.trained_on != "text":  # a task or pairs run: its first held-out prompt
            return self.run.first_held_out_prompt
        if not tokenizer.unknown_characters("ROMEO:"):
            return "ROMEO:"
        return tokenizer.decode(list(range(min(3, self.run.model.vocab_size))))

    # ------------------------------------------------------------ the trace

    def trace(self, request: Any) -> dict[str, Any]:
        arguments = _trace_arguments(request)
        views = request.get("views", False)
        if not isinstance(views, bool):
            raise MinigptError("views {views!r} must be true or false", views=views)
        result = self._traced(arguments)
        self._remember(arguments, result)
        out = result.as_dict()
        if views:
            out["views"] = _views(result)
        return out

    def _traced(self, arguments: dict[str, Any]) -> Trace | Comparison:
        """Run.trace of a request's arguments, its "compare_run": true the run given to compare with."""
        if arguments["compare_run"] and self.compared is None:
            raise MinigptError("{compare_run:on}: this server was started without a run to compare with")
        return self.run.trace(**{**arguments, "compare_run": self.compared if arguments["compare_run"] else None})

    def _remember(self, arguments: dict[str, Any], result: Trace | Comparison) -> None:
        """The traced position's logits of both passes, for the distribution requests that follow."""
        before, after = (result.before, result.after) if isinstance(result, Comparison) else (None, result)
        key = json.dumps(arguments, sort_keys=True)
        self._logits[key] = (None if before is None else before.stage(None, "logits"), after.stage(None, "logits"))
        self._logits.move_to_end(key)
        while len(self._logits) > CACHED_LOGITS:
            self._logits.popitem(last=False)

    # ------------------------------------------------------------ the next token

    def next_tokens(self, request: Any) -> dict[str, Any]:
        """The BARS most likely next tokens (by logit; ties: lower id first) with their probability
        under `next_token_distribution(logits, temperature, top_k, top_p)`, sampling's own code, and
        at temperature 1 unfiltered; over the ids the tokenizer can write, as sampling draws them."""
        arguments = _trace_arguments(request)
        s = self._sample_settings(request)
        key = json.dumps(arguments, sort_keys=True)
        if key not in self._logits:
            self._remember(arguments, self._traced(arguments))
        before, after = self._logits[key]
        out = self._distribution(after, s)
        if before is not None:
            out["before"] = self._distribution(before, s)
        return out

    def _distribution(self, logits: torch.Tensor, s: SampleConfig) -> dict[str, Any]:
        logits = logits[: self.run.tokenizer.vocab_size]  # a padded model's extra rows are never drawn
        shaped = next_token_distribution(logits, s.temperature, s.top_k, s.top_p)
        plain = next_token_distribution(logits)
        order = _ranked(logits)[:BARS].tolist()
        tokens = self.run.tokenizer
        return {
            "candidates": [
                {
                    "id": i,
                    "token": tokens.token_text(i),
                    "probability": float(shaped[i]),
                    "unfiltered": float(plain[i]),
                    "logit": float(logits[i]),
                }
                for i in order
            ],
            "kept": int((shaped > 0).sum()),  # tokens the filters leave to draw from
            "of": len(logits),
        }

    def step(self, request: Any) -> dict[str, Any]:
        """The token `minigpt sample --greedy -n 1` (or `--seed S -n 1`, with the request's temperature,
        top-k and top-p) appends to these tokens: `generate`, sampling's own loop, for one step, with a
        generator seeded as `sample` seeds it. Sampling uses the unmodified model, as `sample` does."""
        if not isinstance(request, dict):
            raise MinigptError("the request must be a JSON object")
        s = self._sample_settings(request)
        ids = _token_ids(self.run, request)
        model = self.run.model
        if model.cfg.positions == "learned" and len(ids) >= model.context:
            raise MinigptError(
                "the prompt has {n_ids} tokens and fills the position table ({given} rows): the next "
                "token would stand at position {given}, which the model has no row for; shorten the "
                "prompt",
                n_ids=len(ids),
                given=model.context,
            )
        # rope, alibi, none: the next token's text must still be one the model reads as it is read
        model.check_length(len(ids) + 1, "the prompt with its next token", "shorten the prompt")
        use_threads(self.run.cfg.train.threads or 1)  # as `sample` runs one sample
        model.eval()
        one = replace(s, max_new_tokens=1, num_samples=1)
        chosen = next(iter(generate(model, ids, one, writable=self.run.tokenizer.vocab_size)))
        token = int(chosen.tokens[0])
        return {
            "ids": [*ids, token],
            "id": token,
            "token": self.run.tokenizer.token_text(token),
            "probability": float(chosen.probs[0]),
            "text": self.run.tokenizer.decode([*ids, token]),
            "greedy": s.greedy,
            "seed": s.seed,
        }

    # ------------------------------------------------------------ patching

    def patch(self, request: Any) -> dict[str, Any]:
        """Run.patch's answer for {"clean", "corrupt" (texts or lists of ids), "answer", "versus"
        (a token's text, "#ID" or an id), "by"}. A missing answer is the clean prompt's likeliest
        next token, a missing versus the corrupt prompt's likeliest other than the answer (the
        unmodified model, at the last position, over the ids the tokenizer writes). Beside it,
        `spelled`: each token as the page's boxes show it, its text where that is the token, else #ID."""
        if not isinstance(request, dict):
            raise MinigptError("the request must be a JSON object")
        clean, corrupt = _prompt_field(request, "clean"), _prompt_field(request, "corrupt")
        answer, versus = _token_field(request, "answer"), _token_field(request, "versus")
        by = request.get("by", "stage")
        if not isinstance(by, str):
            raise MinigptError('{by} {given!r} must be "stage" or "head"', given=by)
        if answer is None and clean is not None:
            answer = self._likeliest(clean, "clean")
        if versus is None and corrupt is not None and answer is not None:
            versus = self._likeliest(corrupt, "corrupt", unless=self._token_id(answer, "answer"))
        result = self.run.patch(clean=clean, corrupt=corrupt, answer=answer, versus=versus, by=by)
        return {
            **result.as_dict(),
            "spelled": {"answer": self._spelled(result.answer_id), "versus": self._spelled(result.versus_id)},
        }

    def _likeliest(self, prompt: str | list[int], name: str, unless: int | None = None) -> int | None:
        """The id of the prompt's likeliest next token other than `unless`, a refusal on the way
        naming the request's field the prompt came from."""
        given = {"prompt": prompt} if isinstance(prompt, str) else {"ids": prompt}
        try:
            logits = self.run.trace(**given, compare=False).stage(None, "logits")
        except MinigptError as exc:
            raise MinigptError("{what}: {reason}", what=parameter(name), reason=exc) from None
        return next((i for i in _ranked(logits[: self.run.tokenizer.vocab_size])[:2].tolist() if i != unless), None)

    def _token_id(self, token: str | int, name: str) -> int:
        """A token as Run.patch reads it (an int is an id), refused as it refuses it."""
        text = f"#{token}" if isinstance(token, int) else token
        return resolve_token(self.run.tokenizer, text, parameter(name), self.run.model.vocab_size)

    def _spelled(self, token: int) -> str:
        """The token's text where a box shows it as it is (no space or newline at an end, nothing
        unprintable) and it encodes to that token alone; else #ID."""
        text = self.run.tokenizer.token_text(token)
        if not text.isprintable() or text != text.strip():
            return f"#{token}"
        try:
            return text if self.run.tokenizer.encode(text, special=False) == [token] else f"#{token}"
        except MinigptError:  # a char tokenizer's unknown character: the id alone names it
            return f"#{token}"

    def _sample_settings(self, request: dict[str, Any]) -> SampleConfig:
        """The run's [sample] section with the [sample] keys the request names (its `prompt` is the
        text traced, not a setting), each checked as `sample` checks it."""
        given = {key: request[key] for key in SAMPLE_SETTINGS if request.get(key) is not None}
        return updated(self.run.cfg, {"sample": given}).sample


# ---------------------------------------------------------------- the model as built


def positions_enter(model: dict[str, Any]) -> dict[str, Any]:
    """Where positions enter the model (`[model] positions`), as the page's diagram draws it: `at`
    "input" (a learned table's row added to the token row before block 0), "attention" (rope turns
    the queries and keys, alibi biases the scores) or None (none: no position enters; only the
    causal mask tells positions apart); `label`, the few words drawn there; `about`, a sentence."""
    scheme = model["positions"]
    if scheme in ("learned", "sinusoidal"):
        kind = "learned positions" if scheme == "learned" else "sinusoidal positions (fixed, not learned)"
        about = f"{kind}: a position row added to the token row before block 0"
        return {"at": "input", "label": "+ position row", "about": about}
    if scheme in ("rope", "alibi", "t5"):
        label = "rotate Q, K" if scheme == "rope" else "bias on the scores"
        return {"at": "attention", "label": label, "about": positions_note(model, "the trace JSON")}
    about = "no positions: no position table, and only the causal mask tells positions apart"
    return {"at": None, "label": None, "about": about}


def depth_mixing(model: dict[str, Any]) -> dict[str, Any] | None:
    """Attention Residuals (`[model] residual = "attention"`), as the page's diagram draws it: `at`,
    the stages that mix over depth (read1, read2); `label`, the few words drawn under them; `about`,
    a sentence; `layers`, `groups` and `per_group`, how the sublayers are summed (groups of one: the
    full form); `readers`, each read's layer, sublayer and sources (depth_reads.py). None for a
    model with a residual stream, or without one."""
    readers = model_readers(model)
    if not readers:
        return None
    layers = len(readers) - 1
    groups = model.get("attention_residual_blocks") or layers
    per_group = layers // groups
    grouped = (
        "every earlier sublayer's output"
        if per_group == 1
        else f"the sums of {groups} groups of {per_group} sublayers (Block AttnRes)"
    )
    return {
        "at": [stages.READ1, stages.READ2] if model["ffn_hidden"] > 0 else [stages.READ1],
        "label": "mix over depth",
        "about": (
            f"Attention Residuals: each of the {layers} sublayers reads a softmax-weighted mix of the embedding and "
            f"{grouped}, by a learned query of its own; the final norm reads one too"
        ),
        "layers": layers,
        "groups": groups,
        "per_group": per_group,
        "readers": [
            {"layer": r.layer, "reader": r.reader, "stage": r.weights, "sources": list(r.sources)} for r in readers
        ],
    }


# ---------------------------------------------------------------- requests


def _trace_arguments(request: Any) -> dict[str, Any]:
    """Run.trace's keyword arguments from a request, each checked for its JSON type."""
    if not isinstance(request, dict):
        raise MinigptError("the request must be a JSON object")
    text, ids, position = request.get("prompt"), request.get("ids"), request.get("position")
    if text is not None and not isinstance(text, str):
        raise MinigptError("{prompt} {text!r} must be a string", text=text)
    if ids is not None and not (isinstance(ids, str) or _integers(ids)):
        raise MinigptError('{ids} {given!r} must be a list of integers or a string such as "3,1,4"', given=ids)
    if position is not None and (not isinstance(position, int) or isinstance(position, bool)):
        raise MinigptError("{position} {given!r} is not an integer", given=position)
    set_input = request.get("set_input") or None
    if set_input is not None and not isinstance(set_input, str):
        raise MinigptError('{set_input} {given!r} must be a string such as "2,2,2,2"', given=set_input)
    at_position, grad = request.get("at_position", False), request.get("grad", False)
    compare_run = request.get("compare_run", False)
    for name, value in (("at_position", at_position), ("grad", grad), ("compare_run", compare_run)):
        if not isinstance(value, bool):
            raise MinigptError("{parameter} {given!r} must be true or false", parameter=parameter(name), given=value)
    patch = request.get("patch")  # its fields are Run.trace's to check
    if patch is not None and not isinstance(patch, dict):
        raise MinigptError(
            'patch {given!r} must be an object {{"clean", "block", "stage", "position", "head"}} or null', given=patch
        )
    return {
        "prompt": text,
        "ids": ids,
        "position": position,
        "scale": _strings(request, "scale"),
        "replace_residual": _strings(request, "replace_residual"),
        "ablate_head": _strings(request, "ablate_head"),
        "set_input": set_input,
        "at_position": at_position,
        "attribute": _token_field(request, "attribute"),
        "versus": _token_field(request, "versus"),
        "patch": patch,
        "grad": grad,
        "target": _token_field(request, "target"),
        "compare_run": compare_run,
    }


def _token_field(request: dict[str, Any], key: str) -> str | int | None:
    """A token as Run.trace and Run.patch take it: its text, "#ID" or an id; null or "" is none."""
    value = request.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise MinigptError(
            '{parameter} {given!r} must be a token\'s text, "#ID" or an integer id',
            parameter=parameter(key),
            given=value,
        )
    return value


def _prompt_field(request: dict[str, Any], key: str) -> str | list[int] | None:
    """A patching prompt: a text, or a list of token ids (what the page traces after a step); an
    empty one is missing, as Run.patch says."""
    value = request.get(key)
    if value is not None and not (isinstance(value, str) or _integers(value)):
        raise MinigptError(
            "{parameter} {given!r} must be a string or a list of integers", parameter=parameter(key), given=value
        )
    return value or None


def _ranked(logits: torch.Tensor) -> torch.Tensor:
    """Ids by logit, likeliest first; ties: lower id first."""
    return torch.sort(logits, descending=True, stable=True).indices


def _refusal(check: Callable[[], None]) -> str | None:
    """What `check` refuses, in the API's words (None: nothing)."""
    try:
        check()
    except MinigptError as exc:
        return str(exc)
    return None


def _integers(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _strings(request: dict[str, Any], key: str) -> list[str]:
    value = request.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MinigptError('{parameter} must be a list of strings, e.g. ["0.attention=0"]', parameter=parameter(key))
    return value


def _token_ids(run: Run, request: dict[str, Any]) -> list[int]:
    arguments = _trace_arguments(request)
    return tokens_to_trace(run.tokenizer, arguments["prompt"], arguments["ids"])


# ---------------------------------------------------------------- what the page draws beside the trace


def _views(result: Trace | Comparison) -> dict[str, Any]:
    """The shown pass's whole attention matrices ([head][query][key] per block, the future's cells
    zero) as the model's own float32 or float64 bytes, so every weight reaches the page exactly and
    GPT-2's 12 x 12 x 64 x 64 weights stay a few megabytes; every row's norm, for each pass; and the
    traced token as the trace command's header names it, for the page's titles."""
    shown = result.after if isinstance(result, Comparison) else result
    passes = {"before": result.before, "after": result.after} if isinstance(result, Comparison) else {"after": result}
    p = shown.position
    return {
        # The traced token named as `minigpt trace` names it, quoted, with its id: a bare "?" or
        # "," in the page's titles read as "unknown" or as punctuation of the title itself.
        "traced_token": f"token {show_token(shown.tokens[p])}, id {shown.ids[p]}",
        "attention": [_packed(shown.whole(block.index, stages.ATTENTION_WEIGHTS)) for block in shown.blocks],
        "norms": {name: _norms(trace) for name, trace in passes.items()},
    }


def _packed(weights: torch.Tensor) -> dict[str, Any]:
    wide = weights.dtype == torch.float64
    array = weights.detach().cpu().to(torch.float64 if wide else torch.float32).contiguous().numpy()
    # Little-endian, as every browser's typed arrays are on the machines that run one.
    data = array.astype("<f8" if wide else "<f4", copy=False).tobytes()
    return {
        "dtype": "float64" if wide else "float32",
        "shape": list(array.shape),
        "data": base64.b64encode(data).decode(),
    }


def _norms(trace: Trace) -> dict[str, Any]:
    """The Euclidean norm of every row the trace shows (math.fsum of the squares, as --compare's)."""
    return {
        "token_row": row_norm(trace.input.token_row),
        "position_row": row_norm(trace.input.position_row) if trace.input.position_row is not None else None,
        "blocks": [
            {
                # Attention Residuals: no one row enters a block past the first
                **({} if block.input is None else {"input": row_norm(block.input.row)}),
                **{name: row_norm(row) for name, row in block.stages.items()},
            }
            for block in trace.blocks
        ],
        **({} if trace.final_read is None else {"final_read": row_norm(trace.final_read.row)}),
        "final_norm": row_norm(trace.final_norm.row),
    }
