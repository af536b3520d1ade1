"""The checks of the FFN exercises: `ffn` (chapter 17.4: ReLU(x W1 + b1) W2 + b2) and `swiglu`
(lesson 09: W2 (SiLU(gate) * value), [gate | value] = n W1), each against minigpt's FeedForward
(minigpt/model/layers.py) with the same weights.

Both must return the model's width (the lesson's "returning the hidden-width MLP vector" is the
first thing checked, and nothing else can be compared until it holds), act on each position by
itself, and call their two Linear layers as modules (a trace records `hidden` where it enters W2).
A wrong output is explained by the known mistakes that reproduce it (common.Fitting): another
activation or none, the activation after W2, a bias left out, the input added back (the residual
add is the block's); for SwiGLU the gate and value taken from the wrong columns of n W1 (swapped,
or alternate columns), another activation, SiLU on the product or on both halves, an addition.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import ModelConfig
from ...model.layers import FeedForward
from .common import (
    Check,
    Fitting,
    Group,
    Probe,
    Stop,
    against,
    agrees_check,
    close,
    linear_calls,
    module_checks,
    parameters_check,
    randn,
    row,
    shape,
)
from .norms import pair

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,
    "none": lambda t: t,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}
WIDTH, HIDDEN = 4, 8


def _rows(positions: int = 3) -> Tensor:
    return randn(2, positions, WIDTH, seed=11) * 1.5


def _reference(activation: str, hidden: int = HIDDEN, bias: bool = True) -> nn.Module:
    cfg = ModelConfig(n_embd=WIDTH, n_head=2, ffn_hidden=hidden, activation=activation, bias=bias, dtype="float64")
    return FeedForward(cfg).double()


def _linear_names(hidden: int, widen: int, bias: bool = True) -> dict[str, list[int]]:
    names = {
        "W1.weight": [widen * hidden, WIDTH],
        "W1.bias": [widen * hidden],
        "W2.weight": [WIDTH, hidden],
        "W2.bias": [WIDTH],
    }
    return {k: v for k, v in names.items() if bias or not k.endswith("bias")}


def _no_bias_check(name: str, build: Callable[..., nn.Module], widen: int) -> Check:
    def run() -> str | None:
        got = {k: list(t.shape) for k, t in build(WIDTH, HIDDEN, False).state_dict().items()}
        if got != _linear_names(HIDDEN, widen, bias=False):
            return (
                f"{name}({WIDTH}, {HIDDEN}, bias=False) has the parameters {', '.join(got)}: pass `bias` on to both "
                "Linear layers (a [model] bias = false run has none)"
            )
        return None

    return Check(f"{name}({WIDTH}, {HIDDEN}, bias=False) builds without biases", run)


def _width_check(probe: Probe, name: str, build: Callable[..., nn.Module]) -> Check:
    """The lesson's failure mode "returning the hidden-width MLP vector": nothing else compares until it holds."""

    def run() -> str | None:
        for dtype in (torch.float32, torch.float64):
            x = _rows().to(dtype)
            with torch.no_grad():
                out = probe.forward(name, build(WIDTH, HIDDEN).to(dtype), x)
            if isinstance(out, Tensor) and out.shape[:-1] == x.shape[:-1] and out.shape[-1] != WIDTH:
                raise Stop(
                    f"your {name} returns the hidden-width vector: [2, 3, {WIDTH}] became {shape(out)} "
                    f"({out.shape[-1]} numbers a position); the down projection W2 must bring it back to width "
                    f"{WIDTH} before the residual add"
                )
            if not isinstance(out, Tensor) or out.shape != x.shape:
                raise Stop(
                    f"your {name} turns a {list(x.shape)} input into {shape(out)}; it must return [B, T, "
                    "C], one row per position"
                )
            if out.dtype != dtype:
                return (
                    f"your {name} turns a {str(dtype).removeprefix('torch.')} input into "
                    f"{str(out.dtype).removeprefix('torch.')}"
                )
        return None

    return Check(
        f"{name} returns the model's width: [2, 3, {WIDTH}] in, [2, 3, {WIDTH}] out, in float32 and float64", run
    )


