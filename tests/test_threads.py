"""[train] threads = 0: the count timed fastest before the first step (every core unless fewer win by
a margin), fixed for the run and recorded; with adaptive_threads = true, timed again as it trains
(threads.py). Timings here are given, never measured, so nothing depends on
how busy the machine running the tests is. (tests/test_reproducible.py kills a default run.)"""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from minigpt import device
from minigpt.api import train
from minigpt.config import ConfigError, load_config
from minigpt.model.gpt import MiniGPT
from minigpt.training import session as session_module
from minigpt.training import threads
from minigpt.training import trainer as trainer_module
from minigpt.training.events import Listener


def test_the_candidates_are_all_cores_down_to_one():
    assert threads.candidates(1) == [1]
    assert threads.candidates(2) == [2, 1]
    assert threads.candidates(8) == [8, 7, 4, 1]


def test_the_fastest_count_wins_and_a_tie_keeps_more_threads():
    # one core busy: a 2-thread pass stalls on it, one thread runs at its own speed
    busy = {2: 0.30, 1: 0.12}
    assert threads.pick(threads.best_times([2, 1], busy.__getitem__)) == 1
    quiet = {2: 0.07, 1: 0.12}
    assert threads.pick(threads.best_times([2, 1], quiet.__getitem__)) == 2
    assert threads.pick(threads.best_times([2, 1], {2: 0.1, 1: 0.1}.__getitem__)) == 2


def test_before_the_first_step_each_count_is_judged_by_its_middle_round():
    # a core kept busy: one 2-thread round ran while the other program was off its core
    times = {2: iter([0.07, 0.30, 0.31, 0.29, 0.30]), 1: iter([0.12] * 5)}
    best = threads.best_times([2, 1], lambda n: next(times[n]), 5, statistics.median)
    assert best == {2: 0.30, 1: 0.12} and threads.pick(best, threads.START_MARGIN) == 1


def test_each_count_is_judged_by_its_best_round():
    # the load changed during the first round: its slow 2-thread pass does not decide
    times = {2: iter([0.5, 0.07, 0.07]), 1: iter([0.12, 0.12, 0.12])}
    assert threads.pick(threads.best_times([2, 1], lambda n: next(times[n]))) == 2


def test_choosing_leaves_no_gradient_and_no_trace_on_the_random_state():
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        load_config(None).model, n_layer=1, n_embd=16, n_head=2, ffn_hidden=32, context=8, dropout=0.1
    )
    model = MiniGPT(cfg, 20).train()
    batch = (torch.randint(0, 20, (2, 8)), torch.randint(0, 20, (2, 8)))
    before = torch.get_rng_state()
    was = torch.get_num_threads()
    try:
        chosen = threads.choose(model, batch, "float32", cores=2)
        assert chosen in (1, 2) and torch.get_num_threads() == chosen
    finally:
        torch.set_num_threads(was)
    assert torch.equal(torch.get_rng_state(), before)  # dropout drew from a forked state
    assert all(p.grad is None for p in model.parameters())


def test_a_timed_pass_reads_a_fixed_number_of_tokens_whatever_the_context(monkeypatch):
    torch.manual_seed(0)
    cfg = dataclasses.replace(load_config(None).model, n_layer=1, n_embd=16, n_head=2, ffn_hidden=32, context=8)
    model = MiniGPT(cfg, 20).train()
    seen = []
    real = MiniGPT.forward

    def spy(self, ids, *args, **kwargs):
        seen.append(tuple(ids.shape))
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(MiniGPT, "forward", spy)
    was = torch.get_num_threads()
    try:
        for tokens, rows in ((24, 3), (4, 1)):  # 24 tokens: 3 windows of 8; fewer than a window: one
            monkeypatch.setattr(threads, "PROBE_TOKENS", tokens)
            seen.clear()
            threads.choose(model, (torch.randint(0, 20, (10, 8)), torch.randint(0, 20, (10, 8))), "float32", cores=2)
            assert seen and set(seen) == {(rows, 8)}
    finally:
        torch.set_num_threads(was)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_asks_again_when_steps_slow_down():
    watch = threads.Watch(2, cores=2, clock=Clock())
    assert not any(watch.due(0.1) for _ in range(2 * threads.WINDOW))  # steady: never
    assert not any(watch.due(0.12) for _ in range(threads.WINDOW))  # 20% slower: noise
    assert any(watch.due(0.3) for _ in range(threads.WINDOW))  # another program took a core


