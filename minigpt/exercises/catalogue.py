"""The exercises, as plain values (no torch): what each is, where the texts define it, what its file
defines, and what it replaces in a model trained with it (`[model] exercise = NAME`: the learner's
class built where minigpt builds its own, with the [model] values config.EXERCISE_MODEL says it
needs, set where the config leaves them out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import EXERCISE_DEFAULTS, EXERCISE_MODEL


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    source: str  # where the texts define it
    names: tuple[str, ...]  # what the learner's file must define
    replaces: str  # in a model trained with it

    @property
    def model(self) -> dict[str, Any]:
        """The [model] values its module needs (EXERCISE_DEFAULTS' as set where a config leaves them out)."""
        return {**EXERCISE_MODEL[self.name], **EXERCISE_DEFAULTS.get(self.name, {})}


EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        Exercise(
            "rmsnorm",
            "RMSNorm and a residual sublayer",
            "lesson 09",
            ("RMSNorm", "residual_sublayer"),
            "every norm (norm1, norm2, final_norm) is your RMSNorm (residual_sublayer: checked, not plugged in)",
        ),
        Exercise(
            "layernorm",
            "LayerNorm",
            "chapter 17.3",
            ("LayerNorm",),
            "every norm (norm1, norm2, final_norm) is your LayerNorm",
        ),
        Exercise(
            "ffn", "the position-wise FFN", "chapter 17.4", ("FeedForward",), "each block's FFN is your FeedForward"
        ),
        Exercise(
            "attention",
            "causal multi-head attention",
            "chapter 17.5 (MHA)",
            ("CausalSelfAttention",),
            "each block's attention is your CausalSelfAttention",
        ),
        Exercise(
            "block",
            "the pre-norm block",
            "chapter 17.5, Table 17.1",
            ("Block",),
            "every block is your Block, wiring minigpt's norms, attention and FFN",
        ),
        Exercise("swiglu", "the SwiGLU MLP", "lesson 09 (SwiGLU)", ("SwiGLU",), "each block's FFN is your SwiGLU"),
        Exercise(
            "rope",
            "rotary positions in Llama's half-split layout",
            "Su et al. 2021, RoFormer",
            ("apply_rope",),
            "every attention turns its queries and keys with your apply_rope",
        ),
        Exercise(
            "alibi",
            "ALiBi's slopes and bias",
            "Press et al. 2022, ALiBi",
            ("alibi_slopes", "alibi_bias"),
            "every attention adds your alibi_bias to its scores, with your alibi_slopes",
        ),
        Exercise(
            "gqa",
            "grouped-query attention",
            "Ainslie et al. 2023, GQA",
            ("GroupedQueryAttention",),
            "each block's attention is your GroupedQueryAttention, n_kv_head key and value heads shared by groups "
            "of query heads",
        ),
        Exercise(
            "attention_residual",
            "the softmax over depth",
            "Kimi Team 2026, Attention Residuals",
            ("DepthAttention",),
            "each sublayer's read over depth, and the final norm's, is your DepthAttention",
        ),
    )
}
assert list(EXERCISES) == list(EXERCISE_MODEL), "config.EXERCISE_MODEL and the catalogue name the same exercises"
