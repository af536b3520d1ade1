"""The four experiments of docs/guide/remove-it-and-watch.md, run as a learner runs them: every model
trained as a cell of a `minigpt sweep` (a shipped config with one key varied), scored by `minigpt
eval`, compared by `minigpt plot` and `minigpt trace`, on this machine, in one go. Writes the guide's
figures (docs/remove-*.png) and every number the guide quotes (runs/remove-and-watch.json), and
prints them.

    python scripts/remove_and_watch.py                 about 15 minutes on a 2-core laptop CPU
    python scripts/remove_and_watch.py --out DIR       the sweeps go to DIR (default: runs/remove-and-watch/)
    python scripts/remove_and_watch.py --again         figures and numbers again from those sweeps
    python scripts/remove_and_watch.py --steps 4 --out /tmp/check --figures /tmp/check --json-out /tmp/check/r.json
                                                       a short check of the whole script (numbers meaningless)

Interrupted, it continues where it stopped when run again: each sweep skips its finished cells.

1. Order: reverse with and without the position table (accuracy), and `trace --ids` with the tokens
   before a position permuted: block 0's rows there, and block 1's.
2. Processing: attention only (ffn_hidden = 0) against the default at the same width, on Tiny
   Shakespeare (bits per byte) and on add (accuracy).
3. Depth: 12 blocks with and without the residual: the loss, and block 0's gradient norm over block
   11's as training logs it (block_grad_norms) and as `trace --grad` measures it.
4. Size: without norms, at the default learning rates and at ten times them: the residual stream's
   norm block by block, and where the run diverges (the sweep's rules: a loss that explodes past
   2 ln V, or one that is not finite).
Nothing here belongs in the test suite (tests/test_order.py and tests/test_switches.py hold the checks).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TEN_TIMES = ["--set", "train.learning_rate=0.03", "--set", "train.muon_learning_rate=0.2"]

# sweep -> (config, extra arguments, grid): each a shipped config with one [model] key varied
SWEEPS = {
    "order": ("reverse", [], ["model.positions=learned,none"]),
    "processing": ("default", [], ["model.ffn_hidden=512,0"]),
    "processing-add": ("add", [], ["model.ffn_hidden=512,0"]),
    "depth": ("deep", [], ["model.residual=true,false"]),
    "size": ("default", [], ["model.norm=none"]),  # beside processing's default cell
    "size-10x": ("default", TEN_TIMES, ["model.norm=layernorm,none"]),
}
# name -> (sweep, cell): every run an experiment compares (each the run of the config of its name,
# configs/NAME.toml, where there is one)
RUNS = {
    "reverse": ("order", "positions=learned"),
    "reverse-no-positions": ("order", "positions=none"),
    "default": ("processing", "ffn_hidden=512"),
    "attention-only": ("processing", "ffn_hidden=0"),
    "add": ("processing-add", "ffn_hidden=512"),
    "add-attention-only": ("processing-add", "ffn_hidden=0"),
    "deep": ("depth", "residual=true"),
    "deep-no-residual": ("depth", "residual=false"),
    "no-norm": ("size", "norm=none"),
    "default-10x": ("size-10x", "norm=layernorm"),
    "no-norm-10x": ("size-10x", "norm=none"),
}


def minigpt(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "minigpt", *args], capture_output=True, text=True, env=env)
    if check and done.returncode != 0:
        raise SystemExit(f"remove_and_watch: minigpt {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done


def sweep_command(sweep: str, steps: int | None) -> list[str]:
    """The `minigpt sweep` arguments of one sweep (into its folder under OUT, given separately)."""
    config, extra, grid = SWEEPS[sweep]
    words = ["sweep", "-c", f"configs/{config}.toml", *extra, *(w for g in grid for w in ("--grid", g))]
    return words + (["--steps", str(steps)] if steps is not None else [])


def run_sweeps(out: Path, steps: int | None) -> None:
    """Every sweep, one after another (a finished cell is skipped: an interrupted script continues)."""
    for sweep in SWEEPS:
        words = sweep_command(sweep, steps)
        words[2] = str(ROOT / words[2])  # the config, wherever the script runs
        print(f"  sweep {sweep} ...", file=sys.stderr, flush=True)
        minigpt(*words, "--out", str(out / sweep), "--quiet")


def run_dir(out: Path, name: str) -> Path:
    sweep, cell = RUNS[name]
    return out / sweep / cell


def trained(out: Path, name: str, steps: int | None) -> dict:
    """What the report says of the run `name`'s training: the sweep that trained it, its wall time,
    its last validation scores, where it diverged, and each block's gradient norm (first and last)."""
    sweep, cell = RUNS[name]
    lines = (out / sweep / "sweep.jsonl").read_text().splitlines()
    record = next(r for r in map(json.loads, lines) if r["cell"] == cell)
    records = [json.loads(line) for line in (run_dir(out, name) / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("eval")]
    result = {
        "command": "minigpt " + " ".join(sweep_command(sweep, steps)) + f" --out runs/remove-and-watch/{sweep}",
        "exit_code": 1 if record["diverged_by"] else 0,  # a diverged run stops short, as `train` would have
        "wall_s": round(record["wall_s"], 1),
        "val_bpb": round(evals[-1]["val_bpb"], 4) if evals else None,
        "val_loss": round(evals[-1]["val_loss"], 4) if evals else None,
    }
    if record["diverged_by"]:
        result["refusal"] = f"diverged at step {record['diverged_at']} ({record['diverged_by']})"
    grads = [r for r in records if "block_grad_norms" in r]
    if grads:
        result["block_grad_norms"] = {"first": grads[0], "last": grads[-1]}
    print(f"  {name}: {result}", file=sys.stderr, flush=True)
    return result


def accuracy(out: Path, name: str) -> float:
    return json.loads(minigpt("eval", "--run", str(run_dir(out, name)), "--json").stdout)["accuracy"]


def parameters(out: Path, name: str) -> int:
    sys.path.insert(0, str(ROOT))
    import minigpt as api

    return api.load(run_dir(out, name)).model.num_parameters()


def traced(out: Path, name: str, *args: str) -> dict:
    return json.loads(minigpt("trace", "--run", str(run_dir(out, name)), "--json", *args).stdout)


def order_experiment(out: Path, report: dict, figures: Path) -> None:
    """Accuracy with and without the table, and how much permuting the first four tokens of a
    held-out prompt moves block 0's and block 1's rows at the prompt's last token ("=")."""
    for name in ("reverse", "reverse-no-positions"):
        report[name]["accuracy"] = accuracy(out, name)
    prompt = "jfykbzlv="  # the first held-out prompt of configs/reverse.toml's seed
    for name in ("reverse", "reverse-no-positions"):
        ids = traced(out, name, "-p", prompt)["ids"]
        base = [block["stages"] for block in traced(out, name, "--ids", ",".join(map(str, ids)))["blocks"]]
        moved = {0: 0.0, 1: 0.0}
        for order in itertools.islice(itertools.permutations(ids[:8]), 1, 6):
            blocks = traced(out, name, "--ids", ",".join(map(str, [*order, *ids[8:]])))["blocks"]
            for b in moved:
                moved[b] = max(
                    moved[b],
                    max(abs(x - y) for s in base[b] for x, y in zip(base[b][s], blocks[b]["stages"][s])),
                )
        report[name]["permuted_prefix_largest_change"] = {f"block {b}": v for b, v in moved.items()}
    compare(out, figures / "remove-order.png", "reverse", "reverse-no-positions")


def compare(out: Path, png: Path, *names: str) -> None:
    """`minigpt plot` of the named runs' curves, overlaid, into `png`."""
    minigpt("plot", *(str(run_dir(out, name)) for name in names), "-o", str(png))


def processing_experiment(out: Path, report: dict, figures: Path) -> None:
    for name in ("default", "attention-only", "add", "add-attention-only"):
        report[name]["parameters"] = parameters(out, name)
    for name in ("add", "add-attention-only"):
        report[name]["accuracy"] = accuracy(out, name)
    compare(out, figures / "remove-processing.png", "default", "attention-only")


def depth_experiment(out: Path, report: dict, figures: Path) -> None:
    for name in ("deep", "deep-no-residual"):
        grads = report[name].get("block_grad_norms")
        if grads:
            for when, record in grads.items():
                norms = record["block_grad_norms"]
                grads[when] = {"step": record["step"], "bottom_over_top": norms[0] / norms[-1], "norms": norms}
        gradient = traced(out, name, "-p", "ROMEO:", "--grad")["gradient"]
        blocks = gradient["blocks"]
        report[name]["trace_grad"] = {
            "target": gradient["target"],
            "input_norm_by_block": [b["input"]["norm"] for b in blocks],
            "top_output_norm": blocks[-1]["stages"]["output"]["norm"],
            "bottom_over_top": blocks[0]["input"]["norm"] / blocks[-1]["stages"]["output"]["norm"],
        }
    compare(out, figures / "remove-depth.png", "deep", "deep-no-residual")


def size_experiment(out: Path, report: dict, figures: Path) -> None:
    """The residual stream's norm at "ROMEO:"'s last token, entering each block and leaving the
    last, with and without norms; and the ten-times runs (one diverges: its line is kept)."""
    streams = {}
    for name in ("default", "no-norm"):
        trace = traced(out, name, "-p", "ROMEO:")
        rows = [trace["blocks"][0]["input"]["row"]] + [b["stages"]["output"] for b in trace["blocks"]]
        streams[name] = [math.sqrt(sum(v * v for v in row)) for row in rows]
        report[name]["stream_norms"] = [round(n, 2) for n in streams[name]]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    for name, norms in streams.items():
        axes[0].plot(range(len(norms)), norms, marker="o", label=f"{name} ({report[name]['val_bpb']} bits/byte)")
    axes[0].set_xticks(range(len(norms)), ["input"] + [f"out {b}" for b in range(len(norms) - 1)])
    axes[0].set_yscale("log")
    axes[0].set_title('residual stream norm at "ROMEO:"\'s last token')
    for name in ("default", "no-norm", "default-10x", "no-norm-10x"):
        records = [json.loads(line) for line in (run_dir(out, name) / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if "loss" in r and not r.get("eval") and not r.get("diverged")]
        axes[1].plot([r["step"] for r in steps], [r["loss"] for r in steps], label=name, linewidth=1)
    axes[1].set_yscale("log")
    axes[1].set_title("training loss (nats/token); no-norm-10x diverges")
    axes[1].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.savefig(figures / "remove-size.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "remove-and-watch", help="where the sweeps go, one folder each"
    )
    parser.add_argument("--json-out", type=Path, default=ROOT / "runs" / "remove-and-watch.json")
    parser.add_argument("--figures", type=Path, default=DOCS, help="where the figures go (default: docs/)")
    parser.add_argument(
        "--again", action="store_true", help="measure and draw again from the sweeps already in --out (no training)"
    )
    parser.add_argument("--steps", type=int, help="train every run this many steps (a short check of the script)")
    args = parser.parse_args()
    if not args.again:
        run_sweeps(args.out, args.steps)
    report = {name: trained(args.out, name, args.steps) for name in RUNS}
    args.figures.mkdir(parents=True, exist_ok=True)
    order_experiment(args.out, report, args.figures)
    processing_experiment(args.out, report, args.figures)
    depth_experiment(args.out, report, args.figures)
    size_experiment(args.out, report, args.figures)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
