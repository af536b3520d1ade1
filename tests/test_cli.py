"""Command-line mistakes end like every other user error: one line on stderr, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args, expected",
    [
        (["train", "--steps", "abc"], "minigpt: error: Invalid value for '--steps': "),
        (["train", "--bogus"], "minigpt: error: No such option: --bogus"),
        (["trace", "-p", "x", "--position", "abc"], "minigpt: error: Invalid value for '--position': "),
        (["nosuch"], "minigpt: error: No such command 'nosuch'; see '"),
    ],
)
def test_a_command_line_mistake_is_one_line_and_exit_2(minigpt_process, args, expected):
    result = minigpt_process(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(expected)
    assert "Traceback" not in result.stderr


def test_no_arguments_shows_the_help_and_succeeds(minigpt_process):
    result = minigpt_process()
    assert result.returncode == 0
    for command in ("train", "sample", "trace"):
        assert command in result.stdout


def test_version_is_answered_with_the_package_s_own_version(minigpt_process):
    from importlib.metadata import version

    import minigpt

    result = minigpt_process("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"minigpt {minigpt.__version__}\n"
    assert version("minigpt") == minigpt.__version__  # pyproject reads its version from the package


def test_the_torch_the_package_asks_for_starts_at_the_release_ci_tests():
    """pyproject's floor is the torch `.ci/run` installs, so the promise is what is tested; the
    default recipe's torch.optim.Muon (2.9 and newer) is inside it, and nothing above the 2.14.1
    this workplace caps at is ever required."""
    import re
    import tomllib

    import torch

    root = Path(__file__).resolve().parents[1]
    requirement = next(
        d
        for d in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
        if d.startswith("torch")
    )
    floor, cap = re.fullmatch(r"torch>=([\d.]+),<=([\d.]+)", requirement).groups()
    installed_by_ci = re.search(r"pip install -q torch==([\d.]+)", (root / ".ci" / "run").read_text())[1]
    assert installed_by_ci.startswith(floor) and floor.count(".") == 1
    assert tuple(map(int, cap.split("."))) <= (2, 14, 1)
    assert hasattr(torch.optim, "Muon")
    assert f"torch from {floor} to {cap}" in (root / "README.md").read_text()
