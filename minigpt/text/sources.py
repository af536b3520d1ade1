"""Which files `[train] data` names, and what a run records of them.

`data` is a text file, a folder, or a list of either. A folder stands for every `*.txt` file under
it, recursively, in sorted order of their paths (links followed; hidden files and folders, whose
names start with a dot, left out as a shell's `*` leaves them). Each file gets the name a run
records it by: its path relative to the folder given, or its own name when it was given directly,
so a moved folder still resumes. A corpus is identified by its files' names and sha256s.

Nothing is read here beyond the folders' listings: what cannot be a corpus (an empty folder, one
with no `*.txt`, a link that loops, two files of one name) is refused before any text is read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import MinigptError

SUFFIX = ".txt"


@dataclass(frozen=True)
class TextFile:
    """One file of a corpus: the name a run records it by, and where it is now."""

    name: str
    path: Path


@dataclass(frozen=True)
class Document:
    """One file of a corpus: the name and sha256 a run records it by, and how many tokens of each
    split it gave (its training head, its validation tail)."""

    name: str
    sha256: str
    train_tokens: int
    val_tokens: int


@dataclass
class Listing:
    """The files `data` names, in order, and the empty files its folders hold (skipped: a folder
    may well hold a placeholder, and an empty file adds no text)."""

    files: list[TextFile]
    skipped: list[TextFile] = field(default_factory=list)
    given: list[Path] = field(default_factory=list)  # the paths `data` named

    def describe(self) -> str:
        """The corpus in a few words, for messages: the file itself, or how many files from where."""
        if len(self.files) == 1:
            return str(self.files[0].path)
        where = f"under {self.given[0]}" if len(self.given) == 1 else f"from {len(self.given)} paths"
        return f"{len(self.files):,} files {where}"


def entries(data: str | Sequence[str]) -> list[str]:
    """`[train] data` as a list of paths."""
    return [data] if isinstance(data, str) else list(data)


def describe(data: str | Sequence[str]) -> str:
    """`[train] data` as a person reads it: the path, or the paths."""
    return ", ".join(entries(data))


def list_files(data: str | Sequence[str]) -> Listing:
    """The files `data` names, in order; refused when they cannot be a corpus."""
    listing = Listing([])
    for given in entries(data):
        if not given:
            raise MinigptError("no training text given ({data} is empty); pass a UTF-8 file or a folder")
        path = Path(given)
        listing.given.append(path)
        if path.is_dir():
            files, skipped = _folder_files(path)
            listing.files += files
            listing.skipped += skipped
        else:
            # A missing or unreadable file is refused when it is read, with the reason.
            listing.files.append(TextFile(path.name, path))
    seen: dict[str, TextFile] = {}
    for f in listing.files:
        if f.name in seen:
            first = seen[f.name]
            twice = (
                f"training file {f.path} is given twice"
                if _same_file(first.path, f.path)
                else f"training files {first.path} and {f.path} are both named {f.name}"
            )
            raise MinigptError(
                "{twice}; a run records each file by its name, so give every file once with {data} (a folder's "
                "files are named by their paths inside it)",
                twice=twice,
            )
        seen[f.name] = f
    return listing


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


def _folder_files(root: Path) -> tuple[list[TextFile], list[TextFile]]:
    """Every *.txt file under `root` and the empty ones among them, in sorted order of their
    paths. A link to a folder that holds the link (a loop) is refused by name: a walk that
    follows links would never end."""
    found: list[TextFile] = []
    empty: list[TextFile] = []
    others: list[str] = []

    def visit(folder: Path, relative: PurePosixPath, ancestors: dict[tuple[int, int], Path], link: Path | None) -> None:
        """`link`: the last link followed on the way to `folder` (what a loop is named by)."""
        try:
            names = sorted(entry.name for entry in os.scandir(folder))
        except OSError as exc:
            raise MinigptError(
                "training folder {folder} cannot be read ({reason}); check its permissions",
                folder=folder,
                reason=exc.strerror,
            ) from None
        for name in names:
            if name.startswith("."):
                continue
            path = folder / name
            try:
                st = os.stat(path)  # follows links
            except OSError as exc:
                raise _unfollowable(root, path, exc) from None
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                followed = path if path.is_symlink() else link
                if key in ancestors:
                    through = f" (through {path})" if followed != path else ""
                    raise MinigptError(
                        "training folder {root}: the link {followed} leads back to {ancestors}, a folder it lies "
                        "in{through}, so the folder never ends (a link loop); remove the link, or pass the folders to "
                        "read with {data}",
                        root=root,
                        followed=followed or path,
                        ancestors=ancestors[key],
                        through=through,
                    )
                visit(path, relative / name, {**ancestors, key: path}, followed)
            elif stat.S_ISREG(st.st_mode) and name.endswith(SUFFIX):
                f = TextFile(str(relative / name), path)
                (found if st.st_size else empty).append(f)
            else:
                others.append(str(relative / name))

    top = os.stat(root)
    visit(root, PurePosixPath(), {(top.st_dev, top.st_ino): root}, None)
    if not found:
        if empty:
            raise MinigptError(
                "training folder {root} holds only empty *{SUFFIX} files ({n_empty}, e.g. {name}); put text in "
                "them or pass another folder with {data}",
                root=root,
                SUFFIX=SUFFIX,
                n_empty=len(empty),
                name=empty[0].name,
            )
        if not others:
            raise MinigptError(
                "training folder {root} is empty; put the UTF-8 *{SUFFIX} files to train on in it, or pass "
                "another folder with {data}",
                root=root,
                SUFFIX=SUFFIX,
            )
        raise MinigptError(
            "training folder {root} holds no *{SUFFIX} file ({n_others:,} file(s), none ending in {SUFFIX}, "
            "e.g. {others}); a folder trains on every *{SUFFIX} file under it: rename the text files, or "
            "pass them with {data}",
            root=root,
            SUFFIX=SUFFIX,
            n_others=len(others),
            others=others[0],
        )
    return found, empty


def _unfollowable(root: Path, path: Path, exc: OSError) -> MinigptError:
    """A folder entry that cannot be looked at: a broken link, a link to itself, no permission."""
    if path.is_symlink():
        target = os.readlink(path)
        if exc.errno == errno.ELOOP:
            return MinigptError(
                "training folder {root}: the link {path} (to {target}) never reaches a file (a link loop); "
                "remove the link",
                root=root,
                path=path,
                target=target,
            )
        if exc.errno == errno.ENOENT:
            return MinigptError(
                "training folder {root}: the link {path} is broken ({target} does not exist); remove the link or "
                "restore what it points to",
                root=root,
                path=path,
                target=target,
            )
    return MinigptError(
        "training folder {root}: {path} cannot be read ({reason}); check its permissions",
        root=root,
        path=path,
        reason=exc.strerror,
    )


# ---------------------------------------------------------------- identity


def digest(files: Sequence[tuple[str, str]]) -> str:
    """The sha256 a corpus of several files is known by: over every (name, sha256), in order."""
    return hashlib.sha256(json.dumps([list(f) for f in files]).encode("utf-8")).hexdigest()


def first_difference(then: Sequence[Sequence[str]], now: Sequence[Sequence[str]]) -> str:
    """What differs between two lists of (name, sha256), the first file named: "b.txt changed
    (...)", "d.txt was added", "c.txt was removed", or the same files in another order."""
    before, after = dict(map(tuple, then)), dict(map(tuple, now))
    found = []
    for name, sha in now:
        if name not in before:
            found.append(f"{name} was added")
        elif before[name] != sha:
            found.append(f"{name} changed (sha256 {sha[:12]}... != {before[name][:12]}...)")
    found += [f"{name} was removed" for name, _ in then if name not in after]
    if not found:
        order = [name for name, _ in now]
        moved = next(((i, name) for i, (name, _) in enumerate(then) if order[i] != name), None)
        if moved is None:
            return "the files are the same"
        i, name = moved
        return f"the same files in another order ({name} was file {i + 1}, now file {order.index(name) + 1})"
    more = f" (and {len(found) - 1} more difference(s))" if len(found) > 1 else ""
    return found[0] + more
