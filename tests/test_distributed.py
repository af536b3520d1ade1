"""`torchrun -m minigpt train`: data-parallel training (gloo on the CPU) that computes what one
process computes with the union batch, writes one run folder, stops and resumes as one.

Every launch is the real command line under torchrun, paced or failed where a test needs it by
MINIGPT_FAILPOINTS (minigpt/failpoints.py); two "machines" are two `--nnodes=2` launches. What no
command line shows, when each rank's gradients are exchanged and each rank's final weights, is
recorded by tests/ddp_probe.py, which drives the same trainer through the library.
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
from conftest import announced, child_processes, wait_for
from test_attention_residuals_commands import ATTENTION
from test_gqa import GQA_SETS

import minigpt

pytestmark = pytest.mark.slow  # every test here launches torchrun

# float32: bf16 rounding would differ with the batch split. Accumulation: micro-steps exercise no_sync.
COMMON = ["--quiet", "--set", 'train.precision="float32"', "--set", "train.grad_accum=2"]
GRAD_ACCUM = 2
PROBE = Path(__file__).with_name("ddp_probe.py")
# minigpt's own source files, wherever the checkout (or the environment it is installed in) lives.
OUR_FILES = {str(Path(minigpt.__file__).parent) + os.sep, str(Path(minigpt.__file__).resolve().parent) + os.sep}


def no_frame_of_ours(stderr: str) -> bool:
    """No traceback frame in minigpt's package: torchrun reports a failed or signalled rank with a
    traceback of its own (torch's files), but no rank's code may fail."""
    return not any(f'File "{folder}' in stderr for folder in OUR_FILES)


def launcher(nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def ranks_env(**extra: str) -> dict[str, str]:
    """The ranks' environment: one thread each (two ranks share this machine's cores)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def torchrun(folder: Path, *args, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 -m minigpt ARGS` in `folder`, its environment plus `env`."""
    return subprocess.run(
        [*launcher(), "-m", "minigpt", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=folder,
        env=ranks_env(**env),
    )


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
    """`two`: 2 ranks of batch 4 (torchrun); `one`: 1 process of batch 8; both with grad_accum 2."""
    from conftest import SHAKESPEARE, TINY_CONFIG
    from typer.testing import CliRunner

    from minigpt.cli import app

    folder = tmp_path_factory.mktemp("ddp")
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    (folder / "out").mkdir()
    two = torchrun(folder, "train", "-c", folder / "tiny.toml", "--out", folder / "out" / "two", *COMMON)
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


# Configs whose two-rank run must compute what one process computes with the union batch, each with
# its tolerances (weights, then validation losses; None: weights only) and what more its test checks.
# Their two-rank runs are trained in one launch (`launched`), each one-process run by its test.
EQUIVALENT = {
    # The default optimizer. Muon orthogonalises each update in bfloat16, which magnifies any
    # difference in summation order: after 20 steps weights differ by a few 1e-3 (as much as one
    # process on 1 and on 2 threads), while the validation losses agree within 1e-4.
    "muon": (["--set", 'train.optimizer="muon"'], 2e-2, 1e-4),
    # every switch of "Remove it and watch" at once: no positions, no residual, no norms, no FFN
    "switches": (
        ["--set", 'model.positions="none"', "--set", "model.residual=false"]
        + ["--set", 'model.norm="none"', "--set", "model.ffn_hidden=0"],
        1e-5,
        1e-5,
    ),
    # a task: each rank draws the global batch of examples and keeps its rows, as windows are
    "task": (["--task", "reverse", "--task-length", "3", "--set", "model.context=8"], 1e-5, 1e-5),
    # LoRA on the one-process run of `runs`: every rank reads the base and trains the adapters alone
    "lora": (["--set", "train.lora_rank=2", "--set", "train.learning_rate=0.01", "--init-from", "out/one"], 1e-5, 1e-5),
    # grouped-query attention with rope, RMSNorm, SwiGLU and a qkv bias alone (test_gqa.py's model)
    "gqa": ([a for s in GQA_SETS for a in ("--set", s)], 1e-5, None),
    "rope": (["--set", 'model.positions="rope"', "--steps", "10"], 1e-5, 1e-5),
    # the newer position keys: fixed sinusoids, T5's one bias table shared by the blocks (distances past 3
    # in its logarithmic buckets), rope on a quarter of each head
    "sinusoidal": (["--set", 'model.positions="sinusoidal"', "--steps", "10"], 1e-5, 1e-5),
    "t5": (
        ["--set", 'model.positions="t5"', "--set", "model.t5_buckets=8", "--set", "model.t5_max_distance=6"]
        + ["--steps", "10"],
        1e-5,
        1e-5,
    ),
    "rope-fraction": (
        ["--set", 'model.positions="rope"', "--set", "model.rope_fraction=0.25", "--steps", "10"],
        1e-5,
        1e-5,
    ),
    "attention-residuals": (["--set", ATTENTION, "--set", "model.n_layer=2", "--steps", "10"], 1e-5, 1e-5),
}


def equivalent_args(runs: Path, name: str) -> list:
    """`minigpt train`'s arguments for EQUIVALENT[name], less --out; paths absolute."""
    args, _, _ = EQUIVALENT[name]
    # a task reads no data: a config of its own, without tiny.txt
    config = runs / ("task.toml" if name == "task" else "tiny.toml")
    return ["-c", config, *COMMON, *[runs / a if a == "out/one" else a for a in args]]


@pytest.fixture(scope="module")
def launched(runs):
    """One launch of tests/ddp_probe.py on two ranks: the two-rank run of `runs` again, through
    the probe (probe/run, with what it recorded: probe/allreduce{rank}.txt, probe/rank{rank}.pt),
    then every EQUIVALENT config's two-rank run (equivalent/NAME), each as `minigpt train` runs it."""
    out = runs / "probe"
    out.mkdir()
    (runs / "task.toml").write_text(
        (runs / "tiny.toml").read_text().replace('data = "tiny.txt"\n', "").replace('kind = "char"\n', ""),
        encoding="utf-8",
    )
    overrides = [COMMON[i + 1] for i, a in enumerate(COMMON) if a == "--set"]
    commands = {
        name: [*map(str, ["train", *equivalent_args(runs, name), "--out", runs / "equivalent" / name])]
        for name in EQUIVALENT
    }
    jobs = {
        "probe": {"config": str(runs / "tiny.toml"), "run_dir": str(out / "run"), "out": str(out)}
        | {"overrides": overrides},
        "commands": commands,
        "results": str(runs / "results.json"),
    }
    (runs / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run(
        [*launcher(), str(PROBE), runs / "jobs.json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=runs,
        env=ranks_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return runs, json.loads((runs / "results.json").read_text()), done.stderr


@pytest.fixture(scope="module")
def probed(launched):
    return launched[0] / "probe"


def test_both_ranks_end_with_identical_weights_and_the_checkpoint_is_theirs(runs, probed):
    rank0, rank1 = weights(probed / "rank0.pt"), weights(probed / "rank1.pt")
    assert_close(rank0, rank1, atol=0)
    assert_close(rank0, weights(probed / "run" / "checkpoint.pt"), atol=0)
    # and the probe trained exactly what the command line trained
    assert_close(rank0, weights(runs / "out" / "two" / "checkpoint.pt"), atol=0)


def test_gradients_are_exchanged_once_per_step_not_on_every_micro_batch(probed):
    for rank in (0, 1):
        drawn = [int(n) for n in (probed / f"allreduce{rank}.txt").read_text().split()]
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


def machines(tmp_path: Path, runs: Path) -> list[Path]:
    """Two machines' folders, each with its own copy of tiny.txt and tiny.toml."""
    homes = []
    for node in (0, 1):
        home = tmp_path / f"machine{node}"
        home.mkdir()
        for name in ("tiny.txt", "tiny.toml"):
            shutil.copy(runs / name, home / name)
        homes.append(home)
    return homes


def on_two_machines(homes: list[Path], args: list[list], envs: list[dict[str, str]] | None = None) -> list:
    """`python -m minigpt ARGS[node]` under `torchrun --nnodes=2 --nproc-per-node=1`, one launch
    per machine (each in its home, with its own token cache, its environment plus ENVS[node]);
    the launches' (exit status, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = [
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
                "-m",
                "minigpt",
                *map(str, args[node]),
            ],
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ranks_env(MINIGPT_CACHE=str(home / "cache"), **(envs[node] if envs else {})),
        )
        for node, home in enumerate(homes)
    ]
    said = [process.communicate(timeout=300)[1] for process in processes]
    return [(process.returncode, stderr) for process, stderr in zip(processes, said)]


def test_a_second_machine_needs_only_the_training_text(runs, tmp_path):
    """Two "machines" (torchrun --nnodes=2, one process each): separate folders and token caches,
    the text copied into each. Machine 1 gets rank 0's tokenizer, encodes into its own cache and
    writes no run folder; the run is the single-machine 2-rank run."""
    homes = machines(tmp_path, runs)
    train = ["train", "-c", "tiny.toml", "--out", "run", *COMMON]
    # machine 1 fails the run (an internal error) if it ever fits a tokenizer of its own
    for code, stderr in on_two_machines(homes, [train, train], [{}, {"MINIGPT_FAILPOINTS": "tokenizer-fit=raise"}]):
        assert code == 0, stderr[-3000:]
    one, other = homes
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
    """What a batch scheduler sends: SIGTERM to torchrun, which forwards it to every worker, and to
    every worker itself. Each copy lands at a moment the test knows, failpoints holding both ranks
    there until it comes: torchrun's in step 4; the workers' own once both ranks have stopped and
    left the process group, just before rank 0 prints: the latest a copy can come, and it must not
    cut rank 0 short before it has said how to resume. The ranks stop together at the end of step
    4, rank 0 saves one checkpoint and prints the resume command. Resumed with that command the run
    ends bitwise equal to the uninterrupted 2-rank run; its checkpoint resumed in one process with
    batch_size doubled ends equal to it too (up to reduction order)."""
    run, there = tmp_path / "interrupted", tmp_path / "reached"
    stop = 4
    held = f"batch@{GRAD_ACCUM * (stop - 1) + 1}=announce+pause:60;train-end=announce+pause:60"  # step 4's first batch
    process = subprocess.Popen(
        [*launcher(), "-m", "minigpt", "train", "-c", str(runs / "tiny.toml"), "--out", str(run), *COMMON[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=runs,
        env=ranks_env(MINIGPT_FAILPOINTS=held, MINIGPT_FAILPOINTS_FILE=str(there)),
    )
    try:
        wait_for(lambda: announced(there) == ["batch"] * 2, f"the ranks never reached step {stop}", process)
        workers = child_processes(process.pid)  # both paused: neither can end before it is signalled
        assert len(workers) == 2, workers
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: announced(there)[2:] == ["train-end"] * 2, "the ranks never stopped together", process)
        for worker in workers:
            os.kill(worker, signal.SIGTERM)
        stderr = process.communicate(timeout=120)[1]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
    said = [line for line in stderr.splitlines() if line.startswith("interrupted at step")]
    assert len(said) == 1, stderr[-3000:]  # rank 0's line only
    found = re.fullmatch(r"interrupted at step (\d+)/20; checkpoint saved in (.+?)\. Resume with: (.+)", said[0])
    assert found and found[2] == str(run), said
    assert int(found[1]) == stop
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == stop
    assert "internal error" not in stderr and no_frame_of_ours(stderr), stderr[-3000:]

    in_one = tmp_path / "in-one"
    shutil.copytree(run, in_one)

    resume = shlex.split(found[3])
    assert resume[:4] == ["torchrun", "--standalone", "--nproc_per_node=2", "-m"] and resume[4:6] == [
        "minigpt",
        "train",
    ]
    assert resume[-1] == "--resume"
    again = torchrun(runs, *resume[5:])  # exactly the command the user is told to run
    assert again.returncode == 0, again.stderr[-3000:]
    straight = runs / "out" / "two"
    assert_close(weights(run / "checkpoint.pt"), weights(straight / "checkpoint.pt"), atol=0)
    assert eval_losses(run) == eval_losses(straight)

    one = cli("train", "-c", runs / "tiny.toml", "--out", in_one, "--resume", *COMMON, "--set", "train.batch_size=8")
    assert one.exit_code == 0, one.output
    assert torch.load(in_one / "checkpoint.pt", weights_only=True)["step"] == 20
    assert_close(weights(in_one / "checkpoint.pt"), weights(straight / "checkpoint.pt"), atol=1e-5)


@pytest.mark.parametrize(
    "mistake, said",
    [
        ([], "already holds a run"),  # found by rank 0 alone: its folder
        (["--steps", "abc"], "Invalid value for '--steps': 'abc' is not a valid int"),  # every rank's command line
    ],
)
def test_a_refusal_stops_every_rank_with_one_line(runs, tmp_path, mistake, said):
    # Rank 0 (the one that speaks) starts late, as it may on a busy machine: the others must not end
    # first, since torchrun then stops rank 0 before it says the line.
    (tmp_path / "sitecustomize.py").write_text(
        'import os, time\nif os.environ.get("LOCAL_RANK") == "0":\n    time.sleep(3)\n'
    )
    late = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    result = torchrun(
        runs, "train", "-c", runs / "tiny.toml", "--out", runs / "out" / "two", *COMMON, *mistake, PYTHONPATH=late
    )
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if "minigpt: error:" in line]
    assert len(refusals) == 1 and said in refusals[0], result.stderr[-3000:]


def one_refusal(*launches: tuple[int, str]) -> str:
    """The launches (exit status, stderr) all failed, with one refusal line among them and no
    internal error; that line."""
    stderr = "".join(said for _, said in launches)
    assert all(code != 0 for code, _ in launches), stderr[-3000:]
    assert "internal error" not in stderr and no_frame_of_ours(stderr), stderr[-3000:]
    refusals = [line for line in stderr.splitlines() if "minigpt: error:" in line]
    assert len(refusals) == 1, stderr[-3000:]
    return refusals[0]


def test_a_refusal_on_another_rank_stops_every_rank_before_anything_is_written(runs, tmp_path):
    """Machine 1's copy of the text is not machine 0's (one letter differs)."""
    homes = machines(tmp_path, runs)
    text = homes[1] / "tiny.txt"
    text.write_text(text.read_text(encoding="utf-8").replace("Citizen", "Citizem", 1), encoding="utf-8")
    train = ["train", "-c", "tiny.toml", "--out", "never", *COMMON]
    refusal = one_refusal(*on_two_machines(homes, [train, train]))
    assert re.search(r"rank 1 \(on .+\): training text .+ is not the text rank 0 trains on", refusal), refusal
    for home in homes:  # no run folder, no lock file left
        assert not (home / "never").exists() and not list(home.glob(".never*"))


def test_a_write_error_on_rank_0_mid_run_stops_every_rank_with_one_line(runs, tmp_path):
    """Only rank 0 writes; when a checkpoint cannot be written the ranks agree to stop at that
    step's end, instead of the others waiting for a gradient exchange rank 0 never joins."""
    run = tmp_path / "full"
    # Rank 0's checkpoint files, in order: checkpoint.pt at step 0; best.pt and checkpoint.pt at
    # step 10; the 4th is the first at step 20 (best.pt if the loss improved, else checkpoint.pt).
    full_at_20 = "checkpoint-write@4=raise:ENOSPC"
    result = torchrun(runs, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON, MINIGPT_FAILPOINTS=full_at_20)
    refusal = one_refusal((result.returncode, result.stderr))
    assert f"could not write to the run folder {run} (No space left on device)" in refusal
    assert "its last checkpoint (step 10) is intact" in refusal
    assert "torchrun --standalone --nproc_per_node=2 -m minigpt train" in refusal
    assert torch.load(run / "checkpoint.pt", weights_only=True)["step"] == 10


def test_a_config_that_differs_on_another_rank_is_refused_in_one_line(runs, tmp_path):
    """Machine 1 is launched with one --set more than machine 0."""
    homes = machines(tmp_path, runs)
    train = ["train", "-c", "tiny.toml", "--out", "never", *COMMON]
    refusal = one_refusal(*on_two_machines(homes, [train, [*train, "--set", "train.steps=10"]]))
    assert re.search(
        r"rank 1 \(on .+\): the config here differs from rank 0's \(\[train\] steps: 10 != 20 "
        r"\(here != rank 0\)\); launch every process with the same config",
        refusal,
    ), refusal
    for home in homes:
        assert not (home / "never").exists()


def test_a_write_error_on_rank_0_before_the_first_step_stops_every_rank_with_one_line(runs, tmp_path):
    """Opening the metrics log (rewritten on --resume) fails on rank 0 alone: agreed, not a hang."""
    run = tmp_path / "full"
    result = torchrun(
        runs, "train", "-c", runs / "tiny.toml", "--out", run, *COMMON, MINIGPT_FAILPOINTS="metrics-open=raise:ENOSPC"
    )
    refusal = one_refusal((result.returncode, result.stderr))
    assert f"could not write to the run folder {run} (No space left on device)" in refusal
    assert "its last checkpoint (step 0) is intact" in refusal


@pytest.mark.parametrize("name", list(EQUIVALENT))
def test_a_model_trains_on_two_ranks_as_in_one_process(launched, cli, tmp_path, name):
    """Muon, a switched model, a task, LoRA, GQA, rope, sinusoidal, T5, rope on a quarter of each head,
    Attention Residuals: weights and validation losses of the two-rank run (batch 4 each) within
    EQUIVALENT's tolerances of one process's (batch 8)."""
    runs, results, stderr = launched
    assert results[name] == 0, stderr[-3000:]
    _, atol, losses = EQUIVALENT[name]
    two = runs / "equivalent" / name
    one = cli("train", *equivalent_args(runs, name), "--out", tmp_path / "one", "--set", "train.batch_size=8")
    assert one.exit_code == 0, one.output
    trained = weights(two / "checkpoint.pt")
    assert_close(trained, weights(tmp_path / "one" / "checkpoint.pt"), atol=atol)
    if name == "attention-residuals":
        assert "final_depth.query" in trained
    if name in ("sinusoidal", "t5"):  # no position table: fixed rows, or T5's one table for every block
        assert "position_table.weight" not in trained and ("relative_bias.weight" in trained) == (name == "t5")
    if losses is None:
        return
    ddp, single = eval_losses(two), eval_losses(tmp_path / "one")
    assert ddp and [step for step, _ in ddp] == [step for step, _ in single]
    assert all(abs(a - b) < losses for (_, a), (_, b) in zip(ddp, single)), (ddp, single)
    if name == "muon":
        assert [step for step, _ in ddp] == [10, 20]
