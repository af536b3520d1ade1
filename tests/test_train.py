"""`minigpt train`: the learning-rate schedule, weight-decay groups, the run folder it writes, exact
resume after Ctrl-C, refused resumes, and every bad input ending in one error line with no run
folder left behind."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import interrupt_once_training, minigpt_command, power_cut_at, with_failpoints

from minigpt.config import TrainConfig, load_config
from minigpt.model.gpt import MiniGPT
from minigpt.runs import identity
from minigpt.training.optimizers import make_optimizer
from minigpt.training.trainer import learning_rate

RUN_FILES = {"config.toml", "tokenizer.json", "checkpoint.pt", "metrics.jsonl", "best.pt"}


def error_line(result) -> str:
    """A refusal: exit 2, no traceback, nothing on stdout, and exactly one `minigpt: error:` line on
    stderr (no progress line before it). Returns that line."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not an unhandled error
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines  # the refusal and nothing else
    assert lines[0].startswith("minigpt: error: ")
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def train_tiny(cli, config, out, *args):
    result = cli("train", "-c", config, "--out", out, *args)
    assert result.exit_code == 0, result.output
    return result


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


# ----------------------------------------------------------------------------------------------
# learning-rate schedule

SCHEDULE = TrainConfig(steps=100, warmup_steps=10, learning_rate=1e-3, min_lr=1e-4)


def test_warmup_is_linear_from_lr_over_warmup_to_lr():
    rates = [learning_rate(s, SCHEDULE) for s in range(SCHEDULE.warmup_steps)]
    assert rates[0] == pytest.approx(1e-3 / 10)
    assert rates == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    steps = [b - a for a, b in zip(rates, rates[1:])]
    assert steps == pytest.approx([1e-4] * 9)


def test_peak_is_the_learning_rate_at_the_end_of_warmup():
    rates = [learning_rate(s, SCHEDULE) for s in range(SCHEDULE.steps)]
    assert max(rates) == pytest.approx(1e-3)
    assert rates[SCHEDULE.warmup_steps - 1] == pytest.approx(1e-3)
    assert rates[SCHEDULE.warmup_steps] == pytest.approx(1e-3)
    assert all(r < 1e-3 for r in rates[: SCHEDULE.warmup_steps - 1])


def test_rate_decreases_monotonically_after_warmup():
    rates = [learning_rate(s, SCHEDULE) for s in range(SCHEDULE.warmup_steps, SCHEDULE.steps)]
    assert all(b < a for a, b in zip(rates, rates[1:]))
    assert all(r >= SCHEDULE.min_lr for r in rates)
    # Cosine, not linear: flat near the peak and the floor, steepest in the middle.
    drops = [a - b for a, b in zip(rates, rates[1:])]
    middle = len(drops) // 2
    assert drops[0] < drops[middle] / 10 and drops[-1] < drops[middle] / 10
    assert max(drops) == pytest.approx(drops[middle], rel=0.01)
    halfway = rates[len(rates) // 2]
    assert halfway == pytest.approx((1e-3 + 1e-4) / 2, rel=0.05)


def test_cosine_reaches_min_lr_at_steps_and_stays_there():
    assert learning_rate(SCHEDULE.steps, SCHEDULE) == pytest.approx(SCHEDULE.min_lr)
    assert learning_rate(SCHEDULE.steps + 50, SCHEDULE) == pytest.approx(SCHEDULE.min_lr)


def test_cosine_reaches_min_lr_at_the_last_step():
    # The training loop runs step = 0 .. steps-1 with learning_rate(step): the last update is steps-1.
    assert learning_rate(SCHEDULE.steps - 1, SCHEDULE) == pytest.approx(SCHEDULE.min_lr, rel=1e-9)


def test_no_warmup_starts_at_the_peak():
    cfg = dataclasses.replace(SCHEDULE, warmup_steps=0)
    assert learning_rate(0, cfg) == pytest.approx(1e-3)


# ----------------------------------------------------------------------------------------------
# weight decay on matrices only


@pytest.mark.parametrize("tie", [False, True])
def test_weight_decay_applies_to_matrices_only(tiny_config, tie):
    cfg = load_config(tiny_config, [f"model.tie_embeddings={'true' if tie else 'false'}"])
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, 20)
    optimizer = make_optimizer(model, cfg.train)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == cfg.train.weight_decay == 0.1
    assert no_decay["weight_decay"] == 0.0

    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decayed.isdisjoint(kept)
    assert decayed | kept == set(names.values())  # every parameter exactly once
    assert {"token_table.weight", "position_table.weight"} <= decayed
    assert ("head.weight" in decayed) != tie  # a tied head is the token table, listed once
    assert all(model.get_parameter(n).dim() >= 2 for n in decayed)
    assert all(model.get_parameter(n).dim() == 1 for n in kept)
    assert any(n.endswith("bias") for n in kept) and any("norm" in n for n in kept)

    # With zero gradients AdamW's only move is the decay: matrices shrink, vectors stay put.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    shrink = 1 - cfg.train.learning_rate * cfg.train.weight_decay
    for n, p in model.named_parameters():
        expected = before[n] * shrink if n in decayed else before[n]
        assert torch.allclose(p, expected, rtol=0, atol=1e-9), n
        if n in kept:
            assert torch.equal(p, before[n]), n


