"""LoRA runs and PEFT: `export --format peft` writes the adapter as PEFT saves one, and PEFT loads it
onto the GPT-2 folder `export --format hf` writes of the base, computing minigpt's logits;
`export --format hf` of a LoRA run writes the merged model; `import hf DIR --adapter ADAPTER`
brings a PEFT adapter back, merged; what minigpt does not compute is refused naming the key."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import lazy_module, train_tiny_run

import minigpt

transformers = lazy_module("transformers")
peft = lazy_module("peft")

IDS = [[3, 1, 4, 1, 5, 9, 2, 6]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A GPT-2-shaped tiny base (tanh GELU, biases, pre-norm LayerNorm) and a LoRA fine-tune of it."""
    folder = tmp_path_factory.mktemp("peft")
    base = train_tiny_run(folder, "--set", 'model.activation="gelu_tanh"', "--set", "model.n_layer=2")
    tuned = folder / "lora"
    minigpt.train(
        config=base / "config.toml",
        init_from=base,
        out=tuned,
        steps=6,
        set={"train.lora_rank": 2, "train.learning_rate": 0.05, "train.lora_targets": "qkv,out,W2"},
        progress=False,
    )
    return base, tuned


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(IDS))[0]


def test_peft_loads_the_adapter_onto_the_base_folder_and_computes_minigpts_logits(runs, cli, tmp_path):
    base, tuned = runs
    assert cli("export", "--run", base, "--format", "hf", "--out", tmp_path / "base-hf").exit_code == 0
    result = cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_proj"]
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "base-hf")).eval()
    adapted = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    ours = logits_of(minigpt.load(tuned).model)
    theirs = adapted(torch.tensor(IDS)).logits[0]
    assert (ours - theirs).abs().max() < 1e-5
    assert (ours - logits_of(minigpt.load(base).model)).abs().max() > 1e-3  # the adapter changed something


def test_hf_export_of_a_lora_run_is_the_merged_model(runs, cli, tmp_path):
    _, tuned = runs
    assert cli("export", "--run", tuned, "--format", "hf", "--out", tmp_path / "merged").exit_code == 0
    merged = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "merged")).eval()
    assert (logits_of(minigpt.load(tuned).model) - merged(torch.tensor(IDS)).logits[0]).abs().max() < 1e-5


def test_a_peft_adapter_imports_merged_onto_its_gpt2_folder(runs, cli, tmp_path):
    base, tuned = runs
    cli("export", "--run", base, "--format", "hf", "--out", tmp_path / "base-hf")
    cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    result = cli("import", "hf", tmp_path / "base-hf", "--adapter", tmp_path / "adapter", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    imported = minigpt.load(tmp_path / "run")
    assert (logits_of(imported.model) - logits_of(minigpt.load(tuned).model)).abs().max() < 1e-5
    assert json.loads((tmp_path / "run" / "origin.json").read_text())["adapter"] == str(tmp_path / "adapter")


@pytest.mark.parametrize("key, value", [("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"])])
def test_an_adapter_minigpt_does_not_compute_is_refused_naming_the_key(runs, cli, tmp_path, key, value):
    base, tuned = runs
    cli("export", "--run", base, "--format", "hf", "--out", tmp_path / "base-hf")
    cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    path = tmp_path / "adapter" / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    result = cli("import", "hf", tmp_path / "base-hf", "--adapter", tmp_path / "adapter", "--out", tmp_path / "run")
    assert result.exit_code == 2 and f"{key} = {value!r}" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_peft_export_of_a_run_without_adapters_is_refused(runs, cli, tmp_path):
    base, _ = runs
    result = cli("export", "--run", base, "--format", "peft", "--out", tmp_path / "adapter")
    assert result.exit_code == 2 and "is not a LoRA run" in result.stderr
