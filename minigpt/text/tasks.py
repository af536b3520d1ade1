"""Tasks whose answer a learner can check: each example is a prompt and the one right completion.

    reverse   qwertyui=  ->  iuytrewq.       sort   qwertyui=  ->  eiqrtuwy.
    copy      qwertyui=  ->  qwertyui.       add    042+919=   ->  0961.

With `[train] task_start` every prompt starts with that constant text (">qwertyui="): the papers'
prompts do, and a model without positions (positions = "none") can count from a constant first
token.

The inputs are drawn uniformly (letters a-z, or digits of zero-padded numbers), so every example of
a task at one length has the same shape and the answer always starts at the same position; the
final "." marks the end, so a sample knows where the answer stops. Examples are drawn from torch
generators: the run's own batch generator for training (saved in every checkpoint, so a resumed run
draws what the interrupted one would have) and one seeded from the run's seed for the held-out
examples, which training never draws (a training example equal to a held-out one is drawn again).

With `[train] task_lengths = "A-B"` a run trains at mixed lengths: each example's length is drawn
uniformly from A..B, then its symbols (a batch pads its rows, examples.py). The held-out examples
are held out per length, each length's drawn as a run at that one length draws them, so the
examples at a length are the same whatever range a run trained on, and a length it never trained
on (`minigpt eval --task-length`) is read the same way.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch

from ..config import Config, TrainConfig, length_range
from ..errors import MinigptError
from .examples import Examples, Pair
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
    start: str = ""  # [train] task_start: the constant text every prompt starts with

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
        own = self.symbols + ("+=." if self.name == "add" else "=.")
        return own + "".join(sorted(set(self.start) - set(own)))

    @property
    def prompt_length(self) -> int:
        return len(self.start) + self.drawn + (2 if self.name == "add" else 1)

    @property
    def completion_length(self) -> int:
        return self.length + (2 if self.name == "add" else 1)

    def example(self, drawn: str) -> tuple[str, str]:
        """(prompt, completion) of the example whose drawn symbols are `drawn`."""
        prompt, completion = _FORMATS[self.name](drawn, self.length)
        return self.start + prompt, completion

    @property
    def window(self) -> int:
        """Tokens a model reads for one example: prompt and completion, less the last token."""
        return self.prompt_length + self.completion_length - 1

    def describe(self, drawn: str, lengths: range | None = None) -> str:
        """The task in one line, with the example of `drawn` (e.g. the first held-out input);
        `lengths`: the mixed lengths of a run, if it trained at more than this one."""
        unit = "digits per number" if self.name == "add" else "letters"
        prompt, completion = self.example(drawn)
        size = lengths_text(lengths) if lengths is not None else str(self.length)
        return f"task {self.name} ({size} {unit}), e.g. {prompt!r} -> {completion!r}"

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

    def held_out_count(self, wanted: int) -> int:
        """Examples held out at this length when `wanted` are asked of every length of a range: at
        most half the length's inputs (a length of 1 letter has 26), so training keeps the rest."""
        return min(wanted, self.size // 2)


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


def task_of(name: str, length: int, start: str = "") -> Task:
    """The [train] task and task_length (0: the task's default size), prompts starting with `start`."""
    return Task(name, length or DEFAULT_LENGTH[name], start)


def trained_lengths(tc: TrainConfig) -> range:
    """The lengths a task run trains on: `task_lengths`' range, or `task_length` alone."""
    if tc.task_lengths:
        lengths = length_range(tc.task_lengths)
        assert lengths is not None, "config validation refuses a task_lengths that is not a range"
        return lengths
    length = task_of(tc.task, tc.task_length).length
    return range(length, length + 1)


def lengths_text(lengths: range) -> str:
    """A range of lengths as task_lengths and --task-length write it: 8, or 1-8."""
    return str(lengths.start) if len(lengths) == 1 else f"{lengths.start}-{lengths[-1]}"


def task_tokenizer(task: Task) -> TextTokenizer:
    """A task run's own tokenizer: one id per character the task writes."""
    return TextTokenizer(train_tokenizer("char", 0, task.characters))


def held_out_at(cfg: Config, tokenizer: TextTokenizer, length: int) -> tuple[list[Pair], str]:
    """A task run's held-out examples at `length` letters (digits per number for add), as ids, and
    the task at that length in one line. At a length it trained on, the ones training held out; at
    another, the ones a run at that length would hold out: never seen either way."""
    tc = cfg.train
    task = Task(tc.task, length, tc.task_start)
    # A run at this one length held out task_held_out, which training checked is at most half.
    inputs = task.held_out(task.held_out_count(tc.task_held_out), tc.seed)
    return [_encoded(task, tokenizer, d) for d in inputs], task.describe(inputs[0])


def _encoded(task: Task, tokenizer: TextTokenizer, drawn: str) -> Pair:
    prompt, completion = task.example(drawn)
    return tokenizer.encode(prompt), tokenizer.encode(completion)


def task_examples(cfg: Config, tokenizer: TextTokenizer | None = None, same_as=None) -> Examples:
    """A task run's examples: `[train] task` at `task_length` (or at each of `task_lengths`),
    `task_held_out` held out (of each length), drawn from the run's seed. `tokenizer`: a fine-tune's
    (or rank 0's), which must write every character; otherwise a character tokenizer of the task's
    characters. `same_as`: rank 0's (name, sha256)."""
    tc, context = cfg.train, cfg.model.context
    lengths = trained_lengths(tc)
    mixed = bool(tc.task_lengths)
    tasks = {length: Task(tc.task, length, tc.task_start) for length in lengths}
    task = tasks[lengths[-1]]  # the longest: the one that must fit the context
    given = f'task_lengths = "{tc.task_lengths}"' if mixed else f"task_length = {task.length}"
    if task.window > context:
        raise MinigptError(
            '[train] task = "{task}" at {given} reads {window} tokens per example (prompt {prompt} '
            "+ completion {completion}, less the last), more than [model] context = {context}; set context to at "
            "least {window}, or {smaller}",
            task=task.name,
            given=given,
            window=task.window,
            prompt=task.prompt_length,
            completion=task.completion_length,
            context=context,
            smaller="a shorter range of task_lengths" if mixed else "a smaller task_length",
        )
    if not mixed and 2 * tc.task_held_out > task.size:
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
        tokenizer = task_tokenizer(task)
    unknown = tokenizer.unknown_characters(task.characters)
    if unknown:
        raise MinigptError(
            "the run's tokenizer cannot write {shown}, which task {task} uses; fine-tune a task run from a run "
            "of the same task, or from one with a byte-level tokenizer",
            shown=" ".join(map(repr, unknown)),
            task=task.name,
        )

    if mixed:
        # Held out per length; listed longest first and taking turns, so the first few (a validation
        # pass, the sample during training) hold every length, and the first is a full-length one.
        per_length = [
            [(t, d) for d in t.held_out(t.held_out_count(tc.task_held_out), tc.seed)]
            for t in (tasks[n] for n in reversed(lengths))
        ]
        held_inputs = [example for turn in zip_longest(*per_length) for example in turn if example is not None]
        draw = _mixed_draw(tasks, tokenizer, {d for _, d in held_inputs})
    else:
        held_inputs = [(task, d) for d in task.held_out(tc.task_held_out, tc.seed)]
        draw = _one_length_draw(task, tokenizer, {d for _, d in held_inputs})

    described = task.describe(held_inputs[0][1], lengths if mixed else None)
    identity = {"task": task.name, "length": task.length, "held_out": tc.task_held_out, "seed": tc.seed}
    if mixed:  # a run at one length keeps the sha256 it always had
        identity["lengths"] = [lengths.start, lengths[-1]]
    if tc.task_start:  # and a run without a constant start too
        identity["start"] = tc.task_start
    sha = hashlib.sha256(json.dumps(identity).encode()).hexdigest()
    name = f"task:{task.name}"
    if same_as is not None and same_as != [(name, sha)]:
        raise MinigptError("this rank's task is not rank 0's; launch every process with the same config")
    held_out = [_encoded(t, tokenizer, d) for t, d in held_inputs]
    held = f"{tc.task_held_out:,} of each length held out" if mixed else f"{tc.task_held_out:,} held out"
    return Examples(
        tokenizer,
        draw,
        held_out,
        sha,
        Path(name),
        described,
        f"{described}; training examples drawn from the seed, {held}",
        task=task,
        documents=[Document(name, sha, 0, sum(t.completion_length for t, _ in held_inputs))],
    )


def _one_length_draw(
    task: Task, tokenizer: TextTokenizer, held: set[str]
) -> Callable[[int, torch.Generator], list[Pair]]:
    def draw(n: int, generator: torch.Generator) -> list[Pair]:
        pairs: list[Pair] = []
        while len(pairs) < n:  # a held-out input is drawn again: training never sees one
            pairs += [_encoded(task, tokenizer, d) for d in task.draw(n - len(pairs), generator) if d not in held]
        return pairs

    return draw


def _mixed_draw(
    tasks: dict[int, Task], tokenizer: TextTokenizer, held: set[str]
) -> Callable[[int, torch.Generator], list[Pair]]:
    lengths = list(tasks)
    symbols = tasks[lengths[0]].symbols

    def draw(n: int, generator: torch.Generator) -> list[Pair]:
        chosen = torch.randint(lengths[0], lengths[-1] + 1, (n,), generator=generator).tolist()
        inputs: list[str] = [""] * n
        todo = list(range(n))
        while todo:  # a held-out input is drawn again, at the same length: training never sees one
            widest = max(tasks[chosen[i]].drawn for i in todo)
            picks = torch.randint(len(symbols), (len(todo), widest), generator=generator).tolist()
            again = []
            for i, row in zip(todo, picks):
                drawn = "".join(symbols[s] for s in row[: tasks[chosen[i]].drawn])
                if drawn in held:
                    again.append(i)
                else:
                    inputs[i] = drawn
            todo = again
        return [_encoded(tasks[length], tokenizer, d) for length, d in zip(chosen, inputs)]

    return draw
