"""The Llama family's layout, written once: which of transformers' tensors hold each of minigpt's
parameters for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Phi3ForCausalLM folders.
Import (llama.py) and export read this one table, so the two directions cannot disagree.

The four families share one block: RMSNorm, attention with rotary positions and grouped-query
heads, RMSNorm, a SwiGLU FFN (down(silu(gate(x)) * up(x))). minigpt stacks what Llama, Mistral and
Qwen2 keep apart: W_Q, W_K and W_V are one `qkv` matrix (the query heads' rows, then the key
heads', then the value heads'), and the FFN's gate and up projections are one `W1` (gate rows, then
up rows), so a parameter of ours is one or more of theirs joined along the rows, and split back on
export. Phi-3 stacks them as minigpt does (qkv_proj, gate_up_proj), so each of its tensors is one
of ours whole; it is also the family whose rope rotates a share of each head (partial_rotary_factor:
minigpt's rope_fraction), which Llama, Mistral and Qwen2 do not read. Every matrix is nn.Linear's
[out, in] in both: nothing is transposed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ModelConfig


@dataclass(frozen=True)
class Parameter:
    """One of minigpt's parameters and the tensors it is made of; `{i}` stands for the block's index."""

    ours: str  # minigpt's name (model/gpt.py, model/layers.py)
    theirs: tuple[str, ...]  # transformers' names, joined along dim 0 in this order
    part: str | None = None  # the linear part (qkv, out, W1, W2) whose bias switch says whether a bias exists
    bias: bool = False  # a bias vector rather than a weight
    tied: bool = False  # the head: the token table itself when tie_word_embeddings, not stored on its own

    def at(self, i: int) -> Parameter:
        return replace(self, ours=self.ours.format(i=i), theirs=tuple(t.format(i=i) for t in self.theirs))


def _linear(ours: str, part: str, *theirs: str) -> tuple[Parameter, Parameter]:
    """A linear layer's weight, then its bias (present where `part` is biased)."""
    return (
        Parameter(f"{ours}.weight", tuple(f"{t}.weight" for t in theirs), part),
        Parameter(f"{ours}.bias", tuple(f"{t}.bias" for t in theirs), part, bias=True),
    )


LAYER = "model.layers.{i}."
TOKEN_TABLE = Parameter("token_table.weight", ("model.embed_tokens.weight",))
FINAL_NORM = Parameter("final_norm.weight", ("model.norm.weight",))
HEAD = Parameter("head.weight", ("lm_head.weight",), tied=True)
OUTSIDE = (TOKEN_TABLE, FINAL_NORM, HEAD)


def _block(attention: tuple[str, ...], gate_up: tuple[str, ...]) -> tuple[Parameter, ...]:
    """A block's parameters, `attention` and `gate_up` being the modules joined into qkv and W1."""
    return (
        Parameter("blocks.{i}.norm1.weight", (LAYER + "input_layernorm.weight",)),
        *_linear("blocks.{i}.attention.qkv", "qkv", *(LAYER + f"self_attn.{x}" for x in attention)),
        *_linear("blocks.{i}.attention.out", "out", LAYER + "self_attn.o_proj"),
        Parameter("blocks.{i}.norm2.weight", (LAYER + "post_attention_layernorm.weight",)),
        *_linear("blocks.{i}.ffn.W1", "W1", *(LAYER + f"mlp.{x}" for x in gate_up)),
        *_linear("blocks.{i}.ffn.W2", "W2", LAYER + "mlp.down_proj"),
    )


