"""The README's quick start, in essence, on a tiny config: `minigpt train` writes a run folder and
`minigpt sample` continues a prompt from it, each as a real process; `minigpt --help` lists the
three commands. The README stays a front page, and every docs page is reachable from the site's nav."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK_START = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && "
    'minigpt train && minigpt sample -p "ROMEO:"'
)
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -q'
RUN_FILES = {"config.toml", "tokenizer.json", "checkpoint.pt", "metrics.jsonl", "best.pt"}


@pytest.mark.slow  # two real processes, the quick start's own way
def test_readme_train_then_sample_on_a_tiny_config(tiny_config, tmp_path, minigpt_process):
    run_minigpt = minigpt_process
    run = tmp_path / "run"
    trained = run_minigpt("train", "-c", tiny_config, "--out", run)
    assert trained.returncode == 0, trained.stderr
    assert "Traceback" not in trained.stderr
    assert "done: 20 steps" in trained.stderr
    assert f"sample with: minigpt sample --run {run}" in trained.stderr
    assert {p.name for p in run.iterdir()} == RUN_FILES

    sampled = run_minigpt("sample", "-c", tiny_config, "--run", run, "-n", "20", "-p", "ROMEO:")
    assert sampled.returncode == 0, sampled.stderr
    assert "Traceback" not in sampled.stderr
    assert "not implemented" not in sampled.stderr + sampled.stdout
    # The prompt, then 20 new char tokens (one character each).
    assert sampled.stdout.startswith("ROMEO:")
    assert len(sampled.stdout) >= len("ROMEO:") + 20
    assert {p.name for p in run.iterdir()} == RUN_FILES  # sampling writes nothing into the run


def _help_commands() -> list[list[str]]:
    script = Path(sys.executable).with_name("minigpt")
    installed = [[str(script), "--help"]] if script.exists() else []
    return [[sys.executable, "-m", "minigpt", "--help"], *installed]


@pytest.mark.parametrize(
    "command", _help_commands(), ids=lambda c: "console script" if c[1] == "--help" else "python -m"
)
def test_help_lists_train_sample_and_trace(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for name in ("train", "sample", "trace"):
        assert any(line.strip(" │").split(" ")[0] == name for line in lines), (name, result.stdout)


def test_readme_quick_start_names_install_train_and_sample():
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    install = text.find("pip install -e .")
    assert install >= 0, "the README does not say pip install -e ."
    train = text.find("minigpt train", install)
    assert train > install, "no `minigpt train` after the install command"
    assert text.find("minigpt sample", train) > train, "no `minigpt sample` after `minigpt train`"


def test_readme_shows_the_quick_start_then_the_test_command_verbatim():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert QUICK_START in lines, "the quick start's one command is not a line of the README"
    assert TEST_COMMAND in lines, "the test command is not a line of the README"
    assert lines.index(QUICK_START) < lines.index(TEST_COMMAND)
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")


def test_readme_is_a_front_page_of_at_most_300_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


def nav_pages(mkdocs_yml: str) -> list[str]:
    """The pages mkdocs.yml's nav lists, in order: each `.md` path ending a line of the nav (a
    `- page.md` or a `- Title: page.md` entry), read without a YAML library."""
    nav = mkdocs_yml.split("\nnav:\n", 1)[1]
    nav = re.split(r"\n(?=\S)", nav, maxsplit=1)[0]  # up to the next top-level key
    return re.findall(r"^\s*-\s*(?:[^\n]*:\s*)?([\w./-]+\.md)\s*$", nav, flags=re.MULTILINE)


def test_nav_reader_finds_titled_and_untitled_entries_only_under_nav():
    yml = "\n".join(
        ["site_name: x", "nav:", "  - Home: index.md", "  - Learn:", '      - "A: b": learn/a.md', "      - guide/b.md"]
        + ["extra: c.md", ""]
    )
    assert nav_pages(yml) == ["index.md", "learn/a.md", "guide/b.md"]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    listed = nav_pages((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = REPO / "docs"
    pages = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    pages = [p for p in pages if not p.startswith("runs/")]  # what the notebook writes, not a page
    assert sorted(set(listed)) == sorted(listed), "a page is listed twice"
    assert [p for p in pages if p not in listed] == [], "pages left out of mkdocs.yml's nav"
    assert [p for p in listed if not (docs / p).is_file()] == [], "nav entries with no page"