# ----------------------------------------------------------------------------------------------
# the run folder


def test_run_folder_holds_config_tokenizer_checkpoint_and_metrics(cli, tiny_config, tiny_text, tmp_path):
    run = tmp_path / "run"
    result = train_tiny(cli, tiny_config, run)
    assert set(os.listdir(run)) == RUN_FILES  # no temporary files left over
    assert "done: 20 steps" in result.stderr and "bits/byte" in result.stderr
    assert f"sample with: minigpt sample --run {run}" in result.stderr

    used = load_config(tiny_config, [], {"train": {"out": str(run)}})
    written = load_config(run / "config.toml")
    for section in ("model", "tokenizer", "train", "sample"):
        assert getattr(written, section) == getattr(used, section), section
    assert written.train.data == str(tiny_text)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(run / "tokenizer.json"))
    text = tiny_text.read_text(encoding="utf-8")
    assert tokenizer.get_vocab_size() == len(set(text[:18_000]))

    payload = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert payload["step"] == 20
    assert payload["vocab_size"] == tokenizer.get_vocab_size()
    assert payload["model_config"] == dataclasses.asdict(used.model)
    assert set(payload["model"]) == set(MiniGPT(used.model, payload["vocab_size"]).state_dict())
    assert payload["optimizer"]["state"] and len(payload["optimizer"]["param_groups"]) == 2
    assert {"torch", "batches", "python", "numpy"} <= set(payload["rng"])
    assert payload["hashes"] == {
        "config": identity.config_hash(identity.training_identity(used)),
        "tokenizer": hashlib.sha256((run / "tokenizer.json").read_bytes()).hexdigest(),
        "corpus": hashlib.sha256(tiny_text.read_bytes()).hexdigest(),
    }

    records = metrics(run)
    train_records = [r for r in records if not r.get("eval")]
    evals = [r for r in records if r.get("eval")]
    assert [r["step"] for r in train_records] == [5, 10, 15, 20]
    assert [r["step"] for r in evals] == [10, 20]
    for r in train_records:
        assert math.isfinite(r["loss"]) and r["lr"] == pytest.approx(learning_rate(r["step"] - 1, used.train))
    for r in evals:
        assert 0 < r["val_loss"] < math.log(payload["vocab_size"]) + 1
        # ASCII text, char tokens: one token per byte, so bits/byte = nats/token / ln 2.
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2))


