"""The two experiments of docs/guide/depth.md, run as a learner runs them: every model trained by
`minigpt sweep` (or `minigpt train`) from a shipped config, every figure of the sweep drawn by
`minigpt plot`, on this machine, in one go. Writes the guide's figures (docs/depth-*.png) and every
number it quotes (runs/depth-experiments.json), and prints the tables.

    python scripts/depth_experiments.py             about an hour on a 2-core laptop CPU
    python scripts/depth_experiments.py --only init     gradients against depth at initialisation (2 minutes)
    python scripts/depth_experiments.py --only warmup   warmup at Xiong et al.'s learning rates (about 25 minutes)
    python scripts/depth_experiments.py --again     figures and numbers again from the runs
    python scripts/depth_experiments.py --quick --out DIR   every experiment but the first, a few steps (a test)
    python scripts/depth_experiments.py --out DIR   the runs go to DIR (default: runs/)

Rerunning continues where it stopped: each sweep skips its finished cells (minigpt sweep resumes).

1. Norm placement (c21's question): pre- and post-norm at width 64, depths 2 to 32, AdamW at a fixed
   learning rate (1e-2, no decay), no clipping; without warmup, then with 50 warmup steps; two seeds.
   A cell "diverged" by the sweep's rule (non-finite, or a loss above 2 ln V), and "failed to train"
   when its final validation loss is not below the unigram loss (what a model that ignores the
   context reaches): the depth at which each setting first does either is the answer.
2. Attention Residuals beside the ordinary residual at 12 and 24 blocks on Tiny Shakespeare: at
   equal steps, and the ordinary residual again at the steps that take it as long as Attention
   Residuals took (equal wall time, from the sweep's own wall times). For each model: the
   validation loss, the size of what each block's first norm reads (the paper's hidden-state
   growth), each layer's depth weights, and each block's gradient norm over the last logged steps.
3. At initialisation (Xiong et al. 2020, Theorem 1): each block's gradient norm on the first
   batch, before any update (the metrics' step-1 record: the gradient is taken on the initial
   weights, the update follows it), against depth 2 to 32, pre- and post-norm, with GPT-2's
   initialisation and with Xavier's (`[model] init`), two seeds; and the slope of the last block's
   gradient against depth on a log-log scale (Theorem 1: -1/2 for pre-norm, 0 for post-norm).
4. Warmup at Xiong's learning rates (Adam at 5e-4 and 1e-3): 12 blocks, pre- and post-norm, GPT-2's
   and Xavier's initialisation, no warmup against 60 warmup steps of 1,500 (4%), two seeds
   (configs/depth/warmup.toml).
Nothing here belongs in the test suite (tests/test_sweep.py and tests/test_attention_residuals*.py
hold the checks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CORPUS = ROOT / "data" / "tinyshakespeare.txt"

NORM_GRID = [
    "--grid", "model.n_layer=2,4,8,16,32",
    "--grid", "model.norm_position=pre,post",
    "--grid", "train.warmup_steps=0,50",
    "--seeds", "2",
]  # fmt: skip
RESIDUAL_GRID = ["--grid", "model.residual=true,attention", "--seeds", "2"]
BLOCK_GRID = ["--grid", "model.attention_residual_blocks=8", "--seeds", "2"]  # 24 layers in 8 blocks
NORM_CONFIG = ROOT / "configs" / "depth" / "norm-placement.toml"
RESIDUAL_CONFIG = ROOT / "configs" / "depth" / "attention-residuals.toml"
RESIDUAL_STEPS = 1200  # the config's steps
INIT_GRID = [
    "--grid", "model.n_layer=2,4,8,16,32",
    "--grid", "model.norm_position=pre,post",
    "--grid", "model.init=gpt2,xavier",
    "--seeds", "2",
]  # fmt: skip
# one step, logged: its record holds each block's gradient on the initial weights
AT_INIT = ["--set", "train.steps=1", "--set", "train.log_interval=1", "--set", "train.eval_interval=1",
           "--set", "train.eval_batches=1", "--set", "train.checkpoint_interval=1"]  # fmt: skip
WARMUP_GRID = [
    "--grid", "model.norm_position=pre,post",
    "--grid", "train.learning_rate=5e-4,1e-3",
    "--grid", "train.warmup_steps=0,60",
    "--grid", "model.init=gpt2,xavier",
    "--seeds", "2",
]  # fmt: skip
WARMUP_CONFIG = ROOT / "configs" / "depth" / "warmup.toml"


@dataclass(frozen=True)
class Setup:
    """Where the runs and figures go, and what --quick shortens."""

    out: Path
    again: bool = False
    quick: bool = False

    @property
    def figures(self) -> Path:  # --quick leaves the guide's figures alone
        return self.out if self.quick else DOCS

    def steps(self, *flags: str) -> list[str]:
        """--set flags that make every run of an experiment short under --quick (`flags`: its own)."""
        return list(flags) if self.quick else []


def minigpt(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "minigpt", *args]
    print("$ minigpt " + " ".join(args), flush=True)
    done = subprocess.run(command, text=True, env=env, capture_output=True, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"depth_experiments: minigpt {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def cells(sweep: Path) -> list[dict]:
    """The sweep's finished cells (sweep.jsonl), each with `run`: its run folder."""
    records = [json.loads(line) for line in (sweep / "sweep.jsonl").read_text().splitlines() if line.strip()]
    return [{**record, "run": str(sweep / record["cell"])} for record in records]


