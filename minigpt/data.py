"""Text file -> token ids -> batches.

The text is read as strict UTF-8, split into a training head and a contiguous validation tail
(`val_fraction` of the characters), the tokenizer is fitted to the head only, and both splits are
encoded with the library's batch encoder. Ids are cached as .npy files (uint16 for vocabularies up
to 65,536) keyed by the file's sha256 and the tokenizer settings, then memory-mapped, so a second
run on the same text starts at once; batches are gathered from the mapped ids and widened to int64
per batch, so memory does not grow with the text.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import failpoints
from .config import Config
from .errors import MinigptError, option
from .io import atomic_write, atomic_write_text
from .model import check_token_ids
from .tokenizer import TextTokenizer, line_chunks, train_tokenizer

CACHE_FORMAT = 1  # bump when the cached files' meaning changes


def cache_root() -> Path:
    """MINIGPT_CACHE, else ~/.cache/minigpt (XDG_CACHE_HOME respected)."""
    if os.environ.get("MINIGPT_CACHE"):
        return Path(os.environ["MINIGPT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "minigpt"


def read_text(path: str | Path, what: str = "training text", given_as: str = "data") -> tuple[str, str]:
    """(text, sha256 of the bytes). Refuses what cannot be a text to train on (or, with `what` and
    the option `given_as` that names it, to score or to prompt with), saying why."""
    path = Path(path)
    if not path.exists():
        raise MinigptError(f"{what} {path} does not exist; pass an existing UTF-8 file with {option(given_as)}")
    if path.is_dir():
        raise MinigptError(f"{what} {path} is a directory; pass a UTF-8 text file with {option(given_as)}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MinigptError(f"{what} {path} cannot be read ({exc.strerror}); check its permissions") from None
    if not raw:
        raise MinigptError(f"{what} {path} is empty; pass a file with text in it")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise MinigptError(f"{what} {path} looks binary (NUL byte at offset {nul}); pass a UTF-8 text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MinigptError(
            f"{what} {path} is not UTF-8: invalid byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}; convert it to UTF-8 (e.g. iconv -t UTF-8)"
        ) from None
    return text, hashlib.sha256(raw).hexdigest()


@dataclass
class Corpus:
    """Both splits as token ids, the tokenizer fitted to the training split, and what bits per
    byte needs: how many UTF-8 bytes of text each split's tokens stand for."""

    tokenizer: TextTokenizer
    train_ids: np.ndarray
    val_ids: np.ndarray
    train_bytes: int
    val_bytes: int
    sha256: str
    path: Path

    @property
    def val_tokens_per_byte(self) -> float:
        return len(self.val_ids) / self.val_bytes


def split_text(text: str, val_fraction: float) -> tuple[str, str]:
    """Training head and validation tail, cut at a character boundary."""
    cut = len(text) - max(1, math.floor(len(text) * val_fraction))
    return text[:cut], text[cut:]


def _encode(tokenizer: TextTokenizer, text: str, on_characters: Callable[[int], None]) -> np.ndarray:
    """Ids of `text`, encoded a piece at a time straight into a compact array (a Python list of
    ids would take 28 bytes an id)."""
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32  # half the cache for common vocabularies
    pieces = []
    for piece in line_chunks(text):
        ids = tokenizer.encode_lines(piece.splitlines(keepends=True))
        pieces.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype))
        on_characters(len(piece))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)


@contextmanager
def _no_progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    yield lambda n: None