def test_force_replaces_an_existing_run(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet")
    first = torch.load(run / "checkpoint.pt", weights_only=True)
    train_tiny(cli, tiny_config, run, "--quiet", "--force", "--set", "train.seed=7")
    assert set(os.listdir(run)) == RUN_FILES
    second = torch.load(run / "checkpoint.pt", weights_only=True)
    assert not torch.equal(first["model"]["token_table.weight"], second["model"]["token_table.weight"])


def test_resuming_a_finished_run_does_nothing(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet")
    before = snapshot(run)
    result = train_tiny(cli, tiny_config, run, "--resume")
    assert "already finished 20 steps; nothing to do" in result.stderr
    assert snapshot(run) == before


# ----------------------------------------------------------------------------------------------
# exact resume after Ctrl-C


@pytest.mark.slow
def test_interrupted_then_resumed_run_ends_bitwise_identical(cli, tiny_config, tmp_path):
    steps = 120
    settings = [
        "--set",
        f"train.steps={steps}",
        "--set",
        "train.checkpoint_interval=40",
        "--set",
        "train.eval_interval=20",
    ]
    straight = tmp_path / "straight"
    train_tiny(cli, tiny_config, straight, "--quiet", *settings)

    run = tmp_path / "interrupted"
    # The real CLI in a real process, paused in step 45 (a failpoint) until the test's SIGINT: the
    # step ends and the run stops there, wherever the machine's load puts either process.
    process = subprocess.Popen(
        minigpt_command("train", "-c", tiny_config, "--out", run, *settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("batch@45=announce+pause:60", tmp_path / "reached"),
    )
    stderr = interrupt_once_training(process, tmp_path / "reached", signal.SIGINT)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    found = re.search(
        rf"interrupted at step (\d+)/{steps}; checkpoint saved in (.+?)\. Resume with: (.+)$", stderr, re.M
    )
    assert found, stderr
    stopped = int(found[1])
    assert stopped == 45  # past the step-40 checkpoint: the stop writes its own
    assert found[2] == str(run)
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == stopped
    assert max(r["step"] for r in metrics(run)) <= stopped

    resume = shlex.split(found[3])
    assert resume[:2] == ["minigpt", "train"] and resume[-1] == "--resume"
    assert "-c" in resume and "--out" in resume
    result = cli(*resume[1:], "--quiet")  # exactly the command the user is told to run
    assert result.exit_code == 0, result.output

    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == steps
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for i, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][i][key]), (i, key)
    assert torch.equal(a["rng"]["batches"], b["rng"]["batches"])
    assert a["hashes"] == b["hashes"]

    # metrics.jsonl: one record per logged step and per evaluation, no repeats, same numbers.
    def numbers(run_dir):
        return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")} for r in metrics(run_dir)]

    resumed = numbers(run)
    keys = [(r["step"], bool(r.get("eval"))) for r in resumed]
    assert len(keys) == len(set(keys))
    assert keys == sorted(keys)
    assert resumed == numbers(straight)


def test_resume_after_a_crash_redoes_the_steps_logged_after_the_last_checkpoint(cli, tiny_config, tmp_path):
    straight = tmp_path / "straight"
    train_tiny(cli, tiny_config, straight, "--quiet")

    run = tmp_path / "crashed"
    with power_cut_at(20):
        crashed = cli("train", "-c", tiny_config, "--out", run, "--quiet")
    assert isinstance(crashed.exception, RuntimeError)
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 10
    assert max(r["step"] for r in metrics(run)) == 20  # steps 11..20 were logged, then lost

    train_tiny(cli, tiny_config, run, "--quiet", "--resume")
    keys = [(r["step"], bool(r.get("eval"))) for r in metrics(run)]
    assert keys == [(5, False), (10, False), (10, True), (15, False), (20, False), (20, True)]
    a = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)


# ----------------------------------------------------------------------------------------------
# refused resumes


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.learning_rate=0.002", ["config differs", "[train] learning_rate: 0.002 != 0.003"]),
        ("train.seed=1", ["config differs", "[train] seed: 1 != 1337"]),
        ("tokenizer.kind=byte", ["config differs", "[tokenizer] kind: 'byte' != 'char'"]),
        ("model.n_embd=32", ["[model] section", "n_embd: 32 != 16"]),
    ],
)
def test_resume_with_another_config_is_refused_naming_the_difference(cli, tiny_config, tmp_path, override, expected):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    before = snapshot(run)
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "10", "--resume", "--set", override))
    for text in expected:
        assert text in line
    assert snapshot(run) == before


def test_resume_on_an_edited_corpus_is_refused(cli, tiny_config, tiny_text, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    before = snapshot(run)
    old = hashlib.sha256(tiny_text.read_bytes()).hexdigest()
    # Same characters (the char tokenizer does not change), different text.
    tiny_text.write_text(tiny_text.read_text(encoding="utf-8").replace("Citizen", "Citizem", 1), encoding="utf-8")
    new = hashlib.sha256(tiny_text.read_bytes()).hexdigest()
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "10", "--resume"))
    assert f"the corpus {tiny_text} differs" in line
    assert f"sha256 {new[:12]}... != {old[:12]}..." in line
    assert snapshot(run) == before


