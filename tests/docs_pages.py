"""Reading the command blocks of a docs page, running them as a reader would, and matching what they
print against what the page shows (tests/test_docs.py uses it).

The convention (also in docs/guide/layout-and-development.md):

- A fenced block whose first line starts with `$ ` holds commands; the lines after a command, up to the
  next `$ ` line, are its expected output. A command line ending in ` \\` continues on the next line.
- A page's blocks run in order in one scratch folder, where `configs/` and `data/` are copies of the
  repository's; `runs/` starts empty. `minigpt` is this checkout's.
- Output is matched line by line against stdout, then stderr; trailing spaces are ignored and a line
  that is exactly `...` stands for any number of lines, none included. A shown `minigpt: error:` line
  means the command must fail; otherwise it must succeed.
- `<!-- doc-setup: COMMAND -->` runs COMMAND (bash) at that point, unseen by the reader.
- `<!-- output not checked: REASON -->` right before a fence leaves that block out (never in docs/learn/).
- A Learn page runs after the README's Quick start (runs/default holds a run) and without the extras
  (tests/test_docs.py prepares its folder so).

`run_page` runs a page's steps in the calling process (tests/test_docs.py: the test's own, so a page
costs no torch import of its own): `minigpt` commands in-process through the CLI's own `main`,
anything else through bash. Run as a script (`python tests/docs_pages.py PAGE SCRATCH`), it does the
same and prints each result as one JSON line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
SETUP = re.compile(r"^\s*<!--\s*doc-setup:\s*(.*?)\s*-->\s*$")
UNCHECKED = re.compile(r"^\s*<!--\s*output not checked:\s*(.*?)\s*-->\s*$")
# A command is run in-process only when it is a plain `minigpt ...` word list (no pipe, redirect, chain
# or variable): anything else is bash's to run.
SHELL_SYNTAX = re.compile(r"[|<>;&$`]")


@dataclass
class Step:
    """One thing a page does: a shown command with its expected output, or a hidden setup command."""

    command: str
    line: int  # where the page says it, 1-based
    expected: list[str] = field(default_factory=list)
    hidden: bool = False


@dataclass
class Block:
    line: int
    steps: list[Step]
    unchecked: str | None  # the reason given, where the page leaves the block out


def read_page(text: str) -> list[Block | Step]:
    """The page's command blocks and setup comments, in page order."""
    items: list[Block | Step] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        setup = SETUP.match(lines[i])
        if setup:
            items.append(Step(setup.group(1), i + 1, hidden=True))
            i += 1
            continue
        if not FENCE.match(lines[i]):
            i += 1
            continue
        fence = FENCE.match(lines[i]).group(1)
        # A fence inside a fold (`??? success`) is indented: its lines are read without that indent.
        indent = len(lines[i]) - len(lines[i].lstrip())
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        if not body or not body[0].startswith("$ "):
            continue
        reason = UNCHECKED.match(lines[start - 1]) if start > 0 else None
        items.append(Block(start + 1, _steps(body, start + 2), reason.group(1) if reason else None))
    return items


def _steps(body: list[str], first_line: int) -> list[Step]:
    steps: list[Step] = []
    j = 0
    while j < len(body):
        line = body[j]
        if line.startswith("$ "):
            command, at = line[2:], first_line + j
            while command.endswith("\\") and j + 1 < len(body):
                j += 1
                command = command[:-1].rstrip() + " " + body[j].strip()
            steps.append(Step(command.strip(), at))
        elif steps:
            steps[-1].expected.append(line)
        j += 1
    return steps


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether `actual` is `expected` with each `...` line standing for zero or more lines."""
    expected = [line.rstrip() for line in expected]
    actual = [line.rstrip() for line in actual]
    # reachable[j]: the expected lines read so far can match actual[:j]
    reachable = [True] + [False] * len(actual)
    for want in expected:
        if want == "...":
            for j in range(1, len(actual) + 1):
                reachable[j] = reachable[j] or reachable[j - 1]
            continue
        reachable = [False] + [reachable[j] and actual[j] == want for j in range(len(actual))]
    return reachable[-1]


def scratch_folder(repo: Path, scratch: Path) -> Path:
    """A reader's folder: copies of configs/ and data/ (runs a config names are written under this
    folder, not the checkout), an empty runs/."""
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copytree(repo / "configs", scratch / "configs")
    shutil.copytree(repo / "data", scratch / "data")  # 1 MB; a copy, so paths print as a reader's do
    (scratch / "runs").mkdir()
    return scratch


def _run_in_process(words: list[str]) -> tuple[int, str, str]:
    from minigpt import cli

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["minigpt", *words]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def _run_in_bash(command: str, folder: Path) -> tuple[int, str, str]:
    shim = folder / ".bin"
    if not shim.exists():  # `minigpt` in a bash command is this checkout's, under this Python
        shim.mkdir()
        (shim / "minigpt").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m minigpt "$@"\n')
        # and `python`/`python3` the Python this test runs under, which has minigpt installed
        for name in ("python", "python3"):
            (shim / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        for tool in shim.iterdir():
            tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout, done.stderr


def run_step(step: Step, folder: Path) -> dict:
    words = shlex.split(step.command) if not SHELL_SYNTAX.search(step.command) else []
    if words[:1] == ["minigpt"]:
        code, out, err = _run_in_process(words[1:])
    else:
        code, out, err = _run_in_bash(step.command, folder)
    return {"command": step.command, "line": step.line, "code": code, "stdout": out, "stderr": err}


def run_page(page: Path, scratch: Path, prepare=None):
    """Each step of `page` run in order in a reader's folder at `scratch`, from inside it; yields
    each step's result as it ends. `prepare(folder)`, when given, makes the folder what the reader has
    before the page's first command (tests/test_docs.py: a Learn page's reader has the Quick start's
    run). The working directory is the caller's again afterwards."""
    repo = Path(__file__).resolve().parents[1]
    text = page.read_text(encoding="utf-8")
    folder = scratch_folder(repo, scratch)
    if prepare is not None:
        prepare(folder)
    before = os.getcwd()
    os.chdir(folder)
    try:
        for item in read_page(text):
            steps = [item] if isinstance(item, Step) else [] if item.unchecked else item.steps
            for step in steps:
                yield run_step(step, folder)
    finally:
        os.chdir(before)


def main(page: str, scratch: str) -> None:
    for result in run_page(Path(page).resolve(), Path(scratch).resolve()):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
