"""The four [model] switches of docs/guide/remove-it-and-watch.md: positions = "none", residual = false,
norm = "none", ffn_hidden = 0. For each: train a tiny model, resume it, sample, trace (the stages
present or absent, and their values), eval; and what refuses: impossible combinations, GPT-2
export, attribution and patching without a residual, interventions on a removed part."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import train_tiny_run

from minigpt import failpoints
from minigpt.config import ModelConfig, load_config, model_config_from
from minigpt.errors import ConfigError, MinigptError
from minigpt.inspection.attribution import attribute, check_decomposable
from minigpt.inspection.interventions import ReplaceResidual, Scale
from minigpt.inspection.interventions_apply import check
from minigpt.inspection.legend_text import legend_lines
from minigpt.inspection.trace import trace_position as trace_model
from minigpt.interchange.export import gpt2_refusal
from minigpt.model import stages
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.model.recorder import Recorder, UnknownStageError
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

SWITCHES = {
    "positions": ('model.positions="none"',),
    "residual": ("model.residual=false",),
    "norm": ('model.norm="none"',),
    "ffn": ("model.ffn_hidden=0",),
}
FFN_ONLY = (stages.NORM2, stages.HIDDEN, stages.FFN)


@pytest.fixture(scope="module", params=list(SWITCHES))
def switched(request, tmp_path_factory):
    """(switch, run folder): a tiny model with one switch set, trained 6 steps of which the 5th
    fails (a failpoint) after the checkpoint of step 3: the test resumes it."""
    folder = tmp_path_factory.mktemp(request.param)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(failpoints, "_armed", failpoints.parse("batch@5=raise"))
        patch.setattr(failpoints, "_hits", {})
        with pytest.raises(AssertionError):
            train_tiny_run(folder, *TRAIN, *_sets(request.param))
    assert torch.load(folder / "run" / "checkpoint.pt", weights_only=False)["step"] == 3
    return request.param, folder / "run"


TRAIN = ("--set", "train.steps=6", "--set", "train.checkpoint_interval=3", "--set", "train.eval_interval=3")


def _sets(switch: str) -> list[str]:
    return [part for override in SWITCHES[switch] for part in ("--set", override)]


def test_each_switch_trains_resumes_samples_traces_and_evals(cli, switched):
    switch, run = switched
    model_cfg = load_config(run / "config.toml").model
    assert {
        "positions": model_cfg.positions == "none",
        "residual": model_cfg.residual is False,
        "norm": model_cfg.norm == "none",
        "ffn": model_cfg.ffn_hidden == 0,
    }[switch]
    config = run / "config.toml"
    resumed = cli("train", "-c", config, "--out", run, "--resume", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert torch.load(run / "checkpoint.pt", weights_only=False)["step"] == 6
    sampled = cli("sample", "--run", run, "-n", "5", "--greedy", "--json")
    assert sampled.exit_code == 0, sampled.output
    traced = cli("trace", "--run", run, "--prompt", "the", "--json")
    assert traced.exit_code == 0, traced.output
    data = json.loads(traced.stdout)
    block = data["blocks"][0]
    present = set(block["stages"])
    if switch == "ffn":
        assert not present & set(FFN_ONLY) and block["stages"]["output"] == block["stages"]["residual1"]
    else:
        assert set(FFN_ONLY) <= present
    assert (data["input"]["position_row"] is None) == (switch == "positions")
    text = cli("trace", "--run", run, "--prompt", "the")
    assert text.exit_code == 0, text.output
    assert ("+ position" in text.stdout) == (switch != "positions")
    assert ("residual1 = input + attention" in text.stdout) == (switch != "residual")
    assert ("norm2 =" in text.stdout) == (switch != "ffn")
    scored = cli("eval", "--run", run, "--data", run.parent / "tiny.txt", "--json")
    assert scored.exit_code == 0, scored.output
    assert math.isfinite(json.loads(scored.stdout)["nats_per_token"])
    exported = cli("export", "--run", run, "--format", "hf", "--out", run.parent / "hf")
    assert exported.exit_code == 2 and exported.stderr.count("\n") == 1
    key = {"positions": "positions", "residual": "residual", "norm": "norm", "ffn": "ffn_hidden"}[switch]
    assert f"[model] {key} = " in exported.stderr


# ----------------------------------------------------------------------------------------------
# the values a trace shows, exactly (float64, seeded random weights)

VOCAB = 11


def model_of(**changes) -> MiniGPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(context=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, dtype="float64"), **changes})
    model = MiniGPT(cfg, VOCAB).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def recorded(model: MiniGPT, ids: list[int]) -> Recorder:
    recorder = Recorder(model.cfg)
    with torch.no_grad():
        model(torch.tensor([ids]), recorder=recorder)
    return recorder


def test_without_the_residual_each_sum_is_its_update_alone():
    for position in ("pre", "post"):
        r = recorded(model_of(residual=False, norm_position=position), [1, 2, 3, 4])
        for i in range(2):
            assert torch.equal(r[f"blocks.{i}.residual1"], r[f"blocks.{i}.attention"])
            second = stages.second_sum(position)
            assert torch.equal(r[f"blocks.{i}.{second}"], r[f"blocks.{i}.ffn"])


def test_norm_none_is_the_identity_everywhere_and_has_no_parameters():
    model = model_of(norm="none")
    assert not any("norm" in name for name, _ in model.named_parameters())
    r = recorded(model, [1, 2, 3, 4])
    assert torch.equal(r["blocks.0.norm1"], r["input"]) and torch.equal(r["blocks.0.norm2"], r["blocks.0.residual1"])
    assert torch.equal(r["final_norm"], r["blocks.1.output"])


def test_positions_none_the_input_is_the_token_row_alone():
    model = model_of(positions="none")
    assert not hasattr(model, "position_table")
    ids = [3, 3, 3, 5, 3]
    x = recorded(model, ids)["input"][0]
    assert torch.equal(x, model.token_table.weight[ids].detach())
    assert all(torch.equal(x[0], x[p]) for p in (1, 2, 4))
    with pytest.raises(ContextTooLongError, match=r"trained on at most 8 .*no table to run out of.*extrapolate"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_no_ffn_the_stages_are_absent_and_output_is_residual1():
    for position, output_is in (("pre", "residual1"), ("post", "norm1")):
        model = model_of(ffn_hidden=0, norm_position=position)
        assert not hasattr(model.blocks[0], "ffn") and not hasattr(model.blocks[0], "norm2")
        r = recorded(model, [1, 2, 3])
        names = stages.recorded_names(2, position, ffn=False)
        assert list(r.stages) == list(names) and not any(n.endswith((".ffn", ".hidden", ".norm2")) for n in names)
        assert torch.equal(r["blocks.0.output"], r[f"blocks.0.{output_is}"])
        with pytest.raises(UnknownStageError, match=r"blocks.0.ffn.*no such stage"):
            Recorder(model.cfg, {"blocks.0.ffn": lambda value, recorded: value})


def test_with_positions_none_attention_at_the_last_position_ignores_the_order_before_it():
    """Without a position table, attention is a weighted sum over a set: permuting the tokens before
    the last one leaves block 0's attention row there the same (to float64 rounding: the sum is
    taken in another order); with the table it changes."""
    orders = ([1, 2, 3, 4, 7], [4, 3, 2, 1, 7], [2, 4, 1, 3, 7])
    none = [recorded(model_of(positions="none"), ids)["blocks.0.attention"][0, -1] for ids in orders]
    # the same up to float64's rounding of a sum taken in another order
    assert all((none[0] - row).abs().max() < 1e-12 for row in none[1:])
    learned = [recorded(model_of(), ids)["blocks.0.attention"][0, -1] for ids in orders]
    assert all((learned[0] - row).abs().max() > 1e-3 for row in learned[1:])


def test_the_legend_matches_the_model_as_built():
    def legend(**changes) -> str:
        return " ".join(legend_lines(model_of(**changes).architecture()))

    assert "+" not in legend(residual=False, bias=False)
    assert "residual1 = input + attention" in legend()
    assert "norm1 = input;" in legend(norm="none") and "LN" not in legend(norm="none")
    no_ffn = legend(ffn_hidden=0)
    assert "output = residual1" in no_ffn and "hidden" not in no_ffn and "norm2" not in no_ffn


# ----------------------------------------------------------------------------------------------
# refusals


def test_norm_none_with_post_norm_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as refusal:
        load_config(None, ['model.norm="none"', 'model.norm_position="post"'])
    assert "nothing to position" in str(refusal.value) and "\n" not in str(refusal.value)


def test_a_checkpoint_written_before_the_switches_reads_as_the_defaults():
    stored = {k: v for k, v in vars(ModelConfig()).items() if k not in ("positions", "residual")}
    assert model_config_from(stored, "old checkpoint") == ModelConfig()


def test_gpt2_export_refuses_each_switch_naming_the_key():
    base = dict(context=4, n_layer=1, n_head=1, n_embd=4, ffn_hidden=8)
    for changes, key in (
        (dict(positions="none"), "positions"),
        (dict(residual=False), "residual"),
        (dict(norm="none"), "norm"),
        (dict(ffn_hidden=0), "ffn_hidden"),
    ):
        assert f"[model] {key} = " in gpt2_refusal(MiniGPT(ModelConfig(**{**base, **changes}), 5))


def test_attribution_and_interventions_refuse_a_removed_part():
    with pytest.raises(MinigptError, match=r"no residual \(\[model\] residual = false\)"):
        check_decomposable(model_of(residual=False))
    with pytest.raises(MinigptError, match=r"no FFN \(\[model\] ffn_hidden = 0\)"):
        check([Scale(None, stages.FFN, 0.5)], model_of(ffn_hidden=0))
    with pytest.raises(MinigptError, match=r"no residual"):
        check([ReplaceResidual(None)], model_of(residual=False))
    check([Scale(0, stages.ATTENTION, 0.5), ReplaceResidual(None)], model_of(ffn_hidden=0))  # meaningful


@pytest.mark.parametrize(
    "changes, absent",
    [(dict(norm="none"), ()), (dict(positions="none"), ("position",)), (dict(ffn_hidden=0), ("0.ffn", "1.ffn"))],
)
def test_attribution_is_exact_with_each_switch_it_can_take(changes, absent):
    model = model_of(**changes)
    tokenizer = TextTokenizer(train_tokenizer("byte", 300, "abcdefghijk"))
    traced = trace_model(model, tokenizer, [1, 2, 3, 4], 3, top=3)
    result = attribute(model, tokenizer, traced, 5, versus=2)
    names = [part.name for part in result.parts]
    assert abs(result.error) < 1e-9 and not set(absent) & set(names)
    if changes.get("norm") == "none":
        assert result.scale == 1.0 and "final_norm.bias" not in names


def test_the_explore_pages_model_reports_the_switches_and_traces(switched):
    import minigpt
    from minigpt.explore.explorer import Explorer

    switch, run = switched
    explorer = Explorer(minigpt.load(run))
    info = explorer.model_info()
    assert (info["positions"], info["residual"], info["norm"], info["ffn_hidden"] == 0) == (
        "none" if switch == "positions" else "learned",
        switch != "residual",
        "none" if switch == "norm" else "layernorm",
        switch == "ffn",
    )
    assert (info["residual_adds"] == {}) == (switch == "residual")
    assert ("ffn" in info["scalable"]) == (switch != "ffn")
    assert (info["attribution"]["refused"] is not None) == (switch == "residual")


def test_a_run_trained_before_the_switches_keeps_its_identity_and_resumes():
    from minigpt.config import load_config
    from minigpt.runs.identity import training_identity

    plain = training_identity(load_config(None))
    assert "positions" not in plain["model"] and "residual" not in plain["model"]  # hashed as earlier runs were
    switched = training_identity(load_config(None, ['model.positions="none"', "model.residual=false"]))
    assert switched["model"]["positions"] == "none" and switched["model"]["residual"] is False
