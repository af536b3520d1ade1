"""What `minigpt explore`'s page asks, answered by the library: the page draws, this computes.

    trace(request)        Run.trace's own JSON (what `minigpt trace --json [--compare]` prints); with
                          "views": true also every block's whole attention matrices and each row's norm
    next_tokens(request)  the next-token distribution at the traced position, reshaped by sampling's own
                          `next_token_distribution` (temperature, top-k, top-p) from the traced logits
    step(request)         the token `minigpt sample -n 1` would append (greedy, or seeded), by `generate`

Every number the page shows comes from here; the page does no arithmetic on them. Refusals are
`MinigptError`s naming the request's fields as the Python API names its arguments. The model and
its recorder are not shared between threads: the caller holds one lock around each answer.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Any

import torch

from ..api import SAMPLE_SETTINGS, Run
from ..config import SampleConfig, updated
from ..device import use_threads
from ..errors import MinigptError, parameter
from ..inspection.trace import Comparison, Trace, row_norm, tokens_to_trace
from ..model import stages
from ..sampling.generate import generate, next_token_distribution

BARS = 12  # next-token candidates drawn as bars
CACHED_LOGITS = 16  # traced logit rows kept, so moving a sampling slider does not trace again


class Explorer:
    def __init__(self, run: Run):
        self.run = run
        self._logits: OrderedDict[str, tuple[torch.Tensor | None, torch.Tensor]] = OrderedDict()

    # ------------------------------------------------------------ what the page draws first

    def model_info(self) -> dict[str, Any]:
        cfg, s = self.run.model.cfg, self.run.cfg.sample
        return {
            "run": str(self.run.path),
            **self.run.model.architecture(),
            "writable": min(self.run.tokenizer.vocab_size, self.run.model.vocab_size),
            # the page's skip connections and scale controls, from the names the model computes (stages.py);
            # the order of the stages the page reads from the trace's own `stages`, in computation order
            "residual_adds": stages.RESIDUAL_ADDS.get(cfg.norm_position, {}),
            "scalable": list(stages.SCALABLE),
            # The page's sampling controls start where `minigpt sample` starts for this run.
            "sample": asdict(s),
            "bars": BARS,
            "prompt": self.first_prompt(),
        }

    def first_prompt(self) -> str:
        """What the page traces first: "ROMEO:" where the tokenizer can write it, else the first
        tokens of the vocabulary (a teaching model's a, b, c)."""
        tokenizer = self.run.tokenizer
        if not tokenizer.unknown_characters("ROMEO:"):
            return "ROMEO:"
        return tokenizer.decode(list(range(min(3, self.run.model.vocab_size))))

    # ------------------------------------------------------------ the trace

    def trace(self, request: Any) -> dict[str, Any]:
        arguments = _trace_arguments(request)
        views = request.get("views", False)
        if not isinstance(views, bool):
            raise MinigptError("views {views!r} must be true or false", views=views)
        result = self.run.trace(**arguments)
        self._remember(arguments, result)
        out = result.as_dict()
        if views:
            out["views"] = _views(result)
        return out

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
            self._remember(arguments, self.run.trace(**arguments))
        before, after = self._logits[key]
        out = self._distribution(after, s)
        if before is not None:
            out["before"] = self._distribution(before, s)
        return out

    def _distribution(self, logits: torch.Tensor, s: SampleConfig) -> dict[str, Any]:
        logits = logits[: self.run.tokenizer.vocab_size]  # a padded model's extra rows are never drawn
        shaped = next_token_distribution(logits, s.temperature, s.top_k, s.top_p)
        plain = next_token_distribution(logits)
        order = torch.sort(logits, descending=True, stable=True).indices[:BARS].tolist()
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
        if len(ids) >= model.context:
            raise MinigptError(
                "the prompt has {n_ids} tokens and fills the position table ({given} rows): the next "
                "token would stand at position {given}, which the model has no row for; shorten the "
                "prompt",
                n_ids=len(ids),
                given=model.context,
            )
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

    def _sample_settings(self, request: dict[str, Any]) -> SampleConfig:
        """The run's [sample] section with the [sample] keys the request names (its `prompt` is the
        text traced, not a setting), each checked as `sample` checks it."""
        given = {key: request[key] for key in SAMPLE_SETTINGS if request.get(key) is not None}
        return updated(self.run.cfg, {"sample": given}).sample


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
    at_position = request.get("at_position", False)
    if not isinstance(at_position, bool):
        raise MinigptError("{at_position} {given!r} must be true or false", given=at_position)
    return {
        "prompt": text,
        "ids": ids,
        "position": position,
        "scale": _strings(request, "scale"),
        "replace_residual": _strings(request, "replace_residual"),
        "ablate_head": _strings(request, "ablate_head"),
        "set_input": set_input,
        "at_position": at_position,
    }


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
    GPT-2's 12 x 12 x 64 x 64 weights stay a few megabytes; and every row's norm, for each pass."""
    shown = result.after if isinstance(result, Comparison) else result
    passes = {"before": result.before, "after": result.after} if isinstance(result, Comparison) else {"after": result}
    return {
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
        "position_row": row_norm(trace.input.position_row),
        "blocks": [
            {"input": row_norm(block.input.row), **{name: row_norm(row) for name, row in block.stages.items()}}
            for block in trace.blocks
        ],
        "final_norm": row_norm(trace.final_norm.row),
    }
