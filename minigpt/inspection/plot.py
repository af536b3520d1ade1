"""Figures: the training curves of one or several runs, overlaid, and a trace's attention weights
as heat maps. matplotlib is an optional extra (`pip install -e ".[plot]"`); each function returns
the Figure, so callers (and tests) can inspect its panels before saving it."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from ..errors import MinigptError
from .attribution import Attribution
from .by_position import PositionLosses
from .patching import Patching, swept_stages
from .trace import Trace

EXTRA = 'pip install -e ".[plot]"  (or: pip install matplotlib)'


def require_matplotlib() -> None:
    """Refused when matplotlib cannot be imported: a command that draws a figure asks this before its
    work, so that without the extra it prints nothing (a pipe never gets half an output)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MinigptError("plotting needs matplotlib, which is not installed; {EXTRA}", EXTRA=EXTRA) from None


def _pyplot():
    require_matplotlib()
    import matplotlib

    if "ipykernel" not in sys.modules:  # a notebook draws figures inline; elsewhere, files only
        matplotlib.use("Agg")  # no window, no display needed
    import matplotlib.pyplot as plt

    return plt


def curves_figure(runs: dict[str, dict[str, list[dict[str, Any]]]], x: str = "step"):
    """Three panels: training loss, validation loss (nats/token), validation bits/byte; one line per
    run, labelled with its name. `x`: "step", or "time" (seconds of training). Below them, for each
    run whose log has them (`block_grad_norms`; older runs have none), a panel of every block's
    gradient norm on a log scale, one line per block."""
    plt = _pyplot()
    graded = [name for name, data in runs.items() if _grad_records(data)]
    figure = plt.figure(figsize=(13, 7.6 if graded else 3.8), layout="constrained")
    columns = 3 * max(1, len(graded))  # three curves above, each run's gradient panel below
    grid = figure.add_gridspec(2 if graded else 1, columns)
    axes = [figure.add_subplot(grid[0, k * columns // 3 : (k + 1) * columns // 3]) for k in range(3)]
    label = "step" if x == "step" else "seconds of training"
    for name, data in runs.items():
        xs = _xs(data, x)
        axes[0].plot(xs(data["train"]), [r["loss"] for r in data["train"]], label=name, linewidth=1)
        axes[1].plot(xs(data["eval"]), [r["val_loss"] for r in data["eval"]], marker="o", label=name)
        axes[2].plot(xs(data["eval"]), [r["val_bpb"] for r in data["eval"]], marker="o", label=name)
    for ax, title in zip(axes, ("training loss (nats/token)", "validation loss (nats/token)", "validation bits/byte")):
        ax.set_title(title)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for k, name in enumerate(graded):
        ax = figure.add_subplot(grid[1, 3 * k : 3 * (k + 1)])
        records = _grad_records(runs[name])
        n_blocks = len(records[0]["block_grad_norms"])
        for block in range(n_blocks):  # one colour scale from the bottom block (dark) to the top
            norms = [r["block_grad_norms"][block] for r in records]
            colour = plt.cm.viridis(block / max(1, n_blocks - 1) * 0.9)
            ax.plot(_xs(runs[name], x)(records), norms, label=f"block {block}", linewidth=1, color=colour)
        ax.set_yscale("log")
        ax.set_title(f"{name}: gradient norm of each block")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return figure


def _xs(data: dict[str, list[dict[str, Any]]], x: str):
    """The x of each record: its step, or (x = "time") the seconds of training at that step."""
    at = {r["step"]: r.get("elapsed_s") for r in data["train"]}
    return lambda records: [
        r["step"] if x == "step" else at.get(r["step"], r.get("elapsed_s", math.nan)) for r in records
    ]


def _grad_records(data: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The training records that carry each block's gradient norm (none in a run logged before them)."""
    return [r for r in data["train"] if r.get("block_grad_norms")]


def text_curves(runs: dict[str, dict[str, list[dict[str, Any]]]], width: int = 60, height: int = 12) -> str:
    """The validation bits/byte of each run against steps, as characters (a terminal without
    matplotlib or without a file to write): one mark per run, a legend below; then, for each run
    whose log has them, every block's gradient norm at a few logged steps (the first, the last and
    some between) and block 0's over the last block's."""
    return "\n".join(_text_bpb(runs, width, height) + [line for name in runs for line in _text_grads(name, runs[name])])


def _text_bpb(runs: dict[str, dict[str, list[dict[str, Any]]]], width: int, height: int) -> list[str]:
    marks = "*o+x#@%&"
    points = [(name, r["step"], r["val_bpb"]) for name, data in runs.items() for r in data["eval"]]
    if not points:
        return ["no evaluations to plot yet"]
    steps, values = [p[1] for p in points], [p[2] for p in points]
    low, high, last = min(values), max(values), max(steps)
    grid = [[" "] * width for _ in range(height)]
    for k, name in enumerate(runs):
        for run_name, step, value in points:
            if run_name == name:
                col = round(step / last * (width - 1)) if last else 0
                row = round((high - value) / ((high - low) or 1) * (height - 1))
                grid[row][col] = marks[k % len(marks)]
    lines = [f"validation bits/byte against step (0 .. {last})"]
    for i, row in enumerate(grid):
        value = high - (high - low) * i / (height - 1)
        lines.append(f"{value:7.3f} |{''.join(row)}")
    lines.append(" " * 8 + "+" + "-" * width)
    lines += [f"  {marks[k % len(marks)]} {name}" for k, name in enumerate(runs)]
    return lines


GRAD_STEPS = 5  # logged steps the text table shows, the first and the last among them


def _text_grads(name: str, data: dict[str, list[dict[str, Any]]]) -> list[str]:
    records = _grad_records(data)
    if not records:
        return []
    picked = sorted({round(k * (len(records) - 1) / (GRAD_STEPS - 1)) for k in range(GRAD_STEPS)})
    shown = [records[k] for k in picked]
    last = len(shown[0]["block_grad_norms"]) - 1
    heads = [f"step {r['step']}" for r in shown]
    col_w = max(9, *(len(h) for h in heads))
    label_w = len(f"block {last}") if last else len("block 0")
    rows = [(f"block {i}", [r["block_grad_norms"][i] for r in shown]) for i in range(last + 1)]
    if last:  # how much of the top block's gradient the bottom one gets
        ratios = [
            r["block_grad_norms"][0] / r["block_grad_norms"][last] if r["block_grad_norms"][last] else math.nan
            for r in shown
        ]
        rows.append((f"0 / {last}", ratios))
    out = ["", f"gradient norm of each block (L2 over its parameters' gradients), {name}:"]
    out.append(f"  {'':<{label_w}}" + "".join(f"  {h:>{col_w}}" for h in heads))
    out += [f"  {label:<{label_w}}" + "".join(f"  {v:>{col_w}.4g}" for v in values) for label, values in rows]
    return out


def attention_figure(trace: Trace):
    """Every head's attention weights in every shown block: query rows, key columns, the masked
    (future) cells blank, the traced position's row marked, token texts on the axes."""
    plt = _pyplot()
    import numpy as np

    blocks = trace.blocks
    heads = len(blocks[0].full_attention)
    group = heads // trace.model.get("n_kv_head", heads)  # query heads per key and value head
    figure, axes = plt.subplots(
        len(blocks), heads, figsize=(2.6 * heads + 1, 2.5 * len(blocks) + 0.6), squeeze=False, constrained_layout=True
    )
    labels = [repr(t)[1:-1][:8] for t in trace.tokens]
    for b, block in enumerate(blocks):
        for h in range(heads):
            ax = axes[b][h]
            weights = np.array(block.full_attention[h], dtype=float)
            weights[np.triu_indices_from(weights, k=1)] = np.nan  # a query never sees later keys
            ax.imshow(weights, vmin=0, vmax=1, cmap="Blues")
            # grouped-query attention: which key and value head the query head reads
            kv = f" (kv {h // group})" if group > 1 else ""
            ax.set_title(f"block {block.index}, head {h}{kv}", fontsize=9)
            ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.axhline(trace.position, color="#d6552b", linewidth=1.2)  # the traced position's row
    return figure


def attribution_figure(attribution: Attribution, shown: int = 30):
    """The attribution's largest parts as horizontal bars (towards the token right, away left)."""
    plt = _pyplot()
    parts = sorted(attribution.parts, key=lambda part: -abs(part.value))[:shown][::-1]
    figure, ax = plt.subplots(figsize=(7, 0.28 * len(parts) + 1.4), constrained_layout=True)
    ax.barh(
        [part.name for part in parts],
        [part.value for part in parts],
        color=["#2b6cb0" if part.value >= 0 else "#d6552b" for part in parts],
    )
    ax.axvline(0, color="black", linewidth=0.8)
    versus = f" minus {attribution.versus!r}" if attribution.versus is not None else ""
    ax.set_title(
        f"logit of {attribution.token!r}{versus} at position {attribution.position} = {attribution.total:.4f}",
        fontsize=9,
    )
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    return figure


def patching_figure(result: Patching):
    """The effects as heat maps, blocks down: one panel per stage (positions across), or for heads
    one of heads across (every position at once) and one of positions across (the largest head)."""
    plt = _pyplot()
    import numpy as np

    n_layer = 1 + max(e.block for e in result.effects)
    labels = [f"{p}:{repr(t)[1:-1][:6]}" for p, t in enumerate(result.clean.tokens)]
    if result.by == "stage":
        panels = []
        for stage in swept_stages(result.effects):  # a block a stage is not patched in (Attention Residuals): blank
            grid = np.full((n_layer, len(labels)), np.nan)
            for e in result.effects:
                if e.stage == stage:
                    grid[e.block, e.position] = e.effect
            panels.append((stage, grid, labels))
    else:
        n_head = 1 + max(e.head for e in result.effects)
        heads, positions = np.zeros((n_layer, n_head)), np.zeros((n_layer, len(labels)))
        for e in result.effects:
            if e.position is None:
                heads[e.block, e.head] = e.effect
            elif abs(e.effect) > abs(positions[e.block, e.position]):
                positions[e.block, e.position] = e.effect
        panels = [("each head, every position", heads, [str(h) for h in range(n_head)])]
        panels.append(("largest head at each position", positions, labels))
    figure, axes = plt.subplots(
        1, len(panels), figsize=(3.2 * len(panels) + 1.5, 0.35 * n_layer + 2.2), squeeze=False, constrained_layout=True
    )
    limit = max(1.0, *(float(np.nanmax(np.abs(grid))) for _, grid, _ in panels))
    for ax, (title, grid, columns) in zip(axes[0], panels):
        image = ax.imshow(grid, vmin=-limit, vmax=limit, cmap="RdBu", aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
        ax.set_yticks(range(n_layer), [f"block {i}" for i in range(n_layer)], fontsize=7)
    figure.colorbar(image, ax=axes[0][-1], shrink=0.8, label="restored")
    figure.suptitle(f"patching: {result.answer!r} minus {result.versus!r}", fontsize=10)
    return figure


def save_png(figure, path: Path, flag: str = "png", force: bool = False) -> None:
    """The figure as the PNG the output flag `flag` names, written atomically once check_output
    (runs/outputs.py) has passed (an existing file replaced only with `force`); the figure is closed
    either way."""
    from ..runs.outputs import PNG, write_output

    def draw(file) -> None:
        figure.savefig(file, format="png", dpi=100)

    try:
        write_output(Path(path), flag, PNG, force=force, write=draw, binary=True)
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)


def position_figure(result: PositionLosses, title: str = ""):
    """The loss at each position as a curve (bits on the right axis), the trained length a vertical
    line, the positions past it shaded. matplotlib is the plot extra's (plot.py)."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(8, 4), layout="constrained")
    ax.plot(range(result.length), result.nats, linewidth=1.2, color="#2b6cb0")
    edge = result.trained_length - 0.5  # between the last trained position and the first past it
    if result.length > result.trained_length:
        ax.axvspan(edge, result.length - 1, color="#d6552b", alpha=0.08)
    ax.axvline(edge, color="#d6552b", linewidth=1.2, linestyle="--")
    ax.text(
        edge,
        1.0,
        f" trained length {result.trained_length}",
        transform=ax.get_xaxis_transform(),
        va="top",
        fontsize=8,
        color="#d6552b",
    )
    ax.set_xlabel("position (predicting the token after it)")
    ax.set_ylabel("loss (nats/token)")
    bits = ax.secondary_yaxis("right", functions=(lambda n: n / math.log(2), lambda b: b * math.log(2)))
    bits.set_ylabel("bits/token")
    read = "extrapolating" if result.extrapolate else ""
    read = ", ".join(x for x in (read, result.rope_scaling and f"rope scaling {result.rope_scaling}") if x)
    ax.set_title(
        (title + ": " if title else "")
        + f"loss by position, mean of {result.windows:,} windows"
        + (f" ({read})" if read else ""),
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    return figure
