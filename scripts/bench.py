"""minigpt benchmark: training tokens/s and sampling tokens/s, measured in one run on this machine.

    python scripts/bench.py                  # default config, shipped corpus
    python scripts/bench.py --run runs/default --json

Speeds are reported together with the machine (CPU, cores, torch, threads) and as ratios between
variants measured in the same process (1 vs all threads; KV cache vs full recompute), because
absolute numbers from different machines or different moments are not comparable.
Nothing here belongs in the test suite: it runs for about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minigpt.config import load_config  # noqa: E402
from minigpt.data import load_corpus  # noqa: E402
from minigpt.generate import generate  # noqa: E402
from minigpt.model import MiniGPT  # noqa: E402
from minigpt.run import load_model  # noqa: E402
from minigpt.train import Trainer, build  # noqa: E402


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def train_tokens_per_s(cfg, corpus, threads: int, steps: int, warmup: int = 3) -> float:
    """The real training step, `Trainer.train_step` (schedule, accumulation, clipping, optimizer
    step) on real batches, without a run folder; tokens per second over `steps` after `warmup`
    untimed steps."""
    torch.set_num_threads(threads)
    trainer = Trainer(build(cfg, corpus, "cpu"))
    trainer.session.model.train()
    for _ in range(warmup):
        trainer.train_step()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    elapsed = time.perf_counter() - start
    return steps * trainer.session.tokens_per_step / elapsed


def _timed_tokens(model: MiniGPT, prompt_ids: list[int], new_tokens: int, seed: int,
                  use_cache: bool) -> tuple[list[int], float]:
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    generation = generate(model, prompt_ids, new_tokens, temperature=1.0, generator=generator,
                          use_cache=use_cache, slide=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    tokens = [step.tokens for step in generation]
    ids = torch.cat(tokens).tolist() if tokens else []  # one sync at the end, as a consumer would
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ids, time.perf_counter() - start


def bench_sampling(model: MiniGPT, tokenizer, new_tokens: int = 1000, prompt: str = "\n",
                   seed: int = 1337, warmup_tokens: int = 16, repeats: int = 3) -> dict:
    """Sampling speed at batch 1: `new_tokens` tokens (temperature 1, sliding window past the
    table) with the KV cache and with full recompute, in the same process on the same model; the
    best of `repeats` alternating runs of each.

    Returns {"new_tokens", "context", "device", "dtype", "with_kv_cache_tokens_per_s",
    "without_kv_cache_tokens_per_s", "speedup", "same_tokens"}. Past the table every step is a full
    recompute of `context` positions in both modes, so the cache only speeds up the first
    `context - len(prompt)` tokens; `speedup` says what that is worth over `new_tokens`.
    """
    model.eval()
    prompt_ids = tokenizer.encode(prompt if prompt else "\n")
    for use_cache in (True, False):  # warm up kernels and allocator outside the clock
        _timed_tokens(model, prompt_ids, min(warmup_tokens, new_tokens), seed, use_cache)
    # Alternate the two modes and keep each one's fastest run, so a passing load on the machine
    # does not land on one mode only.
    runs = {True: [], False: []}
    for _ in range(repeats):
        for use_cache in (True, False):
            runs[use_cache].append(_timed_tokens(model, prompt_ids, new_tokens, seed, use_cache))
    (cached_ids, cached_s), (plain_ids, plain_s) = (min(runs[mode], key=lambda r: r[1]) for mode in (True, False))
    with_cache = new_tokens / cached_s if cached_s > 0 else 0.0
    without_cache = new_tokens / plain_s if plain_s > 0 else 0.0
    parameter = next(model.parameters())
    return {"new_tokens": new_tokens, "context": model.context, "device": str(parameter.device),
            "dtype": str(parameter.dtype).removeprefix("torch."),
            "with_kv_cache_tokens_per_s": round(with_cache, 1),
            "without_kv_cache_tokens_per_s": round(without_cache, 1),
            "speedup": round(with_cache / without_cache, 3) if without_cache else None,
            "same_tokens": cached_ids == plain_ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default=None, help="config file (default: configs/default.toml)")
    parser.add_argument("--run", default=None, help="trained run folder for the sampling figures "
                                                   "(default: a freshly initialised model; speed does not depend on the weights)")
    parser.add_argument("--train-steps", type=int, default=30, help="timed training steps per variant")
    parser.add_argument("--new-tokens", type=int, default=1000, help="tokens generated per sampling variant")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    cfg = load_config(args.config)
    corpus = load_corpus(cfg)
    all_threads = torch.get_num_threads()
    report = {"machine": machine(), "config": cfg.source,
              "model": {"parameters": None, "vocab_size": corpus.tokenizer.vocab_size,
                        "tokens_per_step": cfg.train.batch_size * cfg.model.context}}

    train = {}
    for threads in sorted({1, all_threads}):
        train[f"threads_{threads}"] = round(train_tokens_per_s(cfg, corpus, threads, args.train_steps), 1)
    torch.set_num_threads(all_threads)
    train["thread_speedup"] = round(train[f"threads_{all_threads}"] / train["threads_1"], 3)
    report["train_tokens_per_s"] = train

    if args.run:
        model, tokenizer = load_model(cfg, Path(args.run))
    else:
        torch.manual_seed(0)
        model, tokenizer = MiniGPT(cfg.model, corpus.tokenizer.vocab_size).eval(), corpus.tokenizer
    report["model"]["parameters"] = model.num_parameters()
    with torch.inference_mode():
        report["sample_batch1"] = bench_sampling(model, tokenizer, new_tokens=args.new_tokens)
        # Where the cache can help: the tokens generated while the window is still filling.
        report["sample_batch1_window_filling"] = bench_sampling(model, tokenizer, new_tokens=model.context - 1)

    if args.json:
        print(json.dumps(report, indent=2))
        return
    m = report["machine"]
    s = report["sample_batch1"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {all_threads} threads, python {m['python']}")
    print(f"model: {report['model']['parameters']:,} parameters, vocab {report['model']['vocab_size']}, "
          f"{report['model']['tokens_per_step']} tokens/step ({cfg.source})")
    print(f"train: {train['threads_1']:,.0f} tokens/s on 1 thread, {train[f'threads_{all_threads}']:,.0f} on "
          f"{all_threads} (x{train['thread_speedup']})")
    print(f"sample (batch 1, {s['new_tokens']} new tokens, context {s['context']}): "
          f"{s['with_kv_cache_tokens_per_s']:,.0f} tokens/s with KV cache, "
          f"{s['without_kv_cache_tokens_per_s']:,.0f} without (x{s['speedup']}); same tokens: {s['same_tokens']}")
    f = report["sample_batch1_window_filling"]
    print(f"sample while the window fills (batch 1, first {f['new_tokens']} new tokens): "
          f"{f['with_kv_cache_tokens_per_s']:,.0f} tokens/s with KV cache, "
          f"{f['without_kv_cache_tokens_per_s']:,.0f} without (x{f['speedup']}); same tokens: {f['same_tokens']}")


if __name__ == "__main__":
    main()
