"""The files a command writes when an output flag asks (`--png`, `--per-token`, `plot -o`), checked
before the work that fills them (`check_output`) and written atomically (`write_output`): the name
ends in what is written, the file lies outside every run folder (a folder holding a checkpoint.pt:
a run folder holds its run's files and nothing else, so nothing there is an output's to replace, and
`train --force` can replace the run whole), and a file already there is replaced only with `--force`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import MinigptError, parameter
from ..io import atomic_write
from .layout import CHECKPOINT_FILE


@dataclass(frozen=True)
class Output:
    """What an output flag writes: its file name's ending, and the kind of file in words."""

    suffix: str
    kind: str


PNG = Output(".png", "a PNG image")
JSON_LINES = Output(".jsonl", "JSON lines")


def run_folder_around(path: Path) -> Path | None:
    """The run folder `path` would lie in (its folder or one above it holds a checkpoint.pt), or None."""
    return next((folder for folder in Path(path).resolve().parents if (folder / CHECKPOINT_FILE).is_file()), None)


def check_output(path: Path, flag: str, output: Output, force: bool) -> None:
    """Refuse a path the output flag `flag` (a parameter's name) must not write: one not ending in
    what it writes, a folder, one inside a run folder (even with `force`), one in no folder, an
    existing file unless `force`. Called before the work that fills the file, and again by `write_output`."""
    path, what = Path(path), parameter(flag)
    if path.suffix.lower() != output.suffix:
        raise MinigptError(
            "{what} {given} does not end in {suffix}, and {what} writes {kind}; give a file name ending in {suffix}",
            what=what,
            given=path,
            suffix=output.suffix,
            kind=output.kind,
        )
    if path.is_dir():
        raise MinigptError(
            "{what} {given} is a folder; give the path of the {suffix} file to write",
            what=what,
            given=path,
            suffix=output.suffix,
        )
    run = run_folder_around(path)
    if run is not None:
        raise MinigptError(
            "{what} {given} lies inside the run folder {run}, which holds its run's own files and nothing else; "
            "write it outside the run folder",
            what=what,
            given=path,
            run=run,
        )
    if not path.absolute().parent.is_dir():
        raise MinigptError(
            "{what} {given}: there is no folder {parent} to write it in; make it first, or choose another path",
            what=what,
            given=path,
            parent=path.absolute().parent,
        )
    if path.exists() and not force:
        raise MinigptError(
            "{what} {given} already exists; pass {force:on} to replace it, or choose another path",
            what=what,
            given=path,
        )


def write_output(
    path: Path, flag: str, output: Output, force: bool, write: Callable[[Any], None], binary: bool = False
) -> None:
    """`check_output`, then write(file) atomically (`atomic_write`); a path that cannot be written
    is refused in one line, and nothing is left there."""
    check_output(path, flag, output, force)
    try:
        atomic_write(Path(path), write, binary=binary)
    except OSError as exc:
        raise MinigptError(
            "{what} {given} cannot be written ({reason}); choose another path",
            what=parameter(flag),
            given=path,
            reason=exc.strerror or exc,
        ) from None
