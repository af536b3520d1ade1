"""A Llama-family folder's weights read into minigpt's parameters. The files' headers first: every
tensor the config's model needs, none other, each of its shape, before any value is read.

Memory: the weights are never read whole. Each of minigpt's tensors is allocated once, in float32
(float64 for a float64 folder), filled from the file's tensors it is made of (llama_layout.py says
which, joined along the rows), read one at a time, and each is dropped once copied: the import holds
minigpt's model and at most one of the file's tensors. Half-precision weights (bfloat16, float16)
are widened to float32, which holds every one of their values, so nothing is rounded.
"""

from __future__ import annotations

import contextlib
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import MinigptError
from ..io import Progress
from ..model.gpt import MiniGPT
from . import llama_layout as layout
from .convert import HALF, listed, read_json, torch_load
from .export import EXTRA

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PYTORCH, PYTORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"

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


class Weights:
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


def _needed(
    cfg: ModelConfig, vocab_size: int, model_type: str
) -> tuple[list[layout.Parameter], dict[str, tuple[int, ...]], dict]:
    """The parameters a model of `cfg` stores in a `model_type` folder, the shape each of
    transformers' tensors must have, and minigpt's shapes."""
    with torch.device("meta"):  # minigpt's own names and shapes, without allocating them
        ours = {name: tuple(t.shape) for name, t in MiniGPT(cfg, vocab_size).state_dict().items()}
    chosen = layout.parameters(cfg, model_type)
    shapes: dict[str, tuple[int, ...]] = {}
    for p in chosen:
        counts = layout.row_counts(p, cfg)
        if counts == (-1,):
            shapes[p.theirs[0]] = ours[p.ours]
        else:  # rows of minigpt's tensor, the rest of its shape
            shapes.update({name: (rows, *ours[p.ours][1:]) for name, rows in zip(p.theirs, counts)})
    return chosen, shapes, ours


def _check_tensors(weights: Weights, cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], where: str) -> None:
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


def read_parameters(
    weights: Weights, cfg: ModelConfig, vocab_size: int, model_type: str, where: str, progress: Progress
) -> dict[str, torch.Tensor]:
    """minigpt's parameters, each allocated once and filled from the `model_type` folder's tensors
    it joins (read one at a time and dropped once copied), checked for finite values; a tied head is
    the table."""
    chosen, shapes, ours = _needed(cfg, vocab_size, model_type)
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


def read_whole(path: Path) -> bool:
    """Whether torch reads the file whole (a pre-zip pytorch_model.bin) rather than through a memory map."""
    return path.suffix == ".bin" and not zipfile.is_zipfile(path)


def widened(found: dict[str, tuple[str, torch.Tensor]]) -> bool:
    return any(tensor.dtype in HALF for _, tensor in found.values())
