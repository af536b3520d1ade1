"""The command line of `python scripts/bench.py`: the options, then either one part alone (--only
NAME: that part and the machine, its rows and the JSON report) or the full run (comparison.py), the
scratch folder removed either way, the table printed and the report written."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

import benchmarks
from minigpt.config import load_config

from . import ROOT
from .auto import auto_benchmark, auto_rows
from .cli import cli_benchmark, cli_rows
from .comparison import matmul_peaks, measure_everything
from .large_data import folder_benchmark, print_folder
from .llama import llama_benchmark, llama_memory_benchmark, llama_memory_rows, llama_rows
from .lora import lora_benchmark, lora_rows
from .machine import machine, matmul_peak
from .nanogpt import NanoGPT
from .patching import patching_benchmark, patching_rows
from .positions import positions_benchmark, positions_rows
from .quality import quality_rows, time_to_quality
from .report import new_report, print_rows, print_table, row_writer, save
from .residuals import residuals_benchmark, residuals_rows
from .tasks import tasks_benchmark, tasks_rows
from .versions import versions_benchmark, versions_rows


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=benchmarks.__doc__.split("\n\n")[0])
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
            "auto",
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
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.table:
        print_table(json.loads(args.table.read_text(encoding="utf-8")), default_config="configs/default.toml")
        return
    if args.only == "versions" and (args.against is None or not (args.against / "minigpt").is_dir()):
        raise SystemExit("bench: --only versions needs --against DIR, a minigpt checkout (it holds minigpt/)")

    from minigpt.device import keep_freed_memory

    keep_freed_memory()  # as `minigpt train` does, so the in-process training figures are its own
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-bench-"))
    env.setdefault("MINIGPT_CACHE", str(scratch / "cache"))
    os.environ["MINIGPT_CACHE"] = env["MINIGPT_CACHE"]
    threads = torch.get_num_threads()
    report = new_report(machine(), args.config)
    row = row_writer(report)
    try:
        if args.only:
            measure_alone(args, report, row, env, scratch, threads)
        else:
            measure_everything(args, report, row, env, scratch, threads)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save(report, args.json_out)
    if args.only == "folder":
        print_folder(report["folder"])
    elif args.only:
        print_rows(report)
    else:
        source = Path(load_config(args.config).source)
        print_table(
            report, default_config=str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
        )
    print(f"\n(JSON: {args.json_out})")


def measure_alone(args: argparse.Namespace, report: dict, row, env: dict, scratch: Path, threads: int) -> None:
    """--only NAME: that part measured, under its name in the report (llama-memory: llama_memory),
    and its rows; the cli, quality and patching parts first measure the matmul peaks they are set against."""
    if args.only in ("cli", "quality"):
        report["matmul_gflops"] = matmul_peaks()
    elif args.only == "patching":
        report["matmul_gflops"] = {"float32": round(matmul_peak(torch.float32))}
    nano = (
        NanoGPT(args.nanogpt.resolve(), scratch, env)
        if args.nanogpt and args.only in ("auto", "cli", "quality")
        else None
    )
    llama_folder = args.llama_folder.resolve() if args.llama_folder else None
    parts = {
        "folder": (lambda: folder_benchmark(args.folder_files, args.folder_mb, args.config, env), None),
        "auto": (lambda: auto_benchmark(args.config, nano, env, scratch), auto_rows),
        "cli": (lambda: cli_benchmark(args.config, nano, env, scratch, report["matmul_gflops"], threads), cli_rows),
        "quality": (lambda: time_to_quality(args.config, nano, env, scratch), quality_rows),
        "versions": (lambda: versions_benchmark(args.against, env, scratch), versions_rows),
        "patching": (lambda: patching_benchmark(args.config, report["matmul_gflops"]["float32"]), patching_rows),
        "tasks": (lambda: tasks_benchmark(env, scratch), tasks_rows),
        "lora": (lambda: lora_benchmark(env, scratch), lora_rows),
        "positions": (lambda: positions_benchmark(args.config, env, scratch), positions_rows),
        "residuals": (lambda: residuals_benchmark(args.config, env, scratch), residuals_rows),
        "llama": (lambda: llama_benchmark(env, scratch, llama_folder, args.llama_tokens), llama_rows),
        "llama-memory": (lambda: llama_memory_benchmark(env, scratch), llama_memory_rows),
    }
    measure, rows_of = parts[args.only]
    name = args.only.replace("-", "_")
    report[name] = measure()
    if rows_of is not None:
        rows_of(report[name], row)
