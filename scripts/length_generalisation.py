"""Length generalisation on a laptop (docs/guide/length-generalisation.md): Kazemnejad et al. 2023,
"The Impact of Positional Encoding on Length Generalization in Transformers" (arXiv 2305.19466),
reproduced small. Every cell is one `minigpt` command, printed as it runs, so any one of them can be
run alone.

    python scripts/length_generalisation.py            the whole experiment (84 task and 6 text runs, 30 minutes)
    python scripts/length_generalisation.py --quick    every kind of cell at a few steps (a smoke test)
    python scripts/length_generalisation.py --only reverse,text    some parts (tasks, or text)
    python scripts/length_generalisation.py --again    the tables and figures again from saved results

1. Tasks: copy, reverse and sort at 1-6 letters, add at 1-3 digits per number (configs/lengths/),
   every prompt starting with the constant text ">" (`[train] task_start`, as the paper's prompts
   start with fixed text), trained with each of the paper's five schemes, positions = none, t5,
   alibi, rope (at the paper's quarter of each head, rope_fraction = 0.25, and whole) and
   sinusoidal, and minigpt's learned table (with a row for the longest test example, of which
   training reads the first rows only), SEEDS seeds each (the same model and steps), then exact
   match at every length up to twice the longest trained (`minigpt eval --task-length 1-2L`, read
   past the trained length with --extrapolate where the scheme has no learned table); each
   scheme's mean over L+1..2L with its spread over the seeds, and the mean reciprocal rank of each
   scheme over the tasks (the paper's headline).
2. Text: Tiny Shakespeare at a context of 64 with each scheme, then the loss at each position of
   256-token windows (`minigpt eval --by-position --length 256`): rope without scaling, with
   --rope-scaling linear:4 and yarn:4, none and alibi with --extrapolate; learned at 64 (its table).

Writes runs/lengths/results.json and results.md (the numbers, each cell's commands and seconds) and
the figures docs/length-generalisation.png and docs/length-generalisation-text.png (with --quick or
--out, the figures go beside the results). Resumable: a run whose results are saved is not trained or
read again, an interrupted one is finished (`train --resume`); --force starts over. Cells run
--jobs at a time (default 2, one thread each: on 2 cores, two small models at once train faster
than one on both cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minigpt.text.tasks import Task  # noqa: E402  (the example lengths, as the runs compute them)

# The paper's five schemes (rotary at its 25% of each head and whole), and minigpt's learned table.
SCHEMES = {
    "none": ["--set", "model.positions=none"],
    "t5": ["--set", "model.positions=t5"],
    "alibi": ["--set", "model.positions=alibi"],
    "rope 25%": ["--set", "model.positions=rope", "--set", "model.rope_fraction=0.25"],
    "rope": ["--set", "model.positions=rope"],
    "sinusoidal": ["--set", "model.positions=sinusoidal"],
    "learned": ["--set", "model.positions=learned"],
}
SEEDS = 3
START = ">"  # every task prompt's constant start
LONGEST_TRAINED = {"copy": 6, "reverse": 6, "sort": 6, "add": 3}  # L: each task trains at 1..L
CONFIGS = ROOT / "configs" / "lengths"
# The paper's own numbers beside each cell (Kazemnejad et al. 2023; where each comes from is listed on
# docs/guide/length-generalisation.md): its mean exact match (%) over 1..L, at L+1 and over L+1..2L,
# the mean of its three seeds, at its own L (copy and reverse 20, sort and add 8). Copy and reverse
# are exact (the reference repository's results/sanity_check.jsonl, the splits its Figure 3 shows);
# sort (single-token) and add are read off the appendix figure of every length (≈, to 0.1 point).
# Its rotary turns a quarter of each head (rope 25% here); it has no whole rope and no learned table.
PAPER_LONGEST = {"copy": 20, "reverse": 20, "sort": 8, "add": 8}
PAPER_READ_OFF = {"sort", "add"}
PAPER = {
    ("copy", "none"): (99.6, 99.9, 98.6),
    ("copy", "t5"): (99.6, 100.0, 77.1),
    ("copy", "alibi"): (99.6, 99.9, 28.9),
    ("copy", "rope 25%"): (99.6, 0.4, 0.0),
    ("copy", "sinusoidal"): (99.6, 0.0, 0.0),
    ("reverse", "none"): (99.8, 98.2, 47.3),
    ("reverse", "t5"): (99.9, 98.9, 44.8),
    ("reverse", "alibi"): (99.9, 98.8, 19.5),
    ("reverse", "rope 25%"): (99.9, 94.1, 5.3),
    ("reverse", "sinusoidal"): (100.0, 22.0, 1.1),
    ("sort", "none"): (100.0, 100.0, 99.5),
    ("sort", "t5"): (100.0, 100.0, 98.7),
    ("sort", "alibi"): (99.9, 99.4, 62.3),
    ("sort", "rope 25%"): (100.0, 97.4, 48.9),
    ("sort", "sinusoidal"): (100.0, 67.2, 10.2),
    ("add", "none"): (97.2, 82.5, 11.8),
    ("add", "t5"): (97.2, 77.9, 10.1),
    ("add", "alibi"): (97.2, 87.5, 10.9),
    ("add", "rope 25%"): (97.9, 0.5, 0.1),
    ("add", "sinusoidal"): (97.8, 5.0, 0.6),
}
# Its mean reciprocal rank: Figure 1 (17 task splits, each seed ranked alone), then the same
# computed from the reference repository's results over the four tasks run here.
PAPER_MRR = {"none": 0.69, "t5": 0.55, "alibi": 0.50, "rope 25%": 0.33, "sinusoidal": 0.22}
PAPER_MRR_FOUR = {"none": 0.903, "t5": 0.486, "alibi": 0.444, "rope 25%": 0.237, "sinusoidal": 0.213}
TEXT_CONTEXT, TEXT_LENGTH, TEXT_WINDOWS = 64, 256, 400
# (name, the run's positions, eval flags): how each text model is read, past its trained length or not.
TEXT_READINGS = (
    ("learned", "learned", ["--length", str(TEXT_CONTEXT)]),
    ("rope", "rope", ["--length", str(TEXT_LENGTH), "--extrapolate"]),
    ("rope linear:4", "rope", ["--length", str(TEXT_LENGTH), "--rope-scaling", "linear:4"]),
    ("rope yarn:4", "rope", ["--length", str(TEXT_LENGTH), "--rope-scaling", "yarn:4"]),
    ("none", "none", ["--length", str(TEXT_LENGTH), "--extrapolate"]),
    ("alibi", "alibi", ["--length", str(TEXT_LENGTH), "--extrapolate"]),
    ("t5", "t5", ["--length", str(TEXT_LENGTH), "--extrapolate"]),
    ("sinusoidal", "sinusoidal", ["--length", str(TEXT_LENGTH), "--extrapolate"]),
)
QUICK = ["--steps", "20"]  # --quick: every run this short, one seed
QUICK_TASK = ["--set", "train.task_held_out=100"]  # and evaluated on fewer examples
QUICK_WINDOWS = 8
PRINTING = threading.Lock()


def shown(path: Path) -> str:
    """A path as the printed commands write it: relative to the checkout, where they run."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def minigpt(*args: str) -> str:
    """Run `minigpt ARGS` from the checkout, printed first as a learner would type it; its stdout."""
    with PRINTING:
        print(f"$ {shlex.join(['minigpt', *args])}", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-m", "minigpt", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"length_generalisation: `minigpt {shlex.join(args)}` failed:\n{done.stderr[-3000:]}")
    return done.stdout


def newer(result: Path, run: Path) -> bool:
    checkpoint = run / "checkpoint.pt"
    return result.exists() and checkpoint.exists() and result.stat().st_mtime >= checkpoint.stat().st_mtime


def trained(run: Path, config: Path, settings: list[str], results: list[Path]) -> float:
    """Train `run`, or finish it (--resume), unless every result read from it is saved and newer
    than its checkpoint; the seconds its training took, over every call (kept in the run folder)."""
    spent = run / "train-seconds.txt"
    if not all(newer(r, run) for r in results):
        began = time.perf_counter()
        again = ["--resume"] if (run / "checkpoint.pt").exists() else ["--force"] if run.exists() else []
        minigpt("train", "-c", shown(config), *settings, "--out", shown(run), "--quiet", *again)
        before = float(spent.read_text()) if again == ["--resume"] and spent.exists() else 0.0
        spent.write_text(f"{before + time.perf_counter() - began:.1f}\n")
    return float(spent.read_text()) if spent.exists() else 0.0


def evaluated(run: Path, saved: Path, args: list[str]) -> tuple[dict, float]:
    """`minigpt eval --run RUN ARGS --json`, kept in `saved` (read back when newer than the run)."""
    if newer(saved, run):
        return json.loads(saved.read_text(encoding="utf-8")), 0.0
    began = time.perf_counter()
    report = json.loads(minigpt("eval", "--run", shown(run), *args, "--json"))
    part = saved.with_suffix(".part")
    part.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    part.replace(saved)  # never a half-written result
    return report, time.perf_counter() - began


# ---------------------------------------------------------------- 1. tasks


def task_cell(out: Path, task: str, scheme: str, seed: int, extra: list[str]) -> dict:
    """One task with one position scheme and seed: trained at 1..L, read at 1..2L."""
    longest = LONGEST_TRAINED[task]
    start = ["--set", f'train.task_start="{START}"', "--set", f"train.seed={1337 + seed}"]
    # the longest training example (the learned table: the longest read), its constant start included
    context = Task(task, 2 * longest if scheme == "learned" else longest, START).window
    settings = [*SCHEMES[scheme], *start, "--set", f"model.context={context}"]
    run, config = out / f"{task}-{scheme.replace(' ', '').replace('%', '')}-seed{seed}", CONFIGS / f"{task}.toml"
    saved = run / "task-lengths.json"
    seconds = trained(run, config, settings + extra, [saved])
    reading = ["--task-length", f"1-{2 * longest}"] + ([] if scheme == "learned" else ["--extrapolate"])
    report, eval_seconds = evaluated(run, saved, reading)
    return {
        "task": task,
        "positions": scheme,
        "seed": seed,
        "longest_trained": longest,
        "context": report["context"],
        "accuracy": {row["length"]: row["accuracy"] for row in report["lengths"]},
        "examples": {row["length"]: row["examples"] for row in report["lengths"]},
        "train_seconds": round(seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "commands": [
            shlex.join(["minigpt", "train", "-c", shown(config), *settings, "--out", shown(run)]),
            shlex.join(["minigpt", "eval", "--run", shown(run), *reading]),
        ],
    }


def by_scheme(cells: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The cells of each (task, scheme), its seeds together."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for c in cells:
        grouped.setdefault((c["task"], c["positions"]), []).append(c)
    return grouped


def accuracy_of(cell: dict) -> dict[int, float]:
    """A cell's exact match by length (its keys are texts once read back from results.json)."""
    return {int(k): v for k, v in cell["accuracy"].items()}


def past(cell: dict) -> float:
    """A cell's mean exact match over the lengths past the trained ones, L+1..2L."""
    acc, L = accuracy_of(cell), cell["longest_trained"]
    return sum(acc[n] for n in range(L + 1, 2 * L + 1)) / L


def reciprocal_ranks(cells: list[dict]) -> dict[str, float]:
    """Each scheme's mean reciprocal rank over the tasks, ranked by its mean over L+1..2L (seeds
    averaged; a tie shares the better rank), as the paper ranks its schemes."""
    grouped = by_scheme(cells)
    tasks = list(dict.fromkeys(t for t, _ in grouped))
    schemes = list(dict.fromkeys(p for _, p in grouped))
    ranks: dict[str, list[float]] = {p: [] for p in schemes}
    for task in tasks:
        means = {
            p: sum(map(past, grouped[(task, p)])) / len(grouped[(task, p)]) for p in schemes if (task, p) in grouped
        }
        for p, m in means.items():
            ranks[p].append(1 / (1 + sum(other > m for other in means.values())))
    return {p: sum(r) / len(r) for p, r in ranks.items() if r}


def paper_cell(task: str, scheme: str) -> str:
    """The paper's three numbers for a cell, "≈" where read off its figure, "—" where it has none."""
    if (task, scheme) not in PAPER:
        return "—"
    about = "≈ " if task in PAPER_READ_OFF else ""
    return about + " / ".join(f"{n:.1f}" for n in PAPER[(task, scheme)]) + "%"


def paper_rank(ranks: dict[str, float], scheme: str, places: int) -> str:
    return f"{ranks[scheme]:.{places}f}" if scheme in ranks else "—"


def task_tables(cells: list[dict]) -> list[str]:
    """Markdown: a summary row per task and scheme (seeds averaged, the spread of their means past
    L), the mean reciprocal rank of each scheme, then every length of each task."""
    lines = [
        "| task | positions | seeds | mean 1..L | at L+1 | mean L+1..2L | its range over the seeds "
        "| the paper: 1..L / L+1 / L+1..2L |",
        "|---|---|---|---|---|---|---|---|",
    ]
    grouped = by_scheme(cells)
    for (task, scheme), runs in grouped.items():
        L = runs[0]["longest_trained"]
        acc = [accuracy_of(c) for c in runs]
        inside = sum(sum(a[n] for n in range(1, L + 1)) / L for a in acc) / len(acc)
        next_one = sum(a[L + 1] for a in acc) / len(acc)
        pasts = [past(c) for c in runs]
        lines.append(
            f"| {task} (L = {L}) | {scheme} | {len(runs)} | {100 * inside:.1f}% | {100 * next_one:.1f}% | "
            f"{100 * sum(pasts) / len(pasts):.1f}% | {100 * min(pasts):.1f}-{100 * max(pasts):.1f}% "
            f"| {paper_cell(task, scheme)} |"
        )
    lines += ["", "Mean reciprocal rank over the tasks (by the mean over L+1..2L):", ""]
    lines += ["| positions | MRR | the paper, Figure 1 | the paper, these four tasks |", "|---|---|---|---|"]
    lines += [
        f"| {p} | {r:.3f} | {paper_rank(PAPER_MRR, p, 2)} | {paper_rank(PAPER_MRR_FOUR, p, 3)} |"
        for p, r in sorted(reciprocal_ranks(cells).items(), key=lambda item: -item[1])
    ]
    for task in dict.fromkeys(t for t, _ in grouped):
        rows = {p: runs for (t, p), runs in grouped.items() if t == task}
        first = next(iter(rows.values()))[0]
        lengths, L = sorted(int(n) for n in first["accuracy"]), first["longest_trained"]
        head = [f"**{n}**" if n <= L else str(n) for n in lengths]
        lines += ["", f"{task}, exact match (%) at each length, mean of the seeds (trained lengths in bold):", ""]
        lines += [f"| positions | {' | '.join(head)} |", "|---|" + "---|" * len(lengths)]
        for scheme, runs in rows.items():
            accs = [accuracy_of(c) for c in runs]
            mean = {n: sum(a[n] for a in accs) / len(accs) for n in lengths}
            lines.append(f"| {scheme} | " + " | ".join(f"{100 * mean[n]:.0f}" for n in lengths) + " |")
    return lines


def task_figure(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(c["task"] for c in cells))
    figure, axes = plt.subplots(1, len(tasks), figsize=(3.3 * len(tasks), 3.3), sharey=True, squeeze=False)
    for axis, task in zip(axes[0], tasks):
        longest = LONGEST_TRAINED[task]
        axis.axvspan(0.5, longest + 0.5, color="0.92", lw=0)
        axis.text(longest / 2 + 0.5, 4, "trained", ha="center", color="0.45", fontsize=8)
        for (t, scheme), runs in by_scheme(cells).items():
            if t != task:
                continue
            accs = [accuracy_of(c) for c in runs]
            lengths = sorted(accs[0])
            mean = [100 * sum(a[n] for a in accs) / len(accs) for n in lengths]
            axis.plot(lengths, mean, marker=".", label=scheme, ls="--" if scheme == "learned" else "-")
        unit = "digits per number" if task == "add" else "letters"
        axis.set(title=task, xlabel=f"length ({unit})", xlim=(0.5, 2 * longest + 0.5), ylim=(-3, 103))
    axes[0][0].set_ylabel("exact match (%)")
    axes[0][-1].legend(title="positions", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------- 2. text


def saved_reading(run: Path, name: str) -> Path:
    return run / f"by-position-{name.replace(' ', '-').replace(':', '')}.json"


def text_cell(out: Path, scheme: str, extra: list[str], windows: int) -> list[dict]:
    """One text model: trained at TEXT_CONTEXT, then each of its readings by position."""
    run, config = out / f"text-{scheme}", CONFIGS / "shakespeare.toml"
    readings = [(name, flags) for name, positions, flags in TEXT_READINGS if positions == scheme]
    seconds = trained(
        run, config, ["--set", f"model.positions={scheme}", *extra], [saved_reading(run, name) for name, _ in readings]
    )
    cells = []
    for name, flags in readings:
        args = ["--data", shown(ROOT / "data" / "tinyshakespeare.txt"), "--by-position", *flags]
        report, eval_seconds = evaluated(run, saved_reading(run, name), [*args, "--windows", str(windows)])
        cells.append(
            {
                "reading": name,
                "positions": scheme,
                "trained_length": report["trained_length"],
                "length": report["length"],
                "windows": report["windows"],
                "mean_inside": report["mean_inside"],
                "mean_past": report["mean_past"],
                "nats": [p["nats"] for p in report["positions"]],
                "train_seconds": round(seconds, 1),
                "eval_seconds": round(eval_seconds, 1),
                "commands": [
                    shlex.join(
                        ["minigpt", "train", "-c", shown(config), "--set", f"model.positions={scheme}"]
                        + ["--out", shown(run)]
                    ),
                    shlex.join(["minigpt", "eval", "--run", shown(run), *args]),
                ],
            }
        )
    return cells


def text_table(cells: list[dict]) -> list[str]:
    lines = [
        f"| read as | mean loss at 0..{TEXT_CONTEXT - 1} (nats) | at {TEXT_CONTEXT}..{TEXT_LENGTH - 1} | "
        "past - inside |",
        "|---|---|---|---|",
    ]
    for c in cells:
        past = "(its table ends)" if c["mean_past"] is None else f"{c['mean_past']:.3f}"
        rise = "" if c["mean_past"] is None else f"{c['mean_past'] - c['mean_inside']:+.3f}"
        lines.append(f"| {c['reading']} | {c['mean_inside']:.3f} | {past} | {rise} |")
    return lines


def text_figure(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8.5, 3.6))
    for c in cells:
        nats = c["nats"]
        near = [nats[max(0, i - 3) : i + 4] for i in range(len(nats))]
        axis.plot(range(len(nats)), [sum(n) / len(n) for n in near], label=c["reading"], lw=1.2)
    axis.axvline(TEXT_CONTEXT, color="0.5", ls="--", lw=1)
    axis.set(xlabel="position in the window", ylabel="loss (nats, mean of 7 positions)", title="Tiny Shakespeare")
    axis.text(TEXT_CONTEXT + 2, axis.get_ylim()[1], "trained length", va="top", color="0.4", fontsize=8)
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------- the whole


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        names = [
            line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="run folders and results (default runs/lengths, or -quick)")
    parser.add_argument("--quick", action="store_true", help="20 steps a run: proves every kind of cell runs")
    parser.add_argument("--only", default="", help="comma-separated parts: copy, reverse, sort, add, text")
    parser.add_argument("--jobs", type=int, default=2, help="cells at once, each on cores/jobs threads (default 2)")
    parser.add_argument("--again", action="store_true", help="nothing trained or read: results from those saved")
    parser.add_argument("--force", action="store_true", help="delete the out folder first and start over")
    args = parser.parse_args()
    out = args.out or ROOT / "runs" / ("lengths-quick" if args.quick else "lengths")
    parts = [p.strip() for p in args.only.split(",") if p.strip()] or [*LONGEST_TRAINED, "text"]
    unknown = [p for p in parts if p not in (*LONGEST_TRAINED, "text")]
    if unknown or args.jobs < 1:
        raise SystemExit(
            f"length_generalisation: --only {unknown[0]!r} is not a part (copy, reverse, sort, add, text)"
            if unknown
            else "length_generalisation: --jobs must be at least 1"
        )
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    extra = QUICK if args.quick else []
    if args.jobs > 1:  # the runs share the cores
        extra = [*extra, "--set", f"train.threads={max(1, (os.cpu_count() or 1) // args.jobs)}"]
    windows = QUICK_WINDOWS if args.quick else TEXT_WINDOWS
    results_file = out / "results.json"
    before = json.loads(results_file.read_text(encoding="utf-8")) if results_file.exists() else {}
    tasks, text = before.get("tasks", []), before.get("text", [])
    began = time.perf_counter()

    if not args.again:
        chosen = [t for t in LONGEST_TRAINED if t in parts]
        for task in chosen:
            print(f"# {task}: trained at 1-{LONGEST_TRAINED[task]}, read at 1-{2 * LONGEST_TRAINED[task]}")
        if "text" in parts:
            print(f"# Tiny Shakespeare: trained at {TEXT_CONTEXT} tokens, read at {TEXT_LENGTH}")
        with ThreadPoolExecutor(args.jobs) as pool:
            task_jobs = [
                pool.submit(task_cell, out, task, scheme, seed, extra + (QUICK_TASK if args.quick else []))
                for task in chosen
                for scheme in SCHEMES
                for seed in range(1 if args.quick else SEEDS)
            ]
            text_schemes = dict.fromkeys(positions for _, positions, _ in TEXT_READINGS)
            text_jobs = (
                [pool.submit(text_cell, out, s, extra, windows) for s in text_schemes] if "text" in parts else []
            )
            tasks = [c for c in tasks if c["task"] not in chosen] + [job.result() for job in task_jobs]
            if text_jobs:
                names = [name for name, *_ in TEXT_READINGS]
                text = sorted((c for job in text_jobs for c in job.result()), key=lambda c: names.index(c["reading"]))

    order = {t: i for i, t in enumerate(LONGEST_TRAINED)}
    schemes = list(SCHEMES)
    tasks.sort(key=lambda c: (order[c["task"]], schemes.index(c["positions"]), c.get("seed", 0)))
    wall = time.perf_counter() - began
    results = {
        "paper": "Kazemnejad et al. 2023, arXiv 2305.19466",
        "quick": args.quick,
        "jobs": args.jobs,
        "machine": machine(),
        "wall_seconds_this_call": round(wall, 1),
        "tasks": tasks,
        "text": text,
    }
    results_file.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    table = ["## Exact match by length (held-out examples)", "", *task_tables(tasks)]
    if text:
        table += ["", "## Tiny Shakespeare: loss by position", "", *text_table(text)]
    (out / "results.md").write_text("\n".join(table) + "\n", encoding="utf-8")
    figures = out if args.quick or args.out else ROOT / "docs"
    try:
        if tasks:
            task_figure(tasks, figures / "length-generalisation.png")
        if text:
            text_figure(text, figures / "length-generalisation-text.png")
    except ImportError:
        print("length_generalisation: no figures: matplotlib is missing (pip install -e '.[plot]')")
    print("\n" + "\n".join(table))
    print(f"\nwrote {shown(out / 'results.md')} and results.json, figures in {shown(figures)}; {wall:.0f} s this call")


if __name__ == "__main__":
    main()
