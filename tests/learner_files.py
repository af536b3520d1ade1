"""What the tests of a learner's code share (tests/test_exercise_trust.py, tests/test_exercise_faults.py):
the kept solutions, a solution that leaves a mark when imported, a solution with a line changed, and
every file under a folder, to compare byte for byte before and after a command."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

SOLUTIONS = Path(__file__).resolve().parent / "data" / "exercises"
FFN_RETURN = "return self.W2(F.relu(self.W1(x)))"
# A first line that leaves ffn.imported beside the file whenever the file is imported (its code runs).
MARKS_ITS_IMPORT = "import pathlib\npathlib.Path(__file__).with_suffix('.imported').touch()\n"


def solution(name: str) -> str:
    return (SOLUTIONS / f"{name}.py").read_text(encoding="utf-8")


def ffn_returning(body: str) -> str:
    """The ffn solution with its forward's return replaced by `body` (lines indented under forward)."""
    text = solution("ffn")
    assert FFN_RETURN in text
    return text.replace(FFN_RETURN, body.replace("\n", "\n        "))


def write_learner(folder: Path, text: str, name: str = "ffn") -> Path:
    """folder/exercises/NAME.py holding `text`."""
    path = folder / "exercises" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def line_of(path: Path, text: str) -> int:
    """The number of the line of `path` holding `text`."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path: bytes), to compare before and after a command."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def record_learner_file(run: Path, file: str, source: Path) -> None:
    """Make every checkpoint of `run` record `file` (as written) as its learner's file, with the sha256
    of `source`: what a crafted run folder does."""
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    for checkpoint in ("checkpoint.pt", "best.pt"):
        payload = torch.load(run / checkpoint, weights_only=True)
        payload["exercise"].update(file=file, sha256=sha)
        torch.save(payload, run / checkpoint)
