"""A Hugging Face folder of the Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Phi3ForCausalLM) as an `Imported` model: config.json mapped onto [model] (llama_config.py: rope, on
a share of each head in Phi-3, RMSNorm, SwiGLU, grouped-query attention, each family's biases,
rope's scaling rule, Mistral's and Phi-3's sliding window) or refused naming the key, the weights
read one tensor at a time (llama_weights.py: model.safetensors, its shards, or pytorch_model.bin)
and joined into minigpt's tensors as llama_layout.py says, and the folder's tokenizer
(hf_tokenizer.py). This module decides which reader a folder needs and puts the three together.

What transformers computes is the reference: where config.json leaves a key out, transformers'
config class's default is taken (llama_layout.DEFAULTS), both config shapes transformers writes are
read (rope_theta + rope_scaling, and 5.x's rope_parameters), and rope's angles are computed in
float32 as transformers computes them ([model] rope_angles = "float32"), so every stage agrees
with transformers' model on the same folder.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import MinigptError
from ..io import Progress, file_sha256, no_progress
from ..rope_scaling import RopeScaling, spelled
from . import hf
from . import llama_layout as layout
from .convert import Imported, check_room, dtypes_of, literal, model_dtype, model_section, read_json
from .hf_tokenizer import read_folder_tokenizer
from .llama_config import read_settings
from .llama_weights import Weights, read_parameters, read_whole, widened

GPT2 = "gpt2"


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
    Mistral, Qwen2 or Phi-3 one (this module); any other model_type is refused naming it."""
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
    """A LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or Phi3ForCausalLM folder: config.json,
    the weights (model.safetensors, sharded or not, or pytorch_model.bin) and tokenizer.json. `context`: the
    longest text minigpt accepts unasked, max_position_embeddings unless given (fewer)."""
    folder = Path(folder)
    model_type = folder_model_type(folder)
    config_path = str(folder / "config.json")
    raw = read_json(folder / "config.json")
    settings = read_settings(raw, config_path)
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
        weights = Weights(folder, files)
        where = str(folder / weights.description.split(" ")[0])
        found = {name: (name, tensor) for name, tensor in weights.meta.items()}
        cfg = model_section(settings, trained, model_dtype(found, where), config_path)
        # minigpt's copy, then its checkpoint serialised; the files are mapped, but for an old non-zip .bin
        check_room(cfg, vocab_size, sum(p.stat().st_size for p in weights.paths if read_whole(p)))
        state = read_parameters(weights, cfg, vocab_size, model_type, where, progress)
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
            **({"widened": f"{stored} weights read as {cfg.dtype}, exactly"} if widened(found) else {}),
        },
    )
