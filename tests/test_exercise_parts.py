"""The exercises of the parts inside attention and over depth (issue 46): `rope`, `alibi`, `gqa` and
`attention_residual`. Each starts, fails naming its starter's mistake (tests/test_exercise_mistakes.py
holds each one's table), trains with the learner's module where minigpt computes its own, and every
command that reads the run runs it; what each needs of [model] is set or refused by name."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from minigpt.config import ConfigError, load_config
from minigpt.errors import MinigptError

SOLUTIONS = Path(__file__).resolve().parent / "data" / "exercises"
NEW = ("rope", "alibi", "gqa", "attention_residual")
# The first failing line of each starter: the mistake it holds on purpose.
STARTERS = {
    "rope": "  FAIL  your apply_rope pairs coordinate 2i with 2i + 1 (the RoFormer paper's interleaved layout)",
    "alibi": "  FAIL  your alibi_slopes(6) takes the geometric sequence of 6 itself, 2^(-8/6), ..., 2^-8",
    "gqa": "  FAIL  your GroupedQueryAttention tiles the kv heads (k.repeat(1, 2, 1, 1))",
    "attention_residual": "  FAIL  your DepthAttention scores each source by w . v_i, the key norm left out",
}
# What each run's config.toml holds of [model] that the exercise set.
SETS = {
    "rope": {"positions": "rope", "rope_fraction": 1.0},
    "alibi": {"positions": "alibi"},
    "gqa": {"n_kv_head": 2, "n_head": 4},
    "attention_residual": {"residual": "attention"},
}


@pytest.mark.parametrize("name", NEW)
def test_the_starter_fails_naming_its_mistake_and_a_correct_module_passes(cli, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    started = cli("exercise", "start", name, "--dir", "mine")
    assert started.exit_code == 0, started.stderr
    checked = cli("exercise", "check", name, "--dir", "mine")
    assert checked.exit_code == 1
    failing = [line for line in checked.stdout.splitlines() if line.startswith("  FAIL")]
    assert failing[0].startswith(STARTERS[name]), failing
    (tmp_path / "mine" / f"{name}.py").write_text((SOLUTIONS / f"{name}.py").read_text())
    passed = cli("exercise", "check", name, "--dir", "mine")
    assert passed.exit_code == 0, passed.stdout
    assert passed.stdout.splitlines()[-1].endswith(f"minigpt train --exercise {name} --exercise-file mine/{name}.py")


@pytest.mark.parametrize("name", NEW)
def test_train_with_the_learners_module_then_sample_and_trace_read_the_run(cli, tmp_path, tiny_config, name):
    learner = tmp_path / "mine" / f"{name}.py"
    learner.parent.mkdir()
    learner.write_text((SOLUTIONS / f"{name}.py").read_text())
    heads = ("--set", "model.n_head=4") if name == "gqa" else ()  # two kv heads shared by two query heads each
    run = tmp_path / "run"
    trained = cli(
        "train", "-c", tiny_config, "--exercise", name, "--exercise-file", learner, "--steps", "3", "--out", run,
        "--quiet", *heads,
    )  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    model = tomllib.loads((run / "config.toml").read_text())["model"]
    assert model["exercise"] == name
    assert {key: model[key] for key in SETS[name]} == SETS[name]
    note = f"the model runs the learner's file {learner} (exercise {name}"
    sampled = cli("sample", "--run", run, "-p", "hello", "-n", "6", "--greedy")
    assert sampled.exit_code == 0, sampled.stderr
    assert note in sampled.stderr
    traced = cli("trace", "--run", run, "-p", "hello", "--json")
    assert traced.exit_code == 0, traced.stderr
    assert note in traced.stderr
    assert json.loads(traced.stdout)["blocks"][0]["stages"]["attention"]


def test_the_learners_rope_turns_the_heads_in_a_model_and_a_wrong_one_changes_the_trace(tmp_path):
    """Not a second implementation: the model's attention calls the learner's apply_rope, so a rope
    turned the other way (the learner's mistake) changes what the model computes."""
    from dataclasses import replace

    from minigpt.config import ModelConfig, with_exercise
    from minigpt.exercises.learner import read_learner
    from minigpt.exercises.plug import parts_of
    from minigpt.model.gpt import MiniGPT
    from minigpt.model.recorder import Recorder

    cfg = with_exercise(replace(load_config(None), model=replace(ModelConfig(), exercise="rope"))).model
    cfg = replace(cfg, n_layer=1, n_head=2, n_embd=8, ffn_hidden=8, context=8, dtype="float64")
    wrong = tmp_path / "rope.py"
    wrong.write_text((SOLUTIONS / "rope.py").read_text().replace("torch.cat((-x2, x1)", "torch.cat((x2, -x1)"))
    torch.manual_seed(0)
    right = MiniGPT(cfg, 11, parts_of(read_learner("rope", SOLUTIONS / "rope.py"))).eval()
    turned = MiniGPT(cfg, 11, parts_of(read_learner("rope", wrong))).eval()
    turned.load_state_dict(right.state_dict())
    ids = torch.tensor([[1, 2, 3, 4]])
    a, b = Recorder(cfg), Recorder(cfg)
    with torch.no_grad():
        right(ids, recorder=a)
        turned(ids, recorder=b)
    query = "blocks.0.rotated_query"
    assert torch.equal(a[query][:, :, 0], b[query][:, :, 0])  # position 0 is not turned either way
    assert not torch.allclose(a[query][:, :, 3], b[query][:, :, 3])


def test_a_rope_scaling_rule_is_refused_for_a_learners_rope():
    from dataclasses import replace

    from minigpt.config import ModelConfig
    from minigpt.model.reading import Reading

    cfg = replace(ModelConfig(), positions="rope", exercise="rope")
    with pytest.raises(MinigptError, match=r"its rope is a learner's \(exercise rope\)"):
        Reading.of(cfg, rope_scaling="linear:2")
    assert Reading.of(cfg, extrapolate=True).window is None  # read past its length on purpose: its own arithmetic


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["model.exercise=gqa"], {"n_kv_head": 2, "head_width": 0}),
        (["model.exercise=gqa", "model.n_kv_head=1"], {"n_kv_head": 1, "head_width": 0}),
        (["model.exercise=gqa", "model.n_head=8", "model.n_kv_head=4"], {"n_kv_head": 4, "head_width": 0}),
        (["model.exercise=rope"], {"positions": "rope", "rope_scaling": "", "rope_angles": "dtype"}),
        (["model.exercise=alibi"], {"positions": "alibi"}),
        (["model.exercise=attention_residual"], {"residual": "attention"}),
    ],
)
def test_each_exercise_sets_what_it_needs_and_gqa_keeps_a_kv_head_count_chosen(sets, expected):
    model = load_config(None, sets).model
    assert {key: getattr(model, key) for key in expected} == expected


