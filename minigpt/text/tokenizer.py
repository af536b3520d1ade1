"""Tokenizers built with Hugging Face `tokenizers`: byte-level BPE, char and byte.

Every kind is saved as a plain `tokenizer.json` that `tokenizers.Tokenizer.from_file` loads. On top
of the library we keep one table, `pieces`: the exact bytes each id stands for. Decoding joins those
bytes and decodes UTF-8 once, so a byte-level model's output can never crash on a split character,
and streaming holds back an incomplete sequence until its last byte arrives.

Text is encoded line by line (line endings kept) with the library's batch encoder, both for the
corpus and for prompts, so a prompt is split exactly as the same text was split in training.

A tokenizer that came with a Llama-family model (interchange/hf_tokenizer.py) is *framed*: its
post-processor is a template (the BOS the model was trained to see first), and it reads a text
whole, as its authors' code does (its pre-tokenizer may join a run of newlines into one token, or
mark only the text's first word with SentencePiece's "▁"). A SentencePiece-style decoder
(Replace "▁" with " ", ByteFallback, Fuse, Strip) is followed in the byte table too: <0xE4> is
the byte 0xE4, and the text's first space is dropped when the decoder drops it.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
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
# The same map for str.translate: a byte-level piece becomes the Latin-1 spelling of its bytes
# (a 150,000-token vocabulary in a tenth of a second rather than seconds).
_TO_LATIN1 = {ord(c): b for c, b in UNICODE_TO_BYTE.items()}


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


def _spec(component) -> dict | None:
    """A `tokenizers` decoder or post-processor as the JSON it is saved as; None for none."""
    return None if component is None else json.loads(component.__getstate__())


def post_processors(post: dict | None) -> list[dict]:
    """The post-processors a post-processor's JSON is made of, a Sequence's unpacked."""
    if post is None:
        return []
    return [p for part in post["processors"] for p in post_processors(part)] if post["type"] == "Sequence" else [post]


def _is_template(post: dict | None) -> bool:
    """Whether a post-processor is (or holds) a TemplateProcessing: a framed tokenizer's mark."""
    return any(p["type"] == "TemplateProcessing" for p in post_processors(post))


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # ByteFallback's spelling of one byte


def _piece_rules(decoder: dict | None) -> tuple[tuple[tuple[str, str], ...], bool, tuple | None] | None:
    """A SentencePiece-style decoder as rules the byte table can follow token by token:
    (replacements made in every token, whether <0xAB> tokens are bytes, how the text's start
    differs), or None for any other decoder. The start: ("strip", c, n) drops up to n leading c's
    of the joined text (Strip after Fuse); ("first", c) drops every c of the first token, where
    later tokens get a space (Metaspace's prefix space)."""
    if decoder is None:
        return None
    if decoder["type"] == "Metaspace":
        scheme = decoder.get("prepend_scheme", "always" if decoder.get("add_prefix_space", True) else "never")
        c = decoder["replacement"]
        return ((c, " "),), False, None if scheme == "never" else ("first", c)
    steps = decoder["decoders"] if decoder["type"] == "Sequence" else [decoder]
    kinds = [step["type"] for step in steps]
    replace = []
    while steps and kinds[0] == "Replace" and "String" in steps[0]["pattern"]:
        replace.append((steps[0]["pattern"]["String"], steps[0]["content"]))
        steps, kinds = steps[1:], kinds[1:]
    fallback = kinds[:1] == ["ByteFallback"]
    steps, kinds = steps[fallback:], kinds[fallback:]
    if kinds[:1] != ["Fuse"] or not (replace or fallback):
        return None
    if kinds[1:] == []:
        return tuple(replace), fallback, None
    if kinds[1:] == ["Strip"] and steps[1]["stop"] == 0:
        return tuple(replace), fallback, ("strip", steps[1]["content"], steps[1]["start"])
    return None


