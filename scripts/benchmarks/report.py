"""The report: every figure a row (minigpt's, nanoGPT's or a reference's, their ratio, the target),
said on stderr as it is measured; printed as one table, and written as JSON with the machine's
description."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .large_data import print_folder


def new_report(machine: dict, config: str | None) -> dict:
    return {"machine": machine, "config": config or "configs/default.toml", "rows": []}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def row_writer(report: dict):
    """The `row` every benchmark's rows function writes through: one row added to `report`, and said."""

    def row(name: str, minigpt: float | None, nanogpt: float | None, unit: str, target: str, better: str = "higher"):
        # "higher": minigpt / nanoGPT; "lower": nanoGPT / minigpt (both: bigger is better for minigpt);
        # "of-reference": minigpt / the reference in the nanoGPT column (a cost ratio: smaller is better)
        r = {
            "figure": name,
            "minigpt": minigpt,
            "nanogpt": nanogpt,
            "unit": unit,
            "target": target,
            "ratio": {
                "higher": ratio(minigpt, nanogpt),
                "lower": ratio(nanogpt, minigpt),
                "of-reference": ratio(minigpt, nanogpt),
            }[better],
        }
        report["rows"].append(r)
        print(
            f"  {name}: minigpt {minigpt} {unit}" + (f", nanoGPT {nanogpt}, x{r['ratio']}" if nanogpt else ""),
            file=sys.stderr,
            flush=True,
        )

    return row


def save(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def print_table(report: dict, default_config: str) -> None:
    m = report["machine"]
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, torch {m['torch']}, "
        f"{m['torch_threads']} threads, python {m['python']}, CPU bfloat16: {m['cpu_bfloat16']}"
        + (f", GPU {m['cuda']}" if m["cuda"] else "")
    )
    mm = report["matmul_gflops"]
    print(f"matmul peak: float32 {mm['float32']} GFLOP/s, bfloat16 {mm['bfloat16']} GFLOP/s")
    mfu = report["mfu"]
    print(
        f"training FLOPs/token {mfu['flops_per_token']:,}; MFU minigpt {mfu['minigpt']:.1%} "
        f"(float32 path {mfu['minigpt_float32']:.1%})"
        + (f", nanoGPT {mfu['nanogpt']:.1%} of the float32 peak" if mfu["nanogpt"] else "")
    )
    print()
    print_rows(report)
    if "large_text" in report:
        lt = report["large_text"]
        a, b = lt["first_run"], lt["cached_run"]
        print(
            f"\n{lt['megabytes']} MB text: first run prepares in {a['prepare_s']} s (peak {a['peak_rss_mb']} MB); "
            f"with the cache the first step is done {b['first_step_after_launch_s']} s after launch "
            f"({b['first_step_after_imports_s']} s after imports, peak {b['peak_rss_mb']} MB)"
        )
    if "folder" in report:
        print_folder(report["folder"])
    if "minigpt_full_run" in report:
        f = report["minigpt_full_run"]
        print(
            f"default run ({default_config}): {f['steps']} steps, {f['wall_s']} s wall "
            f"({f['train_loop_s']} s in the loop), val {f['val_loss']} nats/token = {f['val_bpb']} bits/byte"
        )
    if report.get("nanogpt_full_run"):
        f = report["nanogpt_full_run"]
        print(
            f"nanoGPT 2,000 iterations: {f['wall_s']} s wall, val {f['val_loss']} nats/token = {f['val_bpb']} bits/byte"
        )


def print_rows(report: dict) -> None:
    w = max(len(r["figure"]) for r in report["rows"])
    print(f"{'figure':<{w}}  {'minigpt':>10}  {'nanoGPT':>10}  {'ratio':>7}  target")
    print(f"{'':<{w}}  {'':>10}  {'(or ref.)':>10}")
    for r in report["rows"]:
        m = "-" if r["minigpt"] is None else r["minigpt"]
        n = "" if r["nanogpt"] is None else r["nanogpt"]
        x = "" if r["ratio"] is None else f"x{r['ratio']}"
        print(f"{r['figure']:<{w}}  {m:>10}  {n:>10}  {x:>7}  {r['target']}")
