"""A Hugging Face folder of the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)
as an `Imported` model: config.json mapped onto [model] (rope, RMSNorm, SwiGLU, grouped-query
attention, each family's biases, rope's scaling rule, Mistral's sliding window) or refused naming
the key, the weights read one tensor at a time (model.safetensors, its shards, or
pytorch_model.bin) and joined into minigpt's tensors as llama_layout.py says, and the folder's
tokenizer.

What transformers computes is the reference: where config.json leaves a key out, transformers'
config class's default is taken (llama_layout.DEFAULTS), both config shapes transformers writes are
read (rope_theta + rope_scaling, and 5.x's rope_parameters), and rope's angles are computed in
float32 as transformers computes them ([model] rope_angles = "float32"), so every stage agrees
with transformers' model on the same folder.

Memory: the weights are never read whole. Each of minigpt's tensors is allocated once, in float32
(float64 for a float64 folder), filled from the file's tensors it is made of, read one at a time,
and each is dropped once copied: the import holds minigpt's model and at most one of the file's
tensors. Half-precision weights (bfloat16, float16) are widened to float32, which holds every one
of their values, so nothing is rounded.
"""

from __future__ import annotations

import contextlib
import json
import math
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import MinigptError, Phrase
from ..io import Progress, file_sha256, no_progress
from ..model.gpt import MiniGPT
from ..model.positions import RopeScaling, spelled
from . import hf
from . import llama_layout as layout
from .convert import (
    HALF,
    Imported,
    check_room,
    dtypes_of,
    flag_value,
    listed,
    literal,
    model_dtype,
    model_section,
    read_json,
    torch_load,
    whole_number,
)
from .export import EXTRA
from .hf_tokenizer import read_folder_tokenizer

GPT2 = "gpt2"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH, PYTORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"

# Keys of a mixture-of-experts model (Mixtral, Qwen2-MoE, DeepSeek, ...): none of the three families has them.
MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)

# safetensors' dtype names -> torch's (a header says which; the data is read only once accepted)
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


# ---------------------------------------------------------------- which reader


def folder_model_type(folder: Path) -> Any:
    """config.json's model_type (None when absent), or a refusal when the folder has no config.json."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinigptError(
            "{folder} is not a folder; pass a Hugging Face model folder (config.json, model.safetensors, tokenizer)",
            folder=folder,
        )
    if not (folder / "config.json").is_file():
        raise MinigptError("{folder} has no config.json; it is not a Hugging Face model folder", folder=folder)
    return read_json(folder / "config.json").get("model_type")


def read_hf_folder(folder: Path, context: int | None = None, progress: Progress = no_progress) -> Imported:
    """What `import hf` reads, by config.json's model_type: a GPT-2 folder (hf.py), or a Llama,
    Mistral or Qwen2 one (this module); any other model_type is refused naming it."""
    model_type = folder_model_type(folder)
    if model_type == GPT2:
        return hf.read_hf_gpt2(Path(folder), context=context, progress=progress)
    if model_type in layout.ARCHITECTURES:
        return read_hf_llama(Path(folder), context=context, progress=progress)
    known = ", ".join(json.dumps(t) for t in (GPT2, *layout.ARCHITECTURES))
    raise MinigptError(
        "{where}: model_type = {literal} is not one minigpt computes; it imports the model types {known} "
        "(GPT2LMHeadModel, {classes})",
        where=str(Path(folder) / "config.json"),
        literal="absent" if model_type is None else literal(model_type),
        known=known,
        classes=", ".join(layout.ARCHITECTURES.values()),
    )


# ---------------------------------------------------------------- config.json


def _refuse(where: str | Phrase, key: str, value: Any, why: str) -> MinigptError:
    return MinigptError("{where}: {key} = {literal}: {why}", where=where, key=key, literal=literal(value), why=why)


def _number(where: str | Phrase, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MinigptError(
            "{where}: {key} = {literal} is not a positive number", where=where, key=key, literal=literal(value)
        )
    return float(value)


def _rope_parameters(raw: dict[str, Any], where: str | Phrase) -> tuple[str, dict[str, Any], str, float]:
    """(rope_type, its parameters, the key holding them, rope_theta) as transformers reads them from
    either config shape: `rope_scaling` (older; rope_type or type) beside a top-level rope_theta, or
    5.x's `rope_parameters` holding rope_theta too. As in transformers, a rope_scaling wins over a
    rope_parameters, a rope_type over a type, and a rope_theta inside the parameters over one beside."""
    key = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    params = raw.get(key) or {}
    if not isinstance(params, dict):
        raise _refuse(where, key, params, "it is not an object of rope settings")
    nested = [name for name in params if name in ("full_attention", "sliding_attention")]
    if nested:  # per layer type (a config with layer_types): every layer is full attention here
        params = params.get("full_attention") or {}
        key = f"{key}.full_attention"
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in layout.ROPE_TYPES:
        raise _refuse(
            where,
            f"{key}.{'rope_type' if 'rope_type' in params else 'type'}",
            rope_type,
            "minigpt computes the rope types " + ", ".join(layout.ROPE_TYPES) + " only",
        )
    theta = params.get("rope_theta", raw.get("rope_theta", layout.DEFAULT_THETA))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise _refuse(where, "partial_rotary_factor", partial, "minigpt rotates every dimension of a head (1.0)")
    return rope_type, params, key, _number(where, "rope_theta", theta)


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
    """Mistral's sliding window (0: none), and every key that would make some layer attend
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
    if model_type == "mistral":
        window = raw.get("sliding_window", defaults["sliding_window"])
        return 0 if window is None else whole_number(where, "sliding_window", window)
    return 0


