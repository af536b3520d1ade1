"""A corpus of several files (a folder, or a list; see sources.py).

Each file is split as one file is (text.split_text), so every file has its own validation tail:
heads are joined into the training split and tails into the validation split, with END_OF_TEXT
between two files in each, where one document ends and the next begins. The tokenizer is fitted to
all the heads (never a tail) and has END_OF_TEXT as one more token.

Memory stays flat: files are read, fitted and encoded one at a time (BPE streams lines file after
file), never all held at once, and the joined splits are written a file's ids at a time. Every file
is read first, before anything is fitted or written, so a bad one is refused at once; it is read
again to fit and to encode, and refused if it changed in between.

The cache: each file's ids under a tokenizer are an entry of their own (keyed by the file's sha256,
the tokenizer's fingerprint and val_fraction), so a file added to a corpus is the only one encoded
again when the tokenizer stays the same (byte, or a fine-tune's); a fitted tokenizer is keyed by the
files' sha256s, so adding a file fits a BPE or char tokenizer again, and then every file is
encoded again. The joined splits are one more entry, memory-mapped like one file's ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import MinigptError
from ..io import Progress, atomic_write, atomic_write_text
from .reading import check_writable, encode, read_text, split_text
from .sources import Listing, TextFile, first_difference
from .token_cache import CACHE_FORMAT, entry, id_dtype, read_ids, write_npy
from .tokenizer import END_OF_TEXT, TextTokenizer, line_chunks, train_tokenizer


@dataclass
class Joined:
    """A corpus of several files, as ids: both splits, the tokenizer, the bytes of text each split
    stands for, and every file's (name, sha256) and (head tokens, tail tokens), in order."""

    tokenizer: TextTokenizer
    train_ids: np.ndarray
    val_ids: np.ndarray
    train_bytes: int
    val_bytes: int
    files: list[tuple[str, str]]
    counts: list[tuple[int, int]]


def not_rank_0s(theirs: list[tuple[str, str]], ours: list[tuple[str, str]]) -> MinigptError:
    return MinigptError(
        "the training files here are not the files rank 0 trains on ({first_difference}); every machine "
        "needs the same files under the same names",
        first_difference=first_difference(theirs, ours),
    )


def load_files(
    cfg: Config,
    listing: Listing,
    on_status: Callable[[str], None],
    progress: Progress,
    tokenizer: TextTokenizer | None,
    same_as: list[tuple[str, str]] | None,
) -> Joined:
    """A corpus of several files: each split into a head and a tail, heads joined into the training
    split and tails into the validation split, END_OF_TEXT between two files in each."""
    files, vf, n = listing.files, cfg.train.val_fraction, len(listing.files)
    # Every file is read once before anything is fitted, encoded or written, so a bad one (not
    # UTF-8, unreadable, changing) is refused first. One file's text at a time is in memory.
    shas, train_bytes, val_bytes = [], 0, 0
    with progress(f"reading {n:,} files", n, unit="file") as advance:
        for f in files:
            text, sha = read_text(f.path)
            head, tail = split_text(text, vf)
            if tokenizer is not None:
                check_writable(tokenizer, text, f.path)
            shas.append(sha)
            train_bytes += len(head.encode("utf-8"))
            val_bytes += len(tail.encode("utf-8"))
            del text, head, tail
            advance(1)
    named = [(f.name, sha) for f, sha in zip(files, shas)]
    if same_as is not None and [tuple(f) for f in same_as] != named:
        raise not_rank_0s(same_as, named)

    given = tokenizer is not None
    if not given:
        tokenizer, fitted = _fitted_tokenizer(cfg, files, shas, progress)
    boundary = tokenizer.end_of_text
    if boundary is None:  # only a tokenizer given (a fine-tune's) can lack it: every fitted one has it
        raise MinigptError(
            "{init_from} {given}: its tokenizer has no {END_OF_TEXT!r}, the token that marks where "
            "one file ends and the next begins, so it cannot train on several files ({describe}); fine-tune "
            "on one file, or start from a run trained on several",
            given=cfg.train.init_from,
            END_OF_TEXT=END_OF_TEXT,
            describe=listing.describe(),
        )
    fingerprint = tokenizer.fingerprint()
    joined = entry({"format": CACHE_FORMAT, "joined": shas, "tokenizer": fingerprint, "val_fraction": vf})
    cached = _read_joined(joined, n)
    if cached is not None:
        on_status(f"token cache hit: {joined}")
        train_ids, val_ids, counts = cached
    else:
        train_ids, val_ids, counts, encoded, where = _encode_files(tokenizer, files, shas, vf, joined, progress)
        which = "them" if encoded == n else f"{encoded:,} of them ({n - encoded:,} from the token cache)"
        did = (
            f"{n:,} files: encoded {which} with the run's own {cfg.tokenizer.kind} tokenizer"
            if given
            else f"{fitted}; encoded {which}"
        )
        on_status(f"{did}; {where}")
    return Joined(tokenizer, train_ids, val_ids, train_bytes, val_bytes, named, counts)


