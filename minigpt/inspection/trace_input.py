"""What a trace is given, checked before its pass: the tokens (a prompt or ids, exactly one), the
position to follow and the blocks to show, each refused in one line naming the flag or keyword."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import MinigptError, Phrase
from ..memory import check_memory, forward_bytes
from ..model.gpt import MiniGPT, check_token_ids
from ..text.tokenizer import TextTokenizer

GIVE_TOKENS = Phrase("pass {prompt} TEXT or {ids} 3,1,4")


def tokens_to_trace(tokenizer: TextTokenizer, prompt: str | None, ids: str | Sequence[int] | None) -> list[int]:
    """The ids a trace follows, from exactly one of a prompt or ids (a list, or "3,1,4")."""
    if (prompt is None) == (ids is None):
        raise MinigptError("give the tokens to trace with exactly one of {prompt} TEXT or {ids} 3,1,4")
    if ids is not None:
        ids = parse_ids(ids) if isinstance(ids, str) else list(ids)
        if not ids:
            raise MinigptError("{ids} is empty; give at least one token id, e.g. {ids} 3,1,4")
        return ids
    if prompt == "":
        raise MinigptError("the prompt is empty; trace needs at least one token: {give}", give=GIVE_TOKENS)
    return tokenizer.encode(prompt)  # a char tokenizer refuses characters it never saw


def parse_ids(text: str) -> list[int]:
    """`3,1,4` -> [3, 1, 4]; anything but comma-separated integers is refused."""
    if not text.strip():
        raise MinigptError("{ids} is empty; trace needs at least one token id, e.g. {ids} 3,1,4")
    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise MinigptError(
                "{ids} {text!r}: {strip!r} is not an integer; give comma-separated token ids, e.g. {ids} 3,1,4",
                text=text,
                strip=part.strip(),
            ) from None
    return ids


def check_ids(model: MiniGPT, ids: list[int], grad: bool = False) -> None:
    if not ids:
        raise MinigptError("the prompt has no tokens; trace needs at least one: {give}", give=GIVE_TOKENS)
    model.check_length(len(ids), "the prompt", "shorten the prompt")
    check_token_ids(ids, model.vocab_size)
    # A trace keeps every block's stages and attention weights: for GPT-2 at 1,024 tokens, gigabytes.
    # With its gradient, the graph's saved values and the gradients' rows too: about twice that.
    check_memory(
        forward_bytes(model.cfg, model.vocab_size, len(ids), recorded=True) * (2 if grad else 1),
        model.token_table.weight.device.type,
        f"tracing {len(ids)} tokens through this model (every block's stages kept)",
        "trace a shorter prompt",
    )


def resolve_position(position: int | None, length: int) -> int:
    """Default: the last token; negative counts from the end, as in Python."""
    if position is None:
        return length - 1
    index = position + length if position < 0 else position
    if not 0 <= index < length:
        raise MinigptError(
            "{position} {given} is beyond the prompt: it has {length} token(s), positions "
            "0..{value} (or -{length}..-1 from the end)",
            given=position,
            length=length,
            value=length - 1,
        )
    return index


def resolve_blocks(block: int | None, n_layer: int) -> list[int]:
    if block is None:
        return list(range(n_layer))
    index = block + n_layer if block < 0 else block
    if not 0 <= index < n_layer:
        raise MinigptError(
            "{block} {given} does not exist: the model has {n_layer} block(s), 0..{value} (or "
            "-{n_layer}..-1 from the end)",
            given=block,
            n_layer=n_layer,
            value=n_layer - 1,
        )
    return [index]
