"""What a run's metrics log and a prompt file hold, read for a caller."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runs.metrics import read_metrics
from ..text.reading import read_text


def metrics(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A run's metrics.jsonl: {"train": [...], "eval": [...]}, one dict per logged step and per
    evaluation, as `minigpt plot` draws them."""
    return read_metrics(Path(path))


def read_prompt(path: str | Path) -> str:
    """A prompt kept in a UTF-8 file (refused, saying why, when it cannot be read as text)."""
    return read_text(path, "prompt file")[0]
