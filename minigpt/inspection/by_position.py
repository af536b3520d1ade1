"""Loss by position: how well a model predicts the next token at each position of a window, so the
cliff at the length it was trained at can be seen.

The text is cut into windows of `length` tokens that do not overlap, as training's batches are:
window k reads tokens kN .. kN+N-1 and is scored against tokens kN+1 .. kN+N, so position p is the
prediction of token p+1 from tokens 0..p of its window, always read from position 0 (one forward
pass per window, no sliding). The loss at a position is averaged over the windows. A model trained
at `context` tokens has read positions 0 .. context-1 only; positions from `context` on are past
its trained length (reachable for every positions but learned with --extrapolate, or with rope scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..model.gpt import MiniGPT
from ..model.reading import Reading

LOGIT_BUDGET = 2**25  # logits computed at once (windows x positions x vocabulary): a batch's memory bound


@dataclass
class PositionLosses:
    """The mean next-token loss at each position of `windows` windows of `length` tokens."""

    length: int  # N: positions per window
    trained_length: int  # [model] context: positions 0 .. trained_length-1 were trained
    windows: int  # how many windows each position's mean is over
    nats: list[float]  # mean loss at positions 0 .. length-1, in nats
    extrapolate: bool  # read past the trained length on purpose
    rope_scaling: str | None  # the rope scaling rule it was read with ("yarn:4"), if any

    @property
    def bits(self) -> list[float]:
        return [n / math.log(2) for n in self.nats]

    def past_trained_length(self, position: int) -> bool:
        """Whether the prediction at `position` reads more tokens than the model was trained on."""
        return position >= self.trained_length

    @property
    def mean_inside(self) -> float:
        """The mean loss over the positions inside the trained length (each is over `windows`)."""
        inside = self.nats[: self.trained_length]
        return math.fsum(inside) / len(inside)

    @property
    def mean_past(self) -> float | None:
        """The mean loss over the positions past the trained length (None: the windows stop there)."""
        past = self.nats[self.trained_length :]
        return math.fsum(past) / len(past) if past else None

    def to_json(self) -> dict:
        return {
            "length": self.length,
            "trained_length": self.trained_length,
            "windows": self.windows,
            "extrapolate": self.extrapolate,
            "rope_scaling": self.rope_scaling,
            "positions": [
                {"position": p, "nats": nats, "bits": bits, "past_trained_length": self.past_trained_length(p)}
                for p, (nats, bits) in enumerate(zip(self.nats, self.bits))
            ],
            "mean_inside": self.mean_inside,
            "mean_past": self.mean_past,
        }

    def __repr__(self) -> str:  # a notebook shows the figures, not every position
        past = f", past it {self.mean_past:.4f}" if self.mean_past is not None else ""
        return (
            f"PositionLosses({self.windows:,} windows of {self.length} tokens, trained at {self.trained_length}: "
            f"mean nats inside {self.mean_inside:.4f}{past})"
        )


def window_starts(n_tokens: int, length: int, most: int | None = None) -> list[int]:
    """Where each window starts: windows of `length` inputs (and the token after them as the last
    target) that do not overlap, as many as the text holds; `most` of them spread evenly over the
    text when fewer are asked for (the first always among them)."""
    count = (n_tokens - 1) // length
    picked = range(count) if most is None or most >= count else (k * count // most for k in range(most))
    return [k * length for k in picked]


@torch.inference_mode()
def loss_by_position(
    model: MiniGPT,
    ids: list[int],
    length: int,
    windows: int | None = None,
    writable: int | None = None,
    reading: Reading | None = None,
) -> PositionLosses:
    """The mean next-token loss at each position 0 .. length-1 over the text's windows (see the
    module), under the distribution sampling draws from (over the ids the tokenizer can write,
    `writable`), the model read as `reading` says (default: its default reading). The caller
    checks first that the reading accepts `length` tokens (Reading.refuse_length) and that the
    text holds at least one window (length + 1 tokens)."""
    reading = model.reading if reading is None else reading
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    starts = window_starts(len(ids), length, windows)
    text = torch.tensor(ids, dtype=torch.long, device=device)
    total = torch.zeros(length, dtype=torch.float64, device=device)
    vocabulary = writable or model.vocab_size
    batch_size = max(1, min(64, LOGIT_BUDGET // (length * vocabulary)))
    try:
        for at in range(0, len(starts), batch_size):
            group = torch.tensor(starts[at : at + batch_size], device=device)
            spans = group[:, None] + torch.arange(length + 1, device=device)  # [B, N+1] token indices
            tokens = text[spans]
            logits, _ = model(tokens[:, :-1], reading=reading)  # every window from position 0
            nats = -torch.log_softmax(logits[..., :vocabulary].double(), dim=-1)
            total += nats.gather(-1, tokens[:, 1:, None]).squeeze(-1).sum(0)  # [N]
    finally:
        model.train(was_training)
    return PositionLosses(
        length=length,
        trained_length=model.context,
        windows=len(starts),
        nats=(total / len(starts)).tolist(),
        extrapolate=reading.extrapolate,
        rope_scaling=None if reading.user_rule is None else str(reading.user_rule),
    )
