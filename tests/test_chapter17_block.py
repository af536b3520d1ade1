"""Chapter 17, Example 17.2 / Table 17.1: the teaching block, number for number.

A float64 one-block model is loaded with exactly the chapter's E, P, W_Q, W_K, W_V, W_O, W_1 and W_2
(zero biases, unit gains, eps 1e-5). The trace recorded from the model's own forward pass must equal
the table rounded to six decimals, and the independent scalar route (tests/reference.py) must agree
with the model within 1e-12.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import reference  # tests/ is on sys.path under `pytest` and `python -m pytest` alike
import torch

from minigpt.model.chapter17 import TABLE_TO_RECORDER, build_model, chapter_model_config
from minigpt.model.gpt import MiniGPT
from minigpt.model.recorder import Recorder

HERE = Path(__file__).resolve()
CANDIDATES = (
    HERE.parents[2] / "shared" / "reference" / "chapter17-block.json",
    HERE.parents[1] / "data" / "chapter17-block.json",
)


@pytest.fixture(scope="module")
def chapter() -> dict:
    for path in CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))
    pytest.skip(
        "chapter17-block.json (the chapter's teaching weights) not found at " + " or ".join(str(p) for p in CANDIDATES)
    )


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


@pytest.fixture(scope="module")
def teaching_model(chapter) -> MiniGPT:
    cfg = chapter_model_config(chapter)
    assert (cfg.context, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.ffn_hidden, cfg.dtype) == (3, 1, 2, 2, 3, "float64")
    return build_model(cfg, chapter)


@pytest.fixture(scope="module")
def trace(teaching_model, chapter) -> Recorder:
    recorder = Recorder(teaching_model.cfg)
    with torch.no_grad():
        teaching_model(torch.tensor([chapter["token_ids"]]), recorder=recorder)
    return recorder


def test_teaching_weights_are_loaded_exactly(teaching_model, chapter):
    block = teaching_model.blocks[0]
    C = 2
    qkv = block.attention.qkv.weight
    # the model's x @ weight.T must be the chapter's x @ W for every matrix
    assert qkv[0:C].T.tolist() == chapter["W_Q"]
    assert qkv[C : 2 * C].T.tolist() == chapter["W_K"]
    assert qkv[2 * C : 3 * C].T.tolist() == chapter["W_V"]
    assert block.attention.out.weight.T.tolist() == chapter["W_O"]
    assert block.ffn.W1.weight.T.tolist() == chapter["W_1"]
    assert block.ffn.W2.weight.T.tolist() == chapter["W_2"]
    assert teaching_model.token_table.weight.dtype == torch.float64
    assert block.norm1.eps == block.norm2.eps == 1e-5


@pytest.mark.parametrize("table_name", list(TABLE_TO_RECORDER))
def test_first_position_row_matches_table_17_1(trace, chapter, table_name):
    expected = chapter["first_position_trace_rounded_6"][table_name]
    recorded = trace[TABLE_TO_RECORDER[table_name]]
    # whole-array shape [T, width] of the table, with the batch axis in front
    assert list(recorded.shape) == [1] + expected["shape"]
    first_row = recorded[0, 0].tolist()
    assert [round(v, 6) for v in first_row] == expected["row"]


def test_table_shapes_are_three_by_two_except_hidden(trace):
    for name in (
        "input",
        "blocks.0.norm1",
        "blocks.0.attention",
        "blocks.0.residual1",
        "blocks.0.norm2",
        "blocks.0.ffn",
        "blocks.0.output",
    ):
        assert list(trace[name].shape) == [1, 3, 2], name
    assert list(trace["blocks.0.hidden"].shape) == [1, 3, 3]


def test_full_block_output_matches_chapter_rounded_to_six_decimals(trace, chapter):
    Y = trace["blocks.0.output"][0].tolist()
    assert [[round(v, 6) for v in row] for row in Y] == chapter["block_output_Y_rounded_6"]


def test_first_row_equals_the_chapter_closed_form(trace):
    # a = 0.5 / sqrt(0.25 + eps); u = (2a - 1) / (2 sqrt(((2a - 1)/2)^2 + eps)); Y_1 = [1 + u, 2a + u]
    eps = 1e-5
    a = 0.5 / math.sqrt(0.25 + eps)
    u = (2 * a - 1) / (2 * math.sqrt(((2 * a - 1) / 2) ** 2 + eps))
    closed_form = {
        "blocks.0.norm1": [a, -a],
        "blocks.0.attention": [0.0, 2 * a],
        "blocks.0.residual1": [1.0, 2 * a],
        "blocks.0.norm2": [-u, u],
        "blocks.0.hidden": [0.0, 2 * u, u],
        "blocks.0.ffn": [u, u],
        "blocks.0.output": [1 + u, 2 * a + u],
    }
    for name, row in closed_form.items():
        got = trace[name][0, 0].tolist()
        assert all(abs(g - e) <= 1e-12 for g, e in zip(got, row, strict=True)), (name, got, row)


def test_first_position_attends_only_to_itself_with_weight_one(trace):
    weights = trace["blocks.0.attention_weights"]  # [B, H, T, T]
    assert list(weights.shape) == [1, 2, 3, 3]
    assert weights[0, :, 0].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    # causal: nothing above the diagonal, each row sums to one
    assert torch.all(torch.triu(weights[0], diagonal=1) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 2, 3, dtype=torch.float64), atol=1e-15)


def test_scalar_reference_agrees_with_the_model_within_1e_12(teaching_model, trace, chapter):
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in teaching_model.state_dict().items()})
    ref = reference.forward(weights, [chapter["token_ids"]], n_head=2, eps=chapter["eps"])

    def close(model_tensor, ref_value):
        got = torch.tensor(ref_value, dtype=torch.float64)
        assert got.shape == model_tensor.shape
        return float((got - model_tensor).abs().max()) <= 1e-12

    assert close(trace["input"], ref["input"])
    for stage in reference.STAGES + ("attention_weights",):
        assert close(trace[f"blocks.0.{stage}"], ref["blocks"][0][stage]), stage
    assert close(trace["final_norm"], ref["final_norm"])
    assert close(trace["logits"], ref["logits"])


def test_scalar_reference_alone_reproduces_table_17_1(chapter):
    # The reference read straight from the chapter's matrices (no model involved).
    def transpose(m):
        return [list(col) for col in zip(*m)]

    C = 2
    block = dict(
        norm1_gain=[1.0] * C,
        norm1_bias=[0.0] * C,
        norm2_gain=[1.0] * C,
        norm2_bias=[0.0] * C,
        qkv_weight=transpose(chapter["W_Q"]) + transpose(chapter["W_K"]) + transpose(chapter["W_V"]),
        qkv_bias=None,
        out_weight=transpose(chapter["W_O"]),
        out_bias=None,
        W1_weight=transpose(chapter["W_1"]),
        W1_bias=chapter["b_1"],
        W2_weight=transpose(chapter["W_2"]),
        W2_bias=chapter["b_2"],
    )
    weights = dict(
        token_table=chapter["E_token_table"],
        position_table=chapter["P_position_table"],
        blocks=[block],
        final_gain=[1.0] * C,
        final_bias=[0.0] * C,
        head_weight=[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    )
    ref = reference.forward(weights, [chapter["token_ids"]], n_head=2, eps=chapter["eps"])
    Y = ref["blocks"][0]["output"][0]
    assert [[round(v, 6) for v in row] for row in Y] == chapter["block_output_Y_rounded_6"]
    table = chapter["first_position_trace_rounded_6"]
    assert [round(v, 6) for v in ref["input"][0][0]] == table["X (token plus position)"]["row"]
    assert [round(v, 6) for v in ref["blocks"][0]["hidden"][0][0]] == table["hidden (FFN after ReLU)"]["row"]
