"""Tasks whose answer a learner can check (`train --task`, `eval --task`) and prompt/completion
pairs of your own (`--data FILE.jsonl`): the examples, the loss on answers only, held-out
examples never trained on, exact-match accuracy, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import power_cut_at

import minigpt
from minigpt.config import load_config
from minigpt.inspection.accuracy import accuracy
from minigpt.model.gpt import MiniGPT
from minigpt.runs import identity
from minigpt.text.examples import IGNORE, example_tensors
from minigpt.text.tasks import Task, task_examples, task_of

# A tiny model and a short schedule: a task run trains in about a second.
TINY_TASK = """\
[model]
context = 24
n_layer = 1
n_head = 2
n_embd = 32
ffn_hidden = 64

[train]
task = "{task}"
task_length = {length}
task_held_out = {held}
optimizer = "adamw"
batch_size = 16
steps = {steps}
warmup_steps = 2
eval_interval = 10
eval_batches = 2
checkpoint_interval = 10
log_interval = 5
threads = 1
device = "cpu"
"""


def task_config(folder: Path, task: str = "reverse", length: int = 4, held: int = 50, steps: int = 20) -> Path:
    path = folder / f"{task}.toml"
    path.write_text(TINY_TASK.format(task=task, length=length, held=held, steps=steps), encoding="utf-8")
    return path


def error_line(result) -> str:
    """A refusal: exit 2, one `minigpt: error:` line on stderr, nothing else, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("minigpt: error: ")
    return lines[0]


# ---------------------------------------------------------------- the examples


@pytest.mark.parametrize(
    "name, drawn, prompt, completion",
    [
        ("reverse", "qwer", "qwer=", "rewq."),
        ("sort", "qwer", "qwer=", "eqrw."),
        ("copy", "qwer", "qwer=", "qwer."),
        ("add", "042919", "042+919=", "0961."),
        ("add", "999999", "999+999=", "1998."),
    ],
)
def test_each_task_writes_the_one_right_answer(name, drawn, prompt, completion):
    task = Task(name, 3 if name == "add" else 4)
    assert task.example(drawn) == (prompt, completion)
    assert (len(prompt), len(completion)) == (task.prompt_length, task.completion_length)


def test_held_out_examples_are_seeded_distinct_and_differ_between_seeds():
    task = task_of("reverse", 3)
    a, b = task.held_out(200, seed=1), task.held_out(200, seed=1)
    assert a == b and len(set(a)) == 200
    assert a != task.held_out(200, seed=2)


def test_training_never_draws_a_held_out_example_and_draws_the_same_from_the_same_generator(tmp_path):
    # reverse of 2 letters has 676 inputs: 300 held out, so a random draw would hit them half the time.
    cfg = load_config(task_config(tmp_path, length=2, held=300))
    examples = task_examples(cfg)
    held = {tuple(p) for p, _ in examples.held_out}
    drawn = examples.draw(4000, torch.Generator().manual_seed(0))
    prompts = {tuple(p) for p, _ in drawn}
    assert not prompts & held
    assert len(prompts) == 676 - 300  # and everything else is drawn
    again = examples.draw(4000, torch.Generator().manual_seed(0))
    assert again == drawn


def test_a_batch_predicts_the_completion_tokens_alone():
    pairs = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9])]
    x, y = example_tensors(pairs)
    assert x.tolist() == [[1, 2, 3, 4], [6, 7, 8, 0]]
    assert y.tolist() == [[IGNORE, IGNORE, 4, 5], [7, 8, 9, IGNORE]]


def test_prompt_positions_get_no_gradient_from_the_loss(tmp_path):
    cfg = load_config(task_config(tmp_path))
    examples = task_examples(cfg)
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, examples.tokenizer.vocab_size)
    x, y = example_tensors(examples.draw(8, torch.Generator().manual_seed(0)))
    logits, loss = model(x, y)  # the loss is computed from these very logits
    logits.retain_grad()
    loss.backward()
    grad = logits.grad.abs().sum(-1)  # [B, W]: how much each position's logits move the loss
    prompt = examples.task.prompt_length - 1  # targets before it are prompt tokens
    assert torch.all(grad[:, :prompt] == 0)
    assert torch.all(grad[:, prompt:] > 0)  # every answer position is trained


