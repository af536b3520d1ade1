"""Progress a person can watch, asked for with `progress=True`: a training bar (step, loss, the last
validation loss, tokens/s and the time left) and a bar over a large text (or many files) while it is
tokenized.
Both are tqdm's `auto` flavour: a widget in a notebook, a line on stderr in a terminal. Where stderr
is neither (a file, a pipe, a CI log), a bar would be one endless line of carriage returns: training
prints a plain line every tenth of its steps (or every minute) instead, and the bars of the passing
steps (a corpus prepared, a checkpoint read) are left out."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .events import EvalDone, Listener, StepDone

# Texts shorter than this are prepared in a few seconds: no bar.
FROM_CHARACTERS = 5_000_000
# Off a terminal: a line every this share of the session's steps, and at least this often.
LINE_EVERY_SHARE = 0.1
LINE_EVERY_S = 60.0


class Pace:
    """How long a step takes lately, for the time left and for saying when the machine got busy.
    Each step's own wall time is kept; the pace is the median of the last WINDOW (an evaluation or
    a checkpoint is one long step, which a median ignores), scaled by what such pauses have added
    so far (the mean over the median of every step). The fastest pace seen is the machine quiet:
    a pace more than BUSY times it means something else is using the machine."""

    WINDOW = 20
    BUSY = 2.0

    def __init__(self) -> None:
        self.last: float | None = None  # when the last step ended
        self.recent: list[float] = []
        self.total, self.steps = 0.0, 0
        self.quiet: float | None = None  # the fastest full window's median

    def step(self, now: float, started: float) -> None:
        """A step ended at `now` (the first one began at `started`)."""
        seconds, self.last = now - (started if self.last is None else self.last), now
        self.recent = [*self.recent[-(self.WINDOW - 1) :], seconds]
        self.total, self.steps = self.total + seconds, self.steps + 1
        if len(self.recent) == self.WINDOW:
            self.quiet = min(self.quiet or self.now(), self.now())

    def now(self) -> float:
        """Seconds a step takes lately (the median of the last WINDOW)."""
        ordered = sorted(self.recent)
        return ordered[len(ordered) // 2] if ordered else 0.0

    def left(self, steps: int) -> float:
        """Seconds for `steps` more at the recent pace, with the pauses so far in proportion."""
        typical = self.now()
        pauses = self.total / self.steps / typical if typical > 0 else 1.0
        return steps * typical * max(pauses, 1.0)

    def slowdown(self) -> float | None:
        """How many times slower steps run than when the machine was quietest, when over BUSY."""
        if self.quiet is None or self.quiet <= 0 or len(self.recent) < self.WINDOW:
            return None
        ratio = self.now() / self.quiet
        return ratio if ratio > self.BUSY else None


def busy_words(slowdown: float | None) -> list[str]:
    return [] if slowdown is None else [f"machine busy: steps {slowdown:.1f}x slower than earlier"]


def _in_notebook() -> bool:
    """Whether tqdm's `auto` flavour is the notebook widget here (stderr is no terminal there either)."""
    import tqdm.auto  # noqa: F401 - imports tqdm.autonotebook without its warning
    from tqdm.autonotebook import tqdm as chosen
    from tqdm.std import tqdm as console

    return chosen is not console


def _bars_shown() -> bool:
    """A bar can be drawn: on a terminal, or as a notebook's widget."""
    return sys.stderr.isatty() or _in_notebook()


def training_progress(initial: int, total: int) -> Listener:
    """The training bar where one can be drawn, else plain lines (`ProgressLines`)."""
    return TrainingProgress(initial, total) if _bars_shown() else ProgressLines(initial, total)