def _settings(raw: dict[str, Any], where: str | Phrase) -> dict[str, Any]:
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
    rope_type, params, rope_key, theta = _rope_parameters(raw, where)
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
        "scaling": scaling,
        "rope_angles": "float32",  # transformers computes rope's angles in float32, a float64 model's too
        "sliding_window": _check_attention(raw, model_type, n_layer, where),
        "vocab_size": whole_number(where, layout.VOCAB_SIZE, raw.get(layout.VOCAB_SIZE, defaults[layout.VOCAB_SIZE])),
        "rows": rows,
    }


# ---------------------------------------------------------------- the weights


class _Weights:
    """A folder's tensors by name: shapes and dtypes from the files' headers (`meta`, nothing read
    yet), each tensor's values read when asked (`read`), one at a time. model.safetensors, a
    sharded model.safetensors.index.json, pytorch_model.bin (read through a memory map) or its
    sharded index, in the order transformers prefers them."""

    def __init__(self, folder: Path, files: contextlib.ExitStack):
        self.folder, self._files = folder, files
        self.meta: dict[str, torch.Tensor] = {}  # name -> a tensor on the meta device, or the mapped one
        self.shown: dict[str, str] = {}  # name -> where it is, for messages
        self._readers: dict[str, Any] = {}  # name -> a safe_open handle, or the mapped .bin dict
        index: dict[str, str] | None = None  # a sharded folder's weight_map: tensor name -> file
        if (folder / SAFETENSORS).is_file():
            self.description, self.paths = SAFETENSORS, [folder / SAFETENSORS]
        elif (folder / SAFETENSORS_INDEX).is_file():
            self.paths, index = _shards(folder / SAFETENSORS_INDEX)
            self.description = f"{SAFETENSORS_INDEX} ({len(self.paths)} shards)"
        elif (folder / PYTORCH).is_file():
            self.description, self.paths = PYTORCH, [folder / PYTORCH]
        elif (folder / PYTORCH_INDEX).is_file():
            self.paths, index = _shards(folder / PYTORCH_INDEX)
            self.description = f"{PYTORCH_INDEX} ({len(self.paths)} shards)"
        else:
            raise MinigptError(
                "{folder} has no weights: no {a}, {b}, {c} or {d}",
                folder=folder,
                a=SAFETENSORS,
                b=SAFETENSORS_INDEX,
                c=PYTORCH,
                d=PYTORCH_INDEX,
            )
        for path in self.paths:
            self._open(path)
        if index is not None:
            absent = [name for name in index if name not in self.meta and not name.endswith(layout.IGNORED_SUFFIX)]
            if absent:
                raise MinigptError(
                    "{where} lists {listed}, which its shards do not hold; the folder is incomplete",
                    where=str(folder / self.description.split(" ")[0]),
                    listed=listed(absent),
                )

    def _open(self, path: Path) -> None:
        if path.suffix == ".safetensors":
            try:
                from safetensors import SafetensorError, safe_open
            except ImportError:
                raise MinigptError(
                    "reading {name} needs the safetensors package, which is not installed; {EXTRA}",
                    name=path.name,
                    EXTRA=EXTRA,
                ) from None
            try:
                handle = self._files.enter_context(safe_open(str(path), framework="pt"))
                tensors = {}
                for name in handle.keys():
                    part = handle.get_slice(name)
                    kind = part.get_dtype()
                    if kind not in _DTYPES:
                        raise MinigptError(
                            "{path}: {name} is stored as {kind}; minigpt reads float16, bfloat16, float32 and "
                            "float64 weights",
                            path=path,
                            name=name,
                            kind=kind,
                        )
                    tensors[name] = torch.empty(part.get_shape(), dtype=_DTYPES[kind], device="meta")
            except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
                raise MinigptError(
                    "{path} could not be read as safetensors ({exc}); it is truncated or damaged", path=path, exc=exc
                ) from None
            reader: Any = handle
        else:
            loaded = torch_load(path, "a Hugging Face model file")
            if not isinstance(loaded, dict):
                raise MinigptError(
                    "{path} holds a {name}, not a dict of named tensors", path=path, name=type(loaded).__name__
                )
            tensors = {str(name): tensor for name, tensor in loaded.items()}
            reader = loaded
        for name, tensor in tensors.items():
            if name.endswith(layout.IGNORED_SUFFIX):  # rope's inverse frequencies: computed, not learned
                continue
            if name in self.meta:
                raise MinigptError(
                    "{path} holds {name}, which {other} holds too; the folder is not one model",
                    path=path,
                    name=name,
                    other=self.shown[name],
                )
            self.meta[name], self.shown[name], self._readers[name] = tensor, path.name, reader

    def read(self, name: str) -> torch.Tensor:
        """The values of tensor `name`: its own copy from a safetensors file, or a view of the mapped .bin."""
        reader = self._readers[name]
        return reader[name] if isinstance(reader, dict) else reader.get_tensor(name)