def unigram_loss() -> float:
    """Nats per character of the validation tail (the last 10%) under the training part's character
    frequencies: the loss of a model that ignores the context, the line a model must get under."""
    text = CORPUS.read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    counts = Counter(text[:cut])
    total = sum(counts.values())
    tail = text[cut:]
    return -sum(math.log(counts.get(c, 1) / total) for c in tail) / len(tail)


# ---------------------------------------------------------------- 1. norm placement


def norm_placement(setup: Setup) -> dict:
    out = setup.out
    sweep = out / "norm-placement"
    if not setup.again:
        minigpt("sweep", "-c", str(NORM_CONFIG), *NORM_GRID, "--out", str(sweep))
    # from the sweep's parent, so that the figure's title names the sweep, not this machine's path
    figure = setup.figures / "depth-norm-placement.png"
    minigpt("plot", sweep.name, "--against", "model.n_layer", "-o", str(figure), "--force", cwd=out)
    baseline = unigram_loss()
    table: dict[tuple[str, int], dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for cell in cells(sweep):
        grid = cell["values"]
        key = (grid["model.norm_position"], grid["train.warmup_steps"])
        table[key][grid["model.n_layer"]].append(cell)
    rows, first_failure = {}, {}
    for (position, warmup), by_depth in sorted(table.items()):
        name = f"{position}-norm, warmup {warmup}"
        rows[name] = {}
        for depth, runs in sorted(by_depth.items()):
            losses = [run["final_val_loss"] for run in runs]
            states = [_state(run, baseline) for run in runs]
            first_grads = [_first_grads(Path(run["run"])) for run in runs]
            rows[name][depth] = {
                "final_val_loss": losses,
                "states": states,
                "wall_s": [run["wall_s"] for run in runs],
                # each block's gradient norm at the first logged step (step 10): block 0's and the last's
                "grad_block0_step10": [g[0] for g in first_grads],
                "grad_last_block_step10": [g[-1] for g in first_grads],
            }
            if name not in first_failure and any(state != "trained" for state in states):
                first_failure[name] = depth
        first_failure.setdefault(name, None)
    return {"unigram_loss": baseline, "cells": rows, "first_failure": first_failure}


def _first_grads(run_dir: Path) -> list[float]:
    """Each block's gradient norm at the run's first logged step (metrics.jsonl's block_grad_norms)."""
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    return first["block_grad_norms"]


def _state(cell: dict, baseline: float) -> str:
    if cell.get("diverged_at") is not None:
        return f"diverged ({cell['diverged_by']}) at step {cell['diverged_at']}"
    loss = cell.get("final_val_loss")
    return "trained" if loss is not None and loss < baseline else "failed to train"


# ---------------------------------------------------------------- 3. at initialisation


def at_initialisation(setup: Setup) -> dict:
    sweep = setup.out / "norm-at-init"
    if not setup.again:
        grid = ["--grid", "model.n_layer=2,4", *INIT_GRID[2:-2]] if setup.quick else INIT_GRID  # one seed
        minigpt("sweep", "-c", str(NORM_CONFIG), *grid, *AT_INIT, "--out", str(sweep))
    by_setting: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for cell in cells(sweep):
        grid = cell["values"]
        name = f"{grid['model.norm_position']}-norm, {grid['model.init']}"
        by_setting[name][grid["model.n_layer"]].append(_first_grads(Path(cell["run"])))
    rows = {}
    for name, by_depth in sorted(by_setting.items()):
        depths = sorted(by_depth)
        last = {L: sum(g[-1] for g in by_depth[L]) / len(by_depth[L]) for L in depths}
        first = {L: sum(g[0] for g in by_depth[L]) / len(by_depth[L]) for L in depths}
        rows[name] = {"last_block": last, "first_block": first, "slope": _slope(last)}
    _init_figure(rows, setup.figures)
    return rows


def _slope(values: dict[int, float]) -> float:
    """The least-squares slope of log(value) against log(depth): the power of L it scales as."""
    xs, ys = [math.log(L) for L in values], [math.log(v) for v in values.values()]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _init_figure(rows: dict, figures: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, row in rows.items():
        depths = list(row["last_block"])
        ax.plot(depths, list(row["last_block"].values()), "o-" if "pre" in name else "s--",
                label=f"{name} (slope {row['slope']:+.2f})")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="blocks (L)", ylabel="last block's gradient norm at initialisation")
    ax.set_xticks([2, 4, 8, 16, 32], labels=["2", "4", "8", "16", "32"])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())  # the depths alone, not log-scale minor ticks
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(figures / "depth-init-gradients.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- 4. warmup at Xiong's learning rates


def warmup(setup: Setup) -> dict:
    sweep = setup.out / "warmup"
    if not setup.again:
        short = setup.steps(
            "--set", "train.steps=20", "--set", "train.eval_interval=10", "--set", "train.log_interval=10"
        )
        minigpt("sweep", "-c", str(WARMUP_CONFIG), *WARMUP_GRID, *short, "--out", str(sweep))
    baseline = unigram_loss()
    rows: dict[str, list] = defaultdict(list)
    for cell in cells(sweep):
        grid = cell["values"]
        name = (
            f"{grid['model.norm_position']}-norm, {grid['model.init']}, lr {grid['train.learning_rate']:g}, "
            f"warmup {grid['train.warmup_steps']}"
        )
        rows[name].append({"final_val_loss": cell["final_val_loss"], "state": _state(cell, baseline)})
    return {"unigram_loss": baseline, "cells": dict(sorted(rows.items()))}


# ---------------------------------------------------------------- 2. Attention Residuals


def attention_residuals(setup: Setup) -> dict:
    out = setup.out
    sweep, block_sweep = out / "attention-residuals", out / "attention-residuals-block"
    short = setup.steps("--set", "train.steps=20", "--set", "train.eval_interval=10", "--set", "train.warmup_steps=2")
    total = 20 if setup.quick else RESIDUAL_STEPS
    if not setup.again:
        minigpt("sweep", "-c", str(RESIDUAL_CONFIG), *RESIDUAL_GRID, *short, "--out", str(sweep))
        minigpt("sweep", "-c", str(RESIDUAL_CONFIG), *BLOCK_GRID, *short, "--out", str(block_sweep))
    runs: dict[str, list[Path]] = defaultdict(list)
    wall: dict[str, list[float]] = defaultdict(list)
    for cell in cells(sweep) + cells(block_sweep):
        values = cell["values"]
        name = (
            "block AttnRes (8 blocks)"
            if "model.attention_residual_blocks" in values
            else "full AttnRes"
            if values["model.residual"] == "attention"
            else "residual"
        )
        runs[name].append(Path(cell["run"]))
        wall[name].append(cell["wall_s"])
    # equal wall time: the ordinary residual trained for as long as full Attention Residuals took
    ratio = sum(wall["full AttnRes"]) / sum(wall["residual"])
    steps = round(total * ratio)
    timed = out / "attention-residuals-time"
    if not setup.again and not (timed / "checkpoint.pt").exists():
        minigpt("train", "-c", str(RESIDUAL_CONFIG), "--set", "model.residual=true", "--steps", str(steps), *short[2:],
                "--set", f"train.checkpoint_interval={steps}", "--out", str(timed))  # fmt: skip
    runs[f"residual, {steps} steps (equal time)"] = [timed]
    measured = {name: [measure(path) for path in paths] for name, paths in runs.items()}
    figures({name: ms[0] for name, ms in measured.items()}, setup.figures)
    return {
        "step_time_ratio": {name: sum(w) / sum(wall["residual"]) for name, w in wall.items()},
        "equal_time_steps": steps,
        "runs": {name: [str(p) for p in paths] for name, paths in runs.items()},
        "measured": measured,
    }


def measure(run_dir: Path) -> dict:
    """One run's numbers: its last validation loss, the norm of each layer's output (each attention's
    and each FFN's, what the paper's Fig. 5 plots) and of what each block's first norm reads
    (ordinary: the stream entering the block; Attention Residuals: read1), mean over 16 validation
    windows' positions, each layer's mean depth weights, and each block's gradient norm at
    initialisation (the first logged step's, taken on the initial weights) and over the last five
    logged steps."""
    import torch

    import minigpt
    from minigpt.api.reading import metrics
    from minigpt.model import stages
    from minigpt.model.recorder import Recorder

    run = minigpt.load(run_dir)
    text = CORPUS.read_text(encoding="utf-8")
    ids = run.tokenizer.encode(text[int(len(text) * 0.9) :])
    context = run.cfg.model.context
    windows = torch.tensor([ids[i * context : (i + 1) * context] for i in range(16)])
    recorder = Recorder(run.cfg.model)
    with torch.no_grad():
        run.model(windows, recorder=recorder)
    n_layer = run.cfg.model.n_layer
    depth = run.cfg.model.residual == "attention"

    def size(name: str) -> float:
        return float(recorder[name].norm(dim=-1).mean())

    if depth:
        reads = [size(stages.block_name(i, stages.READ1)) for i in range(n_layer)]
        weights = []
        for i in range(n_layer):
            for stage in (stages.DEPTH_WEIGHTS1, stages.DEPTH_WEIGHTS2):
                weights.append(recorder[stages.block_name(i, stage)].mean(dim=(0, 1)).tolist())
        weights.append(recorder[stages.FINAL_DEPTH_WEIGHTS].mean(dim=(0, 1)).tolist())
    else:
        reads = [size(stages.INPUT)] + [size(stages.block_name(i, stages.OUTPUT)) for i in range(n_layer - 1)]
        weights = None
    outputs = [size(stages.block_name(i, stage)) for i in range(n_layer) for stage in (stages.ATTENTION, stages.FFN)]
    logged = metrics(run_dir)
    every = [record["block_grad_norms"] for record in logged["train"] if "block_grad_norms" in record]
    grads = every[-5:]
    grad_norms = [sum(g[i] for g in grads) / len(grads) for i in range(n_layer)]
    elapsed = {record["step"]: record["elapsed_s"] for record in logged["train"]}
    return {
        # (step, seconds since training began, validation loss) at each evaluation
        "val_curve": [(r["step"], elapsed.get(r["step"]), r["val_loss"]) for r in logged["eval"] if r["step"]],
        "val_loss": logged["eval"][-1]["val_loss"],
        "read_norm": reads,
        "output_norm": outputs,
        "grad_at_init": every[0] if logged["train"][0]["step"] == 1 else None,
        "depth_weights": weights,
        "grad_norm": grad_norms,
    }


def figures(measured: dict, to: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, m in measured.items():
        style = "-" if "AttnRes" in name else ":" if "equal time" in name else "--"
        steps, seconds, losses = zip(*m["val_curve"])
        left.plot(steps, losses, style, marker="o", label=name)
        right.plot(seconds, losses, style, marker="o", label=name)
    left.set(xlabel="step", ylabel="validation loss (nats/character)", title="at equal steps")
    right.set(xlabel="seconds of training", title="at equal wall time")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(to / "depth-attention-residuals-curves.png", dpi=110)
    plt.close(fig)

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    for name, m in measured.items():
        if "equal time" in name:
            continue
        style = "-" if "AttnRes" in name else "--"
        left.plot(range(len(m["output_norm"])), m["output_norm"], style, label=name)
        if m["grad_at_init"]:
            middle.plot(range(len(m["grad_at_init"])), m["grad_at_init"], style, label=name)
        right.plot(range(len(m["grad_norm"])), m["grad_norm"], style, label=name)
    left.set(xlabel="layer (attention, FFN, ...)", ylabel="mean L2 norm of its output", title="output size by layer")
    middle.set(xlabel="block", ylabel="gradient norm", title="gradient at initialisation", yscale="log")
    right.set(xlabel="block", ylabel="gradient norm (last 5 steps)", title="gradient after training", yscale="log")
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(to / "depth-attention-residuals-norms.png", dpi=110)
    plt.close(fig)

    heat = {name: m["depth_weights"] for name, m in measured.items() if m["depth_weights"]}
    fig, axes = plt.subplots(1, len(heat), figsize=(6 * len(heat), 5))
    for ax, (name, rows) in zip(axes, heat.items()):
        width = len(rows[-1])
        grid = [row + [float("nan")] * (width - len(row)) for row in rows]
        image = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set(
            xlabel="source (0: embedding, then each sublayer's output)", ylabel="layer (last: final norm)", title=name
        )
        fig.colorbar(image, ax=ax, label="mean depth weight")
    fig.tight_layout()
    fig.savefig(to / "depth-attention-residuals-weights.png", dpi=110)
    plt.close(fig)


def summary(measured: dict) -> dict:
    """The paper's two findings, as numbers: the weight each layer puts on its predecessor (the
    source just before it) and on the embedding, averaged over the layers past the first and over
    the seeds."""
    out = {}
    for name, runs in measured.items():
        found = [m["depth_weights"][1:] for m in runs if m["depth_weights"]]
        if not found:
            continue
        rows = [row for later in found for row in later]
        out[name] = {
            "predecessor": sum(row[-1] for row in rows) / len(rows),
            "embedding": sum(row[0] for row in rows) / len(rows),
            "uniform": sum(1 / len(row) for row in rows) / len(rows),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs")
    parser.add_argument("--again", action="store_true", help="figures and numbers again from the runs")
    parser.add_argument("--only", choices=("norm", "residuals", "init", "warmup"), help="one experiment")
    parser.add_argument(
        "--quick", action="store_true", help="every experiment but norm, a few steps each (under 3 minutes; a test)"
    )
    args = parser.parse_args()
    setup = Setup(args.out, args.again, args.quick)
    results_file = args.out / "depth-experiments.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    if args.only == "norm" or (args.only is None and not args.quick):
        results["norm_placement"] = norm_placement(setup)
    if args.only in (None, "init"):
        results["at_initialisation"] = at_initialisation(setup)
    if args.only in (None, "warmup"):
        results["warmup"] = warmup(setup)
    if args.only in (None, "residuals"):
        results["attention_residuals"] = attention_residuals(setup)
        results["attention_residuals"]["depth_reads"] = summary(results["attention_residuals"]["measured"])
    results_file.parent.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
