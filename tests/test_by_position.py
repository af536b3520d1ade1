"""`minigpt eval --by-position`: the mean loss at each position of a text's non-overlapping windows,
each read from position 0, against a hand computation from the model's logits; the refusals past
the trained length (and what crosses it on purpose); the JSON and the text the command prints."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn.functional as F
from conftest import CORPUS, need, random_run, train_tiny_run

from minigpt.commands.eval_positions import bins
from minigpt.config import ModelConfig
from minigpt.errors import MinigptError
from minigpt.inspection.by_position import window_starts
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

CONTEXT = 8
JSON_KEYS = {"run", "data", "length", "trained_length", "windows", "extrapolate", "rope_scaling", "positions"}
JSON_KEYS |= {"mean_inside", "mean_past"}


def tiny_run(positions: str, seed: int = 0):
    """A seeded random float64 model (far from uniform) with a char tokenizer of CORPUS's characters."""
    tokenizer = TextTokenizer(train_tokenizer("char", 300, CORPUS))
    cfg = ModelConfig(
        n_layer=1, n_head=2, n_embd=8, ffn_hidden=16, context=CONTEXT, dtype="float64", positions=positions
    )
    return random_run(cfg, tokenizer.vocab_size, tokenizer, seed=seed)


@pytest.fixture
def text(tmp_path):
    """101 characters of CORPUS's alphabet, drawn at random."""
    rng = random.Random(1)
    path = tmp_path / "text.txt"
    path.write_text("".join(rng.choice(sorted(set(CORPUS))) for _ in range(101)), encoding="utf-8")
    return path


def by_hand(run, ids: list[int], length: int, starts: list[int]) -> list[float]:
    """Each window's cross-entropy at each position from its own forward pass, averaged over windows."""
    total = torch.zeros(length, dtype=torch.float64)
    with torch.no_grad():
        for start in starts:
            window = torch.tensor(ids[start : start + length + 1])
            logits, _ = run.model(window[None, :-1])
            total += F.cross_entropy(logits[0, :, : run.tokenizer.vocab_size], window[1:], reduction="none")
    return (total / len(starts)).tolist()


@pytest.mark.parametrize("n_tokens, length", [(101, 8), (17, 8), (16, 8), (101, 33), (9, 1)])
def test_windows_do_not_overlap_and_each_has_the_token_after_it(n_tokens, length):
    starts = window_starts(n_tokens, length)
    assert len(starts) == (n_tokens - 1) // length
    assert all(b - a == length for a, b in zip(starts, starts[1:])) and starts[0] == 0
    assert starts[-1] + length + 1 <= n_tokens  # the last window's last target is in the text


def test_a_cap_on_windows_spreads_them_over_the_text():
    assert window_starts(101, 8, 3) == [0, 32, 64]  # of 12 windows: 0, 4 and 8
    assert window_starts(101, 8, 50) == window_starts(101, 8)  # more than the text holds: all of them


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_each_position_is_the_cross_entropy_of_its_windows_from_the_logits(positions, text):
    run = tiny_run(positions)
    ids = run.tokenizer.encode(text.read_text(encoding="utf-8"))
    result = run.loss_by_position(text)
    assert (result.length, result.trained_length, result.windows) == (CONTEXT, CONTEXT, 12)
    expected = by_hand(run, ids, CONTEXT, [8 * k for k in range(12)])
    assert result.nats == pytest.approx(expected, rel=1e-12)
    assert result.bits == pytest.approx([n / math.log(2) for n in expected], rel=1e-12)
    assert result.mean_inside == pytest.approx(sum(expected) / CONTEXT, rel=1e-12) and result.mean_past is None
    capped = run.loss_by_position(text, length=5, windows=4)  # 20 windows of 5: 0, 5, 10 and 15 of them
    assert capped.windows == 4
    assert capped.nats == pytest.approx(by_hand(run, ids, 5, [0, 25, 50, 75]), rel=1e-12)