def _position_wise_check(probe: Probe, name: str, both) -> Check:
    def run() -> str | None:
        mine, _ = both()
        x = _rows(4)
        moved = x.clone()
        moved[:, 3] += 2.0
        with torch.no_grad():
            a, b = probe.forward(name, mine, x), probe.forward(name, mine, moved)
        changed = [p for p in range(3) if not close(a[:, p], b[:, p])]
        if changed:
            return (
                f"your {name} mixes positions: changing position 3's input changed position {changed[0]}'s output; "
                "it must transform each position by itself, with the same weights"
            )
        return None

    return Check(f"{name} transforms each position by itself (position 3 changes nothing at 0, 1, 2)", run)


def _calls_linears_check(probe: Probe, name: str, build: Callable[..., nn.Module]) -> Check:
    def run() -> str | None:
        module = build(WIDTH, HIDDEN)

        def forward() -> None:
            with torch.no_grad():
                probe.forward(name, module, _rows())

        calls = linear_calls(module, ("W1", "W2"), forward)
        for linear, what in (("W1", "x"), ("W2", "hidden")):
            if calls[linear] != 1:
                return (
                    f"your {name} calls self.{linear} {calls[linear]} times: call it once, as a module, "
                    f"self.{linear}({what}) (a trace records what enters it; a product with "
                    f"self.{linear}.weight skips that)"
                )
        return None

    return Check(f"{name} calls self.W1 and self.W2 once each, as modules", run)


def _residual_words(name: str) -> Callable[[dict], str | None]:
    def words(choices: dict) -> str | None:
        if not choices["residual"]:
            return None
        return (
            f"your {name} adds its input back (x + ...): the residual add is the block's, residual1 + ffn; "
            "return the down projection's output alone"
        )

    return words


def _common_checks(probe: Probe, name: str, build, both, widen: int) -> tuple[list[Check], list[Check]]:
    """The checks every FFN gets, before and after its own."""
    first = [
        parameters_check(
            lambda: build(WIDTH, HIDDEN), f"{name}({WIDTH}, {HIDDEN})", _linear_names(HIDDEN, widen), "W1 and W2"
        ),
        _no_bias_check(name, build, widen),
        _width_check(probe, name, build),
    ]
    last = [
        _position_wise_check(probe, name, both),
        agrees_check(probe, name, both, _rows(), "minigpt's FeedForward (minigpt/model/layers.py)"),
        _calls_linears_check(probe, name, build),
        *module_checks(
            probe, name, lambda: build(WIDTH, HIDDEN), both, _rows(), ("W1.weight", "W1.bias", "W2.weight", "W2.bias")
        ),
    ]
    return first, last


# ---------------------------------------------------------------- ffn (chapter 17.4)


