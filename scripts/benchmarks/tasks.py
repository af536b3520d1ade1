"""`--only tasks`: each shipped task config trained as a user runs it, and its held-out exact-match
accuracy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import ROOT
from .processes import timed_process, train_command

TASKS = ("reverse", "sort", "copy", "add")


def tasks_benchmark(env: dict, scratch: Path) -> dict:
    """Each shipped task config as a user runs it: `minigpt train -c configs/TASK.toml` (its wall
    time, start to exit, and the seconds of training its metrics log records), then `minigpt eval
    --json` on the held-out examples (exact-match accuracy). Target: at least 99% in at most 60 s."""
    out = {}
    for name in TASKS:
        run = scratch / f"task-{name}"
        trained = timed_process(train_command(str(ROOT / "configs" / f"{name}.toml"), run), env, ROOT)
        steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        training_s = max(r.get("elapsed_s", 0.0) for r in steps)
        evaluated = subprocess.run(
            [sys.executable, "-m", "minigpt", "eval", "--run", str(run), "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        report = json.loads(evaluated.stdout)
        out[name] = {
            "wall_s": trained["wall_s"],
            "training_s": round(training_s, 2),
            "accuracy": report["accuracy"],
            "per_position": [round(p, 4) for p in report["per_position"]],
            "examples": report["examples"],
        }
        print(f"  task {name}: {out[name]}", file=sys.stderr, flush=True)
    return out


def tasks_rows(tasks: dict, row) -> None:
    for name, figures in tasks.items():
        row(f"task {name}: held-out exact match (%)", round(100 * figures["accuracy"], 2), None, "%", ">= 99")
        row(f"task {name}: `minigpt train` start to exit (s)", figures["wall_s"], None, "s", "<= 60")
