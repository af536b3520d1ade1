"""rope on a share of each head ([model] rope_fraction, transformers' partial_rotary_factor) through
`minigpt import hf` and `minigpt export --format hf`: Phi-3 (Phi3ForCausalLM) is the family that
carries it with the block minigpt computes (RMSNorm, SwiGLU, rope, grouped-query heads, no biases;
its apply_rotary_pos_emb turns the first int(head_dim x partial_rotary_factor) coordinates of a
head in the half-split layout and passes the rest, as minigpt's Rotary does). A random-weight
folder transformers writes itself imports with its partial_rotary_factor as rope_fraction and
agrees with transformers stage by stage; a minigpt model with rope_fraction < 1 exports as Phi-3
and transformers computes its logits; an imported folder comes back with the same config and
tensors; what neither side computes is refused in one line naming the key. Llama, Mistral and
Qwen2 rotate every coordinate whatever partial_rotary_factor says, so they still refuse one."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from conftest import lazy_module, need, refused, train_tiny_run
from hf_folders import random_hf_folder
from test_import_llama import STD, assert_agrees, edited, imported, tokens, transformers_model

import minigpt
from minigpt.config import ModelConfig
from minigpt.model.gpt import MiniGPT

transformers = lazy_module("transformers")
safetensors_torch = lazy_module("safetensors.torch")

LLAMA_BLOCK = ['model.positions="rope"', 'model.norm="rmsnorm"', 'model.activation="swiglu"', "model.bias=false"]
# name -> phi3_folder's settings: each a share of heads of another width, the config shape of another transformers
FOLDERS = {
    "half, grouped-query": dict(partial=0.5),  # heads 8 wide: 4 coordinates turn
    "quarter, wide heads, tied, window": dict(partial=0.25, head_dim=16, tie=True, window=32),  # 4 of 16
    "phi-4-mini's 0.75, beside rope_theta": dict(partial=0.75, heads=3, kv_heads=1, shape="legacy"),  # 12 of 16
}


@pytest.fixture(scope="module")
def script():
    """scripts/random_hf_folder.py, its tokenizer (SmolLM's shape, 300 ids) fitted once for every folder."""
    module = random_hf_folder()
    module.folder_tokenizer = functools.cache(module.folder_tokenizer)
    return module


def phi3_folder(
    path: Path, script, *, partial: float, window: int | None = None, shape: str = "v5", **settings
) -> Path:
    """A Phi3ForCausalLM folder at `path`, written by random_hf_folder's make_folder (2 blocks of
    width 48, 300 ids, 64 positions; `settings`: its heads, kv_heads, head_dim, tie), weights N(0,
    STD) and gains 1 + N(0, STD) as the Llama tests' folders. shape "legacy": config.json as Phi-3
    and Phi-4-mini ship it, rope_theta and partial_rotary_factor beside a null rope_scaling instead
    of 5.x's rope_parameters."""
    return script.make_folder(
        path, "phi3", std=STD, partial_rotary_factor=partial, sliding_window=window, config_shape=shape, **settings
    )


def overrides(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output = model(ids)
    return output.logits if hasattr(output, "logits") else output[0]


# ---------------------------------------------------------------- import


@pytest.mark.parametrize("name", FOLDERS)
def test_a_phi3_folder_imports_its_share_of_each_head_and_agrees_with_transformers(script, tmp_path, name):
    settings = FOLDERS[name]
    folder = phi3_folder(tmp_path / "folder", script, **settings)
    run = imported(folder, tmp_path / "run")
    cfg = run.model.cfg
    width = settings.get("head_dim", 48 // settings.get("heads", 6))
    assert (cfg.rope_fraction, cfg.rotary_width) == (settings["partial"], int(width * settings["partial"]))
    assert (cfg.norm, cfg.activation, cfg.positions, cfg.bias) == ("rmsnorm", "swiglu", "rope", False)
    assert cfg.kv_heads == settings.get("kv_heads", 2) and cfg.sliding_window == (settings.get("window") or 0)
    assert json.loads((tmp_path / "run" / "origin.json").read_text())["architecture"] == "Phi3ForCausalLM"
    assert_agrees(run, transformers_model(folder), tokens(24), 1e-5)


def test_rotating_a_share_is_not_rotating_the_whole_head(script, tmp_path):
    """The check has teeth: the same folder read as if every coordinate turned differs from transformers."""
    folder = phi3_folder(tmp_path / "folder", script, partial=0.5)
    run = imported(folder, tmp_path / "run")
    ids = tokens(16)
    theirs = logits(transformers_model(folder), ids)
    assert (logits(run.model, ids) - theirs).abs().max() < 1e-4
    whole = MiniGPT(ModelConfig(**{**vars(run.model.cfg), "rope_fraction": 1.0}), run.model.vocab_size).eval()
    whole.load_state_dict(run.model.state_dict())
    assert (logits(whole, ids) - theirs).abs().max() > 1e-2


# ---------------------------------------------------------------- export


def test_a_model_rotating_a_quarter_of_each_head_exports_as_phi3_and_transformers_computes_its_logits(tmp_path):
    from minigpt.interchange.export import export_hf
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefghijkl"))
    settings = dict(context=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48, bias=False)
    cfg = ModelConfig(**settings, positions="rope", norm="rmsnorm", activation="swiglu", rope_fraction=0.25)
    torch.manual_seed(0)
    model = MiniGPT(cfg, tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    export_hf(model, tokenizer, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "phi3" and config["architectures"] == ["Phi3ForCausalLM"]
    assert config["partial_rotary_factor"] == config["rope_parameters"]["partial_rotary_factor"] == 0.25
    tensors = safetensors_torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.qkv_proj.weight"].shape == (32 + 2 * 16, 32)  # minigpt's qkv, whole
    assert torch.equal(tensors["model.layers.1.mlp.gate_up_proj.weight"], model.state_dict()["blocks.1.ffn.W1.weight"])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert type(theirs).__name__ == "Phi3ForCausalLM" and theirs.model.rotary_emb.inv_freq.shape == (1,)  # 2 of 8
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]])
    assert (logits(theirs, ids) - logits(model, ids)).abs().max() < 1e-5


def test_a_trained_rope_fraction_run_exports_as_phi3_through_the_cli(cli, tmp_path):
    run = train_tiny_run(tmp_path, *overrides([*LLAMA_BLOCK, "model.rope_fraction=0.25"]))
    result = cli("export", "--run", run, "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "phi3" and config["rope_parameters"]["partial_rotary_factor"] == 0.25
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])  # tiny.toml's heads are 8 wide: 2 coordinates turn
    assert (logits(theirs, ids) - logits(minigpt.load(run).model, ids)).abs().max() < 1e-5


def test_a_lora_run_rotating_a_quarter_exports_adapters_peft_loads_onto_its_phi3_folder(cli, tmp_path):
    """Phi-3 stacks W_Q, W_K, W_V and the gate and up projections as minigpt does: each adapter is
    PEFT's for qkv_proj or gate_up_proj whole, and PEFT on the exported folder computes minigpt's logits."""
    peft = need("peft")
    base = train_tiny_run(tmp_path, *overrides([*LLAMA_BLOCK, "model.rope_fraction=0.25", "train.steps=4"]))
    train = {"train.lora_rank": 2, "train.learning_rate": 0.05, "train.lora_targets": "qkv,out,W1,W2"}
    tuned = tmp_path / "lora"
    minigpt.train(config=base / "config.toml", init_from=base, out=tuned, steps=4, set=train, progress=False)
    assert cli("export", "--run", base, "--format", "hf", "--out", tmp_path / "base-hf").exit_code == 0
    result = cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base-hf")).eval()
    adapted = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    ours = logits(minigpt.load(tuned).model, ids)
    assert (ours - logits(adapted, ids)).abs().max() < 1e-5
    assert (ours - logits(minigpt.load(base).model, ids)).abs().max() > 1e-3  # the adapter changed something


def test_an_imported_phi3_folder_exports_back_with_the_same_config_and_tensors(script, cli, tmp_path):
    folder = phi3_folder(tmp_path / "folder", script, partial=0.5, head_dim=12, window=48)
    assert cli("import", "hf", folder, "--out", tmp_path / "run").exit_code == 0
    result = cli("export", "--run", tmp_path / "run", "--format", "hf", "--out", tmp_path / "back")
    assert result.exit_code == 0, result.output
    original = json.loads((folder / "config.json").read_text())
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    unwritten = {"transformers_version", "bos_token_id", "eos_token_id"}  # the tokenizer's ids, not the model's
    unwritten |= {"original_max_position_embeddings", "resid_pdrop", "embd_pdrop"}  # longrope's; training's
    assert {k: v for k, v in original.items() if k not in unwritten} == {
        k: v for k, v in back.items() if k in original and k not in unwritten
    }
    assert back["partial_rotary_factor"] == 0.5 and back["sliding_window"] == 48 and back["head_dim"] == 12
    original_tensors = safetensors_torch.load_file(str(folder / "model.safetensors"))
    back_tensors = safetensors_torch.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(original_tensors) == set(back_tensors)
    assert all(torch.equal(original_tensors[name], back_tensors[name]) for name in original_tensors)
    ids = tokens(24)
    theirs = transformers_model(folder)
    exported = transformers_model(tmp_path / "back")
    assert (logits(theirs, ids) - logits(exported, ids)).abs().max() < 1e-5


# ---------------------------------------------------------------- refusals: one line naming the key


@pytest.fixture(scope="module")
def phi3_source(script, tmp_path_factory) -> Path:
    return phi3_folder(tmp_path_factory.mktemp("phi3") / "folder", script, partial=0.5)


@pytest.fixture(scope="module")
def llama_source(script, tmp_path_factory) -> Path:
    return script.make_folder(tmp_path_factory.mktemp("llama") / "folder", "llama", std=STD)


PHI3_REFUSALS = [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, 'rope_parameters.rope_type = "longrope"'),
    (
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        'rope_type = "linear": minigpt computes the rope types default only in Phi3ForCausalLM',
    ),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.375}},
        "partial_rotary_factor = 0.375: it rotates 3 of each head's 8 coordinates",
    ),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.5}},
        "partial_rotary_factor = 1.5: the share of each head rope rotates is a number in (0, 1]",
    ),
    ({"hidden_act": "gelu"}, 'hidden_act = "gelu"'),
    ({"num_local_experts": 16}, "num_local_experts = 16"),
    ({"architectures": ["Phi3ForTokenClassification"]}, "minigpt imports the language model Phi3ForCausalLM"),
]


