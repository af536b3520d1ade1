"""The checks between config keys are one table (minigpt/config/cross_checks.py, issue 45): every row
is met by a config that breaks it and by no earlier row, and a sweep refuses the cell that breaks a
row with the row's own message, said of the cell, before anything is written."""

from __future__ import annotations

import pytest

import minigpt
from minigpt.api.sweep_grid import Cells
from minigpt.config import CONFIG_CHECKS, MODEL_CHECKS, ConfigError, load_config
from minigpt.errors import MinigptError

# One case per row, in the table's order: the `set` a base config is given (valid on its own), and
# one grid key with a value that keeps it valid and one that breaks the row.
CASES = [
    # [model]
    ([], "model.n_embd", 128, 130),
    ([], "model.rope_scaling", "", "linear:2"),
    ([], "model.n_kv_head", 0, 3),
    (['model.positions="rope"'], "model.head_width", 0, 3),
    ([], "model.rope_fraction", 1.0, 0.5),
    (['model.positions="rope"'], "model.rope_fraction", 1.0, 0.09375),  # 3 of a head's 32 coordinates
    (['model.positions="sinusoidal"', "model.n_head=1"], "model.n_embd", 128, 129),
    (['model.positions="t5"'], "model.t5_max_distance", 128, 16),
    (["model.n_kv_head=2"], "model.exercise", "none", "attention"),
    (["model.bias=false", "model.qkv_bias=true"], "model.exercise", "none", "attention"),
    (['model.positions="rope"'], "model.exercise", "none", "attention"),
    (['model.norm_position="post"'], "model.residual", True, "attention"),
    ([], "model.attention_residual_blocks", 0, 2),
    (['model.residual="attention"'], "model.attention_residual_blocks", 0, 3),
    (['model.norm_position="post"'], "model.norm", "layernorm", "none"),
    # [train] and [tokenizer]
    (['tokenizer.kind="bpe"'], "train.task", "none", "reverse"),
    (['train.data="story.txt"'], "train.task", "none", "reverse"),
    ([], "train.task_lengths", "", "3-1"),
    (["train.task_length=3"], "train.task_lengths", "", "1-8"),
    (["train.threads=2"], "train.adaptive_threads", False, True),
    (['train.lora_targets="qkv,foo"'], "train.lora_rank", 0, 4),
    ([], "train.lora_rank", 0, 4),
    (['train.init_from="runs/base"', 'train.optimizer="muon"'], "train.lora_rank", 0, 4),
    ([], "tokenizer.vocab_size", 1024, 100),
    ([], "train.min_lr", 0.0001, 1.0),
    ([], "train.task_start", "", "S"),
]
ROWS = [*MODEL_CHECKS, *CONFIG_CHECKS]


def toml(value) -> str:
    return {True: "true", False: "false"}.get(value, f'"{value}"') if isinstance(value, (bool, str)) else repr(value)


def load_refusal(sets: list[str], key: str, value) -> ConfigError:
    with pytest.raises(ConfigError) as refused:
        load_config(None, [*sets, f"{key}={toml(value)}"])
    return refused.value


def test_the_table_has_one_case_per_row():
    assert len(CASES) == len(ROWS) == 26


@pytest.mark.parametrize(("row", "case"), list(zip(ROWS, CASES)), ids=[case[1] for case in CASES])
def test_each_row_refuses_the_config_that_breaks_it_and_no_earlier_row_does(row, case):
    sets, key, good, bad = case
    load_config(None, [*sets, f"{key}={toml(good)}"])  # the same config, with the row kept, loads
    refusal = load_refusal(sets, key, bad)
    assert refusal.template == "{where}: " + row.template
    assert set(refusal.values) == {"where", *row.values}
    source = f"{load_config(None).source} with overrides {' '.join([*sets, f'{key}={toml(bad)}'])}"
    assert refusal.values["where"] == source


def test_a_refusal_reads_as_the_row_says_with_its_values_filled():
    refusal = load_refusal([], "model.n_embd", 130)
    assert refusal.for_command_line.endswith(
        ": [model] n_embd = 130 is not divisible by n_head = 4; choose n_embd a multiple of n_head (e.g. 128)"
    )
    refusal = load_refusal([], "train.lora_rank", 4)
    assert refusal.for_command_line.endswith(
        ": [train] lora_rank = 4 adapts a trained model, and init_from names none: there is nothing to adapt; "
        "give --init-from RUN (a trained or imported run), or set lora_rank = 0"
    )
    assert str(refusal).endswith("give init_from RUN (a trained or imported run), or set lora_rank = 0")


@pytest.mark.parametrize("case", CASES, ids=[case[1] for case in CASES])
def test_a_sweep_refuses_the_cell_that_breaks_a_row_as_load_config_does_naming_the_cell(case, tmp_path):
    sets, key, good, bad = case
    expected = load_refusal(sets, key, bad)

    def never(*_):
        raise AssertionError("a cell started training")

    with pytest.raises(MinigptError) as refused:
        minigpt.sweep({key: [good, bad]}, tmp_path / "sweep", set=sets, steps=1, progress=False, on_cell=never)
    assert refused.value.template == expected.template
    assert {k: v for k, v in refused.value.values.items() if k != "where"} == {
        k: v for k, v in expected.values.items() if k != "where"
    }
    cell = Cells({key: [good, bad]})[1].name  # the bad value's cell, named as the sweep names it
    assert refused.value.for_command_line.startswith(f"--grid cell {cell}: ")
    assert not (tmp_path / "sweep").exists()
