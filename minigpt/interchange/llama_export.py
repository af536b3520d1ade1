"""Export to the Llama family: a run whose model LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM or Phi3ForCausalLM computes, as a Hugging Face folder (config.json that
transformers 5 and 4.56 on read alike, model.safetensors in the run's dtype, the tokenizer), and a
LoRA run's adapters as PEFT saves them for that folder.

The family's block is lesson 09's: pre-norm RMSNorm, attention with rotary positions (grouped-query
heads, any head width), a SwiGLU FFN, residual adds. The four families differ only where they put
biases and windows and how much of a head rope turns: Llama biases W_Q, W_K, W_V and W_O together
(attention_bias) and the FFN's three matrices together (mlp_bias), Qwen2 biases W_Q, W_K and W_V
alone, Mistral has no biases and may have a sliding window, Phi-3 has no biases, may have a window,
and is the one whose rope rotates a share of each head (partial_rotary_factor, minigpt's
rope_fraction; the other three's rotate all of it). A run imported from one of them is written back
as that family (its origin's model_type); any other run as Phi-3 when its rope_fraction is below 1,
Qwen2 when exactly its W_Q, W_K, W_V are biased, Mistral when it has a window, Llama otherwise. What
no family expresses is refused, naming the key.

Tensor names are llama_layout.py's, the table the import reads too: minigpt's stacked `qkv` and
`W1` are split back into q_proj, k_proj, v_proj and gate_proj, up_proj along their rows (Phi-3's
qkv_proj and gate_up_proj are them whole). A tied head is stored once, as transformers stores it
(no lm_head.weight).

LoRA: minigpt adapts the stacked matrices, PEFT on Llama adapts q_proj, k_proj, v_proj (gate_proj,
up_proj) one by one. The stacked update B A splits exactly into one adapter per projection, each
with the same A and the rows of B that write that projection's rows, at the same rank and alpha;
PEFT on Phi-3 adapts qkv_proj and gate_up_proj, minigpt's stacked matrices themselves.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig, Residual
from ..model.positions import RopeScaling, parse_rope_scaling
from . import llama_layout as llama

FAMILIES = tuple(llama.ARCHITECTURES)  # config.json's model_type of each
NAMES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "phi3": "Phi-3"}
# What the family's block is: a model with all three is written as one of its folders (export.hf_family)
BLOCK = {"positions": "rope", "norm": "rmsnorm", "activation": "swiglu"}
BIAS_KEYS = {"qkv": "qkv_bias", "out": "out_bias", "W1": "ffn_bias", "W2": "ffn_bias"}  # part -> its switch
PART_OF = {"qkv_bias": "qkv", "out_bias": "out", "ffn_bias": "W1"}  # switch -> a part it biases


def is_family_block(cfg: ModelConfig) -> bool:
    return all(getattr(cfg, key) == value for key, value in BLOCK.items())


def _bias_key(cfg: ModelConfig, part: str) -> str:
    """The [model] key that gives part `part` its bias."""
    return "bias" if cfg.bias else BIAS_KEYS[part]


def family(cfg: ModelConfig, imported: str | None = None) -> str:
    """The family (model_type) a model is written as: the one it was imported from (`imported`),
    else the one its rope_fraction, biases and window say."""
    if imported in FAMILIES:
        return imported
    if cfg.rope_fraction != 1.0:
        return llama.PARTIAL_ROTARY[0]
    if cfg.biased("qkv") and not cfg.biased("out") and not cfg.biased("W1"):
        return "qwen2"
    return "mistral" if cfg.sliding_window else "llama"


def refusal(cfg: ModelConfig, model_type: str) -> str | None:
    """What keeps a model with the family's block (is_family_block) out of `model_type`, naming the
    key; None when that family computes it."""
    name = NAMES[model_type]
    if cfg.exercise != "none":
        return f"[model] exercise = {cfg.exercise!r}: a learner's module computes part of it, transformers its own"
    if cfg.norm_position != "pre":
        return f"[model] norm_position = {cfg.norm_position!r}: {name} is pre-norm"
    if cfg.residual_kind is not Residual.SUM:
        given = "false" if cfg.residual is False else repr(cfg.residual)
        return f"[model] residual = {given}: {name}'s blocks add each sublayer to the residual stream"
    if cfg.ffn_hidden == 0:
        return f"[model] ffn_hidden = 0: every {name} block has an MLP"
    if cfg.rope_fraction != 1.0 and model_type not in llama.PARTIAL_ROTARY:
        partial = " and ".join(NAMES[t] for t in llama.PARTIAL_ROTARY)
        return (
            f"[model] rope_fraction = {cfg.rope_fraction:g}: {name} rotates every coordinate of a head; {partial} "
            "(partial_rotary_factor) rotates a share of each"
        )
    scaling = rope_scaling(cfg)
    if scaling is not None and scaling.kind not in llama.FAMILY_ROPE_TYPES.get(model_type, llama.ROPE_TYPES):
        return f"[model] rope_scaling = {cfg.rope_scaling!r}: {name} reads no {scaling.kind} rope rule"
    biased = [part for part in ("qkv", "out", "W1") if cfg.biased(part)]
    if model_type in ("mistral", "phi3") and biased:
        key = _bias_key(cfg, biased[0])
        what = "with a sliding window" if model_type == "mistral" else "that rotates a share of each head"
        return f"[model] {key} = true: {name}, the family {what}, has no biases"
    if model_type == "qwen2" and biased != ["qkv"]:
        part = next(p for p in ("qkv", "out", "W1") if (p in biased) != (p == "qkv"))
        key, value = (BIAS_KEYS["qkv"], "false") if part == "qkv" else (_bias_key(cfg, part), "true")
        return f"[model] {key} = {value}: Qwen2 biases W_Q, W_K and W_V, and nothing else"
    if model_type == "llama" and cfg.biased("qkv") != cfg.biased("out"):
        on, off = ("qkv_bias", "out_bias") if cfg.biased("qkv") else ("out_bias", "qkv_bias")
        qwen2 = ", and Qwen2, which biases W_Q, W_K and W_V alone, has no FFN biases" if cfg.biased("qkv") else ""
        return (
            f"[model] {on} = true with {off} = false: Llama biases W_Q, W_K, W_V and W_O together "
            f"(attention_bias){qwen2}"
        )
    if cfg.sliding_window and model_type not in llama.WINDOWED:
        return f"[model] sliding_window = {cfg.sliding_window}: {name} attends to every earlier position"
    return None


# ---------------------------------------------------------------- config.json


def rope_scaling(cfg: ModelConfig) -> RopeScaling | None:
    return parse_rope_scaling(cfg.rope_scaling) if cfg.rope_scaling else None


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
    """transformers 5's rope_parameters: rope_type, rope_theta and the rule's settings, under the
    names llama_layout.ROPE_FIELDS gives them (the import reads the same table), each written when
    transformers needs it or it differs from transformers' default."""
    scaling = rope_scaling(cfg)
    if scaling is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    values = {"rope_type": scaling.kind, "rope_theta": cfg.rope_theta, "factor": scaling.factor}
    if scaling.kind in ("yarn", "llama3"):  # the length they scale against (minigpt's context when unset)
        values[llama.ORIGINAL_CONTEXT] = scaling.original_context or cfg.context
    default = RopeScaling(scaling.kind, scaling.factor)
    for theirs, ours in llama.ROPE_FIELDS[scaling.kind].items():
        value = getattr(scaling, ours)
        if scaling.kind == "llama3" or value != getattr(default, ours):
            values[theirs] = value
    return values


