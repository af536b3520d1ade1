"""`--only auto`: what `precision = "auto"` and `optimizer = "auto"` choose, beside every fixed
recipe and nanoGPT, through the CLI at the comparison shape: on this CPU as it is, and as a CPU
without native bfloat16 (`ONEDNN_MAX_CPU_ISA=AVX2`: oneDNN's bfloat16 kernels capped at AVX2, so
bfloat16 is emulated, while the flags still list avx512_bf16); then with one core kept busy, the
default `threads = 0` against a fixed `threads = 1`."""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.config import load_config

from .cli import BusyCore
from .processes import cli_tokens_per_s
from .shapes import SHAPE

# The fixed recipes auto chooses among; auto itself is the config's default.
RECIPES = {
    "auto": [],
    "adamw, auto precision": ['train.optimizer="adamw"'],
    "muon, float32": ['train.optimizer="muon"', 'train.precision="float32"'],
    "muon, bfloat16": ['train.optimizer="muon"', 'train.precision="bfloat16"'],
    "adamw, float32": ['train.optimizer="adamw"', 'train.precision="float32"'],
    "adamw, bfloat16": ['train.optimizer="adamw"', 'train.precision="bfloat16"'],
}
KINDS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}


def auto_benchmark(config: str | None, nano, env: dict, scratch: Path, steps: int = 150, rounds: int = 3) -> dict:
    """Each recipe's CLI tokens/s (best of `rounds`, the rounds alternating between the recipes and
    nanoGPT's train.py), what auto chose and the figures it measured (its checkpoint's), per CPU kind.
    A recipe that runs bfloat16 where it is emulated gets one short round: it is many times slower."""
    cfg = load_config(config, SHAPE)
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
    result: dict = {}
    for kind, variables in KINDS.items():
        here = {**env, **variables}
        runs: dict[str, list[float]] = {name: [] for name in RECIPES}
        nano_runs: list[float] = []
        chosen = None
        for number in range(rounds):
            for name, changes in RECIPES.items():
                slow = kind == "avx2" and "bfloat16" in name
                if slow and number:
                    continue
                out = scratch / f"auto-{kind}-{name.replace(', ', '-').replace(' ', '-')}"
                runs[name].append(
                    cli_tokens_per_s(config, [*SHAPE, *changes], 20 if slow else steps, per_step, out, here)
                )
                if name == "auto" and chosen is None:
                    payload = torch.load(out / "checkpoint.pt", weights_only=False, map_location="cpu")
                    chosen = {"choices": payload["choices"], "measured": payload.get("measured")}
            if nano:
                nano.env, was = here, nano.env
                try:
                    nano_runs.append(nano.train_tokens_per_s(60, True, [], per_step, skip=15))
                finally:
                    nano.env = was
        result[kind] = {
            "recipes": {name: [round(x) for x in xs] for name, xs in runs.items()},
            "nanogpt": [round(x) for x in nano_runs],
            "auto_chose": chosen,
        }
    result["busy"] = busy_benchmark(config, env, scratch, per_step, steps, rounds)
    return result


def busy_benchmark(config: str | None, env: dict, scratch: Path, per_step: int, steps: int, rounds: int) -> dict:
    """One core kept busy by a spinning process: the default (`threads = 0`, timed at the start)
    against a fixed `threads = 1`, rounds alternating; the count the default chose."""
    runs: dict[str, list[float]] = {"threads = 0": [], "threads = 1": []}
    counts = []
    with BusyCore():
        for _ in range(rounds):
            for name, changes in (("threads = 0", ["train.threads=0"]), ("threads = 1", ["train.threads=1"])):
                out = scratch / f"busy-{name[-1]}"
                runs[name].append(cli_tokens_per_s(config, [*SHAPE, *changes], steps, per_step, out, env))
                if name == "threads = 0":
                    counts.append(torch.load(out / "checkpoint.pt", weights_only=False)["choices"]["threads"])
    return {**{name: [round(x) for x in xs] for name, xs in runs.items()}, "default_chose_threads": counts}


def auto_rows(auto: dict, row) -> None:
    for kind, label in (("native", "this CPU"), ("avx2", "ONEDNN_MAX_CPU_ISA=AVX2, bfloat16 emulated")):
        e = auto[kind]
        best = {name: max(xs) for name, xs in e["recipes"].items()}
        nano = max(e["nanogpt"]) if e["nanogpt"] else None
        c = e["auto_chose"]["choices"]
        row(
            f"{label}: the default recipe (auto: {c['optimizer']}, {c['precision']})",
            best["auto"],
            nano,
            "tokens/s",
            ">= x1.2",
        )
        row(f"{label}: AdamW (precision auto)", best["adamw, auto precision"], nano, "tokens/s", "")
        same = [name for name in RECIPES if name != "auto" and name.startswith(c["optimizer"])]
        fastest = max(same, key=best.get)
        row(
            f"{label}: auto against the fastest fixed {c['optimizer']} recipe ({fastest})",
            best["auto"],
            best[fastest],
            "tokens/s",
            ">= x0.95",
            better="of-reference",
        )
        for name in RECIPES:
            if name != "auto":
                row(f"{label}: {name}", best[name], nano, "tokens/s", "")
    busy = auto["busy"]
    row(
        f"one core kept busy: the default (threads = 0, chose {busy['default_chose_threads']}) against threads = 1",
        max(busy["threads = 0"]),
        max(busy["threads = 1"]),
        "tokens/s",
        ">= x1.0",
        better="of-reference",
    )
