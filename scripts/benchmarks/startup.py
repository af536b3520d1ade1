"""A sampling call as a user makes it (`minigpt sample -p "ROMEO:" -n 200`, start to exit) against a
bare `python -c "import torch"`."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import time
from pathlib import Path


def startup(run: Path, env: dict, repeats: int = 5) -> dict:
    """`minigpt sample -p "ROMEO:" -n 200` start to exit against `python -c "import torch"`,
    alternating, best of `repeats` each; where the onnx extra is installed, also with `--runtime
    onnxruntime` (its export cached by a first, untimed call, as a user's second call finds it)."""
    sample = [sys.executable, "-m", "minigpt", "sample", "--run", str(run), "-p", "ROMEO:", "-n", "200"]
    commands = {"import_torch": [sys.executable, "-c", "import torch"], "minigpt_sample": sample}
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxscript"):
        commands["minigpt_sample_onnxruntime"] = [*sample, "--runtime", "onnxruntime"]
        subprocess.run(commands["minigpt_sample_onnxruntime"], capture_output=True, env=env)
    best = {name: math.inf for name in commands}
    for _ in range(repeats):
        for name, command in commands.items():
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"bench: {' '.join(command)} failed:\n{done.stderr}")
            best[name] = min(best[name], time.perf_counter() - started)
    return {
        "import_torch_s": round(best["import_torch"], 3),
        "minigpt_sample_s": round(best["minigpt_sample"], 3),
        "ratio": round(best["minigpt_sample"] / best["import_torch"], 3),
        **(
            {"minigpt_sample_onnxruntime_s": round(best["minigpt_sample_onnxruntime"], 3)}
            if "minigpt_sample_onnxruntime" in best
            else {}
        ),
    }