def test_resume_with_a_changed_tokenizer_is_refused(cli, tiny_config, tiny_text, tmp_path, isolated_cache):
    # The same config and text, another tokenizer (as another tokenizers release might fit): the
    # cached tokenizer is replaced by one with a character more.
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    before = snapshot(run)
    [cached] = isolated_cache.glob("*/tokenizer.json")
    head = tiny_text.read_text(encoding="utf-8")[:18_000]
    cached.write_text(TextTokenizer(train_tokenizer("char", 0, head + "é")).to_str(), encoding="utf-8")
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "10", "--resume"))
    assert "tokenizer differs" in line
    assert snapshot(run) == before


def test_resume_on_a_text_whose_tokenizer_changed_too_names_the_text(cli, tiny_config, tiny_text, tmp_path):
    # The text is the cause (the tokenizer fitted to it differs as a consequence): the text is named.
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    before = snapshot(run)
    tiny_text.write_text("é" + tiny_text.read_text(encoding="utf-8"), encoding="utf-8")  # one more char
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "10", "--resume"))
    assert f"the corpus {tiny_text} differs from the one the checkpoint was trained on" in line
    assert snapshot(run) == before


def test_resume_without_a_checkpoint_is_refused(cli, tiny_config, tmp_path):
    run = tmp_path / "never-trained"
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--resume"))
    assert f"--resume: no checkpoint in {run}" in line
    assert not run.exists()


def test_resume_and_force_together_are_refused(cli, tiny_config, tmp_path):
    line = error_line(cli("train", "-c", tiny_config, "--out", tmp_path / "run", "--resume", "--force"))
    assert "contradict" in line
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------------------
# bad inputs: one error line, no traceback, no run folder


def _write(path: Path, content: bytes | None) -> Path:
    if content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        ("dir", "is empty; put the UTF-8 *.txt files to train on in it"),  # a folder is a corpus of its files
        (b"abc\x00def" * 10, "looks binary (NUL byte at offset 3)"),
        (b"hello \xff world" * 10, "is not UTF-8: invalid byte 0xff at offset 6"),
    ],
)
def test_unusable_training_text_is_refused_in_one_line(cli, tiny_config, tmp_path, content, expected):
    data = tmp_path / "input"
    if content == "dir":
        data.mkdir()
    else:
        _write(data, content)
    run = tmp_path / "run"
    result = cli("train", "-c", tiny_config, "--data", data, "--out", run)
    line = error_line(result)
    assert result.stderr == line + "\n"  # exactly one line
    assert f"training {'folder' if content == 'dir' else 'text'} {data} " in line and expected in line
    assert not run.exists()


def test_text_too_short_for_a_window_and_a_validation_split_is_refused(cli, tiny_config, tmp_path):
    data = _write(tmp_path / "short.txt", b"ab" * 10)
    run = tmp_path / "run"
    line = error_line(cli("train", "-c", tiny_config, "--data", data, "--out", run))
    assert "is too short: its validation split has 2 tokens" in line
    assert "context + 1 = 9" in line
    assert not run.exists()


