"""A Hugging Face GPT-2 folder as an `Imported` model: config.json's settings (mapped onto [model] or
refused, naming the key), the weights from model.safetensors or pytorch_model.bin (Conv1D's
[in, out] matrices transposed), and the byte-level BPE tokenizer from tokenizer.json or
vocab.json + merges.txt.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, models

from ..errors import MinigptError, Phrase
from ..io import Progress, file_sha256, no_progress
from ..text.tokenizer import TextTokenizer, byte_level_tokenizer
from . import gpt2_layout as gpt2
from .convert import (
    Imported,
    check_room,
    check_rows,
    dtypes_of,
    flag_value,
    head_tied,
    kept_rows,
    literal,
    minigpt_state,
    model_dtype,
    model_section,
    read_json,
    read_tokenizer_file,
    renamed,
    torch_load,
    whole_number,
)
from .export import EXTRA

EOT = "<|endoftext|>"  # GPT-2's one special token, its last id (50,256)


# ---------------------------------------------------------------- GPT-2's config.json

# Flags of GPT2Config that change what attention computes: minigpt computes the defaults only.
_ATTENTION_FLAGS = {
    "scale_attn_weights": (True, "divides the attention scores by sqrt(d) when true"),
    "scale_attn_by_inverse_layer_idx": (False, "divides block i's attention scores by i + 1 as well"),
    "reorder_and_upcast_attn": (False, "scales the keys before the product and upcasts it"),
    "add_cross_attention": (False, "adds a cross-attention layer to every block (an encoder-decoder)"),
}


def _gpt2_settings(raw: dict[str, Any], where: str | Phrase) -> dict[str, Any]:
    """config.json -> the keyword arguments of ModelConfig (less context and dtype) and the vocab
    size, with GPT2Config's defaults for absent keys; what minigpt cannot compute is refused."""
    if "model_type" not in raw:
        raise MinigptError(
            "{where} has no model_type; minigpt imports GPT-2 folders (model_type = {literal}) only",
            where=where,
            literal=literal(gpt2.MODEL_TYPE),
        )
    if raw["model_type"] != gpt2.MODEL_TYPE:
        raise MinigptError(
            "{where}: model_type = {literal} is not {literal2}; minigpt computes GPT-2's architecture only, "
            "so it imports GPT-2 folders only",
            where=where,
            literal=literal(raw["model_type"]),
            literal2=literal(gpt2.MODEL_TYPE),
        )

    def get(key: str, default: Any) -> Any:
        alias = gpt2.ALIASES.get(key)
        if key in raw and alias in raw and raw[key] != raw[alias]:
            raise MinigptError(
                "{where}: {key} = {literal} and {alias} = {literal2} disagree; they name the same setting",
                where=where,
                key=key,
                literal=literal(raw[key]),
                alias=alias,
                literal2=literal(raw[alias]),
            )
        return raw.get(key, raw.get(alias, default)) if alias else raw.get(key, default)

    def setting(ours: str) -> tuple[str, Any]:
        """GPT2Config's key for [model] key `ours`, and the file's value (GPT2Config's default where absent)."""
        key, default = gpt2.SETTINGS[ours].key, gpt2.SETTINGS[ours].default
        return key, get(key, default)

    for key, (default, what) in _ATTENTION_FLAGS.items():
        if flag_value(where, key, get(key, default)) != default:
            raise MinigptError(
                "{where}: {key} = {literal}: it {what}, which minigpt does not compute; only GPT-2 folders with "
                "{key} = {literal2} can be imported",
                where=where,
                key=key,
                literal=literal(not default),
                what=what,
                literal2=literal(default),
            )
    n_embd, n_head = whole_number(where, *setting("n_embd")), whole_number(where, *setting("n_head"))
    embd_key, head_key = gpt2.SETTINGS["n_embd"].key, gpt2.SETTINGS["n_head"].key
    if n_embd % n_head:
        raise MinigptError(
            "{where}: {embd_key} = {n_embd} is not divisible by {head_key} = {n_head}; every head reads an "
            "equal share of the width, so this folder is not a model GPT-2 can be",
            where=where,
            embd_key=embd_key,
            n_embd=n_embd,
            head_key=head_key,
            n_head=n_head,
        )
    inner_key, inner = setting("ffn_hidden")
    activation_key, activation = setting("activation")
    if activation not in gpt2.ACTIVATIONS:
        raise MinigptError(
            "{where}: {activation_key} = {literal} is not one minigpt computes; it computes {join}",
            where=where,
            activation_key=activation_key,
            literal=literal(activation),
            join=", ".join(gpt2.ACTIVATIONS),
        )
    eps_key, eps = setting("norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise MinigptError(
            "{where}: {eps_key} = {literal} is not a positive number",
            where=where,
            eps_key=eps_key,
            literal=literal(eps),
        )
    return {
        "n_layer": whole_number(where, *setting("n_layer")),
        "n_head": n_head,
        "n_embd": n_embd,
        "ffn_hidden": 4 * n_embd if inner is None else whole_number(where, inner_key, inner),  # GPT-2: None means 4C
        "norm_eps": float(eps),
        "activation": gpt2.ACTIVATIONS[activation],
        "tie_embeddings": flag_value(where, *setting("tie_embeddings")),
        "bias": True,  # GPT-2 always has biases
        "vocab_size": whole_number(where, *setting("vocab_size")),
        "rows": whole_number(where, *setting("context")),
    }


