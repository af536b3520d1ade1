"""`minigpt sweep`'s grid (issue 44): each grid value is checked on its own, each cell's whole config
(base + that cell's values + --set) as train checks it, so a grid is refused only for a cell that
cannot run, named by its values; a value with commas (a rope scaling rule with settings) is written
in double quotes or as a TOML array; a grid above 1,000 cells is said with its count before anything
runs, and its cells are made as they are reached, never listed."""

from __future__ import annotations

import itertools
import time
import tomllib
from pathlib import Path

import pytest
from conftest import refused

import minigpt
from minigpt.api.sweep_grid import Cells

QUICK = ("--steps", "2", "--quiet")


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize(
    ("grid", "cell", "model"),
    [
        (
            ["model.residual=attention", "model.attention_residual_blocks=2"],
            "residual=attention,attention_residual_blocks=2",
            {"residual": "attention", "attention_residual_blocks": 2},
        ),
        (["model.n_embd=30", "model.n_head=3"], "n_embd=30,n_head=3", {"n_embd": 30, "n_head": 3}),
        (["model.n_head=4", "model.n_kv_head=4"], "n_head=4,n_kv_head=4", {"n_head": 4, "n_kv_head": 4}),
    ],
    ids=["attention-residual-blocks", "heads-of-width-10", "kv-heads"],
)
def test_values_that_the_base_config_alone_would_refuse_make_a_cell_that_runs(
    cli, tiny_config, tmp_path, grid, cell, model
):
    out = tmp_path / "sweep"
    result = cli("sweep", "-c", tiny_config, *[w for g in grid for w in ("--grid", g)], *QUICK, "--out", out)
    assert result.exit_code == 0, result.output
    trained = tomllib.loads((out / cell / "config.toml").read_text())["model"]
    assert {key: trained[key] for key in model} == model
    assert minigpt.load(out / cell).model.cfg.n_head == trained["n_head"]


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (
            ["model.n_embd=30,32", "model.n_head=3"],
            "minigpt: error: --grid cell n_embd=32,n_head=3: [model] n_embd = 32 is not divisible by n_head = 3",
        ),
        (
            ["model.n_head=2,4", "model.n_kv_head=4"],
            "minigpt: error: --grid cell n_head=2,n_kv_head=4: [model] n_kv_head = 4 does not divide n_head = 2",
        ),
        (
            ["model.attention_residual_blocks=2", "model.residual=attention,true"],
            "minigpt: error: --grid cell attention_residual_blocks=2,residual=true: [model] "
            "attention_residual_blocks = 2 is given with residual = true",
        ),
    ],
    ids=["heads", "kv-heads", "residual"],
)
def test_a_grid_is_refused_only_for_the_cell_that_cannot_run_named_by_its_values(
    cli, tiny_config, tmp_path, grid, expected
):
    out = tmp_path / "never"
    before = files(tmp_path)
    line = refused(cli, "sweep", "-c", tiny_config, *[w for g in grid for w in ("--grid", g)], *QUICK, "--out", out)
    assert line.startswith(expected)
    assert files(tmp_path) == before  # nothing written, the --out folder not even made


@pytest.mark.parametrize(
    "grid",
    ['model.rope_scaling="yarn:4,beta_fast=16",linear:2', 'model.rope_scaling=["yarn:4,beta_fast=16", "linear:2"]'],
    ids=["double-quotes", "toml-array"],
)
def test_a_rope_scaling_rule_with_settings_is_a_grid_value_in_double_quotes_or_a_toml_array(
    cli, tiny_config, tmp_path, grid
):
    out = tmp_path / "scaled"
    result = cli("sweep", "-c", tiny_config, "--set", 'model.positions="rope"', "--grid", grid, *QUICK, "--out", out)
    assert result.exit_code == 0, result.output
    assert tomllib.loads((out / "sweep.toml").read_text())["grid"] == {
        "model.rope_scaling": ["yarn:4,beta_fast=16", "linear:2"]
    }
    yarn = minigpt.load(out / "rope_scaling=yarn_4_beta_fast_16").model
    assert (yarn.own_scaling.kind, yarn.own_scaling.factor, yarn.own_scaling.beta_fast) == ("yarn", 4.0, 16.0)
    assert minigpt.load(out / "rope_scaling=linear_2").model.own_scaling.kind == "linear"
    assert [row.split()[0] for row in result.stdout.splitlines()[1:]] == ["yarn:4,beta_fast=16", "linear:2"]


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (
            'model.rope_scaling="yarn:4,beta_fast=nan",linear:2',
            'minigpt: error: --grid model.rope_scaling="yarn:4,beta_fast=nan": [model] rope_scaling = '
            '"yarn:4,beta_fast=nan": beta_fast = nan is out of range: yarn\'s beta_fast is a finite number above '
            "beta_slow (1 here)",
        ),
        (
            'model.rope_scaling="llama3:4,low_freq_factor=0,high_freq_factor=0"',
            'minigpt: error: --grid model.rope_scaling="llama3:4,low_freq_factor=0,high_freq_factor=0": [model] '
            'rope_scaling = "llama3:4,low_freq_factor=0,high_freq_factor=0": low_freq_factor = 0 is out of range',
        ),
        (
            'model.rope_scaling="linear:2,beta_fast=16"',
            'minigpt: error: --grid model.rope_scaling="linear:2,beta_fast=16": [model] rope_scaling = '
            '"linear:2,beta_fast=16": beta_fast is a setting of yarn; linear takes original_context: drop beta_fast',
        ),
        (
            'model.rope_scaling="yarn:4,beta_fast=16,linear:2',
            'minigpt: error: --grid model.rope_scaling="yarn:4,beta_fast=16,linear:2 has a double quote that is '
            "never closed",
        ),
    ],
    ids=["nan", "llama3-zeros", "unread-setting", "unclosed-quote"],
)
def test_a_rope_scaling_grid_value_is_checked_as_the_flag_checks_it_naming_the_value(
    cli, tiny_config, tmp_path, grid, expected
):
    out = tmp_path / "never"
    line = refused(
        cli, "sweep", "-c", tiny_config, "--set", 'model.positions="rope"', "--grid", grid, *QUICK, "--out", out
    )
    assert line.startswith(expected)
    assert "--rope-scaling" not in line and not out.exists()


