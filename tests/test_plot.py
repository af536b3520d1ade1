"""`minigpt plot` and `minigpt trace --png`: figures with the expected panels, valid PNG files, a
text plot without a file, each block's gradient norm (a panel per run, a table in text; older runs
without them plot as before), and one-line refusals (no metrics, no matplotlib)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import need, train_tiny_run

from minigpt.inspection.plot import attention_figure, curves_figure
from minigpt.runs.metrics import read_metrics


@pytest.fixture(autouse=True, scope="module")
def plot_extra():
    """matplotlib (the plot extra, in the test extra), imported when the first test here runs."""
    need("matplotlib")


PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    a = train_tiny_run(tmp_path_factory.mktemp("a"), "--set", "train.eval_interval=5")
    b = train_tiny_run(
        tmp_path_factory.mktemp("b"), "--set", "train.eval_interval=5", "--set", 'model.norm_position="post"'
    )
    return a, b


def test_curves_overlay_every_run_in_three_panels(runs, cli, tmp_path):
    a, b = runs
    figure = curves_figure({"pre": read_metrics(a), "post": read_metrics(b)})
    assert len(figure.axes) == 3 + 2  # and a gradient panel per run
    for ax in figure.axes[:3]:
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pre", "post"]
        assert len(ax.get_lines()) == 2
    evals = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert list(figure.axes[2].get_lines()[0].get_ydata()) == [r["val_bpb"] for r in evals]
    out = tmp_path / "curves.png"
    result = cli("plot", a, b, "-o", out, "--x", "time")
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG)


def test_without_a_file_the_curves_are_drawn_in_text(runs, cli):
    a, b = runs
    result = cli("plot", a, b)
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n\n")[0].splitlines()  # the curve; each run's gradient table below
    assert lines[0].startswith("validation bits/byte against step")
    assert any("*" in line for line in lines[1:-2]) and any("o" in line.split("|", 1)[-1] for line in lines[1:-2])
    assert lines[-2].strip().startswith("* ") and lines[-1].strip().startswith("o ")


def test_each_runs_block_gradient_norms_are_a_log_scale_panel_and_a_text_table(runs, cli, tmp_path):
    a, _ = runs
    deep = train_tiny_run(tmp_path, "--set", "model.n_layer=3", "--steps", "12")
    data = {"deep": read_metrics(deep), "one": read_metrics(a)}
    figure = curves_figure(data)
    panels = figure.axes[3:]
    assert [ax.get_title() for ax in panels] == [
        "deep: gradient norm of each block",
        "one: gradient norm of each block",
    ]
    assert all(ax.get_yscale() == "log" for ax in panels)
    logged = data["deep"]["train"]
    assert [r["step"] for r in logged] == [5, 10, 12]
    lines = panels[0].get_lines()
    assert [line.get_label() for line in lines] == ["block 0", "block 1", "block 2"]
    for block, line in enumerate(lines):
        assert list(line.get_xdata()) == [5, 10, 12]
        assert list(line.get_ydata()) == [r["block_grad_norms"][block] for r in logged]

    text = cli("plot", deep).stdout.splitlines()
    start = text.index(f"gradient norm of each block (L2 over its parameters' gradients), {deep}:")
    assert text[start + 1].split() == ["step", "5", "step", "10", "step", "12"]
    for block in range(3):
        cells = text[start + 2 + block].split()
        assert cells[:2] == ["block", str(block)]
        assert [float(c) for c in cells[2:]] == [pytest.approx(r["block_grad_norms"][block], rel=1e-3) for r in logged]
    ratios = text[start + 5].split()
    assert ratios[:3] == ["0", "/", "2"]
    expected = [r["block_grad_norms"][0] / r["block_grad_norms"][2] for r in logged]
    assert [float(c) for c in ratios[3:]] == [pytest.approx(v, rel=1e-3) for v in expected]


def test_a_run_logged_before_the_gradient_norms_plots_as_before(runs, cli, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    records = [json.loads(line) for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        record.pop("block_grad_norms", None)
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figure = curves_figure({"old": read_metrics(old)})
    assert len(figure.axes) == 3
    result = cli("plot", old)
    assert result.exit_code == 0 and "gradient norm" not in result.stdout
    assert result.stdout.splitlines()[0].startswith("validation bits/byte against step")
    out = tmp_path / "old.png"
    assert cli("plot", old, "-o", out).exit_code == 0 and out.read_bytes().startswith(PNG)


def test_trace_png_draws_every_head_of_every_block(runs, cli, tmp_path):
    a, _ = runs
    out = tmp_path / "attention.png"
    result = cli("trace", "--run", a, "-p", "ROMEO:", "--png", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG)
    from minigpt.config import load_config
    from minigpt.inspection.trace import trace_position
    from minigpt.inspection.trace_input import tokens_to_trace
    from minigpt.runs.reading import load_model

    model, tokenizer = load_model(load_config(a / "config.toml"), a)
    trace = trace_position(model, tokenizer, tokens_to_trace(tokenizer, "ROMEO:", None))
    figure = attention_figure(trace)
    assert len(figure.axes) == model.cfg.n_layer * model.cfg.n_head
    image = figure.axes[0].get_images()[0].get_array()
    assert image.mask[0, 1] and not image.mask[1, 0]  # a query never sees later keys: blank above the diagonal


def test_a_folder_without_metrics_and_a_bad_axis_are_refused(cli, tmp_path, runs):
    result = cli("plot", tmp_path)
    assert result.exit_code == 2 and f"{tmp_path} has no metrics.jsonl" in result.stderr
    result = cli("plot", runs[0], "--x", "epoch")
    assert result.exit_code == 2 and "--x 'epoch' is not one of: step, time" in result.stderr


def test_without_matplotlib_the_command_says_what_to_install(runs, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = cli("plot", runs[0], "-o", tmp_path / "x.png")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert 'pip install -e ".[plot]"' in result.stderr
    assert not (tmp_path / "x.png").exists()