def _fallback_text(run: bytes) -> str:
    """ByteFallback's reading of a run of byte tokens: its text if it is whole UTF-8, else one
    U+FFFD for every byte."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the byte table that makes decoding exact and streamable."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.byte_level = isinstance(tok.decoder, decoders.ByteLevel)
        # A model's own tokenizer: it reads a text whole, inside its template (see the module's docstring).
        self.framed = _is_template(_spec(tok.post_processor))
        vocab = tok.get_vocab()
        # The ids it can write: 0 .. vocab_size - 1. A model may have more rows than this (nanoGPT
        # pads GPT-2's 50,257 ids to 50,304); those ids are never written (see token_text).
        self.vocab_size = max(tok.get_vocab_size(), max(vocab.values(), default=-1) + 1)
        # Added tokens (GPT-2's <|endoftext|>) match the raw text, so they stand for their own
        # UTF-8 bytes, not for the byte-level alphabet, which they need not be written in.
        added = set(tok.get_added_tokens_decoder())
        rules = None if self.byte_level else _piece_rules(_spec(tok.decoder))
        replace, fallback, self._start = rules or ((), False, None)
        self._byte_tokens: set[int] = set()  # ByteFallback's <0xAB> tokens
        self._first: dict[int, str] = {}  # Metaspace: a token's text where it starts the text
        self.pieces: list[bytes] = [b""] * self.vocab_size
        for piece, i in vocab.items():
            if self.byte_level and i not in added:
                self.pieces[i] = piece.translate(_TO_LATIN1).encode("latin-1")
                continue
            text = piece
            for old, new in replace:  # the decoder sends every token through, added ones too
                text = text.replace(old, new)
            if fallback and _BYTE_TOKEN.fullmatch(text):
                self.pieces[i] = bytes([int(text[3:5], 16)])
                self._byte_tokens.add(i)
            else:
                self.pieces[i] = text.encode("utf-8")
            if self._start and self._start[0] == "first" and self._start[1] in piece:
                self._first[i] = piece.replace(self._start[1], "")
        # Characters a char tokenizer knows; None means any text can be encoded.
        self.alphabet = None if self.byte_level or self.framed else set(vocab)

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

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Ids for `text`; a char tokenizer refuses characters it never saw, naming them. A framed
        tokenizer reads the text whole, inside its template (an imported Llama's BOS first) unless
        `special` is false: the ids of the text alone (one token named by its text, a part of a
        longer text)."""
        if self.framed:
            return self.tok.encode(text, add_special_tokens=special).ids
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
        """The text of `ids`, as the tokenizer's own decoder writes it."""
        if not (self._byte_tokens or self._start):
            return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")
        parts, run = [], b""
        for n, i in enumerate(ids):
            if i in self._byte_tokens:
                run += self.pieces[i]
                continue
            if run:
                parts.append(_fallback_text(run))
                run = b""
            parts.append(self._first[i] if n == 0 and i in self._first else self.pieces[i].decode("utf-8", "replace"))
        text = "".join(parts) + (_fallback_text(run) if run else "")
        if self._start and self._start[0] == "strip":
            _, c, most = self._start
            while most and text.startswith(c):
                text, most = text[len(c) :], most - 1
        return text

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self.pieces, self._byte_tokens)


class StreamDecoder:
    """Turns ids into text as they arrive, holding back a UTF-8 sequence until it is complete. A run
    of ByteFallback's byte tokens is held until it ends, and is then read as decode reads it (whole
    UTF-8, or one U+FFFD a byte)."""

    def __init__(self, pieces: list[bytes], byte_tokens: set[int] | frozenset[int] = frozenset()):
        self.pieces = pieces
        self.byte_tokens = byte_tokens
        self._run = b""
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if token_id in self.byte_tokens:
            self._run += self.pieces[token_id]
            return ""
        return self._end_run() + self._utf8.decode(self.pieces[token_id])

    def flush(self) -> str:
        """Whatever is still held back, at the end of generation (an unfinished sequence shows as U+FFFD)."""
        return self._end_run() + self._utf8.decode(b"", final=True)

    def _end_run(self) -> str:
        run, self._run = self._run, b""
        return _fallback_text(run) if run else ""
