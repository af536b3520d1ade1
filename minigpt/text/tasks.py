"""Tasks whose answer a learner can check: each example is a prompt and the one right completion.

    reverse   qwertyui=  ->  iuytrewq.       sort   qwertyui=  ->  eiqrtuwy.
    copy      qwertyui=  ->  qwertyui.       add    042+919=   ->  0961.

The inputs are drawn uniformly (letters a-z, or digits of zero-padded numbers), so every example of
a task has the same length and the answer always starts at the same position; the final "." marks
the end, so a sample knows where the answer stops. Examples are drawn from torch generators: the
run's own batch generator for training (saved in every checkpoint, so a resumed run draws what the
interrupted one would have) and one seeded from the run's seed for the held-out examples, which
training never draws (a training example equal to a held-out one is drawn again).
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import Config
from ..errors import MinigptError
from .examples import Examples
from .sources import Document
from .tokenizer import TextTokenizer, train_tokenizer

LETTERS = string.ascii_lowercase
DIGITS = string.digits
# Added to the run's seed for the held-out examples' generator: a stream apart from the batches'.
HELD_OUT_SEED = 7_919


@dataclass(frozen=True)
class Task:
    """One task at one size: `length` letters per input, or `length` digits per number (add)."""

    name: str
    length: int

    @property
    def symbols(self) -> str:
        """What each drawn position is drawn from."""
        return DIGITS if self.name == "add" else LETTERS

    @property
    def drawn(self) -> int:
        """Symbols drawn per example: the input's letters, or both numbers' digits."""
        return 2 * self.length if self.name == "add" else self.length

    @property
    def characters(self) -> str:
        """Every character an example can hold: the character tokenizer's vocabulary."""
        return self.symbols + ("+=." if self.name == "add" else "=.")

    @property
    def prompt_length(self) -> int:
        return self.drawn + (2 if self.name == "add" else 1)

    @property
    def completion_length(self) -> int:
        return self.length + (2 if self.name == "add" else 1)

    def example(self, drawn: str) -> tuple[str, str]:
        """(prompt, completion) of the example whose drawn symbols are `drawn`."""
        return _FORMATS[self.name](drawn, self.length)

    def describe(self, drawn: str) -> str:
        """The task in one line, with the example of `drawn` (e.g. the first held-out input)."""
        unit = "digits per number" if self.name == "add" else "letters"
        prompt, completion = self.example(drawn)
        return f"task {self.name} ({self.length} {unit}), e.g. {prompt!r} -> {completion!r}"

    def draw(self, n: int, generator: torch.Generator) -> list[str]:
        """`n` inputs, each `drawn` symbols, drawn uniformly with `generator`."""
        picks = torch.randint(len(self.symbols), (n, self.drawn), generator=generator).tolist()
        return ["".join(self.symbols[i] for i in row) for row in picks]

    def held_out(self, n: int, seed: int) -> list[str]:
        """The `n` distinct held-out inputs of a run with this seed, in the order drawn (task_examples
        refuses an `n` over half the task's inputs first: training would have little else to draw)."""
        generator = torch.Generator().manual_seed(seed + HELD_OUT_SEED)
        seen: dict[str, None] = {}
        while len(seen) < n:
            for drawn in self.draw(n - len(seen), generator):
                seen.setdefault(drawn, None)
        return list(seen)[:n]

    @property
    def size(self) -> int:
        """How many distinct inputs the task has."""
        return len(self.symbols) ** self.drawn


def _reverse(drawn: str, length: int) -> tuple[str, str]:
    return drawn + "=", drawn[::-1] + "."


def _sort(drawn: str, length: int) -> tuple[str, str]:
    return drawn + "=", "".join(sorted(drawn)) + "."


def _copy(drawn: str, length: int) -> tuple[str, str]:
    return drawn + "=", drawn + "."


