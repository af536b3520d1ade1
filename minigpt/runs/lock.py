"""One writer at a time: the lock a `train` (or an import) holds on its run folder."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MinigptError

# ---------------------------------------------------------------- one writer at a time


class RunLock:
    """An exclusive lock on a run folder for as long as one `train` writes it: `fcntl.flock` on a
    small file beside the folder (`.NAME.lock` in its parent, so it exists before the folder does
    and survives --force removing it), holding the writer's pid. The kernel releases it when the
    process ends, however it ends, so a killed trainer never blocks the next one. Readers (sample,
    trace) take no lock: every file they read is replaced atomically."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir.parent / f".{self.run_dir.name}.lock"
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not a POSIX system: no lock, as before
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise MinigptError(
                    "run folder {run_dir} cannot be used ({reason}); choose another {out}",
                    run_dir=self.run_dir,
                    reason=exc.strerror or exc,
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise MinigptError(
                    "run folder {run_dir} is being written by another training run (pid {holder}); wait for it to "
                    "finish or stop it, or choose another {out}",
                    run_dir=self.run_dir,
                    holder=holder,
                ) from None
            # The holder before us removes the file as it lets go; a lock on a removed file locks nothing.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self.fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file while still holding the lock, then let go: nothing is left beside
        the run folder (a killed trainer leaves its file, which blocks no one)."""
        if self.fd is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None
