"""The checks of the `block` exercise: the pre-norm block of chapter 17.5, wired by the learner from
four given parts. Table 17.1 is the test: the learner's Block, holding chapter 17's own LayerNorms,
heads and FFN (data/chapter17-block.json), must turn X into the table's Y.

The wiring is checked first, part by part, with parts that record what they read and return known
updates: a zero update must leave the stream as it came (replacing instead of adding), attention
must read norm1(x) and the FFN norm2(residual1) (pre-norm; reading x is post-norm or no norm), and
each add must keep the untouched stream (normalising the residual stream itself).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...config import PROJECT_ROOT, ModelConfig
from ...model.chapter17 import build_model, chapter_model_config
from ...model.gpt import Block
from ...model.layers import CausalSelfAttention, FeedForward, LayerNorm
from .common import Check, Group, Probe, Stop, against, close, randn, row, shape, unchanged_input_check

WIDTH = 4
CHAPTER = PROJECT_ROOT / "data" / "chapter17-block.json"


class Recording(nn.Module):
    """A part that keeps every input it is given and returns `update(input)`."""

    def __init__(self, update: Callable[[Tensor], Tensor]):
        super().__init__()
        self.update, self.seen = update, []

    def forward(self, x: Tensor) -> Tensor:
        self.seen.append(x.detach().clone())
        return self.update(x)


def _norm(seed: int) -> nn.Module:
    """A LayerNorm of its own gains and biases, so norm1 and norm2 give different rows."""
    norm = LayerNorm(WIDTH, 1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(0.5 + randn(WIDTH, seed=seed).abs())
        norm.bias.copy_(0.5 * randn(WIDTH, seed=seed + 1))
    return norm


def block(probe: Probe) -> list[Group]:
    x = randn(1, 3, WIDTH, seed=31) * 2
    U = randn(1, 3, WIDTH, seed=32)  # attention's update
    Fu = randn(1, 3, WIDTH, seed=33)  # the FFN's update
    norm1, norm2 = _norm(34), _norm(36)
    n1 = norm1(x).detach()

    def run(attention: Callable[[Tensor], Tensor], ffn: Callable[[Tensor], Tensor], given: Tensor | None = None):
        parts = (Recording(norm1), Recording(attention), Recording(norm2), Recording(ffn))
        learner = probe.build("Block", *parts)
        with torch.no_grad():
            out = probe.forward("Block", learner, x.clone() if given is None else given)
        return out, [part.seen for part in parts]

    def zero() -> Tensor:
        return lambda t: torch.zeros_like(t)

    def shown(t) -> str:
        return row(t[0, 0]) if isinstance(t, Tensor) and t.dim() == 3 else shape(t)

    def names() -> str | None:
        cfg = ModelConfig(n_embd=WIDTH, n_head=2, ffn_hidden=8, dtype="float64")
        parts = (LayerNorm(WIDTH, 1e-5), CausalSelfAttention(cfg), LayerNorm(WIDTH, 1e-5), FeedForward(cfg))
        got = list(probe.build("Block", *parts).state_dict())
        expected = list(Block(cfg).state_dict())
        if sorted(got) != sorted(expected):
            raise Stop(
                "your Block keeps its parts under other names (its parameters are "
                f"{', '.join(sorted({k.split('.')[0] for k in got})) or 'none'}): keep them as self.norm1, "
                "self.attention, self.norm2 and self.ffn, the names a run's checkpoint stores"
            )
        return None

    def identity_path() -> str | None:
        out, seen = run(zero(), zero())
        if close(out, x):
            return None
        if close(out, torch.zeros_like(x)):
            return (
                f"your Block replaces instead of adding: with both updates zero, {row(x[0, 0])} became {shown(out)}; "
                "a = x + Attention(norm1(x)) keeps x when the update is zero"
            )
        if seen[1] and close(seen[1][0], x) and close(out, norm2(norm1(x))):
            return (
                "your Block normalises after each add (post-norm, chapter 17.6): its attention reads x itself and "
                f"with both updates zero it returned norm2(norm1(x)) = {shown(out)}, not x = {row(x[0, 0])}; 17.5's "
                "pre-norm block reads norm1(x) and adds to the untouched x"
            )
        if any(close(out, candidate) for candidate in (n1, norm2(n1), norm2(x))):
            return (
                f"your Block normalises the stream itself: with both updates zero it returned {shown(out)}, a "
                f"normalised row, not x = {row(x[0, 0])}; each sublayer reads a normalised view, and the addition "
                "keeps the untouched input"
            )
        got, want, at = against(out, x)
        return f"with both updates zero your Block gave {got} at position {at[-1]}, where x is {want}: it must return x"

    def attention_reads() -> str | None:
        _, seen = run(zero(), zero())
        if not seen[1]:
            return "your Block never calls self.attention"
        if close(seen[1][0], n1):
            return None
        if close(seen[1][0], x):
            return (
                "your attention reads x itself, not norm1(x): a pre-norm block (17.5) puts each norm before its "
                "sublayer; normalising after the add is post-norm, another block (17.6)"
            )
        got, want, at = against(seen[1][0], n1)
        return f"at position {at[-1]} your attention received {got}; in a pre-norm block it reads norm1(x) = {want}"

    def first_add() -> str | None:
        out, seen = run(lambda t: t * 0 + U, zero())
        if close(out, x + U):
            return None
        if close(out, x):
            if seen[3] and close(seen[3][0], norm2(x + U)):
                return (
                    "your second add starts again from x and drops attention's update: with a zero FFN update it "
                    f"returned x = {row(x[0, 0])}, not R = X + U = {row((x + U)[0, 0])}; Y = R + FFN(norm2(R))"
                )
            return (
                f"your Block drops attention's update: with attention's update U = {row(U[0, 0])} and a zero FFN "
                f"update it returned x = {row(x[0, 0])}; R = X + U"
            )
        if close(out, x + 2 * U):
            return f"your Block adds attention's update twice: x + U is {row((x + U)[0, 0])}, it gave {shown(out)}"
        if close(out, n1 + U):
            return (
                "your Block adds attention's update to norm1(x), not to the untouched x (it normalises the residual "
                f"stream itself): x = {row(x[0, 0])} plus {row(U[0, 0])} must give {row((x + U)[0, 0])}"
            )
        if close(out, U):
            return f"your Block keeps only attention's update {row(U[0, 0])}: add it to x, R = X + U"
        if any(close(out, candidate) for candidate in (n1 + U, norm2(n1 + U), norm2(n1 + U) + n1)):
            return (
                "your Block normalises the stream itself: with attention's update U and a zero FFN update it "
                f"returned {shown(out)}, built on norm1(x), not x + U = {row((x + U)[0, 0])}; the adds must keep the "
                "untouched stream"
            )
        if close(out, norm2(x + U)) or close(out, norm2(norm1(x + U))):
            return (
                "your Block normalises after each add (post-norm, chapter 17.6): 17.5's pre-norm block returns "
                "R + FFN(norm2(R)), R = X + U, with no norm on the stream itself"
            )
        got, want, at = against(out, x + U)
        return f"with a zero FFN update your Block gave {got} at position {at[-1]}, where x + U is {want}"

    def ffn_reads() -> str | None:
        out, seen = run(lambda t: t * 0 + U, zero())
        if not seen[3]:
            return "your Block never calls self.ffn"
        expected = norm2(x + U).detach()
        if close(seen[3][0], expected):
            return None
        if close(seen[3][0], x + U):
            return "your FFN reads the residual R = X + U itself, not norm2(R): pre-norm puts norm2 before the FFN"
        if close(seen[3][0], norm1(x + U)):
            return (
                "your FFN reads norm1(R), attention's norm: the FFN has a norm of its own, norm2 (each with its own "
                "gains, which a run trains apart); Y = R + FFN(norm2(R))"
            )
        if close(seen[3][0], norm2(x)) and close(out, x + U):  # R = X + U kept, and the FFN fed from x
            return (
                "your FFN reads norm2(x), the block's input, not norm2(R) with attention's update added (a parallel "
                "block, as GPT-J's): 17.5's pre-norm block reads norm2(X + U)"
            )
        got, want, at = against(seen[3][0], expected)
        return f"at position {at[-1]} your FFN received {got}; it reads norm2(X + U) = {want}"

    def second_add() -> str | None:
        out, _ = run(lambda t: t * 0 + U, lambda t: t * 0 + Fu)
        if close(out, x + U + Fu):
            return None
        if close(out, x + Fu):
            return "your second add starts again from x and drops attention's update: Y = R + FFN(norm2(R)), R = X + U"
        if close(out, x + U + 2 * Fu):
            return (
                "your Block adds the FFN's update twice: with updates U and F, X + U + F is "
                f"{row((x + U + Fu)[0, 0])}, it gave {shown(out)}"
            )
        if close(out, Fu):
            return f"your Block returns only the FFN's update {row(Fu[0, 0])}: Y = R + FFN(norm2(R))"
        got, want, at = against(out, x + U + Fu)
        return f"with updates U and F your Block gave {got} at position {at[-1]}, where X + U + F is {want}"

    def table() -> str | None:
        ref = json.loads(CHAPTER.read_text(encoding="utf-8"))
        model = build_model(chapter_model_config(ref), ref)
        chapter = copy.deepcopy(model.blocks[0])
        parts = [chapter.norm1, chapter.attention, chapter.norm2, chapter.ffn]
        X = (model.token_table.weight[ref["token_ids"]] + model.position_table.weight).detach()[None]
        learner = probe.build("Block", *parts)
        with torch.no_grad():
            out = probe.forward("Block", learner, X)
        expected = ref["block_output_Y_rounded_6"]
        if isinstance(out, Tensor) and out.shape == (1, 3, 2):
            got = [[round(v, 6) for v in r] for r in out[0].tolist()]
            if got == expected:
                return None
            return (
                f"on chapter 17's weights your Block's Y is [{', '.join(row(r, 6) for r in out[0])}]; Table 17.1's "
                f"is [{', '.join(row(r, 6) for r in expected)}]"
            )
        return f"on chapter 17's weights your Block turned X [1, 3, 2] into {shape(out)}"

    checks = [
        Check("Block keeps its parts as self.norm1, self.attention, self.norm2 and self.ffn", names),
        Check("Block: with both updates zero, Y = X (the adds keep the identity path)", identity_path),
        Check("Block: attention reads norm1(x) (pre-norm)", attention_reads),
        Check("Block: the first add keeps the untouched x, R = X + U", first_add),
        Check("Block: the FFN reads norm2(R)", ffn_reads),
        Check("Block: the second add keeps R, Y = R + FFN(norm2(R))", second_add),
        Check("Block turns chapter 17's X into Table 17.1's Y (6 decimals)", table),
        unchanged_input_check(  # updates that are not zero: x += 0 would change nothing to see
            probe,
            "Block",
            lambda t: probe.build("Block", *(Recording(f) for f in (norm1, lambda n: n * 0 + U, norm2, zero())))(t),
            x,
        ),
    ]
    return [Group("Block", checks)]
