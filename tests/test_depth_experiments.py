"""scripts/depth_experiments.py --quick: every experiment of docs/guide/depth.md but the first, a few
steps each, as one command (the guide's numbers come from the full run; this proves each kind of
cell runs and each number the guide quotes is computed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_quick_form_runs_every_experiment_and_leaves_the_guides_figures_alone(tmp_path):
    docs = {p: p.stat().st_mtime_ns for p in (ROOT / "docs").glob("depth-*.png")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "depth_experiments.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "depth-experiments.json").read_text())
    init = results["at_initialisation"]
    assert set(init) == {f"{p}-norm, {i}" for p in ("pre", "post") for i in ("gpt2", "xavier")}
    for row in init.values():  # the last block's gradient at 2 and 4 blocks, and its slope against depth
        assert set(row["last_block"]) == {"2", "4"} and all(v > 0 for v in row["last_block"].values())
        assert math.isfinite(row["slope"])
    assert len(results["warmup"]["cells"]) == 16  # placement x learning rate x warmup x init
    residuals = results["attention_residuals"]
    assert set(residuals["measured"]) >= {"residual", "full AttnRes", "block AttnRes (8 blocks)"}
    for runs in residuals["measured"].values():
        for m in runs:
            assert len(m["output_norm"]) == 2 * 12  # each attention's and each FFN's output
    assert (tmp_path / "depth-init-gradients.png").is_file()
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "docs").glob("depth-*.png")} == docs
