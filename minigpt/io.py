"""Files. Atomic writes: a file is written under a temporary name in its own folder and renamed into
place, so a crash mid-write leaves the previous version intact and a reader never sees half a file.
Used by the run folder (config, tokenizer, checkpoint, metrics) and by the token cache; a whole
folder (an imported run) is written the same way, under a temporary name beside it.

The files a command writes when an output flag asks are written so too (runs/outputs.py).

And reading: a file's sha256 in pieces (a checkpoint of gigabytes is never held whole), with the
progress protocol every slow read follows, `progress(label, total)`: a context that gives
`advance(n)`, as a progress bar does; `no_progress` where nobody watches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

# progress(label, total[, unit]) -> a context giving advance(n)
Progress = Callable[..., AbstractContextManager[Callable[[int], None]]]


@contextmanager
def no_progress(label: str, total: int, unit: str = "") -> Iterator[Callable[[int], None]]:
    """The progress of a step nobody watches."""
    yield lambda n: None


def file_sha256(path: Path, progress: Progress = no_progress) -> str:
    """The sha256 of a file's bytes, read a few MB at a time, `progress` told of each piece."""
    digest = hashlib.sha256()
    with progress(f"hashing {Path(path).name}", Path(path).stat().st_size) as advance, open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            advance(len(chunk))
    return digest.hexdigest()


def _umask() -> int:
    """The process's umask. Reading it means setting it, so it is put straight back; asked per
    write, never changed at import."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def creation_mode() -> int:
    """The mode `open()` would give a new file (0o666 less the umask)."""
    return 0o666 & ~_umask()


def atomic_write(path: Path, write: Callable[[Any], None], binary: bool = False) -> None:
    """Call write(file) on a temporary file next to `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, creation_mode())  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_folder(path: Path, fill: Callable[[Path], None]) -> None:
    """Call fill(folder) on a new temporary folder beside `path`, then rename it to `path`. An
    existing `path` is moved aside first and removed only once the new folder is in place, so a
    failure anywhere leaves the old folder as it was and nothing of the new one."""
    path = Path(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes 0700; give it the mode mkdir would
        fill(staging)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old.tmp", dir=path.parent))
            os.replace(path, old)  # over the empty placeholder folder
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None:
            if path.exists():
                os.rmdir(old)  # the old folder never moved: only the placeholder goes
            else:
                os.replace(old, path)  # the new folder never arrived: the old one goes back
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
