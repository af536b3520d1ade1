"""`--only lora`: the fine-tune guide's recipe on GPT-2 small's and medium's shapes, in full and
with LoRA, with and without [train] recompute: peak resident memory and seconds per step."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

from . import ROOT
from .processes import timed_process, train_command

# docs/guide/fine-tune.md's GPT-2 small recipe (nanoGPT's finetune_shakespeare at a 128-token window):
# AdamW at a constant 3e-5, 8 windows x 4 micro-steps per step.
FINE_TUNE = [
    'train.optimizer="adamw"', "train.learning_rate=3e-5", "train.min_lr=3e-5", "train.warmup_steps=0",
    "train.weight_decay=0", "train.batch_size=8", "train.grad_accum=4", "train.eval_interval=1000",
    "train.eval_batches=2", "train.checkpoint_interval=1000", "train.log_interval=1",
]  # fmt: skip
FINE_TUNE_VARIANTS = {
    "full": [],
    "full, recompute": ["train.recompute=true"],
    "lora r8": ["train.lora_rank=8"],
    "lora r8, recompute": ["train.lora_rank=8", "train.recompute=true"],
}
GPT2_SHAPES = {
    "gpt2_small": dict(n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072),
    "gpt2_medium": dict(n_layer=24, n_head=16, n_embd=1024, ffn_hidden=4096),
}


def lora_benchmark(env: dict, scratch: Path, steps: int = 4) -> dict:
    """The fine-tune recipe through the CLI (`minigpt train --init-from RUN`), on GPT-2 small's and
    medium's shapes at random (50,257 rows, context 128, scripts/bench_explore.py's builder), in full
    and with LoRA (rank 8 on qkv, out, W1, W2), with and without [train] recompute: the peak
    resident memory of the whole process, and the seconds per step (the median of the steps after
    the first, from the metrics log). Medium runs the LoRA variants alone."""
    spec = importlib.util.spec_from_file_location("bench_explore", ROOT / "scripts" / "bench_explore.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    out = {}
    for shape, sizes in GPT2_SHAPES.items():
        base = builder.write_gpt2_shaped_run(scratch / shape, **sizes, context=128, vocab_size=50257)
        for variant, changes in FINE_TUNE_VARIANTS.items():
            if shape == "gpt2_medium" and not variant.startswith("lora"):
                continue
            run = scratch / f"{shape}-{variant.replace(' ', '').replace(',', '-')}"
            command = train_command(None, run, steps, [*FINE_TUNE, *changes])
            command += ["--init-from", str(base), "--data", str(ROOT / "data" / "tinyshakespeare.txt")]
            measured = timed_process(command, env, ROOT)
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            elapsed = [r["elapsed_s"] for r in records if "elapsed_s" in r and not r.get("eval")]
            per_step = statistics.median(b - a for a, b in zip(elapsed, elapsed[1:]))
            out[f"{shape}: {variant}"] = {"peak_rss_gb": round(measured["peak_rss_mb"] / 1024, 2),
                                          "step_s": round(per_step, 2), "wall_s": measured["wall_s"]}  # fmt: skip
            print(f"  {shape}: {variant}: {out[f'{shape}: {variant}']}", file=sys.stderr, flush=True)
            shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    return out


def lora_rows(lora: dict, row) -> None:
    full = lora.get("gpt2_small: full")
    for name, figures in lora.items():
        reference = full if full and name.startswith("gpt2_small") and name != "gpt2_small: full" else None
        target = "<= x0.5" if reference else ""
        row(f"fine-tune {name}: peak resident (GB; ref.: full)", figures["peak_rss_gb"],
            reference and reference["peak_rss_gb"], "GB", target, "of-reference")  # fmt: skip
        row(f"fine-tune {name}: s per step (ref.: full)", figures["step_s"], reference and reference["step_s"], "s",
            "<= x1" if reference else "", "of-reference")  # fmt: skip
