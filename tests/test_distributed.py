"""`torchrun -m minigpt train`: data-parallel training (gloo on the CPU) that computes what one
process computes with the union batch, writes one run folder, stops and resumes as one.

The 2-rank runs go through WORKER: the real command line (`minigpt.cli.main`) with three things
added that change no number it computes: a DistributedDataParallel communication hook that does
the usual averaging all-reduce and logs how many micro-batches this rank had drawn when it ran,
each rank's final weights saved beside the run, and an optional sleep per batch (so a signal can
land mid-run on a fast machine).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import interrupt_once_training

# float32: bf16 rounding would differ with the batch split. Accumulation: micro-steps exercise no_sync.
COMMON = ["--quiet", "--set", 'train.precision="float32"', "--set", "train.grad_accum=2"]
GRAD_ACCUM = 2

WORKER = """\
import os, sys, time
import torch
import minigpt.data as data
import minigpt.session as sessions
import minigpt.trainer as train
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

rank, out, pace = os.environ["RANK"], os.environ["WORKER_OUT"], float(os.environ.get("WORKER_PACE", "0"))
drawn = [0]
sample = data.Batches.sample
def counted(self, generator):
    drawn[0] += 1
    time.sleep(pace)
    return sample(self, generator)
data.Batches.sample = counted

enter = sessions.TrainingSession.__enter__
def enter_with_hook(self):
    session = enter(self)
    def hook(group, bucket):
        with open(os.path.join(out, f"allreduce{rank}.txt"), "a") as f:
            f.write(f"{drawn[0]}\\n")
        return allreduce_hook(group, bucket)
    session.forward_model.register_comm_hook(None, hook)
    return session
sessions.TrainingSession.__enter__ = enter_with_hook

run = train.Trainer.run
def run_and_keep(self):
    result = run(self)
    torch.save(self.session.model.state_dict(), os.path.join(out, f"rank{rank}.pt"))
    return result
train.Trainer.run = run_and_keep

from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


def launcher(nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def worker(folder: Path, out: Path, pace: float = 0.0) -> tuple[list[str], dict]:
    """The command line and environment that run `minigpt ARGS` through WORKER under torchrun."""
    script = folder / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    return (
        [*launcher(), str(script)],
        {**os.environ, "OMP_NUM_THREADS": "1", "WORKER_OUT": str(out), "WORKER_PACE": str(pace)},
    )


def run_worker(folder: Path, out: Path, *args) -> subprocess.CompletedProcess:
    command, env = worker(folder, out)
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=folder, env=env)


def weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)
    return state.get("model", state)


def assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if atol == 0:
            assert torch.equal(a[name], b[name]), name
        else:
            assert torch.allclose(a[name], b[name], rtol=0, atol=atol), name


def eval_losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["val_loss"]) for r in records if r.get("eval")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """`two`: 2 ranks of batch 4 (WORKER); `one`: 1 process of batch 8; both with grad_accum 2."""
    from conftest import SHAKESPEARE, TINY_CONFIG
    from typer.testing import CliRunner

    from minigpt.cli import app

    folder = tmp_path_factory.mktemp("ddp")
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    (folder / "out").mkdir()
    two = run_worker(
        folder, folder / "worker-two", "train", "-c", folder / "tiny.toml", "--out", folder / "out" / "two", *COMMON
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = CliRunner().invoke(
        app,
        ["train", "-c", folder / "tiny.toml", "--out", folder / "out" / "one", *COMMON, "--set", "train.batch_size=8"],
    )
    assert one.exit_code == 0, one.output
    return folder


def test_two_ranks_compute_what_one_process_computes_with_the_union_batch(runs):
    two, one = runs / "out" / "two", runs / "out" / "one"
    assert torch.load(two / "checkpoint.pt", weights_only=True)["step"] == 20
    assert_close(weights(two / "checkpoint.pt"), weights(one / "checkpoint.pt"), atol=1e-5)
    # Evaluation: each rank scores its rows of every window; the ranks' mean is one process's figure.
    ddp, single = eval_losses(two), eval_losses(one)
    assert [step for step, _ in ddp] == [step for step, _ in single] == [10, 20]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(ddp, single))