def rope_settings(cfg: ModelConfig) -> dict[str, Any]:
    """rope's settings under the keys of every transformers the extras allow (4.56 on), saying one
    thing: 5.x reads rope_parameters (rope_theta inside it), 4.x a top-level rope_theta beside
    rope_scaling (null: no rule) and would read theta 10000 unscaled without them. 5.x takes a
    rope_scaling over rope_parameters, with the rope_theta beside it, so the two spell one rule:
    rope_scaling is rope_parameters less its rope_theta (a key 4.x's rope validation warns of).
    Before 4.56, yarn took its factor from max_position_embeddings / original_max_position_embeddings
    instead of reading it, so a cropped import's rule was read otherwise: hence the extras' floor."""
    parameters = rope_parameters(cfg)
    scaling = {key: value for key, value in parameters.items() if key != "rope_theta"}
    return {
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling if rope_scaling(cfg) is not None else None,
        "rope_parameters": parameters,
    }


def max_positions(cfg: ModelConfig) -> int:
    """max_position_embeddings: the context, except that transformers' dynamic rule reads it as the
    length the model was trained at, which an import cropped with a shorter context keeps apart."""
    scaling = rope_scaling(cfg)
    if scaling is not None and scaling.kind == "dynamic" and scaling.original_context:
        return scaling.original_context
    return cfg.context