def load_corpus(
    cfg: Config,
    on_status: Callable[[str], None] = lambda message: None,
    progress: Callable[[str, int], ContextManager[Callable[[int], None]]] = _no_progress,
    tokenizer: TextTokenizer | None = None,
    sha256: str | None = None,
) -> Corpus:
    """Read, split, fit the tokenizer and encode, or reuse the cached result for this exact input.
    `progress(label, total_characters)` gives a callable told how many characters were done, for
    a progress bar on a large text (the command draws it; nothing is drawn here).

    `tokenizer`: encode with this one and never fit another (a fine-tune keeps its run's; the other
    ranks of a data-parallel run use rank 0's). `sha256`: the text must be the one with that hash
    (the text rank 0 trains on)."""
    path = Path(cfg.train.data)
    text, sha = read_text(path)
    if sha256 is not None and sha != sha256:
        raise MinigptError(
            f"training text {path} here is not the text rank 0 trains on (sha256 {sha[:12]}... != "
            f"{sha256[:12]}...); every machine needs the same file at the same path"
        )
    train_text, val_text = split_text(text, cfg.train.val_fraction)
    if tokenizer is not None:
        _check_writable(tokenizer, text, path)
    elif cfg.tokenizer.kind == "char":
        unseen = sorted(set(val_text) - set(train_text))
        if unseen:
            # A char tokenizer fitted to the training head cannot encode these; say so up front.
            shown = " ".join(repr(c) for c in unseen[:10])
            raise MinigptError(
                f"validation tail of {path} has characters the training part never uses "
                f'({shown}); use tokenizer.kind = "bpe" or "byte", or change val_fraction'
            )
    settings = {"format": CACHE_FORMAT, "sha256": sha, "val_fraction": cfg.train.val_fraction}
    # A tokenizer given is known by its fingerprint; one fitted here, by what it is fitted with.
    settings |= (
        {"tokenizer": tokenizer.fingerprint()}
        if tokenizer is not None
        else {"kind": cfg.tokenizer.kind, "vocab_size": cfg.tokenizer.vocab_size}
    )
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]
    folder = cache_root() / key
    files = [folder / name for name in ("tokenizer.json", "train.npy", "val.npy")]
    cached = _read_cache(files) if all(f.exists() for f in files) else None
    if cached is not None and (tokenizer is None or cached[0].fingerprint() == tokenizer.fingerprint()):
        on_status(f"token cache hit: {folder}")
        tokenizer, train_ids, val_ids = cached
    else:
        given = tokenizer is not None
        if not given:
            failpoints.reach("tokenizer-fit")
            with progress(f"fitting the {cfg.tokenizer.kind} tokenizer", len(train_text)) as advance:
                tokenizer = TextTokenizer(
                    train_tokenizer(cfg.tokenizer.kind, cfg.tokenizer.vocab_size, train_text, advance)
                )
        with progress("encoding the text", len(text)) as advance:
            train_ids, val_ids = _encode(tokenizer, train_text, advance), _encode(tokenizer, val_text, advance)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(files[1], lambda f: np.save(f, train_ids), binary=True)
            atomic_write(files[2], lambda f: np.save(f, val_ids), binary=True)
            atomic_write_text(files[0], tokenizer.to_str())  # last: its presence marks a complete entry
            where = f"token ids cached in {folder}"
        except OSError as exc:
            where = f"token cache not written ({exc.strerror}), so the next run encodes again"
        done = (
            f"encoded {len(text):,} characters with the run's own {cfg.tokenizer.kind} tokenizer"
            if given
            else f"fitted a {cfg.tokenizer.kind} tokenizer to the training split and encoded {len(text):,} characters"
        )
        on_status(f"{done}; {where}")
    corpus = Corpus(
        tokenizer, train_ids, val_ids, len(train_text.encode("utf-8")), len(val_text.encode("utf-8")), sha, path
    )
    _check_long_enough(corpus, cfg.model.context)
    for ids in (corpus.train_ids, corpus.val_ids):  # a damaged cache must not reach the model
        check_token_ids(ids, tokenizer.vocab_size)
    return corpus


def _check_writable(tokenizer: TextTokenizer, text: str, path: Path) -> None:
    """A tokenizer that was not fitted to this text (a fine-tune's) must write every character of it:
    a char tokenizer's first unknown character is named with where it is."""
    unknown = tokenizer.unknown_characters(text)
    if unknown:
        offset = min(text.find(c) for c in unknown)
        line = text.count("\n", 0, offset) + 1
        raise MinigptError(
            f"training text {path} has {text[offset]!r} at character {offset:,} (line {line}), which the run's "
            f"char tokenizer cannot write ({len(unknown)} such character(s) in all; it knows "
            f"{tokenizer.vocab_size}); remove them, or start from a run with a byte-level tokenizer"
        )


def _read_cache(files: list[Path]) -> tuple[TextTokenizer, np.ndarray, np.ndarray] | None:
    """A cache entry's tokenizer and memory-mapped ids; None when a file of it is damaged (cut
    short, overwritten), so the text is encoded again and the entry rewritten."""
    try:
        return (TextTokenizer.load(files[0]), *(np.load(f, mmap_mode="r") for f in files[1:]))
    except (MinigptError, ValueError, OSError):
        return None


def _check_long_enough(corpus: Corpus, context: int) -> None:
    need = context + 1
    for name, ids in (("training", corpus.train_ids), ("validation", corpus.val_ids)):
        if len(ids) < need:
            raise MinigptError(
                f"training text {corpus.path} is too short: its {name} split has {len(ids)} tokens, "
                f"but one window needs context + 1 = {need}; use a longer text, a smaller "
                f"[model] context, or another [train] val_fraction"
            )


class Batches:
    """Random windows of context + 1 tokens (inputs and next-token targets) from one split. The ids
    stay as they are (a memory-mapped uint16 array); only each batch is gathered and widened."""

    def __init__(
        self, ids: np.ndarray, context: int, batch_size: int, device: str = "cpu", rank: int = 0, world_size: int = 1
    ):
        self.ids = ids
        self.offsets = np.arange(context + 1)
        self.context, self.batch_size, self.device = context, batch_size, device
        self.rank, self.world_size = rank, world_size  # data parallel: this rank's rows of the global batch

    def windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = starts.numpy()[:, None] + self.offsets  # [B, context + 1] positions in the split
        w = torch.from_numpy(self.ids[rows].astype(np.int64))
        x, y = w[:, :-1], w[:, 1:]
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        # The global batch a single process would draw; this rank keeps its own rows of it.
        starts = torch.randint(len(self.ids) - self.context, (self.batch_size * self.world_size,), generator=generator)
        return self.windows(self._own_rows(starts))

    def fixed(self, n_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Evenly spaced windows across the split: the same ones at every evaluation, no RNG used.
        Like `sample`, each rank keeps its rows of every global batch."""
        size = self.batch_size * self.world_size
        starts = torch.linspace(0, len(self.ids) - self.context - 1, n_batches * size).long()
        return [self.windows(self._own_rows(chunk)) for chunk in starts.split(size)]

    def _own_rows(self, starts: torch.Tensor) -> torch.Tensor:
        """Rank r's rows r*batch_size .. (r+1)*batch_size - 1 of a global batch's window starts."""
        return starts[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
