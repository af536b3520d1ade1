"""origin.json read back: the run folder a fine-tune started from, found where the file says and
checked to hold the very checkpoint it started from (the sha256 the file records), so what is
compared with a fine-tune is its starting point, not a run that has since trained on or been
replaced. An import's origin.json names a model from elsewhere, not a run folder: no origin run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import MinigptError
from ..io import file_sha256
from .layout import CHECKPOINTS, ORIGIN_FILE

PASS_ANOTHER = "pass {compare_run} DIR, a run folder of the same shape and tokenizer"


@dataclass(frozen=True)
class OriginRun:
    """Where a fine-tune started: a run folder and which of its checkpoints ("last" or "best")."""

    folder: Path
    checkpoint: str


def origin_run(run_dir: Path) -> OriginRun:
    """The run folder and checkpoint `run_dir`'s origin.json names, if that checkpoint is still
    there with the sha256 recorded; refused in one line saying what was expected otherwise."""
    run_dir = Path(run_dir)
    path = run_dir / ORIGIN_FILE
    if not path.is_file():
        raise MinigptError(
            "run {run_dir} has no {ORIGIN_FILE}: it was not fine-tuned from another run, so it has no origin "
            "run; " + PASS_ANOTHER,
            run_dir=run_dir,
            ORIGIN_FILE=ORIGIN_FILE,
        )
    try:
        origin = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(origin, dict) and "run" not in origin:  # an import's: a model from elsewhere
            raise MinigptError(
                "run {run_dir} was imported ({kind} {source}), not fine-tuned from a run folder, so it has "
                "no origin run; " + PASS_ANOTHER,
                run_dir=run_dir,
                kind=origin.get("kind", "?"),
                source=origin.get("path", "?"),
            )
        folder, checkpoint, sha256 = Path(origin["run"]), origin.get("checkpoint", "last"), origin["sha256"]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as exc:
        reason = f"no {exc}" if isinstance(exc, KeyError) else exc
        raise MinigptError("{path} cannot be read ({reason}); " + PASS_ANOTHER, path=path, reason=reason) from None
    if checkpoint not in CHECKPOINTS:
        raise MinigptError(
            "{path} names checkpoint {checkpoint!r}, not one of {known}; " + PASS_ANOTHER,
            path=path,
            checkpoint=checkpoint,
            known=", ".join(CHECKPOINTS),
        )
    weights = folder / CHECKPOINTS[checkpoint]
    if not weights.is_file():
        raise MinigptError(
            "run {run_dir} was fine-tuned from {weights} ({ORIGIN_FILE} says), which is not there: the run "
            "was moved or removed; " + PASS_ANOTHER + " (where it is now)",
            run_dir=run_dir,
            weights=weights,
            ORIGIN_FILE=ORIGIN_FILE,
        )
    if file_sha256(weights) != sha256:
        raise MinigptError(
            "run {run_dir} was fine-tuned from {weights}, which has changed since (trained further or "
            "replaced: its sha256 is not the one {ORIGIN_FILE} records); " + PASS_ANOTHER + " to compare "
            "with it as it is now",
            run_dir=run_dir,
            weights=weights,
            ORIGIN_FILE=ORIGIN_FILE,
        )
    return OriginRun(folder, checkpoint)