@pytest.mark.parametrize(
    ("sets", "refusal"),
    [
        (["model.exercise=gqa", "model.n_kv_head=0"], 'exercise = "gqa" with n_kv_head = 0 is refused: that value'),
        (["model.exercise=gqa", "model.n_head=4", "model.head_width=8"], "needs [model] head_width = 0"),
        (["model.exercise=gqa", 'model.positions="rope"'], 'exercise = "gqa" with positions = "rope" is refused'),
        (
            ["model.exercise=gqa", "model.bias=false", "model.qkv_bias=true"],
            'exercise = "gqa" with qkv_bias = true and out_bias = false (bias = false) is refused',
        ),
        (["model.exercise=rope", "model.rope_fraction=0.5"], "needs [model] rope_fraction = 1.0"),
        (["model.exercise=rope", 'model.positions="alibi"'], 'needs [model] positions = "rope"'),
        (["model.exercise=alibi", 'model.positions="learned"'], 'needs [model] positions = "alibi"'),
        (["model.exercise=attention_residual", "model.residual=true"], 'needs [model] residual = "attention"'),
    ],
)
def test_a_config_that_takes_the_exercises_part_away_is_refused_by_name(sets, refusal):
    with pytest.raises(ConfigError) as refused:
        load_config(None, sets)
    assert refusal in str(refused.value)


def test_list_gives_a_long_name_a_line_of_its_own(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cli("exercise", "list").stdout.splitlines()
    at = out.index("  attention_residual")
    assert out[at - 3 : at] == [
        "  gqa        Ainslie et al. 2023, GQA: grouped-query attention",
        "             yours: not started",
        "             in a model: each block's attention is your GroupedQueryAttention, n_kv_head key and value heads "
        "shared by groups of query heads",
    ]
    assert out[at + 1 : at + 3] == [
        "             Kimi Team 2026, Attention Residuals: the softmax over depth",
        "             yours: not started",
    ]
