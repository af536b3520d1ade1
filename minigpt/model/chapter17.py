"""Chapter 17's worked example (Example 17.2, Table 17.1) as model weights.

The chapter gives every matrix of a one-block float64 model: E, P, W_Q, W_K, W_V, W_O, W_1, W_2,
zero biases, unit norm gains, eps 1e-5 (data/chapter17-block.json). `build_model` loads them into
a MiniGPT; `check_table_17_1` refuses a model whose recorded stages do not round to the table.
Used by scripts/make_chapter17.py (which writes data/chapter17/) and by the tests.
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from ..errors import MinigptError
from . import stages
from .gpt import MiniGPT
from .recorder import Recorder

# Table 17.1's row names in chapter17-block.json -> the recorder's names for the same stages.
TABLE_TO_RECORDER = {
    "X (token plus position)": stages.INPUT,
    "norm1": stages.block_name(0, stages.NORM1),
    "attention": stages.block_name(0, stages.ATTENTION),
    "residual1": stages.block_name(0, stages.RESIDUAL1),
    "norm2": stages.block_name(0, stages.NORM2),
    "hidden (FFN after ReLU)": stages.block_name(0, stages.HIDDEN),
    "ffn (FFN output)": stages.block_name(0, stages.FFN),
    "output (block output Y)": stages.block_name(0, stages.OUTPUT),
}


def chapter_model_config(ref: dict) -> ModelConfig:
    """What the chapter's matrices require; the config file must agree with it."""
    E, P, W_1 = ref["E_token_table"], ref["P_position_table"], ref["W_1"]
    return ModelConfig(
        context=len(P),
        n_layer=1,
        n_head=2,
        n_embd=len(E[0]),
        ffn_hidden=len(W_1[0]),
        norm_eps=ref["eps"],
        dropout=0.0,
        norm="layernorm",
        norm_position="pre",
        activation="relu",
        bias=True,
        tie_embeddings=True,
        dtype="float64",
    )


def build_model(cfg: ModelConfig, ref: dict) -> MiniGPT:
    def t(rows) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float64)

    torch.manual_seed(0)  # every parameter is overwritten below; the seed only makes that obvious
    model = MiniGPT(cfg, vocab_size=len(ref["E_token_table"])).eval()
    block = model.blocks[0]
    with torch.no_grad():
        model.token_table.weight.copy_(t(ref["E_token_table"]))  # also the head (tied)
        model.position_table.weight.copy_(t(ref["P_position_table"]))
        # The chapter multiplies row vectors on the right (x @ W); nn.Linear stores W as [out, in].
        block.attention.qkv.weight.copy_(torch.cat([t(ref["W_Q"]).T, t(ref["W_K"]).T, t(ref["W_V"]).T]))
        block.attention.qkv.bias.zero_()
        block.attention.out.weight.copy_(t(ref["W_O"]).T)
        block.attention.out.bias.zero_()
        block.ffn.W1.weight.copy_(t(ref["W_1"]).T)
        block.ffn.W1.bias.copy_(t(ref["b_1"]))
        block.ffn.W2.weight.copy_(t(ref["W_2"]).T)
        block.ffn.W2.bias.copy_(t(ref["b_2"]))
        for norm in (block.norm1, block.norm2, model.final_norm):
            norm.weight.fill_(1.0)
            norm.bias.zero_()
    assert model.head.weight is model.token_table.weight
    return model


def check_table_17_1(model: MiniGPT, ref: dict) -> None:
    """Refuse weights whose recorded stages do not round to the chapter's table."""
    recorder = Recorder(model.cfg)
    with torch.inference_mode():
        model(torch.tensor([ref["token_ids"]]), recorder=recorder)
    wrong = []
    for name, expected in ref["first_position_trace_rounded_6"].items():
        stage = recorder[TABLE_TO_RECORDER[name]]
        row = [round(v, 6) for v in stage[0, 0].tolist()]
        if row != expected["row"] or list(stage.shape) != [1, *expected["shape"]]:
            wrong.append(f"{name}: {row} {list(stage.shape)} != {expected['row']} {expected['shape']}")
    Y = [[round(v, 6) for v in row] for row in recorder[stages.block_name(0, stages.OUTPUT)][0].tolist()]
    if Y != ref["block_output_Y_rounded_6"]:
        wrong.append(f"Y: {Y} != {ref['block_output_Y_rounded_6']}")
    if wrong:
        raise MinigptError("the model does not reproduce Table 17.1: {join}", join="; ".join(wrong))
