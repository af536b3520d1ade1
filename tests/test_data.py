"""minigpt.data: strict reading, the train/validation split (the tokenizer never sees validation),
the token cache under $MINIGPT_CACHE (memory-mapped hits, misses on any input change), batches."""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np
import pytest
import torch
from conftest import SESSION_FOLDERS, SESSION_KEY

from minigpt.config import load_config
from minigpt.errors import MinigptError
from minigpt.text.corpus import Batches, load_corpus
from minigpt.text.reading import read_text, split_text
from minigpt.text.token_cache import cache_root
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer


def corpus_with_messages(config, *overrides):
    messages = []
    corpus = load_corpus(load_config(config, list(overrides)), on_status=messages.append)
    return corpus, messages


# ----------------------------------------------------------------------------------------------
# reading and splitting


def test_read_text_returns_the_text_and_the_sha256_of_its_bytes(tmp_path):
    path = tmp_path / "t.txt"
    raw = "héllo\r\nwörld 🙂\n".encode()
    path.write_bytes(raw)
    text, sha = read_text(path)
    assert text == raw.decode("utf-8")  # line endings untouched
    assert sha == hashlib.sha256(raw).hexdigest()


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"text\x00more", "looks binary (NUL byte at offset 4)"),
        (b"caf\xc3\xa9 ok \xff rest", "not UTF-8: invalid byte 0xff at offset 9"),
        (b"truncated \xe6\x97", "at offset 10"),
    ],
)
def test_read_text_refuses_what_cannot_be_a_training_text(tmp_path, content, expected):
    path = tmp_path / "t.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(MinigptError) as excinfo:
        read_text(path)
    assert expected in str(excinfo.value)
    assert str(path) in str(excinfo.value)


def test_read_text_refuses_a_directory(tmp_path):
    with pytest.raises(MinigptError, match="is a directory"):
        read_text(tmp_path)


def test_split_keeps_a_contiguous_validation_tail():
    text = "0123456789" * 10
    head, tail = split_text(text, 0.1)
    assert head + tail == text
    assert len(tail) == 10 and tail == text[-10:]
    assert split_text("abc", 0.01)[1] == "c"  # always at least one validation character


def test_bpe_is_fitted_on_the_training_split_only(tmp_path):
    # Letters n..z never occur in the training head; the tail repeats one word made of them.
    head = ("abc defg hij klm " * 200)[:1600]
    tail = (" zyxwvu" * 60)[:400]
    text = head + tail
    assert split_text(text, 0.2) == (head, tail)
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text(
        '[model]\ncontext = 8\n[tokenizer]\nkind = "bpe"\nvocab_size = 300\n'
        '[train]\ndata = "t.txt"\nval_fraction = 0.2\n',
        encoding="utf-8",
    )

    # Control: fitted on the whole text, the tail's word is merged into fewer tokens.
    everything = TextTokenizer(train_tokenizer("bpe", 300, text))
    assert len(everything.encode(" zyxwvu")) < 3

    corpus, _ = corpus_with_messages(config)
    tok = corpus.tokenizer
    assert len(tok.encode(" zyxwvu")) == 7  # one byte token each: no merge ever saw these letters
    assert not any(set(piece.decode("latin-1")) & set("nopqrstuvwxyz") and len(piece) > 1 for piece in tok.pieces)
    # The head was still merged (the tokenizer did learn something).
    assert len(tok.encode("abc defg hij klm ")) < 8
    assert tok.decode([int(i) for i in corpus.val_ids]) == tail