def test_existing_run_is_not_overwritten_without_resume_or_force(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet")
    before = snapshot(run)
    line = error_line(cli("train", "-c", tiny_config, "--out", run))
    assert f"run folder {run} already holds a run" in line
    assert "--resume" in line and "--force" in line
    assert snapshot(run) == before


def test_output_under_a_read_only_folder_is_refused(cli, tiny_config, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    # root may write into a 0o500 folder; the kernel's answer to any other user is faked for it, so
    # the refusal is tested whoever runs the suite
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if Path(path) == locked and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    try:
        run = locked / "sub" / "run"
        line = error_line(cli("train", "-c", tiny_config, "--out", run))
        assert f"run folder {run} cannot be written ({locked} is not writable)" in line
        assert not (locked / "sub").exists()
    finally:
        locked.chmod(0o700)


def test_output_under_a_file_is_refused(cli, tiny_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me", encoding="utf-8")
    line = error_line(cli("train", "-c", tiny_config, "--out", blocker / "run"))
    assert f"run folder {blocker / 'run'} cannot be written ({blocker} is not writable)" in line
    line = error_line(cli("train", "-c", tiny_config, "--out", blocker))
    assert f"run folder {blocker} is a file" in line
    assert blocker.read_text(encoding="utf-8") == "keep me"


def test_a_run_cannot_be_lengthened_by_resume_and_the_message_says_why(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    before = snapshot(run)
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "15", "--resume"))
    assert "[train] steps: 15 != 10 (now != checkpoint)" in line
    assert "a run cannot be lengthened or shortened; train a new run with the --steps you want" in line
    assert snapshot(run) == before


def test_resume_with_the_same_text_under_another_path_continues(cli, tiny_config, tiny_text, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "20", "--set", "train.checkpoint_interval=10")
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    payload["step"] = 10  # pretend the run stopped after its first checkpoint
    torch.save(payload, run / "checkpoint.pt")
    moved = tmp_path / "moved.txt"
    moved.write_bytes(tiny_text.read_bytes())
    result = cli(
        "train",
        "-c",
        tiny_config,
        "--out",
        run,
        "--steps",
        "20",
        "--resume",
        "--data",
        moved,
        "--set",
        "train.checkpoint_interval=10",
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 20


def test_an_output_folder_that_cannot_be_created_is_one_line(cli, tiny_config, tmp_path):
    too_long = tmp_path / ("a" * 300)
    line = error_line(cli("train", "-c", tiny_config, "--out", too_long, "--quiet"))
    assert f"run folder {too_long} cannot be used (File name too long); choose another --out" in line


def test_a_damaged_checkpoint_is_refused_without_suggesting_unsafe_loading(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "10")
    (run / "checkpoint.pt").write_bytes(b"garbage")
    line = error_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "10", "--resume"))
    assert f"checkpoint {run / 'checkpoint.pt'} could not be loaded as plain tensors and values" in line
    assert "weights_only" not in line


def test_warmup_longer_than_the_run_is_pointed_out(cli, tiny_config, tmp_path):
    result = train_tiny(cli, tiny_config, tmp_path / "run", "--steps", "5", "--set", "train.warmup_steps=8")
    assert (
        "note: warmup_steps = 8 is not below steps = 5, so the learning rate never reaches learning_rate = 0.003"
    ) in result.stderr


def test_run_files_get_the_usual_permissions(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "5")
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in run.iterdir()} == {name: 0o666 & ~umask for name in RUN_FILES}


def test_the_time_estimate_leaves_the_runs_numbers_untouched(cli, tiny_config, tmp_path):
    # The estimate runs a forward and backward pass; with dropout on, it must not consume the RNG.
    common = ("--steps", "8", "--set", "model.dropout=0.1")
    train_tiny(cli, tiny_config, tmp_path / "quiet", "--quiet", *common)
    shown = train_tiny(cli, tiny_config, tmp_path / "shown", *common)
    assert "about " in shown.stderr
    a, b = (torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"] for name in ("quiet", "shown"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------------------------
# Muon beside AdamW


def test_muon_takes_the_block_matrices_and_adamw_the_rest(tiny_config):
    from minigpt.training.optimizers import Optimizers

    cfg = load_config(tiny_config, ['train.optimizer="muon"'])
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, 20)
    optimizer = make_optimizer(model, cfg.train)
    assert isinstance(optimizer, Optimizers)
    muon, adamw = optimizer.optimizers
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert in_muon | in_adamw == set(names.values()) and not in_muon & in_adamw
    assert {"token_table.weight", "position_table.weight", "head.weight"} <= in_adamw


def test_train_says_which_optimizer_auto_took_and_why(cli, tiny_config, tmp_path):
    # 4 windows of 8 tokens: Muon's orthogonalisation would dwarf the step's own arithmetic
    result = train_tiny(cli, tiny_config, tmp_path / "run", "--steps", "2", "--set", 'train.optimizer="auto"')
    said = [line for line in result.stderr.splitlines() if 'optimizer = "auto"' in line]
    assert len(said) == 1 and said[0].startswith('note: optimizer = "auto": adamw (') and "32-token step" in said[0]
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert "optimizers" not in payload["optimizer"]  # AdamW's own state dict, not Muon beside AdamW


def test_a_muon_run_resumed_from_its_checkpoint_ends_bitwise_identical(tiny_config):
    from minigpt.text.corpus import load_corpus
    from minigpt.training.session import build
    from minigpt.training.trainer import Trainer

    cfg = load_config(tiny_config, ['train.optimizer="muon"', "train.steps=12"])
    corpus = load_corpus(cfg)
    straight = build(cfg, corpus)
    Trainer(straight).run()

    first = build(cfg, corpus)
    trainer = Trainer(first)
    for _ in range(5):
        trainer.train_step()
    saved = first.checkpoint(first.step)
    buffer = __import__("io").BytesIO()
    torch.save(saved, buffer)  # through the same serialisation a checkpoint file goes through
    buffer.seek(0)
    resumed = build(cfg, corpus, payload=torch.load(buffer, weights_only=True))
    assert resumed.step == 5
    Trainer(resumed).run()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


