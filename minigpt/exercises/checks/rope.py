"""The checks of the `rope` exercise: rotary positions (Su et al. 2021) in the half-split layout of
Hugging Face's Llama, against minigpt's Rotary (minigpt/model/positions.py) on the same queries,
keys and values.

The learner's `apply_rope(q, k, v, start, theta)` is checked as a module of one tensor (q, k and v
side by side on the heads' axis, _Packed), so the checks every module gets (agreement in float64
and float32, the device, the gradient) read it as they read a module. The probe has two query heads
and one key and value head (grouped-query attention hands rope fewer key heads), five positions from
start = 3 (a KV cache's later rows) and heads 8 wide, theta = 10000: its four pairs turn at 1, 0.1,
0.01 and 0.001 radians a position, which theta^(-i/d) and theta^(-2i/(d/2)) do not give.

A wrong output is explained first by the known mistakes that reproduce it (common.Fitting): the
interleaved layout (pairs 2i, 2i + 1, the RoFormer paper's own) or the half-split pairs given the
interleaved layout's angles; the frequency exponent (theta^(-i/d), theta^(-2i/(d/2)), the minus sign
lost); the rotation turned the other way; the queries or the keys alone turned; the values turned
too; the positions counted from 0 whatever `start` says (a KV cache's new token turned as if at 0).
The effects come after: q_m . k_n depends on m - n alone, rows turned after a cache are the rows of
one pass, and position 0 is not turned.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...model.positions import Rotary
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    Stop,
    agrees_check,
    apart,
    close,
    device_check,
    gradient_check,
    randn,
    row,
    shape,
)

NAME = "apply_rope"
BATCH, HEADS, KV_HEADS, POSITIONS, WIDTH = 2, 2, 1, 5, 8  # WIDTH: d, one head's
START, THETA = 3, 10000.0
SPLIT = (HEADS, KV_HEADS, KV_HEADS)


def _rows(positions: int = POSITIONS, seed: int = 31) -> Tensor:
    """q, k and v side by side on the heads' axis: [B, H + 2K, T, d]."""
    return randn(BATCH, sum(SPLIT), positions, WIDTH, seed=seed)


class _Packed(nn.Module):
    """A rope function as a module of one tensor: q, k and v side by side on the heads' axis, in and
    out. What it returns is handed on as it is unless it is three tensors of q's, k's and v's shapes."""

    def __init__(self, turn: Callable[[Tensor, Tensor, Tensor], object]):
        super().__init__()
        self.turn = turn

    def forward(self, packed: Tensor):
        q, k, v = packed.split(SPLIT, dim=1)
        out = self.turn(q, k, v)
        if _returns(out, (q, k, v)) is None:
            return torch.cat(out, dim=1)
        return out


def _returns(out, given: tuple[Tensor, ...]) -> str | None:
    """None when `out` is (q, k, v) of the shapes and dtype given, else what it is, in words."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        return f"a {type(out).__name__}" + (f" of {len(out)}" if isinstance(out, (tuple, list)) else "")
    shapes = [shape(t) for t in out]
    if shapes != [shape(t) for t in given]:
        return f"({', '.join(shapes)})"
    if any(t.dtype != given[0].dtype for t in out):
        return "tensors of another dtype: " + ", ".join(str(t.dtype).removeprefix("torch.") for t in out)
    return None


def minigpt_rope(q: Tensor, k: Tensor, v: Tensor, start: int) -> tuple[Tensor, Tensor, Tensor]:
    """minigpt's Rotary on [B, heads, T, d] rows (it takes the positions on axis 1)."""
    rotary = Rotary(WIDTH, THETA, 16)
    turned = (rotary.rotate(t.transpose(1, 2), start).transpose(1, 2) for t in (q, k))
    return *turned, v


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


EXPONENTS = {"2i/d": 2.0, "i/d": 1.0, "4i/d": 4.0, "+2i/d": -2.0}  # inv_freq_i = theta^(-factor i / d)