def _texts(files: list[TextFile], shas: list[str], label: str, progress: Progress) -> Iterator[tuple[TextFile, str]]:
    """Each file's text again, one at a time, as it was when first read (else refused: a file that
    changes mid-way would make a corpus no single moment of the files had)."""
    with progress(label, len(files), unit="file") as advance:
        for f, sha in zip(files, shas):
            text, now = read_text(f.path)
            if now != sha:
                raise MinigptError(
                    "training text {path} changed while the corpus was being prepared (sha256 {sha}... became "
                    "{now}...); try again once nothing is writing to it",
                    path=f.path,
                    sha=sha[:12],
                    now=now[:12],
                )
            yield f, text
            advance(1)


def _fitted_tokenizer(
    cfg: Config, files: list[TextFile], shas: list[str], progress: Progress
) -> tuple[TextTokenizer, str]:
    """The tokenizer fitted to every file's training head (cached by the files' sha256s, in any
    order: fitting does not depend on it), with END_OF_TEXT; and what was done, for the status."""
    kind, vf = cfg.tokenizer.kind, cfg.train.val_fraction
    settings = {"format": CACHE_FORMAT, "kind": kind, "vocab_size": cfg.tokenizer.vocab_size, "val_fraction": vf}
    folder = entry(settings | {"tokenizer_of": sorted(shas)})
    path = folder / "tokenizer.json"
    if path.exists():
        try:
            return TextTokenizer.load(path), f"{kind} tokenizer of these {len(files):,} files from the token cache"
        except MinigptError:  # damaged: fitted again below
            pass
    tails: list[tuple[TextFile, set[str]]] = []

    def heads() -> Iterator[str]:
        for f, text in _texts(files, shas, f"fitting the {kind} tokenizer to {len(files):,} files", progress):
            head, tail = split_text(text, vf)
            if kind == "char":
                tails.append((f, set(tail)))
            yield from line_chunks(head)

    pieces = heads() if kind != "byte" else iter(())  # the byte tokenizer reads no text
    tokenizer = TextTokenizer(train_tokenizer(kind, cfg.tokenizer.vocab_size, pieces, end_of_text=True))
    for f, chars in tails:  # a char tokenizer fitted to the heads cannot write these
        unseen = sorted(chars - tokenizer.alphabet)
        if unseen:
            shown = " ".join(repr(c) for c in unseen[:10])
            raise MinigptError(
                "validation tail of {path} has characters no file's training part uses ({shown}); use "
                'tokenizer.kind = "bpe" or "byte", or change val_fraction',
                path=f.path,
                shown=shown,
            )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, tokenizer.to_str())
    except OSError:
        pass  # the ids are not cached either, and the run's next start says so
    return tokenizer, f"fitted a {kind} tokenizer to the training parts of {len(files):,} files"


def _file_entry(sha: str, fingerprint: str, val_fraction: float) -> Path:
    """One file's ids (head and tail) under one tokenizer: shared by every corpus holding that file."""
    return entry({"format": CACHE_FORMAT, "file": sha, "tokenizer": fingerprint, "val_fraction": val_fraction})


