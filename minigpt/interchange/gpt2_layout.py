"""GPT-2's layout, written once: which of GPT-2's tensors holds each of minigpt's parameters and in
which layout, and which GPT2Config key holds each [model] setting. Import (convert.py, for Hugging
Face GPT-2 folders and for nanoGPT checkpoints, which kept GPT-2's names) and export (export.py)
both read these tables, so the two directions cannot disagree.

GPT-2's Conv1D stores a weight as [in, out], nn.Linear as [out, in]: those are transposed, either
way. nanoGPT kept the names but uses nn.Linear, so its checkpoints are read untransposed. GPT-2
always has biases; a minigpt model without them is exported with zeros there, which computes the
same. The head is the token table when the embeddings are tied, and then GPT-2 stores it once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Parameter:
    """One parameter under both names; `{i}` in a name stands for the block's index."""

    ours: str  # minigpt's name (model/gpt.py, model/layers.py)
    theirs: str  # GPT2LMHeadModel's name
    conv1d: bool = False  # stored [in, out] by GPT-2's Conv1D: transposed into and out of nn.Linear's [out, in]
    # a bias: minigpt's name of the weight it adds one number per row to. GPT-2 always has it; a
    # minigpt model without biases lacks it.
    bias_of: str | None = None
    tied: bool = False  # the token table itself when [model] tie_embeddings: not stored on its own

    def at(self, i: int) -> Parameter:
        return replace(
            self,
            ours=self.ours.format(i=i),
            theirs=self.theirs.format(i=i),
            bias_of=None if self.bias_of is None else self.bias_of.format(i=i),
        )


def _layer(ours: str, theirs: str, conv1d: bool = False) -> tuple[Parameter, Parameter]:
    """A layer's weight, then its bias."""
    weight = Parameter(f"{ours}.weight", f"{theirs}.weight", conv1d=conv1d)
    return weight, Parameter(f"{ours}.bias", f"{theirs}.bias", bias_of=weight.ours)


TOKEN_TABLE = Parameter("token_table.weight", "transformer.wte.weight")
POSITION_TABLE = Parameter("position_table.weight", "transformer.wpe.weight")
HEAD = Parameter("head.weight", "lm_head.weight", tied=True)

# The model's parameters outside the blocks, then one block's, in the order import reads them.
OUTSIDE = (TOKEN_TABLE, POSITION_TABLE, *_layer("final_norm", "transformer.ln_f"), HEAD)
BLOCK = (
    *_layer("blocks.{i}.norm1", "transformer.h.{i}.ln_1"),
    *_layer("blocks.{i}.attention.qkv", "transformer.h.{i}.attn.c_attn", conv1d=True),  # W_Q | W_K | W_V in both
    *_layer("blocks.{i}.attention.out", "transformer.h.{i}.attn.c_proj", conv1d=True),
    *_layer("blocks.{i}.norm2", "transformer.h.{i}.ln_2"),
    *_layer("blocks.{i}.ffn.W1", "transformer.h.{i}.mlp.c_fc", conv1d=True),
    *_layer("blocks.{i}.ffn.W2", "transformer.h.{i}.mlp.c_proj", conv1d=True),
)

# The causal mask GPT-2 and nanoGPT (without flash attention) keep in each block as buffers: not parameters.
MASK_BUFFERS = ("transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias")

# GPT2LMHeadModel's names start with this, its lm_head aside; GPT2Model's, and OpenAI's original
# upload's, do not.
PREFIX = "transformer."


def parameters(n_layer: int) -> list[Parameter]:
    """Every parameter of a GPT-2 of `n_layer` blocks, its names filled in."""
    return list(OUTSIDE) + [parameter.at(i) for i in range(n_layer) for parameter in BLOCK]


def prefixed(name: str) -> str:
    """A tensor's name as GPT2LMHeadModel spells it, whether or not the file left out the prefix."""
    return name if name.startswith(PREFIX) or name == HEAD.theirs else PREFIX + name


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"\d+"))


_MASKS = tuple(_pattern(template) for template in MASK_BUFFERS)


def is_mask_buffer(name: str) -> bool:
    return any(mask.fullmatch(name) for mask in _MASKS)


# ---------------------------------------------------------------- config.json


MODEL_TYPE = "gpt2"  # config.json's model_type


@dataclass(frozen=True)
class Setting:
    """One GPT2Config key and its default (what a config.json that leaves it out means)."""

    key: str
    default: Any


# [model] key (vocab_size: the model's; context: the position table's rows) -> GPT2Config's.
SETTINGS = {
    "vocab_size": Setting("vocab_size", 50257),
    "context": Setting("n_positions", 1024),
    "n_embd": Setting("n_embd", 768),
    "n_layer": Setting("n_layer", 12),
    "n_head": Setting("n_head", 12),
    "ffn_hidden": Setting("n_inner", None),  # None: 4 n_embd
    "activation": Setting("activation_function", "gelu_new"),
    "norm_eps": Setting("layer_norm_epsilon", 1e-5),
    "tie_embeddings": Setting("tie_word_embeddings", True),
}

# GPT2Config's attribute_map: a config.json may use either name.
ALIASES = {
    "n_embd": "hidden_size",
    "n_positions": "max_position_embeddings",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
}

# transformers' activation names -> minigpt's. gelu_new, gelu_pytorch_tanh and gelu_python_tanh are
# one formula (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))); gelu and gelu_python the exact one.
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
}
# minigpt's activation -> the name export writes: the first of transformers' names for it, the one
# GPT-2's own config uses ("gelu_new" for the tanh approximation, "gelu" for the exact one).
EXPORTED_ACTIVATIONS = {ours: theirs for theirs, ours in reversed(ACTIVATIONS.items())}
