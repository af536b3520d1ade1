"""Sampling a model that attends within a sliding window ([model] sliding_window): a text that would
grow past the window is refused before any token is drawn (issue 44), in one line naming the number
of new tokens that fits, never partway through a sample."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import refused, train_tiny_run

import minigpt
from minigpt.model.gpt import ContextTooLongError

WINDOW = 6  # the window, and the trained length: train refuses batches longer than the window


@pytest.fixture(scope="module")
def windowed(tmp_path_factory) -> Path:
    return train_tiny_run(
        tmp_path_factory.mktemp("windowed"),
        *("--steps", "2", "--set", 'model.positions="rope"', "--set", f"model.context={WINDOW}"),
        *("--set", f"model.sliding_window={WINDOW}"),
    )


def test_extrapolated_sampling_past_the_window_is_refused_before_the_first_token(cli, windowed):
    # ROMEO is 5 tokens: 10 new ones read texts of up to 14, past the window of 6
    result = cli("sample", "--run", windowed, "-p", "ROMEO", "-n", "10", "--extrapolate")
    assert result.stdout == ""  # not the prompt, not a token
    assert refused(cli, "sample", "--run", windowed, "-p", "ROMEO", "-n", "10", "--extrapolate") == (
        "minigpt: error: --max-new-tokens 10 after a prompt of 5 tokens reads texts of up to 14 tokens, but this "
        "model attends within a sliding window of 6 ([model] sliding_window = 6): past it each position reads only "
        "the last 6 keys, which minigpt does not compute; so ask for at most 2 new tokens, or shorten the prompt, "
        "or drop --extrapolate"
    )
    assert "--max-new-tokens 3 after a prompt of 5 tokens reads texts of up to 7" in refused(
        cli, "sample", "--run", windowed, "-p", "ROMEO", "-n", "3", "--extrapolate"
    )


@pytest.mark.parametrize(
    "args", [("-n", "2", "--extrapolate"), ("-n", "10"), ("-n", "10", "--no-slide")], ids=["fits", "slides", "stops"]
)
def test_a_sample_that_stays_within_the_window_runs(cli, windowed, args):
    result = cli("sample", "--run", windowed, "-p", "ROMEO", *args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ROMEO") and len(result.stdout.rstrip("\n")) > len("ROMEO")


def test_the_api_refuses_before_it_hands_out_any_text(windowed):
    run = minigpt.load(windowed, extrapolate=True)
    shown: list[str] = []
    with pytest.raises(
        ContextTooLongError, match=r"^max_new_tokens 10 after a prompt of 5 tokens .* drop extrapolate=True$"
    ):
        run.samples("ROMEO", on_text=shown.append, max_new_tokens=10)
    assert shown == []
