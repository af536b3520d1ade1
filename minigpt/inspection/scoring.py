"""Score a whole text with a trained model: every token once, with as much left context as the
position table allows.

The first window reads tokens 0 .. context-1 and scores tokens 1 .. context (token 0 has no
prediction). Each later window moves by stride = context // 2 and scores only the tokens it adds,
predicted from its last `stride` positions: every one of them sees at least context - stride + 1
> context / 2 tokens to its left. The last window ends at the last token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.gpt import MiniGPT


@dataclass
class Scores:
    ids: list[int]  # the text's token ids
    surprisal: list[float]  # nats, for ids[1:] (one per scored token)
    bytes: int  # UTF-8 bytes of the text
    # the fewest tokens a window after the first read before its first scored target; None where the
    # text fits one window (every token then reads all the tokens before it)
    least_left_context: int | None = None

    @property
    def tokens(self) -> int:
        return len(self.surprisal)

    @property
    def nats_per_token(self) -> float:
        return math.fsum(self.surprisal) / self.tokens

    @property
    def bits_per_byte(self) -> float:
        """Mean nats per token x tokens per byte / ln 2: the definition training's val_bpb uses."""
        return self.nats_per_token * len(self.ids) / self.bytes / math.log(2)

    @property
    def perplexity(self) -> float:
        """e^(nats per token); infinite past what a float holds (a diverged model's loss can be)."""
        nats = self.nats_per_token
        return math.exp(nats) if nats < 709 else math.inf

    def __repr__(self) -> str:  # a notebook shows the figures, not every surprisal
        return (
            f"Scores({self.tokens:,} tokens scored, {self.nats_per_token:.4f} nats/token, "
            f"{self.bits_per_byte:.4f} bits/byte, perplexity {self.perplexity:.2f})"
        )


def windows(n_tokens: int, context: int) -> list[tuple[int, int, int]]:
    """(start, first, end) per window: targets first .. end-1 are scored from the tokens start ..
    end-2 (at most `context` of them; the last target is predicted, not read). Every target
    1 .. n-1 is scored exactly once."""
    stride = max(1, context // 2)
    end = min(context + 1, n_tokens)
    out = [(0, 1, end)]
    while end < n_tokens:
        first, end = end, min(end + stride, n_tokens)
        out.append((end - 1 - context, first, end))
    return out


@torch.inference_mode()
def score(model: MiniGPT, ids: list[int], text_bytes: int, batch_size: int = 64, writable: int | None = None) -> Scores:
    """The surprisal of every token after the first, in nats (float32 or the model's dtype), under
    the distribution sampling draws from: over the ids the tokenizer can write (`writable`, when a
    padded model has more rows than that)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    spans = windows(len(ids), model.context)
    text = torch.tensor(ids, dtype=torch.long, device=device)
    surprisal: list[float] = []
    try:
        for at in range(0, len(spans), batch_size):
            group = spans[at : at + batch_size]
            # Windows read end - 1 - start tokens; a shorter one (only ever the first) is padded on
            # the right, which no earlier position can see.
            width = max(end - 1 - start for start, _, end in group)
            batch = torch.stack(
                [F.pad(text[start : end - 1], (0, width - (end - 1 - start))) for start, _, end in group]
            )
            logits, _ = model(batch)
            nats = -torch.log_softmax(logits[..., :writable].double(), dim=-1)
            for row, (start, first, end) in enumerate(group):
                targets = text[first:end]
                positions = torch.arange(first - 1 - start, end - 1 - start, device=device)
                surprisal += nats[row, positions, targets].tolist()
    finally:
        model.train(was_training)
    least = min((first - start for start, first, _ in spans[1:]), default=None)
    return Scores(list(ids), surprisal, text_bytes, least)
