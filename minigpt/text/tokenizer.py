"""Tokenizers built with Hugging Face `tokenizers`: byte-level BPE, char and byte.

Every kind is saved as a plain `tokenizer.json` that `tokenizers.Tokenizer.from_file` loads. On top
of the library we keep one table, `pieces`: the exact bytes each id stands for. Decoding joins those
bytes and decodes UTF-8 once, so a byte-level model's output can never crash on a split character,
and streaming holds back an incomplete sequence until its last byte arrives.

Text is encoded line by line (line endings kept) with the library's batch encoder, both for the
corpus and for prompts, so a prompt is split exactly as the same text was split in training.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from ..errors import MinigptError

KINDS = ("bpe", "char", "byte")  # what `train_tokenizer` fits to a text
IMPORTED = "imported"  # [tokenizer] kind of a run whose tokenizer came with an imported model (convert.py)
# The boundary between two files of a corpus, GPT-2's spelling: an added token, so it stands for its
# own text (the same text in a file or a prompt is that id too, as in GPT-2).
END_OF_TEXT = "<|endoftext|>"

_HEX_BYTES = "minigpt-hex-bytes"
codecs.register_error(
    _HEX_BYTES, lambda err: ("".join(f"<0x{b:02X}>" for b in err.object[err.start : err.end]), err.end)
)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters, which is the
    alphabet `pre_tokenizers.ByteLevel` writes byte-level tokens in."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE = _byte_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in BYTE_TO_UNICODE.items()}


def byte_level_tokenizer(model) -> Tokenizer:
    """`model` behind GPT-2's byte-level pre-tokenizer (its regex, no prefix space) and decoder."""
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


CHUNK_CHARACTERS = 1 << 20


def line_chunks(text: str, size: int = CHUNK_CHARACTERS) -> Iterator[str]:
    """`text` in pieces of about `size` characters, each cut just after a newline, so the pieces'
    lines are exactly `text.splitlines(keepends=True)` while only one piece is split at a time
    (a 100 MB text never becomes millions of strings at once)."""
    start = 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text)) - 1)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def char_tokenizer(vocab: dict[str, int]) -> Tokenizer:
    """One id per character, the ids `vocab` gives (one character -> id each)."""
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()
    return tok


