"""Exact-match accuracy on prompt/answer examples: a task run's held-out examples, or the pairs of a
.jsonl file.

An example counts as right when greedy decoding from its prompt writes exactly its completion. That
is read from one forward pass over prompt + completion: greedy decoding reproduces the completion
if and only if, at every answer position, the most likely token given the right answer so far is
the next one (the first wrong token is where both part ways). Per-position accuracy is that
teacher-forced figure: how often answer token j is the most likely given the prompt and the right
tokens before it. The first few wrong examples are kept (`wrong_pairs`); the API decodes them
greedily, as `sample --greedy` writes them, into `wrong`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.gpt import MiniGPT
from ..text.examples import Pair, example_tensors
from ..text.tasks import lengths_text


@dataclass
class Accuracy:
    examples: int
    right: int  # examples whose whole completion greedy decoding writes
    per_position: list[float]  # answer token j right given the right tokens before it, per j
    wrong_pairs: list[Pair] = field(default_factory=list, repr=False)  # the first few wrong examples, as ids
    wrong: list[dict[str, str]] = field(default_factory=list)  # those: prompt, expected, got (greedy)
    what: str = ""  # which examples: "task reverse (8 letters), 1,000 held-out examples"
    length: int | None = None  # a task's examples at one length (eval --task-length): that length
    trained: bool | None = None  # and whether the run trained at it

    @property
    def accuracy(self) -> float:
        return self.right / self.examples

    def to_json(self) -> dict:
        shown = {
            "examples": self.examples,
            "right": self.right,
            "accuracy": self.accuracy,
            "per_position": self.per_position,
            "wrong": self.wrong,
            "what": self.what,
        }
        if self.length is not None:
            shown |= {"length": self.length, "trained": self.trained}
        return shown

    def __repr__(self) -> str:
        return f"Accuracy({self.right:,} of {self.examples:,} right = {100 * self.accuracy:.2f}%)"


@dataclass
class ByLength:
    """Exact match of a task run at each of several lengths (eval --task-length A-B): the lengths it
    trained on and those it did not, read by the same model."""

    task: str
    trained_lengths: range  # what the run trained on
    context: int  # [model] context: the trained length (or the learned table's rows)
    window: int | None  # the longest example the model accepts as read now (None: --extrapolate)
    rows: list[Accuracy]  # one per length, in order, each with its length and whether it was trained

    @property
    def trained_text(self) -> str:
        """The trained lengths as a reader writes them: "1-6", or "4"."""
        return lengths_text(self.trained_lengths)

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "trained_lengths": [self.trained_lengths.start, self.trained_lengths[-1]],
            "context": self.context,
            "window": self.window,
            "lengths": [
                {"length": r.length, "examples": r.examples, "right": r.right, "accuracy": r.accuracy}
                | {"trained": r.trained, "per_position": r.per_position}
                for r in self.rows
            ],
        }


@torch.inference_mode()
def accuracy(
    model: MiniGPT, pairs: list[Pair], writable: int | None = None, batch_size: int = 256, show: int = 5
) -> Accuracy:
    """Exact-match and per-position accuracy of `model` on `pairs`, keeping the first `show` wrong
    examples; `writable`: the ids the tokenizer has (a padded model has more)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    longest = max(len(c) for _, c in pairs)
    hits = torch.zeros(longest, dtype=torch.long)
    counts = torch.zeros(longest, dtype=torch.long)
    right, wrong = 0, []
    try:
        for at in range(0, len(pairs), batch_size):
            group = pairs[at : at + batch_size]
            x, y = example_tensors(group, str(device))
            logits, _ = model(x)
            best = logits[..., :writable].argmax(-1)
            for row, (prompt, completion) in enumerate(group):
                answer = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
                correct = (best[row, answer] == y[row, answer]).cpu()
                hits[: len(completion)] += correct.long()
                counts[: len(completion)] += 1
                if bool(correct.all()):
                    right += 1
                elif len(wrong) < show:
                    wrong.append((prompt, completion))
    finally:
        model.train(was_training)
    return Accuracy(len(pairs), right, (hits.double() / counts).tolist(), wrong_pairs=wrong)
