"""A nanoGPT checkpoint (ckpt.pt) as an `Imported` model. nanoGPT kept GPT-2's parameter names and
computes the same, with nn.Linear's [out, in] layout where GPT-2's Conv1D stores [in, out], the
exact GELU where GPT-2 uses its tanh approximation, and LayerNorm's epsilon fixed at 1e-5. Its
tokenizer is its char-level dataset's meta.pkl, or a GPT-2 tokenizer folder for its BPE
checkpoints; meta.pkl is read by an unpickler that looks up no class or function at all, so only
dicts, lists, strings and integers come out of it.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from ..errors import MinigptError, Phrase
from ..io import Progress, file_sha256, no_progress
from ..text.tokenizer import TextTokenizer, char_tokenizer
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
    renamed,
    torch_load,
    whole_number,
)
from .hf import read_gpt2_tokenizer

# ---------------------------------------------------------------- nanoGPT's model_args

_NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")
_NANOGPT_IGNORED = {"dropout"}  # training only


def _nanogpt_settings(args: Any, where: str | Phrase) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise MinigptError(
            "{where}: model_args is a {name}, not nanoGPT's dict of settings", where=where, name=type(args).__name__
        )
    unknown = sorted(set(map(str, args)) - set(_NANOGPT_ARGS) - _NANOGPT_IGNORED)
    if unknown:
        raise MinigptError(
            "{where}: model_args has {join}, which nanoGPT's GPTConfig does not; minigpt cannot tell what a "
            "modified model computes, so it imports nanoGPT's own model only",
            where=where,
            join=", ".join(unknown),
        )
    missing = [k for k in _NANOGPT_ARGS if k not in args]
    if missing:
        raise MinigptError(
            "{where}: model_args lacks {join}; it is not a whole nanoGPT checkpoint",
            where=where,
            join=", ".join(missing),
        )
    n_embd, n_head = whole_number(where, "n_embd", args["n_embd"]), whole_number(where, "n_head", args["n_head"])
    if n_embd % n_head:
        raise MinigptError(
            "{where}: n_embd = {n_embd} is not divisible by n_head = {n_head}",
            where=where,
            n_embd=n_embd,
            n_head=n_head,
        )
    return {
        "n_layer": whole_number(where, "n_layer", args["n_layer"]),
        "n_head": n_head,
        "n_embd": n_embd,
        "ffn_hidden": 4 * n_embd,  # nanoGPT's MLP
        "norm_eps": 1e-5,  # nanoGPT's LayerNorm
        "activation": "gelu",  # nn.GELU(): the exact one
        "bias": flag_value(where, "bias", args["bias"]),
        "vocab_size": whole_number(where, "vocab_size", args["vocab_size"]),
        "rows": whole_number(where, "block_size", args["block_size"]),
    }


class _PlainData(pickle.Unpickler):
    """Builds only what pickle's own opcodes build (dicts, lists, tuples, strings, numbers): every
    class and function the file names is refused before it is even looked up, so no constructor,
    reduce or setstate in it can run. (Persistent ids are refused by pickle itself.)"""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}")


_PLAIN = (dict, list, tuple, str, int)
MAX_META_BYTES = 64 << 20  # a character table is kilobytes; anything this large is not one


def read_meta(path: Path) -> TextTokenizer:
    """nanoGPT's char-level meta.pkl (`vocab_size`, `stoi`, `itos`) as a char tokenizer whose ids
    are `stoi`'s exactly; a pickle that names any class or function is refused unrun."""
    path = Path(path)
    if not path.is_file():
        raise MinigptError("{meta} {path}: no such file; nanoGPT writes it as data/DATASET/meta.pkl", path=path)
    if path.stat().st_size > MAX_META_BYTES:
        raise MinigptError(
            "{meta} {path} is {st_size:,} bytes, not a character table; pass meta.pkl",
            path=path,
            st_size=path.stat().st_size,
        )
    try:
        with open(path, "rb") as f:
            meta = _PlainData(f).load()
    except pickle.UnpicklingError as exc:
        named = str(exc)
        if re.fullmatch(r"[\w.]+\.[\w.]+", named):  # ours: the global it names
            raise MinigptError(
                "{meta} {path} names {named}, not plain data, so it is refused without being run; nanoGPT's "
                "meta.pkl holds dicts, strings and integers only",
                path=path,
                named=named,
            ) from None
        raise MinigptError(
            "{meta} {path} is not a readable pickle ({exc}); it is damaged", path=path, exc=exc
        ) from None
    except Exception as exc:  # EOFError, ValueError, MemoryError, ... : a damaged or foreign file
        raise MinigptError(
            "{meta} {path} is not a readable pickle ({name}); it is damaged", path=path, name=type(exc).__name__
        ) from None
    where = Phrase("{meta} {path}", path=path)
    _check_plain(meta, where)
    return _meta_tokenizer(meta, where)


