"""`minigpt export --format hf` of a model the Llama family computes (rope positions, RMSNorm, SwiGLU;
grouped-query heads, other head widths, per-part biases, a window, rope scaling) writes a Llama,
Qwen2 or Mistral folder that transformers loads and computes minigpt's logits from; an imported
folder comes back as the same architecture with the same config; `--format peft` of a LoRA run on
such a model writes adapters PEFT loads onto the folder (the one the base was imported from, or the
one `--format hf` writes of it); what GPT-2 or no family can express is refused naming the key."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from conftest import REPO, SHAKESPEARE, TINY_CONFIG, lazy_module, need, train_tiny_run
from test_import_llama import float64_exact  # noqa: F401 (a fixture: transformers' float32 casts patched out)

import minigpt
from minigpt.config import ModelConfig
from minigpt.errors import MinigptError
from minigpt.model.gpt import MiniGPT

transformers = lazy_module("transformers")
safetensors = lazy_module("safetensors.torch")

IDS = [[3, 1, 4, 1, 5, 9, 2, 6]]
LLAMA_BLOCK = ['model.positions="rope"', 'model.norm="rmsnorm"', 'model.activation="swiglu"', "model.bias=false"]
# family -> the [model] settings of a minigpt-trained run written as that family
TRAINED = {
    "llama": ["model.n_kv_head=1", "model.head_width=6"],  # GQA, heads narrower than n_embd / n_head
    "qwen2": ["model.qkv_bias=true", "model.tie_embeddings=true"],
    "mistral": ["model.sliding_window=8", "model.n_kv_head=1"],
}


def random_hf_folder():
    spec = importlib.util.spec_from_file_location("random_hf_folder", REPO / "scripts" / "random_hf_folder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overrides(settings: list[str]) -> list[str]:
    return [arg for setting in settings for arg in ("--set", setting)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run of each family's shape, trained a few steps by minigpt (float32)."""
    runs = {}
    for family, settings in TRAINED.items():
        folder = tmp_path_factory.mktemp(family)
        runs[family] = train_tiny_run(folder, *overrides([*LLAMA_BLOCK, *settings, "model.n_layer=2", "train.steps=4"]))
    return runs


def lora_tune(base, out, **settings):
    """A LoRA fine-tune of the run `base` into `out`: rank 2, 4 steps at a learning rate large enough
    that the adapters change the logits; `settings`: more [train] keys."""
    train = {"train.lora_rank": 2, "train.learning_rate": 0.05, **settings}
    minigpt.train(config=base / "config.toml", init_from=base, out=out, steps=4, set=train, progress=False)
    return out


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        output = model(torch.tensor(ids))
    return (output.logits if hasattr(output, "logits") else output[0])[0]


# ---------------------------------------------------------------- a minigpt-trained run


@pytest.mark.parametrize("family", TRAINED)
def test_a_trained_run_exports_as_its_family_and_transformers_computes_its_logits(trained, cli, tmp_path, family):
    out = tmp_path / "hf"
    result = cli("export", "--run", trained[family], "--format", "hf", "--out", out)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    architecture = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
    assert config["model_type"] == family and config["architectures"] == [architecture[family]]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(model).__name__ == architecture[family]
    run = minigpt.load(trained[family])
    assert (logits(model) - logits(run.model)).abs().max() < 1e-5
    tensors = safetensors.load_file(str(out / "model.safetensors"))
    if family == "llama":
        assert config["num_key_value_heads"] == 1 and config["head_dim"] == 6 and not config["attention_bias"]
        assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (12, 16)  # 2 query heads of 6
        assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (6, 16)  # 1 key head
        assert tensors["model.layers.1.mlp.gate_proj.weight"].shape == (32, 16)
    if family == "qwen2":  # tied: the head is the token table, stored once as transformers stores it
        assert "lm_head.weight" not in tensors and config["tie_word_embeddings"]
        assert (
            "model.layers.0.self_attn.q_proj.bias" in tensors and "model.layers.0.self_attn.o_proj.bias" not in tensors
        )
    if family == "mistral":
        assert config["sliding_window"] == 8
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(out))
    assert tokenizer("ROMEO:")["input_ids"] == run.tokenizer.encode("ROMEO:")


