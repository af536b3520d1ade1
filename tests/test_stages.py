"""minigpt.stages: the one definition of the stage names. The model records exactly the names it
builds for a config (pre-norm and post-norm), in the order it computes them, and a Recorder refuses
a replacement (or a record) for a name the model never computes instead of silently ignoring it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from minigpt.config import ModelConfig
from minigpt.model import stages
from minigpt.model.cache import KVCache
from minigpt.model.gpt import MiniGPT
from minigpt.model.recorder import Recorder, UnknownStageError

STAGES_SOURCE = Path(__file__).resolve().parents[1] / "minigpt" / "model" / "stages.py"


def tiny(**changes) -> MiniGPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(context=8, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16), **changes})
    return MiniGPT(cfg, 11).eval()


def recorded(model: MiniGPT, **options) -> Recorder:
    recorder = Recorder(model.cfg)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4]]), recorder=recorder, **options)
    return recorder


@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("n_layer", [1, 3])
def test_the_model_records_exactly_the_names_stages_builds_in_their_order(norm_position, n_layer):
    model = tiny(norm_position=norm_position, n_layer=n_layer)
    expected = stages.recorded_names(n_layer, norm_position)
    assert list(recorded(model).stages) == list(expected)
    assert list(recorded(model, last_only=True).stages) == list(expected)  # sampling's pass: the same names
    assert list(recorded(model, cache=KVCache(n_layer, 8)).stages) == list(expected)
    block = [name for name in recorded(model).block(0) if name != stages.ATTENTION_WEIGHTS]
    assert block == list(stages.block_stages(norm_position))


def test_the_names_themselves():
    assert stages.PRE_NORM == ("norm1", "attention", "residual1", "norm2", "hidden", "ffn", "output")
    assert stages.POST_NORM == ("attention", "residual1", "norm1", "hidden", "ffn", "residual2", "norm2", "output")
    assert stages.recorded_names(1, "pre") == (
        "input",
        "blocks.0.norm1",
        "blocks.0.attention_weights",
        "blocks.0.attention",
        "blocks.0.residual1",
        "blocks.0.norm2",
        "blocks.0.hidden",
        "blocks.0.ffn",
        "blocks.0.output",
        "final_norm",
        "logits",
    )
    assert stages.replaceable_names(2, "post")[-2:] == ("blocks.0.heads", "blocks.1.heads")
    assert (stages.second_sum("pre"), stages.second_sum("post")) == ("output", "residual2")
    with pytest.raises(ValueError, match="norm_position 'middle'"):
        stages.block_stages("middle")


def test_stages_imports_nothing_so_anything_can_read_it():
    tree = ast.parse(STAGES_SOURCE.read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__"}


@pytest.mark.parametrize(
    "norm_position, name",
    [
        ("pre", "blocks.0.residual2"),  # post-norm only
        ("pre", "blocks.2.attention"),  # a block the model does not have
        ("post", "blocks.0.attn"),  # a typo
        ("pre", "attention"),  # a block stage without its block
        ("pre", "final_norm.weight"),
    ],
)
def test_a_replacement_for_a_stage_the_model_never_computes_is_refused(norm_position, name):
    model = tiny(norm_position=norm_position)
    with pytest.raises(UnknownStageError) as refused:
        Recorder(model.cfg, {name: lambda value, recorded: value * 0})
    message = str(refused.value)
    assert f"a replacement for {name!r}: this model computes no such stage" in message
    assert "input, final_norm, logits and blocks.I.STAGE for I in 0..1" in message
    assert ", ".join(stages.block_stages(norm_position)) in message and "heads" in message


def test_every_name_the_model_computes_can_be_replaced_and_is_applied():
    model = tiny()
    for name in stages.replaceable_names(2, "pre"):
        calls = []
        recorder = Recorder(model.cfg, {name: lambda value, recorded, calls=calls: calls.append(1) or value})
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]), recorder=recorder)
        assert calls == [1], name  # applied exactly once: never silently skipped


def test_a_record_under_a_name_stages_does_not_define_is_refused():
    recorder = Recorder(tiny().cfg)
    with pytest.raises(UnknownStageError, match=r"a record for 'blocks.0.gate'"):
        recorder.scoped("blocks.0").record("gate", torch.zeros(1))
    assert recorder.stages == {}