def test_char_corpus_refuses_validation_characters_the_training_part_never_uses(tmp_path):
    (tmp_path / "t.txt").write_text("abcd" * 100 + "é" * 20 + "abcd" * 5, encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text('[model]\ncontext = 8\n[tokenizer]\nkind = "char"\n[train]\ndata = "t.txt"\n', encoding="utf-8")
    with pytest.raises(MinigptError) as excinfo:
        load_corpus(load_config(config))
    assert "'é'" in str(excinfo.value) and "validation tail" in str(excinfo.value)


def test_corpus_counts_bytes_for_bits_per_byte(tmp_path):
    text = "ab é " * 100
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text('[model]\ncontext = 8\n[tokenizer]\nkind = "char"\n[train]\ndata = "t.txt"\n', encoding="utf-8")
    corpus = load_corpus(load_config(config))
    head, tail = split_text(text, 0.1)
    assert corpus.train_bytes == len(head.encode("utf-8")) and corpus.val_bytes == len(tail.encode("utf-8"))
    assert corpus.val_tokens_per_byte == pytest.approx(len(tail) / len(tail.encode("utf-8")))
    assert corpus.val_tokens_per_byte < 1  # é is two bytes but one char token


# ----------------------------------------------------------------------------------------------
# the token cache


def test_cache_lives_under_minigpt_cache(isolated_cache, tiny_config):
    assert cache_root() == isolated_cache
    corpus_with_messages(tiny_config)
    entries = list(isolated_cache.glob("*/train.npy"))
    assert len(entries) == 1
    assert {p.name for p in entries[0].parent.iterdir()} == {"tokenizer.json", "train.npy", "val.npy"}


@pytest.fixture(scope="module")
def module_fixture_environment():
    """What a module-scoped fixture (a shared trained run) sees when it starts: before any
    function-scoped fixture has set a test's own cache."""
    return cache_root(), {name: os.environ.get(name) for name in SESSION_FOLDERS}


def test_a_module_fixture_already_writes_into_the_session_folder_not_the_users_home(
    module_fixture_environment, request
):
    session = request.config.stash[SESSION_KEY]
    cache, environment = module_fixture_environment
    assert cache == session / "minigpt-cache"
    for name, sub in SESSION_FOLDERS.items():  # every cache and settings folder the suite's programs use
        assert environment[name] == str(session / sub), name
    assert session.is_relative_to(tempfile.gettempdir())


def test_second_load_is_a_memory_mapped_cache_hit_with_identical_ids(tiny_config):
    first, messages = corpus_with_messages(tiny_config)
    assert not any("cache hit" in m for m in messages)
    assert any("fitted a char tokenizer" in m for m in messages)

    second, messages = corpus_with_messages(tiny_config)
    assert any("cache hit" in m for m in messages), messages
    assert not any("fitted" in m for m in messages)
    assert isinstance(second.train_ids, np.memmap) and isinstance(second.val_ids, np.memmap)
    assert not isinstance(first.train_ids, np.memmap)
    assert np.array_equal(first.train_ids, second.train_ids)
    assert np.array_equal(first.val_ids, second.val_ids)
    assert second.train_ids.dtype == first.train_ids.dtype
    # The reloaded tokenizer is the same one (a resume compares this fingerprint).
    assert second.tokenizer.fingerprint() == first.tokenizer.fingerprint()
    assert (second.sha256, second.train_bytes, second.val_bytes) == (first.sha256, first.train_bytes, first.val_bytes)


def test_cache_hit_for_bpe_keeps_the_tokenizer_fingerprint(tiny_config):
    settings = ["tokenizer.kind=bpe", "tokenizer.vocab_size=300"]
    first, _ = corpus_with_messages(tiny_config, *settings)
    second, messages = corpus_with_messages(tiny_config, *settings)
    assert any("cache hit" in m for m in messages)
    assert second.tokenizer.fingerprint() == first.tokenizer.fingerprint()
    assert np.array_equal(first.train_ids, second.train_ids)


@pytest.mark.parametrize(
    "change",
    [
        "content",
        "tokenizer.kind=byte",
        "tokenizer.vocab_size=300",
        "train.val_fraction=0.2",
    ],
)
def test_any_change_of_text_or_tokenizer_settings_misses_the_cache(tiny_config, tiny_text, change):
    base = ["tokenizer.kind=bpe", "tokenizer.vocab_size=280"] if "vocab_size" in change else []
    first, _ = corpus_with_messages(tiny_config, *base)
    overrides = list(base)
    if change == "content":
        tiny_text.write_text(tiny_text.read_text(encoding="utf-8").replace("Citizen", "Citizens", 1), encoding="utf-8")
    else:
        overrides.append(change)
    second, messages = corpus_with_messages(tiny_config, *overrides)
    assert not any("cache hit" in m for m in messages), messages
    assert any("fitted" in m for m in messages)
    # The new result is not the old one read back.
    assert (
        second.sha256 != first.sha256
        or second.tokenizer.fingerprint() != first.tokenizer.fingerprint()
        or len(second.val_ids) != len(first.val_ids)
    )
    # And the old entry still hits.
    _, messages = corpus_with_messages(tiny_config, *base)
    if change != "content":
        assert any("cache hit" in m for m in messages)


def test_text_shorter_than_one_window_is_refused(tmp_path):
    (tmp_path / "t.txt").write_text("ab" * 10, encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text('[model]\ncontext = 8\n[tokenizer]\nkind = "char"\n[train]\ndata = "t.txt"\n', encoding="utf-8")
    with pytest.raises(MinigptError) as excinfo:
        load_corpus(load_config(config))
    message = str(excinfo.value)
    assert "too short" in message and "validation split has 2 tokens" in message
    assert "context + 1 = 9" in message


# ----------------------------------------------------------------------------------------------
# batches


def test_batches_are_next_token_windows_from_the_split():
    ids = np.arange(100, dtype=np.uint16)
    batches = Batches(ids, context=8, batch_size=5)
    x, y = batches.sample(torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (5, 8) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)  # targets are the inputs shifted by one token
    assert int(y.max()) <= 99

    again = batches.sample(torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x)  # the generator alone decides the windows


def test_fixed_validation_windows_cover_the_split_and_never_change():
    ids = np.arange(50, dtype=np.uint16)
    batches = Batches(ids, context=8, batch_size=4)
    windows = batches.fixed(3)
    assert len(windows) == 3
    starts = [int(s) for x, _ in windows for s in x[:, 0]]
    assert starts[0] == 0 and starts[-1] == 50 - 8 - 1  # first and last possible window
    assert starts == sorted(starts)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(windows, batches.fixed(3)))
    assert len(starts) == 12