# ----------------------------------------------------------------------------------------------
# the best checkpoint


def test_best_pt_holds_the_weights_at_the_lowest_validation_loss_and_commands_read_it(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(
        cli,
        tiny_config,
        run,
        "--quiet",
        "--steps",
        "30",
        "--set",
        "train.learning_rate=0.05",
        "--set",
        "train.eval_interval=5",
        "--set",
        "train.checkpoint_interval=30",
    )
    evals = [r for r in metrics(run) if r.get("eval")]
    best = min(evals, key=lambda r: r["val_loss"])
    payload = torch.load(run / "best.pt", weights_only=True)
    assert set(payload) == {"format", "model", "model_config", "vocab_size", "step", "val_loss", "val_bpb"}
    assert payload["step"] == best["step"] and payload["val_loss"] == best["val_loss"]
    for command in (
        ["sample", "-n", "5", "-p", "The"],
        ["trace", "-p", "The"],
        ["eval", "--data", tmp_path / "tiny.txt"],
    ):
        result = cli(*command[:1], "--run", run, "--checkpoint", "best", *command[1:])
        assert result.exit_code == 0, (command, result.output)
    from minigpt.config import load_config as load
    from minigpt.runs.reading import load_model

    model, _ = load_model(load(run / "config.toml"), run, checkpoint="best")
    assert all(torch.equal(model.state_dict()[k], payload["model"][k]) for k in payload["model"])


def test_best_is_refused_in_one_line_before_the_first_evaluation(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    train_tiny(cli, tiny_config, run, "--quiet", "--steps", "20")
    (run / "best.pt").unlink()
    result = cli("sample", "--run", run, "--checkpoint", "best")
    assert result.exit_code == 2 and f"{run} has no best.pt yet" in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_closing_summary_draws_the_validation_curve(cli, tiny_config, tmp_path):
    from minigpt.commands.train import sparkline

    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁" or sparkline([3.0, 2.0, 1.0]) == "█▄▁"
    assert sparkline([1.0, 1.0]) == "▁▁"
    result = train_tiny(cli, tiny_config, tmp_path / "run", "--set", "train.eval_interval=5")
    line = next(line for line in result.stderr.splitlines() if line.startswith("val loss by evaluation: "))
    evals = [r for r in metrics(tmp_path / "run") if r.get("eval")]
    curve = line.split(": ", 1)[1].split("  ")[0]
    assert len(curve) == len(evals) == 4 and set(curve) <= set("▁▂▃▄▅▆▇█")
    assert f"{evals[0]['val_loss']:.3f} at step 5 -> {evals[-1]['val_loss']:.3f} at step 20" in line


# ----------------------------------------------------------------------------------------------
# samples during training


def test_samples_during_training_are_shown_and_logged_and_change_no_weight(cli, tiny_config, tmp_path):
    plain = tmp_path / "plain"
    train_tiny(cli, tiny_config, plain, "--quiet")
    sampled = tmp_path / "sampled"
    result = train_tiny(
        cli,
        tiny_config,
        sampled,
        "--set",
        "train.sample_every=5",
        "--set",
        'train.sample_prompt="The"',
        "--set",
        "train.sample_tokens=12",
    )
    assert result.stderr.count("--- sample at step ") == 4 and "--- sample at step 20 ---\nThe" in result.stderr
    samples = [r for r in metrics(sampled) if "sample" in r]
    assert [r["step"] for r in samples] == [5, 10, 15, 20] and all(len(r["sample"]) == 12 for r in samples)
    a = torch.load(plain / "checkpoint.pt", weights_only=True)
    b = torch.load(sampled / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])  # the global RNG was never drawn from


def test_a_sample_prompt_longer_than_the_table_is_refused_before_anything_is_written(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    line = error_line(
        cli(
            "train",
            "-c",
            tiny_config,
            "--out",
            run,
            "--set",
            "train.sample_every=5",
            "--set",
            'train.sample_prompt="ROMEO: far longer than eight"',
        )
    )
    assert "[train] sample_prompt has 28 tokens but the position table has 8 rows" in line
    assert not run.exists()