def test_on_fewer_threads_the_watch_asks_again_after_a_while():
    clock = Clock()
    watch = threads.Watch(1, cores=2, clock=clock)
    assert not any(watch.due(0.1) for _ in range(2 * threads.WINDOW))
    clock.now = threads.RECHECK_S + 1
    assert watch.due(0.1)  # the other program may have stopped
    watch.reset(2)
    clock.now += 10 * threads.RECHECK_S
    assert not any(watch.due(0.1) for _ in range(2 * threads.WINDOW))  # on every core: only a slowdown asks


@pytest.fixture
def two_cores(monkeypatch):
    """A 2-core machine whatever runs the tests, and a probe whose verdict is given."""
    for module in (device, session_module, trainer_module):
        monkeypatch.setattr(module, "default_threads", lambda: 2)
    was = torch.get_num_threads()
    yield
    torch.set_num_threads(was)


def given_times(monkeypatch, times: dict[int, float]) -> list[int]:
    """threads.timed_counts answers `times` (seconds of a pass per count); the list records each call's cores."""
    asked = []

    def timed_counts(model, batch, precision, cores, rounds=threads.ROUNDS, statistic=min):
        asked.append(cores)
        return dict(times)

    monkeypatch.setattr(threads, "timed_counts", timed_counts)
    return asked


def test_threads_zero_on_a_quiet_machine_trains_on_every_core_timed_once_and_records_the_count(
    tiny_config, tmp_path, monkeypatch, two_cores
):
    asked = given_times(monkeypatch, {2: 0.07, 1: 0.12})
    monkeypatch.setattr(trainer_module, "Watch", lambda *a: pytest.fail("threads = 0 alone is never watched"))
    torch.set_num_threads(1)  # as after a single sample: training goes back to every core
    out = tmp_path / "run"
    seen = []
    result = train(
        config=tiny_config,
        out=out,
        steps=4,
        set={"train.threads": 0},
        progress=False,
        on_start=lambda session: seen.append(session.notes),
    )
    assert result.step == 4 and torch.get_num_threads() == 2 and asked == [2]
    assert not any("threads = 0" in note for note in seen[0])
    payload = torch.load(out / "checkpoint.pt", weights_only=False)
    assert payload["threads"] == 2 and payload["choices"]["threads"] == 2


@pytest.mark.parametrize(
    ("times", "count"),
    [
        ({2: 0.30, 1: 0.12}, 1),  # a core kept busy: the 2-thread pass waits on it
        ({2: 0.10, 1: 0.09}, 2),  # one thread a little faster: noise, under the margin, keeps every core
        ({2: 0.10, 1: 0.10 / threads.START_MARGIN - 1e-6}, 1),  # just past the margin
    ],
)
def test_threads_zero_on_a_busy_machine_keeps_the_count_that_wins_by_the_margin_and_a_resume_keeps_it(
    tiny_config, tmp_path, monkeypatch, two_cores, times, count
):
    given_times(monkeypatch, times)
    monkeypatch.setattr(trainer_module, "Watch", lambda *a: pytest.fail("threads = 0 alone is never watched"))
    out = tmp_path / "run"
    settings = {"train.threads": 0, "train.checkpoint_interval": 2}
    seen = []

    class Crash(Listener):  # the process dies after step 3, its last checkpoint at step 2
        def on_step(self, event):
            seen.append(torch.get_num_threads())
            if event.step == 3:
                raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(
            config=tiny_config,
            out=out,
            steps=6,
            set=settings,
            progress=False,
            listeners=[Crash()],
            on_start=lambda session: seen.append(session.notes),
        )
    notes, *counts = seen
    assert counts == [count] * 3
    said = [note for note in notes if note.startswith("note: threads = 0")]
    if count == 1:
        assert said == [
            f"note: threads = 0: training on 1 of 2 cores (a pass on 2 threads took {times[2] / times[1]:.1f}x as "
            "long as on 1: another program is using this machine); the run keeps 1 to its end and a resume "
            "continues at it (set train.threads=2 to use every core anyway)"
        ]
    else:
        assert said == []
    assert torch.load(out / "checkpoint.pt", weights_only=False)["threads"] == count
    # the machine is quiet again: a resume is not timed, and continues at the recorded count
    given_times(monkeypatch, {})
    monkeypatch.setattr(threads, "timed_counts", lambda *a: pytest.fail("a resume must not time again"))
    torch.set_num_threads(2)
    train(config=tiny_config, out=out, steps=6, set=settings, resume=True, progress=False)
    assert torch.get_num_threads() == count
    assert torch.load(out / "checkpoint.pt", weights_only=False)["threads"] == count


