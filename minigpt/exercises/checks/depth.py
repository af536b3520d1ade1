"""The checks of the `attention_residual` exercise: one layer's softmax over depth (Attention
Residuals, Kimi Team, arXiv 2603.15031), against minigpt's DepthAttention (minigpt/model/depth.py)
reading the same sources with the same pseudo-query.

The probe stacks four sources of different sizes (scaled by 1, 5, 0.3 and 2), so that a score
without the key norm, where the larger sources outweigh the others, differs from one with it; two
examples of three positions each, width 8. A wrong output is explained first by the known mistakes
that reproduce it (common.Fitting): the key norm left out, or a LayerNorm or a division by the
length in its place; the softmax over the positions or the examples instead of the sources; the
normed keys mixed instead of the sources; the norm applied to the output; the scores divided by
sqrt(C) as attention's are. A gain on the key norm is a parameter more, which the first check names.
Then the effects: a fresh layer (its query at zeros) reads the plain average, one source is read as
it is, and no position reads another.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...model.depth import Depth, DepthAttention, key_norm
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    Stop,
    agrees_check,
    apart,
    close,
    module_checks,
    number,
    parameters_check,
    randn,
    row,
    shape,
)

NAME = "DepthAttention"
WIDTH, EPS = 8, 1e-5
SIZES = (1.0, 5.0, 0.3, 2.0)  # each source's scale: the key norm shows


def _sources(count: int = len(SIZES), positions: int = 3) -> Tensor:
    """[S, B, T, C]: the embedding, then the earlier layers' outputs, each of its own size."""
    scale = torch.tensor(SIZES[:count], dtype=torch.float64)[:, None, None, None]
    return randn(count, 2, positions, WIDTH, seed=51) * scale + 0.3 * randn(count, 2, positions, 1, seed=52)


class _Reference(DepthAttention):
    """minigpt's DepthAttention, handed the sources stacked as the learner's is: each added to a Depth
    (one layer per block, so every source is one the softmax reads) and read by minigpt's own forward."""

    def forward(self, sources: Tensor) -> Tensor:  # type: ignore[override]
        depth = Depth.start(sources[0], 1, EPS, len(sources) - 1)
        for source in sources[1:]:
            depth = depth.add(source)
        return super().forward(depth)


def _reference() -> nn.Module:
    reference = _Reference(WIDTH).double()
    with torch.no_grad():
        reference.query.copy_(randn(WIDTH, seed=53))  # a trained query, of either sign
    return reference


def read_over_depth(sources: Tensor, theirs, *, key: str, axis: str, mix: str, output: str, scale: str) -> Tensor:
    """One layer's read with the choices a learner may have made (each option's first value right)."""
    keys = {
        "rms": lambda: key_norm(sources, EPS),
        "none": lambda: sources,
        "layernorm": lambda: F.layer_norm(sources, (WIDTH,), eps=EPS),
        "length": lambda: F.normalize(sources, dim=-1),
    }[key]()
    logits = keys @ theirs.query  # [S, B, T]
    if scale == "sqrt":
        logits = logits / math.sqrt(WIDTH)
    alpha = torch.softmax(logits, dim={"sources": 0, "batch": 1, "positions": 2}[axis])
    read = (alpha.unsqueeze(-1) * (sources if mix == "sources" else keys)).sum(dim=0)
    return key_norm(read, EPS) if output == "normed" else read


OPTIONS = {
    "key": ["rms", "none", "layernorm", "length"],
    "axis": ["sources", "positions", "batch"],
    "mix": ["sources", "keys"],
    "output": ["plain", "normed"],
    "scale": ["none", "sqrt"],
}


def _sizes() -> str:
    return ", ".join(number(size) for size in SIZES[:-1]) + f" and {number(SIZES[-1])}"


