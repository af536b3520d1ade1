"""What a learner reads, said truly (issue 48): a help text rich's markup leaves whole, a figure
refused before anything is printed when matplotlib is missing, `sample --no-slide` on a rope run
saying what the text filled (no table: the trained length), and a SwiGLU trace saying where its
`+ b1` comes from when the config shows `ffn_bias = false`."""

from __future__ import annotations

import sys

import pytest
from conftest import train_tiny_run


def _commands():
    import typer

    from minigpt.cli import app

    def walk(command, path):
        yield " ".join(path), command
        for name, sub in (getattr(command, "commands", None) or {}).items():
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), ["minigpt"]))


def test_no_help_text_loses_words_to_rich_markup():
    """Typer renders help through rich's markup, where `[model]` is a tag and vanishes: the
    --extrapolate help read "trained at ( context)"."""
    from rich.text import Text

    texts = [
        (f"{path} {param.name}", getattr(param, "help", None) or "")
        for path, command in _commands()
        for param in command.params
    ] + [(path, command.help or "") for path, command in _commands()]
    assert len(texts) > 100
    eaten = [(where, text) for where, text in texts if Text.from_markup(text).plain != text.replace("\\[", "[")]
    assert not eaten


def test_a_png_without_matplotlib_is_refused_before_the_run_is_read_or_anything_printed(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after `pip install -e .` alone
    result = cli(
        "eval", "--run", tmp_path / "no-run", "--data", tmp_path / "no.txt", "--by-position", "--json",
        "--png", tmp_path / "loss.png",
    )  # fmt: skip
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        'minigpt: error: plotting needs matplotlib, which is not installed; pip install -e ".[plot]"  (or: pip '
        "install matplotlib)"
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny one-step runs: rope positions, and a SwiGLU FFN (with [model] bias = true, ffn_bias = false)."""
    rope = train_tiny_run(tmp_path_factory.mktemp("rope"), "--steps", "1", "--set", 'model.positions="rope"')
    swiglu = train_tiny_run(tmp_path_factory.mktemp("swiglu"), "--steps", "1", "--set", 'model.activation="swiglu"')
    learned = train_tiny_run(tmp_path_factory.mktemp("learned"), "--steps", "1")
    return {"rope": rope, "swiglu": swiglu, "learned": learned}


def _stopped(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stderr.strip().splitlines()[-1].split("stopped: ")[1]


def test_no_slide_says_what_the_text_filled_a_table_or_the_trained_length(cli, runs):
    args = ("-p", "ROMEO", "-n", "20", "--no-slide", "--greedy")
    assert _stopped(cli("sample", "--run", runs["learned"], *args)) == (
        "context_limit (the text fills the 8-row position table; drop --no-slide to continue with a sliding window)"
    )
    assert _stopped(cli("sample", "--run", runs["rope"], *args)) == (
        "context_limit (the text reaches the 8 tokens the model was trained at ([model] context); drop --no-slide "
        "to continue with a sliding window)"
    )
    assert _stopped(cli("sample", "--run", runs["rope"], *args, "--rope-scaling", "linear:2")) == (
        "context_limit (the text fills the 16 tokens --rope-scaling linear:2 lets the model read; drop --no-slide "
        "to continue with a sliding window)"
    )


def test_a_swiglu_trace_says_its_ffn_biases_come_from_bias_not_ffn_bias(cli, runs):
    config = (runs["swiglu"] / "config.toml").read_text()
    assert "bias = true" in config and "ffn_bias = false" in config
    lines = cli("trace", "--run", runs["swiglu"], "-p", "ROMEO").stdout.splitlines()
    legend = lines[lines.index(next(line for line in lines if line.startswith("pre-norm block:"))) :][:7]
    assert "  hidden = SiLU(gate) * value, [gate | value] = norm2 W1 + b1;" in legend
    assert legend[4:6] == [
        "  (b1, b2: the FFN's biases, there because [model] bias = true gives every",
        "  linear layer one; ffn_bias = false adds none of its own)",
    ]
    relu = cli("trace", "--run", runs["learned"], "-p", "ROMEO").stdout
    assert "+ b1" in relu and "(b1, b2:" not in relu  # a ReLU FFN's biases are the chapter's own


def test_the_bias_note_names_what_gives_the_biases():
    from minigpt.inspection.legend_text import ffn_bias_note

    swiglu = {"activation": "swiglu", "ffn_hidden": 8}
    assert ffn_bias_note({**swiglu, "bias": False, "ffn_bias": False}) is None  # no + b1 shown either
    assert ffn_bias_note({**swiglu, "bias": False, "ffn_bias": True}) == (
        "(b1, b2: the FFN's biases, from [model] ffn_bias = true; the other linear layers have none)"
    )
    assert ffn_bias_note({**swiglu, "bias": True, "ffn_bias": False, "ffn_hidden": 0}) is None  # no FFN
