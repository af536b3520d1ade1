"""A corpus of several files: `--data FOLDER` (every *.txt under it, sorted) or `--data` repeated.
Each file's head trains and its tail validates, END_OF_TEXT between documents, every file's text
byte-exact; the run's identity names every file; the per-file token cache; every bad input is one
line with nothing written; a single file is exactly what it always was."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHAKESPEARE, TINY_CONFIG, power_cut_at

from minigpt.config import load_config
from minigpt.errors import MinigptError
from minigpt.text.corpus import Batches, load_corpus
from minigpt.text.reading import split_text
from minigpt.text.tokenizer import END_OF_TEXT, TextTokenizer, train_tokenizer

TEXT = SHAKESPEARE.read_text(encoding="utf-8")
# Three documents, one with Windows line endings, two-byte and four-byte characters and no final
# newline: each must come back byte for byte.
DOCUMENTS = {
    "a.txt": TEXT[:7_000].encode(),
    "b.txt": ("café 🙂 " + TEXT[7_000:12_000].replace("\n", "\r\n") + " café 🙂 end").encode(),
    "c.txt": TEXT[12_000:20_000].encode(),
}


def error_line(result) -> str:
    """A refusal: exit 2, one `minigpt: error:` line on stderr and nothing else, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), lines
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def books(tmp_path) -> Path:
    folder = tmp_path / "books"
    folder.mkdir()
    for name, raw in DOCUMENTS.items():
        (folder / name).write_bytes(raw)
    return folder


