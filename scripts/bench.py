"""minigpt benchmark: every speed figure of the project, measured in one run on this machine, and
with --nanogpt the same figures for nanoGPT side by side, as ratios.

    python scripts/bench.py                                      minigpt's own figures
    python scripts/bench.py --nanogpt ../shared/anchors/nanogpt  both systems, every target
    python scripts/bench.py --nanogpt DIR --quick                skip the long full-run and 100 MB parts

Figures (each system measured in this process or in child processes started from it, alternating
where it matters, so both see the same machine at the same moment):
  - matmul peaks in float32 and bfloat16 (GFLOP/s) and the model FLOPs utilisation of training;
  - training throughput at the comparison shape (4 blocks, 4 heads, width 128, context 32, batch 64,
    BPE 1,024, biases on): minigpt's real `Trainer.train_step` in its default precision and in
    float32, against nanoGPT's train.py (compile off, float32, gradient_accumulation_steps=1);
  - time to quality: the default `minigpt train` against nanoGPT's 2,000 iterations, wall time and
    validation bits per byte; and at a small batch (16 windows) and at 6L/6H/384 context 256, the
    seconds from launch until minigpt's default recipe, and AdamW, first evaluate at or below the
    figure nanoGPT's recipe ends at, the same number of steps (`--only quality` measures this alone);
  - `minigpt train` through the CLI at both shapes, quiet and with one core kept busy (`--only cli`);
  - sampling at batch 1, 1,000 new tokens, temperature 1, sliding window past the table: minigpt's
    `generate` against nanoGPT's `GPT.generate` on a model of the same shape;
  - a sampling call as a user makes it (`minigpt sample -p "ROMEO:" -n 200`, start to exit) against
    a bare `python -c "import torch"`;
  - a 100 MB text (made here from the shipped corpus, deleted afterwards): reading, tokenizer
    fitting and caching time and peak memory, and the time to the first step of a second run;
  - a folder of 1,000 files totalling 200 MB (made the same way): `minigpt train --data FOLDER
    --steps 1`, wall time and peak memory with the token cache empty and then warm (`--only folder`
    measures this alone).
  - activation patching (`--only patching`): the `by="stage"` and `by="head"` sweeps of
    `minigpt.inspection.patching.patch` on GPT-2 small's shape (12 blocks, 12 heads, width 768,
    random weights) and on the default config's shape, a 20-token prompt whose corrupt copy
    differs in one token (at position 10, and at position 0: every row then differs), with the
    arithmetic each sweep needs and the seconds it would take at the float32 matmul peak;
  - Attention Residuals against the ordinary residual (`--only residuals`): `minigpt train` tokens/s
    at the default shape and at 12 blocks, batch 16
  - rotary and ALiBi positions against the learned table (`--only positions`): `minigpt train` tokens/s
    and sampling tokens/s of each at the comparison shape, side by side (target: rope within 10%);
  - the shipped task configs (`--only tasks`): `minigpt train -c configs/TASK.toml` for reverse, sort,
    copy and add, start to exit, and `minigpt eval --json`'s held-out exact-match accuracy;
  - fine-tuning GPT-2 small's and medium's shapes (`--only lora`): the fine-tune guide's recipe in full and
    with LoRA, with and without [train] recompute: peak resident memory and seconds per step;
  - an imported Llama-family model (`--only llama`; needs transformers): a random-weight SmolLM2-135M-shaped
    folder (scripts/random_hf_folder.py, or `--llama-folder DIR`): `minigpt import hf` start to exit,
    greedy sampling of 200 tokens at batch 1 through the API as `minigpt sample` does it against
    transformers' `generate` on the same folder, at one thread and at every core (target: 1.5x its
    tokens/s, the same tokens), and `minigpt patch --by stage` on 20-token prompts;
  - `--only llama-memory`: `minigpt import hf` of Qwen2.5-0.5B- and Llama-3.2-1B-shaped folders stored in
    bfloat16, the import's peak resident memory beside the float32 model's size and the file's;
  - `--against DIR` (with `--only versions`): this checkout against another one (a worktree of the
    commit before a change, say), the figures a change must keep: the training step, `minigpt
    train`'s rate through the CLI, sampling through the API, and `minigpt sample -n 200` start to
    exit, each in child processes of either version, alternating round by round.
The report is printed as one table and written as JSON (--json-out) with the machine's description.
Nothing here belongs in the test suite.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minigpt.config import SampleConfig, load_config  # noqa: E402
from minigpt.model.flops import training_flops_per_token  # noqa: E402
from minigpt.model.gpt import MiniGPT  # noqa: E402
from minigpt.sampling.generate import generate  # noqa: E402
from minigpt.text.corpus import load_corpus  # noqa: E402
from minigpt.training.session import build  # noqa: E402
from minigpt.training.trainer import Trainer  # noqa: E402

# The comparison shape of issue 9 (nanoGPT's README in shared/anchors/nanogpt uses the same).
SHAPE = [
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=128",
    "model.context=32",
    "model.ffn_hidden=512",
    "model.bias=true",
    "model.dropout=0.0",
    "model.tie_embeddings=false",
    'model.norm="layernorm"',
    'model.activation="relu"',
    'tokenizer.kind="bpe"',
    "tokenizer.vocab_size=1024",
    "train.batch_size=64",
    "train.grad_accum=1",
]
NANO_SHAPE = [
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--block_size=32",
    "--batch_size=64",
    "--dropout=0.0",
    "--gradient_accumulation_steps=1",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
]
NANO_RECIPE = [
    "--bias=False",
    "--learning_rate=1e-3",
    "--beta2=0.99",
    "--min_lr=1e-4",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--warmup_iters=100",
    "--eval_interval=500",
    "--eval_iters=50",
    "--log_interval=50",
    "--always_save_checkpoint=False",
]


# ---------------------------------------------------------------- the machine


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    from minigpt.device import native_bfloat16

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "cpu_bfloat16": native_bfloat16("cpu"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 10, device: str = "cpu") -> float:
    """GFLOP/s of a square matmul, best of `repeats` (measured at the start and the end of the
    benchmark; the report keeps the higher, so a busy moment does not inflate the utilisation)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    best = math.inf
    for _ in range(repeats + 2):
        _sync(device)
        started = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------- minigpt


def train_tokens_per_s(cfg, corpus, threads: int, steps: int, warmup: int = 3) -> float:
    """The real training step, `Trainer.train_step` (schedule, accumulation, clipping, optimizer
    step) on real batches, without a run folder; tokens per second over `steps` after `warmup`
    untimed steps."""
    return TrainTimer(cfg, corpus, threads, warmup).round(steps)


class TrainTimer:
    """One training session whose steps are timed in rounds, so that variants can alternate."""

    def __init__(self, cfg, corpus, threads: int, warmup: int = 3):
        self.threads = threads
        torch.set_num_threads(threads)
        self.trainer = Trainer(build(cfg, corpus, "cpu"))
        self.trainer.session.model.train()
        for _ in range(warmup):
            self.trainer.train_step()
        self.best = 0.0

    def round(self, steps: int) -> float:
        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        for _ in range(steps):
            self.trainer.train_step()
        elapsed = time.perf_counter() - start
        self.best = max(self.best, steps * self.trainer.session.tokens_per_step / elapsed)
        return self.best


def _timed_tokens(
    model: MiniGPT, prompt_ids: list[int], new_tokens: int, seed: int, use_cache: bool, runtime: str = "torch"
) -> tuple[list[int], float]:
    device = next(model.parameters()).device
    settings = SampleConfig(max_new_tokens=new_tokens, temperature=1.0, seed=seed, slide=True, runtime=runtime)
    generation = generate(model, prompt_ids, settings, use_cache=use_cache)
    _sync(str(device))
    start = time.perf_counter()
    tokens = [step.tokens for step in generation]
    ids = torch.cat(tokens).tolist() if tokens else []  # one sync at the end, as a consumer would
    _sync(str(device))
    return ids, time.perf_counter() - start


def bench_sampling(
    model: MiniGPT,
    tokenizer,
    new_tokens: int = 1000,
    prompt: str = "\n",
    seed: int = 1337,
    warmup_tokens: int = 16,
    repeats: int = 3,
) -> dict:
    """Sampling speed at batch 1: `new_tokens` tokens (temperature 1, sliding window past the
    table) with the KV cache and with full recompute, in the same process on the same model; the
    best of `repeats` alternating runs of each. Past the table every step is a full recompute of
    `context` positions in both modes, so the cache only speeds up the first tokens. Where the onnx
    extra is installed, the same with `runtime = "onnxruntime"` (its export cached by a first,
    untimed run)."""
    model.eval()
    prompt_ids = tokenizer.encode(prompt if prompt else "\n")
    for use_cache in (True, False):  # warm up kernels and allocator outside the clock
        _timed_tokens(model, prompt_ids, min(warmup_tokens, new_tokens), seed, use_cache)
    runs = {True: [], False: []}
    for _ in range(repeats):
        for use_cache in (True, False):
            runs[use_cache].append(_timed_tokens(model, prompt_ids, new_tokens, seed, use_cache))
    (cached_ids, cached_s), (plain_ids, plain_s) = (min(runs[mode], key=lambda r: r[1]) for mode in (True, False))
    with_cache = new_tokens / cached_s if cached_s > 0 else 0.0
    without_cache = new_tokens / plain_s if plain_s > 0 else 0.0
    parameter = next(model.parameters())
    onnx: dict = {}
    try:
        from minigpt.sampling.onnx_window import require

        require()
    except Exception as missing:  # noqa: BLE001 - the extra is optional: say why the row is absent
        onnx["onnxruntime"] = str(missing)
    else:
        _timed_tokens(model, prompt_ids, min(warmup_tokens + model.context, new_tokens), seed, True, "onnxruntime")
        timed = [_timed_tokens(model, prompt_ids, new_tokens, seed, True, "onnxruntime") for _ in range(repeats)]
        onnx_ids, onnx_s = min(timed, key=lambda r: r[1])
        onnx["onnxruntime_tokens_per_s"] = round(new_tokens / onnx_s, 1)
        onnx["onnxruntime_same_tokens"] = onnx_ids == cached_ids
    return {
        "new_tokens": new_tokens,
        "context": model.context,
        "device": str(parameter.device),
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "with_kv_cache_tokens_per_s": round(with_cache, 1),
        "without_kv_cache_tokens_per_s": round(without_cache, 1),
        "speedup": round(with_cache / without_cache, 3) if without_cache else None,
        "same_tokens": cached_ids == plain_ids,
        **onnx,
    }


