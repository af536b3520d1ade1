"""The README's quick start, in essence, on a tiny config: `minigpt train` writes a run folder and
`minigpt sample` continues a prompt from it, each as a real process; `minigpt --help` lists the
three commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
    if not readme.exists():
        pytest.skip("README.md not written yet")
    text = readme.read_text(encoding="utf-8")
    install = text.find("pip install -e .")
    assert install >= 0, "the README does not say pip install -e ."
    train = text.find("minigpt train", install)
    assert train > install, "no `minigpt train` after the install command"
    assert text.find("minigpt sample", train) > train, "no `minigpt sample` after `minigpt train`"