class TrainingProgress(Listener):
    """A bar from the session's first step to its last."""

    def __init__(self, initial: int, total: int):
        from tqdm.auto import tqdm

        self.in_notebook = _in_notebook()
        self.bar = tqdm(
            total=total,
            initial=initial,
            unit="step",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )
        self.val: float | None = None
        self.last: StepDone | None = None
        self.pace = Pace()
        self.started = time.monotonic()

    def write(self, text: str) -> None:
        """A message above the bar (a sample during training), the bar redrawn below it: in the
        notebook's output, or on stderr beside the terminal's bar (stdout stays the command's result)."""
        self.bar.write(text, file=None if self.in_notebook else sys.stderr)

    def on_step(self, event: StepDone) -> None:
        self.last = event
        self.pace.step(time.monotonic(), self.started)
        self._show()
        self.bar.update(1)

    def on_eval(self, event: EvalDone) -> None:
        self.val = event.val_loss
        self._show()

    def _show(self) -> None:
        e = self.last
        shown = [f"loss {e.loss:.3f}"] if e is not None else []  # a fine-tune is evaluated before its first step
        shown += [f"val {self.val:.3f}"] if self.val is not None else []
        shown += [f"{e.tokens_per_s:,.0f} tok/s"] if e is not None else []
        shown += busy_words(self.pace.slowdown())  # the time left follows tqdm's recent rate
        self.bar.set_postfix_str(", ".join(shown), refresh=False)

    def close(self) -> None:
        self.bar.close()


class ProgressLines(Listener):
    """Training's progress as plain lines on stderr, for a file or a pipe: one every tenth of the
    session's steps, or once a minute has passed since the last, and one at the last step:
    `step 150/750 (20%): loss 4.321, val 4.400, 21,000 tok/s, 0m14s elapsed, about 0m56s left`, the
    time left at the recent pace (`Pace`), and `machine busy: steps 2.6x slower than earlier` when
    steps slow down by more than half."""

    def __init__(self, initial: int, total: int, clock: Callable[[], float] = time.monotonic):
        self.initial, self.total, self.clock = initial, total, clock
        self.every = max(1, round((total - initial) * LINE_EVERY_SHARE))
        self.started = self.said_at = clock()
        self.said_step = initial
        self.val: float | None = None
        self.pace = Pace()

    def write(self, text: str) -> None:
        """A message between the lines (a sample during training)."""
        sys.stderr.write(text + "\n")  # stderr: stdout carries only a command's result
        sys.stderr.flush()

    def on_eval(self, event: EvalDone) -> None:
        self.val = event.val_loss

    def on_step(self, event: StepDone) -> None:
        now = self.clock()
        self.pace.step(now, self.started)
        due = event.step - self.said_step >= self.every or now - self.said_at >= LINE_EVERY_S
        if not due and event.step < event.total:
            return
        self.said_step, self.said_at = event.step, now
        elapsed = now - self.started
        left = self.pace.left(event.total - event.step)  # at the recent pace, not the average since the start
        shown = [f"loss {event.loss:.3f}"] + ([f"val {self.val:.3f}"] if self.val is not None else [])
        shown += [f"{event.tokens_per_s:,.0f} tok/s", f"{_clock(elapsed)} elapsed", f"about {_clock(left)} left"]
        shown += busy_words(self.pace.slowdown())
        self.write(f"step {event.step}/{event.total} ({event.step / event.total:.0%}): " + ", ".join(shown))


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


@contextmanager
def preparation(label: str, total: int, unit: str = "char") -> Iterator[Callable[[int], None]]:
    """A bar while a corpus is prepared (see data.load_corpus's `progress`): over the characters of a
    large text, or over the files of a corpus of several (shown once they take more than a moment:
    many files, or a lot of text in them)."""
    from tqdm.auto import tqdm

    if not _bars_shown():  # a passing bar, erased when done: nothing to keep in a file
        yield lambda n: None
        return
    if unit == "file":
        with tqdm(total=total, desc=label, unit="file", dynamic_ncols=True, leave=False, delay=1.0) as bar:
            yield bar.update
        return
    if total < FROM_CHARACTERS:
        yield lambda n: None
        return
    with tqdm(total=total, desc=label, unit="char", unit_scale=True, dynamic_ncols=True, leave=False) as bar:
        yield bar.update


@contextmanager
def task(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar for any slow step (reading a large checkpoint, converting its tensors): shown only once
    the step has taken more than a moment, and gone when it is done."""
    from tqdm.auto import tqdm

    if not _bars_shown():
        yield lambda n: None
        return
    with tqdm(total=total, desc=label, unit_scale=True, dynamic_ncols=True, leave=False, delay=1.0) as bar:
        yield bar.update
