"""`--only cli`: `minigpt train` through the CLI at both shapes, quiet and with one core kept busy,
beside nanoGPT's train.py and beside the bare timed step."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from minigpt.config import load_config
from minigpt.model.flops import training_flops_per_token
from minigpt.model.gpt import MiniGPT
from minigpt.text.corpus import load_corpus

from .processes import cli_tokens_per_s
from .shapes import LARGE_SHAPE, NANO_LARGE_SHAPE, SHAPE
from .training import TrainTimer


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
            # With a core busy: the default, whose thread count is timed before the first step.
            with BusyCore():
                for _ in range(rounds):
                    busy.append(cli_tokens_per_s(config, changes, steps, per_step, out, env))
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
        "one core kept busy: `minigpt train` (threads = 0) tokens/s against its quiet figure (nanoGPT: its own)",
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
            "one core kept busy: `minigpt train` (threads = 0) against nanoGPT",
            e["busy_minigpt_cli"],
            e["busy_nanogpt"],
            "tokens/s",
            "",
        )
