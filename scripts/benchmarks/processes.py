"""minigpt's commands as child processes: `minigpt train` as the benchmarks run it, its steady
tokens/s read from its metrics log, and any command's wall time and peak memory (that process alone)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def train_command(config: str | None, out: Path, steps: int | None = None, changes: list[str] = ()) -> list[str]:
    """`minigpt train` as the benchmark runs it: quiet, into `out` (replaced), `changes` as --set."""
    command = [sys.executable, "-m", "minigpt", "train", "--out", str(out), "--quiet", "--force"]
    command += ["-c", config] if config else []
    command += ["--steps", str(steps)] if steps is not None else []
    for change in changes:
        command += ["--set", change]
    return command


def cli_tokens_per_s(
    config: str | None,
    changes: list[str],
    steps: int,
    tokens_per_step: int,
    out: Path,
    env: dict,
    cwd: Path | None = None,
) -> float:
    """`minigpt train` as a user runs it (a subprocess, `threads = 0`, progress off): tokens/s over
    the steady window of its own metrics log, from its first logged step to its last. `cwd`: where
    it runs (`python -m` puts that folder first on the path, before PYTHONPATH)."""
    command = train_command(
        config, out, steps, [*changes, f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}"]
    )
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        raise SystemExit(f"bench: minigpt train failed:\n{result.stderr}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    first, last = rows[0], rows[-1]
    return tokens_per_step * (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])


# Runs argv[2:] and writes its wall time and peak memory to argv[1]. A small process of its own:
# on Linux a child's ru_maxrss starts at the resident size of the process it was spawned from (the
# parent's address space is the child's until exec), so spawned from this script, which has torch
# loaded, every figure would be at least this script's size.
WAIT4 = r"""
import json, os, sys, time
started = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - started
with open(sys.argv[1], "w") as f:
    json.dump({"wall_s": wall, "code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}, f)
"""


def timed_process(command: list[str], env: dict, cwd: Path) -> dict:
    """Run `command` to its end: wall time, and the peak resident memory of that process alone
    (os.wait4's rusage of it, from a small process that starts it; see WAIT4)."""
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile("w+") as err:
        report = Path(scratch) / "wait4.json"
        subprocess.run(
            [sys.executable, "-c", WAIT4, str(report), *command],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=cwd,
        )
        err.seek(0)
        stderr = err.read()
        measured = json.loads(report.read_text()) if report.exists() else {"code": None}
    if measured["code"] != 0:
        raise SystemExit(f"bench: {' '.join(command)} failed:\n{stderr[-3000:]}")
    return {
        "wall_s": round(measured["wall_s"], 2),
        "peak_rss_mb": round(measured["maxrss_kb"] / 1024),
        "stderr": stderr,
    }
