"""`--only positions`: rotary and ALiBi positions against the learned table, training through the
CLI and sampling in this process."""

from __future__ import annotations

from pathlib import Path

import torch

from minigpt.config import load_config
from minigpt.model.gpt import MiniGPT
from minigpt.text.corpus import load_corpus

from .processes import cli_tokens_per_s
from .sampling import bench_sampling
from .shapes import SHAPE

POSITION_SCHEMES = ("learned", "rope", "alibi")


def positions_benchmark(config: str | None, env: dict, scratch: Path, steps: int = 100, rounds: int = 3) -> dict:
    """Rotary and ALiBi positions against the learned table at the comparison shape, as a user runs
    each: `minigpt train --set model.positions=...` (a subprocess; tokens/s over its metrics log),
    rounds alternating between the schemes, the best round of each; then sampling at batch 1 in
    this process, rounds alternating likewise (bench_sampling: 1000 tokens, sliding window past the
    context, so every step past it recomputes a full window and its rotations) on each scheme's
    fresh model. Target: rope
    within 10% of learned in both."""
    cfg = load_config(config, SHAPE)
    per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
    train: dict[str, list[float]] = {scheme: [] for scheme in POSITION_SCHEMES}
    for _ in range(rounds):
        for scheme in POSITION_SCHEMES:
            changes = [*SHAPE, f'model.positions="{scheme}"']
            out = scratch / f"positions-{scheme}"
            train[scheme].append(cli_tokens_per_s(config, changes, steps, per_step, out, env))
    corpus = load_corpus(cfg)
    models = {}
    for scheme in POSITION_SCHEMES:
        torch.manual_seed(0)
        models[scheme] = MiniGPT(
            load_config(config, [*SHAPE, f'model.positions="{scheme}"']).model, corpus.tokenizer.vocab_size
        )
    # rounds alternating between the schemes, as the training runs do: the machine's drift falls on all alike
    sampling: dict[str, dict] = {}
    for _ in range(rounds):
        for scheme, model in models.items():
            found, best = bench_sampling(model, corpus.tokenizer), sampling.get(scheme)
            for mode in ("with_kv_cache_tokens_per_s", "without_kv_cache_tokens_per_s"):
                found[mode] = max(found[mode], best[mode]) if best else found[mode]
            sampling[scheme] = found
    return {
        "train_tokens_per_s": {scheme: [round(x) for x in runs] for scheme, runs in train.items()},
        "sampling": sampling,
    }


def positions_rows(positions: dict, row) -> None:
    train, sampling = positions["train_tokens_per_s"], positions["sampling"]
    for scheme in POSITION_SCHEMES[1:]:
        row(
            f"train tokens/s, positions {scheme} (nanoGPT column: learned)",
            max(train[scheme]),
            max(train["learned"]),
            "tokens/s",
            ">= 0.9x" if scheme == "rope" else "",
        )
        for mode in ("with_kv_cache", "without_kv_cache"):
            row(
                f"sampling tokens/s {mode.replace('_', ' ')}, positions {scheme} (nanoGPT column: learned)",
                sampling[scheme][f"{mode}_tokens_per_s"],
                sampling["learned"][f"{mode}_tokens_per_s"],
                "tokens/s",
                ">= 0.9x" if scheme == "rope" else "",
            )
