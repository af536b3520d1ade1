"""Progress a person can watch, asked for with `progress=True`: a training bar (step, loss, the last
validation loss, tokens/s and the time left) and a bar over a large text (or many files) while it is
tokenized.
Both are tqdm's `auto` flavour: a widget in a notebook, a line on stderr in a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .events import EvalDone, Listener, StepDone

# Texts shorter than this are prepared in a few seconds: no bar.
FROM_CHARACTERS = 5_000_000


class TrainingProgress(Listener):
    """A bar from the session's first step to its last."""

    def __init__(self, initial: int, total: int):
        from tqdm.auto import tqdm

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
        in_notebook = type(self.bar).__module__.startswith("tqdm.notebook")
        self.bar.write(text, file=None if in_notebook else sys.stderr)

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


@contextmanager
def preparation(label: str, total: int, unit: str = "char") -> Iterator[Callable[[int], None]]:
    """A bar while a corpus is prepared (see data.load_corpus's `progress`): over the characters of a
    large text, or over the files of a corpus of several (shown once they take more than a moment:
    many files, or a lot of text in them)."""
    from tqdm.auto import tqdm

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

    with tqdm(total=total, desc=label, unit_scale=True, dynamic_ncols=True, leave=False, delay=1.0) as bar:
        yield bar.update