def ffn(probe: Probe) -> list[Group]:
    def build(width: int, hidden: int, *bias: bool) -> nn.Module:
        return probe.build("FeedForward", width, hidden, *bias)

    both = pair(lambda: build(WIDTH, HIDDEN), lambda: _reference("relu"))

    def compute(x, theirs, *, activation, place, b1_used, b2_used, residual):
        pre = x @ theirs.W1.weight.T + (theirs.W1.bias if b1_used else 0)
        b2 = theirs.W2.bias if b2_used else 0
        if place == "between":
            out = ACTIVATIONS[activation](pre) @ theirs.W2.weight.T + b2
        else:
            out = ACTIVATIONS[activation](pre @ theirs.W2.weight.T + b2)
        return x + out if residual else out

    fitting = Fitting(
        probe,
        "FeedForward",
        "ReLU(x W1 + b1) W2 + b2",
        both,
        _rows(),
        compute,
        {
            "activation": ["relu", "none", "gelu", "sigmoid", "tanh", "silu"],
            "place": ["between", "after"],
            "b1_used": [True, False],
            "b2_used": [True, False],
            "residual": [False, True],
        },
    )

    def chapter_example() -> str | None:
        module = build(2, 3)
        with torch.no_grad():
            module.W1.weight.copy_(torch.tensor([[1.0, -1.0, 0.0], [0.0, 1.0, 1.0]]).T)  # W1 [C, F], stored [F, C]
            module.W2.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]).T)
            module.W1.bias.zero_()
            module.W2.bias.zero_()
            for given, expected in (([-1.0, 1.0], [1.0, 1.0]), ([1.0, -1.0], [1.0, 0.0])):
                out = probe.forward("FeedForward", module, torch.tensor([[given]], dtype=torch.float64))
                if not close(out, want := torch.tensor([[expected]], dtype=torch.float64)):
                    got, chapter, _ = against(out, want)
                    return (
                        f"on chapter 17.4's W1 and W2, {row(given)} became {got}; the chapter gives {chapter} (x W1, "
                        "then ReLU, then W2)"
                    )
        return None

    def activation(choices: dict) -> str | None:
        if choices["place"] == "after":
            return "your FeedForward applies its activation after W2: it belongs between, ReLU(x W1 + b1) W2 + b2"
        if choices["activation"] == "relu":
            return None
        if choices["activation"] == "none":
            return (
                "your FeedForward has no ReLU: two linear maps then collapse into one affine map (chapter 17.4); "
                "hidden = ReLU(x W1 + b1)"
            )
        return f"your FeedForward uses {choices['activation']} where chapter 17.4 uses ReLU"

    def biases(choices: dict) -> str | None:
        left_out = [b for b, used in (("b1", choices["b1_used"]), ("b2", choices["b2_used"])) if not used]
        if not left_out:
            return None
        return f"your FeedForward leaves out {' and '.join(left_out)}: self.W1(x) and self.W2(hidden) add them"

    first, last = _common_checks(probe, "FeedForward", build, both, widen=1)
    checks = [
        *first,
        fitting.check("activation", "FeedForward puts ReLU between W1 and W2", activation),
        fitting.check("biases", "FeedForward adds both biases, b1 and b2", biases),
        fitting.check(
            "residual", "FeedForward returns its update alone (the block adds x)", _residual_words("FeedForward")
        ),
        Check("FeedForward gives chapter 17.4's rows: [-1, 1] -> [1, 1] and [1, -1] -> [1, 0]", chapter_example),
        *last,
    ]
    return [Group("FeedForward", checks)]


# ---------------------------------------------------------------- swiglu (lesson 09)