def _safetensors_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:
        raise MinigptError(
            "reading {name} needs the safetensors package, which is not installed; {EXTRA}", name=path.name, EXTRA=EXTRA
        ) from None
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise MinigptError(
            "{path} could not be read as safetensors ({exc}); it is truncated or damaged", path=path, exc=exc
        ) from None


# ---------------------------------------------------------------- tokenizers


def _supported(tok: Tokenizer, where: str | Phrase) -> TextTokenizer:
    """`tok` as a TextTokenizer, if its ids and bytes can be read exactly: a byte-level BPE
    (GPT-2's, minigpt's bpe and byte kinds) or one id per character (minigpt's char kind)."""
    spec = json.loads(tok.to_str())
    model = (spec.get("model") or {}).get("type")
    decoder = (spec.get("decoder") or {}).get("type")
    vocab = tok.get_vocab()
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise MinigptError(
            "{where}: the token ids are not 0 .. {value} each once; the tokenizer is damaged",
            where=where,
            value=len(vocab) - 1,
        )
    if decoder == "ByteLevel" and model == "BPE":
        return TextTokenizer(tok)
    if model == "WordLevel" and decoder == "Fuse" and all(len(piece) == 1 for piece in vocab):
        text = TextTokenizer(tok)
        alphabet = sorted(vocab, key=vocab.get)
        if text.encode("".join(alphabet)) == sorted(vocab.values()):  # it really splits every character
            return text
    raise MinigptError(
        "{where} is a {model} tokenizer with a {decoder} decoder; minigpt reads byte-level BPE "
        "tokenizers (GPT-2's) and one-id-per-character ones",
        where=where,
        model=model,
        decoder=decoder,
    )