def config_json(cfg: ModelConfig, vocab_size: int, model_type: str) -> dict[str, Any]:
    """config.json as transformers 5 writes it for `model_type`, under llama_layout.CONFIG_KEYS' names,
    with rope's settings as 4.x reads them too (rope_settings); export.export_hf adds the dtype keys."""
    ours = {
        **{key: getattr(cfg, key) for key in llama.CONFIG_KEYS},
        "n_kv_head": cfg.kv_heads,
        "head_width": cfg.resolved_head_width,
        "context": max_positions(cfg),
    }
    values: dict[str, Any] = {
        "architectures": [llama.ARCHITECTURES[model_type]],
        "model_type": model_type,
        llama.VOCAB_SIZE: vocab_size,
        **{
            theirs: ours[key]
            for key, theirs in llama.CONFIG_KEYS.items()
            if key not in ("rope_theta", "sliding_window")
        },
        llama.ACTIVATION: "silu",
        **rope_settings(cfg),
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }
    for switch, theirs in llama.bias_keys(model_type).items():
        if isinstance(theirs, str):  # a key of config.json (Llama's); the other families' are fixed
            values[theirs] = cfg.biased(PART_OF[switch])
    if model_type in llama.PARTIAL_ROTARY:  # 5.x reads it inside rope_parameters, 4.x beside them
        values[llama.PARTIAL_ROTARY_FACTOR] = values["rope_parameters"][llama.PARTIAL_ROTARY_FACTOR] = cfg.rope_fraction
    if model_type in llama.WINDOWED:
        values["sliding_window"] = cfg.sliding_window or None
    if model_type == "llama":
        values["pretraining_tp"] = 1
    elif model_type == "qwen2":  # every layer full attention
        qwen2 = llama.DEFAULTS["qwen2"]
        values.update(use_sliding_window=False, sliding_window=None, max_window_layers=qwen2["max_window_layers"])
        values["layer_types"] = ["full_attention"] * cfg.n_layer
        if (
            cfg.resolved_head_width * cfg.n_head == cfg.n_embd
        ):  # Qwen2Config has no head_dim, only heads of other widths need it
            del values[llama.CONFIG_KEYS["head_width"]]
    return values


# ---------------------------------------------------------------- tensors


def _split(tensor: torch.Tensor, p: llama.Parameter, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """minigpt's tensor as transformers' tensors: whole, or its rows split as llama_layout says."""
    counts = llama.row_counts(p, cfg)
    pieces = (tensor,) if counts == (-1,) else torch.split(tensor, counts)
    return {name: piece.detach().contiguous().clone() for name, piece in zip(p.theirs, pieces, strict=True)}


def state(model, model_type: str) -> dict[str, torch.Tensor]:
    """A MiniGPT's parameters under the names of transformers' `model_type` (the head left out when tied)."""
    ours = model.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for p in llama.parameters(model.cfg, model_type):
        tensors.update(_split(ours[p.ours], p, model.cfg))
    return tensors


# ---------------------------------------------------------------- PEFT


def adapter_tensors(adapters: dict[str, torch.Tensor], cfg: ModelConfig, model_type: str) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapters (model/lora.adapter_state's names: `blocks.0.attention.qkv.lora_A`)
    under transformers' module names for `model_type` (`model.layers.0.self_attn.q_proj.lora_A.weight`):
    A shared by every projection a stacked matrix holds, B split by its rows."""
    weights = {p.ours: p for p in llama.parameters(cfg, model_type) if not p.bias}
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in adapters.items():
        matrix, factor = name.rsplit(".", 1)  # blocks.0.attention.qkv, lora_A
        p = weights[matrix + ".weight"]
        modules = [theirs.removesuffix(".weight") for theirs in p.theirs]
        if factor == "lora_A":
            pieces = {module: tensor for module in modules}
        else:
            pieces = {n.removesuffix(".weight"): t for n, t in _split(tensor, p, cfg).items()}
        for module, piece in pieces.items():
            tensors[f"{module}.{factor}.weight"] = piece.detach().contiguous().clone()
    return tensors


def target_modules(targets: list[str], model_type: str) -> list[str]:
    """The PEFT target_modules of minigpt's lora_targets: each projection's own name (q_proj, ...)."""
    block = {p.ours.split(".", 2)[2].removesuffix(".weight"): p for p in llama.BLOCKS[model_type] if not p.bias}
    parts = {"qkv": "attention.qkv", "out": "attention.out", "W1": "ffn.W1", "W2": "ffn.W2"}
    return [t.rsplit(".", 2)[1] for target in targets for t in block[parts[target]].theirs]