@pytest.mark.parametrize("changes, named", PHI3_REFUSALS, ids=[named for _, named in PHI3_REFUSALS])
def test_what_minigpt_does_not_compute_of_phi3_is_refused_naming_the_key(phi3_source, cli, tmp_path, changes, named):
    folder = edited(phi3_source, tmp_path / "folder", **changes)
    line = refused(cli, "import", "hf", folder, "--out", tmp_path / "run")
    assert named in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_a_llama_mistral_or_qwen2_folder_with_partial_rotary_factor_is_refused_pointing_at_phi3(
    llama_source, cli, tmp_path, model_type
):
    """transformers' Llama, Mistral and Qwen2 rotate every coordinate whatever the key says (their
    compute_default_rope_parameters read head_dim whole): minigpt refuses rather than guess."""
    changes = {"model_type": model_type, "architectures": None, "partial_rotary_factor": 0.5}
    folder = edited(llama_source, tmp_path / "folder", **changes)
    line = refused(cli, "import", "hf", folder, "--out", tmp_path / "run")
    assert "partial_rotary_factor = 0.5: transformers' " in line and "rotates every dimension of a head" in line
    assert 'Phi3ForCausalLM (model_type "phi3") rotates a share of each head' in line


@pytest.fixture(scope="module")
def quarter_runs(tmp_path_factory) -> dict[str, Path]:
    """Runs with rope on a quarter of each head that Phi-3 cannot hold (initial weights: train --steps 0)."""
    settings = {
        "qkv_bias": ["model.qkv_bias=true"],
        "ffn_bias": ["model.ffn_bias=true"],
        "rope_scaling": ['model.rope_scaling="linear:2.0"'],
    }
    runs = {}
    for name, extra in settings.items():
        sets = [*LLAMA_BLOCK, "model.rope_fraction=0.25", *extra]
        runs[name] = train_tiny_run(tmp_path_factory.mktemp(name), "--steps", "0", *overrides(sets))
    return runs