def test_past_the_trained_length_positions_are_marked_and_averaged_apart(text):
    run = tiny_run("rope").read_with(extrapolate=True)
    ids = run.tokenizer.encode(text.read_text(encoding="utf-8"))
    result = run.loss_by_position(text, length=20)
    expected = by_hand(run, ids, 20, [0, 20, 40, 60, 80])
    assert result.nats == pytest.approx(expected, rel=1e-12)
    got = result.to_json()
    assert [p["past_trained_length"] for p in got["positions"]] == [False] * 8 + [True] * 12
    assert [p["position"] for p in got["positions"]] == list(range(20))
    assert got["mean_inside"] == pytest.approx(sum(expected[:8]) / 8, rel=1e-12)
    assert got["mean_past"] == pytest.approx(sum(expected[8:]) / 12, rel=1e-12)
    assert (got["trained_length"], got["extrapolate"], got["rope_scaling"]) == (8, True, None)


def test_a_learned_table_refuses_windows_past_its_rows(text):
    with pytest.raises(MinigptError, match=r"scoring window \(length\) has 9 tokens but the position table has 8"):
        tiny_run("learned").loss_by_position(text, length=9)


def test_rope_past_the_trained_length_is_refused_naming_extrapolate(text):
    with pytest.raises(MinigptError) as refusal:
        tiny_run("rope").loss_by_position(text, length=9)
    assert str(refusal.value).startswith("the scoring window (length) has 9 tokens but the model was trained on")
    assert "pass extrapolate=True to read past it" in str(refusal.value)
    assert "--extrapolate" in refusal.value.for_command_line and "(--length)" in refusal.value.for_command_line


def test_rope_scaling_linear_2_accepts_twice_the_context_and_no_more(text):
    run = tiny_run("rope").read_with(rope_scaling="linear:2")
    result = run.loss_by_position(text, length=16)
    assert (result.windows, result.rope_scaling, result.extrapolate) == (6, "linear:2", False)
    with pytest.raises(MinigptError, match=r"17 tokens .*rope scaling linear:2: 16 tokens"):
        run.loss_by_position(text, length=17)


@pytest.mark.parametrize("positions", ["alibi", "none"])
def test_alibi_and_none_read_past_the_trained_length_with_extrapolate(positions, text):
    with pytest.raises(MinigptError, match="extrapolate"):
        tiny_run(positions).loss_by_position(text, length=12)
    result = tiny_run(positions).read_with(extrapolate=True).loss_by_position(text, length=12)
    assert result.windows == 8 and all(math.isfinite(n) and n > 0 for n in result.nats)
    assert result.mean_past is not None


