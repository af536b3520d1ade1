"""One part of the model fed one row of the learner's own numbers, with every step shown: the FFN
(chapter 17.4: x W1 + b1, the activation, hidden W2 + b2) or a norm (chapter 17.3: mean, variance,
the denominator, the normalised row, gain and bias). For checking a calculation by hand, as the
chapter's exercises 2 and 4 ask.

The part is the model's own module, called on a [1, 1, C] tensor: no second implementation of it.
The FFN's steps are recorded inside that module as it computes them (its `pre_activation` kept by a
Recorder, its `hidden` recorded). A norm's module is one fused kernel with no steps to record, so
its steps are the chapter's formula, worked here in float64 from the module's own gain, bias and
epsilon; the last row is the module's output, and the formula's result is checked against it
(`agrees`; a module that computes something else, a learner's own, is said to differ).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..errors import MinigptError, Phrase
from ..model import stages
from ..model.gpt import MiniGPT
from ..model.layers import FeedForward
from ..model.recorder import Recorder

NORMS = (stages.NORM1, stages.NORM2)
PARTS = (stages.NORM1, stages.NORM2, stages.FFN)  # a block's parts that take one row; and final_norm
MODULE, FORMULA = "module", "formula"  # who computed a step


@dataclass
class Step:
    """One line of a fed part: what it is, how it is computed (in the chapter's names), its value,
    and who computed it: the module (recorded as it ran) or the chapter's formula (worked here)."""

    name: str
    formula: str
    value: list[float] | float
    computed_by: str


@dataclass
class Fed:
    """A part of the model fed one row: `part` ("blocks.0.ffn", "final_norm"), what it is (`kind`:
    ffn, layernorm, rmsnorm, none), the row given, each step, and the module's output (the last
    step). `agrees`: the formula's steps end in the module's output (None where nothing is worked
    by formula: the FFN, whose steps are all the module's)."""

    part: str
    kind: str
    eps: float | None  # a norm's epsilon (None: the FFN)
    given: list[float]
    steps: list[Step]
    output: list[float]
    agrees: bool | None = None
    difference: float | None = None  # the largest |formula - module| where they disagree

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


def parse_feed(text: str) -> tuple[str, list[float]]:
    """`PART=NUMBERS` ("0.ffn=1,-1", "final_norm=1,3") -> ("0.ffn", [1.0, -1.0])."""
    part, sep, numbers = text.partition("=")
    if not sep or not part.strip():
        raise MinigptError(
            "{feed} {text!r}: expected PART=NUMBERS, e.g. {feed} 0.ffn=1,-1 or {feed} 0.norm1=2,4 (PART: "
            "B.norm1, B.norm2, B.ffn or final_norm)",
            text=text,
        )
    return part.strip(), _numbers(numbers, Phrase("{feed} {text}", text=text))


def _numbers(text: str, where: Phrase) -> list[float]:
    out = []
    for piece in text.split(","):
        try:
            out.append(float(piece.strip()))
        except ValueError:
            raise MinigptError("{where}: {piece!r} is not a number", where=where, piece=piece.strip()) from None
    return out


def feed(model: MiniGPT, part: str, row: Sequence[float] | str) -> Fed:
    """`part` ("B.ffn", "B.norm1", "B.norm2", "final_norm") run on `row` (C numbers, or "1,-1")."""
    where = Phrase("{feed} {part}", part=part)
    row = _numbers(row, where) if isinstance(row, str) else [float(v) for v in row]
    name, module, block = _module(model, part)
    width = model.cfg.n_embd
    if len(row) != width:
        raise MinigptError(
            "{where}: {n_row} numbers but the model's width is {width}; give exactly {width} comma-separated numbers",
            where=where,
            n_row=len(row),
            width=width,
        )
    if not all(math.isfinite(v) for v in row):
        raise MinigptError("{where}: every number must be finite", where=where)
    weight = model.token_table.weight
    x = torch.tensor([[row]], dtype=weight.dtype, device=weight.device)  # [1, 1, C]: one example, one position
    was_training = module.training
    module.eval()
    try:
        with torch.inference_mode():
            if name == stages.FFN:
                return _ffn(model, module, block, x, row)
            return _norm(model, module, name, block, x, row)
    finally:
        module.train(was_training)


def _module(model: MiniGPT, part: str) -> tuple[str, torch.nn.Module, int | None]:
    """(the part's stage name, its module, its block) for "B.PART" or "final_norm"."""
    if part == stages.FINAL_NORM:
        return stages.FINAL_NORM, model.final_norm, None
    block, dot, name = part.partition(".")
    known = ", ".join(f"B.{p}" for p in PARTS) + f" or {stages.FINAL_NORM}"
    if not dot or name not in PARTS:
        raise MinigptError("{feed} {part}: not a part that takes one row; feed {known}", part=part, known=known)
    try:
        index = int(block)
    except ValueError:
        index = -1
    n_layer = len(model.blocks)
    if not 0 <= index < n_layer:
        raise MinigptError(
            "{feed} {part}: block {block!r} does not exist; the model has {n_layer} block(s), 0..{last}",
            part=part,
            block=block,
            n_layer=n_layer,
            last=n_layer - 1,
        )
    module = getattr(model.blocks[index], name, None)
    if module is None:  # ffn_hidden = 0: no norm2 and no ffn
        raise MinigptError(
            "{feed} {part}: this model has no FFN ([model] ffn_hidden = 0), so no {name}; feed {block}.norm1",
            part=part,
            name=name,
            block=index,
        )
    return name, module, index


def _ffn(model: MiniGPT, module: torch.nn.Module, block: int, x: torch.Tensor, row: list[float]) -> Fed:
    """The FFN's own forward, its x W1 + b1 kept and its hidden recorded by a Recorder."""
    cfg = model.cfg
    part = stages.block_name(block, stages.FFN)
    b1, b2 = (" + b1", " + b2") if cfg.bias else ("", "")
    steps = [Step("x", "the row given", row, "given")]
    if not isinstance(module, FeedForward):  # another module in the FFN's place: its output alone
        output = module(x)[0, 0].tolist()
        return Fed(part, "ffn", None, row, [*steps, Step(stages.FFN, "the module's output", output, MODULE)], output)
    kept: dict[str, torch.Tensor] = {}
    pre_name = stages.block_name(block, stages.PRE_ACTIVATION)

    def keep(value: torch.Tensor, recorded: dict[str, torch.Tensor]) -> torch.Tensor:
        kept[pre_name] = value.detach().clone()
        return value

    recorder = Recorder(cfg, {pre_name: keep})
    output = module(x, recorder.scoped(stages.block_prefix(block)))[0, 0].tolist()
    hidden = recorder[stages.block_name(block, stages.HIDDEN)][0, 0].tolist()
    pre = kept[pre_name][0, 0].tolist()
    if cfg.activation == "swiglu":
        pre_formula, hidden_formula = f"[gate | value] = x W1{b1}", "SiLU(gate) * value"
    else:
        pre_formula, hidden_formula = f"x W1{b1}", f"{cfg.activation}({stages.PRE_ACTIVATION})"
    steps += [
        Step(stages.PRE_ACTIVATION, pre_formula, pre, MODULE),
        Step(stages.HIDDEN, hidden_formula, hidden, MODULE),
        Step(stages.FFN, f"{stages.HIDDEN} W2{b2}", output, MODULE),
    ]
    return Fed(part, "ffn", None, row, steps, output)


def _norm(
    model: MiniGPT, module: torch.nn.Module, name: str, block: int | None, x: torch.Tensor, row: list[float]
) -> Fed:
    """The norm's own output, after chapter 17.3's formula worked step by step from its parameters."""
    cfg = model.cfg
    part = name if block is None else stages.block_name(block, name)
    output = module(x)[0, 0].tolist()
    steps = [Step("x", "the row given", row, "given")]
    kind = cfg.norm
    width = len(row)
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    gain = [1.0] * width if weight is None else weight.double().tolist()
    shift = [0.0] * width if bias is None else bias.double().tolist()
    eps = float(getattr(module, "eps", cfg.norm_eps))
    if kind == "none":  # the identity where a norm stands
        steps.append(Step(name, "x (no norm: the identity)", output, MODULE))
        return Fed(part, kind, None, row, steps, output, agrees=output == row, difference=None)
    if kind == "layernorm":
        mean = math.fsum(row) / width
        variance = math.fsum((v - mean) ** 2 for v in row) / width
        denominator = math.sqrt(variance + eps)
        normalised = [(v - mean) / denominator for v in row]
        steps += [
            Step("mean", f"sum(x) / {width}", mean, FORMULA),
            Step("variance", f"sum((x - mean)^2) / {width}", variance, FORMULA),
            Step("denominator", "sqrt(variance + eps)", denominator, FORMULA),
            Step("normalised", "(x - mean) / denominator", normalised, FORMULA),
        ]
    else:  # rmsnorm: no mean taken away
        square = math.fsum(v * v for v in row) / width
        denominator = math.sqrt(square + eps)
        normalised = [v / denominator for v in row]
        steps += [
            Step("mean square", f"sum(x^2) / {width}", square, FORMULA),
            Step("denominator", "sqrt(mean square + eps)", denominator, FORMULA),
            Step("normalised", "x / denominator", normalised, FORMULA),
        ]
    worked = [g * n + b for g, n, b in zip(gain, normalised, shift)]
    steps.append(Step("gamma", "the module's gain", gain, MODULE))
    if kind == "layernorm":
        steps.append(Step("beta", "the module's bias", shift, MODULE))
        steps.append(Step(name, "gamma * normalised + beta", output, MODULE))
    else:
        steps.append(Step(name, "gamma * normalised", output, MODULE))
    difference = max(abs(a - b) for a, b in zip(worked, output))
    # the module computes in the model's dtype: float32 rounds at about 1e-7 of the row's size
    tolerance = (1e-10 if x.dtype == torch.float64 else 1e-5) * max(1.0, *(abs(v) for v in worked))
    agrees = difference <= tolerance
    return Fed(part, kind, eps, row, steps, output, agrees=agrees, difference=None if agrees else difference)
