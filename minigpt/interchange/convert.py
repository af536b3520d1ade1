"""Import a model trained elsewhere: a Hugging Face GPT-2 folder or a nanoGPT checkpoint becomes
minigpt's [model] section, parameters under minigpt's names and a tokenizer (`Imported`), which
`write_run` makes a run folder that every command reading a run loads like any other.

GPT-2 is chapter 17's model: pre-norm LayerNorm blocks, learned absolute positions, a final
LayerNorm and a vocabulary head; its names and layouts are gpt2_layout.py's, the table the export
reads too. nanoGPT kept GPT-2's parameter names and computes the same, with nn.Linear's [out, in]
layout where GPT-2's Conv1D stores [in, out], the exact GELU where GPT-2 uses its tanh
approximation, and LayerNorm's epsilon fixed at 1e-5. Every setting either file can hold that
changes what the model computes is mapped onto [model] or refused, naming the key; nothing is
guessed. Weights are copied exactly: transposed where the layout asks, half precision widened to
float32 (which holds every half-precision value), the position table cropped only on request.

Nothing a file holds is run: safetensors holds tensors only, `torch.load(weights_only=True)`
admits tensors and plain values, and nanoGPT's meta.pkl is read by an unpickler that looks up no
class or function at all, so only dicts, lists, strings and integers come out of it.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, models

from ..config import Config, ModelConfig, SampleConfig, TokenizerConfig, TrainConfig, model_config_from
from ..errors import MinigptError, option
from ..io import Progress, file_sha256, no_progress
from ..memory import DTYPE_BYTES, MARGIN, check_memory, parameter_count
from ..model.gpt import MiniGPT
from ..runs.checkpoints import state_payload
from ..runs.folder import create_model_run
from ..text.tokenizer import IMPORTED, TextTokenizer, byte_level_tokenizer, char_tokenizer
from . import gpt2_layout as gpt2
from .export import EXTRA

# nanoGPT pads GPT-2's 50,257 ids to 50,304 rows (a multiple of 64, for the GPU's sake), others to
# a multiple of 128: fewer ids than rows by less than this is padding; by more, another tokenizer.
MOST_PADDING = 128

EOT = "<|endoftext|>"  # GPT-2's one special token, its last id (50,256)


@dataclass
class Imported:
    """A model read from another format, in minigpt's terms, ready for `write_run` or `build`."""

    model: ModelConfig  # the [model] section: what minigpt computes
    vocab_size: int  # rows of the token table and the head
    state: dict[str, torch.Tensor]  # minigpt's parameter names (model.py), exactly MiniGPT's state_dict keys
    tokenizer: TextTokenizer
    tokenizer_size: int  # the ids the tokenizer writes; rows tokenizer_size .. vocab_size - 1 are padding
    origin: dict[str, Any]  # kind, path, weights file and its sha256, tokenizer, ...: plain values

    @property
    def padded(self) -> bool:
        return self.tokenizer_size < self.vocab_size

    @property
    def parameters(self) -> int:
        return parameter_count(self.model, self.vocab_size)

    def build(self) -> MiniGPT:
        """The model itself, in eval mode."""
        model = MiniGPT(self.model, self.vocab_size)
        model.load_state_dict(self.state)
        return model.eval()


# ---------------------------------------------------------------- GPT-2's config.json

# Flags of GPT2Config that change what attention computes: minigpt computes the defaults only.
_ATTENTION_FLAGS = {
    "scale_attn_weights": (True, "divides the attention scores by sqrt(d) when true"),
    "scale_attn_by_inverse_layer_idx": (False, "divides block i's attention scores by i + 1 as well"),
    "reorder_and_upcast_attn": (False, "scales the keys before the product and upcasts it"),
    "add_cross_attention": (False, "adds a cross-attention layer to every block (an encoder-decoder)"),
}


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise MinigptError(f"{path} is not UTF-8 text; a GPT-2 folder's config.json is JSON") from None
    except ValueError as exc:
        raise MinigptError(f"{path} is not valid JSON ({exc}); the folder is damaged") from None
    except OSError as exc:
        raise MinigptError(f"{path} cannot be read ({exc.strerror or exc})") from None
    if not isinstance(value, dict):
        raise MinigptError(f"{path} holds a JSON {type(value).__name__}, not an object; it is not a GPT-2 config")
    return value


