"""The checks of the `attention` exercise: causal multi-head attention (chapter 17.5's MHA, Example
16.3's heads joined through W_O), against minigpt's CausalSelfAttention (minigpt/model/layers.py)
with the same weights.

A wrong output is explained first by the known mistakes that reproduce it (common.Fitting), the
mask first: no mask, later scores set to 0, a mask that hides each position from itself
(diagonal=0) or lets it read the next (diagonal=2), the mask turned round (tril for triu), the
weights masked after the softmax; the heads cut from [B, T, C] without the transpose, or with H and
d swapped; the heads joined back without the transpose; the softmax over the queries; the scores
scaled by the model's width, by d, or not at all; the heads returned without W_O. The width (8) and
heads (2) are chosen so that sqrt(d) = 2, d = 4, sqrt(C) = 2.83 and C = 8 all differ. The mistakes
are then shown by their effect: a later position's input must change nothing at an earlier one,
position 0 (whose only visible key is itself) gives its own value through W_O, and the two examples
of a batch stay apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...config import ModelConfig
from ...model.layers import CausalSelfAttention
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    Stop,
    agrees_check,
    apart,
    close,
    linear_calls,
    module_checks,
    number,
    parameters_check,
    randn,
    shape,
)
from .norms import pair

WIDTH, HEADS = 8, 2
HEAD_WIDTH = WIDTH // HEADS


def _rows(positions: int = 5, batch: int = 2) -> Tensor:
    return randn(batch, positions, WIDTH, seed=21)


def _reference(bias: bool = True) -> nn.Module:
    cfg = ModelConfig(n_embd=WIDTH, n_head=HEADS, bias=bias, dtype="float64")
    return CausalSelfAttention(cfg).double().eval()


# The keys each mask hides from query i, as a [T, T] boolean (True: hidden) of key j.
MASKS = {
    "causal": lambda i, j: j > i,
    "strict": lambda i, j: j >= i,  # triu(diagonal=0): each position hidden from itself too
    "ahead": lambda i, j: j > i + 1,  # triu(diagonal=2): each position reads the next
    "inverted": lambda i, j: j <= i,  # tril where triu(1) belongs: hides what the query may read
}


def attended(
    x: Tensor, theirs: nn.Module, *, mask: str, split: str, join: str, softmax_over: str, scale: str, out: bool
) -> Tensor:
    """Attention with the choices a learner may have made (each option's first value is right)."""
    B, T, C = x.shape
    q, k, v = theirs.qkv(x).split(C, dim=-1)
    if split == "contiguous":  # head h reads coordinates h*d .. (h+1)*d - 1
        q, k, v = (t.view(B, T, HEADS, HEAD_WIDTH).transpose(1, 2) for t in (q, k, v))
    elif split == "swapped":  # view(B, T, d, H): d heads of width H
        q, k, v = (t.view(B, T, HEAD_WIDTH, HEADS).transpose(1, 2) for t in (q, k, v))
    else:  # view(B, H, T, d) straight from [B, T, C]: each "head" holds pieces of several positions
        q, k, v = (t.reshape(B, HEADS, T, HEAD_WIDTH) for t in (q, k, v))
    return mixed(q, k, v, theirs, HEAD_WIDTH, mask=mask, join=join, softmax_over=softmax_over, scale=scale, out=out)


def mixed(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    theirs: nn.Module,
    d: int,
    *,
    mask: str,
    join: str,
    softmax_over: str,
    scale: str,
    out: bool,
) -> Tensor:
    """Heads [B, heads, T, .] on to the output, with the choices a learner may have made: the scores
    scaled (`d`: the model's head width), masked, softmaxed, mixing the values, joined, through W_O."""
    B, _, T, _ = q.shape
    C = q.shape[1] * q.shape[3]  # the joined width
    divisor = {"head": math.sqrt(d), "width": math.sqrt(C), "d": d, "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) / divisor
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if mask in MASKS:
        scores = scores.masked_fill(MASKS[mask](i, j), float("-inf"))
    elif mask == "zero":  # later keys' scores set to 0: exp(0) still weighs them
        scores = scores * (j <= i)
    weights = torch.softmax(scores, dim=-1 if softmax_over == "keys" else -2)
    if mask == "after":  # the later keys' weights zeroed after the softmax: rows no longer sum to 1
        weights = weights.masked_fill(j > i, 0.0)
    heads = weights @ v  # [B, H, T, d]
    joined = heads.reshape(B, T, C) if join == "reshape" else heads.transpose(1, 2).reshape(B, T, C)
    return theirs.out(joined) if out else joined


OPTIONS = {
    "mask": ["causal", "none", "zero", "strict", "ahead", "inverted", "after"],
    "split": ["contiguous", "swapped", "no_transpose"],
    "join": ["transpose", "reshape"],
    "softmax_over": ["keys", "queries"],
    "scale": ["head", "width", "d", "none"],
    "out": [True, False],
}


def no_bias_check(shown: str, build: Callable[..., nn.Module]) -> Check:
    """An attention built with bias=False (`shown`, in words) has W_Q, W_K, W_V and W_O without biases."""

    def run() -> str | None:
        got = list(build(False).state_dict())
        if got != ["qkv.weight", "out.weight"]:
            return f"{shown} has {', '.join(got)}: pass `bias` on to both Linear layers"
        return None

    return Check(f"{shown} builds without biases", run)


def shapes_check(
    name: str,
    build: Callable[[], nn.Module],
    forward: Callable[[nn.Module, Tensor], object],
    rows: Callable[..., Tensor],
) -> Check:
    """An attention keeps [B, T, C] (`rows(T)`) and its dtype; another shape stops the rest of its checks."""

    def run() -> str | None:
        for positions in (1, 5):
            for dtype in (torch.float32, torch.float64):
                x = rows(positions).to(dtype)
                out = forward(build().to(dtype), x)
                if not isinstance(out, Tensor) or out.shape != x.shape:
                    raise Stop(f"your {name} turns a {list(x.shape)} input into {shape(out)}; it must return [B, T, C]")
                if out.dtype != dtype:
                    return (
                        f"your {name} turns a {str(dtype).removeprefix('torch.')} input into "
                        f"{str(out.dtype).removeprefix('torch.')}"
                    )
        return None

    return Check(f"{name} keeps [B, T, C] for T = 1 and T = 5, in float32 and float64", run)


def calls_check(
    name: str, build: Callable[[], nn.Module], forward: Callable[[nn.Module, Tensor], object], x: Tensor
) -> Check:
    """An attention calls its qkv and out once each, as modules: a trace records each head where it enters W_O."""

    def run() -> str | None:
        module = build()
        count = linear_calls(module, ("qkv", "out"), lambda: forward(module, x))
        for linear, what in (("qkv", "x"), ("out", "joined")):
            if count[linear] != 1:
                return (
                    f"your {name} calls self.{linear} {count[linear]} times: call it once, as a module, "
                    f"self.{linear}({what}) "
                    "(a trace records each head where it enters W_O; a product with the weight skips that)"
                )
        return None

    return Check(f"{name} calls self.qkv and self.out once each, as modules", run)


def transpose_hint(exc: BaseException) -> str | None:
    """Q K^T with K not transposed: [T, d] @ [T, d] does not multiply."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and ("batch2" in text or "cannot be multiplied" in text):
        return "Q K^T multiplies Q by K transposed over its last two axes: q @ k.transpose(-2, -1)"
    return None


def attention(probe: Probe) -> list[Group]:
    probe.hints = transpose_hint

    def build(*bias: bool) -> nn.Module:
        return probe.build("CausalSelfAttention", WIDTH, HEADS, *bias)

    both = pair(build, _reference)
    name = "CausalSelfAttention"
    fitting = Fitting(probe, name, "minigpt's attention", both, _rows(), attended, OPTIONS)

    def forward(module: nn.Module, x: Tensor):
        with torch.no_grad():
            return probe.forward(name, module, x)

    def future() -> tuple[int, float] | None:
        """The first earlier position whose output changes when position 3's input does, and by how
        much (nan on both sides counts as unchanged: a position left no key is said by its own check)."""
        mine, _ = both()
        x = _rows()
        moved = x.clone()
        moved[:, 3] += 3.0
        a, b = forward(mine, x), forward(mine, moved)
        for p in range(3):
            if not close(a[:, p], b[:, p], nan_equal=True):
                return p, (a[:, p] - b[:, p]).abs().nan_to_num(nan=math.inf).max().item()
        return None

    def read(effect: tuple[int, float] | None) -> str:
        if effect is None:
            return ""
        return f"changing position 3's input changed position {effect[0]}'s output by {number(effect[1])}; "

    def masked(choices: dict) -> str | None:
        kind = choices["mask"]
        if kind == "causal":
            return None
        if kind == "none":
            return (
                f"your {name} reads the future, having no mask: {read(future())}mask every key after its query "
                "with -inf before the softmax"
            )
        if kind == "zero":
            return (
                f"your mask sets later keys' scores to 0, not -inf: exp(0) still weighs them, so {read(future())}"
                "masked_fill(..., float('-inf')) before the softmax"
            )
        if kind == "strict":
            return (
                "your mask hides each position from itself too (triu(diagonal=0), j >= i): position 0 is left no "
                "key at all and gives nan; mask only the keys after the query (j > i), triu(diagonal=1)"
            )
        if kind == "ahead":
            return (
                f"your mask lets each position read the next one (triu(diagonal=2), j > i + 1): {read(future())}"
                "mask every key after the query (j > i), triu(diagonal=1)"
            )
        if kind == "inverted":
            return (
                "your mask is turned round: it hides each query's own and earlier keys (tril) and keeps the later "
                "ones; mask the keys after the query (j > i), torch.ones(T, T, dtype=torch.bool).triu(1)"
            )
        return (
            "your mask zeroes the later keys' weights after the softmax: each query's weights then sum to less "
            "than 1; mask the scores with -inf before the softmax, which shares the weight among the visible keys"
        )

    def split(choices: dict) -> str | None:
        if choices["split"] == "contiguous":
            return None
        if choices["split"] == "swapped":
            return (
                f"your heads are cut with view(B, T, {HEAD_WIDTH}, {HEADS}), d and H swapped: that makes {HEAD_WIDTH} "
                f"heads of width {HEADS}; view(B, T, {HEADS}, {HEAD_WIDTH}).transpose(1, 2) makes the model's {HEADS} "
                f"heads of width {HEAD_WIDTH}, head h reading coordinates h*d .. (h+1)*d - 1"
            )
        return (
            f"your heads are cut from [B, T, C] straight into [B, {HEADS}, T, {HEAD_WIDTH}] (view or reshape), with no "
            "transpose: each head "
            f"then holds pieces of several positions, and positions mix ({read(future()).removesuffix('; ')}); "
            f"view(B, T, {HEADS}, {HEAD_WIDTH}).transpose(1, 2) gives [B, H, T, d]"
        )

    def join(choices: dict) -> str | None:
        if choices["join"] == "transpose":
            return None
        if choices["split"] == "no_transpose":
            return (
                f"your {name} joins the heads with reshape(B, T, C) alone, the undoing of its view(B, {HEADS}, T, "
                f"{HEAD_WIDTH}); once the heads are cut with .transpose(1, 2), join them back with "
                ".transpose(1, 2).reshape(B, T, C)"
            )
        return (
            f"your {name} joins the heads with reshape(B, T, C) straight from [B, H, T, d], without transposing "
            "back: heads and positions mix; (weights @ v).transpose(1, 2).reshape(B, T, C)"
        )

    def scale(choices: dict) -> str | None:
        if choices["scale"] == "head":
            return None
        if choices["scale"] == "width":
            return (
                f"your {name} divides the scores by sqrt(C) = sqrt({WIDTH}), the model's width: each head divides by "
                f"sqrt(d) = sqrt({HEAD_WIDTH}), its own width"
            )
        if choices["scale"] == "d":
            return (
                f"your {name} divides the scores by d = {HEAD_WIDTH} itself: divide by its square root, "
                f"sqrt(d) = {number(math.sqrt(HEAD_WIDTH))}"
            )
        return f"your {name} does not scale the scores: divide Q K^T by sqrt(d), d = {HEAD_WIDTH} (each head's width)"

    def softmax(choices: dict) -> str | None:
        if choices["softmax_over"] == "keys":
            return None
        return (
            f"your {name}'s softmax runs over the queries (dim=-2): each query's weights over its keys sum "
            "to 1 (dim=-1)"
        )

    def output(choices: dict) -> str | None:
        if choices["out"]:
            return None
        return f"your {name} returns the joined heads without W_O: pass them through self.out"

    def causal() -> str | None:
        effect = future()
        if effect is None:
            return None
        return (
            f"your {name} reads the future: {read(effect)}a position's output must not depend on a later one (every "
            "key after its query masked with -inf before the softmax, and nothing else mixing positions)"
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
                f"your {name} gives nan at position 0: a position left no visible key (all -inf) has no weights; "
                "position 0's only key is itself"
            )
        got, want = apart(out[0, 0], own[0])
        return (
            f"at position 0, whose only visible key is itself, your {name} gave {got}; with weight 1 on its "
            f"own value it is {want} (its value through W_O)"
        )

    def batch() -> str | None:
        mine, _ = both()
        x = _rows()
        moved = x.clone()
        moved[1] += 2.0
        a, b = forward(mine, x), forward(mine, moved)
        if not close(a[0], b[0], nan_equal=True):
            return f"your {name} mixes the examples of a batch: changing example 1 changed example 0's output"
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
        no_bias_check(f"{name}({WIDTH}, {HEADS}, bias=False)", build),
        shapes_check(name, build, forward, _rows),
        fitting.check("mask", f"{name} masks every key after its query, and no other, with -inf", masked),
        fitting.check("split", f"{name}'s head h reads coordinates h*d .. (h+1)*d - 1 of its own position", split),
        fitting.check("join", f"{name} transposes the heads back before joining them to [B, T, C]", join),
        fitting.check("softmax_over", f"{name}'s softmax runs over the keys", softmax),
        fitting.check("scale", f"{name} divides each head's scores by sqrt(d), d = {HEAD_WIDTH}", scale),
        fitting.check("out", f"{name} joins the heads through W_O (self.out)", output),
        Check(f"{name} reads no later position (changing position 3 changes nothing at 0, 1, 2)", causal),
        Check(f"{name} at position 0 gives its own value through W_O (its only visible key is itself)", first_position),
        agrees_check(
            probe,
            name,
            both,
            _rows(),
            "minigpt's (minigpt/model/layers.py)",
            lambda x, at: f"at position {at[1]} of example {at[0]}",
        ),
        Check(f"{name} keeps the examples of a batch apart", batch),
        calls_check(name, build, forward, _rows()),
        *module_checks(probe, name, build, both, _rows(), ("qkv.weight", "qkv.bias", "out.weight", "out.bias")),
    ]
    return [Group(name, checks)]
