"""`minigpt trace` interventions: scale a sublayer's update, the replace-instead-of-add residual,
head ablation and an edited input row, all run through the model's own forward pass; --compare
shows both passes; refusals are one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minigpt.cli import app
from minigpt.config import ModelConfig
from minigpt.inspection.interventions import AblateHead, ReplaceResidual, Scale, SetInput
from minigpt.inspection.interventions_apply import replacements
from minigpt.model.gpt import MiniGPT
from minigpt.model.recorder import Recorder

REPO = Path(__file__).resolve().parents[1]
CHAPTER = ["-c", str(REPO / "configs" / "chapter17.toml"), "--ids", "0,1,2"]


def trace_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["trace", *CHAPTER, "--json", *args])
    assert result.exit_code == 0, (result.stderr, result.exception)
    return json.loads(result.stdout)


def refused(*args: str) -> str:
    result = CliRunner().invoke(app, ["trace", *CHAPTER, *args])
    assert result.exit_code == 2 and result.stdout == "", (result.stdout, result.exception)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.parametrize("position", [0, 1, 2])
def test_attention_scale_zero_makes_residual1_the_input_exactly(position):
    data = trace_json("--position", str(position), "--scale", "0.attention=0")
    [block] = data["blocks"]
    assert block["stages"]["attention"] == [0.0, 0.0]
    assert block["stages"]["residual1"] == block["input"]["row"] == data["input"]["row"]
    assert data["interventions"] == ["scale 0.attention=0"]


def test_replacement_mode_with_scale_zero_loses_the_input_at_the_first_residual():
    data = trace_json("--position", "2", "--scale", "0.attention=0", "--replace-residual", "0")
    stages = data["blocks"][0]["stages"]
    assert stages["residual1"] == [0.0, 0.0]  # the input disappeared
    assert stages["output"] == stages["ffn"]  # replace, not add
    assert data["interventions"] == ["scale 0.attention=0", "replace-residual 0"]


def test_scale_multiplies_the_update_and_the_sum_follows():
    plain = trace_json("--position", "1")["blocks"][0]["stages"]
    doubled = trace_json("--position", "1", "--scale", "all.attention=2")["blocks"][0]["stages"]
    assert doubled["attention"] == pytest.approx([2 * v for v in plain["attention"]], abs=1e-12)
    x = trace_json("--position", "1")["input"]["row"]
    assert doubled["residual1"] == pytest.approx([a + b for a, b in zip(x, doubled["attention"])], abs=1e-12)
    assert doubled["norm1"] == plain["norm1"]  # what comes before the change is untouched


def test_ablating_every_head_leaves_only_the_output_bias():
    data = trace_json("--position", "2", "--ablate-head", "0.0", "--ablate-head", "0.1")
    stages = data["blocks"][0]["stages"]
    assert stages["attention"] == [0.0, 0.0]  # the chapter's W_O bias is zero
    assert stages["residual1"] == data["input"]["row"]


def test_an_edited_input_row_enters_block_0_at_the_traced_position():
    data = trace_json("--position", "1", "--set-input", "2,2")
    assert data["input"]["row"] == [2.0, 2.0]
    assert data["blocks"][0]["stages"]["norm1"] == [0.0, 0.0]  # LayerNorm removes a constant vector


def test_compare_shows_both_passes_their_changes_and_the_kl():
    data = trace_json("--position", "0", "--scale", "0.attention=0", "--compare")
    assert set(data) == {"interventions", "before", "after", "kl_divergence", "stages"}
    assert data["before"] == trace_json("--position", "0")  # the unmodified pass is the plain trace
    change = data["stages"][0]["attention"]
    assert change["norm_before"] == pytest.approx(math.hypot(*data["before"]["blocks"][0]["stages"]["attention"]))
    assert change["norm_after"] == 0.0 and change["change"] == pytest.approx(change["norm_before"])
    assert data["stages"][0]["input"]["change"] == 0.0
    p = [c["probability"] for c in sorted(data["before"]["next_tokens"], key=lambda c: c["id"])]
    q = [c["probability"] for c in sorted(data["after"]["next_tokens"], key=lambda c: c["id"])]
    assert data["kl_divergence"] == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q)), rel=1e-9)
    assert trace_json("--scale", "0.attention=1", "--compare")["kl_divergence"] == pytest.approx(0.0, abs=1e-15)


def test_compare_as_text_names_every_stage_and_fits_80_columns():
    result = CliRunner().invoke(app, ["trace", *CHAPTER, "--position", "0", "--scale", "0.ffn=0", "--compare"])
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "interventions: scale 0.ffn=0" and lines[-1].startswith("KL(before || after) = ")
    for stage in ("input", "norm1", "attention", "residual1", "norm2", "hidden", "ffn", "output"):
        assert any(line.split() and line.split()[0] == stage for line in lines), stage
    assert max(len(line) for line in lines) <= 80


def test_interventions_at_the_traced_position_only_leave_the_other_rows_alone():
    torch.manual_seed(0)
    model = MiniGPT(ModelConfig(context=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, dtype="float64"), 7).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    plain, changed = (
        Recorder(model.cfg),
        Recorder(
            model.cfg,
            replacements(
                [Scale(None, "ffn", 0.0), AblateHead(0, 1), ReplaceResidual(1)],
                model,
                position=2,
                only_at_position=True,
            ),
        ),
    )
    with torch.no_grad():
        model(ids, recorder=plain)
        model(ids, recorder=changed)
    assert torch.equal(plain["blocks.0.ffn"][0, :2], changed["blocks.0.ffn"][0, :2])  # positions 0, 1 untouched
    assert torch.equal(changed["blocks.0.ffn"][0, 2], torch.zeros(8, dtype=torch.float64))
    assert torch.equal(changed["blocks.1.residual1"][0, 2], changed["blocks.1.attention"][0, 2])
    assert not torch.equal(plain["logits"][0, 3], changed["logits"][0, 3])  # later positions read the change


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scale", "0.norm1=0"], "--scale 0.norm1: unknown stage 'norm1'; scale one of: attention, ffn"),
        (["--scale", "3.attention=0"], "--scale: block 3 does not exist; the model has 1 block(s), 0..0, or use 'all'"),
        (["--scale", "0.attention=nan"], "--scale 0.attention=nan: the factor must be a finite number"),
        (["--scale", "0.attention"], "--scale '0.attention': expected BLOCK.STAGE=FACTOR"),
        (["--scale", "x.ffn=1"], "--scale x.ffn=1: block 'x' is not an integer; give a block index or 'all'"),
        (["--ablate-head", "0.2"], "--ablate-head 0.2: head 2 does not exist; the model has 2 heads, 0..1"),
        (["--ablate-head", "0"], "--ablate-head '0': expected BLOCK.HEAD"),
        (["--replace-residual", "1"], "--replace-residual: block 1 does not exist"),
        (["--set-input", "1,2,3"], "--set-input has 3 numbers but the model's width is 2; give exactly 2"),
        (["--set-input", "1,a"], "--set-input: 'a' is not a number"),
        (["--compare"], "--compare needs at least one intervention"),
    ],
)
def test_a_bad_intervention_is_refused_in_one_line(args, message):
    assert message in refused(*args)


def test_set_input_checks_its_numbers_are_finite():
    with pytest.raises(Exception, match="must be finite"):
        torch.manual_seed(0)
        model = MiniGPT(ModelConfig(context=4, n_layer=1, n_head=1, n_embd=2, ffn_hidden=4), 3)
        replacements([SetInput((1.0, float("inf")))], model, position=0)


# ------------------------------------------------------------------ the lesson's four experiments

LESSON = ["-c", str(REPO / "configs" / "lesson09.toml"), "--ids", "0,1,2"]


def lesson_json(*args: str) -> dict:
    result = CliRunner().invoke(app, ["trace", *LESSON, "--json", *args])
    assert result.exit_code == 0, (result.stderr, result.exception)
    return json.loads(result.stdout)


def norm(row: list[float]) -> float:
    return math.sqrt(sum(v * v for v in row))


def test_lesson_1_a_zero_attention_update_leaves_the_stream_unchanged():
    after = lesson_json("--scale", "0.attention=0", "--compare")["after"]
    stages = after["blocks"][0]["stages"]
    assert stages["attention"] == [0.0] * 4 and stages["residual1"] == after["input"]["row"]
    assert after["model"]["norm"] == "rmsnorm" and after["model"]["activation"] == "swiglu"


def test_lesson_2_replacing_instead_of_adding_loses_the_input_at_the_first_residual():
    data = lesson_json("--scale", "0.attention=0", "--replace-residual", "0", "--compare")
    before, after = data["before"]["blocks"][0]["stages"], data["after"]["blocks"][0]["stages"]
    assert after["norm1"] == before["norm1"]  # the input still reaches the first norm...
    assert after["residual1"] == [0.0] * 4  # ...and is gone at the first residual
    assert data["stages"][0]["residual1"]["norm_after"] == 0.0


def test_lesson_3_a_residual_keeps_a_path_for_the_input_not_its_norm():
    data = lesson_json("--scale", "0.attention=0.5", "--compare")
    for run in ("before", "after"):
        x, y = data[run]["input"]["row"], data[run]["blocks"][0]["stages"]["output"]
        assert abs(norm(x) - norm(y)) > 0.1
    assert data["stages"][0]["attention"]["norm_after"] == pytest.approx(
        data["stages"][0]["attention"]["norm_before"] / 2
    )


def test_lesson_4_rmsnorm_keeps_the_sign_pattern_that_layernorm_removes():
    rms = lesson_json("--set-input", "2,2,2,2")["blocks"][0]["stages"]["norm1"]
    assert rms == pytest.approx([1.0] * 4, abs=1e-5) and all(v > 0 for v in rms)
    layer = trace_json("--set-input", "2,2")["blocks"][0]["stages"]["norm1"]  # chapter 17: LayerNorm
    assert layer == [0.0, 0.0]


def test_regenerating_the_lesson_folder_gives_the_shipped_files(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_lesson09", REPO / "scripts" / "make_lesson09.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--out", str(tmp_path / "lesson09")]) == 0
    for name in ("config.toml", "tokenizer.json", "checkpoint.pt"):
        assert (tmp_path / "lesson09" / name).read_bytes() == (REPO / "data" / "lesson09" / name).read_bytes(), name
