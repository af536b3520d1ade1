"""The checks of the `attention` exercise: causal multi-head attention (chapter 17.5's MHA, Example
16.3's heads joined through W_O), against minigpt's CausalSelfAttention (minigpt/model/layers.py)
with the same weights.

The mask comes first, by its effect: a later position's input must change nothing at an earlier
one (a mask that reads the future), and position 0, whose only visible key is itself, must give
its own value through W_O (a mask that hides a position from itself leaves it no key). A wrong
output is then explained by the known mistakes that reproduce it: the scores scaled by the model's
width or not at all, the softmax over the queries, heads reading interleaved coordinates, the
heads returned without W_O.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...config import ModelConfig
from ...model.layers import CausalSelfAttention
from .common import (
    Check,
    Group,
    Probe,
    Stop,
    close,
    device_check,
    explain,
    fit_check,
    fitting,
    gradient_check,
    linear_calls,
    number,
    parameters_check,
    randn,
    row,
    shape,
    unchanged_input_check,
)
from .norms import pair

WIDTH, HEADS = 4, 2
HEAD_WIDTH = WIDTH // HEADS


def _rows(positions: int = 5, batch: int = 2) -> Tensor:
    return randn(batch, positions, WIDTH, seed=21)


def _reference(bias: bool = True) -> nn.Module:
    cfg = ModelConfig(n_embd=WIDTH, n_head=HEADS, bias=bias, dtype="float64")
    return CausalSelfAttention(cfg).double().eval()


def attended(
    x: Tensor, theirs: nn.Module, *, scale: str, mask: str, softmax_over: str, split: str, out: bool
) -> Tensor:
    """Attention with the choices a learner may have made (each option's first value is right)."""
    B, T, C = x.shape
    q, k, v = theirs.qkv(x).split(C, dim=-1)
    if split == "contiguous":  # head h reads coordinates h*d .. (h+1)*d - 1
        q, k, v = (t.view(B, T, HEADS, HEAD_WIDTH).transpose(1, 2) for t in (q, k, v))
    else:  # head h reads coordinates h, h + H, h + 2H, ...
        q, k, v = (t.view(B, T, HEAD_WIDTH, HEADS).permute(0, 3, 1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / {"head": math.sqrt(HEAD_WIDTH), "width": math.sqrt(C), "none": 1.0}[scale]
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    if mask == "causal":
        scores = scores.masked_fill(~visible, float("-inf"))
    elif mask == "zero":  # later keys' scores set to 0: exp(0) still weighs them
        scores = scores * visible
    elif mask == "strict":  # each position hidden from itself too
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(-1), float("-inf"))
    weights = torch.softmax(scores, dim=-1 if softmax_over == "keys" else -2)
    mixed = weights @ v  # [B, H, T, d]
    if split == "contiguous":
        joined = mixed.transpose(1, 2).reshape(B, T, C)
    else:
        joined = mixed.permute(0, 2, 3, 1).reshape(B, T, C)
    return theirs.out(joined) if out else joined


OPTIONS = {
    "scale": ["head", "width", "none"],
    "mask": ["causal", "none", "zero", "strict"],
    "softmax_over": ["keys", "queries"],
    "split": ["contiguous", "interleaved"],
    "out": [True, False],
}


def attention(probe: Probe) -> list[Group]:
    def build(*bias: bool) -> nn.Module:
        return probe.build("CausalSelfAttention", WIDTH, HEADS, *bias)

    both = pair(build, _reference)
    fitted = fitting(probe, "CausalSelfAttention", "minigpt's attention", both, _rows(), attended, OPTIONS)
    name = "CausalSelfAttention"

    def forward(module: nn.Module, x: Tensor):
        with torch.no_grad():
            return probe.forward(name, module, x)

    def no_bias() -> str | None:
        got = [k for k in build(False).state_dict()]
        if got != ["qkv.weight", "out.weight"]:
            return f"{name}({WIDTH}, {HEADS}, bias=False) has {', '.join(got)}: pass `bias` on to both Linear layers"
        return None

    def shapes() -> str | None:
        for positions in (1, 5):
            for dtype in (torch.float32, torch.float64):
                x = _rows(positions).to(dtype)
                out = forward(build().to(dtype), x)
                if not isinstance(out, Tensor) or out.shape != x.shape:
                    raise Stop(f"your {name} turns a {list(x.shape)} input into {shape(out)}; it must return [B, T, C]")
                if out.dtype != dtype:
                    return (
                        f"your {name} turns a {str(dtype).removeprefix('torch.')} input into "
                        f"{str(out.dtype).removeprefix('torch.')}"
                    )
        return None

    def causal() -> str | None:
        mine, theirs = both()
        x = _rows()
        moved = x.clone()
        moved[:, 3] += 3.0
        a, b = forward(mine, x), forward(mine, moved)
        changed = [p for p in range(3) if not close(a[:, p], b[:, p])]
        if not changed:
            return None
        p = changed[0]
        by = (a[:, p] - b[:, p]).abs().max().item()
        choices = explain(forward(mine, x), lambda **c: attended(x, theirs, **c), OPTIONS)
        if choices is not None and choices["mask"] == "zero":
            return (
                f"your mask sets later keys' scores to 0, not -inf: exp(0) still weighs them, so changing position 3's "
                f"input changed position {p}'s output by {number(by)}; masked_fill(..., float('-inf')) "
                "before the softmax"
            )
        return (
            f"your {name} reads the future: changing position 3's input changed position {p}'s output by {number(by)}; "
            "mask every key after its query with -inf before the softmax"
        )

    def first_position() -> str | None:
        mine, theirs = both()
        x = _rows()
        out = forward(mine, x)
        with torch.no_grad():
            own = theirs.out(theirs.qkv(x)[..., 2 * WIDTH :])[:, 0]  # weight 1 on its own value, every head
        if close(out[:, 0], own):
            return None
        if torch.isnan(out[:, 0]).any():
            return (
                f"your {name} gives nan at position 0: your mask hides each position from itself, and position 0 then "
                "has no key at all; mask the keys after the query (j > i), not j >= i"
            )
        return (
            f"at position 0, whose only visible key is itself, your {name} gave {row(out[0, 0])}; with weight 1 on its "
            f"own value it is {row(own[0])} (its value through W_O)"
        )

    def scale(choices: dict) -> str | None:
        if choices["scale"] == "head":
            return None
        if choices["scale"] == "width":
            return (
                f"your {name} divides the scores by sqrt(C) = sqrt({WIDTH}), the model's width: each head divides by "
                f"sqrt(d) = sqrt({HEAD_WIDTH}), its own width"
            )
        return f"your {name} does not scale the scores: divide Q K^T by sqrt(d), d = {HEAD_WIDTH} (each head's width)"

    def softmax(choices: dict) -> str | None:
        if choices["softmax_over"] == "keys":
            return None
        return (
            f"your {name}'s softmax runs over the queries (dim=-2): each query's weights over its keys sum "
            "to 1 (dim=-1)"
        )

    def heads(choices: dict) -> str | None:
        if choices["split"] == "contiguous":
            return None
        return (
            f"your heads read interleaved coordinates: head h reads coordinates h*d .. (h+1)*d - 1 of Q, K and V "
            f"(.view(B, T, {HEADS}, {HEAD_WIDTH})), the slices W_O and a checkpoint expect"
        )

    def output(choices: dict) -> str | None:
        if choices["out"]:
            return None
        return f"your {name} returns the joined heads without W_O: pass them through self.out"

    def batch() -> str | None:
        mine, _ = both()
        x = _rows()
        moved = x.clone()
        moved[1] += 2.0
        a, b = forward(mine, x), forward(mine, moved)
        if not close(a[0], b[0]):
            return f"your {name} mixes the examples of a batch: changing example 1 changed example 0's output"
        return None

    def agrees() -> str | None:
        for dtype, tolerance in ((torch.float64, 1e-9), (torch.float32, 1e-5)):
            mine, theirs = (m.to(dtype) for m in both())
            x = _rows().to(dtype)
            out = forward(mine, x.clone())
            with torch.no_grad():
                expected = theirs(x)
            if not close(out, expected, tolerance):
                return (
                    f"your {name} differs from minigpt's (minigpt/model/layers.py) in "
                    f"{str(dtype).removeprefix('torch.')}: "
                    f"at position 4 it gave {row(out[0, 4])}, minigpt's gives {row(expected[0, 4])}"
                )
        return None

    def calls() -> str | None:
        module = build()
        count = linear_calls(module, ("qkv", "out"), lambda: forward(module, _rows()))
        for linear, what in (("qkv", "x"), ("out", "joined")):
            if count[linear] != 1:
                return (
                    f"your {name} calls self.{linear} {count[linear]} times: call it once, as a module, "
                    f"self.{linear}({what}) "
                    "(a trace records each head where it enters W_O; a product with the weight skips that)"
                )
        return None

    checks = [
        parameters_check(
            build,
            f"{name}({WIDTH}, {HEADS})",
            {
                "qkv.weight": [3 * WIDTH, WIDTH],
                "qkv.bias": [3 * WIDTH],
                "out.weight": [WIDTH, WIDTH],
                "out.bias": [WIDTH],
            },
            "qkv holds W_Q | W_K | W_V, out is W_O",
        ),
        Check(f"{name}({WIDTH}, {HEADS}, bias=False) builds without biases", no_bias),
        Check(f"{name} keeps [B, T, C] for T = 1 and T = 5, in float32 and float64", shapes),
        Check(f"{name} reads no later position (changing position 3 changes nothing at 0, 1, 2)", causal),
        Check(f"{name} at position 0 gives its own value through W_O (its only visible key is itself)", first_position),
        fit_check(f"{name} divides each head's scores by sqrt(d), d = {HEAD_WIDTH}", fitted, scale),
        fit_check(f"{name}'s softmax runs over the keys", fitted, softmax),
        fit_check(f"{name}'s head h reads coordinates h*d .. (h+1)*d - 1", fitted, heads),
        fit_check(f"{name} joins the heads through W_O (self.out)", fitted, output),
        Check(f"{name} agrees with minigpt's (minigpt/model/layers.py), in float64 and float32", agrees),
        Check(f"{name} keeps the examples of a batch apart", batch),
        Check(f"{name} calls self.qkv and self.out once each, as modules", calls),
        unchanged_input_check(probe, name, lambda x: build()(x), _rows()),
        device_check(probe, name, build, _rows()),
        gradient_check(probe, name, both, _rows(), ("qkv.weight", "qkv.bias", "out.weight", "out.bias")),
    ]
    return [Group(name, checks)]
