"""Atomic writes: a file is written under a temporary name in its own folder and renamed into place,
so a crash mid-write leaves the previous version intact and a reader never sees half a file.

Used by the run folder (config, tokenizer, checkpoint, metrics) and by the token cache.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _creation_mode() -> int:
    """The mode `open()` would give a new file (0o666 less the umask). Reading the umask means
    setting it, so it is put straight back; asked per write, never changed at import."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, write: Callable[[Any], None], binary: bool = False) -> None:
    """Call write(file) on a temporary file next to `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _creation_mode())  # mkstemp makes 0600; give the file the mode open() would
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
