"""A rope scaling rule's settings (model/rope_scaling.py), wherever a rule is given: the `--rope-scaling`
flag, the config key `[model] rope_scaling` (a config file, `--set`) and a sweep's grid value
(tests/test_sweep_grid.py). A setting out of its range, one the rule does not read, or one given twice
is refused in one line naming the setting, its value and its range, before anything is read or
written; a rule in range computes what its settings say."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import refused, train_tiny_run

import minigpt
from minigpt.config import ModelConfig
from minigpt.errors import ConfigError, MinigptError
from minigpt.model.gpt import MiniGPT
from minigpt.model.positions import RopeScaling, parse_rope_scaling, spelled

ROPE = ("--set", 'model.positions="rope"', "--steps", "2")


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    """A tiny rope run: context 8, 2 heads of width 8."""
    return train_tiny_run(tmp_path_factory.mktemp("rope"), *ROPE)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time: what a refusal must leave as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


# (rule, what the one line must say after "<where> <rule>: ")
OUT_OF_RANGE = [
    (
        "yarn:4,beta_fast=nan",
        "beta_fast = nan is out of range: yarn's beta_fast is a finite number above beta_slow (1 here)",
    ),
    (
        "llama3:4,low_freq_factor=0,high_freq_factor=0",
        "low_freq_factor = 0 is out of range: llama3's low_freq_factor is a number above 0 and below "
        "high_freq_factor (0 here)",
    ),
    (
        "yarn:4,attention_factor=1e30",
        "attention_factor = 1e30 is out of range: yarn's attention_factor is a number above 0 and at most 10",
    ),
    ("yarn:4,original_context=0", "original_context = 0 is out of range: yarn's original_context is a whole number"),
    ("ntk:2,original_context=-8", "original_context = -8 is out of range: ntk's original_context is a whole number"),
    ("linear:2,original_context=1.5", "original_context = 1.5 is out of range: linear's original_context is a whole"),
    (
        "yarn:4,beta_slow=40",
        "beta_slow = 40 is out of range: yarn's beta_slow is a number above 0 and below beta_fast (32",
    ),
    (
        "llama3:8,high_freq_factor=1",
        "high_freq_factor = 1 is out of range: llama3's high_freq_factor is a finite number",
    ),
    (
        "yarn:4,mscale=1,mscale_all_dim=-7.2",
        "mscale_all_dim = -7.2 is out of range: yarn's mscale_all_dim is a number from 0 to 10",
    ),
    ("yarn:4,truncate=yes", "truncate = yes is out of range: yarn's truncate is true or false"),
    ("ntk:1e30", "the factor 1e30 is out of range: F in ntk:F is a number from 1 to 1,000,000"),
    ("yarn:0.5", "the factor 0.5 is out of range: F in yarn:F is a number from 1 to 1,000,000"),
]
NOT_READ = [
    ("yarn:4,beta_fast=8,beta_fast=16", "beta_fast is given twice; give each setting once"),
    ("linear:2,beta_fast=16", "beta_fast is a setting of yarn; linear takes original_context: drop beta_fast"),
    ("ntk:2,high_freq_factor=8", "high_freq_factor is a setting of llama3; ntk takes original_context: drop"),
    (
        "yarn:4,low_freq_factor=2",
        "low_freq_factor is a setting of llama3; yarn takes original_context, attention_factor",
    ),
    ("yarn:4,beta_fst=16", "beta_fst is not a setting of yarn; yarn takes original_context"),
    ("yarn:4,beta_fast", "'beta_fast' is not a setting: after yarn:F come name=value settings"),
    ("rope:2", "'rope' is no scaling rule; expected one of linear:F, ntk:F, yarn:F, llama3:F"),
]


@pytest.mark.parametrize(("rule", "says"), OUT_OF_RANGE + NOT_READ, ids=[r for r, _ in OUT_OF_RANGE + NOT_READ])
def test_the_flag_refuses_a_setting_out_of_range_unread_or_repeated_naming_it_before_any_token(
    cli, rope_run, rule, says
):
    before = snapshot(rope_run)
    line = refused(cli, "sample", "--run", rope_run, "-p", "ROMEO", "-n", "3", "--rope-scaling", rule)
    assert line.startswith(f"minigpt: error: --rope-scaling {rule}: {says}")
    # not even the prompt is printed: refused before sampling began
    assert cli("sample", "--run", rope_run, "-p", "ROMEO", "-n", "3", "--rope-scaling", rule).stdout == ""
    assert snapshot(rope_run) == before


@pytest.mark.parametrize(
    ("rule", "says"),
    [OUT_OF_RANGE[0], OUT_OF_RANGE[1], OUT_OF_RANGE[2], NOT_READ[0], NOT_READ[1]],
    ids=["nan", "llama3-zeros", "attention-factor", "twice", "unread"],
)
def test_the_config_key_refuses_the_same_rules_naming_the_key_and_where_it_was_given(
    cli, tiny_config, tmp_path, rule, says
):
    out = tmp_path / "never"
    line = refused(cli, "train", "-c", tiny_config, *ROPE, "--set", f"model.rope_scaling={rule}", "--out", out)
    assert line.startswith(f'minigpt: error: --set model.rope_scaling={rule}: [model] rope_scaling = "{rule}": {says}')
    assert "--rope-scaling" not in line

    in_file = tmp_path / "scaled.toml"
    in_file.write_text(
        tiny_config.read_text().replace("[model]\n", f'[model]\npositions = "rope"\nrope_scaling = "{rule}"\n')
    )
    line = refused(cli, "train", "-c", in_file, "--steps", "2", "--out", out)
    assert line.startswith(f'minigpt: error: {in_file}: [model] rope_scaling = "{rule}": {says}')
    assert not out.exists()


def test_a_setting_the_flag_refuses_is_named_as_the_api_argument_in_python(rope_run):
    with pytest.raises(MinigptError) as refusal:
        minigpt.load(rope_run, rope_scaling="yarn:4,beta_fast=nan")
    assert str(refusal.value).startswith("rope_scaling yarn:4,beta_fast=nan: beta_fast = nan is out of range")
    # a ModelConfig built in Python, past config.py's checks, is refused naming the key, not the argument
    with pytest.raises(ConfigError, match=r'^the model: \[model\] rope_scaling = "yarn:4,beta_fast=nan": beta_fast'):
        MiniGPT(
            ModelConfig(
                context=8, n_layer=1, n_head=2, n_embd=16, positions="rope", rope_scaling="yarn:4,beta_fast=nan"
            ),
            10,
        )


def test_settings_in_range_are_read_as_written_and_spelled_back(cli, rope_run):
    rule = "yarn:2,original_context=4,attention_factor=0.5,beta_fast=16,beta_slow=2,mscale=0.707,truncate=false"
    expected = RopeScaling(
        "yarn",
        2.0,
        original_context=4,
        attention_factor=0.5,
        beta_fast=16.0,
        beta_slow=2.0,
        mscale=0.707,
        truncate=False,
    )
    assert parse_rope_scaling(rule) == expected
    assert parse_rope_scaling(spelled(expected)) == expected
    llama3 = RopeScaling("llama3", 32.0, original_context=8192, low_freq_factor=2.0, high_freq_factor=8.0)
    assert spelled(llama3) == "llama3:32.0,original_context=8192,low_freq_factor=2.0,high_freq_factor=8.0"
    assert parse_rope_scaling(spelled(llama3)) == llama3
    # a setting only another rule reads is not written (it would be refused when read back)
    assert spelled(RopeScaling("linear", 2.0, beta_fast=8.0)) == "linear:2.0"

    # original_context is the trained length the factor multiplies: 2 x 4 = 8 tokens accepted, 9 refused
    accepted = cli("sample", "--run", rope_run, "-p", "ROMEO:he", "-n", "1", "--rope-scaling", rule, "--greedy")
    assert accepted.exit_code == 0, accepted.output
    line = refused(cli, "sample", "--run", rope_run, "-p", "ROMEO:hel", "-n", "1", "--rope-scaling", rule)
    assert f"(read with rope scaling {rule}: 8 tokens)" in line


def test_the_dynamic_rule_on_heads_two_wide_is_refused_in_one_line(cli, tmp_path):
    run = train_tiny_run(tmp_path, *ROPE, "--set", "model.n_embd=4", "--set", "model.n_head=2")
    line = refused(cli, "sample", "--run", run, "-p", "ROMEO", "-n", "1", "--rope-scaling", "ntk:2")
    assert line == (
        "minigpt: error: the rope scaling rule ntk:2 (dynamic NTK) needs heads at least 4 wide, and this model's are "
        "2 wide; read it with linear, yarn or llama3 instead"
    )
    assert cli("sample", "--run", run, "-p", "ROMEO", "-n", "1", "--rope-scaling", "yarn:2").exit_code == 0