def test_both_ranks_end_with_identical_weights_and_the_checkpoint_is_theirs(runs):
    rank0, rank1 = weights(runs / "worker-two" / "rank0.pt"), weights(runs / "worker-two" / "rank1.pt")
    assert_close(rank0, rank1, atol=0)
    assert_close(rank0, weights(runs / "out" / "two" / "checkpoint.pt"), atol=0)


def test_gradients_are_exchanged_once_per_step_not_on_every_micro_batch(runs):
    for rank in (0, 1):
        drawn = [int(n) for n in (runs / "worker-two" / f"allreduce{rank}.txt").read_text().split()]
        # The all-reduce runs in the backward pass of each step's last micro-batch (no_sync before it):
        # 20 steps x 2 micro-batches, so only after micro-batch 2, 4, ..., 40 (each bucket once).
        assert sorted(set(drawn)) == list(range(GRAD_ACCUM, 20 * GRAD_ACCUM + 1, GRAD_ACCUM)), drawn
        assert len(drawn) % 20 == 0


def test_one_run_folder_is_written_and_it_samples_in_one_process(runs, cli):
    assert sorted(p.name for p in (runs / "out").iterdir()) == ["one", "two"]  # no lock or stray files
    assert {p.name for p in (runs / "out" / "two").iterdir()} == {
        "config.toml",
        "tokenizer.json",
        "checkpoint.pt",
        "metrics.jsonl",
        "best.pt",
    }
    result = cli("sample", "--run", runs / "out" / "two", "-n", "10", "-p", "The")
    assert result.exit_code == 0, result.output


NEVER_FITS = """\
import sys
import minigpt.data as data
def fitted_here(*args, **kwargs):
    raise AssertionError("a tokenizer was fitted on machine 1")
data.train_tokenizer = fitted_here
from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


def test_a_second_machine_needs_only_the_training_text(runs, tmp_path):
    """Two "machines" (torchrun --nnodes=2, one process each): separate folders and token caches,
    the text copied into each. Machine 1 gets rank 0's tokenizer, encodes into its own cache and
    writes no run folder; the run is the single-machine 2-rank run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = []
    for node in (0, 1):
        home = tmp_path / f"machine{node}"
        home.mkdir()
        for name in ("tiny.txt", "tiny.toml"):
            shutil.copy(runs / name, home / name)
        (home / "never_fits.py").write_text(NEVER_FITS, encoding="utf-8")
        # machine 0 runs minigpt as it is; machine 1 fails the run if it ever fits a tokenizer
        program = ["-m", "minigpt"] if node == 0 else ["never_fits.py"]
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    f"--node-rank={node}",
                    "--master-addr=127.0.0.1",
                    f"--master-port={port}",
                    *program,
                    "train",
                    "-c",
                    "tiny.toml",
                    "--out",
                    "run",
                    *COMMON,
                ],
                cwd=home,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", "MINIGPT_CACHE": str(home / "cache")},
            )
        )
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
    one, other = tmp_path / "machine0", tmp_path / "machine1"
    assert not (other / "run").exists()
    assert [p.name for p in (other / "cache").glob("*/*")] != []  # its own cache, encoded with rank 0's tokenizer
    assert next((other / "cache").glob("*/tokenizer.json")).read_text() == (one / "run" / "tokenizer.json").read_text()
    assert_close(weights(one / "run" / "checkpoint.pt"), weights(runs / "out" / "two" / "checkpoint.pt"), atol=0)


def test_a_two_rank_checkpoint_is_the_run_of_its_global_batch(runs, cli, tmp_path):
    run = tmp_path / "two"
    shutil.copytree(runs / "out" / "two", run)
    same = cli("train", "-c", runs / "tiny.toml", "--out", run, "--resume", *COMMON[1:], "--set", "train.batch_size=8")
    assert same.exit_code == 0 and "already finished 20 steps" in same.stderr  # batch 8 x 1 == batch 4 x 2
    other = cli("train", "-c", runs / "tiny.toml", "--out", run, "--resume", *COMMON)
    assert other.exit_code == 2 and "[train] batch_size: 4 != 8" in other.stderr
    assert "the checkpoint's global batch is 8: use --set train.batch_size=8" in other.stderr


