"""nanoGPT's unmodified train.py and `GPT.generate`, run side by side with minigpt
(`--nanogpt DIR`): its data prepared as its README says, its figures read from its own log."""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import ROOT

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
