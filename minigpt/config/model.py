"""`[model]`: what the model is, key by key; and what an exercise's learner's module needs of it.

Each key is a field that says its type, default, range and help once (fields.py); the properties
below name what is derived from the keys (the key and value heads, a head's width, the layers
Attention Residuals counts), so no module derives them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from .fields import spec

# `[model] exercise`: what each exercise's learner's module needs of [model] (minigpt/exercises/catalogue.py
# says the rest of each); the FFN ones, and the block, need an FFN in every block.
EXERCISE_MODEL: dict[str, dict[str, Any]] = {
    "rmsnorm": {"norm": "rmsnorm"},
    "layernorm": {"norm": "layernorm"},
    "ffn": {"activation": "relu"},
    "attention": {},
    "block": {"norm_position": "pre", "residual": True},
    "swiglu": {"activation": "swiglu"},
    # the learner's rope turns whole heads by its own arithmetic, with no scaling rule
    "rope": {"positions": "rope", "rope_fraction": 1.0, "rope_scaling": "", "rope_angles": "dtype"},
    "alibi": {"positions": "alibi"},
    "gqa": {"head_width": 0},  # its heads are n_embd / n_head wide; n_kv_head: EXERCISE_DEFAULTS
    "attention_residual": {"residual": "attention"},
}
EXERCISES_WITH_FFN = ("ffn", "block", "swiglu")
# Values an exercise sets where the config leaves the key out, and a config may choose otherwise, though
# not as the key's own default, which would leave the exercise's part out of the model (gqa with
# n_kv_head = 0 would share no key and value head).
EXERCISE_DEFAULTS: dict[str, dict[str, Any]] = {"gqa": {"n_kv_head": 2}}


class Residual(Enum):
    """What the `residual` key (true, false or "attention", as TOML writes it) makes of each sublayer's
    output: added to the stream (SUM, the chapter's x + sublayer(x)), the output alone (NONE, "Remove
    it and watch"), or a learned mix over depth that each sublayer reads (ATTENTION, Attention
    Residuals)."""

    SUM = "sum"
    NONE = "none"
    ATTENTION = "attention"


@dataclass
class ModelConfig:
    context: int = spec(
        32,
        "the length the model trains at: rows of the learned position table; with any other positions the "
        "longest text it accepts unless read past it on purpose (extrapolate, rope scaling)",
        minimum=1,
    )
    n_layer: int = spec(4, "number of transformer blocks", minimum=1)
    n_head: int = spec(4, "attention heads per block", minimum=1)
    n_embd: int = spec(128, "model width C (a multiple of n_head, unless head_width is set)", minimum=1)
    ffn_hidden: int = spec(512, "hidden width F of the position-wise FFN (0: no FFN, attention only)", minimum=0)
    norm_eps: float = spec(1e-5, "epsilon added to the variance inside each norm", positive=True)
    dropout: float = spec(
        0.0, "dropout probability (0 for exact teaching runs)", minimum=0.0, maximum=1.0, exclusive_max=True
    )
    norm: str = spec(
        "layernorm",
        "normalisation (none: the identity where each norm stands)",
        choices=("layernorm", "rmsnorm", "none"),
    )
    norm_position: str = spec("pre", "pre-norm (chapter 17.5) or post-norm (17.6)", choices=("pre", "post"))
    activation: str = spec(
        "relu",
        "FFN non-linearity: relu, gelu (exact, erf), gelu_tanh (the tanh approximation GPT-2 uses) or swiglu",
        choices=("relu", "gelu", "gelu_tanh", "swiglu"),
    )
    bias: bool = spec(True, "biases in the linear layers and in LayerNorm (RMSNorm has none)")
    qkv_bias: bool = spec(
        False, "biases on W_Q, W_K and W_V even with bias = false (Qwen2's attention; Llama's attention_bias)"
    )
    out_bias: bool = spec(False, "a bias on W_O even with bias = false (Llama's attention_bias)")
    ffn_bias: bool = spec(False, "biases on the FFN's W1 and W2 even with bias = false (Llama's mlp_bias)")
    n_kv_head: int = spec(
        0,
        "key and value heads (grouped-query attention): each is read by n_head / n_kv_head query heads; "
        "0: n_head, one key and value head per query head (multi-head attention)",
        minimum=0,
    )
    head_width: int = spec(
        0,
        "width d of each attention head; 0: n_embd / n_head (set it where a model's heads are narrower or "
        "wider than that, as some imported ones are)",
        minimum=0,
    )
    tie_embeddings: bool = spec(False, "share the token table with the vocabulary head")
    dtype: str = spec("float32", "parameter dtype; float64 for exact teaching runs", choices=("float32", "float64"))
    positions: str = spec(
        "learned",
        "learned: a position table added to the token row; none: no table, the input is the token row alone; "
        "rope: rotary positions, each query and key rotated by its position inside attention; alibi: a linear "
        "bias on the attention scores, -slope x distance, a slope per head; sinusoidal: Vaswani et al.'s fixed "
        "table of sines and cosines added to the token row, defined at every position; t5: T5's relative bias "
        "on the scores, learned per head and bucket of distance, shared by every block",
        choices=("learned", "none", "rope", "alibi", "sinusoidal", "t5"),
    )
    rope_theta: float = spec(
        10000.0,
        "rope's base: dimension pair i of a head rotates at rope_theta^(-2i/d) radians a position",
        positive=True,
    )
    rope_fraction: float = spec(
        1.0,
        "the share of each head's width that rope rotates (GPT-NeoX's rotary_pct, transformers' "
        "partial_rotary_factor): the first int(d x rope_fraction) coordinates, the rest pass unrotated",
        minimum=0.0,
        maximum=1.0,
        positive=True,
    )
    t5_buckets: int = spec(
        32,
        "positions = t5: buckets of distance, a learned bias per head each; half hold one distance each "
        "(0, 1, ...), the rest distances growing logarithmically up to t5_max_distance",
        minimum=2,
    )
    t5_max_distance: int = spec(
        128,
        "positions = t5: the distance from which on every distance shares the last bucket",
        minimum=2,
    )
    rope_scaling: str = spec(
        "",
        "the model's own rope scaling rule, always applied (an imported model's rope_scaling, e.g. "
        "llama3:32,original_context=8192); empty: none. Reading past the trained length is chosen per command instead",
    )
    rope_angles: str = spec(
        "dtype",
        "the arithmetic of rope's angles: dtype (the model's: a float64 model's rope is exact) or float32 "
        "(transformers', so an imported model computes what transformers computes)",
        choices=("dtype", "float32"),
    )
    sliding_window: int = spec(
        0,
        "attention reads at most this many keys back (Mistral's sliding_window); minigpt refuses texts longer "
        "than it rather than compute another attention; 0: no window",
        minimum=0,
    )
    residual: bool | str = spec(
        True,
        "the skip connections: x + sublayer(...) (false: x = sublayer(...) alone; attention: Attention "
        "Residuals, each sublayer reads a learned softmax mix of the embedding and every earlier sublayer's output)",
        choices=(True, False, "attention"),
    )
    attention_residual_blocks: int = spec(
        0,
        'with residual = "attention": 0 mixes every earlier sublayer output (full Attention Residuals); N mixes '
        "the embedding and N block sums (Block AttnRes: the sublayers split into N equal blocks, summed inside each)",
        minimum=0,
    )
    init: str = spec(
        "gpt2",
        "the initial weights: gpt2 (N(0, 0.02) everywhere, W_O and W2, which write into the residual stream, "
        "scaled by 1/sqrt(2 n_layer)); xavier (Glorot uniform for every matrix, tables N(0, 1/n_embd), as "
        "Xiong et al. 2020 initialise, the scheme their Theorem 1 studies)",
        choices=("gpt2", "xavier"),
    )
    exercise: str = spec(
        "none",
        "a learner's module in place of minigpt's (minigpt exercise): rmsnorm or layernorm at every norm, ffn "
        "or swiglu as each FFN, attention or gqa as each attention, block as each block, rope or alibi as the "
        "positions inside attention, attention_residual as each read over depth; none: minigpt's own",
        choices=("none", *EXERCISE_MODEL),
    )

    @property
    def residual_kind(self) -> Residual:
        """The `residual` key as what it is (Residual); the key keeps its TOML values, so every run's
        config and hash stay as they were."""
        return {True: Residual.SUM, False: Residual.NONE, "attention": Residual.ATTENTION}[self.residual]

    @property
    def rotary_width(self) -> int:
        """The coordinates of a head rope rotates: int(d x rope_fraction), d itself at 1.0."""
        return int(self.resolved_head_width * self.rope_fraction)

    @property
    def kv_heads(self) -> int:
        """Key and value heads: n_kv_head, or n_head when it is 0 (multi-head attention)."""
        return self.n_kv_head or self.n_head

    @property
    def resolved_head_width(self) -> int:
        """d, the width of one attention head as the model builds it: the key head_width, or n_embd /
        n_head where the key is 0 (derived)."""
        return self.head_width or self.n_embd // self.n_head

    def biased(self, part: str) -> bool:
        """Whether linear part `part` (qkv, out, W1, W2) has a bias: bias, or its own switch."""
        own = {"qkv": self.qkv_bias, "out": self.out_bias, "W1": self.ffn_bias, "W2": self.ffn_bias}[part]
        return self.bias or own

    @property
    def layers(self) -> int:
        """The layers Attention Residuals counts: every attention and every FFN sublayer, in order."""
        return self.n_layer * (2 if self.ffn_hidden > 0 else 1)

    @property
    def layers_per_residual_block(self) -> int:
        """Attention Residuals: the layers whose outputs one block sums (1: the full form)."""
        return self.layers // (self.attention_residual_blocks or self.layers)


# [model] keys added after checkpoints were first written: one stored without them was trained with
# their defaults, which is what every earlier model computed.
LATER_MODEL_KEYS = (
    "positions",
    "residual",
    "exercise",
    "rope_theta",
    "attention_residual_blocks",
    "qkv_bias",
    "out_bias",
    "ffn_bias",
    "n_kv_head",
    "head_width",
    "rope_scaling",
    "rope_angles",
    "sliding_window",
    "rope_fraction",
    "t5_buckets",
    "t5_max_distance",
    "init",
)


def model_section_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`key: a-value != b-value` for every [model] key on which two model sections disagree."""
    later = {k: getattr(ModelConfig(), k) for k in LATER_MODEL_KEYS}  # absent from older checkpoints
    a, b = {**later, **a}, {**later, **b}
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
