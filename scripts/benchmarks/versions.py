"""`--only versions --against DIR`: this checkout against another, the figures a change must keep,
each in child processes of either version, alternating round by round."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from minigpt.config import load_config

from . import ROOT
from .processes import cli_tokens_per_s, train_command
from .shapes import SHAPE

# One timed training session in a child process of either version: the real `Trainer.train_step`
# at the comparison shape, tokens/s of the best of its rounds. Both layouts of the package are
# named, so that a checkout from before the subpackages can be timed beside this one.
VERSION_STEP_CHILD = r"""
import json, sys, time
import torch
try:
    from minigpt.training.session import build
    from minigpt.training.trainer import Trainer
    from minigpt.text.corpus import load_corpus
    from minigpt.device import keep_freed_memory
except ImportError:
    from minigpt.session import build
    from minigpt.trainer import Trainer
    from minigpt.data import load_corpus
    from minigpt.device import keep_freed_memory
from minigpt.config import load_config
keep_freed_memory()
shape, steps, rounds = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cfg = load_config(None, shape)
trainer = Trainer(build(cfg, load_corpus(cfg), "cpu"))
trainer.session.model.train()
for _ in range(3):
    trainer.train_step()
best = 0.0
for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    best = max(best, steps * trainer.session.tokens_per_step / (time.perf_counter() - start))
print(json.dumps({"tokens_per_s": best}))
"""

# Sampling as the Python API does it (minigpt.load(run).samples), on one thread, in either version.
VERSION_SAMPLE_CHILD = r"""
import json, sys
import minigpt
run = minigpt.load(sys.argv[1])
tokens, best = int(sys.argv[2]), 0.0
for seed in range(int(sys.argv[3])):
    result = run.samples("\n", max_new_tokens=tokens, temperature=1.0, seed=seed)[0]
    best = max(best, len(result.token_ids) / result.seconds)
print(json.dumps({"tokens_per_s": best}))
"""


def versions_benchmark(other: Path, env: dict, scratch: Path, rounds: int = 3) -> dict:
    """This checkout ("this") against the one at `other`: every figure of each in child processes
    whose PYTHONPATH names that checkout, the two alternating round by round, the best round of
    each counting. The run sampled from is trained here once, by the other version, usually the
    older: a newer version reads an older run folder (config keys added since read as their
    defaults), not the reverse."""
    versions = {"this": ROOT, "other": other.resolve()}
    envs = {name: {**env, "PYTHONPATH": str(root)} for name, root in versions.items()}
    run = scratch / "versions-run"
    # Every child runs in the scratch folder: `python -m minigpt` started in a checkout would import
    # that checkout's package first, whatever PYTHONPATH says.
    done = subprocess.run(train_command(None, run, 60), capture_output=True, text=True, env=envs["other"], cwd=scratch)
    if done.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{done.stderr}")
    shape = load_config(None, SHAPE)
    per_step = shape.train.batch_size * shape.train.grad_accum * shape.model.context
    sample = [sys.executable, "-m", "minigpt", "sample", "--run", str(run), "-p", "ROMEO:", "-n", "200"]
    figures: dict[str, dict[str, list[float]]] = {
        name: {"train_step": [], "cli": [], "sampling": [], "sample_200_s": []} for name in versions
    }

    def child(code: str, args: list[str], name: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=envs[name], cwd=scratch
        )
        if done.returncode != 0:
            raise SystemExit(f"bench: the {name} version failed:\n{done.stderr}")
        return json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"]

    for _ in range(rounds):
        for name in versions:
            f = figures[name]
            f["train_step"].append(child(VERSION_STEP_CHILD, [json.dumps(SHAPE), "30", "2"], name))
            f["cli"].append(cli_tokens_per_s(None, SHAPE, 300, per_step, scratch / f"cli-{name}", envs[name], scratch))
            f["sampling"].append(child(VERSION_SAMPLE_CHILD, [str(run), "1000", "2"], name))
            best = math.inf
            for _ in range(3):
                started = time.perf_counter()
                done = subprocess.run(sample, capture_output=True, text=True, env=envs[name], cwd=scratch)
                if done.returncode != 0:
                    raise SystemExit(f"bench: {' '.join(sample)} failed ({name}):\n{done.stderr}")
                best = min(best, time.perf_counter() - started)
            f["sample_200_s"].append(best)
    return {"other": str(versions["other"]), "runs": figures}


def versions_rows(versions: dict, row) -> None:
    this, other = versions["runs"]["this"], versions["runs"]["other"]
    for key, label, better in (
        ("train_step", "training step tokens/s (Trainer.train_step, comparison shape)", "higher"),
        ("cli", "`minigpt train` (CLI) steady tokens/s, comparison shape", "higher"),
        ("sampling", "sampling tokens/s through the API (run.samples, 1,000 tokens, one thread)", "higher"),
        ("sample_200_s", "`minigpt sample -p ROMEO: -n 200` s, start to exit", "of-reference"),
    ):
        pick = min if better == "of-reference" else max
        digits = 3 if key == "sample_200_s" else 0
        row(
            f"{label}: this checkout (nanoGPT column: {versions['other']})",
            round(pick(this[key]), digits) or None,
            round(pick(other[key]), digits) or None,
            "s" if key == "sample_200_s" else "tokens/s",
            "within noise",
            better=better,
        )