def test_sigterm_stops_both_ranks_and_the_run_resumes_under_torchrun_or_in_one_process(runs, cli, tmp_path):
    """SIGTERM to torchrun and to every worker at once (what a batch scheduler sends; each worker
    also gets torchrun's forwarded copy): the ranks stop at the same step boundary, rank 0 saves
    one checkpoint and prints the resume command. Resumed with that command the run ends bitwise
    equal to the uninterrupted 2-rank run; its checkpoint resumed in one process with batch_size
    doubled ends equal to it too (up to reduction order)."""
    run = tmp_path / "interrupted"
    command, env = worker(runs, tmp_path / "worker-interrupted", pace=0.05)
    process = subprocess.Popen(
        [*command, "train", "-c", str(runs / "tiny.toml"), "--out", str(run), *COMMON[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=runs,
        env=env,
    )
    stderr = interrupt_once_training(process, run, signal.SIGTERM, children=True)  # once step 5 is logged
    assert process.returncode != 0
    said = [line for line in stderr.splitlines() if line.startswith("interrupted at step")]
    assert len(said) == 1, stderr[-3000:]  # rank 0's line only
    found = re.fullmatch(r"interrupted at step (\d+)/20; checkpoint saved in (.+?)\. Resume with: (.+)", said[0])
    assert found and found[2] == str(run), said
    stopped = int(found[1])
    assert 5 <= stopped < 20
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == stopped
    # torchrun itself reports the signal with a traceback of its own; no rank's code may fail
    assert "internal error" not in stderr and not re.search(r'File ".*minigpt', stderr), stderr[-3000:]

    in_one = tmp_path / "in-one"
    shutil.copytree(run, in_one)

    resume = shlex.split(found[3])
    assert resume[:4] == ["torchrun", "--standalone", "--nproc_per_node=2", "-m"] and resume[4:6] == [
        "minigpt",
        "train",
    ]
    assert resume[-1] == "--resume"
    again = run_worker(runs, tmp_path / "worker-resumed", *resume[5:])  # the same arguments, through WORKER
    assert again.returncode == 0, again.stderr[-3000:]
    straight = runs / "out" / "two"
    assert_close(weights(run / "checkpoint.pt"), weights(straight / "checkpoint.pt"), atol=0)
    assert eval_losses(run) == eval_losses(straight)

    one = cli("train", "-c", runs / "tiny.toml", "--out", in_one, "--resume", *COMMON, "--set", "train.batch_size=8")
    assert one.exit_code == 0, one.output
    assert torch.load(in_one / "checkpoint.pt", weights_only=True)["step"] == 20
    assert_close(weights(in_one / "checkpoint.pt"), weights(straight / "checkpoint.pt"), atol=1e-5)


RANK1_TEXT_DIFFERS = """\
import os, sys
import minigpt.data as data
read_text = data.read_text
def other_text(path, what="training text"):
    text, sha = read_text(path, what)
    return (text, "0" * 64) if os.environ["RANK"] == "1" else (text, sha)
data.read_text = other_text
from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


@pytest.mark.parametrize(
    "mistake, said",
    [
        ([], "already holds a run"),  # found by rank 0 alone: its folder
        (["--steps", "abc"], "Invalid value for '--steps': 'abc' is not a valid int"),  # every rank's command line
    ],
)
def test_a_refusal_stops_every_rank_with_one_line(runs, mistake, said):
    result = subprocess.run(
        [
            *launcher(),
            "-m",
            "minigpt",
            "train",
            "-c",
            runs / "tiny.toml",
            "--out",
            runs / "out" / "two",
            *COMMON,
            *mistake,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=runs,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if "minigpt: error:" in line]
    assert len(refusals) == 1 and said in refusals[0], result.stderr[-3000:]


def run_script(tmp_path: Path, runs: Path, text: str, *args) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`text` as a script under torchrun with ARGS; its result and the refusal lines it printed."""
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    result = subprocess.run(
        [*launcher(), str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=runs,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode != 0
    # torchrun reports a failed rank with a traceback of its own; no rank's code may fail
    assert "internal error" not in result.stderr and not re.search(r'File ".*minigpt', result.stderr)
    refusals = [line for line in result.stderr.splitlines() if "minigpt: error:" in line]
    assert len(refusals) == 1, result.stderr[-3000:]
    return result, refusals


def test_a_refusal_on_another_rank_stops_every_rank_before_anything_is_written(runs, tmp_path):
    run = tmp_path / "never"
    _, refusals = run_script(
        tmp_path, runs, RANK1_TEXT_DIFFERS, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON
    )
    assert re.search(r"rank 1 \(on .+\): training text .+ is not the text rank 0 trains on", refusals[0])
    assert not run.exists() and not list(tmp_path.glob(".never*"))  # no run folder, no lock file left


DISK_FULL_AT_STEP_20 = """\
import errno, os, sys
import minigpt.run as run
save = run.torch.save
def disk_full_at_step_20(payload, f, *args, **kwargs):
    if isinstance(payload, dict) and payload.get("step") == 20:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return save(payload, f, *args, **kwargs)
run.torch.save = disk_full_at_step_20
from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


def test_a_write_error_on_rank_0_mid_run_stops_every_rank_with_one_line(runs, tmp_path):
    """Only rank 0 writes; when a checkpoint cannot be written the ranks agree to stop at that
    step's end, instead of the others waiting for a gradient exchange rank 0 never joins."""
    run = tmp_path / "full"
    _, refusals = run_script(
        tmp_path, runs, DISK_FULL_AT_STEP_20, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON
    )
    assert f"could not write to the run folder {run} (No space left on device)" in refusals[0]
    assert "its last checkpoint (step 10) is intact" in refusals[0]
    assert "torchrun --standalone --nproc_per_node=2 -m minigpt train" in refusals[0]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 10


RANK1_STEPS_DIFFER = """\
import os, sys
if os.environ["RANK"] == "1":
    sys.argv += ["--set", "train.steps=10"]
from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


def test_a_config_that_differs_on_another_rank_is_refused_in_one_line(runs, tmp_path):
    run = tmp_path / "never"
    _, refusals = run_script(
        tmp_path, runs, RANK1_STEPS_DIFFER, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON
    )
    assert re.search(
        r"rank 1 \(on .+\): the config here differs from rank 0's \(\[train\] steps: 10 != 20 "
        r"\(here != rank 0\)\); launch every process with the same config",
        refusals[0],
    ), refusals
    assert not run.exists()


DISK_FULL_OPENING_THE_METRICS_LOG = """\
import errno, os, sys
import minigpt.run as run
def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
run.MetricsLog.__init__ = full
from minigpt.cli import main
sys.argv[0] = "minigpt"
main()
"""


def test_a_write_error_on_rank_0_before_the_first_step_stops_every_rank_with_one_line(runs, tmp_path):
    """Opening the metrics log (rewritten on --resume) fails on rank 0 alone: agreed, not a hang."""
    run = tmp_path / "full"
    _, refusals = run_script(
        tmp_path, runs, DISK_FULL_OPENING_THE_METRICS_LOG, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON
    )
    assert f"could not write to the run folder {run} (No space left on device)" in refusals[0]
    assert "its last checkpoint (step 0) is intact" in refusals[0]


def test_muon_on_two_ranks_computes_what_one_process_computes(runs, cli, tmp_path):
    """The default optimizer. Muon orthogonalises each update in bfloat16, which magnifies any
    difference in summation order: after 20 steps weights differ by a few 1e-3 (as much as one
    process on 1 and on 2 threads), while the validation losses agree within 1e-4."""
    muon = [*COMMON, "--set", 'train.optimizer="muon"']
    two = subprocess.run(
        [*launcher(), "-m", "minigpt", "train", "-c", runs / "tiny.toml", "--out", tmp_path / "two", *muon],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=runs,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = cli("train", "-c", runs / "tiny.toml", "--out", tmp_path / "one", *muon, "--set", "train.batch_size=8")
    assert one.exit_code == 0, one.output
    assert_close(weights(tmp_path / "two" / "checkpoint.pt"), weights(tmp_path / "one" / "checkpoint.pt"), atol=2e-2)
    ddp, single = eval_losses(tmp_path / "two"), eval_losses(tmp_path / "one")
    assert [step for step, _ in ddp] == [step for step, _ in single] == [10, 20]
    assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(ddp, single)), (ddp, single)
