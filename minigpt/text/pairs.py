"""Prompt/answer pairs of your own: a .jsonl file of {"prompt": ..., "completion": ...} lines.

The last `val_fraction` of the lines (at least one) is held out for evaluation, the rest trained on
with the loss on completions only (examples.py). The tokenizer is fitted to the training lines'
prompts and completions (a fine-tune keeps its run's); a prompt and its completion are encoded
apart, as a prompt given to `sample` later is, so the answer starts on a token boundary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..config import Config
from ..errors import MinigptError
from .examples import Examples, Pair
from .reading import check_writable, read_text
from .sources import Document
from .tokenizer import TextTokenizer, train_tokenizer

SUFFIX = ".jsonl"


def is_pairs(data: str | list[str]) -> bool:
    """Whether `[train] data` names a .jsonl file of pairs."""
    names = [data] if isinstance(data, str) else data
    return any(Path(name).suffix == SUFFIX for name in names)


def read_pairs(path: Path) -> tuple[list[tuple[int, str, str]], str]:
    """Every line's (number, prompt, completion) and the file's sha256; a bad line is refused by number."""
    text, sha = read_text(path)
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise MinigptError(
                "{path} line {number} is not JSON ({reason}); each line must be one object "
                '{{"prompt": "...", "completion": "..."}}',
                path=path,
                number=number,
                reason=str(exc).split(":")[0],
            ) from None
        if not (isinstance(record, dict) and set(record) == {"prompt", "completion"}):
            raise MinigptError(
                '{path} line {number} is not an object with exactly the keys "prompt" and "completion" (it has '
                '{found}); write each line as {{"prompt": "...", "completion": "..."}}',
                path=path,
                number=number,
                found=", ".join(map(repr, record)) if isinstance(record, dict) else type(record).__name__,
            )
        prompt, completion = record["prompt"], record["completion"]
        if not (isinstance(prompt, str) and isinstance(completion, str) and prompt and completion):
            raise MinigptError(
                "{path} line {number}: prompt and completion must both be non-empty strings; fix or remove the line",
                path=path,
                number=number,
            )
        pairs.append((number, prompt, completion))
    if len(pairs) < 2:
        raise MinigptError(
            "{path} has {n} prompt/completion line(s); training needs at least two (one is held out)",
            path=path,
            n=len(pairs),
        )
    return pairs, sha


def pair_examples(cfg: Config, tokenizer: TextTokenizer | None = None, same_as=None) -> Examples:
    """The examples of the .jsonl file `[train] data` names, split, tokenized and checked."""
    data = cfg.train.data
    if not isinstance(data, str):
        raise MinigptError(
            "[train] data names a .jsonl file of pairs among other paths; a run trains on one .jsonl file alone"
        )
    path = Path(data)
    lines, sha = read_pairs(path)
    held = max(1, math.floor(len(lines) * cfg.train.val_fraction))
    training, held_out = lines[:-held], lines[-held:]
    if same_as is not None and same_as != [(path.name, sha)]:
        raise MinigptError(
            "{path} here is not the file rank 0 trains on; every machine needs the same file at the same path",
            path=path,
        )
    training_text = "".join(p + c for _, p, c in training)
    if tokenizer is None:
        unseen = sorted(set("".join(p + c for _, p, c in held_out)) - set(training_text))
        if cfg.tokenizer.kind == "char" and unseen:
            raise MinigptError(
                "held-out lines of {path} (the last {held}) have characters the training lines never use ({shown}); "
                'use tokenizer.kind = "bpe" or "byte", or change val_fraction',
                path=path,
                held=held,
                shown=" ".join(map(repr, unseen[:10])),
            )
        tokenizer = TextTokenizer(train_tokenizer(cfg.tokenizer.kind, cfg.tokenizer.vocab_size, training_text))
    else:
        check_writable(tokenizer, "".join(p + c for _, p, c in lines), path)
    pairs = encode_pairs(lines, tokenizer, cfg.model.context, path)
    train_pairs, held_pairs = pairs[:-held], pairs[-held:]

    def draw(n: int, generator: torch.Generator) -> list[Pair]:
        return [train_pairs[i] for i in torch.randint(len(train_pairs), (n,), generator=generator).tolist()]

    count = lambda chosen: sum(len(p) + len(c) for p, c in chosen)  # noqa: E731
    return Examples(
        tokenizer,
        draw,
        held_pairs,
        sha,
        path,
        str(path),
        f"{len(train_pairs):,} prompt/completion pairs from {path} ({held:,} more held out)",
        documents=[Document(path.name, sha, count(train_pairs), count(held_pairs))],
    )


def encode_pairs(lines: list[tuple[int, str, str]], tokenizer: TextTokenizer, context: int, path: Path) -> list[Pair]:
    """Each line's prompt and completion encoded apart; a line longer than one window is refused."""
    prompts = tokenizer.encode_lines([p for _, p, _ in lines])
    completions = tokenizer.encode_lines([c for _, _, c in lines])
    pairs: list[Pair] = []
    for (number, _, _), prompt, completion in zip(lines, prompts, completions):
        if len(prompt) + len(completion) - 1 > context:
            raise MinigptError(
                "{path} line {number} is {n} tokens (prompt {p} + completion {c}), one window of at most "
                "[model] context + 1 = {most}; shorten it, or raise [model] context",
                path=path,
                number=number,
                n=len(prompt) + len(completion),
                p=len(prompt),
                c=len(completion),
                most=context + 1,
            )
        pairs.append((prompt, completion))
    return pairs