def test_a_resume_where_there_are_other_cores_continues_at_the_recorded_count_and_says_so(
    tiny_config, tmp_path, monkeypatch, two_cores
):
    given_times(monkeypatch, {2: 0.07, 1: 0.12})  # a quiet 2-core machine
    out = tmp_path / "run"
    settings = {"train.threads": 0, "train.checkpoint_interval": 2}

    class Crash(Listener):  # the process dies after step 3, its last checkpoint at step 2 (2 threads)
        def on_step(self, event):
            if event.step == 3:
                raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(config=tiny_config, out=out, steps=6, set=settings, progress=False, listeners=[Crash()])
    for module in (device, session_module, trainer_module):  # resumed on a 4-core machine
        monkeypatch.setattr(module, "default_threads", lambda: 4)
    seen = []
    train(
        config=tiny_config,
        out=out,
        steps=6,
        set=settings,
        resume=True,
        progress=False,
        on_start=lambda session: seen.append((torch.get_num_threads(), session.notes)),
    )
    ((count, notes),) = seen
    assert count == 2
    assert (
        "note: continuing on the 2 threads this run trained at (one per core here: 4), so that it computes "
        "what the run would have; set train.threads=4 to trade that for speed" in notes
    )
    assert torch.load(out / "checkpoint.pt", weights_only=False)["threads"] == 2


def test_adaptive_threads_with_a_fixed_count_is_refused(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match=r"adaptive_threads = true with threads = 1 is refused"):
        train(config=tiny_config, out=tmp_path / "run", steps=2, set={"train.adaptive_threads": True}, progress=False)
    assert not (tmp_path / "run").exists()


def test_adaptive_threads_trains_at_the_chosen_count_and_a_resume_continues_at_it(
    tiny_config, tmp_path, monkeypatch, two_cores
):
    chosen = []

    def choose(model, batch, precision, cores):
        chosen.append(cores)
        torch.set_num_threads(1)
        return 1

    monkeypatch.setattr(threads, "choose", choose)
    out = tmp_path / "run"
    settings = {"train.threads": 0, "train.adaptive_threads": True, "train.checkpoint_interval": 2}

    class Crash(Listener):  # the process dies after step 3, its last checkpoint at step 2
        def on_step(self, event):
            if event.step == 3:
                raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(config=tiny_config, out=out, steps=6, set=settings, progress=False, listeners=[Crash()])
    assert chosen == [2]
    payload = torch.load(out / "checkpoint.pt", weights_only=False)
    assert payload["step"] == 2 and payload["threads"] == 1

    # A resume is not timed again: it continues at the count its steps ran at.
    monkeypatch.setattr(threads, "choose", lambda *a: pytest.fail("a resume must not choose again"))
    torch.set_num_threads(2)
    train(config=tiny_config, out=out, steps=6, set=settings, resume=True, progress=False)
    assert torch.get_num_threads() == 1
    assert torch.load(out / "checkpoint.pt", weights_only=False)["threads"] == 1


def test_adaptive_threads_times_again_when_the_watch_asks_and_records_the_new_count(
    tiny_config, tmp_path, monkeypatch, two_cores
):
    counts = iter([2, 1])  # the first choice, then the one after the watch asks

    def choose(model, batch, precision, cores):
        count = next(counts)
        torch.set_num_threads(count)
        return count

    ran = []  # the count each step ran at

    class Asks(threads.Watch):  # steps slowed down: after the third, it asks
        def due(self, step_seconds):
            ran.append(torch.get_num_threads())
            return len(ran) == 3

    monkeypatch.setattr(threads, "choose", choose)
    monkeypatch.setattr(trainer_module, "Watch", Asks)
    out = tmp_path / "run"
    settings = {"train.threads": 0, "train.adaptive_threads": True}
    train(config=tiny_config, out=out, steps=6, set=settings, progress=False)
    assert ran == [2, 2, 2, 1, 1, 1]
    assert torch.load(out / "checkpoint.pt", weights_only=False)["threads"] == 1


def test_a_fixed_thread_count_is_never_timed_or_recorded(tiny_config, tmp_path, monkeypatch, two_cores):
    monkeypatch.setattr(threads, "choose", lambda *a: pytest.fail("threads = 1 must not be timed"))
    out = tmp_path / "run"
    train(config=tiny_config, out=out, steps=2, progress=False)  # the tests' config: threads = 1
    assert "threads" not in torch.load(out / "checkpoint.pt", weights_only=False)
