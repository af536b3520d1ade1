"""A Llama-family folder's config.json mapped onto [model], as transformers reads it: where a key
is left out, transformers' config class's default (llama_layout.DEFAULTS); both config shapes
transformers writes (rope_theta + rope_scaling, and 5.x's rope_parameters); rope's scaling rule as a
RopeScaling; Mistral's and Phi-3's sliding window. What minigpt does not compute (a mixture of experts,
quantized weights, another activation, sliding-window layers in Qwen2, a rope type it lacks, a
partial_rotary_factor in a family whose transformers class ignores it, ...) is refused naming the
key and its value. Phi-3's partial_rotary_factor is [model] rope_fraction.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import MinigptError, Phrase
from ..rope_scaling import RopeScaling
from . import llama_layout as layout
from .convert import flag_value, literal, whole_number

# Keys of a mixture-of-experts model (Mixtral, Qwen2-MoE, DeepSeek, ...): none of the four families has them.
MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


def _refuse(where: str | Phrase, key: str, value: Any, why: str) -> MinigptError:
    return MinigptError("{where}: {key} = {literal}: {why}", where=where, key=key, literal=literal(value), why=why)


def _number(where: str | Phrase, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MinigptError(
            "{where}: {key} = {literal} is not a positive number", where=where, key=key, literal=literal(value)
        )
    return float(value)


def _rope_parameters(
    raw: dict[str, Any], model_type: str, where: str | Phrase
) -> tuple[str, dict[str, Any], str, float, float]:
    """(rope_type, its parameters, the key holding them, rope_theta, partial_rotary_factor) as
    transformers reads them from either config shape: `rope_scaling` (older; rope_type or type)
    beside a top-level rope_theta, or 5.x's `rope_parameters` holding rope_theta too. As in
    transformers, a rope_scaling wins over a rope_parameters, a rope_type over a type, and a
    rope_theta or partial_rotary_factor inside the parameters over one beside."""
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise _refuse(where, key, params, "it is not an object of rope settings")
    nested = [name for name in params if name in ("full_attention", "sliding_attention")]
    if nested:  # per layer type (a config with layer_types): every layer is full attention here
        params = params.get("full_attention") or {}
        key = f"{key}.full_attention"
    rope_type = params.get("rope_type", params.get("type", "default"))
    types = layout.FAMILY_ROPE_TYPES.get(model_type, layout.ROPE_TYPES)
    if rope_type not in types:
        raise _refuse(
            where,
            f"{key}.{'rope_type' if 'rope_type' in params else 'type'}",
            rope_type,
            f"minigpt computes the rope types {', '.join(types)} only"
            + (f" in {layout.ARCHITECTURES[model_type]}" if types != layout.ROPE_TYPES else ""),
        )
    theta = params.get("rope_theta", raw.get("rope_theta", layout.DEFAULT_THETA))
    name = layout.PARTIAL_ROTARY_FACTOR
    partial = params.get(name, raw.get(name, 1.0))
    if model_type not in layout.PARTIAL_ROTARY and partial != 1.0:
        holders = ", ".join(f'{layout.ARCHITECTURES[t]} (model_type "{t}")' for t in layout.PARTIAL_ROTARY)
        raise _refuse(
            where,
            name,
            partial,
            f"transformers' {layout.ARCHITECTURES[model_type]} rotates every dimension of a head (1.0) whatever "
            f"this says; {holders} rotates a share of each head",
        )
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise _refuse(where, name, partial, "the share of each head rope rotates is a number in (0, 1]")
    return rope_type, params, key, _number(where, "rope_theta", theta), float(partial)


def _rope_scaling(
    raw: dict[str, Any], rope_type: str, params: dict[str, Any], key: str, max_positions: int, where: str | Phrase
) -> RopeScaling | None:
    """The scaling rule transformers' ROPE_INIT_FUNCTIONS compute for `rope_type`, as a RopeScaling
    (positions.inverse_frequencies computes the same bits). linear and dynamic scale against
    max_position_embeddings (dynamic past it only); llama3 and yarn against
    original_max_position_embeddings: a top-level one wins (transformers moves it into the rope
    parameters), else the parameters', else max_position_embeddings."""
    if rope_type == "default":
        return None

    def needed(name: str) -> Any:
        if name not in params:
            raise MinigptError(
                "{where}: {key} has rope_type {literal} but no {name}, which that rule needs",
                where=where,
                key=key,
                literal=literal(rope_type),
                name=name,
            )
        return params[name]

    def at_least_one(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1 or math.isinf(value):
            raise _refuse(where, f"{key}.{name}", value, "a scaling factor is a number of at least 1")
        return float(value)

    original = max_positions
    if rope_type in ("yarn", "llama3"):
        value = raw.get(layout.ORIGINAL_CONTEXT, params.get(layout.ORIGINAL_CONTEXT, max_positions))
        original = whole_number(where, layout.ORIGINAL_CONTEXT, value)
    factor = needed("factor")
    if factor is None and rope_type == "yarn":  # transformers: the ratio of the two lengths
        factor = max_positions / original
    fields: dict[str, Any] = {}
    if rope_type in ("yarn", "llama3"):
        fields["original_context"] = original
    for theirs, ours in layout.ROPE_FIELDS[rope_type].items():
        value = needed(theirs) if rope_type == "llama3" else params.get(theirs)
        if ours in ("beta_fast", "beta_slow"):
            value = value or {"beta_fast": 32.0, "beta_slow": 1.0}[ours]  # transformers' `or 32`, `or 1`
        if value is None:
            continue
        if ours == "truncate":
            fields[ours] = flag_value(where, f"{key}.{theirs}", value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _refuse(where, f"{key}.{theirs}", value, "it is not a number")
        else:
            fields[ours] = float(value)
    return RopeScaling(rope_type, at_least_one("factor", factor), **fields)


def _check_attention(raw: dict[str, Any], model_type: str, n_layer: int, where: str | Phrase) -> int:
    """Mistral's and Phi-3's sliding window (0: none), and every key that would make some layer attend
    otherwise, refused: Qwen2's sliding-window layers."""
    defaults = layout.DEFAULTS[model_type]
    if model_type == "qwen2":
        if flag_value(where, "use_sliding_window", raw.get("use_sliding_window", False)):
            raise _refuse(
                where,
                "use_sliding_window",
                True,
                "some layers attend within a sliding window, which minigpt does not compute; only Qwen2 folders "
                "with use_sliding_window = false can be imported",
            )
        types = raw.get("layer_types")
        if types is not None:
            sliding = [i for i, t in enumerate(types) if t != "full_attention"] if isinstance(types, list) else [0]
            if sliding or len(types) != n_layer:
                raise _refuse(
                    where,
                    "layer_types",
                    types,
                    'minigpt computes full attention in every layer (a list of num_hidden_layers "full_attention")',
                )
        return 0
    if model_type in layout.WINDOWED:
        window = raw.get("sliding_window", defaults["sliding_window"])
        return 0 if window is None else whole_number(where, "sliding_window", window)
    return 0


def read_settings(raw: dict[str, Any], where: str | Phrase) -> dict[str, Any]:
    """config.json -> the keyword arguments of ModelConfig (less context and dtype), the vocabulary
    rows and max_position_embeddings, with transformers' defaults for absent keys; what minigpt
    does not compute is refused naming the key."""
    model_type = raw["model_type"]
    defaults = layout.DEFAULTS[model_type]
    architectures = raw.get("architectures")
    if architectures is not None and architectures != [layout.ARCHITECTURES[model_type]]:
        raise _refuse(
            where,
            "architectures",
            architectures,
            f"minigpt imports the language model {layout.ARCHITECTURES[model_type]} of this model_type only",
        )
    quantized = raw.get("quantization_config")
    if quantized:
        raise _refuse(
            where,
            "quantization_config",
            quantized.get("quant_method", quantized) if isinstance(quantized, dict) else quantized,
            "the weights are quantized, which minigpt does not read; import the unquantized model",
        )
    for key in MOE_KEYS:
        if raw.get(key):
            raise _refuse(
                where, key, raw[key], "a mixture of experts, which minigpt does not compute (one FFN per block)"
            )
    tp = raw.get("pretraining_tp", 1)
    if tp is not None and tp != 1:
        raise _refuse(where, "pretraining_tp", tp, "minigpt imports models whose pretraining_tp is 1")
    activation = raw.get(layout.ACTIVATION, defaults[layout.ACTIVATION])
    if activation != "silu":
        raise _refuse(
            where,
            layout.ACTIVATION,
            activation,
            'minigpt computes SwiGLU with silu as the gate (hidden_act = "silu") only',
        )

    def get(ours: str) -> tuple[str, Any]:
        key = layout.CONFIG_KEYS[ours]
        return key, raw.get(key, defaults.get(key))

    n_layer = whole_number(where, *get("n_layer"))
    n_head = whole_number(where, *get("n_head"))
    n_embd = whole_number(where, *get("n_embd"))
    kv_key, kv = get("n_kv_head")
    n_kv_head = n_head if kv is None else whole_number(where, kv_key, kv)
    if n_head % n_kv_head:
        raise MinigptError(
            "{where}: {head_key} = {n_head} is not a multiple of {kv_key} = {n_kv_head}; each key and value "
            "head is shared by an equal number of query heads",
            where=where,
            head_key=layout.CONFIG_KEYS["n_head"],
            n_head=n_head,
            kv_key=kv_key,
            n_kv_head=n_kv_head,
        )
    head_key, head_dim = get("head_width")
    if head_dim is None and n_embd % n_head:
        raise MinigptError(
            "{where}: {embd_key} = {n_embd} is not divisible by {head_key} = {n_head} and there is no "
            "{dim_key}; the width of a head is not defined",
            where=where,
            embd_key=layout.CONFIG_KEYS["n_embd"],
            n_embd=n_embd,
            head_key=layout.CONFIG_KEYS["n_head"],
            n_head=n_head,
            dim_key=head_key,
        )
    d = n_embd // n_head if head_dim is None else whole_number(where, head_key, head_dim)
    if d % 2:
        raise _refuse(where, head_key, d, "rope turns a head's dimensions in pairs, so a head's width is even")
    eps_key, eps = get("norm_eps")
    biases = {}
    for switch, source in layout.bias_keys(model_type).items():
        biases[switch] = source if isinstance(source, bool) else flag_value(where, source, raw.get(source, False))
    rows = whole_number(where, *get("context"))
    rope_type, params, rope_key, theta, partial = _rope_parameters(raw, model_type, where)
    rotated = int(d * partial)  # transformers' int(head_dim * partial_rotary_factor), as ModelConfig.rotary_width
    if rotated % 2 or rotated < 2:
        raise _refuse(
            where,
            layout.PARTIAL_ROTARY_FACTOR,
            partial,
            f"it rotates {rotated} of each head's {d} coordinates; rope turns them in pairs, which minigpt "
            "computes for an even number of at least 2 only",
        )
    scaling = _rope_scaling(raw, rope_type, params, rope_key, rows, where)
    return {
        "n_layer": n_layer,
        "n_head": n_head,
        "n_kv_head": 0 if n_kv_head == n_head else n_kv_head,
        "n_embd": n_embd,
        "head_width": 0 if d * n_head == n_embd else d,
        "ffn_hidden": whole_number(where, *get("ffn_hidden")),
        "norm": "rmsnorm",
        "norm_eps": _number(where, eps_key, eps),
        "activation": "swiglu",
        "bias": False,
        **biases,
        "tie_embeddings": flag_value(where, *get("tie_embeddings")),
        "positions": "rope",
        "rope_theta": theta,
        "rope_fraction": partial,
        "scaling": scaling,
        "rope_angles": "float32",  # transformers computes rope's angles in float32, a float64 model's too
        "sliding_window": _check_attention(raw, model_type, n_layer, where),
        "vocab_size": whole_number(where, layout.VOCAB_SIZE, raw.get(layout.VOCAB_SIZE, defaults[layout.VOCAB_SIZE])),
        "rows": rows,
    }