def attention_residual(probe: Probe) -> list[Group]:
    def build(width: int = WIDTH) -> nn.Module:
        return probe.build(NAME, width, EPS)

    def both() -> tuple[nn.Module, nn.Module]:
        theirs = _reference()
        mine = build()
        mine.load_state_dict(theirs.state_dict())
        return mine, theirs

    def where(sources: Tensor, at: tuple[int, ...]) -> str:
        return f"at position {at[1]} of example {at[0]}"

    fitting = Fitting(
        probe, NAME, "softmax_i(w . RMSNorm(v_i)) v_i summed", both, _sources(), read_over_depth, OPTIONS, where
    )

    def forward(module: nn.Module, sources: Tensor):
        with torch.no_grad():
            return probe.forward(NAME, module, sources)

    def zero_query() -> str | None:
        query = build().state_dict()["query"]
        if torch.all(query == 0):
            return None
        return (
            f"your {NAME} starts self.query at {row(query)}: start it at zeros (torch.zeros(width)), so that "
            "every score is 0 and a fresh layer reads the plain average of its sources, 1/S each, as Attention "
            "Residuals starts (any other query starts each layer leaning on some sources for no reason)"
        )

    def uniform_start() -> str | None:
        module = build()
        with torch.no_grad():
            module.query.zero_()  # a fresh layer's (the check before says whether it starts so)
        sources = _sources()
        out, mean = forward(module, sources), sources.mean(dim=0)
        if close(out, mean):
            return None
        got, want = apart(out[0, 0], mean[0, 0]) if shape(out) == shape(mean) else (shape(out), row(mean[0, 0]))
        return (
            f"a fresh {NAME} (its query at zeros) gave {got} at position 0 of example 0; with every score 0 the "
            f"softmax weighs the {len(SIZES)} sources alike, and the read is their plain average, {want}"
        )

    def shapes() -> str | None:
        for count in (1, len(SIZES)):
            for dtype in (torch.float32, torch.float64):
                sources = _sources(count).to(dtype)
                out = forward(build().to(dtype), sources)
                if not isinstance(out, Tensor) or out.shape != sources.shape[1:]:
                    raise Stop(
                        f"your {NAME} turns {count} sources, {list(sources.shape)}, into {shape(out)}; it returns "
                        f"one read, [B, T, C] = {list(sources.shape[1:])}"
                    )
                if out.dtype != dtype:
                    return (
                        f"your {NAME} turns {str(dtype).removeprefix('torch.')} sources into "
                        f"{str(out.dtype).removeprefix('torch.')}"
                    )
        return None

    def key(choices: dict) -> str | None:
        kind = choices["key"]
        if kind == "rms":
            return None
        if kind == "none" and choices["output"] == "normed":
            return (
                f"your {NAME} applies the RMSNorm to its output h instead of to each source's key: the scores are "
                "w . RMSNorm(v_i), and h = sum_i alpha_i v_i is left as it is"
            )
        return {
            "none": f"your {NAME} scores each source by w . v_i, the key norm left out: a source whose outputs are "
            f"larger then outweighs the others whatever w says (the probe's are {_sizes()} times as large); "
            "score w . RMSNorm(v_i), v_i / sqrt(mean(v_i^2) + eps) without a gain",
            "layernorm": f"your {NAME}'s key norm subtracts each key's mean (a LayerNorm); it is an RMSNorm, "
            "v_i / sqrt(mean(v_i^2) + eps), without centring",
            "length": f"your {NAME} divides each key by its length, |v_i| (F.normalize); RMSNorm divides by the root "
            f"mean square, |v_i| / sqrt(C), so its keys are sqrt(C) = {math.sqrt(WIDTH):.2f} times as long",
        }[kind]

    def axis(choices: dict) -> str | None:
        if choices["axis"] == "sources":
            return None
        across = "positions (dim 2 of the scores [S, B, T])" if choices["axis"] == "positions" else "examples"
        return (
            f"your {NAME}'s softmax runs over the {across}, not over the sources: at each position the weights "
            "alpha_i of the S sources sum to 1 (dim 0 of the scores [S, B, T])"
        )

    def mix(choices: dict) -> str | None:
        if choices["mix"] == "sources":
            return None
        return (
            f"your {NAME} mixes the normed keys, not the sources: the norm only scores them, and h = sum_i alpha_i "
            "v_i mixes the sources as they are"
        )

    def output(choices: dict) -> str | None:
        if choices["output"] == "plain":
            return None
        return (
            f"your {NAME} normalises its output h: the norm belongs on each source's key, inside the scores; h is "
            "what the sublayer's own pre-norm reads"
        )

    def scale(choices: dict) -> str | None:
        if choices["scale"] == "none":
            return None
        return (
            f"your {NAME} divides the scores by sqrt(C) = sqrt({WIDTH}), as attention's are: Attention Residuals' "
            "scores are w . RMSNorm(v_i) as they are"
        )

    def one_source() -> str | None:
        mine, _ = both()
        sources = _sources(1)
        out = forward(mine, sources)
        if close(out, sources[0]):
            return None
        got, want = apart(out[0, 0], sources[0, 0, 0])
        return (
            f"your {NAME} read one source, {want} at position 0, as {got}: a softmax over one source weighs it 1, "
            "whatever the query"
        )

    def positions_apart() -> str | None:
        mine, _ = both()
        sources = _sources()
        moved = sources.clone()
        moved[:, :, 2] *= 3.0
        a, b = forward(mine, sources), forward(mine, moved)
        if close(a[:, :2], b[:, :2]):
            return None
        return (
            f"your {NAME} mixes positions: changing position 2 of every source changed the reads at positions 0 "
            "and 1; the read at a position weighs that position's sources alone"
        )

    checks = [
        parameters_check(
            lambda: build(),
            f"{NAME}({WIDTH}, {EPS})",
            {"query": [WIDTH]},
            "the pseudo-query w alone: the key norm has no gain, since w . (g * k) = (w * g) . k",
        ),
        Check(f"{NAME}'s query starts at zeros", zero_query),
        Check(f"{NAME} turns [S, B, T, C] sources into one read, [B, T, C], in float32 and float64", shapes),
        fitting.check("key", f"{NAME} scores w . RMSNorm(v_i), RMSNorm without a gain", key),
        fitting.check("axis", f"{NAME}'s softmax runs over the sources", axis),
        fitting.check("mix", f"{NAME} mixes the sources themselves", mix),
        fitting.check("output", f"{NAME} leaves its read h as the mix gives it", output),
        fitting.check("scale", f"{NAME}'s scores are not scaled", scale),
        Check(f"{NAME} with its query at zeros reads the plain average of its sources", uniform_start),
        Check(f"{NAME} reads one source as it is", one_source),
        Check(
            f"{NAME} reads each position's sources alone (changing position 2 changes nothing at 0, 1)", positions_apart
        ),
        agrees_check(probe, NAME, both, _sources(), "minigpt's (minigpt/model/depth.py)", where),
        *module_checks(probe, NAME, lambda: build(), both, _sources(), ("query",)),
    ]
    return [Group(NAME, checks)]