BLOCK = _block(("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # Llama, Mistral, Qwen2
STACKED_BLOCK = _block(("qkv_proj",), ("gate_up_proj",))  # Phi-3: stacked as minigpt stacks them

# config.json's model_type -> the class transformers builds for it
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
BLOCKS = {"llama": BLOCK, "mistral": BLOCK, "qwen2": BLOCK, "phi3": STACKED_BLOCK}
# The families whose rope rotates the first int(head_dim x partial_rotary_factor) coordinates of a
# head (transformers' Phi3 apply_rotary_pos_emb); Llama's, Mistral's and Qwen2's rotate all of them
PARTIAL_ROTARY = ("phi3",)
WINDOWED = ("mistral", "phi3")  # the families with one sliding_window for every layer


def parameters(cfg: ModelConfig, model_type: str) -> list[Parameter]:
    """Every parameter a model of `cfg` stores in a `model_type` folder, its names filled in: biases
    only on biased parts, the head only when untied."""
    chosen = [p for p in OUTSIDE if not (p.tied and cfg.tie_embeddings)]
    for i in range(cfg.n_layer):
        chosen += [p.at(i) for p in BLOCKS[model_type] if not p.bias or cfg.biased(p.part)]
    return chosen


def row_counts(p: Parameter, cfg: ModelConfig) -> tuple[int, ...]:
    """How many rows of minigpt's tensor each of transformers' tensors holds, in order: the query,
    key and value heads' rows of `qkv`; the gate's and the up projection's of `W1`; all of them
    where one tensor of theirs holds it (Phi-3's stacked ones)."""
    if len(p.theirs) == 1:
        return (-1,)  # one tensor, whole
    if ".attention.qkv." in p.ours:
        d = cfg.resolved_head_width
        return (cfg.n_head * d, cfg.kv_heads * d, cfg.kv_heads * d)
    return (cfg.ffn_hidden, cfg.ffn_hidden)  # W1: the gate's rows, then the up projection's


# ---------------------------------------------------------------- config.json

# [model] key -> the config.json key holding it, in all four families (import reads them, export writes them)
CONFIG_KEYS = {
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_kv_head": "num_key_value_heads",
    "n_embd": "hidden_size",
    "head_width": "head_dim",
    "ffn_hidden": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "context": "max_position_embeddings",
    "rope_theta": "rope_theta",
    "sliding_window": "sliding_window",  # Mistral's and Phi-3's
}
# rope_fraction: inside rope_parameters (5.x) or beside them (4.x); read by the PARTIAL_ROTARY families
PARTIAL_ROTARY_FACTOR = "partial_rotary_factor"
VOCAB_SIZE = "vocab_size"  # rows of the token table and the head (not a [model] key)
ACTIVATION = "hidden_act"  # "silu": the gate's non-linearity of SwiGLU, the only one minigpt computes
DEFAULT_THETA = 10000.0  # transformers' default_theta, where neither config shape names one

# What transformers' config classes (5.x) take for a key config.json leaves out, per model_type (held to
# LlamaConfig(), MistralConfig(), Qwen2Config() and Phi3Config() themselves by tests/test_import_llama.py).
# None: derived (num_key_value_heads -> num_attention_heads, head_dim -> hidden_size // heads) or absent.
DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "pretraining_tp": 1,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": None,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": 4096,  # read only with use_sliding_window = true
        "max_window_layers": 28,
    },
    "phi3": {
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "sliding_window": None,
    },
}


def bias_keys(model_type: str) -> dict[str, str | bool]:
    """Where each family's biases come from: {part switch: config.json key, or a fixed value}.
    Llama: attention_bias on W_Q, W_K, W_V and W_O, mlp_bias on the FFN's; Qwen2: W_Q, W_K and W_V
    always, never W_O or the FFN; Mistral and Phi-3: none."""
    if model_type == "llama":
        return {"qkv_bias": "attention_bias", "out_bias": "attention_bias", "ffn_bias": "mlp_bias"}
    if model_type == "qwen2":
        return {"qkv_bias": True, "out_bias": False, "ffn_bias": False}
    return {"qkv_bias": False, "out_bias": False, "ffn_bias": False}


# rope_type -> positions.RopeScaling's field for each key of transformers' rope parameters it reads
# (rope_theta, factor and original_max_position_embeddings are read for every rule that has them)
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# model_type -> the rope types of ROPE_TYPES its transformers class computes, where not all of them:
# Phi3Config takes default and longrope only (its validate_rope), and minigpt lacks longrope
FAMILY_ROPE_TYPES = {"phi3": ("default",)}
ROPE_FIELDS = {
    "linear": {},
    "dynamic": {},
    "yarn": {
        "attention_factor": "attention_factor",
        "beta_fast": "beta_fast",
        "beta_slow": "beta_slow",
        "mscale": "mscale",
        "mscale_all_dim": "mscale_all_dim",
        "truncate": "truncate",
    },
    "llama3": {"low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor"},
}
ORIGINAL_CONTEXT = "original_max_position_embeddings"  # positions.RopeScaling.original_context
# Tensors an old pytorch_model.bin may hold that are not parameters: rope's inverse frequencies.
IGNORED_SUFFIX = "rotary_emb.inv_freq"