def swiglu(probe: Probe) -> list[Group]:
    def build(width: int, hidden: int, *bias: bool) -> nn.Module:
        return probe.build("SwiGLU", width, hidden, *bias)

    both = pair(lambda: build(WIDTH, HIDDEN), lambda: _reference("swiglu"))

    def compute(x, theirs, *, split, activation, opened, combine, residual):
        both_halves = theirs.W1(x)
        if split.startswith("interleaved"):  # alternate columns: h[..., ::2], h[..., 1::2]
            first, second = both_halves[..., ::2], both_halves[..., 1::2]
        else:
            first, second = both_halves.chunk(2, dim=-1)
        gate, value = (second, first) if split.endswith("swapped") else (first, second)
        act = ACTIVATIONS[activation]
        join = (lambda a, b: a * b) if combine == "multiply" else (lambda a, b: a + b)
        if opened == "gate":
            hidden = join(act(gate), value)
        elif opened == "both":
            hidden = join(act(gate), act(value))
        else:  # the activation after the gate meets the value
            hidden = act(join(gate, value))
        out = theirs.W2(hidden)
        return x + out if residual else out

    fitting = Fitting(
        probe,
        "SwiGLU",
        "W2(SiLU(gate) * value)",
        both,
        _rows(),
        compute,
        {
            "split": ["halves", "swapped", "interleaved", "interleaved_swapped"],
            "activation": ["silu", "sigmoid", "relu", "gelu", "none"],
            "opened": ["gate", "both", "product"],
            "combine": ["multiply", "add"],
            "residual": [False, True],
        },
    )

    def one_component() -> str | None:
        module = build(2, 1)
        n = torch.tensor([[[5.0, 1.0]]], dtype=torch.float64)
        with torch.no_grad():
            module.W2.weight.fill_(1.0)
            for linear in (module.W1, module.W2):
                linear.bias.zero_()
            for gate_row, expected in (([0.0, 0.0], 0.0), ([1.0, 0.0], float(F.silu(torch.tensor(5.0)) * 5))):
                module.W1.weight.copy_(torch.tensor([gate_row, [1.0, 0.0]]))  # the gate, then the value: 5
                out = probe.forward("SwiGLU", module, n)
                if not close(out, want := torch.full((1, 1, 2), expected, dtype=torch.float64), 1e-6):
                    shown, right, _ = against(out, want)
                    if expected == 0.0:
                        return (
                            f"a gate of 0 let the value through: gate 0, value 5 gave {shown}; SiLU(0) = 0, so that "
                            "component must pass nothing"
                        )
                    return f"gate 5, value 5 gave {shown}; SiLU(5) * 5 on each output is {right}"
        return None

    def split(choices: dict) -> str | None:
        kind = choices["split"]
        if kind == "halves":
            return None
        if kind == "swapped":
            return (
                "your SwiGLU takes the second half of self.W1(n) as the gate: n W1 = [gate | value], the gate is the "
                "first F columns (W1.chunk(2, dim=-1) gives gate, value)"
            )
        which = "even" if kind == "interleaved" else "odd"
        return (
            f"your SwiGLU takes the gate from the {which} columns of self.W1(n) and the value from the others "
            "(h[..., ::2], h[..., 1::2]): n W1 = [gate | value] side by side, the gate the first F columns and the "
            "value the last F (gate, value = self.W1(n).chunk(2, dim=-1))"
        )

    def opened(choices: dict) -> str | None:
        if choices["opened"] == "gate":
            return None
        if choices["opened"] == "both":
            return "your SwiGLU applies SiLU to the value too: only the gate is opened, SiLU(gate) * value"
        return "your SwiGLU applies SiLU after multiplying, SiLU(gate * value): open the gate first, SiLU(gate) * value"

    def activation(choices: dict) -> str | None:
        words = {
            "silu": None,
            "sigmoid": "sigmoid(gate) (a GLU)",
            "relu": "ReLU(gate) (a ReGLU)",
            "gelu": "GELU(gate) (a GeGLU)",
            "none": "the gate itself, unactivated (a bilinear GLU)",
        }[choices["activation"]]
        if words is None:
            return None
        return f"your SwiGLU multiplies the value by {words}: SwiGLU's is SiLU(gate) = gate * sigmoid(gate)"

    def combine(choices: dict) -> str | None:
        if choices["combine"] == "multiply":
            return None
        return (
            "your SwiGLU adds SiLU(gate) and value: the gate multiplies the value element by element, "
            "SiLU(gate) * value"
        )

    first, last = _common_checks(probe, "SwiGLU", build, both, widen=2)
    checks = [
        *first,
        fitting.check("split", "SwiGLU's gate is the first half of self.W1(n), its value the second", split),
        fitting.check("activation", "SwiGLU opens the gate with SiLU", activation),
        fitting.check("opened", "SwiGLU applies SiLU to the gate alone, before the product", opened),
        fitting.check("combine", "SwiGLU multiplies SiLU(gate) by the value", combine),
        fitting.check("residual", "SwiGLU returns its update alone (the block adds x)", _residual_words("SwiGLU")),
        Check("SwiGLU's one-component gate: gate 0 passes nothing, gate 5 passes SiLU(5) of the value", one_component),
        *last,
    ]
    return [Group("SwiGLU", checks)]
