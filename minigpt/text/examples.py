"""Prompt/answer examples as a training corpus: a generated task's (tasks.py) or a .jsonl file's
(pairs.py), with the loss taken on the answers only.

An example is a prompt's ids followed by its completion's. A batch is its examples, each read as
inputs s[:-1] and next-token targets s[1:], padded on the right to the longest in the batch; a
target is IGNORE (cross-entropy skips it) where it is a prompt token or padding, so only the
completion's tokens are predicted, and a prompt position gets no gradient from its own next token.
Padding sits after every real token, where the causal mask keeps it out of what they see.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from .tokenizer import TextTokenizer

IGNORE = -100  # F.cross_entropy's default ignore_index
Pair = tuple[list[int], list[int]]  # (prompt ids, completion ids)


def example_tensors(pairs: list[Pair], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs [B, W] and targets [B, W] (W: the longest example less one), targets IGNORE on the
    prompt's tokens and on padding."""
    width = max(len(p) + len(c) for p, c in pairs) - 1
    x = torch.zeros(len(pairs), width, dtype=torch.long)
    y = torch.full((len(pairs), width), IGNORE, dtype=torch.long)
    for row, (prompt, completion) in enumerate(pairs):
        ids = torch.tensor(prompt + completion, dtype=torch.long)
        x[row, : len(ids) - 1] = ids[:-1]
        # Target j predicts ids[j + 1]: a completion token from j = len(prompt) - 1 on.
        y[row, len(prompt) - 1 : len(ids) - 1] = ids[len(prompt) :]
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@dataclass
class Examples:
    """What a run on examples trains with: the tokenizer, a way to draw training examples with the
    batch generator, and the held-out examples it evaluates on (never drawn for training)."""

    tokenizer: TextTokenizer
    draw: Callable[[int, torch.Generator], list[Pair]]  # n training examples, drawn with the generator
    held_out: list[Pair]
    sha256: str  # what the examples are: the .jsonl file's, or the task's description's
    path: Path  # the .jsonl file, or the run's config for a task
    source: str  # in a few words, for messages
    summary: str  # the training examples in a few words, for the line before the first step
    task: Any = None  # the tasks.Task, for a task run
    documents: list = field(default_factory=list)  # one corpus.Document, what a checkpoint records

    @property
    def files(self) -> list[tuple[str, str]]:
        return [(d.name, d.sha256) for d in self.documents]

    @property
    def sample_start(self) -> str:
        """A sample during training continues the first held-out prompt (unless sample_prompt says)."""
        return self.tokenizer.decode(self.held_out[0][0])

    def row_tokens(self, context: int) -> int:
        """Tokens one row of a batch reads, on average: an example less its last token (read at
        every step: computed once)."""
        return self._row_tokens

    @cached_property
    def _row_tokens(self) -> int:
        return round(sum(len(p) + len(c) - 1 for p, c in self.held_out) / len(self.held_out))

    @cached_property
    def val_tokens_per_byte(self) -> float:
        """Of the held-out completions (the only tokens scored), so bits per byte means what it means
        for a text: bits per byte of answer."""
        tokens = sum(len(c) for _, c in self.held_out)
        return tokens / sum(len(self.tokenizer.decode(c).encode("utf-8")) or 1 for _, c in self.held_out)

    def training_batches(self, context: int, batch_size: int, device: str, rank: int, world_size: int):
        return ExampleBatches(self.draw, batch_size, device, rank, world_size)

    def validation_windows(
        self, context: int, batch_size: int, device: str, rank: int, world_size: int, n_batches: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The held-out examples in order, as many whole global batches as `n_batches` and their
        number allow (at least one, repeating them when there are fewer than a batch)."""
        size = batch_size * world_size
        count = max(size, min(len(self.held_out), n_batches * size) // size * size)
        chosen = (self.held_out * math.ceil(count / len(self.held_out)))[:count]
        return [
            example_tensors(chosen[at : at + size][rank * batch_size : (rank + 1) * batch_size], device)
            for at in range(0, count, size)
        ]


class ExampleBatches:
    """Training batches of examples, as corpus.Batches draws windows: the global batch one process
    would draw, of which this rank keeps its rows."""

    def __init__(self, draw, batch_size: int, device: str = "cpu", rank: int = 0, world_size: int = 1):
        self.draw, self.batch_size, self.device = draw, batch_size, device
        self.rank, self.world_size = rank, world_size

    def sample(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = self.draw(self.batch_size * self.world_size, generator)
        return example_tensors(pairs[self.rank * self.batch_size : (self.rank + 1) * self.batch_size], self.device)