def test_a_lora_run_on_a_trained_llama_shaped_run_loads_in_peft_onto_its_bases_folder(trained, cli, tmp_path):
    peft = need("peft")
    base = trained["llama"]
    tuned = lora_tune(base, tmp_path / "lora", **{"train.lora_targets": "qkv,W1,W2"})
    assert cli("export", "--run", base, "--format", "hf", "--out", tmp_path / "base-hf").exit_code == 0
    result = cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    assert config["base_model_name_or_path"] == str(base.resolve()) and not config["fan_in_fan_out"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base-hf")).eval()
    adapted = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    ours = logits(minigpt.load(tuned).model)
    assert (ours - logits(adapted)).abs().max() < 1e-5
    assert (ours - logits(minigpt.load(base).model)).abs().max() > 1e-3  # the adapter changed something
    # --format hf of the LoRA run: the merged model, as the same family
    assert cli("export", "--run", tuned, "--format", "hf", "--out", tmp_path / "merged").exit_code == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).eval()
    assert (logits(merged) - ours).abs().max() < 1e-5


# ---------------------------------------------------------------- an imported folder, round trip

ROUND_TRIPS = {
    "llama-gqa-llama3": dict(
        family="llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "llama-biased-yarn": dict(
        family="llama",
        attention_bias=True,
        mlp_bias=True,
        head_dim=12,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 16.0},
    ),
    "llama-dynamic": dict(family="llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "qwen2-tied": dict(family="qwen2", tie=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mistral-window": dict(family="mistral", sliding_window=16),
}


@pytest.mark.parametrize("shape", ROUND_TRIPS)
def test_an_imported_folder_exports_back_as_the_same_architecture(cli, tmp_path, shape):
    folder = random_hf_folder().make_folder(tmp_path / "folder", std=0.2, **ROUND_TRIPS[shape])
    assert cli("import", "hf", folder, "--out", tmp_path / "run").exit_code == 0
    result = cli("export", "--run", tmp_path / "run", "--format", "hf", "--out", tmp_path / "back")
    assert result.exit_code == 0, result.output
    original = json.loads((folder / "config.json").read_text())
    back = json.loads((tmp_path / "back" / "config.json").read_text())
    unwritten = {"transformers_version", "bos_token_id", "eos_token_id"}  # ids of the tokenizer, not the model
    assert {k: v for k, v in original.items() if k not in unwritten} == {
        k: v for k, v in back.items() if k in original and k not in unwritten
    }
    # Qwen2's config has no head_dim (written for narrow heads only); the other three are what 4.x reads
    assert set(back) - set(original) - {"head_dim"} == {"rope_theta", "rope_scaling", "torch_dtype"}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    exported = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert type(exported) is type(theirs)
    ids = [list(range(7, 300, 19))[:16]]  # 16 positions: past llama3's and yarn's original 16, within the window
    assert (logits(theirs, ids) - logits(exported, ids)).abs().max() < 1e-5
    original_tensors = safetensors.load_file(str(folder / "model.safetensors"))
    back_tensors = safetensors.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert set(original_tensors) == set(back_tensors)
    assert all(torch.equal(original_tensors[name], back_tensors[name]) for name in original_tensors)
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "back"))
    text = "ROMEO: Ωmega ∑ 🦙, là-bas 日本"
    assert (
        tokenizer(text)["input_ids"]
        == transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))(text)["input_ids"]
    )