# ---------------------------------------------------------------- training and accuracy


def test_a_task_run_trains_and_eval_reports_exact_match_and_per_position_accuracy(cli, tmp_path):
    run = tmp_path / "run"
    trained = cli("train", "-c", task_config(tmp_path, steps=30), "--out", run, "--quiet")
    assert trained.exit_code == 0, trained.output
    assert load_config(run / "config.toml").tokenizer.kind == "char"
    result = cli("eval", "--run", run, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["examples"] == 50 and len(report["per_position"]) == 5  # 4 letters and the "."
    assert report["accuracy"] == report["right"] / 50
    assert all(0.0 <= p <= 1.0 for p in report["per_position"])
    text = cli("eval", "--run", run, "--task", "reverse")
    assert text.exit_code == 0 and "exact match:" in text.stdout and "per answer position" in text.stdout


def test_exact_match_is_what_greedy_decoding_writes(tmp_path):
    # A half-trained model, so some answers are right and some wrong.
    out = tmp_path / "run"
    minigpt.train(config=task_config(tmp_path, length=3, steps=60), out=out, progress=False)
    run = minigpt.load(out)
    examples = task_examples(run.cfg, run.tokenizer)
    pairs = examples.held_out[:40]
    measured = accuracy(run.model, pairs, writable=run.tokenizer.vocab_size)
    decoded = [
        run.sample(run.tokenizer.decode(p), greedy=True, max_new_tokens=len(c)) == run.tokenizer.decode(p + c)
        for p, c in pairs
    ]
    assert measured.right == sum(decoded)
    assert 0 < measured.right < 40, measured  # the check has both kinds to tell apart


def test_a_task_run_resumes_bitwise(cli, tmp_path):
    config = task_config(tmp_path, steps=20)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert cli("train", "-c", config, "--out", straight, "--quiet").exit_code == 0
    with power_cut_at(20):
        assert isinstance(cli("train", "-c", config, "--out", resumed, "--quiet").exception, RuntimeError)
    assert torch.load(resumed / "checkpoint.pt", weights_only=True)["step"] == 10
    assert cli("train", "-c", config, "--out", resumed, "--quiet", "--resume").exit_code == 0
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_trace_of_a_task_run_shows_the_example_format(cli, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "-c", task_config(tmp_path, steps=5), "--out", run, "--quiet").exit_code == 0
    first = task_examples(load_config(run / "config.toml")).held_out[0]
    result = cli("trace", "--run", run, "-p", "abcd=")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("trained on task reverse (4 letters), e.g. '")
    assert len(first[0]) == 5


def test_runs_on_text_keep_their_identity_without_the_task_keys():
    cfg = load_config()
    assert not {"task", "task_length", "task_held_out"} & set(identity.training_identity(cfg)["train"])


# ---------------------------------------------------------------- pairs of your own


def write_pairs(path: Path, n: int = 40) -> Path:
    lines = [json.dumps({"prompt": f"{i}+1=", "completion": f"{i + 1};"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_jsonl_of_pairs_trains_on_completions_and_holds_out_its_last_lines(cli, tmp_path):
    data = write_pairs(tmp_path / "pairs.jsonl")
    run = tmp_path / "run"
    result = cli(
        "train", "--data", data, "--out", run, "--quiet", "--steps", "4",
        "--set", "tokenizer.kind=char", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
        "--set", "model.ffn_hidden=16", "--set", "train.batch_size=4", "--set", "train.eval_interval=2",
        "--set", "train.warmup_steps=1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    loaded = minigpt.load(run)
    examples = loaded._examples()
    assert [loaded.tokenizer.decode(p) for p, _ in examples.held_out] == ["36+1=", "37+1=", "38+1=", "39+1="]
    drawn = examples.draw(500, torch.Generator().manual_seed(0))
    assert not {tuple(p) for p, _ in drawn} & {tuple(p) for p, _ in examples.held_out}
    _, y = example_tensors(drawn[:3])
    for (prompt, completion), targets in zip(drawn[:3], y.tolist()):
        assert targets[: len(prompt) - 1] == [IGNORE] * (len(prompt) - 1)
        assert targets[len(prompt) - 1 : len(prompt) - 1 + len(completion)] == completion
    held = json.loads(cli("eval", "--run", run, "--json").stdout)
    assert held["examples"] == 4
    every = json.loads(cli("eval", "--run", run, "--data", data, "--json").stdout)
    assert every["examples"] == 40


@pytest.mark.parametrize(
    "line, expected",
    [
        ("not json", "line 3 is not JSON"),
        ('{"prompt": "a"}', 'line 3 is not an object with exactly the keys "prompt" and "completion"'),
        ('{"prompt": "a", "completion": ""}', "line 3: prompt and completion must both be non-empty strings"),
        ('{"prompt": "a", "completion": 3}', "line 3: prompt and completion must both be non-empty strings"),
        (json.dumps({"prompt": "a" * 40, "completion": "b"}), "line 3 is 41 tokens"),
    ],
)
def test_a_bad_line_of_pairs_is_refused_naming_its_number(cli, tmp_path, line, expected):
    data = tmp_path / "pairs.jsonl"
    good = json.dumps({"prompt": "ab", "completion": "cd"})
    data.write_text(f"{good}\n{good}\n{line}\n{good}\n", encoding="utf-8")
    run = tmp_path / "run"
    message = error_line(cli("train", "--data", data, "--out", run, "--set", "tokenizer.kind=char"))
    assert expected in message and str(data) in message
    assert not run.exists()


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "extra, expected",
    [
        (("--set", "tokenizer.kind=bpe"), 'task = "reverse" with [tokenizer] kind = "bpe" is refused'),
        (("--data", "x.txt"), "are both given"),
        (("--task-length", "12"), "reads 25 tokens per example"),
        (("--task-length", "1"), "has only 26 distinct inputs"),
    ],
)
def test_impossible_task_runs_are_refused_in_one_line(cli, tmp_path, extra, expected):
    run = tmp_path / "run"
    message = error_line(cli("train", "-c", task_config(tmp_path), "--out", run, *extra))
    assert expected in message
    assert not run.exists()


def test_eval_of_another_task_or_of_a_text_run_is_refused(cli, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "-c", task_config(tmp_path, steps=2), "--out", run, "--quiet").exit_code == 0
    line = error_line(cli("eval", "--run", run, "--task", "sort"))
    assert "is trained on task reverse, so it has no held-out examples of sort" in line


def test_a_constant_start_begins_every_prompt_and_is_read_at_every_length(cli, tmp_path):
    task = Task("reverse", 3, ">>")
    assert task.example("abc") == (">>abc=", "cba.")
    assert task.prompt_length == 6 and task.window == 6 + 4 - 1 and ">" in task.characters
    assert Task("reverse", 3).example("abc") == ("abc=", "cba.")  # none: the format every run had
    run = tmp_path / "run"
    trained = cli(
        "train", "-c", task_config(tmp_path, steps=10), "--out", run, "--quiet", "--set", 'train.task_start=">>"'
    )
    assert trained.exit_code == 0, trained.output
    loaded = minigpt.load(run)
    assert loaded.first_held_out_prompt.startswith(">>")
    examples = task_examples(loaded.cfg, loaded.tokenizer)
    assert all(loaded.tokenizer.decode(prompt).startswith(">>") for prompt, _ in examples.held_out)
    plain = task_examples(load_config(task_config(tmp_path)))
    assert examples.sha256 != plain.sha256  # the data a run read is named with its start
    by_length = cli("eval", "--run", run, "--task-length", "2-3", "--json")
    assert by_length.exit_code == 0, by_length.output
    assert [row["length"] for row in json.loads(by_length.stdout)["lengths"]] == [2, 3]
