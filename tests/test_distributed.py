"""`torchrun -m minigpt train`: data-parallel training (gloo on the CPU) that computes what one
process computes with the union batch, and writes one run folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

COMMON = ["--quiet", "--set", 'train.precision="float32"']  # bf16 rounding would differ with the batch split


def torchrun(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "minigpt", *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import SHAKESPEARE, TINY_CONFIG
    from typer.testing import CliRunner

    from minigpt.cli import app

    folder = tmp_path_factory.mktemp("ddp")
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    (folder / "out").mkdir()
    two = torchrun("train", "-c", folder / "tiny.toml", "--out", folder / "out" / "two", *COMMON, cwd=folder)
    assert two.returncode == 0, two.stderr[-3000:]
    one = CliRunner().invoke(app, ["train", "-c", folder / "tiny.toml", "--out", folder / "out" / "one", *COMMON,
                                   "--set", "train.batch_size=8"])
    assert one.exit_code == 0, one.output
    return folder


def test_two_ranks_compute_what_one_process_computes_with_the_union_batch(runs):
    a = torch.load(runs / "out" / "two" / "checkpoint.pt", weights_only=True)
    b = torch.load(runs / "out" / "one" / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20
    for name in a["model"]:
        assert torch.allclose(a["model"][name], b["model"][name], rtol=0, atol=1e-5), name
    last = [line for line in (runs / "out" / "two" / "metrics.jsonl").read_text().splitlines() if '"eval"' in line][-1]
    same = [line for line in (runs / "out" / "one" / "metrics.jsonl").read_text().splitlines() if '"eval"' in line][-1]
    assert abs(__import__("json").loads(last)["val_loss"] - __import__("json").loads(same)["val_loss"]) < 1e-5


def test_one_run_folder_is_written_and_it_samples_in_one_process(runs, cli):
    assert sorted(p.name for p in (runs / "out").iterdir()) == ["one", "two"]  # no lock or stray files
    assert {p.name for p in (runs / "out" / "two").iterdir()} == {"config.toml", "tokenizer.json", "checkpoint.pt",
                                                                  "metrics.jsonl", "best.pt"}
    result = cli("sample", "--run", runs / "out" / "two", "-n", "10", "-p", "The")
    assert result.exit_code == 0, result.output


def test_a_two_rank_checkpoint_is_the_run_of_its_global_batch(runs, cli, tmp_path):
    run = tmp_path / "two"
    shutil.copytree(runs / "out" / "two", run)
    same = cli("train", "-c", runs / "tiny.toml", "--out", run, "--resume", *COMMON[1:], "--set", "train.batch_size=8")
    assert same.exit_code == 0 and "already finished 20 steps" in same.stderr  # batch 8 x 1 == batch 4 x 2
    other = cli("train", "-c", runs / "tiny.toml", "--out", run, "--resume", *COMMON)
    assert other.exit_code == 2 and "[train] batch_size: 4 != 8" in other.stderr


def test_a_refusal_on_rank_0_stops_every_rank_with_one_line(runs):
    result = torchrun("train", "-c", runs / "tiny.toml", "--out", runs / "out" / "two", *COMMON, cwd=runs)
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if "minigpt: error:" in line]
    assert len(refusals) == 1 and "already holds a run" in refusals[0]
