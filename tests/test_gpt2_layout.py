"""gpt2_layout.py: the one table of GPT-2's layout that import and export both read. Every
parameter of a MiniGPT of GPT-2's layout has a GPT-2 name that leads back to it; the names and
layouts are the ones transformers' GPT2LMHeadModel and nanoGPT's GPT hold; an export read back by
the import gives every tensor bitwise."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import need

from minigpt.config import ModelConfig
from minigpt.interchange import gpt2_layout as gpt2
from minigpt.model.gpt import MiniGPT
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
NANOGPT = REPO.parent / "shared" / "anchors" / "nanogpt" / "model.py"
# ffn_hidden 4 n_embd, as GPT-2 and nanoGPT have it; C != 4C, so a transposed matrix changes shape
GPT2_SHAPE = dict(context=12, n_layer=3, n_head=2, n_embd=8, ffn_hidden=32)


def minigpt_state(tie: bool, **changes) -> dict[str, torch.Tensor]:
    return MiniGPT(ModelConfig(**GPT2_SHAPE, tie_embeddings=tie, **changes), 40).state_dict()


def stored(tie: bool) -> list[gpt2.Parameter]:
    """The table's parameters a GPT-2 of GPT2_SHAPE stores (a tied head is not stored on its own)."""
    return [p for p in gpt2.parameters(GPT2_SHAPE["n_layer"]) if not (p.tied and tie)]


@pytest.mark.parametrize("tie", [True, False])
def test_every_parameter_maps_to_a_gpt2_name_and_back_to_itself(tie):
    ours = minigpt_state(tie)
    to_gpt2 = {p.ours: p.theirs for p in stored(tie)}
    back = {theirs: name for name, theirs in to_gpt2.items()}
    assert len(back) == len(to_gpt2)  # no two parameters share a GPT-2 name
    assert set(to_gpt2) == set(ours) - ({gpt2.HEAD.ours} if tie else set())
    assert all(back[to_gpt2[name]] == name for name in to_gpt2)
    if tie:  # the head left out is the token table itself
        assert ours[gpt2.HEAD.ours].data_ptr() == ours[gpt2.TOKEN_TABLE.ours].data_ptr()


def test_the_table_holds_transformers_names_and_conv1d_layouts():
    transformers = need("transformers")
    config = transformers.GPT2Config(
        vocab_size=40,
        n_positions=GPT2_SHAPE["context"],
        n_embd=GPT2_SHAPE["n_embd"],
        n_layer=GPT2_SHAPE["n_layer"],
        n_head=GPT2_SHAPE["n_head"],
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    theirs = {k: v for k, v in transformers.GPT2LMHeadModel(config).state_dict().items() if not gpt2.is_mask_buffer(k)}
    ours = minigpt_state(tie=False)
    assert sorted(theirs) == sorted(p.theirs for p in stored(tie=False))
    for p in stored(tie=False):
        shape = tuple(ours[p.ours].shape)
        assert tuple(theirs[p.theirs].shape) == (shape[::-1] if p.conv1d else shape), p.theirs
    assert any(p.conv1d and len(set(ours[p.ours].shape)) == 2 for p in stored(tie=False))  # a shape test that bites


def test_nanogpt_s_own_model_holds_the_table_s_names_untransposed():
    if not NANOGPT.is_file():
        pytest.skip(f"{NANOGPT} is not in this checkout")
    spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = {k: GPT2_SHAPE[k] for k in ("n_layer", "n_head", "n_embd")}
    nano = module.GPT(module.GPTConfig(block_size=GPT2_SHAPE["context"], vocab_size=40, bias=True, **args))
    theirs = {k: v for k, v in nano.state_dict().items() if not gpt2.is_mask_buffer(k)}
    ours = minigpt_state(tie=True, activation="gelu")
    assert sorted(theirs) == sorted(p.theirs for p in gpt2.parameters(GPT2_SHAPE["n_layer"]))  # its head is tied
    for p in gpt2.parameters(GPT2_SHAPE["n_layer"]):
        assert theirs[p.theirs].shape == ours[p.ours].shape, p.theirs  # nn.Linear, as minigpt's


def test_openai_s_unprefixed_names_and_the_mask_buffers_are_recognised():
    assert gpt2.prefixed("h.0.attn.c_attn.weight") == "transformer.h.0.attn.c_attn.weight"
    assert gpt2.prefixed("transformer.wte.weight") == "transformer.wte.weight"
    assert gpt2.prefixed("lm_head.weight") == "lm_head.weight"
    assert gpt2.is_mask_buffer("transformer.h.11.attn.bias") and gpt2.is_mask_buffer("transformer.h.0.attn.masked_bias")
    assert not gpt2.is_mask_buffer("transformer.h.0.attn.c_attn.bias") and not gpt2.is_mask_buffer(
        "transformer.ln_f.bias"
    )


def test_each_activation_is_exported_under_a_name_the_import_reads_as_it():
    assert gpt2.EXPORTED_ACTIVATIONS == {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}
    assert all(gpt2.ACTIVATIONS[theirs] == ours for ours, theirs in gpt2.EXPORTED_ACTIVATIONS.items())


@pytest.mark.parametrize(
    "changes",
    [
        dict(tie_embeddings=True, activation="gelu_tanh"),
        dict(tie_embeddings=False, activation="gelu", norm_eps=1e-6),
        dict(tie_embeddings=False, activation="relu", bias=False),
    ],
)
def test_export_then_import_reproduces_every_tensor_bitwise(tmp_path, changes):
    need("safetensors")
    from minigpt.interchange.export import export_hf, gpt2_state
    from minigpt.interchange.hf import read_hf_gpt2

    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefghijklmnopqrstuvwxyz .,;:!?'\n"))
    cfg = ModelConfig(**GPT2_SHAPE, **changes)
    model = MiniGPT(cfg, tokenizer.vocab_size).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # every tensor, biases and gains too, far from its init
            p.copy_(torch.randn(p.shape, generator=generator))
    exported = gpt2_state(model)
    ours = model.state_dict()
    for p in stored(cfg.tie_embeddings):
        if p.ours in ours:
            assert torch.equal(exported[p.theirs], ours[p.ours].T if p.conv1d else ours[p.ours]), p.theirs
        else:  # a model without biases: GPT-2's are zeros
            assert p.bias_of and not cfg.bias and not exported[p.theirs].any(), p.theirs
    export_hf(model, tokenizer, tmp_path / "hf")
    back = read_hf_gpt2(tmp_path / "hf")
    assert back.model == dataclasses.replace(cfg, bias=True)  # GPT-2 always has biases
    assert back.vocab_size == tokenizer.vocab_size
    for name, tensor in back.state.items():
        if name in ours:
            assert tensor.dtype == ours[name].dtype and torch.equal(tensor, ours[name]), name
        else:
            assert name.endswith(".bias") and not cfg.bias and not tensor.any(), name
    assert set(ours) <= set(back.state)
    if cfg.tie_embeddings:
        assert back.state[gpt2.HEAD.ours] is back.state[gpt2.TOKEN_TABLE.ours]
