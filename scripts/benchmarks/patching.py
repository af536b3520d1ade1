"""`--only patching`: the activation patching sweeps on GPT-2 small's shape and the default
config's, timed and set against the arithmetic they need at the float32 matmul peak."""

from __future__ import annotations

import math
import sys
import time

import torch

from minigpt.config import load_config


def patching_benchmark(config: str | None, peak_float32: float, repeats: int = 2) -> dict:
    """Seconds of each patching sweep (best of `repeats`), on GPT-2 small's shape and the default
    config's shape with random weights, and the arithmetic the sweep computes (forward FLOPs of
    the rows it recomputes), so the figure can be set against the float32 matmul peak."""
    from minigpt.config import ModelConfig
    from minigpt.inspection.patching import patch, sweep
    from minigpt.model.gpt import MiniGPT

    class Numbered:
        def token_text(self, i: int) -> str:
            return f"t{i}"

    shapes = {
        "gpt2_small": (ModelConfig(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, context=1024), 50257),
        "default": (load_config(config).model, 1024),
    }
    out = {}
    for name, (cfg, vocab) in shapes.items():
        torch.manual_seed(0)
        model = MiniGPT(cfg, vocab).eval()
        length = min(20, cfg.context)
        clean = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(1)).tolist()
        for where in (length // 2, 0):
            corrupt = list(clean)
            corrupt[where] = (corrupt[where] + 1) % vocab
            for by in ("stage", "head"):
                best = math.inf
                for _ in range(repeats):
                    started = time.perf_counter()
                    patch(model, Numbered(), clean, corrupt, 1, 2, by=by)
                    best = min(best, time.perf_counter() - started)
                flops = _patching_flops(cfg, sweep(cfg.n_layer, cfg.n_head, length, by), length, where)
                out[f"{name}_{by}_changed_at_{where}"] = {
                    "seconds": round(best, 3),
                    "tflop": round(flops / 1e12, 3),
                    "seconds_at_float32_peak": round(flops / (peak_float32 * 1e9), 3),
                }
                print(f"  patching {name} by {by}, token {where} changed: {best:.2f} s", file=sys.stderr, flush=True)
    return out


def _patching_flops(cfg, patches, length: int, changed: int) -> float:
    """The matmul FLOPs of the rows a sweep must recompute at least: a patch at block i first
    changing row r recomputes rows r.. of blocks i.. (the last block's FFN and head for the last
    row alone is not counted apart); patches before the changed token, or past the last block's
    attention at an earlier row, compute nothing, and a block's output is the next block's input
    (one patch). Batching neighbouring rows together computes somewhat more, faster."""
    per_row = 2 * (4 * cfg.n_embd * cfg.n_embd + 2 * cfg.n_embd * cfg.ffn_hidden)  # QKV, W_O, W1, W2
    total = 0.0
    last = cfg.n_layer - 1
    for item in patches:
        first = changed if item.position is None else item.position
        if first < changed or (item.block == last and item.stage != "input" and first < length - 1):
            continue
        if item.stage == "output" and item.block < last:  # the same patch as the next block's input
            continue
        total += per_row * (length - first) * (cfg.n_layer - item.block)
    return total


def patching_rows(patching: dict, row) -> None:
    for name, figures in patching.items():
        target = "< 10 s" if name.startswith("gpt2_small") else "< 1 s"
        row(
            f"patching sweep {name} (s; ref.: at the float32 peak)",
            figures["seconds"],
            figures["seconds_at_float32_peak"],
            "s",
            target,
            "of-reference",
        )