def read_gpt2_tokenizer(folder: Path) -> tuple[TextTokenizer, str]:
    """A GPT-2 tokenizer from a folder, and which files it came from: `tokenizer.json`, or GPT-2's
    original `vocab.json` + `merges.txt` (built as transformers builds them: byte-level BPE, no
    prefix space, <|endoftext|> a special token)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinigptError(
            "tokenizer folder {folder} does not exist or is not a folder; pass a folder holding "
            "tokenizer.json, or vocab.json and merges.txt",
            folder=folder,
        )
    if (folder / "tokenizer.json").is_file():
        where = folder / "tokenizer.json"
        return _supported(read_tokenizer_file(where), str(where)), "tokenizer.json"
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if vocab.is_file() != merges.is_file():
        absent = merges if vocab.is_file() else vocab
        raise MinigptError(
            "{folder} has no {name}; a GPT-2 tokenizer needs vocab.json and merges.txt both",
            folder=folder,
            name=absent.name,
        )
    if not vocab.is_file():
        raise MinigptError(
            "{folder} holds no tokenizer: neither tokenizer.json nor vocab.json + merges.txt", folder=folder
        )
    try:
        tok = byte_level_tokenizer(models.BPE(*models.BPE.read_file(str(vocab), str(merges))))
    except Exception as exc:
        raise MinigptError(
            "{vocab} and {merges} could not be read as a BPE tokenizer ({exc})", vocab=vocab, merges=merges, exc=exc
        ) from None
    if EOT in tok.get_vocab():
        tok.add_special_tokens([AddedToken(EOT, special=True)])  # already an id: it keeps it
    return _supported(tok, f"{folder} (vocab.json + merges.txt)"), "vocab.json + merges.txt"


# ---------------------------------------------------------------- the two readers


def read_hf_gpt2(folder: Path, context: int | None = None, progress: Progress = no_progress) -> Imported:
    """A Hugging Face GPT-2 folder: config.json (model_type "gpt2"), model.safetensors or
    pytorch_model.bin, tokenizer.json or vocab.json + merges.txt. `context` crops the position
    table to its first rows."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinigptError(
            "{folder} is not a folder; pass a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer)",
            folder=folder,
        )
    if not (folder / "config.json").is_file():
        raise MinigptError("{folder} has no config.json; it is not a Hugging Face model folder", folder=folder)
    settings = _gpt2_settings(read_json(folder / "config.json"), str(folder / "config.json"))
    crop = kept_rows(context, settings["rows"])
    weights = next((folder / n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()), None)
    if weights is None:
        sharded = any(folder.glob("*.index.json"))
        raise MinigptError(
            "{folder} has no model.safetensors or pytorch_model.bin{value}",
            folder=folder,
            value="; its weights are sharded into several files, which minigpt does not read" if sharded else "",
        )
    tokenizer, tokenizer_files = read_gpt2_tokenizer(folder)
    check_rows(tokenizer, settings["vocab_size"], str(folder / tokenizer_files.split(" ")[0]))
    # Before a tensor is read: the file's tensors are read whole, then copied.
    wide = model_section(settings, settings["rows"], "float32", str(folder / "config.json"))
    check_room(wide, settings["vocab_size"], weights.stat().st_size)
    sha = file_sha256(weights, progress)
    with progress(f"reading {weights.name}", 1) as advance:
        raw = _safetensors_load(weights) if weights.suffix == ".safetensors" else torch_load(weights, "a GPT-2 file")
        advance(1)
    if not isinstance(raw, dict):
        raise MinigptError(
            "{weights} holds a {name}, not a dict of named tensors", weights=weights, name=type(raw).__name__
        )
    found = renamed(raw, str(weights), gpt2.prefixed)  # GPT2LMHeadModel's names, or GPT2Model's
    where = str(weights)
    if settings["tie_embeddings"] and head_tied(found) is False:
        raise MinigptError(
            "{where}: {theirs} differs from {theirs2}, but config.json says {key} = true; the folder is inconsistent",
            where=where,
            theirs=gpt2.HEAD.theirs,
            theirs2=gpt2.TOKEN_TABLE.theirs,
            key=gpt2.SETTINGS["tie_embeddings"].key,
        )
    cfg = model_section(settings, crop, model_dtype(found, where), str(folder / "config.json"))
    state = minigpt_state(found, cfg, settings["vocab_size"], settings["rows"], True, where, progress)
    return Imported(
        model=cfg,
        vocab_size=settings["vocab_size"],
        state=state,
        tokenizer=tokenizer,
        tokenizer_size=tokenizer.vocab_size,
        origin={
            "kind": "hf-gpt2",
            "path": str(folder.resolve()),
            "weights": weights.name,
            "sha256": sha,
            "tokenizer": tokenizer_files,
            "position_rows": settings["rows"],
            "weights_dtype": dtypes_of(found),
        },
    )
