"""Every command a docs page shows with its output prints that output: each page's blocks run in order,
as a reader would run them, in a scratch folder of their own (tests/docs_pages.py has the convention).
The Learn pages leave nothing out."""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_pages import Block, Step, matches, read_page, run_page

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _pages_with_commands() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [p for p in pages if any(isinstance(i, Block) and not i.unchecked for i in read_page(p.read_text("utf-8")))]


def _checked_steps(page: Path) -> list[Step]:
    steps: list[Step] = []
    for item in read_page(page.read_text(encoding="utf-8")):
        steps += [item] if isinstance(item, Step) else [] if item.unchecked else item.steps
    return steps


@pytest.mark.slow  # a process per page, replaying its commands as a reader would
@pytest.mark.parametrize("page", _pages_with_commands(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_shown_command_prints_what_the_page_shows(page, tmp_path):
    results = list(run_page(page, tmp_path / "reader"))
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
