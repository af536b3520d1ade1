"""`minigpt eval`: every token of a file scored once with at least context/2 tokens of left
context after the first window; agreement with training's validation figure; refusals."""

from __future__ import annotations

import json
import math
import random

import pytest

from minigpt.inspection.scoring import windows
from minigpt.text.reading import split_text


@pytest.mark.parametrize("n, context", [(2, 8), (8, 8), (9, 8), (50, 8), (51, 7), (1000, 32), (5, 1)])
def test_windows_score_every_target_once_with_half_a_table_of_context(n, context):
    scored = []
    for start, first, end in windows(n, context):
        assert 0 <= start < first <= end <= n and end - 1 - start <= context
        scored += list(range(first, end))
        if start > 0:
            assert first - start >= context // 2  # each scored token sees at least context/2 to its left
    assert scored == list(range(1, n))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import train_tiny_run

    folder = tmp_path_factory.mktemp("eval")
    train_tiny_run(folder, "--steps", "60", "--set", "train.eval_interval=60", "--set", "train.eval_batches=64")
    return folder


def evaluate(cli, run, data, *extra):
    result = cli("eval", "--run", run, "--data", data, "--json", *extra)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def test_on_its_own_validation_text_eval_agrees_with_training(trained, cli):
    run = trained / "run"
    _, val_text = split_text((trained / "tiny.txt").read_text(encoding="utf-8"), 0.1)
    (trained / "val.txt").write_text(val_text, encoding="utf-8")
    got = evaluate(cli, run, trained / "val.txt")
    assert set(got) >= {"tokens", "bytes", "nats_per_token", "bits_per_byte", "perplexity"}
    assert got["tokens"] == len(val_text) - 1 and got["bytes"] == len(val_text.encode("utf-8"))
    assert got["perplexity"] == pytest.approx(math.exp(got["nats_per_token"]))
    val_bpb = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]["val_bpb"]
    # Training's figure averages 512 windows' tokens at every position (mean left context about
    # context/2); eval scores the whole split, each token after the first window with at least
    # context/2 to its left: the same quantity, at or a little below. 3% covers the sampling of
    # windows on a 2,000-character split.
    assert val_bpb * 0.9 <= got["bits_per_byte"] <= val_bpb * 1.03


def test_random_letters_score_far_worse_than_shakespeare(trained, cli):
    rng = random.Random(0)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(3000))
    (trained / "random.txt").write_text(letters, encoding="utf-8")
    (trained / "shakespeare.txt").write_text((trained / "tiny.txt").read_text()[:3000], encoding="utf-8")
    noise = evaluate(cli, trained / "run", trained / "random.txt")["bits_per_byte"]
    verse = evaluate(cli, trained / "run", trained / "shakespeare.txt")["bits_per_byte"]
    assert noise > verse * 1.15, (noise, verse)


def test_per_token_writes_one_line_per_scored_token(trained, cli, tmp_path):
    text = "ROMEO: but soft, what light\n"
    (tmp_path / "line.txt").write_text(text, encoding="utf-8")
    got = evaluate(cli, trained / "run", tmp_path / "line.txt", "--per-token", tmp_path / "tokens.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "tokens.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(lines) == got["tokens"] == len(text) - 1
    assert [(r["position"], r["token"]) for r in lines] == [(i, c) for i, c in enumerate(text) if i > 0]
    assert sum(r["surprisal_bits"] for r in lines) / len(lines) == pytest.approx(got["nats_per_token"] / math.log(2))


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        ("dir", "is a directory"),
        (b"hello \xff world", "is not UTF-8: invalid byte 0xff at offset 6"),
        ("\u00e9\u00e9\u00e9".encode("utf-8"), "the char tokenizer never saw"),
    ],
)
def test_bad_files_are_refused_in_one_line(trained, cli, tmp_path, content, expected):
    path = tmp_path / "input"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    result = cli("eval", "--run", trained / "run", "--data", path)
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.output
    assert expected in result.stderr