# nanoGPT's shakespeare-char shape on a CPU (its README's), at our BPE-1024 vocabulary
LARGE_SHAPE = [
    "model.n_layer=6",
    "model.n_head=6",
    "model.n_embd=384",
    "model.ffn_hidden=1536",
    "model.context=256",
    "model.dropout=0.2",
    "train.batch_size=16",
]
NANO_LARGE_SHAPE = ["--n_layer=6", "--n_head=6", "--n_embd=384", "--block_size=256", "--batch_size=16", "--dropout=0.2"]


def train_command(config: str | None, out: Path, steps: int | None = None, changes: list[str] = ()) -> list[str]:
    """`minigpt train` as the benchmark runs it: quiet, into `out` (replaced), `changes` as --set."""
    command = [sys.executable, "-m", "minigpt", "train", "--out", str(out), "--quiet", "--force"]
    command += ["-c", config] if config else []
    command += ["--steps", str(steps)] if steps is not None else []
    for change in changes:
        command += ["--set", change]
    return command


def cli_tokens_per_s(
    config: str | None,
    changes: list[str],
    steps: int,
    tokens_per_step: int,
    out: Path,
    env: dict,
    cwd: Path | None = None,
) -> float:
    """`minigpt train` as a user runs it (a subprocess, `threads = 0`, progress off): tokens/s over
    the steady window of its own metrics log, from its first logged step to its last. `cwd`: where
    it runs (`python -m` puts that folder first on the path, before PYTHONPATH)."""
    command = train_command(
        config, out, steps, [*changes, f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}"]
    )
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{result.stderr}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    first, last = rows[0], rows[-1]
    return tokens_per_step * (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])


