"""The token cache: entries of token ids (and fitted tokenizers) under $MINIGPT_CACHE, each a
folder named by a hash of what it was made from, so an input that changes in any way misses.

Every file of an entry is written under a temporary name and renamed into place, and an entry
counts only once its last file is there, so an interrupted run leaves nothing that is read as
complete. Ids are read back memory-mapped: a cached corpus costs no memory until it is used.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_write

CACHE_FORMAT = 1  # bump when the cached files' meaning changes


def cache_root() -> Path:
    """MINIGPT_CACHE, else ~/.cache/minigpt (XDG_CACHE_HOME respected)."""
    if os.environ.get("MINIGPT_CACHE"):
        return Path(os.environ["MINIGPT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minigpt"


def entry(settings: dict[str, Any]) -> Path:
    """The folder of the entry made from `settings` (plain JSON values, CACHE_FORMAT among them)."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / key


def id_dtype(vocab_size: int) -> type:
    """uint16 for vocabularies up to 65,536 ids (half the cache of int32), else int32."""
    return np.uint16 if vocab_size <= 1 << 16 else np.int32


def read_ids(folder: Path, *names: str) -> list[np.ndarray] | None:
    """The memory-mapped arrays `names` of an entry; None when one is missing or damaged (cut
    short, overwritten), so it is made again."""
    try:
        return [np.load(folder / name, mmap_mode="r") for name in names]
    except (ValueError, OSError):
        return None


def write_npy(path: Path, chunks: Iterable[np.ndarray], length: int, dtype: type) -> None:
    """One .npy array of `length` ids written from `chunks` in order, never whole in memory: the
    header, then each chunk's bytes (a memory map of the output would count every page written
    in the process's resident memory). Atomic, like every cache file."""
    dtype = np.dtype(dtype)

    def write(f) -> None:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (length,)}
        np.lib.format.write_array_header_1_0(f, header)
        written = 0
        for chunk in chunks:
            chunk = np.ascontiguousarray(chunk, dtype=dtype)
            f.write(memoryview(chunk).cast("B"))
            written += len(chunk)
        if written != length:  # a caller's mistake, never a user's: the entry would be wrong
            raise ValueError(f"{path}: wrote {written} ids, expected {length}")

    atomic_write(path, write, binary=True)


def bounds(ids: np.ndarray, piece: int = 1 << 22) -> np.ndarray:
    """The lowest and highest id of `ids` (none when empty). A memory-mapped array is read from its
    file a piece at a time, not through the map: pages read through a map stay counted in the
    process's resident memory for as long as the map lives, which for the batches is the whole run."""
    if len(ids) == 0:
        return ids[:0]
    whole_map = isinstance(ids, np.memmap) and isinstance(ids.base, mmap.mmap) and ids.filename is not None
    if not whole_map:  # in memory, or a view of a map (whose offset is not its own)
        return np.array([ids.min(), ids.max()])
    low, high = None, None
    with open(ids.filename, "rb") as f:
        f.seek(ids.offset)
        left = len(ids)
        while left:
            chunk = np.fromfile(f, dtype=ids.dtype, count=min(piece, left))
            if len(chunk) == 0:  # the file is shorter than its header says: damaged
                raise ValueError(f"{ids.filename} is cut short")
            low = chunk.min() if low is None else min(low, chunk.min())
            high = chunk.max() if high is None else max(high, chunk.max())
            left -= len(chunk)
    return np.array([low, high])