def _encode_files(
    tokenizer: TextTokenizer,
    files: list[TextFile],
    shas: list[str],
    val_fraction: float,
    joined: Path,
    progress: Progress,
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]], int, str]:
    """Encode the files the cache does not hold, one at a time, each into its own entry; then join
    every file's ids into the two splits' entry. Returns both splits (memory-mapped), each file's
    token counts, how many files were encoded and where the ids were cached."""
    fingerprint = tokenizer.fingerprint()
    folders = [_file_entry(sha, fingerprint, val_fraction) for sha in shas]
    held: dict[int, list[np.ndarray]] = {}  # ids of files whose entry could not be written
    failed: OSError | None = None
    missing = [i for i, folder in enumerate(folders) if read_ids(folder, "train.npy", "val.npy") is None]
    texts = _texts(
        [files[i] for i in missing], [shas[i] for i in missing], f"encoding {len(missing):,} files", progress
    )
    for k, (_, text) in enumerate(texts):  # to its end, so the bar is closed
        i = missing[k]
        head, tail = split_text(text, val_fraction)
        ids = [encode(tokenizer, head), encode(tokenizer, tail)]
        del text, head, tail
        try:
            _write_ids(folders[i], ids)
        except OSError as exc:
            failed, held[i] = exc, ids

    def parts(i: int) -> list[np.ndarray]:
        if i in held:
            return held[i]
        found = read_ids(folders[i], "train.npy", "val.npy")
        if found is None:  # there a moment ago: something else removed it
            raise MinigptError(
                "the token cache entry {folders} of {path} went away while it was being used; run again",
                folders=folders[i],
                path=files[i].path,
            )
        return found

    counts = []
    for i in range(len(files)):
        train, val = parts(i)
        counts.append((len(train), len(val)))
    dtype = id_dtype(tokenizer.vocab_size)
    boundary = np.array([tokenizer.end_of_text], dtype=dtype)

    def joined_split(which: int) -> Iterator[np.ndarray]:
        for i in range(len(files)):
            if i:
                yield boundary
            yield parts(i)[which]  # one file's ids mapped at a time

    lengths = [sum(c[which] for c in counts) + len(files) - 1 for which in (0, 1)]
    if failed is None:
        try:
            joined.mkdir(parents=True, exist_ok=True)
            for which, name in enumerate(("train.npy", "val.npy")):
                write_npy(joined / name, joined_split(which), lengths[which], dtype)
            atomic_write_text(joined / "documents.json", json.dumps(counts))  # last: it marks a complete entry
        except OSError as exc:
            failed = exc
        else:
            mapped = _read_joined(joined, len(files))
            if mapped is not None:
                return mapped[0], mapped[1], counts, len(missing), f"token ids cached in {joined}"
            failed = OSError("the entry written cannot be read back")
    # No cache to map: the splits are held in memory (the next run encodes again).
    splits = [np.concatenate(list(joined_split(which))) for which in (0, 1)]
    where = f"token cache not written ({failed.strerror or failed}), so the next run encodes again"
    return splits[0], splits[1], counts, len(missing), where


def _write_ids(folder: Path, ids: list[np.ndarray]) -> None:
    """One file's entry: its head's ids, then its tail's (the last file written marks it complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in zip(("train.npy", "val.npy"), ids):
        atomic_write(folder / name, lambda out, array=array: np.save(out, array), binary=True)


def _read_joined(folder: Path, n: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]] | None:
    """A joined entry's splits (memory-mapped) and each file's token counts; None when missing
    or damaged (its lengths disagree with its counts)."""
    try:
        counts = [tuple(c) for c in json.loads((folder / "documents.json").read_text(encoding="utf-8"))]
    except (OSError, ValueError, TypeError):
        return None
    ids = read_ids(folder, "train.npy", "val.npy")
    if ids is None or len(counts) != n:
        return None
    for which in (0, 1):
        if len(ids[which]) != sum(c[which] for c in counts) + n - 1:
            return None
    return ids[0], ids[1], counts