@pytest.mark.parametrize(("seeds", "noted"), [(500, False), (600, True)])
def test_a_grid_of_more_than_1000_cells_is_said_with_its_count_before_it_runs(cli, tiny_config, tmp_path, seeds, noted):
    # n_head = 3 does not divide n_embd = 16: the grid stops at its first cell with it, after 2 x seeds cells
    out = tmp_path / "never"
    grid = ("--grid", "model.n_head=2,3", "--seeds", seeds)
    result = cli("sweep", "-c", tiny_config, *grid, *QUICK, "--out", out)
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    note = (
        f"minigpt: note: the grid has {2 * seeds:,} cells (more than 1,000), trained one after another; each "
        "cell's config is checked before any runs"
    )
    assert lines == ([note] if noted else []) + [lines[-1]]
    assert lines[-1].startswith("minigpt: error: --grid cell n_head=3,seed=1337: [model] n_embd = 16 is not divisible")
    assert not out.exists()


def test_a_grid_of_200_million_cells_is_never_listed(cli, tiny_config, tmp_path):
    """Its first cell cannot run: the refusal comes at once, as it would for a grid of two cells."""
    hundred = ",".join(str(k) for k in range(1, 101))
    grid = ["model.n_head=3,2", f"train.eval_batches={hundred}", f"train.log_interval={hundred}"]
    grid += [f"train.seed={hundred}", f"train.batch_size={hundred}"]
    began = time.perf_counter()
    result = cli("sweep", "-c", tiny_config, *[w for g in grid for w in ("--grid", g)], *QUICK, "--out", tmp_path / "x")
    assert time.perf_counter() - began < 30
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith("minigpt: note: the grid has 200,000,000 cells")
    assert result.stderr.splitlines()[1].startswith(
        "minigpt: error: --grid cell n_head=3,eval_batches=1,log_interval=1,seed=1,batch_size=1: "
    )


def test_cells_are_made_when_read_in_grid_order_the_first_key_outermost():
    grid = {"model.n_layer": [1, 2, 3], "model.norm_position": ["pre", "post"], "train.seed": [7, 8]}
    cells = Cells(grid)
    listed = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    assert len(cells) == 12 and [cell.values for cell in cells] == listed
    assert [cells[k].values for k in range(-12, 12)] == listed + listed
    assert [cells.index(cell) for cell in cells] == list(range(12))
    assert cells[7].name == "n_layer=2,norm_position=post,seed=8"
    with pytest.raises(IndexError):
        cells[12]
    huge = Cells({f"train.k{i}": list(range(100)) for i in range(10)})  # 10^20 cells: past what len() can say
    assert huge.count == 10**20 and huge.index(huge[-1]) == 10**20 - 1
    assert huge.index(huge[123456789]) == 123456789
    assert huge[-1].values == {f"train.k{i}": 99 for i in range(10)}


def test_a_sweep_inside_what_its_cells_read_is_refused_before_its_folder_is_written(cli, tiny_config, tmp_path):
    data = tmp_path / "texts"
    data.mkdir()
    (data / "a.txt").write_text((tmp_path / "tiny.txt").read_text())
    line = refused(cli, "sweep", "-c", tiny_config, "--data", data, "--grid", "model.n_head=1,2", "--out", data / "s")
    assert f"the sweep's folder {data / 's'} lies inside the training data {data}, which its cells read" in line
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]


def test_a_cell_that_can_be_read_but_not_trained_is_refused_by_name_before_any_runs(cli, tiny_config, tmp_path):
    """A sliding window shorter than the context is a model one can read (an imported Mistral's), not
    one a run trains: every window it trains on is `context` tokens long."""
    line = refused(cli, "sweep", "-c", tiny_config, "--grid", "model.sliding_window=8,4", "--out", tmp_path / "s")
    assert line == (
        "minigpt: error: --grid cell sliding_window=4: [model] sliding_window = 4 is shorter than [model] context = "
        "8, and a run trains on windows of context tokens, which the model does not read past its sliding window; "
        "set context to at most 4, or sliding_window to 8 or more (0: none)"
    )
    assert not (tmp_path / "s").exists()


def test_a_refusal_only_training_finds_names_the_cell_it_came_from(cli, tiny_config, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 200)
    grid = f'train.data="{tmp_path / "tiny.txt"}","{tmp_path / "latin1.txt"}"'
    result = cli("sweep", "-c", tiny_config, "--grid", grid, "--steps", "2", "--out", tmp_path / "s", "--quiet")
    assert result.exit_code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("minigpt: error: --grid cell data=") and "latin1.txt" in line.split(": ")[2], line