def test_a_text_shorter_than_one_window_and_bad_numbers_are_refused(text, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("ROMEO: hi", encoding="utf-8")  # 9 tokens: one window of 8, none of 9
    run = tiny_run("none").read_with(extrapolate=True)
    assert run.loss_by_position(short).windows == 1
    with pytest.raises(MinigptError, match=r"has 9 token\(s\), and one window of length 9 needs 10 tokens"):
        run.loss_by_position(short, length=9)
    for length, windows in ((0, None), (8, 0), (-3, None)):
        with pytest.raises(MinigptError, match="is not a whole number of at least 1"):
            run.loss_by_position(text, length=length, windows=windows)


@pytest.mark.parametrize(
    "length, trained, expected",
    [
        (8, 8, [(p, p + 1) for p in range(8)]),
        (6, 8, [(p, p + 1) for p in range(6)]),
        (128, 16, [(a, a + 4) for a in range(0, 128, 4)]),
        (100, 10, [(0, 4), (4, 8), (8, 10)] + [(a, min(a + 4, 100)) for a in range(10, 100, 4)]),
    ],
)
def test_rows_show_every_position_or_groups_that_never_cross_the_trained_length(length, trained, expected):
    assert [(span.start, span.stop) for span in bins(length, trained)] == expected


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("by-position")
    run = train_tiny_run(folder, "--steps", "5", "--set", 'model.positions="rope"', "--set", 'model.dtype="float64"')
    (folder / "val.txt").write_text((folder / "tiny.txt").read_text(encoding="utf-8")[-1_000:], encoding="utf-8")
    return run, folder / "val.txt"


def test_the_command_prints_the_json_contract_and_marks_the_past(rope_run, cli, tmp_path):
    run, val = rope_run
    result = cli("eval", "--run", run, "--data", val, "--by-position", "--length", 24, "--extrapolate", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert set(got) >= JSON_KEYS
    assert (got["run"], got["data"], got["length"], got["trained_length"]) == (str(run), str(val), 24, 8)
    assert (got["windows"], got["extrapolate"], got["rope_scaling"]) == (999 // 24, True, None)
    assert [p["past_trained_length"] for p in got["positions"]] == [p >= 8 for p in range(24)]
    assert set(got["positions"][0]) == {"position", "nats", "bits", "past_trained_length"}
    assert "read past the trained length (--extrapolate): windows of 24 tokens" in result.stderr


def test_the_command_prints_a_row_per_position_and_the_trained_length_line(rope_run, cli, tmp_path):
    run, val = rope_run
    result = cli("eval", "--run", run, "--data", val, "--by-position", "--length", 12, "--extrapolate")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "mean loss at each position of 83 windows of 12 tokens" in lines[0]
    assert 'trained at 8 tokens ([model] context, positions = "rope"), read with --extrapolate' == lines[1]
    rows = [line.split() for line in lines[3:-2] if "trained length" not in line]
    assert [int(row[0]) for row in rows] == list(range(12))
    assert [row[-1] == "past" for row in rows] == [p >= 8 for p in range(12)]
    assert lines[3 + 8].strip() == "--- trained length 8: never trained from here on ---"
    assert lines[-2].startswith("mean inside the trained length (positions 0-7): ")
    assert lines[-1].startswith("mean past it (positions 8-11): ")


def test_the_command_refuses_past_the_trained_length_naming_length_and_extrapolate(rope_run, cli):
    run, val = rope_run
    result = cli("eval", "--run", run, "--data", val, "--by-position", "--length", 24)
    assert result.exit_code == 2
    assert result.stderr.startswith("minigpt: error: the scoring window (--length) has 24 tokens but the model was")
    assert "pass --extrapolate to read past it on purpose" in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--per-token", "x.jsonl"], "--per-token scores each token of the text once"),
        (["--task", "copy"], "--by-position scores the windows of a UTF-8 text"),
        (["--task-length", "4"], "--by-position scores the windows of a UTF-8 text"),
    ],
)
def test_by_position_with_per_token_or_a_task_is_refused_in_one_line(rope_run, cli, extra, says):
    run, val = rope_run
    result = cli("eval", "--run", run, "--data", val, "--by-position", *extra)
    assert result.exit_code == 2 and result.stderr.startswith(f"minigpt: error: {says}"), result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_its_options_without_by_position_are_refused(rope_run, cli):
    run, val = rope_run
    result = cli("eval", "--run", run, "--data", val, "--length", 4)
    assert result.exit_code == 2
    assert result.stderr.startswith("minigpt: error: --length goes with --by-position"), result.stderr


def test_png_draws_the_curve(rope_run, cli, tmp_path):
    need("matplotlib")
    run, val = rope_run
    out = tmp_path / "curve.png"
    result = cli("eval", "--run", run, "--data", val, "--by-position", "--rope-scaling", "yarn:2", "--png", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_task_run_is_refused_even_with_a_text(rope_run, cli, tmp_path):
    _, val = rope_run
    tiny = [f"--set=model.{key}" for key in ("n_layer=1", "n_embd=16", "n_head=2", "ffn_hidden=16")]
    trained = cli("train", "--task", "copy", "--steps", 2, "--out", tmp_path / "copy", "--quiet", *tiny)
    assert trained.exit_code == 0, trained.output
    result = cli("eval", "--run", tmp_path / "copy", "--data", val, "--by-position")
    assert result.exit_code == 2
    assert result.stderr.startswith("minigpt: error: --by-position scores the windows of a UTF-8 text with a run ")