@pytest.mark.parametrize(
    "name, refusal",
    [
        ("qkv_bias", "[model] qkv_bias = true: Phi-3, the family that rotates a share of each head, has no biases"),
        ("ffn_bias", "[model] ffn_bias = true: Phi-3, the family that rotates a share of each head, has no biases"),
        ("rope_scaling", "[model] rope_scaling = 'linear:2.0': Phi-3 reads no linear rope rule"),
    ],
)
def test_what_phi3_cannot_express_is_refused_by_the_export_in_one_line(quarter_runs, cli, tmp_path, name, refusal):
    line = refused(cli, "export", "--run", quarter_runs[name], "--format", "hf", "--out", tmp_path / "hf")
    assert f"--format hf cannot express {refusal}" in line
    assert not (tmp_path / "hf").exists()


def test_a_run_of_an_imported_llama_keeps_its_family_and_refuses_rope_fraction_pointing_at_phi3(tmp_path):
    from minigpt.errors import MinigptError
    from minigpt.interchange.export import export_hf
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    cfg = ModelConfig(
        context=4, n_layer=1, n_head=2, n_embd=16, ffn_hidden=8, bias=False, positions="rope", norm="rmsnorm"
    )
    model = MiniGPT(ModelConfig(**{**vars(cfg), "activation": "swiglu", "rope_fraction": 0.25}), 5)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcde"))
    with pytest.raises(MinigptError) as refusal:
        export_hf(model, tokenizer, tmp_path / "hf", {"kind": "hf-llama"})
    assert (
        "[model] rope_fraction = 0.25: Llama rotates every coordinate of a head; Phi-3 (partial_rotary_factor) "
        "rotates a share of each" in refusal.value.for_command_line
    )
    assert not (tmp_path / "hf").exists()
