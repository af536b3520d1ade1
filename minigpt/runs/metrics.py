"""Reading a run's metrics.jsonl back (the training listeners write it): its records, split into
training steps and evaluations.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import MinigptError
from .layout import METRICS_FILE

# ---------------------------------------------------------------- reading a run


def metrics_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A last line cut short (the process was killed while writing
    it) is left out: the resumed run logs that step again. Any other line that is not a JSON
    object means the file was damaged some other way, and is refused."""
    lines = [line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if number == len(lines):
                break
            raise MinigptError(
                "{path} line {number} is not a JSON object; the run folder is damaged: remove that line (or the "
                "file) and try again",
                path=path,
                number=number,
            )
        records.append(record)
    return records


def read_metrics(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """A run's metrics.jsonl as training records and evaluation records."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise MinigptError(
            "{run_dir} has no metrics.jsonl; only a run folder that training wrote has one", run_dir=run_dir
        )
    records = metrics_records(path)
    return {
        "train": [r for r in records if "loss" in r and not r.get("eval") and not r.get("diverged")],
        "eval": [r for r in records if r.get("eval")],
    }