def _shards(index: Path) -> tuple[list[Path], dict[str, str]]:
    """A sharded folder's files (sorted: model-00001-of-00003... in order) and its weight_map."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise MinigptError("{index} has no weight_map of tensor names to files; the folder is damaged", index=index)
    files = sorted(set(weight_map.values()))
    for name in files:
        if Path(name).name != name or not (index.parent / name).is_file():
            raise MinigptError(
                "{index} names the shard {name}, which is not a file in {folder}; the folder is incomplete",
                index=index,
                name=name,
                folder=index.parent,
            )
    return [index.parent / name for name in files], dict(weight_map)


def _needed(cfg: ModelConfig, vocab_size: int) -> tuple[list[layout.Parameter], dict[str, tuple[int, ...]], dict]:
    """The parameters a model of `cfg` stores, the shape each of transformers' tensors must have,
    and minigpt's shapes."""
    with torch.device("meta"):  # minigpt's own names and shapes, without allocating them
        ours = {name: tuple(t.shape) for name, t in MiniGPT(cfg, vocab_size).state_dict().items()}
    chosen = layout.parameters(cfg)
    shapes: dict[str, tuple[int, ...]] = {}
    for p in chosen:
        counts = layout.row_counts(p, cfg)
        if counts == (-1,):
            shapes[p.theirs[0]] = ours[p.ours]
        else:  # rows of minigpt's tensor, the rest of its shape
            shapes.update({name: (rows, *ours[p.ours][1:]) for name, rows in zip(p.theirs, counts)})
    return chosen, shapes, ours


def _check_tensors(weights: _Weights, cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """Every tensor the config's model needs, none other, each of its shape: from the headers alone."""
    head = layout.HEAD.theirs[0]
    tied_head = {head} if cfg.tie_embeddings else set()
    missing = [name for name in shapes if name not in weights.meta]
    if missing:
        raise MinigptError(
            "{where} lacks {listed}, which the config's model has; the weights are incomplete or not this model",
            where=where,
            listed=listed(missing),
        )
    extra = sorted(set(weights.meta) - set(shapes) - tied_head)
    if extra:
        raise MinigptError(
            "{where} holds {listed}, which no part of the config's model reads; minigpt imports the language model "
            "config.json describes (no other heads, layers or biases)",
            where=where,
            listed=listed(extra),
        )
    if tied_head and head in weights.meta:  # a tied folder may keep its head: it must be the table
        shapes = {**shapes, head: shapes[layout.TOKEN_TABLE.theirs[0]]}
    for name, shape in shapes.items():
        if name in weights.meta and tuple(weights.meta[name].shape) != shape:
            raise MinigptError(
                "{where}: {name} has shape {found_shape} but the config's model needs {needed}; the weights are "
                "not the config's model",
                where=where,
                name=name,
                found_shape=list(weights.meta[name].shape),
                needed=list(shape),
            )


def _finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite. A NaN or an infinity makes the sum NaN or infinite, so a finite
    sum says so at once (isfinite over every value costs 50 times as much); an infinite sum may be
    finite values overflowing, so only then is each value looked at."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def _state(
    weights: _Weights, cfg: ModelConfig, vocab_size: int, where: str, progress: Progress
) -> dict[str, torch.Tensor]:
    """minigpt's parameters, each allocated once and filled from the file's tensors it joins (read
    one at a time and dropped once copied), checked for finite values; a tied head is the table."""
    chosen, shapes, ours = _needed(cfg, vocab_size)
    _check_tensors(weights, cfg, shapes, where)
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    head = layout.HEAD.theirs[0]
    state: dict[str, torch.Tensor] = {}
    with progress("converting the weights", len(chosen)) as advance:
        for p in chosen:
            owned = torch.empty(ours[p.ours], dtype=dtype)
            row = 0
            for name in p.theirs:
                source = weights.read(name)
                owned[row : row + source.shape[0]].copy_(source)  # exact: float32 holds every half value
                row += source.shape[0]
                if p is layout.TOKEN_TABLE and cfg.tie_embeddings and head in weights.meta:
                    if not torch.equal(weights.read(head), source):
                        raise MinigptError(
                            "{where}: {head} differs from {table}, but config.json says {key} = true; the folder "
                            "is inconsistent",
                            where=where,
                            head=head,
                            table=name,
                            key=layout.CONFIG_KEYS["tie_embeddings"],
                        )
                del source
                if not _finite(owned[row - shapes[name][0] : row]):
                    raise MinigptError(
                        "{where}: {name} holds NaN or infinite values; the file is damaged",
                        where=where,
                        name=name,
                    )
            state[p.ours] = owned
            advance(1)
    if cfg.tie_embeddings:
        state[layout.HEAD.ours] = state[layout.TOKEN_TABLE.ours]  # one tensor, as MiniGPT ties them
    return state