def _add(drawn: str, length: int) -> tuple[str, str]:
    # Zero-padded numbers and a sum of length + 1 digits: every example has one shape.
    a, b = drawn[:length], drawn[length:]
    return f"{a}+{b}=", f"{int(a) + int(b):0{length + 1}d}."


_FORMATS: dict[str, Callable[[str, int], tuple[str, str]]] = {
    "reverse": _reverse,
    "sort": _sort,
    "copy": _copy,
    "add": _add,
}
DEFAULT_LENGTH = {"reverse": 8, "sort": 8, "copy": 8, "add": 3}


def task_of(name: str, length: int) -> Task:
    """The [train] task and task_length (0: the task's default size)."""
    return Task(name, length or DEFAULT_LENGTH[name])


def task_examples(cfg: Config, tokenizer: TextTokenizer | None = None, same_as=None) -> Examples:
    """A task run's examples: `[train] task` at `task_length`, `task_held_out` held out, drawn from
    the run's seed. `tokenizer`: a fine-tune's (or rank 0's), which must write every character;
    otherwise a character tokenizer of the task's characters. `same_as`: rank 0's (name, sha256)."""
    tc, context = cfg.train, cfg.model.context
    task = task_of(tc.task, tc.task_length)
    window = task.prompt_length + task.completion_length - 1
    if window > context:
        raise MinigptError(
            '[train] task = "{task}" at task_length = {length} reads {window} tokens per example (prompt {prompt} '
            "+ completion {completion}, less the last), more than [model] context = {context}; set context to at "
            "least {window}, or a smaller task_length",
            task=task.name,
            length=task.length,
            window=window,
            prompt=task.prompt_length,
            completion=task.completion_length,
            context=context,
        )
    if 2 * tc.task_held_out > task.size:
        raise MinigptError(
            '[train] task = "{task}" at task_length = {length} has only {size:,} distinct inputs, too few to hold '
            "out task_held_out = {held} and train on the rest; hold out at most {most:,}, or make task_length larger",
            task=task.name,
            length=task.length,
            size=task.size,
            held=tc.task_held_out,
            most=task.size // 2,
        )
    if tokenizer is None:
        tokenizer = TextTokenizer(train_tokenizer("char", 0, task.characters))
    unknown = tokenizer.unknown_characters(task.characters)
    if unknown:
        raise MinigptError(
            "the run's tokenizer cannot write {shown}, which task {task} uses; fine-tune a task run from a run "
            "of the same task, or from one with a byte-level tokenizer",
            shown=" ".join(map(repr, unknown)),
            task=task.name,
        )

    def encode(drawn: str) -> tuple[list[int], list[int]]:
        prompt, completion = task.example(drawn)
        return tokenizer.encode(prompt), tokenizer.encode(completion)

    held_inputs = task.held_out(tc.task_held_out, tc.seed)
    held = set(held_inputs)

    def draw(n: int, generator: torch.Generator) -> list[tuple[list[int], list[int]]]:
        pairs: list[tuple[list[int], list[int]]] = []
        while len(pairs) < n:  # a held-out input is drawn again: training never sees one
            pairs += [encode(d) for d in task.draw(n - len(pairs), generator) if d not in held]
        return pairs

    described = task.describe(held_inputs[0])
    sha = hashlib.sha256(
        json.dumps({"task": task.name, "length": task.length, "held_out": tc.task_held_out, "seed": tc.seed}).encode()
    ).hexdigest()
    name = f"task:{task.name}"
    if same_as is not None and same_as != [(name, sha)]:
        raise MinigptError("this rank's task is not rank 0's; launch every process with the same config")
    return Examples(
        tokenizer,
        draw,
        [encode(d) for d in held_inputs],
        sha,
        Path(name),
        described,
        f"{described}; training examples drawn from the seed, {tc.task_held_out:,} held out",
        task=task,
        documents=[Document(name, sha, 0, sum(task.completion_length for _ in held_inputs))],
    )