class BusyCore:
    """Another program keeping one core busy (a laptop's browser, an indexer): a spinning process."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def cli_benchmark(config: str | None, nano, env: dict, scratch: Path, peaks: dict, threads: int) -> dict:
    """What users get from `minigpt train` (a subprocess, its metrics log), side by side with
    nanoGPT's train.py, at the comparison shape and at the larger one; the same on a machine with
    one core kept busy; and the CLI's cost over the bare timed step (`Trainer.train_step` in this
    process). Rounds alternate between the two tools; the best round of each counts."""
    out = scratch / "cli-run"
    result: dict = {}
    for name, changes, nano_shape, steps, nano_iters, rounds in (
        ("default", SHAPE, [], 300, 60, 3),
        ("large", SHAPE + LARGE_SHAPE, NANO_LARGE_SHAPE, 30, 20, 1),
    ):
        cfg = load_config(config, changes)
        per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
        corpus = load_corpus(cfg)
        mini, nano_runs = [], []
        timer = TrainTimer(cfg, corpus, threads)
        for _ in range(rounds):
            mini.append(cli_tokens_per_s(config, changes, steps, per_step, out, env))
            timer.round(max(5, steps // 10))
            if nano:
                nano_runs.append(
                    nano.train_tokens_per_s(nano_iters, True, nano_shape, per_step, skip=min(10, nano_iters // 4))
                )
        flops = training_flops_per_token(MiniGPT(cfg.model, corpus.tokenizer.vocab_size))
        entry = {
            "minigpt_cli": [round(x) for x in mini],
            "minigpt_timed_step": round(timer.best),
            "nanogpt": [round(x) for x in nano_runs],
            "flops_per_token": flops,
            "share_of_bf16_peak": round(max(mini) * flops / (peaks["bfloat16"] * 1e9), 4),
            "share_of_float32_peak": round(max(mini) * flops / (peaks["float32"] * 1e9), 4),
        }
        if name == "default":  # as many rounds as quiet, the best of each tool counting
            busy, busy_nano = [], []
            # With a core busy, the opt-in that times the thread count (the default keeps every core).
            adaptive = [*changes, "train.adaptive_threads=true"]
            with BusyCore():
                for _ in range(rounds):
                    busy.append(cli_tokens_per_s(config, adaptive, steps, per_step, out, env))
                    if nano:
                        busy_nano.append(nano.train_tokens_per_s(nano_iters, True, nano_shape, per_step))
            entry["busy_minigpt_cli_runs"] = [round(x) for x in busy]
            entry["busy_minigpt_cli"] = round(max(busy))
            if nano:
                entry["busy_nanogpt_runs"] = [round(x) for x in busy_nano]
                entry["busy_nanogpt"] = round(max(busy_nano))
        result[name] = entry
        del timer
        torch.set_num_threads(threads)
    return result


def cli_rows(cli: dict, row) -> None:
    for name, label in (("default", "4L/4H/128, context 32, batch 64"), ("large", "6L/6H/384, context 256, batch 16")):
        e = cli[name]
        best_nano = max(e["nanogpt"]) if e["nanogpt"] else None
        row(
            f"`minigpt train` (CLI) steady tokens/s, {label}; {e['share_of_bf16_peak']:.1%} of the bf16 peak",
            max(e["minigpt_cli"]),
            best_nano,
            "tokens/s",
            ">= 2.5x",
        )
        row(
            f"the CLI's tokens/s against its timed step alone, {label}",
            max(e["minigpt_cli"]),
            e["minigpt_timed_step"],
            "tokens/s",
            ">= x0.95",
            better="of-reference",
        )
    e = cli["default"]
    row(
        "one core kept busy: `minigpt train` (adaptive_threads) tokens/s against its quiet figure (nanoGPT: its own)",
        e["busy_minigpt_cli"],
        max(e["minigpt_cli"]),
        "tokens/s",
        ">= x0.80",
        better="of-reference",
    )
    if e["nanogpt"]:
        row(
            "one core kept busy: nanoGPT's tokens/s against its quiet figure",
            e["busy_nanogpt"],
            max(e["nanogpt"]),
            "tokens/s",
            "",
            better="of-reference",
        )
        row(
            "one core kept busy: `minigpt train` (adaptive_threads) against nanoGPT",
            e["busy_minigpt_cli"],
            e["busy_nanogpt"],
            "tokens/s",
            "",
        )


def minigpt_full_run(config: str | None, out: Path, env: dict) -> dict:
    """`minigpt train` (the default recipe) as a user runs it, token cache warm: wall time and the
    final validation figures from its metrics log."""
    command = train_command(config, out)
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{result.stderr}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("eval")]
    train_s = max(r.get("elapsed_s", 0.0) for r in records)
    return {
        "wall_s": round(wall, 1),
        "train_loop_s": round(train_s, 1),
        "steps": records[-1]["step"],
        "val_loss": round(evals[-1]["val_loss"], 4),
        "val_bpb": round(evals[-1]["val_bpb"], 4),
    }


def minigpt_time_to(
    config: str | None, changes: list[str], steps: int, target_bpb: float, out: Path, env: dict
) -> dict:
    """`minigpt train` from launch until its metrics log shows an evaluation at or below
    `target_bpb` (the run is stopped there): the seconds a user waits for that quality. A run that
    ends above it reports its best figure and no time."""
    shutil.rmtree(out, ignore_errors=True)
    command = train_command(config, out, steps, [*changes, f"train.checkpoint_interval={steps}"])
    metrics, read, evals = out / "metrics.jsonl", 0, []
    with tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        while True:
            finished = process.poll() is not None
            if metrics.exists():
                with open(metrics, encoding="utf-8") as log:
                    log.seek(read)
                    text = log.read()
                complete = text[: text.rfind("\n") + 1]  # a line still being written waits
                read += len(complete)
                for line in complete.splitlines():
                    record = json.loads(line)
                    if record.get("eval"):
                        evals.append((time.perf_counter() - started, record["step"], record["val_bpb"]))
            reached = [e for e in evals if e[2] <= target_bpb]
            if reached or finished:
                break
            time.sleep(0.05)
        if not finished:
            process.kill()
            process.wait()
        elif process.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"bench: minigpt train failed:\n{stderr.read()}")
    best = min(evals, key=lambda e: e[2])
    first = reached[0] if reached else None
    return {
        "seconds": round(first[0], 1) if first else None,
        "step": first[1] if first else None,
        "val_bpb": round((first or best)[2], 4),
        "evaluations": [[round(t, 1), step, round(bpb, 4)] for t, step, bpb in evals],
    }


# Time to nanoGPT's quality away from the default shape: nanoGPT's recipe (NANO_RECIPE) at a small
# batch and at the larger shape, its final validation figure the target; minigpt's default recipe
# and AdamW at the same shape, steps and warmup, each timed from launch to its first evaluation at
# or below that figure. name, minigpt changes, nanoGPT overrides, steps, warmup, evaluation every,
# batches per evaluation (nanoGPT's eval_iters: the same amount of validation text).
QUALITY_RUNS = (
    ("batch 16", ["train.batch_size=16"], ["--batch_size=16"], 2000, 100, 200, 50),
    ("6L/6H/384, context 256, batch 16", LARGE_SHAPE, NANO_LARGE_SHAPE, 60, 10, 10, 5),
)


def time_to_quality(config: str | None, nano, env: dict, scratch: Path) -> dict:
    result = {}
    for name, changes, nano_changes, steps, warmup, every, batches in QUALITY_RUNS:
        target = None
        if nano:
            target = nano.full_run(
                [
                    *nano_changes,
                    f"--max_iters={steps}",
                    f"--lr_decay_iters={steps}",
                    f"--warmup_iters={warmup}",
                    f"--eval_interval={steps}",
                    f"--eval_iters={batches}",
                ]
            )
        schedule = [f"train.warmup_steps={warmup}", f"train.eval_interval={every}", f"train.eval_batches={batches}"]
        entry = {"steps": steps, "nanogpt": target}
        for recipe, extra in (("default", []), ("adamw", ['train.optimizer="adamw"'])):
            # without nanoGPT, the target is one no run reaches: the whole run is timed
            entry[recipe] = minigpt_time_to(
                config,
                [*SHAPE, *changes, *schedule, *extra],
                steps,
                target["val_bpb"] if target else -math.inf,
                scratch / "quality-run",
                env,
            )
        result[name] = entry
    return result


def quality_rows(quality: dict, row) -> None:
    for name, e in quality.items():
        nano = e["nanogpt"]
        reach = f"{nano['val_bpb']} bits/byte" if nano else "the end"
        for recipe, label in (("default", "default recipe"), ("adamw", "AdamW")):
            m = e[recipe]
            row(
                f"time to nanoGPT's {e['steps']}-step quality ({reach}), {name}: minigpt {label}"
                + ("" if m["seconds"] or not nano else f" (not reached: best {m['val_bpb']})"),
                m["seconds"],
                nano["wall_s"] if nano else None,
                "s",
                "<= 1/3 (x >= 3)" if recipe == "default" else "",
                better="lower",
            )
        d, a = e["default"]["seconds"], e["adamw"]["seconds"]
        row(
            f"time to that quality, {name}: default recipe against AdamW",
            d,
            a,
            "s",
            "<= x1.0",
            better="of-reference",
        )


def startup(run: Path, env: dict, repeats: int = 5) -> dict:
    """`minigpt sample -p "ROMEO:" -n 200` start to exit against `python -c "import torch"`,
    alternating, best of `repeats` each; where the onnx extra is installed, also with `--runtime
    onnxruntime` (its export cached by a first, untimed call, as a user's second call finds it)."""
    sample = [sys.executable, "-m", "minigpt", "sample", "--run", str(run), "-p", "ROMEO:", "-n", "200"]
    commands = {"import_torch": [sys.executable, "-c", "import torch"], "minigpt_sample": sample}
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxscript"):
        commands["minigpt_sample_onnxruntime"] = [*sample, "--runtime", "onnxruntime"]
        subprocess.run(commands["minigpt_sample_onnxruntime"], capture_output=True, env=env)
    best = {name: math.inf for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"bench: {' '.join(command)} failed:\n{done.stderr}")
            best[name] = min(best[name], time.perf_counter() - started)
    return {
        "import_torch_s": round(best["import_torch"], 3),
        "minigpt_sample_s": round(best["minigpt_sample"], 3),
        "ratio": round(best["minigpt_sample"] / best["import_torch"], 3),
        **(
            {"minigpt_sample_onnxruntime_s": round(best["minigpt_sample_onnxruntime"], 3)}
            if "minigpt_sample_onnxruntime" in best
            else {}
        ),
    }


LARGE_TEXT_CHILD = r"""
import json, resource, sys, time
t0 = time.time()
from minigpt.config import load_config
from minigpt.text.corpus import load_corpus
from minigpt.training.session import build
from minigpt.training.trainer import Trainer
cfg = load_config(None, ["train.data=" + json.dumps(sys.argv[1]), "train.batch_size=64"])
imported = time.time()
corpus = load_corpus(cfg)
prepared = time.time()
trainer = Trainer(build(cfg, corpus, "cpu"))
trainer.train_step()
stepped = time.time()
print(json.dumps({"start": t0, "imported": imported, "prepared": prepared, "first_step": stepped,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": len(corpus.train_ids)}))
"""


def large_text(megabytes: int, env: dict) -> dict:
    """A text of `megabytes` MB (the shipped corpus repeated), first run with an empty cache, then a
    second with the cache: time to prepare, peak memory, time to the first training step."""
    corpus = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-") as scratch:
        big = Path(scratch) / "big.txt"
        with open(big, "w", encoding="utf-8") as f:
            for _ in range(math.ceil(megabytes * 1_000_000 / len(corpus))):
                f.write(corpus)
        child_env = {**env, "MINIGPT_CACHE": str(Path(scratch) / "cache")}
        runs = []
        for _ in range(2):
            launched = time.time()
            done = subprocess.run(
                [sys.executable, "-c", LARGE_TEXT_CHILD, str(big)],
                capture_output=True,
                text=True,
                env=child_env,
                cwd=ROOT,
            )
            if done.returncode != 0:
                raise SystemExit(f"bench: large-text run failed:\n{done.stderr}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append(
                {
                    "prepare_s": round(r["prepared"] - r["imported"], 2),
                    "first_step_after_launch_s": round(r["first_step"] - launched, 2),
                    "first_step_after_imports_s": round(r["first_step"] - r["imported"], 2),
                    "peak_rss_mb": round(r["peak_rss_mb"]),
                    "train_tokens": r["train_tokens"],
                }
            )
        return {"megabytes": round(big.stat().st_size / 1e6, 1), "first_run": runs[0], "cached_run": runs[1]}


def write_folder(folder: Path, files: int, megabytes: float) -> int:
    """`files` text files totalling about `megabytes` MB in ten subfolders, each a different stretch
    of the shipped corpus (so no two are the same file); returns the bytes written."""
    corpus = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    size = round(megabytes * 1_000_000 / files)
    wrapped = corpus * (size // len(corpus) + 2)
    total = 0
    for i in range(files):
        start = i * 7919 % len(corpus)
        path = folder / f"part{i % 10}" / f"{i:04d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        total += path.write_bytes(wrapped[start : start + size].encode("utf-8"))
    return total


# Runs argv[2:] and writes its wall time and peak memory to argv[1]. A small process of its own:
# on Linux a child's ru_maxrss starts at the resident size of the process it was spawned from (the
# parent's address space is the child's until exec), so spawned from this script, which has torch
# loaded, every figure would be at least this script's size.
WAIT4 = r"""
import json, os, sys, time
started = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": wall, "code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}, f)
"""


def timed_process(command: list[str], env: dict, cwd: Path) -> dict:
    """Run `command` to its end: wall time, and the peak resident memory of that process alone
    (os.wait4's rusage of it, from a small process that starts it; see WAIT4)."""
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile("w+") as err:
        report = Path(scratch) / "wait4.json"
        subprocess.run(
            [sys.executable, "-c", WAIT4, str(report), *command],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=cwd,
        )
        err.seek(0)
        stderr = err.read()
        measured = json.loads(report.read_text()) if report.exists() else {"code": None}
    if measured["code"] != 0:
        raise SystemExit(f"bench: {' '.join(command)} failed:\n{stderr[-3000:]}")
    return {
        "wall_s": round(measured["wall_s"], 2),
        "peak_rss_mb": round(measured["maxrss_kb"] / 1024),
        "stderr": stderr,
    }


def folder_benchmark(files: int, megabytes: float, config: str | None, env: dict) -> dict:
    """`minigpt train --data FOLDER --steps 1` on a folder of `files` files totalling `megabytes` MB,
    as a user runs it: first with an empty token cache (every file read, the tokenizer fitted to
    every head, every file encoded and the splits joined), then again with the cache warm. Wall time
    and peak resident memory of each."""
    with tempfile.TemporaryDirectory(prefix="minigpt-bench-folder-") as scratch:
        folder = Path(scratch) / "corpus"
        written = write_folder(folder, files, megabytes)
        child_env = {**env, "MINIGPT_CACHE": str(Path(scratch) / "cache")}
        command = [sys.executable, "-m", "minigpt", "train", "--data", str(folder), "--steps", "1"]
        command += ["--out", str(Path(scratch) / "run"), "--force"] + (["-c", config] if config else [])
        runs = []
        for _ in range(2):
            r = timed_process(command, child_env, ROOT)
            found = re.search(r"([\d,]+) train / ([\d,]+) val tokens", r.pop("stderr"))
            if found:
                r |= {"train_tokens": int(found[1].replace(",", "")), "val_tokens": int(found[2].replace(",", ""))}
            runs.append(r)
    return {
        "files": files,
        "megabytes": round(written / 1e6, 1),
        "command": "minigpt train --data FOLDER --steps 1" + (f" -c {config}" if config else ""),
        "first_run": runs[0],
        "cached_run": runs[1],
    }


def print_folder(f: dict) -> None:
    a, b = f["first_run"], f["cached_run"]
    print(
        f"folder of {f['files']:,} files, {f['megabytes']} MB ({f['command']}): first run {a['wall_s']} s, "
        f"peak {a['peak_rss_mb']} MB; with the cache {b['wall_s']} s, peak {b['peak_rss_mb']} MB"
    )


# ---------------------------------------------------------------- nanoGPT


class NanoGPT:
    """nanoGPT's unmodified files in a scratch folder, with its data prepared as its README says."""

    def __init__(self, anchor: Path, scratch: Path, env: dict):
        self.anchor, self.dir, self.env = anchor, scratch / "nano", env
        self.dir.mkdir(parents=True)
        for name in ("model.py", "train.py", "configurator.py"):
            shutil.copy(anchor / name, self.dir / name)
        done = subprocess.run(
            [sys.executable, str(anchor / "prepare_bpe.py"), "1024"],
            capture_output=True,
            text=True,
            env={**env, "NANOGPT_DIR": str(self.dir), "CORPUS": str(ROOT / "data" / "tinyshakespeare.txt")},
        )
        if done.returncode != 0:
            raise SystemExit(f"bench: nanoGPT data preparation failed:\n{done.stderr}")
        found = re.search(r"val_chars_per_token=([\d.]+)", done.stdout)
        text = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
        val = text[int(len(text) * 0.9) :]
        # bytes per token of its validation split (chars per token x bytes per char)
        self.val_bytes_per_token = float(found[1]) * len(val.encode("utf-8")) / len(val)

    def train(self, extra: list[str]) -> tuple[subprocess.CompletedProcess, float]:
        command = [
            sys.executable,
            "train.py",
            "--dataset=shakespeare_bpe1024",
            *NANO_SHAPE,
            *extra,
            f"--out_dir={self.dir / 'out'}",
        ]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=self.dir, env=self.env)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"bench: nanoGPT train.py failed:\n{done.stderr[-3000:]}")
        return done, wall

    def train_tokens_per_s(
        self, iters: int, bias: bool, shape: list[str] = (), tokens_per_iter: int = 64 * 32, skip: int = 10
    ) -> float:
        """Steady state: the median iteration time after the first `skip` (`shape` overrides the
        comparison shape: nanoGPT's configurator takes the last value given)."""
        done, _ = self.train(
            [
                *shape,
                "--bias=" + str(bias),
                f"--max_iters={iters}",
                f"--lr_decay_iters={iters}",
                "--eval_interval=100000",
                "--eval_iters=1",
                "--log_interval=1",
                "--always_save_checkpoint=False",
                "--learning_rate=1e-3",
                "--warmup_iters=10",
            ]
        )
        times = [float(t) for _, t in re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", done.stdout, re.M)]
        return tokens_per_iter / (statistics.median(times[skip:]) / 1000)

    def full_run(self, overrides: list[str] = ()) -> dict:
        """Its README's 2,000-iteration run (`overrides` change its shape or length: the last value
        given wins): wall time and the final validation loss."""
        done, wall = self.train([*NANO_RECIPE, *overrides])
        losses = re.findall(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)", done.stdout, re.M)
        step, _, val = losses[-1]
        return {
            "wall_s": round(wall, 1),
            "steps": int(step),
            "val_loss": float(val),
            "val_bpb": round(float(val) / math.log(2) / self.val_bytes_per_token, 4),
        }

    def model(self, vocab_size: int):
        sys.path.insert(0, str(self.anchor))
        try:
            from model import GPT, GPTConfig  # nanoGPT's model.py
        finally:
            sys.path.remove(str(self.anchor))
        torch.manual_seed(0)
        return GPT(
            GPTConfig(block_size=32, vocab_size=vocab_size, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=True)
        ).eval()


def nanogpt_sampling(model, new_tokens: int, repeats: int = 3) -> float:
    """nanoGPT's `GPT.generate` at batch 1 from one token, temperature 1: tokens/s, best of `repeats`."""
    best = math.inf
    with torch.no_grad():
        model.generate(torch.zeros(1, 1, dtype=torch.long), 16)
        for _ in range(repeats):
            started = time.perf_counter()
            model.generate(torch.zeros(1, 1, dtype=torch.long), new_tokens, temperature=1.0)
            best = min(best, time.perf_counter() - started)
    return new_tokens / best


# ---------------------------------------------------------------- the report


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


# One timed training session in a child process of either version: the real `Trainer.train_step`
# at the comparison shape, tokens/s of the best of its rounds. Both layouts of the package are
# named, so that a checkout from before the subpackages can be timed beside this one.
VERSION_STEP_CHILD = r"""
import json, sys, time
import torch
try:
    from minigpt.training.session import build
    from minigpt.training.trainer import Trainer
    from minigpt.text.corpus import load_corpus
    from minigpt.device import keep_freed_memory
except ImportError:
    from minigpt.session import build
    from minigpt.trainer import Trainer
    from minigpt.data import load_corpus
    from minigpt.device import keep_freed_memory
from minigpt.config import load_config
keep_freed_memory()
shape, steps, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cfg = load_config(None, shape)
trainer = Trainer(build(cfg, load_corpus(cfg), "cpu"))
trainer.session.model.train()
for _ in range(3):
    trainer.train_step()
best = 0.0
for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    best = max(best, steps * trainer.session.tokens_per_step / (time.perf_counter() - start))
print(json.dumps({"tokens_per_s": best}))
"""

# Sampling as the Python API does it (minigpt.load(run).samples), on one thread, in either version.
VERSION_SAMPLE_CHILD = r"""
import json, sys
import minigpt
run = minigpt.load(sys.argv[1])
tokens, best = int(sys.argv[2]), 0.0
for seed in range(int(sys.argv[3])):
    result = run.samples("\n", max_new_tokens=tokens, temperature=1.0, seed=seed)[0]
    best = max(best, len(result.token_ids) / result.seconds)
print(json.dumps({"tokens_per_s": best}))
"""


def patching_benchmark(config: str | None, peak_float32: float, repeats: int = 2) -> dict:
    """Seconds of each patching sweep (best of `repeats`), on GPT-2 small's shape and the default
    config's shape with random weights, and the arithmetic the sweep computes (forward FLOPs of
    the rows it recomputes), so the figure can be set against the float32 matmul peak."""
    from minigpt.config import ModelConfig
    from minigpt.inspection.patching import patch, sweep
    from minigpt.model.gpt import MiniGPT

    class Numbered:
        def token_text(self, i: int) -> str:
            return f"t{i}"

    shapes = {
        "gpt2_small": (ModelConfig(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, context=1024), 50257),
        "default": (load_config(config).model, 1024),
    }
    out = {}
    for name, (cfg, vocab) in shapes.items():
        torch.manual_seed(0)
        model = MiniGPT(cfg, vocab).eval()
        length = min(20, cfg.context)
        clean = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(1)).tolist()
        for where in (length // 2, 0):
            corrupt = list(clean)
            corrupt[where] = (corrupt[where] + 1) % vocab
            for by in ("stage", "head"):
                best = math.inf
                for _ in range(repeats):
                    started = time.perf_counter()
                    patch(model, Numbered(), clean, corrupt, 1, 2, by=by)
                    best = min(best, time.perf_counter() - started)
                flops = _patching_flops(cfg, sweep(cfg.n_layer, cfg.n_head, length, by), length, where)
                out[f"{name}_{by}_changed_at_{where}"] = {
                    "seconds": round(best, 3),
                    "tflop": round(flops / 1e12, 3),
                    "seconds_at_float32_peak": round(flops / (peak_float32 * 1e9), 3),
                }
                print(f"  patching {name} by {by}, token {where} changed: {best:.2f} s", file=sys.stderr, flush=True)
    return out


def _patching_flops(cfg, patches, length: int, changed: int) -> float:
    """The matmul FLOPs of the rows a sweep must recompute at least: a patch at block i first
    changing row r recomputes rows r.. of blocks i.. (the last block's FFN and head for the last
    row alone is not counted apart); patches before the changed token, or past the last block's
    attention at an earlier row, compute nothing, and a block's output is the next block's input
    (one patch). Batching neighbouring rows together computes somewhat more, faster."""
    per_row = 2 * (4 * cfg.n_embd * cfg.n_embd + 2 * cfg.n_embd * cfg.ffn_hidden)  # QKV, W_O, W1, W2
    total = 0.0
    last = cfg.n_layer - 1
    for item in patches:
        first = changed if item.position is None else item.position
        if first < changed or (item.block == last and item.stage != "input" and first < length - 1):
            continue
        if item.stage == "output" and item.block < last:  # the same patch as the next block's input
            continue
        total += per_row * (length - first) * (cfg.n_layer - item.block)
    return total


def versions_benchmark(other: Path, env: dict, scratch: Path, rounds: int = 3) -> dict:
    """This checkout ("this") against the one at `other`: every figure of each in child processes
    whose PYTHONPATH names that checkout, the two alternating round by round, the best round of
    each counting. The run sampled from is trained here once, by the other version, usually the
    older: a newer version reads an older run folder (config keys added since read as their
    defaults), not the reverse."""
    versions = {"this": ROOT, "other": other.resolve()}
    envs = {name: {**env, "PYTHONPATH": str(root)} for name, root in versions.items()}
    run = scratch / "versions-run"
    # Every child runs in the scratch folder: `python -m minigpt` started in a checkout would import
    # that checkout's package first, whatever PYTHONPATH says.
    done = subprocess.run(train_command(None, run, 60), capture_output=True, text=True, env=envs["other"], cwd=scratch)
    if done.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{done.stderr}")
    shape = load_config(None, SHAPE)
    per_step = shape.train.batch_size * shape.train.grad_accum * shape.model.context
    sample = [sys.executable, "-m", "minigpt", "sample", "--run", str(run), "-p", "ROMEO:", "-n", "200"]
    figures: dict[str, dict[str, list[float]]] = {
        name: {"train_step": [], "cli": [], "sampling": [], "sample_200_s": []} for name in versions
    }

    def child(code: str, args: list[str], name: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=envs[name], cwd=scratch
        )
        if done.returncode != 0:
            raise SystemExit(f"bench: the {name} version failed:\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]

    for _ in range(rounds):
        for name in versions:
            f = figures[name]
            f["train_step"].append(child(VERSION_STEP_CHILD, [json.dumps(SHAPE), "30", "2"], name))
            f["cli"].append(cli_tokens_per_s(None, SHAPE, 300, per_step, scratch / f"cli-{name}", envs[name], scratch))
            f["sampling"].append(child(VERSION_SAMPLE_CHILD, [str(run), "1000", "2"], name))
            best = math.inf
            for _ in range(3):
                started = time.perf_counter()
                done = subprocess.run(sample, capture_output=True, text=True, env=envs[name], cwd=scratch)
                if done.returncode != 0:
                    raise SystemExit(f"bench: {' '.join(sample)} failed ({name}):\n{done.stderr}")
                best = min(best, time.perf_counter() - started)
            f["sample_200_s"].append(best)
    return {"other": str(versions["other"]), "runs": figures}


# docs/guide/fine-tune.md's GPT-2 small recipe (nanoGPT's finetune_shakespeare at a 128-token window):
# AdamW at a constant 3e-5, 8 windows x 4 micro-steps per step.
FINE_TUNE = [
    'train.optimizer="adamw"', "train.learning_rate=3e-5", "train.min_lr=3e-5", "train.warmup_steps=0",
    "train.weight_decay=0", "train.batch_size=8", "train.grad_accum=4", "train.eval_interval=1000",
    "train.eval_batches=2", "train.checkpoint_interval=1000", "train.log_interval=1",
]  # fmt: skip
FINE_TUNE_VARIANTS = {
    "full": [],
    "full, recompute": ["train.recompute=true"],
    "lora r8": ["train.lora_rank=8"],
    "lora r8, recompute": ["train.lora_rank=8", "train.recompute=true"],
}
GPT2_SHAPES = {
    "gpt2_small": dict(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072),
    "gpt2_medium": dict(n_layer=24, n_head=16, n_embd=1024, ffn_hidden=4096),
}


def lora_benchmark(env: dict, scratch: Path, steps: int = 4) -> dict:
    """The fine-tune recipe through the CLI (`minigpt train --init-from RUN`), on GPT-2 small's and
    medium's shapes at random (50,257 rows, context 128, scripts/bench_explore.py's builder), in full
    and with LoRA (rank 8 on qkv, out, W1, W2), with and without [train] recompute: the peak
    resident memory of the whole process, and the seconds per step (the median of the steps after
    the first, from the metrics log). Medium runs the LoRA variants alone."""
    spec = importlib.util.spec_from_file_location("bench_explore", ROOT / "scripts" / "bench_explore.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    out = {}
    for shape, sizes in GPT2_SHAPES.items():
        base = builder.write_gpt2_shaped_run(scratch / shape, **sizes, context=128, vocab_size=50257)
        for variant, changes in FINE_TUNE_VARIANTS.items():
            if shape == "gpt2_medium" and not variant.startswith("lora"):
                continue
            run = scratch / f"{shape}-{variant.replace(' ', '').replace(',', '-')}"
            command = train_command(None, run, steps, [*FINE_TUNE, *changes])
            command += ["--init-from", str(base), "--data", str(ROOT / "data" / "tinyshakespeare.txt")]
            measured = timed_process(command, env, ROOT)
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            elapsed = [r["elapsed_s"] for r in records if "elapsed_s" in r and not r.get("eval")]
            per_step = statistics.median(b - a for a, b in zip(elapsed, elapsed[1:]))
            out[f"{shape}: {variant}"] = {"peak_rss_gb": round(measured["peak_rss_mb"] / 1024, 2),
                                          "step_s": round(per_step, 2), "wall_s": measured["wall_s"]}  # fmt: skip
            print(f"  {shape}: {variant}: {out[f'{shape}: {variant}']}", file=sys.stderr, flush=True)
            shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    return out


def lora_rows(lora: dict, row) -> None:
    full = lora.get("gpt2_small: full")
    for name, figures in lora.items():
        reference = full if full and name.startswith("gpt2_small") and name != "gpt2_small: full" else None
        target = "<= x0.5" if reference else ""
        row(f"fine-tune {name}: peak resident (GB; ref.: full)", figures["peak_rss_gb"],
            reference and reference["peak_rss_gb"], "GB", target, "of-reference")  # fmt: skip
        row(f"fine-tune {name}: s per step (ref.: full)", figures["step_s"], reference and reference["step_s"], "s",
            "<= x1" if reference else "", "of-reference")  # fmt: skip


TASKS = ("reverse", "sort", "copy", "add")


def tasks_benchmark(env: dict, scratch: Path) -> dict:
    """Each shipped task config as a user runs it: `minigpt train -c configs/TASK.toml` (its wall
    time, start to exit, and the seconds of training its metrics log records), then `minigpt eval
    --json` on the held-out examples (exact-match accuracy). Target: at least 99% in at most 60 s."""
    out = {}
    for name in TASKS:
        run = scratch / f"task-{name}"
        trained = timed_process(train_command(str(ROOT / "configs" / f"{name}.toml"), run), env, ROOT)
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        training_s = max(r.get("elapsed_s", 0.0) for r in steps)
        evaluated = subprocess.run(
            [sys.executable, "-m", "minigpt", "eval", "--run", str(run), "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        report = json.loads(evaluated.stdout)
        out[name] = {
            "wall_s": trained["wall_s"],
            "training_s": round(training_s, 2),
            "accuracy": report["accuracy"],
            "per_position": [round(p, 4) for p in report["per_position"]],
            "examples": report["examples"],
        }
        print(f"  task {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def tasks_rows(tasks: dict, row) -> None:
    for name, figures in tasks.items():
        row(f"task {name}: held-out exact match (%)", round(100 * figures["accuracy"], 2), None, "%", ">= 99")
        row(f"task {name}: `minigpt train` start to exit (s)", figures["wall_s"], None, "s", "<= 60")


POSITION_SCHEMES = ("learned", "rope", "alibi")


def positions_benchmark(config: str | None, env: dict, scratch: Path, steps: int = 100, rounds: int = 3) -> dict:
    """Rotary and ALiBi positions against the learned table at the comparison shape, as a user runs
    each: `minigpt train --set model.positions=...` (a subprocess; tokens/s over its metrics log),
    rounds alternating between the schemes, the best round of each; then sampling at batch 1 in
    this process (bench_sampling: 1000 tokens, sliding window past the context, so every step past
    it recomputes a full window and its rotations) on each scheme's fresh model. Target: rope
    within 10% of learned in both."""
    cfg = load_config(config, SHAPE)
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
    train: dict[str, list[float]] = {scheme: [] for scheme in POSITION_SCHEMES}
    for _ in range(rounds):
        for scheme in POSITION_SCHEMES:
            changes = [*SHAPE, f'model.positions="{scheme}"']
            out = scratch / f"positions-{scheme}"
            train[scheme].append(cli_tokens_per_s(config, changes, steps, per_step, out, env))
    sampling = {}
    corpus = load_corpus(cfg)
    for scheme in POSITION_SCHEMES:
        torch.manual_seed(0)
        model = MiniGPT(load_config(config, [*SHAPE, f'model.positions="{scheme}"']).model, corpus.tokenizer.vocab_size)
        sampling[scheme] = bench_sampling(model, corpus.tokenizer)
    return {
        "train_tokens_per_s": {scheme: [round(x) for x in runs] for scheme, runs in train.items()},
        "sampling": sampling,
    }


RESIDUAL_MODES = {"residual": "true", "attention residuals": '"attention"'}


def residuals_benchmark(config: str | None, env: dict, scratch: Path, steps: int = 60, rounds: int = 3) -> dict:
    """Attention Residuals against the ordinary residual, as a user trains each: `minigpt train
    --set model.residual=...` (a subprocess; tokens/s over its metrics log) at the default shape
    (4 blocks) and at 12 blocks, rounds alternating between the two, the best round of each. The
    issue asks for the ratio, not a target: the mix over depth costs O(L) per layer, so the ratio
    grows with depth."""
    out: dict[str, dict[str, list[int]]] = {}
    for n_layer in (4, 12):
        shape = [f"model.n_layer={n_layer}", "train.batch_size=16"]
        per_step = load_config(config, shape).train.batch_size * load_config(config, shape).model.context
        runs: dict[str, list[float]] = {mode: [] for mode in RESIDUAL_MODES}
        for _ in range(rounds):
            for mode, value in RESIDUAL_MODES.items():
                changes = [*shape, f"model.residual={value}"]
                folder = scratch / f"residual-{n_layer}-{mode.replace(' ', '-')}"
                runs[mode].append(cli_tokens_per_s(config, changes, steps, per_step, folder, env))
        out[f"{n_layer} blocks"] = {mode: [round(x) for x in values] for mode, values in runs.items()}
    return {"train_tokens_per_s": out}


def residuals_rows(residuals: dict, row) -> None:
    for shape, runs in residuals["train_tokens_per_s"].items():
        row(
            f"train tokens/s, attention residuals, {shape} (nanoGPT column: the ordinary residual)",
            max(runs["attention residuals"]),
            max(runs["residual"]),
            "tokens/s",
            "",
        )


def positions_rows(positions: dict, row) -> None:
    train, sampling = positions["train_tokens_per_s"], positions["sampling"]
    for scheme in POSITION_SCHEMES[1:]:
        row(
            f"train tokens/s, positions {scheme} (nanoGPT column: learned)",
            max(train[scheme]),
            max(train["learned"]),
            "tokens/s",
            ">= 0.9x" if scheme == "rope" else "",
        )
        for mode in ("with_kv_cache", "without_kv_cache"):
            row(
                f"sampling tokens/s {mode.replace('_', ' ')}, positions {scheme} (nanoGPT column: learned)",
                sampling[scheme][f"{mode}_tokens_per_s"],
                sampling["learned"][f"{mode}_tokens_per_s"],
                "tokens/s",
                ">= 0.9x" if scheme == "rope" else "",
            )


def patching_rows(patching: dict, row) -> None:
    for name, figures in patching.items():
        target = "< 10 s" if name.startswith("gpt2_small") else "< 1 s"
        row(
            f"patching sweep {name} (s; ref.: at the float32 peak)",
            figures["seconds"],
            figures["seconds_at_float32_peak"],
            "s",
            target,
            "of-reference",
        )


def versions_rows(versions: dict, row) -> None:
    this, other = versions["runs"]["this"], versions["runs"]["other"]
    for key, label, better in (
        ("train_step", "training step tokens/s (Trainer.train_step, comparison shape)", "higher"),
        ("cli", "`minigpt train` (CLI) steady tokens/s, comparison shape", "higher"),
        ("sampling", "sampling tokens/s through the API (run.samples, 1,000 tokens, one thread)", "higher"),
        ("sample_200_s", "`minigpt sample -p ROMEO: -n 200` s, start to exit", "of-reference"),
    ):
        pick = min if better == "of-reference" else max
        digits = 3 if key == "sample_200_s" else 0
        row(
            f"{label}: this checkout (nanoGPT column: {versions['other']})",
            round(pick(this[key]), digits) or None,
            round(pick(other[key]), digits) or None,
            "s" if key == "sample_200_s" else "tokens/s",
            "within noise",
            better=better,
        )


# ---------------------------------------------------------------- the Llama family (issue 37)

LLAMA_SHAPE = "smollm2-135m"  # scripts/random_hf_folder.py's SmolLM2-135M shape: 30 blocks, 9 heads, 3 kv heads
LLAMA_MEMORY_SHAPES = ("qwen2.5-0.5b", "llama-3.2-1b")  # stored in bfloat16, as the real ones are


def random_hf_folder(out: Path, shape: str, dtype: str, env: dict) -> Path:
    """A random-weight folder of a real checkpoint's shape, written by scripts/random_hf_folder.py
    (transformers itself) in a child process, so that its memory is never this process's."""
    command = [sys.executable, str(ROOT / "scripts" / "random_hf_folder.py"), "--shape", shape, "--dtype", dtype]
    done = subprocess.run([*command, str(out)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench: scripts/random_hf_folder.py --shape {shape} failed:\n{done.stderr[-3000:]}")
    return out


def import_command(folder: Path, run: Path) -> list[str]:
    return [sys.executable, "-m", "minigpt", "import", "hf", str(folder), "--out", str(run), "--force"]


def equal_length_prompts(tokenizer, length: int = 20) -> tuple[str, str]:
    """Two texts of `length` tokens each (lines of the shipped corpus) that differ in one word near
    the middle, as `minigpt patch` takes them."""
    words = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000].split()
    for start in range(0, len(words) - 60, 7):
        for n in range(3, 60):
            clean = words[start : start + n]
            found = len(tokenizer.encode(" ".join(clean)))
            if found > length:
                break
            if found < length:
                continue
            middle = n // 2
            for other in words[:500]:
                corrupt = [*clean[:middle], other, *clean[middle + 1 :]]
                if other != clean[middle] and len(tokenizer.encode(" ".join(corrupt))) == length:
                    return " ".join(clean), " ".join(corrupt)
    raise SystemExit(f"bench: no two texts of {length} tokens found for the patching sweep")


def llama_sampling(run_dir: Path, folder: Path, new_tokens: int, rounds: int, thread_counts: list[int]) -> dict:
    """Greedy sampling at batch 1 from a short prompt: minigpt through its API as `minigpt sample`
    runs it (`minigpt.load(RUN).samples(prompt, max_new_tokens=N, greedy=True)`, tokens/s over the
    result's own seconds: the generation, model load excluded) against transformers' `generate`
    (do_sample=False, use_cache=True, the same prompt ids, no end-of-text stop, float32) on the
    folder the run was imported from, at each thread count (one is what `minigpt sample` uses for
    one sample), rounds alternating between the two, the best round of each. Both compute in
    float32 from the same weights, so the greedy tokens should agree; where they do not, the first
    step that differs is reported. Beside them, minigpt's loop with every step on the model itself
    (`generate(..., fast_path=False)`: no decoding copy, sampling/decoding.py), what that copy adds."""
    import transformers

    import minigpt

    prompt = "ROMEO:"
    runs = {t: minigpt.load(run_dir, set={"train.threads": t}) for t in thread_counts}
    prompt_ids = next(iter(runs.values())).tokenizer.encode(prompt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # minigpt stops at max_new_tokens (or stop text), never at an id
    hf.generation_config.pad_token_id = 0

    def transformers_generate(threads: int, tokens: int) -> tuple[list[int], float]:
        torch.set_num_threads(threads)
        ids = torch.tensor([prompt_ids])
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens, use_cache=True
            )
        return out[0, len(prompt_ids) :].tolist(), time.perf_counter() - started

    def minigpt_sample(threads: int, tokens: int) -> tuple[list[int], float]:
        result = runs[threads].samples(prompt, max_new_tokens=tokens, greedy=True)[0]
        return result.token_ids, result.seconds

    def minigpt_model_itself(threads: int, tokens: int) -> tuple[list[int], float]:
        # the same loop with fast_path=False: every step on the model itself, no decoding copy
        torch.set_num_threads(threads)
        steps = generate(
            runs[threads].model, prompt_ids, SampleConfig(max_new_tokens=tokens, greedy=True), fast_path=False
        )
        started = time.perf_counter()
        ids = torch.cat([step.tokens for step in steps]).tolist()
        return ids, time.perf_counter() - started

    systems = {"minigpt": minigpt_sample, "minigpt_model_itself": minigpt_model_itself}
    systems["transformers"] = transformers_generate
    for threads in thread_counts:  # kernels and allocator warmed outside the clock
        for measure in systems.values():
            measure(threads, 8)
    best: dict[tuple[str, int], float] = {}
    tokens: dict[tuple[str, int], list[int]] = {}
    for _ in range(rounds):
        for threads in thread_counts:
            for name, measure in systems.items():
                ids, seconds = measure(threads, new_tokens)
                tokens[name, threads] = ids
                best[name, threads] = min(best.get((name, threads), math.inf), seconds)
    torch.set_num_threads(thread_counts[-1])
    out = {"prompt": prompt, "prompt_tokens": len(prompt_ids), "new_tokens": new_tokens}
    for threads in thread_counts:
        mine, theirs = tokens["minigpt", threads], tokens["transformers", threads]
        differs = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if differs is None and len(mine) != len(theirs):
            differs = min(len(mine), len(theirs))
        out[f"threads_{threads}"] = {
            "minigpt_tokens_per_s": round(len(mine) / best["minigpt", threads], 2),
            "minigpt_model_itself_tokens_per_s": round(new_tokens / best["minigpt_model_itself", threads], 2),
            "transformers_tokens_per_s": round(len(theirs) / best["transformers", threads], 2),
            "ratio": round(best["transformers", threads] / best["minigpt", threads], 2),
            "same_tokens": differs is None,
            "first_different_step": differs,
        }
    return out


def llama_benchmark(
    env: dict,
    scratch: Path,
    folder: Path | None = None,
    new_tokens: int = 200,
    rounds: int = 3,
    shape: str = LLAMA_SHAPE,
) -> dict:
    """An imported Llama-family model, SmolLM2-135M-shaped with random weights (`folder`, or one
    written here by scripts/random_hf_folder.py): `minigpt import hf FOLDER --out RUN` start to
    exit (and its peak resident memory); greedy sampling against transformers' `generate`
    (llama_sampling); and `minigpt patch --by stage` on two 20-token prompts that differ in one
    word, start to exit, beside the sweep alone through the API (`Run.patch`, model loaded)."""
    import minigpt

    model = f"{shape} shape" if folder is None else f"folder {folder.name}"
    if folder is None:
        folder = random_hf_folder(scratch / f"{shape}-folder", shape, "float32", env)
    run_dir = scratch / f"{shape}-run"
    imported = timed_process(import_command(folder, run_dir), env, scratch)
    out: dict = {
        "model": model,
        "folder": str(folder),
        "import": {"wall_s": imported["wall_s"], "peak_rss_gib": round(imported["peak_rss_mb"] / 1024, 2)},
    }
    print(f"  import hf, {model}: {out['import']}", file=sys.stderr, flush=True)
    threads = torch.get_num_threads()
    out["sampling"] = llama_sampling(run_dir, folder, new_tokens, rounds, sorted({1, threads}))
    print(f"  sampling, {model}: {out['sampling']}", file=sys.stderr, flush=True)
    torch.set_num_threads(threads)
    run = minigpt.load(run_dir)
    clean, corrupt = equal_length_prompts(run.tokenizer)
    answer, versus = "#" + str(run.tokenizer.encode(" the")[-1]), "#" + str(run.tokenizer.encode(" a")[-1])
    command = [sys.executable, "-m", "minigpt", "patch", "--run", str(run_dir), "--clean", clean]
    command += ["--corrupt", corrupt, "--answer", answer, "--versus", versus, "--by", "stage"]
    cli = min(timed_process(command, env, scratch)["wall_s"] for _ in range(2))
    sweep = math.inf
    for _ in range(2):
        started = time.perf_counter()
        run.patch(clean, corrupt, answer, versus, by="stage")
        sweep = min(sweep, time.perf_counter() - started)
    out["patch"] = {
        "tokens": len(run.tokenizer.encode(clean)),
        "command_s": cli,
        "sweep_s": round(sweep, 2),
        "threads": run.cfg.train.threads or threads,
    }
    print(f"  patch --by stage, {model}: {out['patch']}", file=sys.stderr, flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def llama_rows(llama: dict, row) -> None:
    sampling = llama["sampling"]
    for key, figures in sampling.items():
        if not key.startswith("threads_"):
            continue
        threads = key.removeprefix("threads_")
        same = "same tokens" if figures["same_tokens"] else f"tokens differ from step {figures['first_different_step']}"
        row(
            f"sample tokens/s, {llama['model']}, {sampling['new_tokens']} new tokens, greedy, {threads} thread(s); "
            f"{same} (nanoGPT column: transformers' generate)",
            figures["minigpt_tokens_per_s"],
            figures["transformers_tokens_per_s"],
            "tokens/s",
            ">= 1.5x",
        )
        row(
            f"the same, {threads} thread(s), every step on the model itself (fast_path=False: no decoding copy)",
            figures["minigpt_model_itself_tokens_per_s"],
            figures["transformers_tokens_per_s"],
            "tokens/s",
            "",
        )
    row(f"`minigpt import hf`, {llama['model']}, start to exit (s; peak {llama['import']['peak_rss_gib']} GiB)",
        llama["import"]["wall_s"], None, "s", "")  # fmt: skip
    p = llama["patch"]
    row(f"`minigpt patch --by stage`, {p['tokens']}-token prompts, {llama['model']}, start to exit (s)",
        p["command_s"], None, "s", "")  # fmt: skip
    row(f"the same sweep through the API, model loaded ({p['threads']} threads) (s)", p["sweep_s"], None, "s", "")


def safetensors_elements(folder: Path) -> tuple[int, int]:
    """(numbers stored, bytes of the weight files) of a folder's safetensors, from their headers."""
    from safetensors import safe_open

    elements, size = 0, 0
    for path in sorted(folder.glob("*.safetensors")):
        size += path.stat().st_size
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                elements += math.prod(f.get_slice(name).get_shape())
    return elements, size


def llama_memory_benchmark(env: dict, scratch: Path, shapes=LLAMA_MEMORY_SHAPES, build=random_hf_folder) -> dict:
    """`minigpt import hf` of random-weight folders of Qwen2.5-0.5B's and Llama-3.2-1B's shapes,
    stored in bfloat16 as the real ones are (minigpt widens them to float32, exactly): the peak
    resident memory of the import process alone (timed_process), beside the model's float32 size
    and the weight file's size. The issue's bound: no two float32 copies held longer than needed,
    read here as a peak of at most 1.3 x the float32 size plus the file (which the import maps,
    and the kernel counts as resident once read). Each folder and run is deleted once measured
    (the 1B folder is 2.5 GB, its run 5 GB; building it takes about 6 GB and a minute)."""
    out = {}
    for shape in shapes:
        folder, run_dir = scratch / f"{shape}-folder", scratch / f"{shape}-run"
        try:
            build(folder, shape, "bfloat16", env)
            elements, file_bytes = safetensors_elements(folder)
            measured = timed_process(import_command(folder, run_dir), env, scratch)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(run_dir, ignore_errors=True)
        float32 = 4 * elements
        peak = measured["peak_rss_mb"] * 2**20
        out[shape] = {
            "parameters": elements,
            "float32_gib": round(float32 / 2**30, 2),
            "file_gib": round(file_bytes / 2**30, 2),
            "peak_rss_gib": round(peak / 2**30, 2),
            "bound_gib": round((1.3 * float32 + file_bytes) / 2**30, 2),
            "wall_s": measured["wall_s"],
        }
        print(f"  import hf {shape} (bfloat16): {out[shape]}", file=sys.stderr, flush=True)
    return out


def llama_memory_rows(memory: dict, row) -> None:
    for shape, f in memory.items():
        row(
            f"`minigpt import hf` {shape} shape, bfloat16 file of {f['file_gib']} GiB, float32 model "
            f"{f['float32_gib']} GiB: peak resident GiB (ref.: 1.3 x float32 + file)",
            f["peak_rss_gib"],
            f["bound_gib"],
            "GiB",
            "<= x1.0",
            "of-reference",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default=None, help="minigpt config (default: configs/default.toml)")
    parser.add_argument(
        "--nanogpt", type=Path, default=None, help="nanoGPT's files (shared/anchors/nanogpt): measure it side by side"
    )
    parser.add_argument(
        "--quick", action="store_true", help="skip the full training runs, the startup timing and the 100 MB text"
    )
    parser.add_argument("--train-steps", type=int, default=30, help="timed training steps per variant")
    parser.add_argument("--new-tokens", type=int, default=1000, help="tokens generated per sampling run")
    parser.add_argument(
        "--llama-tokens", type=int, default=200, help="tokens generated per sampling run of the Llama-family section"
    )
    parser.add_argument("--large-mb", type=int, default=100, help="size of the generated large text")
    parser.add_argument("--folder-files", type=int, default=1000, help="files in the generated folder")
    parser.add_argument("--folder-mb", type=float, default=200, help="size of the generated folder, in all")
    parser.add_argument(
        "--only",
        choices=[
            "folder",
            "cli",
            "quality",
            "versions",
            "patching",
            "tasks",
            "lora",
            "positions",
            "residuals",
            "llama",
            "llama-memory",
        ],
        default=None,
        help="measure this part alone (and the machine), nothing else",
    )
    parser.add_argument(
        "--json-out",
        type=Path,
        default=ROOT / "runs" / "bench.json",
        help="where the JSON report goes (default: runs/bench.json)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="with --only versions: another minigpt checkout to measure side by side with this one",
    )
    parser.add_argument(
        "--llama-folder",
        type=Path,
        default=None,
        help="with --only llama: a SmolLM-shaped Hugging Face folder to use (default: one written by "
        "scripts/random_hf_folder.py)",
    )
    parser.add_argument("--table", type=Path, default=None, help="print the table of a saved JSON report and stop")
    args = parser.parse_args()
    if args.table:
        print_table(json.loads(args.table.read_text(encoding="utf-8")), default_config="configs/default.toml")
        return

    from minigpt.device import keep_freed_memory

    keep_freed_memory()  # as `minigpt train` does, so the in-process training figures are its own
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-bench-"))
    env.setdefault("MINIGPT_CACHE", str(scratch / "cache"))
    os.environ["MINIGPT_CACHE"] = env["MINIGPT_CACHE"]
    threads = torch.get_num_threads()
    report: dict = {"machine": machine(), "config": args.config or "configs/default.toml", "rows": []}
    rows = report["rows"]
    if args.only == "folder":
        try:
            report["folder"] = folder_benchmark(args.folder_files, args.folder_mb, args.config, env)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print_folder(report["folder"])
        print(f"\n(JSON: {args.json_out})")
        return

    def row(name: str, minigpt: float | None, nanogpt: float | None, unit: str, target: str, better: str = "higher"):
        # "higher": minigpt / nanoGPT; "lower": nanoGPT / minigpt (both: bigger is better for minigpt);
        # "of-reference": minigpt / the reference in the nanoGPT column (a cost ratio: smaller is better)
        r = {
            "figure": name,
            "minigpt": minigpt,
            "nanogpt": nanogpt,
            "unit": unit,
            "target": target,
            "ratio": {
                "higher": ratio(minigpt, nanogpt),
                "lower": ratio(nanogpt, minigpt),
                "of-reference": ratio(minigpt, nanogpt),
            }[better],
        }
        rows.append(r)
        print(
            f"  {name}: minigpt {minigpt} {unit}" + (f", nanoGPT {nanogpt}, x{r['ratio']}" if nanogpt else ""),
            file=sys.stderr,
            flush=True,
        )

    def alone(name: str, measure, rows_of) -> None:
        """--only NAME: that part measured (with the scratch folder removed after), its rows, the
        table and the JSON report."""
        try:
            report[name] = measure()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        rows_of(report[name], row)
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print_rows(report)
        print(f"\n(JSON: {args.json_out})")

    if args.only == "versions":
        if args.against is None or not (args.against / "minigpt").is_dir():
            raise SystemExit("bench: --only versions needs --against DIR, a minigpt checkout (it holds minigpt/)")
        alone("versions", lambda: versions_benchmark(args.against, env, scratch), versions_rows)
        return
    if args.only in ("lora", "tasks"):
        measure = {"lora": lora_benchmark, "tasks": tasks_benchmark}[args.only]
        alone(args.only, lambda: measure(env, scratch), {"lora": lora_rows, "tasks": tasks_rows}[args.only])
        return
    if args.only == "positions":
        alone("positions", lambda: positions_benchmark(args.config, env, scratch), positions_rows)
        return
    if args.only == "residuals":
        alone("residuals", lambda: residuals_benchmark(args.config, env, scratch), residuals_rows)
        return
    if args.only == "llama":
        folder = args.llama_folder.resolve() if args.llama_folder else None
        alone("llama", lambda: llama_benchmark(env, scratch, folder, args.llama_tokens), llama_rows)
        return
    if args.only == "llama-memory":
        alone("llama_memory", lambda: llama_memory_benchmark(env, scratch), llama_memory_rows)
        return
    if args.only == "patching":
        report["matmul_gflops"] = {"float32": round(matmul_peak(torch.float32))}
        report["patching"] = patching_benchmark(args.config, report["matmul_gflops"]["float32"])
        patching_rows(report["patching"], row)
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print_rows(report)
        print(f"\n(JSON: {args.json_out})")
        return
    if args.only in ("cli", "quality"):
        try:
            report["matmul_gflops"] = {
                "float32": round(matmul_peak(torch.float32)),
                "bfloat16": round(matmul_peak(torch.bfloat16)),
            }
            nano = NanoGPT(args.nanogpt.resolve(), scratch, env) if args.nanogpt else None
            if args.only == "cli":
                report["cli"] = cli_benchmark(args.config, nano, env, scratch, report["matmul_gflops"], threads)
            else:
                report["quality"] = time_to_quality(args.config, nano, env, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if args.only == "cli":
            cli_rows(report["cli"], row)
        else:
            quality_rows(report["quality"], row)
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print_rows(report)
        print(f"\n(JSON: {args.json_out})")
        return
    try:
        report["matmul_gflops"] = {
            "float32": round(matmul_peak(torch.float32)),
            "bfloat16": round(matmul_peak(torch.bfloat16)),
        }
        nano = NanoGPT(args.nanogpt.resolve(), scratch, env) if args.nanogpt else None
        torch.set_num_threads(threads)

        # training throughput at the comparison shape
        shape = load_config(args.config, SHAPE)
        corpus = load_corpus(shape)
        default_precision = shape.train.precision

        # Rounds alternate between the variants (nanoGPT between them), best round each.
        def variant(*changes: str) -> TrainTimer:
            return TrainTimer(load_config(args.config, SHAPE + list(changes)), corpus, threads)

        timers = {
            "fast": TrainTimer(shape, corpus, threads),
            "float32": variant('train.precision="float32"'),
            "adamw": variant('train.optimizer="adamw"'),
            "adamw_float32": variant('train.optimizer="adamw"', 'train.precision="float32"'),
        }
        nano_runs: dict[bool, list[float]] = {True: [], False: []}
        for round_number in range(3):
            for timer in timers.values():
                timer.round(args.train_steps)
            if nano:
                nano_runs[round_number % 2 == 0].append(nano.train_tokens_per_s(60, bias=round_number % 2 == 0))
        torch.set_num_threads(threads)
        fast, fp32 = timers["fast"].best, timers["float32"].best
        adamw, adamw_fp32 = timers["adamw"].best, timers["adamw_float32"].best
        nano_train = max(nano_runs[True]) if nano_runs[True] else None
        nano_train_nobias = max(nano_runs[False]) if nano_runs[False] else None
        row(
            f"train tokens/s at the shape (default recipe: {shape.train.optimizer}, precision {default_precision})",
            round(fast),
            round(nano_train or 0) or None,
            "tokens/s",
            ">= 2.5x",
        )
        row("train tokens/s at the shape, float32", round(fp32), round(nano_train or 0) or None, "tokens/s", "")
        row(
            f"train tokens/s at the shape, AdamW (precision {default_precision})",
            round(adamw),
            round(nano_train or 0) or None,
            "tokens/s",
            "",
        )
        row(
            "train tokens/s at the shape, AdamW, float32",
            round(adamw_fp32),
            round(nano_train or 0) or None,
            "tokens/s",
            "",
        )
        if nano_train_nobias:
            report["nanogpt_train_tokens_per_s_bias_off"] = round(nano_train_nobias)
        flops = training_flops_per_token(MiniGPT(shape.model, corpus.tokenizer.vocab_size))
        lowered = default_precision == "bfloat16" or default_precision == "auto" and report["machine"]["cpu_bfloat16"]

        # sampling at batch 1
        default = load_config(args.config)
        torch.manual_seed(0)
        model = MiniGPT(shape.model, corpus.tokenizer.vocab_size).eval()
        torch.set_num_threads(1)  # as `minigpt sample` runs one sample (threads = 0)
        sampling = bench_sampling(model, corpus.tokenizer, new_tokens=args.new_tokens)
        report["sampling"] = sampling
        if nano:
            # nanoGPT as it runs by default (all cores) and on one thread; the ratio is against its faster.
            nano_model = nano.model(corpus.tokenizer.vocab_size)
            torch.set_num_threads(threads)
            nano_default = nanogpt_sampling(nano_model, args.new_tokens)
            torch.set_num_threads(1)
            nano_one = nanogpt_sampling(nano_model, args.new_tokens)
            report["nanogpt_sampling"] = {f"threads_{threads}": round(nano_default, 1), "threads_1": round(nano_one, 1)}
        torch.set_num_threads(threads)
        nano_sample = max(report["nanogpt_sampling"].values()) if nano else None
        row(
            "sample tokens/s, batch 1, 1,000 new tokens",
            sampling["with_kv_cache_tokens_per_s"],
            round(nano_sample, 1) if nano_sample else None,
            "tokens/s",
            ">= 3x",
        )
        if "onnxruntime_tokens_per_s" in sampling:
            row(
                'sample tokens/s, batch 1, 1,000 new tokens, runtime = "onnxruntime" (the onnx extra)',
                sampling["onnxruntime_tokens_per_s"],
                round(nano_sample, 1) if nano_sample else None,
                "tokens/s",
                ">= 3x",
            )

        if not args.quick:
            report["cli"] = cli_benchmark(args.config, nano, env, scratch, report["matmul_gflops"], threads)
            cli_rows(report["cli"], row)
            run = scratch / "default-run"
            mini_full = minigpt_full_run(args.config, run, env)
            report["minigpt_full_run"] = mini_full
            nano_full = nano.full_run() if nano else None
            report["nanogpt_full_run"] = nano_full
            row(
                "time to quality: wall time of the default run",
                mini_full["wall_s"],
                nano_full["wall_s"] if nano_full else None,
                "s",
                "<= 1/3 (x >= 3)",
                better="lower",
            )
            row(
                "time to quality: final validation bits/byte",
                mini_full["val_bpb"],
                nano_full["val_bpb"] if nano_full else None,
                "bits/byte",
                "<= 2.205",
                better="lower",
            )
            report["quality"] = time_to_quality(args.config, nano, env, scratch)
            quality_rows(report["quality"], row)
            s = startup(run, env)
            report["startup"] = s
            row(
                "`minigpt sample -p ROMEO: -n 200` s (reference: `python -c 'import torch'`)",
                s["minigpt_sample_s"],
                s["import_torch_s"],
                "s",
                "<= x1.15",
                better="of-reference",
            )
            if "minigpt_sample_onnxruntime_s" in s:
                row(
                    "the same with `--runtime onnxruntime` (export cached)",
                    s["minigpt_sample_onnxruntime_s"],
                    s["import_torch_s"],
                    "s",
                    "<= x1.15",
                    better="of-reference",
                )
            report["large_text"] = large_text(args.large_mb, env)
            report["folder"] = folder_benchmark(args.folder_files, args.folder_mb, args.config, env)
        torch.set_num_threads(threads)
        report["patching"] = patching_benchmark(args.config, report["matmul_gflops"]["float32"])
        patching_rows(report["patching"], row)
        if not args.quick:
            report["tasks"] = tasks_benchmark(env, scratch)
            tasks_rows(report["tasks"], row)
            if importlib.util.find_spec("transformers"):  # the hf extra: the Llama-family section needs it
                report["llama"] = llama_benchmark(env, scratch, args.llama_folder, args.llama_tokens)
                llama_rows(report["llama"], row)
                torch.set_num_threads(threads)
        again = {"float32": round(matmul_peak(torch.float32)), "bfloat16": round(matmul_peak(torch.bfloat16))}
        report["matmul_gflops"] = {k: max(v, again[k]) for k, v in report["matmul_gflops"].items()}
        peak32, peak = (
            report["matmul_gflops"]["float32"] * 1e9,
            report["matmul_gflops"]["bfloat16" if lowered else "float32"] * 1e9,
        )
        report["mfu"] = {
            "flops_per_token": flops,
            "minigpt": round(fast * flops / peak, 4),
            "minigpt_float32": round(fp32 * flops / peak32, 4),
            "nanogpt": round(nano_train * flops / peak32, 4) if nano_train else None,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print_table(
        report,
        default_config=str(Path(default.source).relative_to(ROOT))
        if Path(default.source).is_relative_to(ROOT)
        else default.source,
    )
    print(f"\n(JSON: {args.json_out})")


def print_table(report: dict, default_config: str) -> None:
    m = report["machine"]
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']}, "
        f"{m['torch_threads']} threads, python {m['python']}, CPU bfloat16: {m['cpu_bfloat16']}"
        + (f", GPU {m['cuda']}" if m["cuda"] else "")
    )
    mm = report["matmul_gflops"]
    print(f"matmul peak: float32 {mm['float32']} GFLOP/s, bfloat16 {mm['bfloat16']} GFLOP/s")
    mfu = report["mfu"]
    print(
        f"training FLOPs/token {mfu['flops_per_token']:,}; MFU minigpt {mfu['minigpt']:.1%} "
        f"(float32 path {mfu['minigpt_float32']:.1%})"
        + (f", nanoGPT {mfu['nanogpt']:.1%} of the float32 peak" if mfu["nanogpt"] else "")
    )
    print()
    print_rows(report)
    if "large_text" in report:
        lt = report["large_text"]
        a, b = lt["first_run"], lt["cached_run"]
        print(
            f"\n{lt['megabytes']} MB text: first run prepares in {a['prepare_s']} s (peak {a['peak_rss_mb']} MB); "
            f"with the cache the first step is done {b['first_step_after_launch_s']} s after launch "
            f"({b['first_step_after_imports_s']} s after imports, peak {b['peak_rss_mb']} MB)"
        )
    if "folder" in report:
        print_folder(report["folder"])
    if "minigpt_full_run" in report:
        f = report["minigpt_full_run"]
        print(
            f"default run ({default_config}): {f['steps']} steps, {f['wall_s']} s wall "
            f"({f['train_loop_s']} s in the loop), val {f['val_loss']} nats/token = {f['val_bpb']} bits/byte"
        )
    if report.get("nanogpt_full_run"):
        f = report["nanogpt_full_run"]
        print(
            f"nanoGPT 2,000 iterations: {f['wall_s']} s wall, val {f['val_loss']} nats/token = {f['val_bpb']} bits/byte"
        )


def print_rows(report: dict) -> None:
    w = max(len(r["figure"]) for r in report["rows"])
    print(f"{'figure':<{w}}  {'minigpt':>10}  {'nanoGPT':>10}  {'ratio':>7}  target")
    print(f"{'':<{w}}  {'':>10}  {'(or ref.)':>10}")
    for r in report["rows"]:
        m = "-" if r["minigpt"] is None else r["minigpt"]
        n = "" if r["nanogpt"] is None else r["nanogpt"]
        x = "" if r["ratio"] is None else f"x{r['ratio']}"
        print(f"{r['figure']:<{w}}  {m:>10}  {n:>10}  {x:>7}  {r['target']}")


if __name__ == "__main__":
    main()
