"""Nothing lost, whatever the user or the machine does: a loss that turns NaN, a second trainer on
the same folder, a model larger than memory, a full disk, an unexpected error, and SIGKILL at a
step, an evaluation and a checkpoint write. Each through the real CLI; processes that must die
are real processes, paced, paused or failed at named points by MINIGPT_FAILPOINTS
(minigpt/failpoints.py)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import announced, minigpt_command, wait_for, with_failpoints

from minigpt.device import check_dtype
from minigpt.errors import MinigptError
from minigpt.runs import checkpoints
from minigpt.training.listeners import MetricsLog

RUN_FILES = {"config.toml", "tokenizer.json", "checkpoint.pt", "metrics.jsonl", "best.pt"}


def one_line(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.stdout == "" and "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("minigpt: error: "), result.stderr
    return result.stderr


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def step_of(run: Path) -> int:
    return torch.load(run / "checkpoint.pt", weights_only=True)["step"]


# ------------------------------------------------------------------ a loss that turns NaN


def test_a_diverging_run_stops_keeps_its_last_good_checkpoint_and_says_what_to_try(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    args = (
        "train",
        "-c",
        tiny_config,
        "--out",
        run,
        "--quiet",
        "--set",
        "train.learning_rate=1e9",
        "--set",
        "train.grad_clip=0",
        "--set",
        "train.warmup_steps=0",
    )
    line = one_line(cli(*args), 1)
    found = re.search(
        r"step (\d+)'s loss or gradient is not finite .* the last good checkpoint \(step (\d+)\) "
        r"is intact in (.+?)\. Lower train.learning_rate \(and train.muon_learning_rate, which Muon's matrices "
        r"take\) or set train.grad_clip",
        line,
    )
    assert found, line
    assert found[3] == str(run) and step_of(run) == int(found[2]) < int(found[1])
    assert all(torch.isfinite(t).all() for t in torch.load(run / "checkpoint.pt", weights_only=True)["model"].values())
    assert metrics(run)[-1] == {
        "step": int(found[1]),
        "diverged": True,
        "loss": metrics(run)[-1]["loss"],
        "grad_norm": metrics(run)[-1]["grad_norm"],
    }
    assert set(os.listdir(run)) == RUN_FILES - {"best.pt"}  # it never reached an evaluation
    again = one_line(cli(*args, "--resume"), 1)  # resume works: it starts from the checkpoint and says the same
    assert f"the last good checkpoint (step {found[2]})" in again


# ------------------------------------------------------------------ two trainers, one folder


@pytest.mark.slow
def test_a_second_trainer_on_the_same_folder_is_refused_naming_the_first(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(  # paced (20 ms a batch), so it is still training while the others try
        minigpt_command("train", "-c", tiny_config, "--out", run, "--quiet", "--steps", "400"),
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("batch=sleep:0.02"),
    )
    try:
        wait_for(
            lambda: (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip(),
            "the first trainer never started",
            first,
        )
        for extra in ((), ("--force",), ("--resume",)):
            line = one_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "400", *extra), 2)
            assert f"run folder {run} is being written by another training run (pid {first.pid})" in line
        assert first.poll() is None  # the first one carries on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # The kernel released the killed trainer's lock: the next one may write.
    result = cli(
        "train",
        "-c",
        tiny_config,
        "--out",
        run,
        "--steps",
        "400",
        "--resume",
        "--quiet",
        "--set",
        "train.checkpoint_interval=400",
    )
    assert result.exit_code == 0, result.output
    assert step_of(run) == 400
    assert not list(tmp_path.glob(".run.lock")) and set(os.listdir(run)) == RUN_FILES


# ------------------------------------------------------------------ a model larger than memory


def test_a_model_larger_than_memory_is_refused_before_allocation(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    line = one_line(
        cli(
            "train", "-c", tiny_config, "--out", run, "--set", "model.n_embd=65536", "--set", "model.ffn_hidden=262144"
        ),
        2,
    )
    assert re.search(
        r"training this model \(parameters, .*\) needs about [\d,.]+ GiB but cpu has [\d,.]+ GiB available", line
    ), line
    assert not run.exists() and not list(tmp_path.glob(".*.lock"))


def test_float64_on_mps_is_refused():
    with pytest.raises(MinigptError, match='dtype = "float64" cannot run on device = "mps"'):
        check_dtype("mps", "float64")
    check_dtype("cpu", "float64")


# ------------------------------------------------------------------ a full disk


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_resume_continues(
    cli, tiny_config, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    real_save = torch.save

    def disk_full_at_step_20(payload, f, *args, **kwargs):
        if isinstance(payload, dict) and payload.get("step") == 20:
            f.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(payload, f, *args, **kwargs)

    monkeypatch.setattr(checkpoints.torch, "save", disk_full_at_step_20)
    line = one_line(cli("train", "-c", tiny_config, "--out", run, "--quiet"), 1)
    monkeypatch.setattr(checkpoints.torch, "save", real_save)
    assert f"could not write to the run folder {run} (No space left on device)" in line
    assert "its last checkpoint (step 10) is intact" in line and "resume with: minigpt train" in line
    assert step_of(run) == 10 and set(os.listdir(run)) == RUN_FILES  # no temporary file left
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet", "--resume")
    assert result.exit_code == 0, result.output
    assert step_of(run) == 20


def test_a_full_disk_on_the_metrics_log_stops_with_one_line(cli, tiny_config, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_write = MetricsLog.write

    def full(self, record):
        if record["step"] >= 15:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, record)

    monkeypatch.setattr(MetricsLog, "write", full)
    line = one_line(cli("train", "-c", tiny_config, "--out", run, "--quiet"), 1)
    assert f"could not write to the run folder {run} (No space left on device)" in line
    assert step_of(run) == 10


# ------------------------------------------------------------------ unexpected errors


@pytest.mark.slow
def test_an_unexpected_error_is_one_line_unless_debug_asks_for_the_traceback(tiny_config, tmp_path):
    # A plain RuntimeError inside the first training step: a bug, not a refusal (MinigptError).
    env = {k: v for k, v in with_failpoints("batch=raise").items() if k != "MINIGPT_DEBUG"}
    bug = "RuntimeError: failpoint batch reached (MINIGPT_FAILPOINTS raise)"
    plain = subprocess.run(
        minigpt_command("train", "-c", tiny_config, "--out", tmp_path / "a", "--quiet"),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert plain.returncode == 1 and plain.stdout == ""
    assert plain.stderr == f"minigpt: internal error: {bug} (run with --debug for the traceback)\n"
    debug = subprocess.run(
        minigpt_command("--debug", "train", "-c", tiny_config, "--out", tmp_path / "b", "--quiet"),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and bug in debug.stderr
    assert ", in train_step\n" in debug.stderr  # raised inside the real step
    by_env = subprocess.run(
        minigpt_command("train", "-c", tiny_config, "--out", tmp_path / "c", "--quiet"),
        capture_output=True,
        text=True,
        env={**env, "MINIGPT_DEBUG": "1"},
        timeout=120,
    )
    assert "Traceback" in by_env.stderr


# ------------------------------------------------------------------ SIGKILL at three moments

# Where each process is killed: it announces that it got there, then waits to be killed. The first
# trains from scratch (checkpoints at steps 0 and 20, killed in step 25), the others resume from
# step 20: the second is killed in its first evaluation (step 30), the third in its first write of
# a checkpoint file (best.pt at step 30, or checkpoint.pt at 40), its temporary file not renamed.
KILLED_AT = {"step": "batch@25", "eval": "eval@1", "checkpoint": "checkpoint-write@1"}


@pytest.mark.slow
def test_sigkill_during_a_step_an_evaluation_and_a_checkpoint_write_then_resume_is_bitwise_equal(
    cli, tiny_config, tmp_path
):
    settings = [
        "--set",
        "train.steps=60",
        "--set",
        "train.checkpoint_interval=20",
        "--set",
        "train.eval_interval=15",
        "--quiet",
    ]
    straight = tmp_path / "straight"
    assert cli("train", "-c", tiny_config, "--out", straight, *settings).exit_code == 0

    run = tmp_path / "killed"
    for number, (moment, point) in enumerate(KILLED_AT.items()):
        there = tmp_path / f"{moment}.reached"
        process = subprocess.Popen(
            minigpt_command("train", "-c", tiny_config, "--out", run, *settings, *(["--resume"] if number else [])),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=with_failpoints(f"{point}=announce+sleep:30", there),
        )
        try:
            name = point.partition("@")[0]
            wait_for(lambda there=there, name=name: announced(there) == [name], f"never reached {point}", process)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == -signal.SIGKILL
        torch.load(run / "checkpoint.pt", weights_only=True)  # whatever the moment, the checkpoint loads

    result = cli("train", "-c", tiny_config, "--out", run, *settings, "--resume")
    assert result.exit_code == 0, result.output
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 60
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    keys = [(r["step"], bool(r.get("eval"))) for r in metrics(run)]
    assert keys == sorted(set(keys)) == [(r["step"], bool(r.get("eval"))) for r in metrics(straight)]
    assert set(os.listdir(run)) == RUN_FILES  # the half-written temporary file is gone


# ------------------------------------------------------------------ a cut-short metrics log


def test_a_metrics_line_cut_short_by_a_crash_is_dropped_and_a_damaged_one_is_refused(tmp_path):
    """SIGKILL while a record is being appended leaves half a line at the end: resume and plot
    read past it (resume logs that step again); a bad line anywhere else is damage, refused."""
    from minigpt.errors import MinigptError
    from minigpt.runs.layout import METRICS_FILE
    from minigpt.runs.metrics import read_metrics
    from minigpt.training.listeners import MetricsLog

    path = tmp_path / METRICS_FILE
    whole = [
        {"step": 5, "loss": 3.9},
        {"step": 10, "eval": True, "val_loss": 3.8, "val_bpb": 5.5},
        {"step": 10, "loss": 3.7},
        {"step": 15, "loss": 3.6},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in whole) + '{"step": 20, "loss": 3.', encoding="utf-8")
    assert read_metrics(tmp_path) == {"train": [whole[0], whole[2], whole[3]], "eval": [whole[1]]}
    MetricsLog(path, 5, keep_through_step=10).close()  # a resume from the step-10 checkpoint
    assert path.read_text(encoding="utf-8") == "".join(json.dumps(r) + "\n" for r in whole[:3])

    path.write_text(json.dumps(whole[0]) + "\nnot json\n" + json.dumps(whole[2]) + "\n", encoding="utf-8")
    with pytest.raises(MinigptError, match=r"metrics.jsonl line 2 is not a JSON object; the run folder is damaged"):
        read_metrics(tmp_path)


# ------------------------------------------------------------------ cut short before the first step


@pytest.mark.slow
def test_sigterm_while_preparing_stops_cleanly_and_leaves_no_lock(tiny_config, tmp_path):
    run = tmp_path / "run"
    there = tmp_path / "fitting.reached"
    process = subprocess.Popen(  # held just before its tokenizer is fitted, the lock taken
        minigpt_command("train", "-c", tiny_config, "--out", run, "--quiet"),
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("tokenizer-fit=announce+sleep:30", there),
    )
    try:
        wait_for(lambda: announced(there) == ["tokenizer-fit"], "the run never began fitting", process)
        process.send_signal(signal.SIGTERM)
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130 and "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert not run.exists() and not list(tmp_path.glob(".run*"))  # nothing made, the lock file removed


@pytest.mark.slow
def test_a_copy_of_the_sigterm_that_stopped_training_is_ignored_however_late(tiny_config, tmp_path):
    """A scheduler's SIGTERM often comes twice (to torchrun and its workers, or to a wrapper script
    that passes it on): the second copy, arriving once training has stopped and just before the
    command prints how to resume, is the same request, not a second interruption."""
    run, there = tmp_path / "run", tmp_path / "reached"
    process = subprocess.Popen(  # paused in step 3 and once it has stopped, each time until signalled
        minigpt_command("train", "-c", tiny_config, "--out", run, "--quiet"),
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("batch@3=announce+pause:60;train-end=announce+pause:60", there),
    )
    try:
        for point in ("batch", "train-end"):
            wait_for(lambda point=point: announced(there)[-1:] == [point], f"never reached {point}", process)
            process.send_signal(signal.SIGTERM)
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert announced(there) == ["batch", "train-end"]
    said = rf"interrupted at step 3/20; checkpoint saved in {re.escape(str(run))}\. Resume with: .+\n"
    assert re.fullmatch(said, stderr), stderr  # its one line, as if the copy had never come
    assert step_of(run) == 3


def test_a_run_folder_cut_short_before_its_first_checkpoint_is_made_again(cli, tiny_config, tmp_path):
    """Killed while writing an empty folder's files (config.toml, tokenizer.json, then the step-0
    checkpoint), which are written in a temporary folder inside it and moved into place with the
    checkpoint last: what a kill leaves is that temporary folder alone, not a run to protect (no
    --force needed), and nothing to resume. A config.toml with no checkpoint beside it is never a
    cut-short run's, so it is the user's own: refused, with or without --force."""
    run = tmp_path / "run"
    run.mkdir()
    cut_short = run / ".run.x1y2.tmp"
    cut_short.mkdir()
    (cut_short / "config.toml").write_text("# cut short\n")
    (cut_short / "tokenizer.json").write_text("{}")
    (cut_short / ".checkpoint.pt.x1y2.tmp").write_bytes(b"half")
    assert "no checkpoint in" in one_line(cli("train", "-c", tiny_config, "--out", run, "--resume"), 2)
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet")
    assert result.exit_code == 0, result.output
    assert {p.name for p in run.iterdir()} == RUN_FILES and step_of(run) == 20
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_text("# my own\n")
    for force in ([], ["--force"]):
        line = one_line(cli("train", "-c", tiny_config, "--out", mine, *force), 2)
        assert f"run folder {mine} holds config.toml and no checkpoint.pt, so no run" in line
    assert [p.name for p in mine.iterdir()] == ["config.toml"] and (mine / "config.toml").read_text() == "# my own\n"


def test_resume_writes_back_a_deleted_tokenizer_and_config(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    assert cli("train", "-c", tiny_config, "--out", run, "--quiet", "--steps", "10").exit_code == 0
    saved = {name: (run / name).read_text() for name in ("config.toml", "tokenizer.json")}
    for name in saved:
        (run / name).unlink()
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet", "--steps", "10", "--resume")
    assert result.exit_code == 0, result.output  # already finished: nothing to train, the files restored
    assert {name: (run / name).read_text() for name in saved} == saved


def test_a_damaged_token_cache_is_encoded_again(cli, tiny_config, tmp_path, isolated_cache):
    first = cli("train", "-c", tiny_config, "--out", tmp_path / "a", "--quiet")
    assert first.exit_code == 0
    [ids] = list(isolated_cache.glob("*/train.npy"))
    ids.write_bytes(ids.read_bytes()[:100])  # cut short
    again = cli("train", "-c", tiny_config, "--out", tmp_path / "b", "--quiet")
    assert again.exit_code == 0, again.output
    assert torch.equal(
        torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)["model"]["head.weight"],
        torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)["model"]["head.weight"],
    )
    assert len(ids.read_bytes()) > 100  # the entry was rewritten


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_before_the_training_loop_is_one_line_and_leaves_nothing(tiny_text, tmp_path, sig):
    """Ctrl-C (or SIGTERM) while the text is being prepared: nothing to save yet, so the command
    says so in one line and exits 130, and no run folder is left half made."""
    there, run = tmp_path / "reached", tmp_path / "run"
    process = subprocess.Popen(
        minigpt_command("train", "--data", tiny_text, "--out", run, "--steps", "5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("tokenizer-fit=announce+sleep:30", there),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground job has it
    )
    try:
        wait_for(lambda: announced(there) == ["tokenizer-fit"], "never reached tokenizer-fit", process)
        process.send_signal(sig)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert stderr.strip().splitlines()[-1] == "minigpt: interrupted", stderr
    assert not run.exists() and not list(tmp_path.glob(".run*"))
