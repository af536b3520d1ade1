"""`minigpt sweep`: a 2x2 grid from the command line trains one ordinary run folder per cell and prints
a table with a diverged column; rerunning skips finished cells, an interrupted cell resumes bitwise;
a bad grid is refused in one line before anything runs; a loss that explodes (or turns NaN) stops
its cell and is recorded; `minigpt plot DIR` draws a sweep in text and as a PNG."""

from __future__ import annotations

import json
import math
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import SHAKESPEARE, TINY_CONFIG, interrupt_once_training, minigpt_command, need, with_failpoints
from typer.testing import CliRunner

import minigpt
from minigpt.api.sweep import exploded, explosion_threshold
from minigpt.inspection.sweep_plot import sweep_lines

CELLS = ["n_layer=1,norm_position=pre", "n_layer=1,norm_position=post", "n_layer=2,norm_position=pre"]
CELLS += ["n_layer=2,norm_position=post"]
GRID = ["--grid", "model.n_layer=1,2", "--grid", "model.norm_position=pre,post"]
SHORT = ["--steps", "6", "--set", "train.eval_interval=3", "--set", "train.checkpoint_interval=2"]


def write_tiny(folder: Path) -> Path:
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    return folder / "tiny.toml"


def records(folder: Path) -> dict[str, dict]:
    lines = (folder / "sweep.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["cell"]: r for r in map(json.loads, lines)}


def evals(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r["val_loss"] for r in map(json.loads, lines) if r.get("eval")]


def step_of(run: Path) -> int:
    return torch.load(run / "checkpoint.pt", weights_only=True)["step"]


def one_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == "" and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The 2x2 grid trained once from the command line: (its folder, the command's arguments, the result)."""
    folder = tmp_path_factory.mktemp("sweep")
    with pytest.MonkeyPatch.context() as patch:  # a token cache of its own, as every test has
        patch.setenv("MINIGPT_CACHE", str(tmp_path_factory.mktemp("cache")))
        from minigpt.cli import app

        args = ["sweep", "-c", str(write_tiny(folder)), *GRID, *SHORT, "--out", str(folder / "depth")]
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)
    return folder / "depth", args, result


def test_a_2x2_grid_trains_a_run_folder_per_cell_and_prints_a_table_with_a_diverged_column(swept, cli):
    out, _, result = swept
    assert sorted(p.name for p in out.iterdir()) == sorted([*CELLS, "base.toml", "sweep.jsonl", "sweep.toml"])
    found = records(out)
    assert list(found) == CELLS  # trained in grid order, the first key outermost
    for name in CELLS:
        run = out / name
        layers, position = re.fullmatch(r"n_layer=(\d),norm_position=(\w+)", name).groups()
        config = (run / "config.toml").read_text(encoding="utf-8")
        assert f"n_layer = {layers}\n" in config and f'norm_position = "{position}"\n' in config
        assert step_of(run) == 6
        record = found[name]
        assert record["values"] == {"model.n_layer": int(layers), "model.norm_position": position}
        assert record["final_val_loss"] == evals(run)[-1] and record["best_val_loss"] == min(evals(run))
        assert len(evals(run)) == 2  # steps 3 and 6
        assert record["diverged_at"] is None and record["diverged_by"] is None
        assert record["chosen"] == {"optimizer": "adamw", "precision": "float32", "threads": 1, "device": "cpu"}
        assert record["wall_s"] > 0 and record["checkpoint_step"] == 6

    table = result.stdout.splitlines()
    assert table[0].split() == ["n_layer", "norm_position", "final", "val", "best", "val", "diverged", "wall"] + [
        "optimizer"
    ]
    assert len(table) == 5
    for line, name in zip(table[1:], CELLS):
        record = found[name]
        cells = line.split()
        assert cells[:2] == [str(v) for v in record["values"].values()]
        assert cells[2:5] == [f"{record['final_val_loss']:.4f}", f"{record['best_val_loss']:.4f}", "-"]
        assert cells[5] == f"{record['wall_s']:.1f}s" and cells[6] == "adamw"
    assert result.stderr.count(": training\n") == 4

    # every cell is an ordinary run folder: the commands that read a run read it
    traced = cli("trace", "--run", out / CELLS[3], "-p", "ROMEO")
    assert traced.exit_code == 0, traced.output
    assert "model: 2 block(s)" in traced.stdout and "post-norm block" in traced.stdout


def test_rerunning_the_same_command_skips_every_finished_cell(swept, cli):
    out, args, first = swept
    before = {name: (out / name / "checkpoint.pt").stat().st_mtime_ns for name in CELLS}
    kept = (out / "sweep.jsonl").read_bytes()
    again = cli(*args)
    assert again.exit_code == 0, again.output
    assert again.stderr.count("finished, skipped") == 4 and ": training" not in again.stderr
    assert again.stdout == first.stdout  # the same table, from the records
    assert {name: (out / name / "checkpoint.pt").stat().st_mtime_ns for name in CELLS} == before
    assert (out / "sweep.jsonl").read_bytes() == kept


def test_another_grid_or_base_into_the_same_folder_is_refused_naming_the_difference(swept, cli):
    out, args, _ = swept
    kept = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    grid = [a.replace("model.n_layer=1,2", "model.n_layer=1,3") for a in args]
    line = one_line(cli(*grid))
    assert "grid model.n_layer = [1, 2] there, [1, 3] here" in line
    assert f"--out {out} holds a sweep of another definition" in line
    line = one_line(cli(*[a if a != "6" else "8" for a in args]))
    assert "[train] steps: 6 there, 8 here" in line
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == kept


@pytest.mark.slow
def test_an_interrupted_cell_resumes_when_the_command_is_run_again_and_ends_bitwise_as_if_never_stopped(
    cli, tiny_config, tmp_path
):
    args = ["-c", tiny_config, "--grid", "model.n_layer=1,2", *SHORT]
    straight = tmp_path / "straight"
    assert cli("sweep", *args, "--out", straight, "--quiet").exit_code == 0

    out = tmp_path / "stopped"
    # The real command in a real process, paused in the 9th step of the process (the second cell's
    # third) until the test's SIGINT: that step ends, a checkpoint is written, and the sweep stops.
    process = subprocess.Popen(
        minigpt_command("sweep", *args, "--out", out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=with_failpoints("batch@9=announce+pause:60", tmp_path / "reached"),
    )
    stderr = interrupt_once_training(process, tmp_path / "reached", signal.SIGINT)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr
    found = re.search(r"interrupted in cell n_layer=2 at step 3/6; its checkpoint is saved\. Rerun the same command to "
                      r"continue: (.+)$", stderr, re.M)  # fmt: skip
    assert found, stderr
    assert list(records(out)) == ["n_layer=1"] and step_of(out / "n_layer=2") == 3

    again = shlex.split(found[1])
    assert again[:2] == ["minigpt", "sweep"]
    result = cli(*again[1:])  # exactly the command the user is told to run
    assert result.exit_code == 0, result.output
    assert "cell 1/2 n_layer=1: finished, skipped" in result.stderr
    assert "cell 2/2 n_layer=2: resuming from its checkpoint" in result.stderr
    assert list(records(out)) == ["n_layer=1", "n_layer=2"]
    for name in ("n_layer=1", "n_layer=2"):
        a = torch.load(straight / name / "checkpoint.pt", weights_only=True)["model"]
        b = torch.load(out / name / "checkpoint.pt", weights_only=True)["model"]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        assert records(out)[name]["final_val_loss"] == records(straight)[name]["final_val_loss"]


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (["--grid", "model.n_layr=1,2"], "--grid model.n_layr=1: unknown key in [model]: 'n_layr'; did you mean"),
        (["--grid", "model.n_layer=1,x"], '--grid model.n_layer=x: [model] n_layer = "x" is not an integer'),
        (["--grid", "model.n_layer=1,0"], "--grid model.n_layer=0: [model] n_layer = 0 must be at least 1"),
        (["--grid", "model.norm_position=pre,pst"], "is not allowed; choose one of: pre, post; did you mean 'post'?"),
        (["--grid", "model.n_layer="], "--grid model.n_layer= lists no values"),
        (["--grid", "model.n_layer=1,,2"], "--grid model.n_layer=1,,2 has an empty value"),
        (["--grid", "n_layer=1,2"], "--grid n_layer=1,2 is not a grid key and its values"),
        (["--grid", "model.n_layer=1", "--grid", "model.n_layer=2"], "--grid model.n_layer is given twice"),
        (["--grid", "model.n_layer=1,1"], "--grid model.n_layer gives the value 1 twice"),
        (["--grid", "model.n_layer=1,2", "--set", "model.n_layer=3"], "--set model.n_layer=3 sets a grid key"),
        (["--grid", "train.steps=2,4"], "--steps and --grid train.steps both set [train] steps"),
        (["--grid", "train.seed=1,2", "--seeds", "2"], "--seeds and --grid train.seed both give the seeds"),
        (["--grid", "train.out=a,b"], "--grid train.out is refused"),
        (["--grid", "model.n_head=2,4", "--grid", "model.n_embd=16,6"], "--grid cell n_head=4,n_embd=6: [model] "),
        (["--seeds", "0"], "--seeds 0 is not a number of seeds"),
        ([], "nothing to sweep: give --grid KEY=V1,V2,... (repeatable), or --seeds K"),
    ],
)
def test_a_grid_that_cannot_run_is_refused_in_one_line_before_anything_runs(cli, tiny_config, tmp_path, grid, expected):
    out = tmp_path / "never"
    line = one_line(cli("sweep", "-c", tiny_config, "--steps", "6", *grid, "--out", out))
    assert expected in line
    assert not out.exists()