def inverse_frequencies(exponent: str, dtype=torch.float64) -> Tensor:
    i = torch.arange(WIDTH // 2, dtype=dtype)
    return THETA ** (-EXPONENTS[exponent] * i / WIDTH)


def turned_row(x: Tensor, start: int, *, layout: str, exponent: str, direction: str) -> Tensor:
    """x [..., T, d] turned by positions start .. start + T - 1 with the choices a learner may have made."""
    t = torch.arange(start, start + x.shape[-2], dtype=x.dtype)
    angles = t[:, None] * inverse_frequencies(exponent, x.dtype)[None, :]  # [T, d/2]
    cos, sin = angles.cos(), angles.sin() * (1.0 if direction == "forward" else -1.0)
    if layout == "interleaved":  # pairs (2i, 2i + 1)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    if layout == "half":  # pairs (i, i + d/2), pair i's angle at both
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    else:  # half-split pairs, the angles laid out as the interleaved layout's (repeat_interleave)
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    return x * cos + _rotate_half(x) * sin


def roped(
    packed: Tensor, theirs, *, layout: str, exponent: str, direction: str, turned: str, values: bool, offset: str
) -> Tensor:
    """rope on the packed rows with the choices a learner may have made (each option's first value right)."""
    q, k, v = packed.split(SPLIT, dim=1)
    first = START if offset == "start" else 0

    def turn(x: Tensor) -> Tensor:
        return turned_row(x, first, layout=layout, exponent=exponent, direction=direction)

    q = turn(q) if turned in ("both", "queries") else q
    k = turn(k) if turned in ("both", "keys") else k
    return torch.cat((q, k, turn(v) if values else v), dim=1)


OPTIONS = {
    "layout": ["half", "interleaved", "interleaved_angles"],
    "exponent": list(EXPONENTS),
    "direction": ["forward", "backward"],
    "turned": ["both", "queries", "keys"],
    "values": [False, True],
    "offset": ["start", "zero"],
}


def _frequencies(exponent: str) -> str:
    return row(inverse_frequencies(exponent))


def rope(probe: Probe) -> list[Group]:
    function = probe.learner[NAME]

    def learner(start: int = START) -> nn.Module:
        return _Packed(lambda q, k, v: function(q, k, v, start, THETA))

    def both() -> tuple[nn.Module, nn.Module]:
        return learner(), _Packed(lambda q, k, v: minigpt_rope(q, k, v, START))

    fitting = Fitting(probe, NAME, "minigpt's rope (minigpt/model/positions.py)", both, _rows(), roped, OPTIONS, _where)

    def call(*args):
        """The learner's function on copies of the tensors given (whether it edits them is its own check)."""
        with torch.no_grad():
            return probe.call(NAME, function, *(a.clone() if isinstance(a, Tensor) else a for a in args))

    def returns() -> str | None:
        for dtype in (torch.float64, torch.float32):
            q, k, v = _rows().to(dtype).split(SPLIT, dim=1)
            said = _returns(call(q, k, v, START, THETA), (q, k, v))
            if said is not None:
                raise Stop(
                    f"your {NAME} returned {said} for q {shape(q)}, k {shape(k)} and v {shape(v)} in "
                    f"{str(dtype).removeprefix('torch.')}; return the three, q, k and v, each of its own shape and "
                    "dtype (k and v may have fewer heads than q)"
                )
        return None

    def layout(choices: dict) -> str | None:
        if choices["layout"] == "half":
            return None
        if choices["layout"] == "interleaved":
            return (
                f"your {NAME} pairs coordinate 2i with 2i + 1 (the RoFormer paper's interleaved layout); minigpt, as "
                "Hugging Face's Llama, pairs coordinate i with i + d/2 (the half-split layout): x cos + "
                "rotate_half(x) sin, rotate_half([x1, x2]) = [-x2, x1]; weights trained in one layout do not work "
                "in the other"
            )
        return (
            f"your {NAME} pairs coordinates i and i + d/2 (rotate_half) but lays the angles out as the interleaved "
            "layout does (each frequency twice side by side, repeat_interleave): pair i's angle belongs at "
            "coordinates i and i + d/2 both, torch.cat((angles, angles), dim=-1)"
        )

    def exponent(choices: dict) -> str | None:
        kind = choices["exponent"]
        if kind == "2i/d":
            return None
        what = {
            "i/d": "theta^(-i/d), the step of 2 left out (torch.arange(d // 2) / d)",
            "4i/d": "theta^(-2i/(d/2)), d/2 where d belongs",
            "+2i/d": "theta^(+2i/d), the exponent's minus sign lost, so the later pairs turn faster, not slower",
        }[kind]
        return (
            f"your {NAME} turns pair i at {what}: with d = {WIDTH} that is {_frequencies(kind)} radians a position; "
            f"inv_freq_i = theta^(-2i/d) is {_frequencies('2i/d')} (torch.arange(0, d, 2) / d)"
        )

    def direction(choices: dict) -> str | None:
        if choices["direction"] == "forward":
            return None
        return (
            f"your {NAME} turns each pair the other way, by -t inv_freq (sin's sign flipped, or rotate_half as "
            "[x2, -x1]): rotated = x cos + rotate_half(x) sin with rotate_half([x1, x2]) = [-x2, x1]"
        )

    def turned(choices: dict) -> str | None:
        if choices["turned"] == "both":
            return None
        done, left = ("queries", "keys") if choices["turned"] == "queries" else ("keys", "queries")
        return (
            f"your {NAME} turns the {done} but not the {left}: q_m . k_n then depends on where one of them is, not "
            "on the distance m - n; turn both"
        )

    def values(choices: dict) -> str | None:
        if not choices["values"]:
            return None
        return (
            f"your {NAME} turns the values too: rope turns only the queries and the keys, which meet in q . k; the "
            "values are mixed by the weights as they are (return v unchanged)"
        )

    def offset(choices: dict) -> str | None:
        if choices["offset"] == "start":
            return None
        return (
            f"your {NAME} turns the first row as position 0 whatever start says: under a KV cache a new token at "
            f"position start = {START} is turned as if it were at 0, while the cached keys were turned at their "
            "own positions; count the positions from start, torch.arange(start, start + T)"
        )

    def relative() -> str | None:
        q, k, v = _rows(6, seed=32).split(SPLIT, dim=1)
        scores = []
        for start in (0, 4):
            q_t, k_t, _ = call(q, k, v, start, THETA)
            scores.append(q_t[:, :1] @ k_t.transpose(-2, -1))  # query head 0 against the key head
        if close(scores[0], scores[1]):
            return None
        got, want = apart(scores[1][0, 0, 5], scores[0][0, 0, 5])
        return (
            f"your {NAME}'s scores q_m . k_n change when every position moves on by 4: the last query's scores "
            f"were {want} from position 0 and {got} from position 4; with rope they depend on m - n alone"
        )

    def cached() -> str | None:
        q, k, v = _rows().split(SPLIT, dim=1)
        whole = call(q, k, v, 0, THETA)
        first = call(*(t[:, :, :3] for t in (q, k, v)), 0, THETA)
        later = call(*(t[:, :, 3:] for t in (q, k, v)), 3, THETA)
        pieces = [torch.cat((a, b), dim=2) for a, b in zip(first, later)]
        for what, piece, one in zip(("query", "key", "value"), pieces, whole):
            if not close(piece[..., 3:, :], one[..., 3:, :]):
                got, want = apart(piece[0, 0, 4], one[0, 0, 4])
                return (
                    f"your {NAME} turns position 4's {what} to {got} when positions 3 and 4 come after a KV cache "
                    f"(start = 3), and to {want} in one pass over 0 .. 4: a row's turn depends on its position alone"
                )
        return None

    def first_position() -> str | None:
        q, k, v = _rows().split(SPLIT, dim=1)
        q_t, k_t, _ = call(q, k, v, 0, THETA)
        for what, given, out in (("query", q, q_t), ("key", k, k_t)):
            if not close(out[..., 0, :], given[..., 0, :]):
                got, want = apart(out[0, 0, 0], given[0, 0, 0])
                return (
                    f"your {NAME} turns position 0's {what} {want} into {got}: its angles are 0 x inv_freq = 0, so "
                    "rope leaves it as it is (cos 0 = 1, sin 0 = 0)"
                )
        return None

    def unchanged() -> str | None:
        q, k, v = _rows().split(SPLIT, dim=1)
        given = [t.clone() for t in (q, k, v)]
        with torch.no_grad():
            probe.call(NAME, function, *given, START, THETA)
        for what, now, was in zip("qkv", given, (q, k, v)):
            if not torch.equal(now, was):
                at = int((now != was).reshape(-1).nonzero()[0])
                after, before = (text[1:-1] for text in apart(now.reshape(-1)[at], was.reshape(-1)[at]))
                return (
                    f"your {NAME} changes {what} in place: its number {at} was {before} and is now {after}; compute "
                    "new tensors (x * cos + ..., not x.mul_(...) or x[...] = ...), since attention reads them again"
                )
        return None

    checks = [
        Check(f"{NAME} returns q, k and v, each of its input's shape and dtype, in float64 and float32", returns),
        fitting.check("layout", f"{NAME} pairs coordinate i with i + d/2 (the half-split layout)", layout),
        fitting.check("exponent", f"{NAME} turns pair i at theta^(-2i/d) radians a position", exponent),
        fitting.check("direction", f"{NAME} turns by +t inv_freq: rotate_half([x1, x2]) = [-x2, x1]", direction),
        fitting.check("turned", f"{NAME} turns the queries and the keys", turned),
        fitting.check("values", f"{NAME} returns the values unturned", values),
        fitting.check("offset", f"{NAME} counts the positions from start (start = {START}: a KV cache's)", offset),
        Check(f"{NAME}'s scores q_m . k_n depend on m - n alone (every position moved on by 4)", relative),
        Check(f"{NAME} turns positions 3, 4 after a KV cache (start = 3) as one pass over 0 .. 4 does", cached),
        Check(f"{NAME} leaves position 0 unturned (its angles are 0)", first_position),
        agrees_check(
            probe,
            NAME,
            both,
            _rows(),
            "minigpt's rope (minigpt/model/positions.py)",
            _where,
        ),
        Check(f"{NAME} leaves q, k and v unchanged (no in-place edit)", unchanged),
        device_check(probe, NAME, learner, _rows()),
        gradient_check(probe, NAME, both, _rows(), ()),
    ]
    return [Group(NAME, checks)]


def _where(packed: Tensor, at: tuple[int, ...]) -> str:
    """Where a row of the packed rows comes from: which of q, k and v, its position and example."""
    b, head, t = at
    which = f"query head {head}" if head < HEADS else "the key" if head < HEADS + KV_HEADS else "the value"
    return f"at position {START + t} of {which} of example {b}"
