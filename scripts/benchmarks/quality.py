"""`--only quality`, and the full run: time to quality, the default `minigpt train` against
nanoGPT's 2,000 iterations, and at other shapes the seconds until minigpt first evaluates at or
below the figure nanoGPT's recipe ends at."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .processes import train_command
from .shapes import LARGE_SHAPE, NANO_LARGE_SHAPE, SHAPE


def minigpt_full_run(config: str | None, out: Path, env: dict) -> dict:
    """`minigpt train` (the default recipe) as a user runs it, token cache warm: wall time and the
    final validation figures from its metrics log."""
    command = train_command(config, out)
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{result.stderr}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("eval")]
    train_s = max(r.get("elapsed_s", 0.0) for r in records)
    return {
        "wall_s": round(wall, 1),
        "train_loop_s": round(train_s, 1),
        "steps": records[-1]["step"],
        "val_loss": round(evals[-1]["val_loss"], 4),
        "val_bpb": round(evals[-1]["val_bpb"], 4),
    }


def minigpt_time_to(
    config: str | None, changes: list[str], steps: int, target_bpb: float, out: Path, env: dict
) -> dict:
    """`minigpt train` from launch until its metrics log shows an evaluation at or below
    `target_bpb` (the run is stopped there): the seconds a user waits for that quality. A run that
    ends above it reports its best figure and no time."""
    shutil.rmtree(out, ignore_errors=True)
    command = train_command(config, out, steps, [*changes, f"train.checkpoint_interval={steps}"])
    metrics, read, evals = out / "metrics.jsonl", 0, []
    with tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        while True:
            finished = process.poll() is not None
            if metrics.exists():
                with open(metrics, encoding="utf-8") as log:
                    log.seek(read)
                    text = log.read()
                complete = text[: text.rfind("\n") + 1]  # a line still being written waits
                read += len(complete)
                for line in complete.splitlines():
                    record = json.loads(line)
                    if record.get("eval"):
                        evals.append((time.perf_counter() - started, record["step"], record["val_bpb"]))
            reached = [e for e in evals if e[2] <= target_bpb]
            if reached or finished:
                break
            time.sleep(0.05)
        if not finished:
            process.kill()
            process.wait()
        elif process.returncode != 0:
            stderr.seek(0)
            raise SystemExit(f"bench: minigpt train failed:\n{stderr.read()}")
    best = min(evals, key=lambda e: e[2])
    first = reached[0] if reached else None
    return {
        "seconds": round(first[0], 1) if first else None,
        "step": first[1] if first else None,
        "val_bpb": round((first or best)[2], 4),
        "evaluations": [[round(t, 1), step, round(bpb, 4)] for t, step, bpb in evals],
    }


# Time to nanoGPT's quality away from the default shape: nanoGPT's recipe (NANO_RECIPE) at a small
# batch and at the larger shape, its final validation figure the target; minigpt's default recipe
# and AdamW at the same shape, steps and warmup, each timed from launch to its first evaluation at
# or below that figure. name, minigpt changes, nanoGPT overrides, steps, warmup, evaluation every,
# batches per evaluation (nanoGPT's eval_iters: the same amount of validation text).
QUALITY_RUNS = (
    ("batch 16", ["train.batch_size=16"], ["--batch_size=16"], 2000, 100, 200, 50),
    ("6L/6H/384, context 256, batch 16", LARGE_SHAPE, NANO_LARGE_SHAPE, 60, 10, 10, 5),
)


def time_to_quality(config: str | None, nano, env: dict, scratch: Path) -> dict:
    result = {}
    for name, changes, nano_changes, steps, warmup, every, batches in QUALITY_RUNS:
        target = None
        if nano:
            target = nano.full_run(
                [
                    *nano_changes,
                    f"--max_iters={steps}",
                    f"--lr_decay_iters={steps}",
                    f"--warmup_iters={warmup}",
                    f"--eval_interval={steps}",
                    f"--eval_iters={batches}",
                ]
            )
        schedule = [f"train.warmup_steps={warmup}", f"train.eval_interval={every}", f"train.eval_batches={batches}"]
        entry = {"steps": steps, "nanogpt": target}
        for recipe, extra in (("default", []), ("adamw", ['train.optimizer="adamw"'])):
            # without nanoGPT, the target is one no run reaches: the whole run is timed
            entry[recipe] = minigpt_time_to(
                config,
                [*SHAPE, *changes, *schedule, *extra],
                steps,
                target["val_bpb"] if target else -math.inf,
                scratch / "quality-run",
                env,
            )
        result[name] = entry
    return result


def quality_rows(quality: dict, row) -> None:
    for name, e in quality.items():
        nano = e["nanogpt"]
        reach = f"{nano['val_bpb']} bits/byte" if nano else "the end"
        for recipe, label in (("default", "default recipe"), ("adamw", "AdamW")):
            m = e[recipe]
            row(
                f"time to nanoGPT's {e['steps']}-step quality ({reach}), {name}: minigpt {label}"
                + ("" if m["seconds"] or not nano else f" (not reached: best {m['val_bpb']})"),
                m["seconds"],
                nano["wall_s"] if nano else None,
                "s",
                "<= 1/3 (x >= 3)" if recipe == "default" else "",
                better="lower",
            )
        d, a = e["default"]["seconds"], e["adamw"]["seconds"]
        row(
            f"time to that quality, {name}: default recipe against AdamW",
            d,
            a,
            "s",
            "<= x1.0",
            better="of-reference",
        )