def test_the_exploded_rule_is_a_loss_above_twice_the_loss_of_a_uniform_guess():
    assert explosion_threshold(58) == 2 * math.log(58)
    assert exploded(2 * math.log(58) + 1e-9, 58) and not exploded(2 * math.log(58), 58)
    assert not exploded(math.log(58), 58)  # where training starts
    assert not exploded(math.nan, 58) and not exploded(math.inf, 58)  # non-finite: the trainer's own guard
    assert explosion_threshold(50257) == pytest.approx(21.65, abs=0.01)


def test_a_loss_that_explodes_or_turns_nan_stops_its_cell_there_and_is_recorded(cli, tiny_config, tmp_path):
    out = tmp_path / "rates"
    result = cli(
        "sweep",
        *("-c", tiny_config, "--grid", "train.learning_rate=0.003,1.0,1e9", "--set", 'model.norm="none"'),
        *("--set", "train.grad_clip=0", "--set", "train.warmup_steps=0", "--set", "train.min_lr=0"),
        *("--set", "train.log_interval=1", "--steps", "6", "--out", out, "--quiet"),
    )
    assert result.exit_code == 0, result.output
    found = records(out)
    assert [(r["diverged_at"], r["diverged_by"]) for r in found.values()] == [
        (None, None),
        (2, "exploded"),
        (2, "non-finite"),
    ]
    assert list(found) == ["learning_rate=0.003", "learning_rate=1", "learning_rate=1e+09"]
    # exploded: step 2's loss is finite and above 2 ln V; the cell stopped after it with a checkpoint
    run = out / "learning_rate=1"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vocab = minigpt.load(run).tokenizer.vocab_size
    assert [r["step"] for r in logged] == [1, 2]
    assert logged[0]["loss"] < explosion_threshold(vocab) < logged[1]["loss"] < math.inf
    assert step_of(run) == 2
    # non-finite: step 2 was not applied; the step-0 checkpoint stands
    assert step_of(out / "learning_rate=1e+09") == 0
    assert found["learning_rate=1e+09"]["checkpoint_step"] == 0
    rows = [line.split(None, 1) for line in result.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["0.003", "1", "1e+09"]
    assert "step 2 exploded" in rows[1][1] and "step 2 non-finite" in rows[2][1]
    assert rows[0][1].split()[2] == "-"


def test_plot_draws_a_sweep_as_text_against_a_key_a_line_per_other_key(swept, cli):
    out, _, _ = swept
    found = records(out)
    result = cli("plot", out)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "final validation loss (nats/token) against model.n_layer"
    assert "  * norm_position=pre" in lines and "  o norm_position=post" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["model.n_layer", "1", "2"]
    for row, position in zip(table[1:], ("pre", "post")):
        expected = [f"{found[f'n_layer={n},norm_position={position}']['final_val_loss']:.4f}" for n in (1, 2)]
        assert row.split() == [f"norm_position={position}", *expected]

    walls = cli("plot", out, "--against", "norm_position", "--metric", "wall").stdout.splitlines()
    assert walls[0] == "wall time (seconds) against model.norm_position"
    assert one_line(cli("plot", out, "--against", "n_head")) == (
        f"minigpt: error: --against 'n_head' is not a grid key of {out}; its keys: model.n_layer, model.norm_position"
    )
    assert "--metric 'loss' is not one of: final, best, diverged_at, wall" in one_line(
        cli("plot", out, "--metric", "loss")
    )
    assert "--metric and --against plot a sweep's folder" in one_line(cli("plot", out / CELLS[0], "--metric", "best"))


def test_plot_draws_a_sweep_as_a_png(swept, cli, tmp_path):
    need("matplotlib")
    from minigpt.inspection.sweep_plot import sweep_figure

    out, _, _ = swept
    png = tmp_path / "sweep.png"
    result = cli("plot", out, "-o", png, "--metric", "best")
    assert result.exit_code == 0, result.output
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    sweep = minigpt.api.read_sweep(out)
    figure = sweep_figure(sweep.grid, list(sweep.records.values()), metric="best", against="model.n_layer")
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.get_lines()] == ["norm_position=pre", "norm_position=post"]
    for line, position in zip(ax.get_lines(), ("pre", "post")):
        expected = [records(out)[f"n_layer={n},norm_position={position}"]["best_val_loss"] for n in (1, 2)]
        assert list(line.get_ydata()) == expected


