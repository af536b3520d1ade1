"""Nothing lost, whatever the user or the machine does: a loss that turns NaN, a second trainer on
the same folder, a model larger than memory, a full disk, an unexpected error, and SIGKILL at a
step, an evaluation and a checkpoint write. Each through the real CLI; processes that must die
are real processes."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minigpt import run as run_folder
from minigpt.device import check_dtype
from minigpt.errors import MinigptError

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
        r"is intact in (\S+)\. Lower train.learning_rate or set train.grad_clip",
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

PACED = (
    "import sys, time\n"
    "import minigpt.data as data\n"
    "sample = data.Batches.sample\n"
    "data.Batches.sample = lambda self, generator: (time.sleep(0.02), sample(self, generator))[1]\n"
    "from minigpt.cli import main\n"
    "sys.argv[0] = 'minigpt'\n"
    "main()\n"
)


def wait_for(predicate, what: str, process=None, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert process is None or process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_second_trainer_on_the_same_folder_is_refused_naming_the_first(cli, tiny_config, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-c", PACED, "train", "-c", str(tiny_config), "--out", str(run), "--quiet", "--steps", "400"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        wait_for(
            lambda: (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip(),
            "the first trainer never started",
            first,
        )
        for extra in ((), ("--force",), ("--resume",)):
            line = one_line(cli("train", "-c", tiny_config, "--out", run, "--steps", "400", *extra), 2)
            assert f"run folder {run} is being written by another minigpt train (pid {first.pid})" in line
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

    monkeypatch.setattr(run_folder.torch, "save", disk_full_at_step_20)
    line = one_line(cli("train", "-c", tiny_config, "--out", run, "--quiet"), 1)
    monkeypatch.setattr(run_folder.torch, "save", real_save)
    assert f"could not write to the run folder {run} (No space left on device)" in line
    assert "its last checkpoint (step 10) is intact" in line and "resume with: minigpt train" in line
    assert step_of(run) == 10 and set(os.listdir(run)) == RUN_FILES  # no temporary file left
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet", "--resume")
    assert result.exit_code == 0, result.output
    assert step_of(run) == 20


def test_a_full_disk_on_the_metrics_log_stops_with_one_line(cli, tiny_config, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_write = run_folder.MetricsLog.write

    def full(self, record):
        if record["step"] >= 15:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, record)

    monkeypatch.setattr(run_folder.MetricsLog, "write", full)
    line = one_line(cli("train", "-c", tiny_config, "--out", run, "--quiet"), 1)
    assert f"could not write to the run folder {run} (No space left on device)" in line
    assert step_of(run) == 10


# ------------------------------------------------------------------ unexpected errors

BROKEN = (
    "import sys\n"
    "import minigpt.trainer as train\n"
    "train.Trainer.train_step = lambda self: 1 / 0\n"
    "from minigpt.cli import main\n"
    "sys.argv[0] = 'minigpt'\n"
    "main()\n"
)


def test_an_unexpected_error_is_one_line_unless_debug_asks_for_the_traceback(tiny_config, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MINIGPT_DEBUG"}
    args = [sys.executable, "-c", BROKEN]
    plain = subprocess.run(
        [*args, "train", "-c", str(tiny_config), "--out", str(tmp_path / "a"), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert plain.returncode == 1 and plain.stdout == ""
    assert plain.stderr == (
        "minigpt: internal error: ZeroDivisionError: division by zero (run with --debug for the traceback)\n"
    )
    debug = subprocess.run(
        [*args, "--debug", "train", "-c", str(tiny_config), "--out", str(tmp_path / "b"), "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr
    by_env = subprocess.run(
        [*args, "train", "-c", str(tiny_config), "--out", str(tmp_path / "c"), "--quiet"],
        capture_output=True,
        text=True,
        env={**env, "MINIGPT_DEBUG": "1"},
        timeout=120,
    )
    assert "Traceback" in by_env.stderr


# ------------------------------------------------------------------ SIGKILL at three moments

# The real CLI, announcing on stdout (and then pausing) when it is inside a step, an evaluation or a
# checkpoint write, so the test can kill it right there. The pauses change no number.
ANNOUNCED = (
    "import sys, time\n"
    "import minigpt.data as data, minigpt.trainer as train, minigpt.run as run\n"
    "moment = sys.argv.pop(1)\n"
    "def announce(name):\n"
    "    if name == moment:\n"
    "        print(name, flush=True); time.sleep(30)\n"
    "sample, evaluate, save = data.Batches.sample, train.evaluate, run.torch.save\n"
    "steps = [0]\n"
    "def paced(self, generator):\n"
    "    steps[0] += 1\n"
    "    if steps[0] == 25: announce('step')\n"
    "    return sample(self, generator)\n"
    "data.Batches.sample = paced\n"
    "def evaluating(*args):\n"
    "    announce('eval'); return evaluate(*args)\n"
    "train.evaluate = evaluating\n"
    "def saving(payload, f, *args, **kwargs):\n"
    "    if moment == 'checkpoint' and payload.get('step', 0) > 0:\n"
    "        f.write(b'partial'); f.flush(); announce('checkpoint')\n"
    "    return save(payload, f, *args, **kwargs)\n"
    "run.torch.save = saving\n"
    "from minigpt.cli import main\n"
    "sys.argv[0] = 'minigpt'\n"
    "main()\n"
)


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
    for number, moment in enumerate(("step", "eval", "checkpoint")):
        command = [
            sys.executable,
            "-c",
            ANNOUNCED,
            moment,
            "train",
            "-c",
            str(tiny_config),
            "--out",
            str(run),
            *settings,
            *(["--resume"] if number else []),
        ]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
        )
        try:
            assert process.stdout.readline().strip() == moment, process.communicate()
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
    from minigpt.run import METRICS_FILE, MetricsLog, read_metrics

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

SLOW_FIT = (
    "import sys, time\n"
    "import minigpt.data as data\n"
    "fit = data.train_tokenizer\n"
    "def slow(*args, **kwargs):\n"
    "    print('fitting', file=sys.stderr, flush=True); time.sleep(30); return fit(*args, **kwargs)\n"
    "data.train_tokenizer = slow\n"
    "from minigpt.cli import main\n"
    "sys.argv[0] = 'minigpt'\n"
    "main()\n"
)


def test_sigterm_while_preparing_stops_cleanly_and_leaves_no_lock(tiny_config, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_FIT, "train", "-c", str(tiny_config), "--out", str(run), "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert process.stderr.readline().strip() == "fitting"
        process.send_signal(signal.SIGTERM)
        stderr = process.communicate(timeout=60)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130 and "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert not run.exists() and not list(tmp_path.glob(".run*"))  # nothing made, the lock file removed


def test_a_run_folder_cut_short_before_its_first_checkpoint_is_made_again(cli, tiny_config, tmp_path):
    """Killed between writing config.toml / tokenizer.json and the step-0 checkpoint: not a run to
    protect (no --force needed), and nothing to resume."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("# cut short\n")
    (run / "tokenizer.json").write_text("{}")
    (run / ".checkpoint.pt.x1y2.tmp").write_bytes(b"half")
    assert "no checkpoint in" in one_line(cli("train", "-c", tiny_config, "--out", run, "--resume"), 2)
    result = cli("train", "-c", tiny_config, "--out", run, "--quiet")
    assert result.exit_code == 0, result.output
    assert {p.name for p in run.iterdir()} == RUN_FILES and step_of(run) == 20


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
