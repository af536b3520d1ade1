"""How many CPU threads training uses with `[train] threads = 0`: chosen by timing, not assumed.

A step on all cores waits, at every operation, for its slowest thread; when another program keeps
one core busy, the thread sharing that core runs at half speed and the whole step with it, so fewer
threads can be faster than all of them (docs/guide/performance.md has the figures). So before the
first step the session times one forward and backward pass at each candidate count (all cores, then
fewer) and keeps the fastest for the whole run, fewer than all cores only when they win by
START_MARGIN: a quiet machine always trains on every core, a busy one on what it gives.

The thread count changes the order of float additions inside matmuls (the last bits of a weight),
so the count a run trains at is recorded in every checkpoint and a resume continues at it, never
timing again: a run killed and resumed computes the bits of the uninterrupted one, and two fresh
runs on a quiet machine (or with a fixed `threads = N`) compute the same bits. Two fresh runs of
which one started while another program kept a core busy may train at other counts, and then differ
in the last bits; the start says so in a note.

`adaptive_threads = true` goes further: while it trains, the trainer watches its step times and
times the candidates again when steps slow down (something else started) or, on fewer threads than
cores, every minute (it may have stopped), and switches; which count wins, and when, then follows
the load of the moment, so a resumed run may compute other bits than an uninterrupted one.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TypeVar

import torch

from ..device import autocast

K = TypeVar("K")  # what names a timer: a thread count, a precision

SLOWER = 1.4  # steps this much slower than when the count was chosen: time the candidates again
RECHECK_S = 60.0  # on fewer threads than cores, time the candidates again this often
WINDOW = 16  # steps whose median is compared
# Tokens per timed pass (whole windows, at least one): enough work to split over the cores, and a
# fraction of a step at any context (a fixed number of windows would be a whole step at a long one).
PROBE_TOKENS = 512
# threads = 0 trains on fewer threads than cores only when they time this much faster before the
# first step: far above the noise of a quiet machine, far below the x2-x3 of a core kept busy.
START_MARGIN = 1.3
START_ROUNDS = 5  # rounds per count before the first step, judged by their median
ROUNDS = 3  # timed passes per candidate (the fastest counts: a pass is slowed, never sped up, by noise)


def candidates(cores: int) -> list[int]:
    """All cores, all but one, half of them, one: the counts worth timing, most first."""
    return sorted({cores, max(1, cores - 1), max(1, cores // 2), 1}, reverse=True)


def best_times(
    counts: Sequence[int],
    timed: Callable[[int], float],
    rounds: int = ROUNDS,
    statistic: Callable[[list[float]], float] = min,
) -> dict[int, float]:
    """Each count's time over `rounds` alternating rounds: its shortest, or `statistic` of them."""
    times = alternating_rounds({n: partial(timed, n) for n in counts}, rounds)
    return {n: statistic(t) for n, t in times.items()}


def alternating_rounds(timers: Mapping[K, Callable[[], float]], rounds: int) -> dict[K, list[float]]:
    """Each timer's seconds in each of `rounds` rounds, the rounds alternating between the timers so
    that a change in the machine's load meanwhile falls on all of them alike (the thread counts
    here, measured.py's precisions and Muon's orthogonalisation)."""
    times: dict[K, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, once in timers.items():
            times[name].append(once())
    return times


def pick(best: dict[int, float], margin: float = 1.0) -> int:
    """The count with the shortest time, where fewer threads than the most must win by `margin`
    (their times count `margin` times over). A tie goes to more threads."""
    most = max(best)
    return min(best, key=lambda n: (best[n] * (1.0 if n == most else margin), -n))


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


def timed_counts(
    model: torch.nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    precision: str,
    cores: int,
    rounds: int = ROUNDS,
    statistic: Callable[[list[float]], float] = min,
) -> dict[int, float]:
    """Each candidate count's time (`statistic` of `rounds` rounds) for a pass on the first
    PROBE_TOKENS of `batch`. Leaves no trace on the run: the RNG states are restored (dropout draws
    from them) and the gradients cleared."""
    rows = max(1, PROBE_TOKENS // batch[0].shape[1])
    x, y = batch[0][:rows], batch[1][:rows]
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        best = best_times(candidates(cores), timed_pass(model, (x, y), precision), rounds, statistic)
    model.zero_grad(set_to_none=True)
    return best


def choose(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], precision: str, cores: int) -> int:
    """Time the candidate counts on `batch` and set torch to the fastest (adaptive_threads)."""
    best = pick(timed_counts(model, batch, precision, cores))
    torch.set_num_threads(best)
    return best


def starting_count(session, payload: dict | None, cores: int) -> tuple[int, str | None]:
    """`threads = 0` on a CPU: the count a run trains at, and a note when it is not every core. A
    resume takes the count its checkpoint records (the steps so far ran at it: bitwise over speed).
    A fresh run times the candidates once, before the first step, and keeps the winner to its end:
    all cores unless fewer are START_MARGIN times faster, which on a quiet machine they never are
    (so two fresh runs there compute the same bits), and which on a machine where another program
    keeps a core busy they are, by about twice. With adaptive_threads the trainer may time again."""
    if payload is not None and "threads" in payload:
        torch.set_num_threads(payload["threads"])
        return payload["threads"], None
    if cores == 1:
        return 1, None
    if session.cfg.train.adaptive_threads:  # the fastest now; the trainer times again when steps slow
        return choose(session.model, session.val_windows[0], session.precision, cores), None
    # The median of START_ROUNDS: a pass on every core that happens to run while the other program
    # is off its core is fast, so the fastest round could hide the busy core (it did, one run in three).
    best = timed_counts(
        session.model, session.val_windows[0], session.precision, cores, START_ROUNDS, statistics.median
    )
    count = pick(best, START_MARGIN)
    torch.set_num_threads(count)
    if count == cores:
        return count, None
    return count, (
        f"note: threads = 0: training on {count} of {cores} cores (a pass on {cores} threads took "
        f"{best[cores] / best[count]:.1f}x as long as on {count}: another program is using this machine); the run "
        f"keeps {count} to its end and a resume continues at it (set train.threads={cores} to use every core anyway)"
    )


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