def test_a_lora_fine_tune_of_an_imported_folder_loads_in_peft_onto_that_folder(cli, tmp_path):
    peft = need("peft")
    folder = random_hf_folder().make_folder(tmp_path / "folder", "llama", std=0.2, max_pos=16, attention_bias=True)
    assert cli("import", "hf", folder, "--out", tmp_path / "run").exit_code == 0
    (tmp_path / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:4_000], encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG[TINY_CONFIG.index("[train]") :], encoding="utf-8")
    tuned = tmp_path / "lora"
    minigpt.train(
        config=tmp_path / "tiny.toml",
        init_from=tmp_path / "run",
        out=tuned,
        steps=3,
        set={"train.lora_rank": 2, "train.learning_rate": 0.05},
        progress=False,
    )
    result = cli("export", "--run", tuned, "--format", "peft", "--out", tmp_path / "adapter")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(folder.resolve()) and config["r"] == 2
    assert config["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    base = transformers.AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]).eval()
    adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ids = [list(range(5, 300, 23))[:12]]
    ours = logits(minigpt.load(tuned).model, ids)
    assert (ours - logits(adapted, ids)).abs().max() < 1e-5
    assert (ours - logits(minigpt.load(tmp_path / "run").model, ids)).abs().max() > 1e-4


# ---------------------------------------------------------------- float64


@pytest.fixture(scope="module")
def float64_runs(tmp_path_factory):
    """Llama-shaped float64 runs trained by minigpt: rope's angles in float64 ([model] rope_angles =
    "dtype", a trained run's default) and in float32 (transformers' arithmetic), and a LoRA
    fine-tune of the latter."""
    runs = {}
    for angles in ("dtype", "float32"):
        settings = [*LLAMA_BLOCK, 'model.dtype="float64"', f'model.rope_angles="{angles}"', "model.n_kv_head=1"]
        runs[angles] = train_tiny_run(tmp_path_factory.mktemp(angles), *overrides([*settings, "train.steps=4"]))
    runs["lora"] = lora_tune(runs["float32"], tmp_path_factory.mktemp("lora") / "run")
    return runs


def exported_float64(cli, run, format: str, out) -> tuple[dict[str, torch.Tensor], str]:
    """`minigpt export` of a float64 run: its tensors, every one float64 (nothing narrowed), and its
    note on stderr (one line)."""
    result = cli("export", "--run", run, "--format", format, "--out", out)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("minigpt: note: transformers computes RMSNorm")
    weights = "model.safetensors" if format == "hf" else "adapter_model.safetensors"
    tensors = safetensors.load_file(str(out / weights))
    assert {tensor.dtype for tensor in tensors.values()} == {torch.float64}
    return tensors, result.stderr


def test_a_float64_run_exports_float64_and_says_what_transformers_computes_in_float32(float64_runs, cli, tmp_path):
    """transformers' Llama casts RMSNorm's input to float32, and computes rope's angles in float32:
    the export keeps the float64 weights and says so, and the logits differ by float32 rounding."""
    _, note = exported_float64(cli, float64_runs["dtype"], "hf", tmp_path / "hf")
    assert "and rope's angles (this run computes them in float64)" in note and "not float64's" in note
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float64"  # transformers 5's key, and 4.x's
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()  # 5.x: dtype "auto"
    assert model.dtype == torch.float64
    difference = (logits(model) - logits(minigpt.load(float64_runs["dtype"]).model)).abs().max()
    assert 1e-12 < difference < 1e-6  # float32's rounding, as the note says: not float64's


@pytest.mark.usefixtures("float64_exact")
def test_a_float64_run_and_its_lora_adapter_give_minigpt_s_logits_within_float64_rounding(float64_runs, cli, tmp_path):
    """With transformers' float32 casts patched out (float64_exact) and rope's angles in float32 on
    both sides, the exported float64 folder, and PEFT's adapter on it, give minigpt's logits within
    float64 rounding: nothing on the way out was narrowed."""
    _, note = exported_float64(cli, float64_runs["float32"], "hf", tmp_path / "hf")
    assert "rope's angles" not in note
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert (logits(model) - logits(minigpt.load(float64_runs["float32"]).model)).abs().max() < 1e-12
    exported_float64(cli, float64_runs["lora"], "peft", tmp_path / "adapter")
    adapted = need("peft").PeftModel.from_pretrained(model, str(tmp_path / "adapter")).eval()
    ours = logits(minigpt.load(float64_runs["lora"]).model)
    assert (ours - logits(adapted)).abs().max() < 1e-12
    assert (ours - logits(minigpt.load(float64_runs["float32"]).model)).abs().max() > 1e-3  # the adapter acts


# ---------------------------------------------------------------- refusals

TINY = dict(context=4, n_layer=1, n_head=2, n_embd=8, ffn_hidden=8, bias=False)
ROPE = dict(positions="rope", norm="rmsnorm", activation="swiglu")


@pytest.mark.parametrize(
    "settings, imported, refusal",
    [
        (
            dict(n_kv_head=1),
            None,
            "[model] n_kv_head = 1: GPT-2 has a key and value head per query head; a Llama-family",
        ),
        (dict(head_width=3), None, "[model] head_width = 3: GPT-2's 2 heads split n_embd = 8 evenly; a Llama-family"),
        (
            dict(norm="rmsnorm"),
            None,
            "[model] norm = 'rmsnorm': GPT-2 has LayerNorm only; a Llama-family folder holds",
        ),
        (dict(**ROPE, qkv_bias=True, ffn_bias=True), None, "[model] qkv_bias = true with out_bias = false: Llama "),
        (dict(**ROPE, out_bias=True), None, "[model] out_bias = true with qkv_bias = false: Llama biases W_Q, W_K"),
        (dict(**ROPE, sliding_window=2, ffn_bias=True), None, "[model] ffn_bias = true: Mistral, the family with a"),
        (dict(**ROPE, sliding_window=2, qkv_bias=True), None, "[model] sliding_window = 2: Qwen2 attends to every"),
        (dict(**ROPE, norm_position="post"), None, "[model] norm_position = 'post': Llama is pre-norm"),
        (dict(**ROPE), {"kind": "hf-qwen2"}, "[model] qkv_bias = false: Qwen2 biases W_Q, W_K and W_V, and nothing"),
    ],
)
def test_what_the_chosen_family_cannot_express_is_refused_naming_the_key(tmp_path, settings, imported, refusal):
    from minigpt.interchange.export import export_hf
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    model = MiniGPT(ModelConfig(**{**TINY, **settings}), 5)
    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcde"))
    with pytest.raises(MinigptError) as refused:
        export_hf(model, tokenizer, tmp_path / "hf", imported)
    assert f"--format hf cannot express {refusal}" in refused.value.for_command_line
    assert not (tmp_path / "hf").exists()


def test_a_gqa_run_with_learned_positions_is_refused_by_the_cli_in_one_line(cli, tmp_path):
    run = train_tiny_run(tmp_path, "--set", "model.n_kv_head=1", "--set", "train.steps=2")
    result = cli("export", "--run", run, "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and not (tmp_path / "hf").exists()
    assert "--format hf cannot express [model] n_kv_head = 1: GPT-2 has a key and value head per query head" in (
        result.stderr
    )


def test_gpt2_holds_biases_on_some_parts_only_as_zeros_on_the_others(tmp_path):
    """Per-part biases need no refusal in a GPT-2 folder: the parts without one get zeros."""
    from minigpt.interchange.export import export_hf
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    tokenizer = TextTokenizer(train_tokenizer("char", 0, "abcdefgh"))
    torch.manual_seed(0)
    cfg = ModelConfig(context=6, n_layer=2, n_head=2, n_embd=8, ffn_hidden=16, activation="gelu", bias=False)
    model = MiniGPT(ModelConfig(**{**vars(cfg), "qkv_bias": True}), tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    export_hf(model, tokenizer, tmp_path / "hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    ids = [[0, 3, 1, 7, 2, 5]]
    assert (logits(theirs, ids) - logits(model, ids)).abs().max() < 1e-5
