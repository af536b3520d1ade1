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

    def write(self, text: str) -> None:
        """A message above the bar (a sample during training), the bar redrawn below it: in the
        notebook's output, or on stderr beside the terminal's bar (stdout stays the command's result)."""
        self.bar.write(text, file=None if self.in_notebook else sys.stderr)

    def on_step(self, event: StepDone) -> None:
        self.last = event
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
        self.bar.set_postfix_str(", ".join(shown), refresh=False)

    def close(self) -> None:
        self.bar.close()


class ProgressLines(Listener):
    """Training's progress as plain lines on stderr, for a file or a pipe: one every tenth of the
    session's steps, or once a minute has passed since the last, and one at the last step:
    `step 150/750 (20%): loss 4.321, val 4.400, 21,000 tok/s, 0m14s elapsed, about 0m56s left`."""

    def __init__(self, initial: int, total: int, clock: Callable[[], float] = time.monotonic):
        self.initial, self.total, self.clock = initial, total, clock
        self.every = max(1, round((total - initial) * LINE_EVERY_SHARE))
        self.started = self.said_at = clock()
        self.said_step = initial
        self.val: float | None = None

    def write(self, text: str) -> None:
        """A message between the lines (a sample during training)."""
        sys.stderr.write(text + "\n")  # stderr: stdout carries only a command's result
        sys.stderr.flush()

    def on_eval(self, event: EvalDone) -> None:
        self.val = event.val_loss

    def on_step(self, event: StepDone) -> None:
        now = self.clock()
        due = event.step - self.said_step >= self.every or now - self.said_at >= LINE_EVERY_S
        if not due and event.step < event.total:
            return
        self.said_step, self.said_at = event.step, now
        elapsed = now - self.started
        left = elapsed / max(event.step - self.initial, 1) * (event.total - event.step)
        shown = [f"loss {event.loss:.3f}"] + ([f"val {self.val:.3f}"] if self.val is not None else [])
        shown += [f"{event.tokens_per_s:,.0f} tok/s", f"{_clock(elapsed)} elapsed", f"about {_clock(left)} left"]
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