def train_tokenizer(
    kind: str,
    vocab_size: int,
    text: str | Iterable[str],
    on_characters: Callable[[int], None] = lambda n: None,
    end_of_text: bool = False,
) -> Tokenizer:
    """A new tokenizer of `kind` fitted to `text` (the training split only, never validation): one
    string, or pieces of text, each cut after a newline (several files' training parts, read one
    at a time). `on_characters(n)` is told as the text is read, for a progress bar. `end_of_text`:
    with END_OF_TEXT as a special token, the boundary between files (for BPE one of the
    `vocab_size` ids, id 0; for char and byte one more id, the last)."""
    pieces = line_chunks(text) if isinstance(text, str) else text
    if kind == "bpe":
        tok = byte_level_tokenizer(models.BPE())
        special = {"special_tokens": [AddedToken(END_OF_TEXT, special=True)]} if end_of_text else {}
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **special
        )

        def lines() -> Iterator[list[str]]:
            for piece in pieces:
                yield piece.splitlines(keepends=True)
                on_characters(len(piece))

        tok.train_from_iterator(lines(), trainer=trainer)
        return tok
    if kind == "byte":
        # id == byte value, so a learner can read ids as bytes.
        vocab = {BYTE_TO_UNICODE[b]: b for b in range(256)}
        tok = byte_level_tokenizer(models.BPE(vocab=vocab, merges=[]))
    elif kind == "char":
        seen: set[str] = set()
        for piece in pieces:
            seen.update(piece)
            on_characters(len(piece))
        tok = char_tokenizer({ch: i for i, ch in enumerate(sorted(seen))})
    elif kind == IMPORTED:
        raise MinigptError(
            '[tokenizer] kind = "{IMPORTED}" is the tokenizer an imported model came with, kept as it is and '
            "never fitted to a text; choose one of {join} to train a new model",
            IMPORTED=IMPORTED,
            join=", ".join(KINDS),
        )
    else:
        raise MinigptError(
            "tokenizer kind {kind!r} is unknown; choose one of: {join}", kind=kind, join=", ".join(KINDS)
        )
    if end_of_text:
        tok.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    return tok


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the byte table that makes decoding exact and streamable."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.byte_level = isinstance(tok.decoder, decoders.ByteLevel)
        vocab = tok.get_vocab()
        # The ids it can write: 0 .. vocab_size - 1. A model may have more rows than this (nanoGPT
        # pads GPT-2's 50,257 ids to 50,304); those ids are never written (see token_text).
        self.vocab_size = max(tok.get_vocab_size(), max(vocab.values(), default=-1) + 1)
        # Added tokens (GPT-2's <|endoftext|>) match the raw text, so they stand for their own
        # UTF-8 bytes, not for the byte-level alphabet, which they need not be written in.
        added = set(tok.get_added_tokens_decoder())
        self.pieces: list[bytes] = [b""] * self.vocab_size
        for piece, i in vocab.items():
            if self.byte_level and i not in added:
                self.pieces[i] = bytes(UNICODE_TO_BYTE[c] for c in piece)
            else:
                self.pieces[i] = piece.encode("utf-8")
        # Characters a char tokenizer knows; None means any text can be encoded.
        self.alphabet = None if self.byte_level else set(vocab)

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        path = Path(path)
        if not path.is_file():
            raise MinigptError("tokenizer file {path} does not exist; train a run there first", path=path)
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:  # the library raises plain Exceptions for malformed files
            raise MinigptError(
                "tokenizer file {path} could not be read ({exc}); retrain the run", path=path, exc=exc
            ) from None

    @classmethod
    def from_str(cls, text: str) -> TextTokenizer:
        """The tokenizer `to_str` wrote (as rank 0 of a data-parallel run sends it to the others)."""
        return cls(Tokenizer.from_str(text))

    def to_str(self) -> str:
        return self.tok.to_str()

    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer: what a checkpoint records and a resume compares."""
        return hashlib.sha256(self.to_str().encode("utf-8")).hexdigest()

    @property
    def end_of_text(self) -> int | None:
        """The id of END_OF_TEXT (the boundary between a corpus's files), or None without one."""
        return self.tok.token_to_id(END_OF_TEXT)

    def unknown_characters(self, text: str) -> list[str]:
        return [] if self.alphabet is None else sorted(set(text) - self.alphabet)

    def encode(self, text: str) -> list[int]:
        """Ids for `text`; a char tokenizer refuses characters it never saw, naming them."""
        return [i for ids in self.encode_lines(text.splitlines(keepends=True)) for i in ids]

    def encode_lines(self, lines: list[str]) -> list[list[int]]:
        unknown = self.unknown_characters("".join(lines))
        if unknown:
            shown = " ".join(repr(c) for c in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise MinigptError(
                "text has {n_unknown} character(s) the char tokenizer never saw in training: {shown}; remove "
                'them or train with tokenizer.kind = "bpe" or "byte"',
                n_unknown=len(unknown),
                shown=shown,
            )
        # The fast variant skips the character offsets we never read (same ids; tokenizers >= 0.20).
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [e.ids for e in encode(lines, add_special_tokens=False)]

    def token_text(self, i: int) -> str:
        """One token as readable text; bytes that are only part of a UTF-8 character (a byte-level
        token can hold a third of an emoji) show as <0xF0>, so different tokens stay distinguishable.
        An id past the tokenizer's (a padded model row, which a trace may rank) shows as <pad ID>."""
        if i >= self.vocab_size:
            return f"<pad {i}>"
        return self.pieces[i].decode("utf-8", errors=_HEX_BYTES)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self.pieces)


class StreamDecoder:
    """Turns ids into text as they arrive, holding back a UTF-8 sequence until it is complete."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.pieces[token_id])

    def flush(self) -> str:
        """Whatever is still held back, at the end of generation (an unfinished sequence shows as U+FFFD)."""
        return self._utf8.decode(b"", final=True)
