"""What `minigpt eval` says of the context each token was scored with is what its windows gave it (a
text shorter than the context fits one window: every token is read with all the tokens before it),
and a way of reading past the trained length (`--rope-scaling`, `--extrapolate`), which scoring a
text in windows of the trained length would take and never use, is refused in one line."""

from __future__ import annotations

import pytest
from conftest import refused, train_tiny_run

from minigpt.inspection.scoring import windows

CONTEXT = 8  # conftest's tiny config


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("rope"), "--steps", "5", "--set", 'model.positions="rope"')


def least_left_context(n_tokens: int, context: int) -> int:
    """The fewest tokens any target after the first window is predicted from, one target at a time."""
    return min(
        target - start
        for start, first, end in windows(n_tokens, context)[1:]
        for target in range(first, end)  # predicted at position target - 1 - start, reading target - start tokens
    )


@pytest.mark.parametrize("characters", [2, 5, CONTEXT + 1])
def test_a_text_that_fits_one_window_is_said_to_give_every_token_all_before_it(cli, rope_run, tmp_path, characters):
    text = tmp_path / "short.txt"
    text.write_text("ROMEO: what light"[:characters], encoding="utf-8")
    result = cli("eval", "--run", rope_run, "--data", text)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"{text}: {characters - 1} tokens scored ({characters} bytes), each with every token before it as "
        f"context: the text fits one window of {CONTEXT} tokens"
    )
    assert "left context after the first window" not in result.stdout


@pytest.mark.parametrize("characters, least", [(CONTEXT + 2, CONTEXT), (11, 7), (500, 5)])
def test_a_longer_text_is_said_to_give_the_least_left_context_its_windows_gave(
    cli, rope_run, tmp_path, characters, least
):
    assert least_left_context(characters, CONTEXT) == least  # the windows as they fall on this many tokens
    text = tmp_path / "long.txt"
    text.write_text((rope_run.parent / "tiny.txt").read_text(encoding="utf-8")[:characters], encoding="utf-8")
    result = cli("eval", "--run", rope_run, "--data", text)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"{text}: {characters - 1:,} tokens scored ({characters:,} bytes), each with at least {least} tokens of "
        "left context after the first window"
    )


@pytest.mark.parametrize(
    "flags, given", [(["--rope-scaling", "linear:2"], "--rope-scaling linear:2"), (["--extrapolate"], "--extrapolate")]
)
def test_reading_past_the_trained_length_without_by_position_is_refused(cli, rope_run, tmp_path, flags, given):
    text = tmp_path / "text.txt"
    text.write_text((rope_run.parent / "tiny.txt").read_text(encoding="utf-8")[:200], encoding="utf-8")
    for extra in ([], ["--json"], ["--per-token", tmp_path / "tokens.jsonl"]):
        line = refused(cli, "eval", "--run", rope_run, "--data", text, *flags, *extra)
        assert line == (
            f"minigpt: error: {given} reads a model past the length it was trained at, and eval scores a text in "
            f"windows of that length ({CONTEXT} tokens), never past it; leave it out, or give it with --by-position "
            f"--length N to see the loss at positions past {CONTEXT}"
        )
    assert list(tmp_path.iterdir()) == [text]  # no --per-token file
    result = cli("eval", "--run", rope_run, "--data", text, *flags, "--by-position", "--length", 2 * CONTEXT)
    assert result.exit_code == 0, result.output  # where it reads past the trained length, it is taken