def _whole(where: str, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MinigptError(f"{where}: {key} = {_literal(value)} is not an integer of at least {minimum}")
    return value


def _flag(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MinigptError(f"{where}: {key} = {_literal(value)} is not true or false")
    return value


def _gpt2_settings(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """config.json -> the keyword arguments of ModelConfig (less context and dtype) and the vocab
    size, with GPT2Config's defaults for absent keys; what minigpt cannot compute is refused."""
    if "model_type" not in raw:
        raise MinigptError(
            f"{where} has no model_type; minigpt imports GPT-2 folders (model_type = {_literal(gpt2.MODEL_TYPE)}) only"
        )
    if raw["model_type"] != gpt2.MODEL_TYPE:
        raise MinigptError(
            f"{where}: model_type = {_literal(raw['model_type'])} is not {_literal(gpt2.MODEL_TYPE)}; minigpt "
            f"computes GPT-2's architecture only, so it imports GPT-2 folders only"
        )

    def get(key: str, default: Any) -> Any:
        alias = gpt2.ALIASES.get(key)
        if key in raw and alias in raw and raw[key] != raw[alias]:
            raise MinigptError(
                f"{where}: {key} = {_literal(raw[key])} and {alias} = {_literal(raw[alias])} disagree; "
                f"they name the same setting"
            )
        return raw.get(key, raw.get(alias, default)) if alias else raw.get(key, default)

    def setting(ours: str) -> tuple[str, Any]:
        """GPT2Config's key for [model] key `ours`, and the file's value (GPT2Config's default where absent)."""
        key, default = gpt2.SETTINGS[ours].key, gpt2.SETTINGS[ours].default
        return key, get(key, default)

    for key, (default, what) in _ATTENTION_FLAGS.items():
        if _flag(where, key, get(key, default)) != default:
            raise MinigptError(
                f"{where}: {key} = {_literal(not default)}: it {what}, which minigpt does not compute; "
                f"only GPT-2 folders with {key} = {_literal(default)} can be imported"
            )
    n_embd, n_head = _whole(where, *setting("n_embd")), _whole(where, *setting("n_head"))
    embd_key, head_key = gpt2.SETTINGS["n_embd"].key, gpt2.SETTINGS["n_head"].key
    if n_embd % n_head:
        raise MinigptError(
            f"{where}: {embd_key} = {n_embd} is not divisible by {head_key} = {n_head}; every head reads an equal "
            f"share of the width, so this folder is not a model GPT-2 can be"
        )
    inner_key, inner = setting("ffn_hidden")
    activation_key, activation = setting("activation")
    if activation not in gpt2.ACTIVATIONS:
        raise MinigptError(
            f"{where}: {activation_key} = {_literal(activation)} is not one minigpt computes; "
            f"it computes {', '.join(gpt2.ACTIVATIONS)}"
        )
    eps_key, eps = setting("norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise MinigptError(f"{where}: {eps_key} = {_literal(eps)} is not a positive number")
    return {
        "n_layer": _whole(where, *setting("n_layer")),
        "n_head": n_head,
        "n_embd": n_embd,
        "ffn_hidden": 4 * n_embd if inner is None else _whole(where, inner_key, inner),  # GPT-2: None means 4C
        "norm_eps": float(eps),
        "activation": gpt2.ACTIVATIONS[activation],
        "tie_embeddings": _flag(where, *setting("tie_embeddings")),
        "bias": True,  # GPT-2 always has biases
        "vocab_size": _whole(where, *setting("vocab_size")),
        "rows": _whole(where, *setting("context")),
    }


# ---------------------------------------------------------------- nanoGPT's model_args

_NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")
_NANOGPT_IGNORED = {"dropout"}  # training only


def _nanogpt_settings(args: Any, where: str) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise MinigptError(f"{where}: model_args is a {type(args).__name__}, not nanoGPT's dict of settings")
    unknown = sorted(set(map(str, args)) - set(_NANOGPT_ARGS) - _NANOGPT_IGNORED)
    if unknown:
        raise MinigptError(
            f"{where}: model_args has {', '.join(unknown)}, which nanoGPT's GPTConfig does not; minigpt cannot "
            f"tell what a modified model computes, so it imports nanoGPT's own model only"
        )
    missing = [k for k in _NANOGPT_ARGS if k not in args]
    if missing:
        raise MinigptError(f"{where}: model_args lacks {', '.join(missing)}; it is not a whole nanoGPT checkpoint")
    n_embd, n_head = _whole(where, "n_embd", args["n_embd"]), _whole(where, "n_head", args["n_head"])
    if n_embd % n_head:
        raise MinigptError(f"{where}: n_embd = {n_embd} is not divisible by n_head = {n_head}")
    return {
        "n_layer": _whole(where, "n_layer", args["n_layer"]),
        "n_head": n_head,
        "n_embd": n_embd,
        "ffn_hidden": 4 * n_embd,  # nanoGPT's MLP
        "norm_eps": 1e-5,  # nanoGPT's LayerNorm
        "activation": "gelu",  # nn.GELU(): the exact one
        "bias": _flag(where, "bias", args["bias"]),
        "vocab_size": _whole(where, "vocab_size", args["vocab_size"]),
        "rows": _whole(where, "block_size", args["block_size"]),
    }


# ---------------------------------------------------------------- weights


_HALF = {torch.float16, torch.bfloat16}  # widened to float32, which holds each of their values exactly


def _renamed(tensors: dict[str, Any], where: str, rename: Callable[[str], str]) -> dict[str, tuple[str, Any]]:
    """{canonical name: (the file's name, tensor)}, the causal-mask buffers left out (they are not
    parameters); refuses two tensors arriving at one name."""
    out: dict[str, tuple[str, Any]] = {}
    for name, tensor in tensors.items():
        canonical = rename(str(name))
        if gpt2.is_mask_buffer(canonical):
            continue
        if canonical in out:
            raise MinigptError(f"{where} holds both {out[canonical][0]} and {name}; the file is not one model")
        out[canonical] = (str(name), tensor)
    return out


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _model_dtype(found: dict[str, tuple[str, Any]], where: str) -> str:
    kinds = set()
    for name, tensor in found.values():
        if not isinstance(tensor, torch.Tensor):
            raise MinigptError(f"{where}: {name} is a {type(tensor).__name__}, not a tensor; the file is damaged")
        kinds.add(tensor.dtype)
    if kinds == {torch.float64}:
        return "float64"
    if kinds <= {torch.float32, *_HALF}:
        return "float32"
    shown = ", ".join(sorted(str(k).removeprefix("torch.") for k in kinds))
    raise MinigptError(
        f"{where} holds {shown} tensors; minigpt reads floating-point weights (float16, bfloat16 and float32, "
        f"or float64 throughout)"
    )


def _minigpt_state(
    found: dict[str, tuple[str, Any]],
    cfg: ModelConfig,
    vocab_size: int,
    rows: int,
    conv1d: bool,
    where: str,
    progress: Progress,
) -> dict[str, torch.Tensor]:
    """The file's tensors under minigpt's names, in minigpt's layouts, each checked for its shape
    and for finite values, owned (never views into the file), the position table cropped to
    cfg.context rows. Any tensor missing, or left over, is refused."""
    with torch.device("meta"):  # minigpt's own names and shapes, without allocating them
        expected = {name: tuple(t.shape) for name, t in MiniGPT(cfg, vocab_size).state_dict().items()}
    expected[gpt2.POSITION_TABLE.ours] = (rows, cfg.n_embd)  # cropped below, once read
    # a tied head is the token table (an lm_head in the file was checked equal to it)
    layout = {
        p.ours: p for p in gpt2.parameters(cfg.n_layer) if p.ours in expected and not (p.tied and cfg.tie_embeddings)
    }
    theirs = {ours: p.theirs for ours, p in layout.items()}
    ignored = {gpt2.HEAD.theirs} if cfg.tie_embeddings else set()
    missing = [name for name in theirs.values() if name not in found]
    if missing:
        raise MinigptError(
            f"{where} lacks {_listed(missing)}, which the config's model has; the file is incomplete or not this model"
        )
    extra = sorted(found[name][0] for name in set(found) - set(theirs.values()) - ignored)
    if extra:
        raise MinigptError(
            f"{where} holds {_listed(extra)}, which no part of the config's model reads; minigpt imports "
            f"GPT-2's language model only (no other heads or layers)"
        )
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    state: dict[str, torch.Tensor] = {}
    with progress("converting the weights", len(theirs)) as advance:
        for ours, name in theirs.items():
            shown, tensor = found[name]
            flip = conv1d and layout[ours].conv1d
            shape = expected[ours][::-1] if flip else expected[ours]
            if tuple(tensor.shape) != shape:
                raise MinigptError(
                    f"{where}: {shown} has shape {list(tensor.shape)} but the config's model needs {list(shape)}; "
                    f"the weights are not the config's model"
                )
            if flip:
                tensor = tensor.T
            if ours == gpt2.POSITION_TABLE.ours:
                tensor = tensor[: cfg.context]  # --context: the first rows, as nanoGPT's crop_block_size
            owned = torch.empty(tensor.shape, dtype=dtype).copy_(tensor)  # contiguous, exact
            if not bool(torch.isfinite(owned).all()):
                raise MinigptError(f"{where}: {shown} holds NaN or infinite values; the file is damaged")
            state[ours] = owned
            advance(1)
    if cfg.tie_embeddings:
        state[gpt2.HEAD.ours] = state[gpt2.TOKEN_TABLE.ours]  # one tensor, as MiniGPT ties them
    return state


def _tied(found: dict[str, tuple[str, Any]]) -> bool | None:
    """Whether the file's head is its token table: no lm_head, or one equal to wte; None when absent."""
    if gpt2.TOKEN_TABLE.theirs not in found or gpt2.HEAD.theirs not in found:
        return None if gpt2.HEAD.theirs in found else True
    wte, head = found[gpt2.TOKEN_TABLE.theirs][1], found[gpt2.HEAD.theirs][1]
    return isinstance(wte, torch.Tensor) and wte.shape == head.shape and bool(torch.equal(wte, head))


def import_bytes(cfg: ModelConfig, vocab_size: int, file_bytes: int = 0) -> int:
    """About what an import holds at once: the file's tensors when they are read into memory
    (`file_bytes`; a mapped file needs none), minigpt's copy of them, and that copy serialised in
    memory before it is written (save_checkpoint), with the fixed margin."""
    return file_bytes + 2 * parameter_count(cfg, vocab_size) * DTYPE_BYTES[cfg.dtype] + MARGIN


def _check_room(cfg: ModelConfig, vocab_size: int, file_bytes: int = 0) -> None:
    check_memory(
        import_bytes(cfg, vocab_size, file_bytes),
        "cpu",
        f"importing this model ({parameter_count(cfg, vocab_size):,} parameters, {cfg.dtype})",
        "free memory, or import it on a machine with more",
    )


def _safetensors_load(path: Path) -> dict[str, torch.Tensor]:
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:
        raise MinigptError(
            f"reading {path.name} needs the safetensors package, which is not installed; {EXTRA}"
        ) from None
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise MinigptError(f"{path} could not be read as safetensors ({exc}); it is truncated or damaged") from None


def _torch_load(path: Path, what: str) -> Any:
    """A PyTorch file's plain contents (tensors, dicts, numbers, strings); nothing else is built."""
    try:
        # mmap: tensors are read when used, so nanoGPT's optimizer state (twice the model) never is.
        with warnings.catch_warnings():  # a damaged file's warnings (pickle protocols) would be a second line
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as exc:  # torch raises many kinds for a damaged file: all mean it cannot be read
        if re.search(r"Unsupported (global|class)", str(exc)):  # weights_only met a class or function
            # torch's message suggests weights_only=False, which would let the file run code: not shown.
            raise MinigptError(
                f"{path} holds objects other than tensors and plain values, so it is refused without being "
                f"run; {what} saved by its own training code holds none"
            ) from None
        raise MinigptError(f"{path} could not be read as a PyTorch file; it is truncated or damaged") from None


# ---------------------------------------------------------------- tokenizers


def _supported(tok: Tokenizer, where: str) -> TextTokenizer:
    """`tok` as a TextTokenizer, if its ids and bytes can be read exactly: a byte-level BPE
    (GPT-2's, minigpt's bpe and byte kinds) or one id per character (minigpt's char kind)."""
    spec = json.loads(tok.to_str())
    model = (spec.get("model") or {}).get("type")
    decoder = (spec.get("decoder") or {}).get("type")
    vocab = tok.get_vocab()
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise MinigptError(f"{where}: the token ids are not 0 .. {len(vocab) - 1} each once; the tokenizer is damaged")
    if decoder == "ByteLevel" and model == "BPE":
        return TextTokenizer(tok)
    if model == "WordLevel" and decoder == "Fuse" and all(len(piece) == 1 for piece in vocab):
        text = TextTokenizer(tok)
        alphabet = sorted(vocab, key=vocab.get)
        if text.encode("".join(alphabet)) == sorted(vocab.values()):  # it really splits every character
            return text
    raise MinigptError(
        f"{where} is a {model} tokenizer with a {decoder} decoder; minigpt reads byte-level BPE "
        f"tokenizers (GPT-2's) and one-id-per-character ones"
    )


def read_gpt2_tokenizer(folder: Path) -> tuple[TextTokenizer, str]:
    """A GPT-2 tokenizer from a folder, and which files it came from: `tokenizer.json`, or GPT-2's
    original `vocab.json` + `merges.txt` (built as transformers builds them: byte-level BPE, no
    prefix space, <|endoftext|> a special token)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinigptError(
            f"tokenizer folder {folder} does not exist or is not a folder; pass a folder holding "
            f"tokenizer.json, or vocab.json and merges.txt"
        )
    if (folder / "tokenizer.json").is_file():
        where = folder / "tokenizer.json"
        try:
            tok = Tokenizer.from_file(str(where))
        except Exception as exc:  # the library raises plain Exceptions for malformed files
            raise MinigptError(f"{where} could not be read as a tokenizer ({exc}); the file is damaged") from None
        return _supported(tok, str(where)), "tokenizer.json"
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if vocab.is_file() != merges.is_file():
        absent = merges if vocab.is_file() else vocab
        raise MinigptError(f"{folder} has no {absent.name}; a GPT-2 tokenizer needs vocab.json and merges.txt both")
    if not vocab.is_file():
        raise MinigptError(f"{folder} holds no tokenizer: neither tokenizer.json nor vocab.json + merges.txt")
    try:
        tok = byte_level_tokenizer(models.BPE(*models.BPE.read_file(str(vocab), str(merges))))
    except Exception as exc:
        raise MinigptError(f"{vocab} and {merges} could not be read as a BPE tokenizer ({exc})") from None
    if EOT in tok.get_vocab():
        tok.add_special_tokens([AddedToken(EOT, special=True)])  # already an id: it keeps it
    return _supported(tok, f"{folder} (vocab.json + merges.txt)"), "vocab.json + merges.txt"


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
        raise MinigptError(f"{option('meta')} {path}: no such file; nanoGPT writes it as data/DATASET/meta.pkl")
    if path.stat().st_size > MAX_META_BYTES:
        raise MinigptError(
            f"{option('meta')} {path} is {path.stat().st_size:,} bytes, not a character table; pass meta.pkl"
        )
    try:
        with open(path, "rb") as f:
            meta = _PlainData(f).load()
    except pickle.UnpicklingError as exc:
        named = str(exc)
        if re.fullmatch(r"[\w.]+\.[\w.]+", named):  # ours: the global it names
            raise MinigptError(
                f"{option('meta')} {path} names {named}, not plain data, so it is refused without being run; nanoGPT's "
                f"meta.pkl holds dicts, strings and integers only"
            ) from None
        raise MinigptError(f"{option('meta')} {path} is not a readable pickle ({exc}); it is damaged") from None
    except Exception as exc:  # EOFError, ValueError, MemoryError, ... : a damaged or foreign file
        raise MinigptError(
            f"{option('meta')} {path} is not a readable pickle ({type(exc).__name__}); it is damaged"
        ) from None
    _check_plain(meta, f"{option('meta')} {path}")
    return _meta_tokenizer(meta, f"{option('meta')} {path}")


def _check_plain(value: Any, where: str) -> None:
    stack, seen = [value], set()
    while stack:  # a loop, not recursion: a deeply nested file must not overflow the stack
        item = stack.pop()
        if not isinstance(item, _PLAIN) or isinstance(item, bool):
            raise MinigptError(
                f"{where} holds a {type(item).__name__}; nanoGPT's meta.pkl holds dicts, strings and integers only"
            )
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def _meta_tokenizer(meta: Any, where: str) -> TextTokenizer:
    if not isinstance(meta, dict) or not all(k in meta for k in ("vocab_size", "stoi", "itos")):
        raise MinigptError(
            f"{where} is not nanoGPT's char-level meta.pkl (a dict of vocab_size, stoi and itos); BPE datasets "
            f"have none: pass {option('tokenizer')} DIR (a GPT-2 tokenizer folder) instead"
        )
    stoi, itos, size = meta["stoi"], meta["itos"], meta["vocab_size"]
    if not isinstance(stoi, dict) or not all(isinstance(c, str) and len(c) == 1 for c in stoi):
        raise MinigptError(f"{where}: stoi is not a dict from single characters to ids")
    ids = list(stoi.values())
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or sorted(ids) != list(range(len(ids))):
        raise MinigptError(f"{where}: stoi's ids are not 0 .. {len(stoi) - 1} each once")
    if size != len(stoi):
        raise MinigptError(f"{where}: vocab_size = {_literal(size)} but stoi has {len(stoi)} characters")
    if not isinstance(itos, dict) or itos != {i: c for c, i in stoi.items()}:
        raise MinigptError(f"{where}: itos is not the inverse of stoi")
    return TextTokenizer(char_tokenizer(dict(stoi)))


def _check_rows(tokenizer: TextTokenizer, rows: int, where: str) -> None:
    """A tokenizer may write fewer ids than the weights have rows (padding), never more."""
    if tokenizer.vocab_size > rows:
        raise MinigptError(
            f"{where} writes {tokenizer.vocab_size} ids but the weights have {rows} rows (vocab_size); it is "
            f"not this model's tokenizer: pass the one it was trained with"
        )
    if rows - tokenizer.vocab_size >= MOST_PADDING:
        raise MinigptError(
            f"{where} writes {tokenizer.vocab_size} ids but the weights have {rows} rows (vocab_size), more "
            f"than padding to a round number adds; it is not this model's tokenizer: pass the one it was trained with"
        )


def _context(context: int | None, rows: int) -> int:
    if context is None:
        return rows
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= rows:
        raise MinigptError(
            f"{option('context')} {context}: the position table has {rows} rows, so the context can be cropped to "
            f"1 .. {rows} of them; choose a number in that range (or leave {option('context')} out to keep all {rows})"
        )
    return context


def _model_config(settings: dict[str, Any], context: int, dtype: str, where: str) -> ModelConfig:
    values = {k: v for k, v in settings.items() if k not in ("vocab_size", "rows")}
    values.update(context=context, dtype=dtype, dropout=0.0)
    # every [model] key, the defaults (layernorm, pre-norm) included, checked like a checkpoint's
    return model_config_from(asdict(ModelConfig(**values)), where)


# ---------------------------------------------------------------- the two readers


def read_hf_gpt2(folder: Path, context: int | None = None, progress: Progress = no_progress) -> Imported:
    """A Hugging Face GPT-2 folder: config.json (model_type "gpt2"), model.safetensors or
    pytorch_model.bin, tokenizer.json or vocab.json + merges.txt. `context` crops the position
    table to its first rows."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MinigptError(
            f"{folder} is not a folder; pass a Hugging Face GPT-2 folder (config.json, model.safetensors, tokenizer)"
        )
    if not (folder / "config.json").is_file():
        raise MinigptError(f"{folder} has no config.json; it is not a Hugging Face model folder")
    settings = _gpt2_settings(_read_json(folder / "config.json"), str(folder / "config.json"))
    crop = _context(context, settings["rows"])
    weights = next((folder / n for n in ("model.safetensors", "pytorch_model.bin") if (folder / n).is_file()), None)
    if weights is None:
        sharded = any(folder.glob("*.index.json"))
        raise MinigptError(
            f"{folder} has no model.safetensors or pytorch_model.bin"
            + ("; its weights are sharded into several files, which minigpt does not read" if sharded else "")
        )
    tokenizer, tokenizer_files = read_gpt2_tokenizer(folder)
    _check_rows(tokenizer, settings["vocab_size"], str(folder / tokenizer_files.split(" ")[0]))
    # Before a tensor is read: the file's tensors are read whole, then copied.
    wide = _model_config(settings, settings["rows"], "float32", str(folder / "config.json"))
    _check_room(wide, settings["vocab_size"], weights.stat().st_size)
    sha = file_sha256(weights, progress)
    with progress(f"reading {weights.name}", 1) as advance:
        raw = _safetensors_load(weights) if weights.suffix == ".safetensors" else _torch_load(weights, "a GPT-2 file")
        advance(1)
    if not isinstance(raw, dict):
        raise MinigptError(f"{weights} holds a {type(raw).__name__}, not a dict of named tensors")
    found = _renamed(raw, str(weights), gpt2.prefixed)  # GPT2LMHeadModel's names, or GPT2Model's
    where = str(weights)
    if settings["tie_embeddings"] and _tied(found) is False:
        raise MinigptError(
            f"{where}: {gpt2.HEAD.theirs} differs from {gpt2.TOKEN_TABLE.theirs}, but config.json says "
            f"{gpt2.SETTINGS['tie_embeddings'].key} = true; the folder is inconsistent"
        )
    cfg = _model_config(settings, crop, _model_dtype(found, where), str(folder / "config.json"))
    state = _minigpt_state(found, cfg, settings["vocab_size"], settings["rows"], True, where, progress)
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
            "weights_dtype": _dtypes(found),
        },
    )


def _dtypes(found: dict[str, tuple[str, Any]]) -> str:
    return ", ".join(sorted({str(t.dtype).removeprefix("torch.") for _, t in found.values()}))


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
        raise MinigptError(f"{path}: no such file; pass nanoGPT's ckpt.pt (or the out folder holding it)")
    if (meta is None) == (tokenizer_dir is None):
        raise MinigptError(
            f"a nanoGPT checkpoint holds no tokenizer: pass exactly one of {option('meta')} data/DATASET/meta.pkl "
            f"(char-level datasets) or {option('tokenizer')} DIR (a GPT-2 tokenizer folder, for BPE datasets)"
        )
    tokenizer = read_meta(meta) if meta is not None else read_gpt2_tokenizer(Path(tokenizer_dir))[0]
    mapped = zipfile.is_zipfile(path)  # an old-format file is read whole, not mapped
    sha = file_sha256(path, progress)
    with progress(f"reading {path.name}", 1) as advance:
        payload = _torch_load(path, "a nanoGPT checkpoint")
        advance(1)
    where = str(path)
    if not isinstance(payload, dict) or "model_args" not in payload or not isinstance(payload.get("model"), dict):
        hint = (
            "; it is a minigpt checkpoint, already a run folder's"
            if isinstance(payload, dict) and ("model_config" in payload)
            else ""
        )
        raise MinigptError(f"{where} is not a nanoGPT checkpoint (no model and model_args){hint}")
    settings = _nanogpt_settings(payload["model_args"], where)
    crop = _context(context, settings["rows"])
    _check_rows(
        tokenizer,
        settings["vocab_size"],
        f"{option('meta')} {meta}" if meta is not None else f"{option('tokenizer')} {tokenizer_dir}",
    )
    # torch.compile's wrapper prefixes every name with _orig_mod. (nanoGPT's train.py strips it on resume too).
    found = _renamed(payload["model"], where, lambda n: n.removeprefix("_orig_mod."))
    tied = _tied(found)
    settings["tie_embeddings"] = True if tied is None else tied
    cfg = _model_config(settings, crop, _model_dtype(found, where), where)
    _check_room(cfg, settings["vocab_size"], 0 if mapped else path.stat().st_size)
    state = _minigpt_state(found, cfg, settings["vocab_size"], settings["rows"], False, where, progress)
    source = {
        "kind": "nanogpt",
        "path": str(path.resolve()),
        "weights": path.name,
        "sha256": sha,
        "tokenizer": f"meta.pkl {Path(meta).resolve()}"
        if meta is not None
        else f"GPT-2 tokenizer {Path(tokenizer_dir).resolve()}",
        "position_rows": settings["rows"],
        "weights_dtype": _dtypes(found),
    }
    if isinstance(payload.get("iter_num"), int):  # the step nanoGPT saved it at
        source["iter_num"] = payload["iter_num"]
    return Imported(cfg, settings["vocab_size"], state, tokenizer, tokenizer.vocab_size, source)


# ---------------------------------------------------------------- the run folder


def run_config(imported: Imported, out: Path) -> Config:
    """The imported run's config.toml: its [model], its own tokenizer (kind "imported": kept, never
    fitted again, so a fine-tune encodes as the source did), and default [train] and [sample]."""
    out = Path(out).resolve()
    return Config(
        model=imported.model,
        tokenizer=TokenizerConfig(kind=IMPORTED, vocab_size=imported.tokenizer_size),
        train=TrainConfig(out=str(out)),
        sample=SampleConfig(),
        name=out.name,
        source=f"imported from {imported.origin['kind']} {imported.origin['path']}",
    )


def write_run(imported: Imported, out: Path, force: bool = False) -> Config:
    """`out` as a run folder (config.toml, tokenizer.json, checkpoint.pt recording the source), or
    nothing: it is written whole under a temporary name and renamed into place. An existing folder
    that holds anything is refused unless `force`."""
    cfg = run_config(imported, out)
    payload = state_payload(cfg, imported.state, imported.vocab_size, imported.tokenizer_size, imported.origin)
    create_model_run(Path(out), force, cfg, imported.tokenizer, payload)
    return cfg