def _check_plain(value: Any, where: str | Phrase) -> None:
    stack, seen = [value], set()
    while stack:  # a loop, not recursion: a deeply nested file must not overflow the stack
        item = stack.pop()
        if not isinstance(item, _PLAIN) or isinstance(item, bool):
            raise MinigptError(
                "{where} holds a {name}; nanoGPT's meta.pkl holds dicts, strings and integers only",
                where=where,
                name=type(item).__name__,
            )
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def _meta_tokenizer(meta: Any, where: str | Phrase) -> TextTokenizer:
    if not isinstance(meta, dict) or not all(k in meta for k in ("vocab_size", "stoi", "itos")):
        raise MinigptError(
            "{where} is not nanoGPT's char-level meta.pkl (a dict of vocab_size, stoi and itos); BPE "
            "datasets have none: pass {tokenizer} DIR (a GPT-2 tokenizer folder) instead",
            where=where,
        )
    stoi, itos, size = meta["stoi"], meta["itos"], meta["vocab_size"]
    if not isinstance(stoi, dict) or not all(isinstance(c, str) and len(c) == 1 for c in stoi):
        raise MinigptError("{where}: stoi is not a dict from single characters to ids", where=where)
    ids = list(stoi.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or sorted(ids) != list(range(len(ids))):
        raise MinigptError("{where}: stoi's ids are not 0 .. {value} each once", where=where, value=len(stoi) - 1)
    if size != len(stoi):
        raise MinigptError(
            "{where}: vocab_size = {literal} but stoi has {n_stoi} characters",
            where=where,
            literal=literal(size),
            n_stoi=len(stoi),
        )
    if not isinstance(itos, dict) or itos != {i: c for c, i in stoi.items()}:
        raise MinigptError("{where}: itos is not the inverse of stoi", where=where)
    return TextTokenizer(char_tokenizer(dict(stoi)))


def read_nanogpt(
    path: Path,
    meta: Path | None = None,
    tokenizer_dir: Path | None = None,
    context: int | None = None,
    progress: Progress = no_progress,
) -> Imported:
    """nanoGPT's ckpt.pt (the file, or the out folder holding it) with its tokenizer: a char-level
    meta.pkl, or a GPT-2 tokenizer folder for its BPE checkpoints. `context` crops the position table."""
    path = Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.is_file():
        raise MinigptError("{path}: no such file; pass nanoGPT's ckpt.pt (or the out folder holding it)", path=path)
    if (meta is None) == (tokenizer_dir is None):
        raise MinigptError(
            "a nanoGPT checkpoint holds no tokenizer: pass exactly one of {meta} data/DATASET/meta.pkl "
            "(char-level datasets) or {tokenizer} DIR (a GPT-2 tokenizer folder, for BPE datasets)"
        )
    tokenizer = read_meta(meta) if meta is not None else read_gpt2_tokenizer(Path(tokenizer_dir))[0]
    mapped = zipfile.is_zipfile(path)  # an old-format file is read whole, not mapped
    sha = file_sha256(path, progress)
    with progress(f"reading {path.name}", 1) as advance:
        payload = torch_load(path, "a nanoGPT checkpoint")
        advance(1)
    where = str(path)
    if not isinstance(payload, dict) or "model_args" not in payload or not isinstance(payload.get("model"), dict):
        hint = (
            "; it is a minigpt checkpoint, already a run folder's"
            if isinstance(payload, dict) and ("model_config" in payload)
            else ""
        )
        raise MinigptError(
            "{where} is not a nanoGPT checkpoint (no model and model_args){hint}", where=where, hint=hint
        )
    settings = _nanogpt_settings(payload["model_args"], where)
    crop = kept_rows(context, settings["rows"])
    check_rows(
        tokenizer,
        settings["vocab_size"],
        Phrase("{meta} {path}", path=meta) if meta is not None else Phrase("{tokenizer} {path}", path=tokenizer_dir),
    )
    # torch.compile's wrapper prefixes every name with _orig_mod. (nanoGPT's train.py strips it on resume too).
    found = renamed(payload["model"], where, lambda n: n.removeprefix("_orig_mod."))
    tied = head_tied(found)
    settings["tie_embeddings"] = True if tied is None else tied
    cfg = model_section(settings, crop, model_dtype(found, where), where)
    check_room(cfg, settings["vocab_size"], 0 if mapped else path.stat().st_size)
    state = minigpt_state(found, cfg, settings["vocab_size"], settings["rows"], False, where, progress)
    source = {
        "kind": "nanogpt",
        "path": str(path.resolve()),
        "weights": path.name,
        "sha256": sha,
        "tokenizer": f"meta.pkl {Path(meta).resolve()}"
        if meta is not None
        else f"GPT-2 tokenizer {Path(tokenizer_dir).resolve()}",
        "position_rows": settings["rows"],
        "weights_dtype": dtypes_of(found),
    }
    if isinstance(payload.get("iter_num"), int):  # the step nanoGPT saved it at
        source["iter_num"] = payload["iter_num"]
    return Imported(cfg, settings["vocab_size"], state, tokenizer, tokenizer.vocab_size, source)
