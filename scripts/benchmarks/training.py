"""The training step timed in this process: minigpt's own `Trainer.train_step`, in rounds so that
variants can alternate."""

from __future__ import annotations

import time

import torch

from minigpt.training.session import build
from minigpt.training.trainer import Trainer


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