def test_seeds_are_a_last_grid_key_and_the_plot_takes_their_mean(tiny_config, tmp_path):
    out = tmp_path / "seeds"
    said = []
    sweep = minigpt.sweep(
        {"model.n_layer": [1]},
        out,
        seeds=2,
        config=tiny_config,
        steps=4,
        progress=False,
        on_cell=lambda cell, how, s: said.append((cell.name, how, len(s.cells))),
    )
    assert said == [("n_layer=1,seed=1337", "start", 2), ("n_layer=1,seed=1338", "start", 2)]
    assert sweep.grid == {"model.n_layer": [1], "train.seed": [1337, 1338]}
    assert "seed = 1338\n" in (out / "n_layer=1,seed=1338" / "config.toml").read_text()
    finals = [r["final_val_loss"] for r in sweep.records.values()]
    assert finals[0] != finals[1]
    (line,) = sweep_lines(sweep.grid, list(sweep.records.values()), "final", "model.n_layer")
    assert line.label == "all cells" and line.points == [finals] and line.means == [sum(finals) / 2]
    assert sweep.rows()[0] == ["n_layer", "seed", "final val", "best val", "diverged", "wall", "optimizer"]
    # the API says a refusal with its arguments' names
    with pytest.raises(minigpt.MinigptError, match=r"^seeds and grid train.seed both give the seeds"):
        minigpt.sweep(["train.seed=1,2"], tmp_path / "x", seeds=2, config=tiny_config)
