"""How many CPU threads training uses with `[train] adaptive_threads = true` (and `threads = 0`):
chosen by timing, not assumed. Without it, `threads = 0` is one thread per core for the whole run.

A step on all cores waits, at every operation, for its slowest thread; when another program keeps
one core busy, the thread sharing that core runs at half speed and the whole step with it, so fewer
threads can be faster than all of them (docs/guide/performance.md has the figures). So
before the first step, the session times one forward and backward pass at each candidate count (all cores,
then fewer) and trains at the fastest; while it trains, the trainer watches its step times and
times the candidates again when steps slow down (something else started) or, on fewer threads than
cores, every minute (it may have stopped).

The thread count changes the order of float additions inside matmuls (the last bits of a weight),
so the count a run trains at is recorded in every checkpoint and a resume continues at it. That is
why timing is opt-in: which count wins, and when a switch happens, depends on the machine's load
at that moment, so two fresh runs, or a run killed and resumed (each process times for itself and
switches at other steps), compute other bits. A fixed `threads = N`, and `threads = 0` without adaptive_threads,
never change: two fresh runs compute bitwise the same, and so does a resumed one.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from ..device import autocast

SLOWER = 1.4  # steps this much slower than when the count was chosen: time the candidates again
RECHECK_S = 60.0  # on fewer threads than cores, time the candidates again this often
WINDOW = 16  # steps whose median is compared
# Tokens per timed pass (whole windows, at least one): enough work to split over the cores, and a
# fraction of a step at any context (a fixed number of windows would be a whole step at a long one).
PROBE_TOKENS = 512
ROUNDS = 3  # timed passes per candidate (the fastest counts: a pass is slowed, never sped up, by noise)


def candidates(cores: int) -> list[int]:
    """All cores, all but one, half of them, one: the counts worth timing, most first."""
    return sorted({cores, max(1, cores - 1), max(1, cores // 2), 1}, reverse=True)


def fastest(counts: Sequence[int], timed: Callable[[int], float], rounds: int = ROUNDS) -> int:
    """The count with the shortest best time, the rounds alternating between the counts so that a
    change in load meanwhile falls on all of them alike. A tie goes to more threads (the first)."""
    best = {n: float("inf") for n in counts}
    for _ in range(rounds):
        for n in counts:
            best[n] = min(best[n], timed(n))
    return min(counts, key=lambda n: (best[n], -n))


def timed_pass(
    model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str
) -> Callable[[int], float]:
    """Seconds of one forward and backward pass on `batch` at a given thread count (after an untimed
    one at that count: the thread pool resizes on the first). Gradients are summed into the model's
    .grad; the caller clears them."""
    x, y = batch

    def once() -> float:
        started = time.perf_counter()
        with autocast(str(x.device), precision):
            loss = model(x, y)[1]
        loss.backward()
        return time.perf_counter() - started

    def timed(threads: int) -> float:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            once()
        return once()

    return timed


def choose(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str, cores: int) -> int:
    """Time the candidate counts on `batch` and set torch to the fastest. Leaves no trace on the
    run: the RNG states are restored (dropout draws from them) and the gradients cleared."""
    rows = max(1, PROBE_TOKENS // batch[0].shape[1])
    x, y = batch[0][:rows], batch[1][:rows]
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        best = fastest(candidates(cores), timed_pass(model, (x, y), precision))
    model.zero_grad(set_to_none=True)
    torch.set_num_threads(best)
    return best


class Watch:
    """Step times since the count was last chosen: says when to time the candidates again."""

    def __init__(self, threads: int, cores: int, clock: Callable[[], float] = time.perf_counter):
        self.cores, self.clock = cores, clock
        self.reset(threads)

    def reset(self, threads: int) -> None:
        self.threads = threads
        self.chosen_at = self.clock()
        self.baseline: float | None = None
        self.recent: deque[float] = deque(maxlen=WINDOW)

    def due(self, step_seconds: float) -> bool:
        """After a step: whether to time the candidates again now."""
        self.recent.append(step_seconds)
        if len(self.recent) < WINDOW:
            return False
        now = statistics.median(self.recent)
        if self.baseline is None:
            self.baseline = now
            return False
        if now > SLOWER * self.baseline:
            return True
        return self.threads < self.cores and self.clock() - self.chosen_at > RECHECK_S
