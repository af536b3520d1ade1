"""Tasks at mixed lengths (`[train] task_lengths = "A-B"`) and exact match at lengths a run never
trained on (`minigpt eval --task-length N|A-B`): the batches, the held-out examples per length,
the per-length accuracy, the refusal past the trained length, and old runs' identity."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import power_cut_at

import minigpt
from minigpt.config import load_config
from minigpt.runs import identity
from minigpt.text.examples import IGNORE, example_tensors
from minigpt.text.tasks import Task, task_examples

# Reverse at 1-3 letters: the longest example reads 3 + 1 + 3 + 1 - 1 = 7 tokens, the context.
MIXED = """\
[model]
context = 7
n_layer = 1
n_head = 2
n_embd = 32
ffn_hidden = 64
positions = "{positions}"
dtype = "float64"

[train]
task = "reverse"
task_lengths = "1-3"
task_held_out = {held}
optimizer = "adamw"
batch_size = 32
steps = {steps}
warmup_steps = 2
eval_interval = 100
eval_batches = 2
checkpoint_interval = 100
threads = 1
device = "cpu"
"""


def mixed_config(folder: Path, positions: str = "none", held: int = 20, steps: int = 2) -> Path:
    path = folder / f"mixed-{positions}.toml"
    path.write_text(MIXED.format(positions=positions, held=held, steps=steps), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def half_trained(tmp_path_factory) -> Path:
    """A NoPE run on reverse at 1-3 letters, trained far enough that some answers are right."""
    folder = tmp_path_factory.mktemp("lengths")
    out = folder / "run"
    minigpt.train(config=mixed_config(folder, steps=120), out=out, progress=False)
    return out


def error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), lines
    return lines[0]


# ---------------------------------------------------------------- the examples


def test_a_mixed_batch_holds_every_length_and_its_loss_is_on_the_answers_alone(tmp_path):
    examples = task_examples(load_config(mixed_config(tmp_path)))
    pairs = examples.draw(64, torch.Generator().manual_seed(0))
    assert {len(p) for p, _ in pairs} == {2, 3, 4}  # 1, 2 and 3 letters and the "="
    x, y = example_tensors(pairs)
    assert x.shape == (64, 7)
    for (prompt, completion), inputs, targets in zip(pairs, x.tolist(), y.tolist()):
        example = prompt + completion
        assert inputs[: len(example) - 1] == example[:-1]
        # Prompt targets and padding are ignored; the answer's tokens are the targets, in order.
        assert targets == [IGNORE] * (len(prompt) - 1) + completion + [IGNORE] * (8 - len(example))
    decode = examples.tokenizer.decode
    assert all(decode(c) == decode(p)[:-1][::-1] + "." for p, c in pairs)


def test_held_out_examples_are_drawn_per_length_and_training_never_draws_one(tmp_path):
    cfg = load_config(mixed_config(tmp_path, held=20))
    examples = task_examples(cfg)
    decode = examples.tokenizer.decode
    held = [decode(p)[:-1] for p, _ in examples.held_out]
    # 20 of each length, but at most half of 1 letter's 26 inputs; the longest listed first.
    assert [len(h) for h in held[:3]] == [3, 2, 1]
    assert sorted(len(h) for h in held) == [1] * 13 + [2] * 20 + [3] * 20
    for length in (1, 2, 3):  # the same examples as a run at that one length holds out
        task = Task("reverse", length)
        assert [h for h in held if len(h) == length] == task.held_out(task.held_out_count(20), cfg.train.seed)
    drawn = {decode(p)[:-1] for p, _ in examples.draw(3000, torch.Generator().manual_seed(1))}
    assert not drawn & set(held)
    assert {d for d in drawn if len(d) == 1} == set("abcdefghijklmnopqrstuvwxyz") - set(held)


def test_mixed_draws_repeat_from_the_same_generator(tmp_path):
    examples = task_examples(load_config(mixed_config(tmp_path)))
    a = examples.draw(50, torch.Generator().manual_seed(3))
    assert a == examples.draw(50, torch.Generator().manual_seed(3))
    assert a != examples.draw(50, torch.Generator().manual_seed(4))


def test_a_mixed_length_run_resumes_bitwise(cli, tmp_path):
    config = mixed_config(tmp_path, steps=20)
    extra = ("--set", "train.checkpoint_interval=10", "--quiet")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("train", "-c", config, "--out", straight, *extra).exit_code == 0
    with power_cut_at(20):
        assert isinstance(cli("train", "-c", config, "--out", resumed, *extra).exception, RuntimeError)
    assert cli("train", "-c", config, "--out", resumed, *extra, "--resume").exit_code == 0
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- accuracy per length


def test_accuracy_at_each_length_equals_a_count_of_greedy_answers(half_trained):
    run = minigpt.load(half_trained, extrapolate=True)
    table = run.accuracy_by_length("1-4")
    assert [(r.length, r.trained) for r in table.rows] == [(1, True), (2, True), (3, True), (4, False)]
    for row in table.rows:  # counted here from the task's seeded inputs, answered by greedy sampling
        task = Task("reverse", row.length)
        inputs = task.held_out(task.held_out_count(20), run.cfg.train.seed)
        answers = [run.sample(f"{d}=", greedy=True, max_new_tokens=len(d) + 1) for d in inputs]
        right = sum(answer == f"{d}={d[::-1]}." for d, answer in zip(inputs, answers))
        assert (row.examples, row.right) == (len(inputs), right)
    assert 0 < sum(r.right for r in table.rows) < sum(r.examples for r in table.rows)  # both kinds to tell apart


def test_eval_prints_a_table_per_length_and_its_json(cli, half_trained):
    text = cli("eval", "--run", half_trained, "--task-length", "1-4", "--extrapolate")
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0] == (
        "task reverse, trained on lengths 1-3; context 7 tokens; read past it on purpose (--extrapolate)"
    )
    assert lines[1].split() == ["length", "exact", "match", "examples", "trained"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("1", "13", "yes"),
        ("2", "20", "yes"),
        ("3", "20", "yes"),
        ("4", "20", "no"),
    ]
    report = json.loads(cli("eval", "--run", half_trained, "--task-length", "1-4", "--extrapolate", "--json").stdout)
    assert report["trained_lengths"] == [1, 3] and report["context"] == 7 and report["window"] is None
    assert [(r["length"], r["trained"]) for r in report["lengths"]] == [(1, True), (2, True), (3, True), (4, False)]
    for row, line in zip(report["lengths"], lines[2:]):
        assert row["accuracy"] == row["right"] / row["examples"]
        assert line.split()[1] == f"{100 * row['accuracy']:.2f}%"


def test_one_length_reports_its_answers_and_says_it_was_not_trained(cli, half_trained):
    result = cli("eval", "--run", half_trained, "--task-length", "4", "--extrapolate", "--json")
    report = json.loads(result.stdout)
    assert (report["length"], report["trained"], report["examples"]) == (4, False, 20)
    assert len(report["per_position"]) == 5  # 4 letters and the "."
    assert report["what"].endswith("20 held-out examples, a length it never trained on (1-3)")
    plain = cli("eval", "--run", half_trained)  # the run's own held-out examples say its lengths
    assert plain.stdout.splitlines()[0].startswith("task reverse (1-3 letters), e.g. '")


# ---------------------------------------------------------------- refusals


def test_a_length_past_the_trained_context_is_refused_naming_extrapolate(cli, half_trained):
    line = error_line(cli("eval", "--run", half_trained, "--task-length", "2-5"))
    assert "task reverse at length 5 (prompt and answer, less the last token) has 11 tokens" in line
    assert ": lengths up to 3, or pass --extrapolate" in line


def test_a_learned_table_refuses_past_its_rows_and_refuses_extrapolate(cli, tmp_path):
    run = tmp_path / "learned"
    minigpt.train(config=mixed_config(tmp_path, positions="learned"), out=run, progress=False)
    line = error_line(cli("eval", "--run", run, "--task-length", "4"))
    assert "has 9 tokens but the position table has 7 rows" in line
    assert "--extrapolate is refused for this model" in error_line(
        cli("eval", "--run", run, "--task-length", "4", "--extrapolate")
    )
    inside = json.loads(cli("eval", "--run", run, "--task-length", "1-3", "--json").stdout)
    assert [r["trained"] for r in inside["lengths"]] == [True, True, True]


@pytest.mark.parametrize(
    "args, expected",
    [
        (("--task-length", "x-4"), "--task-length x-4 is not a length or a range of lengths"),
        (("--task-length", "4-2"), "--task-length 4-2 is not a length or a range of lengths"),
        (("--task-length", "3", "--data", "a.txt"), "--task-length reads a task run's task at a length"),
    ],
)
def test_a_bad_task_length_is_refused_in_one_line(cli, half_trained, args, expected):
    assert expected in error_line(cli("eval", "--run", half_trained, *args))


@pytest.mark.parametrize(
    "setting, expected",
    [
        ('train.task_lengths="8-2"', 'task_lengths = "8-2" is not a range of lengths; write "A-B"'),
        ('train.task_lengths="1-8"', 'task_length = 4 and task_lengths = "1-8" are both given'),
    ],
)
def test_a_bad_task_lengths_is_refused_in_one_line(cli, tmp_path, setting, expected):
    run = tmp_path / "run"
    line = error_line(cli("train", "--task", "reverse", "--task-length", "4", "--set", setting, "--out", run))
    assert expected in line
    assert not run.exists()


def test_a_range_longer_than_the_context_is_refused_naming_task_lengths(cli, tmp_path):
    line = error_line(cli("train", "-c", mixed_config(tmp_path), "--set", 'train.task_lengths="1-4"'))
    assert 'at task_lengths = "1-4" reads 9 tokens per example' in line
    assert "or a shorter range of task_lengths" in line


# ---------------------------------------------------------------- identity


def test_a_task_run_at_one_length_keeps_its_identity(tmp_path):
    # config.toml as a run written before task_lengths existed: no such key.
    old = tmp_path / "old.toml"
    old.write_text('[train]\ntask = "reverse"\ntask_length = 4\ntask_held_out = 50\n', encoding="utf-8")
    before = identity.training_identity(load_config(old))
    assert "task_lengths" not in before["train"]
    assert before == identity.training_identity(load_config(old, ['train.task_lengths=""']))
    # The examples' own sha256 (in every checkpoint) is computed as it always was.
    examples = task_examples(load_config(old))
    expected = json.dumps({"task": "reverse", "length": 4, "held_out": 50, "seed": 1337})
    assert examples.sha256 == hashlib.sha256(expected.encode()).hexdigest()
    mixed = identity.training_identity(load_config(old, ['train.task_lengths="1-4"', "train.task_length=0"]))
    assert mixed["train"]["task_lengths"] == "1-4"
    assert identity.config_hash(mixed) != identity.config_hash(before)
