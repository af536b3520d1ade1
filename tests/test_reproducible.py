"""A run with the default settings computes the same bits every time (issue 36): killed with SIGKILL
at several steps and resumed, it ends bitwise equal to the uninterrupted run. Nothing here sets
`[train] threads`, so the run trains on every core torch would use (two on a 2-core machine, and
at this size 1 and 2 threads give other last bits: a thread count that changed would show).
The kills land at failpoints (minigpt/failpoints.py), never at a guessed moment."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch
from conftest import announced, minigpt_command, run_minigpt, wait_for, with_failpoints

# The tests' tiny model with every [train] key at its default but the size of the run: no threads,
# no adaptive_threads, optimizer and precision "auto".
DEFAULT_SETTINGS = """\
[model]
context = 8
n_layer = 2
n_head = 2
n_embd = 16
ffn_hidden = 32

[tokenizer]
kind = "char"

[train]
data = "tiny.txt"
batch_size = 8
steps = 20
warmup_steps = 4
eval_interval = 10
eval_batches = 2
checkpoint_interval = 4
log_interval = 5
device = "cpu"
"""

# Each process is killed in the Nth batch it draws: the first in step 7 (its last checkpoint at
# step 4), the second, resumed from 4, in step 10 (an evaluation behind it), the third, from 8, in
# step 17; the last resumes from 16.
KILLS = ((7, 4), (6, 8), (9, 16))


@pytest.mark.slow
def test_a_default_run_killed_three_times_and_resumed_is_bitwise_the_uninterrupted_one(cli, tmp_path, tiny_text):
    config = tmp_path / "default.toml"
    config.write_text(DEFAULT_SETTINGS, encoding="utf-8")
    # The count torch uses in a fresh process here (one per core, or what OMP_NUM_THREADS says).
    torch_default = subprocess.Popen(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], stdout=subprocess.PIPE, text=True
    )
    # One process at a time: two training on every core each would wait on each other.
    straight = run_minigpt("train", "-c", config, "--out", tmp_path / "straight", "--quiet")
    assert straight.returncode == 0, straight.stderr

    killed = tmp_path / "killed"
    for number, (batch, checkpoint_step) in enumerate(KILLS):
        there = tmp_path / f"kill{number}.reached"
        process = subprocess.Popen(
            minigpt_command("train", "-c", config, "--out", killed, "--quiet", *(["--resume"] if number else [])),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=with_failpoints(f"batch@{batch}=announce+sleep:60", there),
        )
        try:
            wait_for(lambda there=there: announced(there) == ["batch"], f"never reached batch {batch}", process)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == -signal.SIGKILL
        assert torch.load(killed / "checkpoint.pt", weights_only=True)["step"] == checkpoint_step
    # The last resume in this process: it trains at the count the checkpoint records, whatever
    # this process's own count is.
    resumed = cli("train", "-c", config, "--out", killed, "--quiet", "--resume")
    assert resumed.exit_code == 0, resumed.output

    cores = int(torch_default.communicate(timeout=120)[0])
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20
    assert a["threads"] == b["threads"] == a["choices"]["threads"] == cores
    assert a["model"].keys() == b["model"].keys()
    different = [name for name in a["model"] if not torch.equal(a["model"][name], b["model"][name])]
    assert different == []
