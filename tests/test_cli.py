"""Command-line mistakes end like every other user error: one line on stderr, exit status 2."""

from __future__ import annotations

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
