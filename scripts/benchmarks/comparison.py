"""The full run (no --only): every figure of minigpt, and with --nanogpt nanoGPT's beside it. The
training step at the comparison shape in four variants and sampling at batch 1 here; with --quick
that, the patching sweeps and the utilisation alone; else also the CLI, the default run to quality,
the startup, the 100 MB text, the folder, the tasks and the Llama-family section."""

from __future__ import annotations

import importlib.util
from argparse import Namespace
from pathlib import Path

import torch

from minigpt.config import load_config
from minigpt.model.flops import training_flops_per_token
from minigpt.model.gpt import MiniGPT
from minigpt.text.corpus import load_corpus

from .cli import cli_benchmark, cli_rows
from .large_data import folder_benchmark, large_text
from .llama import llama_benchmark, llama_rows
from .machine import matmul_peak
from .nanogpt import NanoGPT, nanogpt_sampling
from .patching import patching_benchmark, patching_rows
from .quality import minigpt_full_run, quality_rows, time_to_quality
from .sampling import bench_sampling
from .shapes import SHAPE
from .startup import startup
from .tasks import tasks_benchmark, tasks_rows
from .training import TrainTimer


def matmul_peaks() -> dict[str, int]:
    return {"float32": round(matmul_peak(torch.float32)), "bfloat16": round(matmul_peak(torch.bfloat16))}


def measure_everything(args: Namespace, report: dict, row, env: dict, scratch: Path, threads: int) -> None:
    report["matmul_gflops"] = matmul_peaks()
    nano = NanoGPT(args.nanogpt.resolve(), scratch, env) if args.nanogpt else None
    torch.set_num_threads(threads)
    shape = load_config(args.config, SHAPE)
    corpus = load_corpus(shape)
    fast, fp32, nano_train = training_at_the_shape(args, shape, corpus, nano, threads, report, row)
    flops = training_flops_per_token(MiniGPT(shape.model, corpus.tokenizer.vocab_size))
    precision = shape.train.precision
    lowered = precision == "bfloat16" or precision == "auto" and report["machine"]["cpu_bfloat16"]
    sampling_at_batch_1(args, shape, corpus, nano, threads, report, row)
    if not args.quick:
        whole_runs(args, nano, env, scratch, threads, report, row)
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
    # measured again at the end, the higher kept, so that a busy moment does not inflate the utilisation
    again = matmul_peaks()
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


def training_at_the_shape(
    args: Namespace, shape, corpus, nano: NanoGPT | None, threads: int, report: dict, row
) -> tuple[float, float, float | None]:
    """Training throughput at the comparison shape: minigpt's default recipe, float32, AdamW and AdamW
    in float32, rounds alternating between the variants (nanoGPT between them), best round each.
    Returns the default recipe's and float32's tokens/s and nanoGPT's (None without it)."""
    precision = shape.train.precision

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
    best = {name: timer.best for name, timer in timers.items()}
    nano_train = max(nano_runs[True]) if nano_runs[True] else None
    nano_train_nobias = max(nano_runs[False]) if nano_runs[False] else None
    reference = round(nano_train or 0) or None
    for name, label, target in (
        ("fast", f"(default recipe: {shape.train.optimizer}, precision {precision})", ">= 2.5x"),
        ("float32", ", float32", ""),
        ("adamw", f", AdamW (precision {precision})", ""),
        ("adamw_float32", ", AdamW, float32", ""),
    ):
        row(f"train tokens/s at the shape{' ' if name == 'fast' else ''}{label}", round(best[name]), reference,
            "tokens/s", target)  # fmt: skip
    if nano_train_nobias:
        report["nanogpt_train_tokens_per_s_bias_off"] = round(nano_train_nobias)
    return best["fast"], best["float32"], nano_train


def sampling_at_batch_1(args: Namespace, shape, corpus, nano: NanoGPT | None, threads: int, report: dict, row) -> None:
    """minigpt's `generate` on one thread, as `minigpt sample` runs one sample; nanoGPT's
    `GPT.generate` as it runs by default (every core) and on one thread, the ratio against its faster."""
    torch.manual_seed(0)
    model = MiniGPT(shape.model, corpus.tokenizer.vocab_size).eval()
    torch.set_num_threads(1)  # as `minigpt sample` runs one sample (threads = 0)
    sampling = bench_sampling(model, corpus.tokenizer, new_tokens=args.new_tokens)
    report["sampling"] = sampling
    if nano:
        nano_model = nano.model(corpus.tokenizer.vocab_size)
        torch.set_num_threads(threads)
        nano_default = nanogpt_sampling(nano_model, args.new_tokens)
        torch.set_num_threads(1)
        nano_one = nanogpt_sampling(nano_model, args.new_tokens)
        report["nanogpt_sampling"] = {f"threads_{threads}": round(nano_default, 1), "threads_1": round(nano_one, 1)}
    torch.set_num_threads(threads)
    nano_sample = max(report["nanogpt_sampling"].values()) if nano else None
    reference = round(nano_sample, 1) if nano_sample else None
    row("sample tokens/s, batch 1, 1,000 new tokens", sampling["with_kv_cache_tokens_per_s"], reference, "tokens/s",
        ">= 3x")  # fmt: skip
    if "onnxruntime_tokens_per_s" in sampling:
        row('sample tokens/s, batch 1, 1,000 new tokens, runtime = "onnxruntime" (the onnx extra)',
            sampling["onnxruntime_tokens_per_s"], reference, "tokens/s", ">= 3x")  # fmt: skip


def whole_runs(
    args: Namespace, nano: NanoGPT | None, env: dict, scratch: Path, threads: int, report: dict, row
) -> None:
    """What takes minutes: the CLI at both shapes, the default run to quality against nanoGPT's 2,000
    iterations, time to quality elsewhere, the startup of a sampling call, the 100 MB text and the folder."""
    report["cli"] = cli_benchmark(args.config, nano, env, scratch, report["matmul_gflops"], threads)
    cli_rows(report["cli"], row)
    run = scratch / "default-run"
    mini_full = minigpt_full_run(args.config, run, env)
    report["minigpt_full_run"] = mini_full
    nano_full = nano.full_run() if nano else None
    report["nanogpt_full_run"] = nano_full
    row("time to quality: wall time of the default run", mini_full["wall_s"], nano_full and nano_full["wall_s"], "s",
        "<= 1/3 (x >= 3)", better="lower")  # fmt: skip
    row("time to quality: final validation bits/byte", mini_full["val_bpb"], nano_full and nano_full["val_bpb"],
        "bits/byte", "<= 2.205", better="lower")  # fmt: skip
    report["quality"] = time_to_quality(args.config, nano, env, scratch)
    quality_rows(report["quality"], row)
    s = startup(run, env)
    report["startup"] = s
    row("`minigpt sample -p ROMEO: -n 200` s (reference: `python -c 'import torch'`)", s["minigpt_sample_s"],
        s["import_torch_s"], "s", "<= x1.15", better="of-reference")  # fmt: skip
    if "minigpt_sample_onnxruntime_s" in s:
        row("the same with `--runtime onnxruntime` (export cached)", s["minigpt_sample_onnxruntime_s"],
            s["import_torch_s"], "s", "<= x1.15", better="of-reference")  # fmt: skip
    report["large_text"] = large_text(args.large_mb, env)
    report["folder"] = folder_benchmark(args.folder_files, args.folder_mb, args.config, env)
