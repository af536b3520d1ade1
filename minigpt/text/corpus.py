"""Text files -> token ids -> batches.

One file: the text is read as strict UTF-8, split into a training head and a contiguous validation
tail (`val_fraction` of the characters), the tokenizer is fitted to the head only, and both splits
are encoded with the library's batch encoder (text.py). Ids are cached as .npy files (uint16 for
vocabularies up to 65,536) keyed by the file's sha256 and the tokenizer settings, then
memory-mapped, so a second run on the same text starts at once; batches are gathered from the
mapped ids and widened to int64 per batch, so memory does not grow with the text.

Several files (a folder of *.txt files, or a list): folders.py joins them, each file's head into
the training split and its tail into the validation split, an end-of-text token between files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import failpoints
from ..config import Config
from ..errors import MinigptError
from ..io import Progress, atomic_write, atomic_write_text, no_progress
from ..model.gpt import check_token_ids
from .examples import Examples
from .folders import load_files, not_rank_0s
from .pairs import is_pairs, pair_examples
from .reading import check_writable, encode, read_text, split_text
from .sources import Document, TextFile, digest, list_files
from .tasks import task_examples
from .token_cache import CACHE_FORMAT, bounds, cache_root, entry
from .tokenizer import TextTokenizer, train_tokenizer

# What the commands and tests import from here.
__all__ = ["CACHE_FORMAT", "Batches", "Corpus", "Document", "cache_root", "load_corpus", "read_text", "split_text"]


@dataclass
class Corpus:
    """Both splits as token ids, the tokenizer fitted to the training split, and what bits per
    byte needs: how many UTF-8 bytes of text each split's tokens stand for."""

    tokenizer: TextTokenizer
    train_ids: np.ndarray
    val_ids: np.ndarray
    train_bytes: int
    val_bytes: int
    sha256: str  # one file's own; several files': sources.digest of every (name, sha256)
    path: Path  # the file, or the first path [train] data names
    documents: list[Document] = field(default_factory=list)  # in order; one per file
    source: str = ""  # the corpus in a few words, for messages (the file, or "3 files under DIR")

    @property
    def val_tokens_per_byte(self) -> float:
        return len(self.val_ids) / self.val_bytes

    @property
    def files(self) -> list[tuple[str, str]]:
        """(name, sha256) of every file: what a checkpoint records and a resume compares."""
        return [(d.name, d.sha256) for d in self.documents]

    sample_start = "\n"  # what a sample during training starts from when [train] sample_prompt is empty

    def row_tokens(self, context: int) -> int:
        """Tokens one row of a batch reads: a window of the table's length."""
        return context

    @property
    def summary(self) -> str:
        return f"{len(self.train_ids):,} train / {len(self.val_ids):,} val tokens"

    def training_batches(self, context: int, batch_size: int, device: str, rank: int, world_size: int) -> Batches:
        return Batches(self.train_ids, context, batch_size, device, rank, world_size)

    def validation_windows(
        self, context: int, batch_size: int, device: str, rank: int, world_size: int, n_batches: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return Batches(self.val_ids, context, batch_size, device, rank, world_size).fixed(n_batches)


def load_corpus(
    cfg: Config,
    on_status: Callable[[str], None] = lambda message: None,
    progress: Progress = no_progress,
    tokenizer: TextTokenizer | None = None,
    same_as: list[tuple[str, str]] | None = None,
) -> Corpus | Examples:
    """Read, split, fit the tokenizer and encode, or reuse the cached result for this exact input.
    A task run (`[train] task`) or a .jsonl file of pairs gives prompt/answer Examples instead.
    `progress(label, total)` gives a callable told how much was done, for a progress bar (the
    command draws it; nothing is drawn here): characters of a large text, or with `unit="file"`
    files of a corpus of several.

    `tokenizer`: encode with this one and never fit another (a fine-tune keeps its run's; the other
    ranks of a data-parallel run use rank 0's). `same_as`: the (name, sha256) of the files it must
    be (the files rank 0 trains on)."""
    if cfg.train.task != "none":
        return task_examples(cfg, tokenizer, same_as)
    if is_pairs(cfg.train.data):
        return pair_examples(cfg, tokenizer, same_as)
    listing = list_files(cfg.train.data)
    if listing.skipped:
        shown = ", ".join(f.name for f in listing.skipped[:5]) + (" ..." if len(listing.skipped) > 5 else "")
        on_status(f"note: skipped {len(listing.skipped)} empty file(s) (no text to train on): {shown}")
    if len(listing.files) == 1:
        corpus = _load_file(cfg, listing.files[0], on_status, progress, tokenizer, same_as)
    else:
        joined = load_files(cfg, listing, on_status, progress, tokenizer, same_as)
        documents = [Document(name, sha, *count) for (name, sha), count in zip(joined.files, joined.counts)]
        corpus = Corpus(
            joined.tokenizer,
            joined.train_ids,
            joined.val_ids,
            joined.train_bytes,
            joined.val_bytes,
            digest(joined.files),
            listing.given[0],
            documents,
            listing.describe(),
        )
    _check_long_enough(corpus, cfg.model.context)
    for ids in (corpus.train_ids, corpus.val_ids):  # a damaged cache must not reach the model
        check_token_ids(bounds(ids), corpus.tokenizer.vocab_size)
    return corpus


def _load_file(
    cfg: Config,
    file: TextFile,
    on_status: Callable[[str], None],
    progress: Progress,
    tokenizer: TextTokenizer | None,
    same_as: list[tuple[str, str]] | None,
) -> Corpus:
    """A corpus of one file: exactly the ids, tokenizer and sha256 a run on that file always had."""
    path = file.path
    text, sha = read_text(path)
    if same_as is not None and len(same_as) != 1:
        raise not_rank_0s(same_as, [(file.name, sha)])
    if same_as is not None and sha != same_as[0][1]:
        raise MinigptError(
            "training text {path} here is not the text rank 0 trains on (sha256 {sha}... != {same_as}...); "
            "every machine needs the same file at the same path",
            path=path,
            sha=sha[:12],
            same_as=same_as[0][1][:12],
        )
    train_text, val_text = split_text(text, cfg.train.val_fraction)
    if tokenizer is not None:
        check_writable(tokenizer, text, path)
    elif cfg.tokenizer.kind == "char":
        unseen = sorted(set(val_text) - set(train_text))
        if unseen:
            # A char tokenizer fitted to the training head cannot encode these; say so up front.
            shown = " ".join(repr(c) for c in unseen[:10])
            raise MinigptError(
                "validation tail of {path} has characters the training part never uses ({shown}); use "
                'tokenizer.kind = "bpe" or "byte", or change val_fraction',
                path=path,
                shown=shown,
            )
    settings = {"format": CACHE_FORMAT, "sha256": sha, "val_fraction": cfg.train.val_fraction}
    # A tokenizer given is known by its fingerprint; one fitted here, by what it is fitted with.
    settings |= (
        {"tokenizer": tokenizer.fingerprint()}
        if tokenizer is not None
        else {"kind": cfg.tokenizer.kind, "vocab_size": cfg.tokenizer.vocab_size}
    )
    folder = entry(settings)
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
            train_ids, val_ids = encode(tokenizer, train_text, advance), encode(tokenizer, val_text, advance)
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
    document = Document(file.name, sha, len(train_ids), len(val_ids))
    return Corpus(
        tokenizer,
        train_ids,
        val_ids,
        len(train_text.encode("utf-8")),
        len(val_text.encode("utf-8")),
        sha,
        path,
        [document],
        str(path),
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
    what = f"training text {corpus.path}" if len(corpus.documents) <= 1 else f"training corpus ({corpus.source})"
    for name, ids in (("training", corpus.train_ids), ("validation", corpus.val_ids)):
        if len(ids) < need:
            raise MinigptError(
                "{what} is too short: its {name} split has {n_ids} tokens, but one window needs context + 1 = "
                "{need}; use a longer text, a smaller [model] context, or another [train] val_fraction",
                what=what,
                name=name,
                n_ids=len(ids),
                need=need,
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