# ---------------------------------------------------------------- the reader


def _trained_length(context: int | None, rows: int) -> int:
    if context is None:
        return rows
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= rows:
        raise MinigptError(
            "{context} {given}: the model was trained on texts of up to {rows} tokens (max_position_embeddings), "
            "so its context can be set to 1 .. {rows}; choose a number in that range (or leave {context} out to "
            "keep all {rows})",
            given=context,
            rows=rows,
        )
    return context


def read_hf_llama(folder: Path, context: int | None = None, progress: Progress = no_progress) -> Imported:
    """A LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM folder: config.json, the weights
    (model.safetensors, sharded or not, or pytorch_model.bin) and tokenizer.json. `context`: the
    longest text minigpt accepts unasked, max_position_embeddings unless given (fewer)."""
    folder = Path(folder)
    model_type = folder_model_type(folder)
    config_path = str(folder / "config.json")
    raw = read_json(folder / "config.json")
    settings = _settings(raw, config_path)
    rows, vocab_size, scaling = settings.pop("rows"), settings.pop("vocab_size"), settings.pop("scaling")
    trained = _trained_length(context, rows)
    if scaling is not None and scaling.kind == "dynamic" and trained != rows:
        # transformers' dynamic rule stretches past max_position_embeddings, whatever minigpt accepts unasked
        scaling = RopeScaling(**{**asdict(scaling), "original_context": rows, "name": ""})
    settings["rope_scaling"] = spelled(scaling) if scaling is not None else ""
    tokenizer, tokenizer_files = read_folder_tokenizer(folder)
    if tokenizer.vocab_size > vocab_size:
        raise MinigptError(
            "{where} writes {count} ids but the weights have {rows} rows ({key}); it is not this model's tokenizer",
            where=str(folder / tokenizer_files.split(" ")[0]),
            count=tokenizer.vocab_size,
            rows=vocab_size,
            key=layout.VOCAB_SIZE,
        )
    with contextlib.ExitStack() as files:
        weights = _Weights(folder, files)
        where = str(folder / weights.description.split(" ")[0])
        found = {name: (name, tensor) for name, tensor in weights.meta.items()}
        cfg = model_section(settings, trained, model_dtype(found, where), config_path)
        # minigpt's copy, then its checkpoint serialised; the files are mapped, but for an old non-zip .bin
        check_room(cfg, vocab_size, sum(p.stat().st_size for p in weights.paths if _read_whole(p)))
        state = _state(weights, cfg, vocab_size, where, progress)
        stored = dtypes_of(found)
    hashes = {path.name: file_sha256(path, progress) for path in weights.paths}
    return Imported(
        model=cfg,
        vocab_size=vocab_size,
        state=state,
        tokenizer=tokenizer,
        tokenizer_size=tokenizer.vocab_size,
        origin={
            "kind": f"hf-{model_type}",
            "path": str(folder.resolve()),
            "architecture": layout.ARCHITECTURES[model_type],
            "weights": weights.description,
            "sha256": hashes[weights.paths[0].name] if len(hashes) == 1 else hashes,
            "tokenizer": tokenizer_files,
            "position_rows": rows,
            "weights_dtype": stored,
            **({"widened": f"{stored} weights read as {cfg.dtype}, exactly"} if _widened(found) else {}),
        },
    )


def _read_whole(path: Path) -> bool:
    """Whether torch reads the file whole (a pre-zip pytorch_model.bin) rather than through a memory map."""
    return path.suffix == ".bin" and not zipfile.is_zipfile(path)


def _widened(found: dict[str, tuple[str, torch.Tensor]]) -> bool:
    return any(tensor.dtype in HALF for _, tensor in found.values())
