"""minigpt.tokenizer: bpe, char and byte round trips (non-ASCII included), tokenizer.json as a real
`tokenizers` file, byte ids as byte values, streaming decode of split characters, refusals."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from minigpt.errors import MinigptError
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

NON_ASCII = "Café naïve résumé. 日本語のテキスト。 Emoji: 🙂👍🏽 and ✓.\n"
TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "  indented line with  two spaces\r\nWindows line end above.\n" + NON_ASCII
) * 4


def fitted(kind: str, text: str = TEXT, vocab_size: int = 300) -> TextTokenizer:
    return TextTokenizer(train_tokenizer(kind, vocab_size, text))


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
def test_round_trip_keeps_every_character(kind):
    tok = fitted(kind)
    ids = tok.encode(TEXT)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == TEXT
    assert tok.decode(tok.encode(NON_ASCII)) == NON_ASCII


@pytest.mark.parametrize("kind", ["bpe", "byte"])
def test_byte_level_kinds_round_trip_text_never_seen_in_training(kind):
    tok = fitted(kind, text="only plain ascii words here\n" * 20)
    unseen = "Ωmega ∑ 𝔘nicode 日本 🦙\n"
    assert tok.decode(tok.encode(unseen)) == unseen


def test_char_tokenizer_has_one_id_per_distinct_character():
    tok = fitted("char")
    assert tok.vocab_size == len(set(TEXT))
    assert len(tok.encode(NON_ASCII)) == len(NON_ASCII)


def test_bpe_learns_merges_up_to_its_vocab_size():
    tok = fitted("bpe", vocab_size=300)
    assert tok.vocab_size == 300
    # 44 merges on this repetitive text make it clearly shorter than its bytes.
    assert len(tok.encode(TEXT)) < 0.8 * len(TEXT.encode("utf-8"))
    assert any(len(piece) > 1 for piece in tok.pieces)


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
def test_tokenizer_json_reloads_with_the_library_and_gives_the_same_ids(kind, tmp_path):
    tok = fitted(kind)
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_str(), encoding="utf-8")

    library = Tokenizer.from_file(str(path))
    lines = TEXT.splitlines(keepends=True)
    assert [e.ids for e in library.encode_batch(lines, add_special_tokens=False)] == tok.encode_lines(lines)
    assert library.decode(tok.encode(TEXT)) == TEXT
    assert library.get_vocab_size() == tok.vocab_size

    reloaded = TextTokenizer.load(path)
    assert reloaded.encode(TEXT) == tok.encode(TEXT)
    assert reloaded.pieces == tok.pieces
    assert reloaded.fingerprint() == tok.fingerprint()


def test_byte_ids_are_the_utf8_byte_values():
    tok = fitted("byte")
    assert tok.vocab_size == 256
    for text in ["A", "é", "日本語", "🙂👍🏽", NON_ASCII]:
        assert tok.encode(text) == list(text.encode("utf-8")), text
    assert tok.pieces == [bytes([b]) for b in range(256)]


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_stream_decoder_holds_back_split_characters_and_ends_equal_to_decode(kind):
    # BPE fitted to ASCII only: every non-ASCII character is split across byte tokens.
    tok = fitted(kind, text="plain ascii training text, nothing else\n" * 20)
    text = "é日本語🙂👍🏽 ok"
    ids = tok.encode(text)
    split = [i for i in ids if not _valid_utf8(tok.pieces[i])]
    assert split, "the test needs tokens that hold part of a character"

    stream = tok.stream()
    emitted = [stream.push(i) for i in ids]
    tail = stream.flush()
    assert not any("\ufffd" in piece for piece in emitted), emitted
    assert "".join(emitted) + tail == tok.decode(ids) == text
    assert tail == ""
    # Nothing is emitted for the first byte of "é"; the whole character comes with its last byte.
    assert emitted[0] == "" and emitted[1] == "é"


def test_decode_of_a_partial_utf8_sequence_does_not_crash():
    tok = fitted("byte")
    ids = tok.encode("a🙂")  # a, then 4 bytes
    assert tok.decode(ids[:3]) == "a\ufffd"
    assert tok.decode(ids[2:]).endswith("\ufffd")  # starts mid-character
    assert tok.token_text(ids[1]) == "<0xF0>"  # a lone lead byte shows as itself, not as a bare U+FFFD
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids[:3]) == "a"
    assert stream.flush() == "\ufffd"  # an unfinished character at the end shows as one mark


def test_char_tokenizer_refuses_unseen_characters_naming_them():
    tok = fitted("char", text="abc abc\n")
    with pytest.raises(MinigptError) as excinfo:
        tok.encode("abz€ cab")
    message = str(excinfo.value)
    assert "'z'" in message and "'€'" in message
    assert "2 character(s)" in message
    assert "'a'" not in message
    assert 'kind = "bpe"' in message


def test_unknown_tokenizer_kind_is_refused():
    with pytest.raises(MinigptError, match="unknown; choose one of: bpe, char, byte"):
        train_tokenizer("words", 300, "text")


def test_loading_a_missing_or_broken_tokenizer_file_is_refused(tmp_path):
    with pytest.raises(MinigptError, match="does not exist"):
        TextTokenizer.load(tmp_path / "missing.json")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(MinigptError, match="could not be read"):
        TextTokenizer.load(broken)


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("size", [1, 3, 7, 64, 1 << 20])
def test_line_chunks_cut_only_at_line_ends_and_lose_nothing(size):
    from minigpt.text.tokenizer import line_chunks

    text = "ROMEO:\r\nBut soft!\n\n\nWhat light\u2028through\x0cyonder\rwindow\nbreaks\n" * 3 + "no newline at the end"
    pieces = list(line_chunks(text, size))
    assert "".join(pieces) == text
    assert all(piece.endswith("\n") for piece in pieces[:-1])
    assert [line for piece in pieces for line in piece.splitlines(keepends=True)] == text.splitlines(keepends=True)
    assert list(line_chunks("", size)) == []


def test_a_text_encoded_in_pieces_gives_the_ids_of_the_whole(tmp_path):
    import numpy as np

    from minigpt.text.reading import encode

    text = "".join(f"line {i}: é日 the quick brown fox\n" for i in range(500))
    tokenizer = TextTokenizer(train_tokenizer("bpe", 300, text))
    seen = []
    ids = encode(tokenizer, text, seen.append)
    assert ids.dtype == np.uint16 and ids.tolist() == tokenizer.encode(text)
    assert sum(seen) == len(text)


def test_an_added_token_stands_for_its_own_text_in_a_byte_level_tokenizer():
    """GPT-2's <|endoftext|> is an added special token, and an added token need not be written in
    the byte-level alphabet (a space, an é): each decodes to its own UTF-8 text, and no text before
    or after it changes."""
    from tokenizers import AddedToken

    tok = train_tokenizer("bpe", 300, TEXT)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.add_tokens([AddedToken(" zzz é", special=False)])
    text = TextTokenizer(tok)
    assert text.vocab_size == tok.get_vocab_size() == 302
    eot, other = tok.token_to_id("<|endoftext|>"), tok.token_to_id(" zzz é")
    assert (text.token_text(eot), text.token_text(other)) == ("<|endoftext|>", " zzz é")
    ids = text.encode("Before<|endoftext|>we zzz é speak")
    assert eot in ids and other in ids
    assert text.decode(ids) == "Before<|endoftext|>we zzz é speak"


def test_an_id_past_the_tokenizer_s_shows_as_padding():
    """A padded model (nanoGPT: 50,304 rows for 50,257 ids) ranks rows no text encodes to; a trace
    shows them as <pad ID>, distinct from every real token."""
    tok = fitted("char")
    assert tok.token_text(tok.vocab_size) == f"<pad {tok.vocab_size}>"
    assert tok.token_text(tok.vocab_size + 6) == f"<pad {tok.vocab_size + 6}>"
    assert tok.token_text(tok.vocab_size - 1) != f"<pad {tok.vocab_size - 1}>"


def test_imported_is_a_kind_no_text_is_fitted_to():
    with pytest.raises(MinigptError, match='kind = "imported" is the tokenizer an imported model came with'):
        train_tokenizer("imported", 300, TEXT)
