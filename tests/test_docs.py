"""Every command a docs page shows with its output prints that output: each page's blocks run in order,
as a reader would run them, in a scratch folder of their own (tests/docs_pages.py has the convention).
The Learn pages leave nothing out, and run as their reader runs them: after the README's Quick start
(runs/default holds a run, which a page must neither write over nor read by default) and after
`pip install -e .` alone (no extra's module can be imported)."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from docs_pages import Block, Step, matches, read_page, run_page

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# The modules of the extras a figure, an export or an import needs (pyproject.toml), none of them
# installed by `pip install -e .`: a Learn page's commands run without them.
EXTRAS = ("matplotlib", "safetensors", "transformers", "peft", "tensorboard", "onnx", "onnxruntime", "onnxscript")


def _pages_with_commands() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [p for p in pages if any(isinstance(i, Block) and not i.unchecked for i in read_page(p.read_text("utf-8")))]


def _checked_steps(page: Path) -> list[Step]:
    steps: list[Step] = []
    for item in read_page(page.read_text(encoding="utf-8")):
        steps += [item] if isinstance(item, Step) else [] if item.unchecked else item.steps
    return steps


def _after_the_quick_start_without_extras(monkeypatch, blocked: Path):
    """A Learn page's reader: runs/default holds a run (the Quick start's; chapter 17's stands in for
    it), and no extra is installed: each extra's module raises ImportError, in this process (where
    `minigpt` commands run) and in every process a page's bash command starts (PYTHONPATH)."""
    blocked.mkdir()
    for name in EXTRAS:
        (blocked / f"{name}.py").write_text(f"raise ImportError('{name} is an extra: a Learn page runs without it')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(blocked), os.environ.get("PYTHONPATH")])))
    for name in [m for m in sys.modules if m.split(".")[0] in EXTRAS] + list(EXTRAS):
        monkeypatch.setitem(sys.modules, name, None)

    def prepare(folder: Path) -> None:
        shutil.copytree(REPO / "data" / "chapter17", folder / "runs" / "default")

    return prepare


def test_the_blocked_modules_are_the_extras_a_plain_install_leaves_out():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {
        spec.split(">")[0].split("=")[0]
        for key in ("plot", "export", "peft", "tensorboard", "onnx")
        for spec in extras[key]
    }
    assert wanted == set(EXTRAS)


@pytest.mark.slow  # a process per page, replaying its commands as a reader would
@pytest.mark.parametrize("page", _pages_with_commands(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_shown_command_prints_what_the_page_shows(page, tmp_path, monkeypatch):
    learn = page.parent == DOCS / "learn"
    prepare = _after_the_quick_start_without_extras(monkeypatch, tmp_path / "no-extras") if learn else None
    results = list(run_page(page, tmp_path / "reader", prepare))
    steps = _checked_steps(page)
    assert len(results) == len(steps)
    where = page.relative_to(REPO)
    for step, result in zip(steps, results):
        printed = (result["stdout"] + result["stderr"]).splitlines()
        if step.hidden:
            assert result["code"] == 0, f"{where}:{step.line}: setup `{step.command}` failed:\n" + "\n".join(printed)
            continue
        fails = any(line.startswith("minigpt: error:") for line in step.expected)
        assert (result["code"] != 0) == fails, (
            f"{where}:{step.line}: `{step.command}` exited {result['code']}, the page implies it "
            f"{'fails' if fails else 'succeeds'}:\n" + "\n".join(printed[-40:])
        )
        assert matches(step.expected, printed), (
            f"{where}:{step.line}: `{step.command}` printed:\n"
            + "\n".join(printed)
            + "\n\nthe page shows:\n"
            + "\n".join(step.expected)
        )


def test_the_learn_pages_check_every_command_they_show():
    for page in sorted((DOCS / "learn").glob("*.md")):
        left_out = [b.line for b in read_page(page.read_text("utf-8")) if isinstance(b, Block) and b.unchecked]
        assert not left_out, f"{page.relative_to(REPO)} leaves out the blocks at lines {left_out}"


# The reader itself: a wrong match must fail, or no page would ever be checked.


def test_an_ellipsis_stands_for_any_number_of_lines_and_nothing_else_is_skipped():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "...", "b"], ["a", "b"])
    assert matches(["...", "x  "], ["w", "x"])
    assert not matches(["a", "d"], ["a", "b", "d"])
    assert not matches(["a", "...", "e"], ["a", "b", "d"])
    assert not matches(["a"], ["a", "extra"])


def test_a_page_is_read_into_commands_outputs_setups_and_left_out_blocks():
    page = "\n".join(
        [
            "<!-- doc-setup: echo hi > f.txt -->",
            "```console",
            "$ minigpt trace \\",
            "    --ids 0,1",
            "  out 1",
            "...",
            "$ cat f.txt",
            "hi",
            "```",
            "<!-- output not checked: needs minutes -->",
            "```",
            "$ minigpt train",
            "```",
            '??? success "Check"',
            "    ```console",
            "    $ minigpt sample",
            "    ROMEO:",
            "    ```",
            "```toml",
            "[model]",
            "```",
        ]
    )
    setup, block, left_out, folded = read_page(page)
    assert setup.hidden and setup.command == "echo hi > f.txt"
    assert [(s.command, s.expected) for s in block.steps] == [
        ("minigpt trace --ids 0,1", ["  out 1", "..."]),
        ("cat f.txt", ["hi"]),
    ]
    assert block.unchecked is None and left_out.unchecked == "needs minutes"
    assert [(s.command, s.expected) for s in folded.steps] == [("minigpt sample", ["ROMEO:"])]
