"""`minigpt export`: safetensors with minigpt's names, and a Hugging Face GPT-2 folder that
transformers loads and that gives the next-token probabilities `minigpt trace` gives; every format
in the run's dtype (a float64 run's logits within float64 rounding in transformers and PEFT)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import need, train_tiny_run
from test_export_llama import lora_tune

import minigpt
from minigpt.config import ModelConfig, model_config_from
from minigpt.model.gpt import MiniGPT

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny_run(
        tmp_path_factory.mktemp("export"),
        "--set",
        'tokenizer.kind="bpe"',
        "--set",
        "tokenizer.vocab_size=300",
        "--set",
        'model.activation="gelu"',
    )


def test_safetensors_holds_the_parameters_and_the_model_section(trained, cli, tmp_path):
    safetensors = need("safetensors.torch")
    out = tmp_path / "st"
    result = cli("export", "--run", trained, "--format", "safetensors", "--out", out)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    tensors = safetensors.load_file(str(out / "model.safetensors"))  # no pickle involved
    model = MiniGPT(model_config_from(config["model"], "config.json"), config["vocab_size"]).eval()
    model.load_state_dict(tensors)
    payload = torch.load(trained / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(tensors[k], payload["model"][k]) for k in tensors)


def test_hf_export_loads_in_transformers_and_gives_trace_s_probabilities(trained, cli, tmp_path):
    transformers = need("transformers")
    out = tmp_path / "hf"
    result = cli("export", "--run", trained, "--format", "hf", "--out", out)
    assert result.exit_code == 0, result.output
    model = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    prompt = "ROMEO:"  # within the tiny model's 8-row position table
    traced = json.loads(cli("trace", "--run", trained, "-p", prompt, "--json", "--top", "300").stdout)
    ids = tokenizer(prompt)["input_ids"]
    assert ids == traced["ids"]  # the exported tokenizer encodes as minigpt does
    with torch.no_grad():
        probabilities = torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), dim=-1)
    assert len(traced["next_tokens"]) == probabilities.numel()
    for candidate in traced["next_tokens"]:
        assert abs(candidate["probability"] - float(probabilities[candidate["id"]])) < 1e-4


def test_a_float64_run_exports_float64_in_every_format_and_transformers_and_peft_give_its_logits(cli, tmp_path):
    """Nothing is narrowed on the way out: safetensors, the GPT-2 folder and PEFT's adapter hold
    float64, config.json says so under transformers 5's key and 4.x's, transformers loads it as
    float64 and computes minigpt's logits within float64 rounding, with PEFT's adapter on it too."""
    transformers, peft, safetensors = need("transformers"), need("peft"), need("safetensors.torch")
    run = train_tiny_run(tmp_path, "--set", 'model.dtype="float64"', "--set", 'model.activation="gelu"')
    tuned = lora_tune(run, tmp_path / "lora")
    for format, source, weights in (
        ("safetensors", run, "model.safetensors"),
        ("hf", run, "model.safetensors"),
        ("peft", tuned, "adapter_model.safetensors"),
    ):
        result = cli("export", "--run", source, "--format", format, "--out", tmp_path / format)
        assert result.exit_code == 0 and result.stderr == "", result.output  # GPT-2 computes in float64: no note
        tensors = safetensors.load_file(str(tmp_path / format / weights))
        assert {t.dtype for t in tensors.values()} == {torch.float64}, format
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float64"
    model = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()  # 5.x: dtype "auto"
    assert model.dtype == torch.float64
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert (model(ids).logits - minigpt.load(run).model(ids)[0]).abs().max() < 1e-12
        adapted = peft.PeftModel.from_pretrained(model, str(tmp_path / "peft")).eval()
        ours = minigpt.load(tuned).model(ids)[0]
        assert (adapted(ids).logits - ours).abs().max() < 1e-12
        assert (ours - minigpt.load(run).model(ids)[0]).abs().max() > 1e-3  # the adapter acts


@pytest.mark.parametrize("run, key", [(REPO / "data" / "lesson09", "[model] norm = 'rmsnorm'")])
def test_what_gpt2_cannot_express_is_refused_naming_the_key(cli, tmp_path, run, key):
    result = cli("export", "--run", run, "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert f"--format hf cannot express {key}" in result.stderr
    assert not (tmp_path / "hf").exists()


def test_post_norm_and_swiglu_are_refused_too():
    from minigpt.interchange.export import gpt2_refusal

    base = dict(context=4, n_layer=1, n_head=1, n_embd=4, ffn_hidden=8)
    assert "norm_position = 'post'" in gpt2_refusal(MiniGPT(ModelConfig(**base, norm_position="post"), 5))
    assert "activation = 'swiglu'" in gpt2_refusal(MiniGPT(ModelConfig(**base, activation="swiglu"), 5))
    assert gpt2_refusal(MiniGPT(ModelConfig(**base), 5)) is None


@pytest.mark.parametrize("activation, written", [("gelu", "gelu"), ("gelu_tanh", "gelu_new"), ("relu", "relu")])
def test_each_gelu_is_exported_under_transformers_name_for_it(tmp_path, activation, written):
    """transformers' "gelu" is the exact GELU and "gelu_new" GPT-2's tanh approximation: the folder
    names the one minigpt computed, so transformers computes the same logits."""
    transformers = need("transformers")
    need("safetensors")
    from minigpt.interchange.export import export_hf
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefgh"))
    torch.manual_seed(0)
    cfg = ModelConfig(context=6, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, activation=activation)
    model = MiniGPT(cfg, tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # large enough that the two GELUs differ in the logits
    export_hf(model, tokenizer, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] == written
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.tensor([[0, 3, 1, 7, 2, 5]])
    with torch.no_grad():
        assert (theirs(ids).logits - model(ids)[0]).abs().max() <= 1e-5


def test_an_existing_output_folder_and_an_unknown_format_are_refused(trained, cli, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    result = cli("export", "--run", trained, "--format", "hf", "--out", tmp_path / "full")
    assert result.exit_code == 2 and "already exists and is not an empty folder" in result.stderr
    result = cli("export", "--run", trained, "--format", "onnx", "--out", tmp_path / "x")
    assert result.exit_code == 2 and "--format 'onnx' is not one of: safetensors, hf" in result.stderr


def test_without_the_extra_the_command_says_what_to_install(trained, cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # as if it were not installed
    result = cli("export", "--run", trained, "--format", "safetensors", "--out", tmp_path / "st")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert 'pip install "minigpt[export]"' in result.stderr
