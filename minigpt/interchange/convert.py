"""Importing a model trained elsewhere, what every reader shares: `Imported` (minigpt's [model]
section, parameters under minigpt's names and a tokenizer), the checks on what a file holds
(settings, tensor names, dtypes, the memory needed), and `write_run`, which makes it a run folder
that every command reading a run loads like any other. hf.py reads a Hugging Face GPT-2 folder,
nanogpt.py a nanoGPT checkpoint.

GPT-2 is chapter 17's model: pre-norm LayerNorm blocks, learned absolute positions, a final
LayerNorm and a vocabulary head; its names and layouts are gpt2_layout.py's, the table the export
reads too. Every setting a file can hold that changes what the model computes is mapped onto
[model] or refused, naming the key; nothing is guessed. Weights are copied exactly: transposed
where the layout asks, half precision widened to float32 (which holds every half-precision
value), the position table cropped only on request.

Nothing a file holds is run: safetensors holds tensors only, and `torch.load(weights_only=True)`
admits tensors and plain values.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from ..config import Config, ModelConfig, SampleConfig, TokenizerConfig, TrainConfig, model_config_from
from ..errors import MinigptError, Phrase
from ..io import Progress
from ..memory import DTYPE_BYTES, MARGIN, check_memory, parameter_count
from ..model.gpt import MiniGPT
from ..runs.checkpoints import state_payload
from ..runs.folder import create_model_run
from ..text.tokenizer import IMPORTED, TextTokenizer
from . import gpt2_layout as gpt2

# nanoGPT pads GPT-2's 50,257 ids to 50,304 rows (a multiple of 64, for the GPU's sake), others to
# a multiple of 128: fewer ids than rows by less than this is padding; by more, another tokenizer.
MOST_PADDING = 128


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


def literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def whole_number(where: str | Phrase, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MinigptError(
            "{where}: {key} = {literal} is not an integer of at least {minimum}",
            where=where,
            key=key,
            literal=literal(value),
            minimum=minimum,
        )
    return value


def flag_value(where: str | Phrase, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MinigptError(
            "{where}: {key} = {literal} is not true or false", where=where, key=key, literal=literal(value)
        )
    return value


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a model folder (config.json, an index, tokenizer_config.json), or one line
    saying why it cannot be read."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise MinigptError("{path} is not UTF-8 text, so not JSON; the folder is damaged", path=path) from None
    except ValueError as exc:
        raise MinigptError("{path} is not valid JSON ({exc}); the folder is damaged", path=path, exc=exc) from None
    except OSError as exc:
        raise MinigptError("{path} cannot be read ({reason})", path=path, reason=exc.strerror or exc) from None
    if not isinstance(value, dict):
        raise MinigptError(
            "{path} holds a JSON {name}, not an object; the folder is damaged", path=path, name=type(value).__name__
        )
    return value


def read_tokenizer_file(path: Path) -> Tokenizer:
    """A tokenizer.json as a `tokenizers.Tokenizer`, or one line saying the file is damaged."""
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises plain Exceptions for malformed files
        raise MinigptError(
            "{path} could not be read as a tokenizer ({exc}); the file is damaged", path=path, exc=exc
        ) from None


# ---------------------------------------------------------------- weights


HALF = {torch.float16, torch.bfloat16}  # widened to float32, which holds each of their values exactly


def renamed(tensors: dict[str, Any], where: str | Phrase, rename: Callable[[str], str]) -> dict[str, tuple[str, Any]]:
    """{canonical name: (the file's name, tensor)}, the causal-mask buffers left out (they are not
    parameters); refuses two tensors arriving at one name."""
    out: dict[str, tuple[str, Any]] = {}
    for name, tensor in tensors.items():
        canonical = rename(str(name))
        if gpt2.is_mask_buffer(canonical):
            continue
        if canonical in out:
            raise MinigptError(
                "{where} holds both {given} and {name}; the file is not one model",
                where=where,
                given=out[canonical][0],
                name=name,
            )
        out[canonical] = (str(name), tensor)
    return out


def listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def model_dtype(found: dict[str, tuple[str, Any]], where: str | Phrase) -> str:
    kinds = set()
    for name, tensor in found.values():
        if not isinstance(tensor, torch.Tensor):
            raise MinigptError(
                "{where}: {name} is a {kind}, not a tensor; the file is damaged",
                where=where,
                name=name,
                kind=type(tensor).__name__,
            )
        kinds.add(tensor.dtype)
    if kinds == {torch.float64}:
        return "float64"
    if kinds <= {torch.float32, *HALF}:
        return "float32"
    shown = ", ".join(sorted(str(k).removeprefix("torch.") for k in kinds))
    raise MinigptError(
        "{where} holds {shown} tensors; minigpt reads floating-point weights (float16, bfloat16 and "
        "float32, or float64 throughout)",
        where=where,
        shown=shown,
    )


def minigpt_state(
    found: dict[str, tuple[str, Any]],
    cfg: ModelConfig,
    vocab_size: int,
    rows: int,
    conv1d: bool,
    where: str | Phrase,
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
            "{where} lacks {listed}, which the config's model has; the file is incomplete or not this model",
            where=where,
            listed=listed(missing),
        )
    extra = sorted(found[name][0] for name in set(found) - set(theirs.values()) - ignored)
    if extra:
        raise MinigptError(
            "{where} holds {listed}, which no part of the config's model reads; minigpt imports GPT-2's "
            "language model only (no other heads or layers)",
            where=where,
            listed=listed(extra),
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
                    "{where}: {shown} has shape {found_shape} but the config's model needs {needed}; the weights "
                    "are not the config's model",
                    where=where,
                    shown=shown,
                    found_shape=list(tensor.shape),
                    needed=list(shape),
                )
            if flip:
                tensor = tensor.T
            if ours == gpt2.POSITION_TABLE.ours:
                tensor = tensor[: cfg.context]  # --context: the first rows, as nanoGPT's crop_block_size
            owned = torch.empty(tensor.shape, dtype=dtype).copy_(tensor)  # contiguous, exact
            if not bool(torch.isfinite(owned).all()):
                raise MinigptError(
                    "{where}: {shown} holds NaN or infinite values; the file is damaged", where=where, shown=shown
                )
            state[ours] = owned
            advance(1)
    if cfg.tie_embeddings:
        state[gpt2.HEAD.ours] = state[gpt2.TOKEN_TABLE.ours]  # one tensor, as MiniGPT ties them
    return state


def head_tied(found: dict[str, tuple[str, Any]]) -> bool | None:
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


def check_room(cfg: ModelConfig, vocab_size: int, file_bytes: int = 0) -> None:
    check_memory(
        import_bytes(cfg, vocab_size, file_bytes),
        "cpu",
        f"importing this model ({parameter_count(cfg, vocab_size):,} parameters, {cfg.dtype})",
        "free memory, or import it on a machine with more",
    )


def torch_load(path: Path, what: str) -> Any:
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
                "{path} holds objects other than tensors and plain values, so it is refused without being run; "
                "{what} saved by its own training code holds none",
                path=path,
                what=what,
            ) from None
        raise MinigptError(
            "{path} could not be read as a PyTorch file; it is truncated or damaged", path=path
        ) from None


def check_rows(tokenizer: TextTokenizer, rows: int, where: str | Phrase) -> None:
    """A tokenizer may write fewer ids than the weights have rows (padding), never more."""
    if tokenizer.vocab_size > rows:
        raise MinigptError(
            "{where} writes {vocab_size} ids but the weights have {rows} rows (vocab_size); it is not this "
            "model's tokenizer: pass the one it was trained with",
            where=where,
            vocab_size=tokenizer.vocab_size,
            rows=rows,
        )
    if rows - tokenizer.vocab_size >= MOST_PADDING:
        raise MinigptError(
            "{where} writes {vocab_size} ids but the weights have {rows} rows (vocab_size), more than "
            "padding to a round number adds; it is not this model's tokenizer: pass the one it was trained "
            "with",
            where=where,
            vocab_size=tokenizer.vocab_size,
            rows=rows,
        )


def kept_rows(context: int | None, rows: int) -> int:
    if context is None:
        return rows
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= rows:
        raise MinigptError(
            "{context} {given}: the position table has {rows} rows, so the context can be cropped to "
            "1 .. {rows} of them; choose a number in that range (or leave {context} out to keep all {rows})",
            given=context,
            rows=rows,
        )
    return context


def model_section(settings: dict[str, Any], context: int, dtype: str, where: str | Phrase) -> ModelConfig:
    values = {k: v for k, v in settings.items() if k not in ("vocab_size", "rows")}
    values.update(context=context, dtype=dtype, dropout=0.0)
    # every [model] key, the defaults (layernorm, pre-norm) included, checked like a checkpoint's
    return model_config_from(asdict(ModelConfig(**values)), where)


def dtypes_of(found: dict[str, tuple[str, Any]]) -> str:
    return ", ".join(sorted({str(t.dtype).removeprefix("torch.") for _, t in found.values()}))


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