@pytest.fixture
def config(tmp_path) -> Path:
    """The tiny config, training on books/ (relative to the config's folder)."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_CONFIG.replace('data = "tiny.txt"', 'data = "books"'), encoding="utf-8")
    return path


def corpus(config, *overrides, **kwargs):
    messages = []
    loaded = load_corpus(load_config(config, list(overrides)), on_status=messages.append, **kwargs)
    return loaded, messages


def splits_of(ids: np.ndarray, boundary: int) -> list[list[int]]:
    """The documents of a joined split: its ids cut at every boundary id."""
    documents, current = [], []
    for i in ids.tolist():
        if i == boundary:
            documents.append(current)
            current = []
        else:
            current.append(i)
    return documents + [current]


def nothing_left(tmp_path: Path, run: Path) -> None:
    assert not run.exists()
    assert not list(tmp_path.glob(f".{run.name}*"))  # no lock file, no temporary folder


# ----------------------------------------------------------------------------------------------
# joining: heads train, tails validate, a boundary between documents, every byte kept


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_heads_train_tails_validate_and_each_file_decodes_back_byte_exact(config, books, kind):
    loaded, _ = corpus(config, f'tokenizer.kind="{kind}"', "tokenizer.vocab_size=300")
    tok = loaded.tokenizer
    boundary = tok.end_of_text
    assert boundary is not None and tok.token_text(boundary) == END_OF_TEXT
    assert boundary == (0 if kind == "bpe" else tok.vocab_size - 1)  # BPE: a trainer's special token
    heads, tails = zip(*(split_text(raw.decode(), 0.1) for raw in DOCUMENTS.values()))
    for ids, parts in ((loaded.train_ids, heads), (loaded.val_ids, tails)):
        documents = splits_of(ids, boundary)
        assert len(documents) == 3  # a boundary between documents, none before the first or after the last
        assert [tok.decode(d) for d in documents] == list(parts)  # byte-exact, \r\n and all
    assert loaded.train_bytes == sum(len(h.encode()) for h in heads)
    assert loaded.val_bytes == sum(len(t.encode()) for t in tails)
    assert [d.name for d in loaded.documents] == ["a.txt", "b.txt", "c.txt"]
    assert [(d.train_tokens, d.val_tokens) for d in loaded.documents] == [
        (len(h), len(t)) for h, t in zip(splits_of(loaded.train_ids, boundary), splits_of(loaded.val_ids, boundary))
    ]
    assert [d.sha256 for d in loaded.documents] == [hashlib.sha256(raw).hexdigest() for raw in DOCUMENTS.values()]
    if kind == "char":  # fitted to the heads only: a character only in b's tail is not in it
        assert "🙂" not in tok.alphabet or "🙂" in heads[1]


def test_the_tokenizer_is_fitted_to_the_heads_only(tmp_path, config):
    folder = tmp_path / "books"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):  # each file's tail is one word the heads never use
        (folder / name).write_text(("abc defg hij " * 150)[:1800] + (" zyxwvu" * 60)[:200], encoding="utf-8")
    loaded, _ = corpus(config, 'tokenizer.kind="bpe"', "tokenizer.vocab_size=300", "train.val_fraction=0.1")
    assert len(loaded.tokenizer.encode(" zyxwvu")) == 7  # no merge ever saw these letters
    assert len(loaded.tokenizer.encode("abc defg hij ")) < 6


def test_validation_windows_come_from_every_files_tail(config, books, monkeypatch):
    import minigpt.text.corpus as corpus_module
    import minigpt.training.session as session

    starts = []

    class Recorded(Batches):  # the evaluation's own windows, as the session draws them
        def windows(self, at):
            starts.extend(at.tolist())
            return super().windows(at)

    cfg = load_config(config)
    loaded = load_corpus(cfg)
    monkeypatch.setattr(corpus_module, "Batches", Recorded)  # what Corpus.validation_windows draws with
    session.build(cfg, loaded)
    # Where each file's tail lies in the validation split (a boundary id after each but the last).
    offsets = np.cumsum([0] + [d.val_tokens + 1 for d in loaded.documents])
    window = cfg.model.context + 1
    covered = [any(s < end - 1 and s + window > start for s in starts) for start, end in zip(offsets, offsets[1:])]
    assert len(starts) == cfg.train.eval_batches * cfg.train.batch_size and covered == [True, True, True]


def test_repeated_data_is_the_folder_with_the_same_files_in_the_same_order(config, books):
    from_folder, _ = corpus(config)
    listed = [str(books / name) for name in DOCUMENTS]
    from_list = load_corpus(load_config(config, [], {"train": {"data": listed}}))
    assert np.array_equal(from_folder.train_ids, from_list.train_ids)
    assert np.array_equal(from_folder.val_ids, from_list.val_ids)
    assert from_folder.tokenizer.fingerprint() == from_list.tokenizer.fingerprint()
    assert from_folder.sha256 == from_list.sha256 and from_folder.files == from_list.files
    reordered = load_corpus(load_config(config, [], {"train": {"data": listed[::-1]}}))
    assert reordered.sha256 != from_folder.sha256  # order is part of the corpus


def test_a_folder_is_read_recursively_in_sorted_order_without_hidden_or_other_files(tmp_path, config):
    folder = tmp_path / "books"
    for name in ("b.txt", "a/z.txt", "a/b/c.txt", "a.txt", "notes.md", ".hidden.txt", ".git/x.txt", "empty.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("" if name == "empty.txt" else TEXT[:3000], encoding="utf-8")
    loaded, messages = corpus(config)
    assert [d.name for d in loaded.documents] == ["a/b/c.txt", "a/z.txt", "a.txt", "b.txt"]  # sorted(rglob)
    assert [str(p.relative_to(folder)) for p in sorted(folder.rglob("[!.]*.txt")) if ".git" not in p.parts][:4] == [
        "a/b/c.txt",
        "a/z.txt",
        "a.txt",
        "b.txt",
    ]
    assert "note: skipped 1 empty file(s) (no text to train on): empty.txt" in messages


def test_a_single_file_is_exactly_what_it_always_was(tmp_path, config):
    raw = DOCUMENTS["b.txt"]
    (tmp_path / "only.txt").write_bytes(raw)
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "only.txt").write_bytes(raw)
    settings = ['tokenizer.kind="bpe"', "tokenizer.vocab_size=300"]
    direct, _ = corpus(config, *settings, f'train.data="{tmp_path / "only.txt"}"')
    in_a_folder, _ = corpus(config, *settings, f'train.data="{tmp_path / "one"}"')
    head, tail = split_text(raw.decode(), 0.1)
    fitted = TextTokenizer(train_tokenizer("bpe", 300, head))  # what a one-file run always fitted
    for loaded in (direct, in_a_folder):
        assert loaded.sha256 == hashlib.sha256(raw).hexdigest()  # the file's own, as checkpoints record
        assert loaded.tokenizer.fingerprint() == fitted.fingerprint() and loaded.tokenizer.end_of_text is None
        assert loaded.train_ids.tolist() == fitted.encode(head) and loaded.val_ids.tolist() == fitted.encode(tail)


# ----------------------------------------------------------------------------------------------
# training and resuming


def test_a_folder_of_three_files_trains_and_resumes_bitwise(cli, config, books, tmp_path):
    straight = tmp_path / "straight"
    result = cli("train", "-c", config, "--out", straight, "--quiet")
    assert result.exit_code == 0, result.output
    payload = torch.load(straight / "checkpoint.pt", weights_only=True)
    assert payload["corpus_files"] == [[name, hashlib.sha256(raw).hexdigest()] for name, raw in DOCUMENTS.items()]
    assert 'data = "' in (straight / "config.toml").read_text(encoding="utf-8")  # one path: a string

    run = tmp_path / "crashed"
    with power_cut_at(20):
        assert isinstance(cli("train", "-c", config, "--out", run, "--quiet").exception, RuntimeError)
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 10
    # Resumed from the folder moved elsewhere: names are relative to it, so it is the same corpus.
    moved = tmp_path / "moved"
    shutil.move(books, moved)
    result = cli("train", "-c", config, "--out", run, "--quiet", "--resume", "--data", moved)
    assert result.exit_code == 0, result.output
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20 and a["hashes"] == b["hashes"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_the_api_and_repeated_data_train_the_folders_run(cli, config, books, tmp_path):
    from minigpt.api import train

    folder = tmp_path / "folder"
    assert cli("train", "-c", config, "--out", folder, "--quiet", "--steps", "5").exit_code == 0
    repeated = tmp_path / "repeated"
    args = [a for name in DOCUMENTS for a in ("--data", books / name)]
    assert cli("train", "-c", config, "--out", repeated, "--quiet", "--steps", "5", *args).exit_code == 0
    listed = train([books / name for name in DOCUMENTS], tmp_path / "api", 5, config=config, progress=False)
    written = (repeated / "config.toml").read_text(encoding="utf-8")
    assert "data = [" in written and load_config(repeated / "config.toml").train.data == [
        str(books / name) for name in DOCUMENTS
    ]
    weights = [torch.load(r / "checkpoint.pt", weights_only=True)["model"] for r in (folder, repeated, listed.run)]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])


@pytest.mark.parametrize(
    "change, expected",
    [
        ("change", "b.txt changed (sha256 "),
        ("add", "d.txt was added"),
        ("remove", "b.txt was removed"),
        ("reorder", "the same files in another order (a.txt was file 1, now file 2)"),
    ],
)
def test_resume_with_a_changed_added_or_removed_file_is_refused_naming_it(
    cli, config, books, tmp_path, change, expected
):
    run = tmp_path / "run"
    assert cli("train", "-c", config, "--out", run, "--quiet", "--steps", "10").exit_code == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    data = []
    if change == "change":  # same characters, so the char tokenizer is unchanged and the text is what differs
        (books / "b.txt").write_bytes(DOCUMENTS["b.txt"].replace(b"Citizen", b"Citizem", 1))
    elif change == "add":
        (books / "d.txt").write_bytes(DOCUMENTS["a.txt"][:3000])
    elif change == "remove":
        (books / "b.txt").unlink()
    else:
        data = [a for name in ("b.txt", "a.txt", "c.txt") for a in ("--data", books / name)]
    line = error_line(cli("train", "-c", config, "--out", run, "--steps", "10", "--resume", *data))
    assert "--resume refused: the training files (" in line and expected in line, line
    assert "resume with the original files" in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


# ----------------------------------------------------------------------------------------------
# bad input: one line, nothing written


def _make(tmp_path: Path, case: str) -> Path:
    folder = tmp_path / "input"
    folder.mkdir()
    if case == "no-txt":
        for name in ("a.md", "b.csv", "sub/c.json"):
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_text("x", encoding="utf-8")
    elif case == "not-utf8":
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "b.txt").write_bytes(b"caf\xc3\xa9 ok \xff rest")
    elif case == "binary":
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "b.txt").write_bytes(b"text\x00more")
    elif case == "loop":
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "sub").mkdir()
        (folder / "sub" / "up").symlink_to("..")
    elif case == "loop-below":  # a link to the folder above: the loop is found one folder further in
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "up").symlink_to("..")
    elif case == "self-link":
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "self.txt").symlink_to("self.txt")
    elif case == "broken-link":
        (folder / "a.txt").write_bytes(DOCUMENTS["a.txt"])
        (folder / "b.txt").symlink_to("gone.txt")
    elif case == "only-empty":
        (folder / "a.txt").write_bytes(b"")
    elif case == "too-short":
        (folder / "a.txt").write_bytes(b"ab" * 10)
        (folder / "b.txt").write_bytes(b"cd" * 10)
    return folder


@pytest.mark.parametrize(
    "case, expected",
    [
        ("empty", "training folder {folder} is empty; put the UTF-8 *.txt files to train on in it"),
        ("no-txt", "training folder {folder} holds no *.txt file (3 file(s), none ending in .txt, e.g. a.md)"),
        ("not-utf8", "training text {folder}/b.txt is not UTF-8: invalid byte 0xff at offset 9"),
        ("binary", "training text {folder}/b.txt looks binary (NUL byte at offset 4)"),
        ("loop", "the link {folder}/sub/up leads back to {folder}, a folder it lies in, so the folder never ends"),
        ("loop-below", "the link {folder}/up leads back to {folder}, a folder it lies in (through {folder}/up/input)"),
        ("self-link", "the link {folder}/self.txt (to self.txt) never reaches a file (a link loop)"),
        ("broken-link", "the link {folder}/b.txt is broken (gone.txt does not exist)"),
        ("only-empty", "training folder {folder} holds only empty *.txt files (1, e.g. a.txt)"),
        # 2 + 2 characters and the boundary between them
        ("too-short", "training corpus (2 files under {folder}) is too short: its validation split has 5 tokens"),
    ],
)
def test_a_folder_that_cannot_be_a_corpus_is_refused_in_one_line_with_nothing_written(
    cli, config, tmp_path, case, expected
):
    folder = _make(tmp_path, case)
    run = tmp_path / "run"
    line = error_line(cli("train", "-c", config, "--data", folder, "--out", run))
    assert expected.format(folder=folder) in line, line
    nothing_left(tmp_path, run)


def test_two_files_of_one_name_and_a_file_given_twice_are_refused(cli, config, books, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.txt").write_bytes(DOCUMENTS["c.txt"])
    run = tmp_path / "run"
    line = error_line(cli("train", "-c", config, "--data", books, "--data", other, "--out", run))
    assert f"training files {books / 'a.txt'} and {other / 'a.txt'} are both named a.txt" in line
    line = error_line(cli("train", "-c", config, "--data", books / "a.txt", "--data", books / "a.txt", "--out", run))
    assert f"training file {books / 'a.txt'} is given twice" in line and "--data" in line
    nothing_left(tmp_path, run)


def test_a_file_that_changes_while_it_is_read_is_refused(cli, config, books, tmp_path, monkeypatch):
    import minigpt.text.reading as text

    read = text._read_bytes

    def written_meanwhile(path):
        raw = read(path)
        if path.name == "b.txt":  # another program appends while minigpt reads
            with open(path, "ab") as f:
                f.write(b"more text\n")
        return raw

    monkeypatch.setattr(text, "_read_bytes", written_meanwhile)
    run = tmp_path / "run"
    line = error_line(cli("train", "-c", config, "--out", run))
    assert f"training text {books / 'b.txt'} changed while it was being read; try again once nothing is" in line
    nothing_left(tmp_path, run)


def test_a_file_that_changes_between_its_reads_is_refused(cli, config, books, tmp_path, monkeypatch):
    import minigpt.text.folders as folders

    read_text, seen = folders.read_text, []

    def edited_after_the_first_read(path, *args):
        seen.append(Path(path).name)
        if seen.count("a.txt") == 2:  # read once for its sha256, then edited before it is encoded
            Path(path).write_bytes(DOCUMENTS["a.txt"] + b"an edit\n")
        return read_text(path, *args)

    monkeypatch.setattr(folders, "read_text", edited_after_the_first_read)
    run = tmp_path / "run"
    line = error_line(cli("train", "-c", config, "--out", run, "--set", 'tokenizer.kind="byte"'))
    assert f"training text {books / 'a.txt'} changed while the corpus was being prepared (sha256 " in line
    nothing_left(tmp_path, run)


def test_a_char_tail_with_characters_no_head_has_is_refused_naming_the_file(config, books):
    (books / "b.txt").write_bytes(TEXT[:3000].encode() + "é".encode() * 40)
    with pytest.raises(MinigptError) as excinfo:
        corpus(config)
    assert f"validation tail of {books / 'b.txt'} has characters no file's training part uses ('é')" in str(
        excinfo.value
    )


def test_a_fine_tunes_tokenizer_without_an_end_of_text_token_is_refused(config, books):
    one_file = TextTokenizer(train_tokenizer("char", 0, TEXT[:20_000] + " café 🙂\r"))
    with pytest.raises(MinigptError) as excinfo:
        corpus(config, "train.init_from=runs/one-file", tokenizer=one_file)
    assert f"init_from {Path.cwd() / 'runs' / 'one-file'}: its tokenizer has no {END_OF_TEXT!r}" in str(excinfo.value)
    assert "(3 files under" in str(excinfo.value)


def test_another_ranks_files_are_compared_by_name_and_sha256(config, books):
    rank_0, _ = corpus(config)
    theirs = list(rank_0.files)
    theirs[1] = ("b.txt", "0" * 64)
    with pytest.raises(MinigptError) as excinfo:
        corpus(config, tokenizer=rank_0.tokenizer, same_as=theirs)
    assert "the training files here are not the files rank 0 trains on (b.txt changed (sha256 " in str(excinfo.value)
    here, _ = corpus(config, tokenizer=rank_0.tokenizer, same_as=rank_0.files)
    assert np.array_equal(here.train_ids, rank_0.train_ids)


# ----------------------------------------------------------------------------------------------
# the cache, progress


def test_adding_a_file_with_the_byte_tokenizer_encodes_only_that_file(config, books, isolated_cache):
    byte = 'tokenizer.kind="byte"'
    first, messages = corpus(config, byte)
    assert any("fitted a byte tokenizer to the training parts of 3 files; encoded them;" in m for m in messages)
    entries = {p.parent: p.stat().st_mtime_ns for p in isolated_cache.glob("*/val.npy")}  # ids: written last
    assert len(entries) == 4  # one per file, and the joined splits

    _, messages = corpus(config, byte)
    assert messages == [f"token cache hit: {next(p for p in entries if (p / 'documents.json').exists())}"]

    (books / "d.txt").write_bytes(DOCUMENTS["a.txt"][:3000])
    second, messages = corpus(config, byte)
    assert any("encoded 1 of them (3 from the token cache)" in m for m in messages), messages
    assert {p: (p / "val.npy").stat().st_mtime_ns for p in entries} == entries  # no entry was rewritten
    assert len(list(isolated_cache.glob("*/val.npy"))) == 6  # d.txt's, and the new joined splits
    n = len(first.train_ids)
    assert np.array_equal(second.train_ids[:n], first.train_ids)  # the old files' ids, then the new one's
    assert second.train_ids[n] == second.tokenizer.end_of_text


def test_adding_a_file_with_bpe_fits_again_and_encodes_every_file(config, books):
    bpe = ['tokenizer.kind="bpe"', "tokenizer.vocab_size=300"]
    corpus(config, *bpe)
    (books / "d.txt").write_bytes(DOCUMENTS["a.txt"][:3000])
    _, messages = corpus(config, *bpe)
    assert any("fitted a bpe tokenizer to the training parts of 4 files; encoded them;" in m for m in messages)


def test_reading_and_encoding_report_progress_file_by_file(config, books):
    from contextlib import contextmanager

    bars = []

    @contextmanager
    def progress(label, total, unit="char"):
        done = []
        bars.append((label, total, unit, done))
        yield done.append

    corpus(config, 'tokenizer.kind="bpe"', "tokenizer.vocab_size=300", progress=progress)
    assert [(label, total, unit, sum(done)) for label, total, unit, done in bars] == [
        ("reading 3 files", 3, "file", 3),
        ("fitting the bpe tokenizer to 3 files", 3, "file", 3),
        ("encoding 3 files", 3, "file", 3),
    ]


# ----------------------------------------------------------------------------------------------
# the config


def test_data_is_a_path_or_a_list_of_paths_resolved_against_the_config(tmp_path, monkeypatch):
    monkeypatch.chdir(Path(os.sep))
    path = tmp_path / "c.toml"
    path.write_text('[train]\ndata = ["books", "extra/one.txt"]\n', encoding="utf-8")
    cfg = load_config(path)
    assert cfg.train.data == [str(tmp_path / "books"), str(tmp_path / "extra" / "one.txt")]
    assert load_config(tmp_path / "c.toml").to_toml().count("data = [") == 1
    path.write_text('[train]\ndata = ["books"]\n', encoding="utf-8")
    assert load_config(path).train.data == str(tmp_path / "books")  # a list of one is that path
    for bad in ("[]", "[1]"):
        path.write_text(f"[train]\ndata = {bad}\n", encoding="utf-8")
        with pytest.raises(MinigptError, match=r"is not a path or a list of paths"):
            load_config(path)


def test_a_damaged_entry_is_made_again_and_an_id_out_of_range_never_reaches_the_model(config, books, isolated_cache):
    loaded, _ = corpus(config)
    first = [np.array(ids) for ids in (loaded.train_ids, loaded.val_ids)]  # off the maps cut short below
    del loaded
    joined = next(p.parent for p in isolated_cache.glob("*/documents.json"))
    one_file = next(p for p in isolated_cache.glob("*/train.npy") if p.parent != joined)
    for damaged in (one_file, joined / "val.npy"):
        damaged.write_bytes(damaged.read_bytes()[:100])  # cut short
    again, messages = corpus(config)
    assert any("encoded 1 of them (2 from the token cache)" in m for m in messages), messages
    assert np.array_equal(again.train_ids, first[0]) and np.array_equal(again.val_ids, first[1])
    del again

    ids = np.load(joined / "train.npy")
    ids[-1] = 60_000  # a cache overwritten with an id no tokenizer of this run writes
    np.save(joined / "train.npy", ids)
    with pytest.raises(MinigptError, match="token id 60000 is not in the vocabulary"):
        corpus(config)


def test_the_resume_command_repeats_every_data(monkeypatch):
    from minigpt.commands.options_make import TrainOptions
    from minigpt.commands.train import _resume_command

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    options = TrainOptions(data=[Path("books"), Path("extra one.txt")], out=Path("runs/x"))
    assert _resume_command(options) == "minigpt train --data books --data 'extra one.txt' --out runs/x --resume"
