"""`Run.trace(..., patch=...)`: one patch of `Run.patch` traced. The patched pass ends in the logit
difference `Run.patch` reports for that patch, for every stage and head of both sweeps (float64,
within 1e-9); the last block's output put back at the last position gives the clean run's final
norm row; the attribution stays exact where the patch leaves the sum it splits intact and is
refused where it breaks it; refusals are one line, naming no parameter the command line lacks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_run
from test_patching import ANSWER, CLEAN, CORRUPT, VERSUS, Numbered, text

from minigpt.api import Comparison, MinigptError, Run, Trace
from minigpt.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
LAST = len(CORRUPT) - 1


@pytest.fixture(scope="module")
def run() -> Run:
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=8, ffn_hidden=16, context=8, dtype="float64")
    return random_run(cfg, 12, Numbered(), seed=1)


def patch(block: int, stage: str, position: int | None = None, head: int | None = None) -> dict:
    return {"clean": text(CLEAN), "block": block, "stage": stage, "position": position, "head": head}


def patched(run: Run, where: dict, **options) -> Trace:
    return run.trace(text(CORRUPT), patch=where, compare=False, **options)


@pytest.mark.parametrize("by", ["stage", "head"])
def test_a_patched_trace_ends_in_the_effect_run_patch_reports(run, by):
    sweep = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by=by)
    high, low = sweep.clean.logit_difference, sweep.corrupt.logit_difference
    assert {e.stage for e in sweep.effects} == ({"heads"} if by == "head" else set(STAGES))
    for e in sweep.effects:
        logits = patched(run, patch(e.block, e.stage, e.position, e.head)).stage(None, "logits")
        effect = (float(logits[ANSWER] - logits[VERSUS]) - low) / (high - low)
        assert effect == pytest.approx(e.effect, abs=1e-9), e


STAGES = ["input", "attention", "residual1", "ffn", "output"]


def test_the_last_blocks_output_put_back_at_the_last_position_is_the_clean_runs_final_row(run):
    trace = patched(run, patch(2, "output", LAST))
    clean = run.trace(text(CLEAN))
    assert trace.final_norm.row == clean.final_norm.row
    assert trace.stage(None, "logits").tolist() == clean.stage(None, "logits").tolist()
    assert trace.interventions == ["patch 2.output@6 from clean"]


def test_a_patch_writes_the_clean_row_where_it_says_and_leaves_earlier_rows_alone(run):
    clean = run.trace(text(CLEAN), position=3)
    corrupt = run.trace(text(CORRUPT), position=3)
    # block 1's input is block 0's output: put back once, read by both
    trace = patched(run, patch(1, "input", 3), position=3)
    assert trace.blocks[1].input.row == trace.blocks[0].stages["output"] == clean.blocks[0].stages["output"]
    assert trace.blocks[0].stages["residual1"] == corrupt.blocks[0].stages["residual1"]
    before = patched(run, patch(1, "input", 3), position=2)
    assert before.blocks[2].stages["output"] == run.trace(text(CORRUPT), position=2).blocks[2].stages["output"]
    heads = patched(run, patch(0, "heads", None, 1))
    mixed = heads.recorded["blocks.0.heads"][0]  # [H, T, d]: head 1 the clean run's, head 0 the corrupt one's
    assert torch.equal(mixed[1], run.trace(text(CLEAN)).recorded["blocks.0.heads"][0, 1])
    assert torch.equal(mixed[0], run.trace(text(CORRUPT)).recorded["blocks.0.heads"][0, 0])


def test_with_a_patch_the_result_compares_the_traced_prompt_before_and_after(run):
    compared = run.trace(text(CORRUPT), position=4, patch=patch(1, "ffn", 4))
    assert isinstance(compared, Comparison) and compared.interventions == ["patch 1.ffn@4 from clean"]
    assert compared.before.as_dict() == run.trace(text(CORRUPT), position=4).as_dict()
    assert compared.after.as_dict() == patched(run, patch(1, "ffn", 4), position=4).as_dict()
    assert compared.after.blocks[1].stages["ffn"] == run.trace(text(CLEAN), position=4).blocks[1].stages["ffn"]
    assert compared.stages[1]["ffn"].change > 0 and compared.stages[0]["ffn"].change == 0
    as_ids = run.trace(ids=CORRUPT, position=4, patch={**patch(1, "ffn", 4), "clean": CLEAN})
    assert as_ids.as_dict() == compared.as_dict()
    # with another intervention, the patch's clean value is still the clean prompt's own pass
    both = run.trace(text(CORRUPT), position=4, patch=patch(1, "ffn", 4), scale={"0.attention": 0.5})
    assert both.after.blocks[1].stages["ffn"] == compared.after.blocks[1].stages["ffn"]
    assert both.interventions == ["scale 0.attention=0.5", "patch 1.ffn@4 from clean"]


@pytest.mark.parametrize(
    "where, position",
    [
        (patch(1, "ffn", LAST), None),  # a patched ffn update is the ffn part
        (patch(2, "ffn", None), 3),
        (patch(0, "heads", LAST, 1), None),  # a patched head is that head's part
        (patch(2, "heads", None, 0), 5),
        (patch(1, "attention", 2), None),  # elsewhere the traced row's parts only read the patched one
        (patch(1, "output", 2), None),
        (patch(0, "input", 2), 6),  # the one token the prompts differ in
        (patch(1, "residual1", 3), 5),
        (patch(1, "hidden", LAST), None),  # stages beside Run.patch's: the ffn update is still the part
        (patch(2, "norm1", None), None),
    ],
)
def test_the_attribution_stays_exact_where_the_patch_leaves_its_sum_intact(run, where, position):
    compared = run.trace(text(CORRUPT), position=position, patch=where, attribute=ANSWER, versus=VERSUS)
    after = compared.after
    logits = after.stage(None, "logits")
    assert after.attribution.total == float(logits[ANSWER] - logits[VERSUS])
    assert abs(after.attribution.error) < 1e-12
    assert after.attribution.as_dict() != compared.before.attribution.as_dict()  # the patch reached it


@pytest.mark.parametrize(
    "where, position, message",
    [
        (patch(0, "input", 3), 3, "a patch puts back the clean prompt's input: that residual-stream row"),
        (patch(1, "residual1", None), 2, "the clean prompt's residual1"),
        (patch(2, "output", LAST), None, "the clean prompt's output"),
        (patch(1, "attention", None), None, "attention update: it is the clean pass's, not the sum of the heads"),
        (patch(0, "attention", 4), 4, "attribute another position, or patch a head"),
    ],
)
def test_the_attribution_is_refused_where_the_patch_breaks_its_sum(run, where, position, message):
    with pytest.raises(MinigptError) as caught:
        run.trace(text(CORRUPT), position=position, patch=where, attribute=ANSWER)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.parameters == ()


@pytest.mark.parametrize(
    "where, message",
    [
        ("0.ffn", "the patch '0.ffn' must be a mapping of clean, block, stage, position, head"),
        ({**patch(0, "ffn"), "at": 1}, "the patch has unknown key(s) 'at'; it takes: clean, block, stage"),
        ({**patch(0, "ffn"), "clean": ""}, "the patch's clean prompt '' must be a non-empty text or list"),
        ({**patch(0, "ffn"), "clean": [1, "2"]}, "the patch's clean prompt [1, '2'] must be"),
        ({**patch(0, "ffn"), "clean": "t1 t2"}, "the patch's clean prompt has 2 tokens and the traced one 7"),
        ({**patch(0, "ffn"), "clean": "t1 t2 t3 t4 t5 t6 t7 t99"}, "the patch's clean prompt: "),
        ({"clean": text(CLEAN), "stage": "ffn"}, "the patch's block None must be an integer"),
        (patch(True, "ffn"), "the patch's block True must be an integer"),
        (patch(3, "ffn"), "the patch's block 3 does not exist; the model has 3 block(s), 0..2"),
        (patch(0, "logits"), "the patch's stage 'logits' is not one of this model's block stages: input, norm1"),
        (patch(0, "ffn", 7), "the patch's position 7 is beyond the prompt: it has 7 token(s), positions 0..6"),
        (patch(0, "ffn", -1), "the patch's position -1 is beyond the prompt"),
        (patch(0, "ffn", "1"), "the patch's position '1' must be an integer or None"),
        (patch(0, "heads"), "a patch of heads puts back one head's mixed values: give the patch's head, 0..1"),
        (patch(0, "heads", None, 2), "the patch's head 2 does not exist; the model has 2 heads, 0..1"),
        (patch(0, "ffn", None, 0), "the patch's head 0 is for a patch of heads; a patch of ffn puts back"),
    ],
)
def test_a_bad_patch_is_refused_in_one_line(run, where, message):
    with pytest.raises(MinigptError) as caught:
        run.trace(text(CORRUPT), patch=where)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.parameters == ()  # the command line has no patch: no flag to name


def test_compare_with_a_patch_alone_is_a_comparison(run):
    assert isinstance(run.trace(text(CORRUPT), patch=patch(0, "ffn"), compare=True), Comparison)
    with pytest.raises(MinigptError, match="or a patch to compare with"):
        run.trace(text(CORRUPT), compare=True)
