"""Sampling at batch 1 timed in this process: with the KV cache, with full recompute, and with the
onnxruntime window where the onnx extra is installed, on the same model and the same tokens."""

from __future__ import annotations

import time

import torch

from minigpt.config import SampleConfig
from minigpt.model.gpt import MiniGPT
from minigpt.sampling.generate import generate

from .machine import synchronize


def _timed_tokens(
    model: MiniGPT, prompt_ids: list[int], new_tokens: int, seed: int, use_cache: bool, runtime: str = "torch"
) -> tuple[list[int], float]:
    device = next(model.parameters()).device
    settings = SampleConfig(max_new_tokens=new_tokens, temperature=1.0, seed=seed, slide=True, runtime=runtime)
    generation = generate(model, prompt_ids, settings, use_cache=use_cache)
    synchronize(str(device))
    start = time.perf_counter()
    tokens = [step.tokens for step in generation]
    ids = torch.cat(tokens).tolist() if tokens else []  # one sync at the end, as a consumer would
    synchronize(str(device))
    return ids, time.perf_counter() - start


def bench_sampling(
    model: MiniGPT,
    tokenizer,
    new_tokens: int = 1000,
    prompt: str = "\n",
    seed: int = 1337,
    warmup_tokens: int = 16,
    repeats: int = 3,
) -> dict:
    """Sampling speed at batch 1: `new_tokens` tokens (temperature 1, sliding window past the
    table) with the KV cache and with full recompute, in the same process on the same model; the
    best of `repeats` alternating runs of each. Past the table every step is a full recompute of
    `context` positions in both modes, so the cache only speeds up the first tokens. Where the onnx
    extra is installed, the same with `runtime = "onnxruntime"` (its export cached by a first,
    untimed run)."""
    model.eval()
    prompt_ids = tokenizer.encode(prompt if prompt else "\n")
    for use_cache in (True, False):  # warm up kernels and allocator outside the clock
        _timed_tokens(model, prompt_ids, min(warmup_tokens, new_tokens), seed, use_cache)
    runs = {True: [], False: []}
    for _ in range(repeats):
        for use_cache in (True, False):
            runs[use_cache].append(_timed_tokens(model, prompt_ids, new_tokens, seed, use_cache))
    (cached_ids, cached_s), (plain_ids, plain_s) = (min(runs[mode], key=lambda r: r[1]) for mode in (True, False))
    with_cache = new_tokens / cached_s if cached_s > 0 else 0.0
    without_cache = new_tokens / plain_s if plain_s > 0 else 0.0
    parameter = next(model.parameters())
    onnx: dict = {}
    try:
        from minigpt.sampling.onnx_window import require

        require()
    except Exception as missing:  # noqa: BLE001 - the extra is optional: say why the row is absent
        onnx["onnxruntime"] = str(missing)
    else:
        _timed_tokens(model, prompt_ids, min(warmup_tokens + model.context, new_tokens), seed, True, "onnxruntime")
        timed = [_timed_tokens(model, prompt_ids, new_tokens, seed, True, "onnxruntime") for _ in range(repeats)]
        onnx_ids, onnx_s = min(timed, key=lambda r: r[1])
        onnx["onnxruntime_tokens_per_s"] = round(new_tokens / onnx_s, 1)
        onnx["onnxruntime_same_tokens"] = onnx_ids == cached_ids
    return {
        "new_tokens": new_tokens,
        "context": model.context,
        "device": str(parameter.device),
        "dtype": str(parameter.dtype).removeprefix("torch."),
        "with_kv_cache_tokens_per_s": round(with_cache, 1),
        "without_kv_cache_tokens_per_s": round(without_cache, 1),
        "speedup": round(with_cache / without_cache, 3) if without_cache else None,
        "same_tokens": cached_ids == plain_ids,
        **onnx,
    }
