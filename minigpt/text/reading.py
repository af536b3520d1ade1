"""One text: read as strict UTF-8 (refused, with the reason, when it cannot be a text), split into a
training head and a validation tail, and encoded into a compact array of ids."""

from __future__ import annotations

import hashlib
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import MinigptError
from .token_cache import id_dtype
from .tokenizer import TextTokenizer, line_chunks


def read_text(path: str | Path, what: str = "training text") -> tuple[str, str]:
    """(text, sha256 of the bytes). Refuses what cannot be a text to train on (or, as `what` says,
    to score or to prompt with), saying why."""
    path = Path(path)
    if not path.exists():
        raise MinigptError("{what} {path} does not exist; pass an existing UTF-8 file", what=what, path=path)
    if path.is_dir():
        raise MinigptError("{what} {path} is a directory; pass a UTF-8 text file", what=what, path=path)
    try:
        before = os.stat(path)
        raw = _read_bytes(path)
        after = os.stat(path)
    except OSError as exc:
        raise MinigptError(
            "{what} {path} cannot be read ({reason}); check its permissions", what=what, path=path, reason=exc.strerror
        ) from None
    if _changed(before, after, len(raw)):
        raise MinigptError(
            "{what} {path} changed while it was being read; try again once nothing is writing to it",
            what=what,
            path=path,
        )
    if not raw:
        raise MinigptError("{what} {path} is empty; pass a file with text in it", what=what, path=path)
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise MinigptError(
            "{what} {path} looks binary (NUL byte at offset {nul}); pass a UTF-8 text file",
            what=what,
            path=path,
            nul=nul,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MinigptError(
            "{what} {path} is not UTF-8: invalid byte 0x{raw:02x} at offset {start}; convert it to UTF-8 "
            "(e.g. iconv -t UTF-8)",
            what=what,
            path=path,
            raw=raw[exc.start],
            start=exc.start,
        ) from None
    return text, hashlib.sha256(raw).hexdigest()


def _read_bytes(path: Path) -> bytes:
    return path.read_bytes()


def _changed(before: os.stat_result, after: os.stat_result, read: int) -> bool:
    """Whether a regular file was written (or replaced) while it was read: its size, time or inode
    moved, or it gave another number of bytes than it had. (A pipe has no size to compare.)"""
    if not stat.S_ISREG(before.st_mode):
        return False
    then, now = ((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) for s in (before, after))
    return then != now or read != before.st_size


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """Training head and validation tail, cut at a character boundary."""
    cut = len(text) - max(1, math.floor(len(text) * val_fraction))
    return text[:cut], text[cut:]


def encode(tokenizer: TextTokenizer, text: str, on_characters: Callable[[int], None] = lambda n: None) -> np.ndarray:
    """Ids of `text`, encoded a piece at a time straight into a compact array (a Python list of
    ids would take 28 bytes an id)."""
    dtype = id_dtype(tokenizer.vocab_size)
    pieces = []
    for piece in line_chunks(text):
        # the text alone, no BOS; an imported tokenizer reads the piece whole, as transformers would
        pieces.append(np.fromiter(tokenizer.encode(piece, special=False), dtype=dtype))
        on_characters(len(piece))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)


def check_writable(tokenizer: TextTokenizer, text: str, path: Path) -> None:
    """A tokenizer that was not fitted to this text (a fine-tune's) must write every character of it:
    a char tokenizer's first unknown character is named with where it is."""
    unknown = tokenizer.unknown_characters(text)
    if unknown:
        offset = min(text.find(c) for c in unknown)
        line = text.count("\n", 0, offset) + 1
        raise MinigptError(
            "training text {path} has {text!r} at character {offset:,} (line {line}), which the run's char "
            "tokenizer cannot write ({n_unknown} such character(s) in all; it knows {vocab_size}); remove "
            "them, or start from a run with a byte-level tokenizer",
            path=path,
            text=text[offset],
            offset=offset,
            line=line,
            n_unknown=len(unknown),
            vocab_size=tokenizer.vocab_size,
        )
