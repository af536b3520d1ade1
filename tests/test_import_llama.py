"""`minigpt import hf` of Llama-family folders (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM),
checked against transformers' own model on the same folder: every stage of the trace (each block's
norm1, attention, residual1, norm2, hidden, ffn and output, the final norm, the logits: each within
1e-5 of its largest magnitude) and the next-token probabilities (within 1e-5) in float32, 1e-10 in
float64, at positions inside and past the original training length where a rope scaling rule
defines them; rope's inverse
frequencies bit for bit against transformers' ROPE_INIT_FUNCTIONS; and every refusal one line
naming the key. The folders are random-weight ones transformers itself writes
(scripts/random_hf_folder.py), tiny, nothing downloaded.

In float64, transformers' model still computes two things in float32: LlamaRMSNorm (and Mistral's
and Qwen2's copies) casts its input to float32, and eager attention's softmax takes
dtype=float32. The float64 comparison patches those two casts out of transformers (`float64_exact`)
so that both sides compute in float64; rope's angles stay float32 on both sides (transformers
computes them so; an imported model's [model] rope_angles = "float32").
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import lazy_module, refused
from hf_folders import random_hf_folder

import minigpt
from minigpt.api import import_hf
from minigpt.interchange.llama_layout import ACTIVATION, ARCHITECTURES, CONFIG_KEYS, DEFAULT_THETA, DEFAULTS, VOCAB_SIZE
from minigpt.model.cache import KVCache, LayerCache
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.model.positions import inverse_frequencies, parse_rope_scaling
from minigpt.model.recorder import Recorder

transformers = lazy_module("transformers")
safetensors_torch = lazy_module("safetensors.torch")
rope_utils = lazy_module("transformers.modeling_rope_utils")

REPO = Path(__file__).resolve().parents[1]
STD = 0.3  # random weights large enough that every stage, and the next-token distribution, is far from trivial
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
ORIGINAL = 16  # the rope rules' original_max_position_embeddings; max_position_embeddings is 64
RULES = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.8,
        "mscale_all_dim": 0.5,
        "beta_fast": 16.0,
        "truncate": False,
    },
    "llama3": {**LLAMA3, "original_max_position_embeddings": ORIGINAL},
}


@pytest.fixture(scope="module")
def make(tmp_path_factory):
    """make(name, family, **make_folder's settings) -> a folder, written once per module."""
    script = random_hf_folder()
    script.folder_tokenizer = functools.cache(script.folder_tokenizer)  # fitted once (a second each), not per folder
    made: dict[str, Path] = {}

    def folder(name: str, family: str = "llama", **settings) -> Path:
        if name not in made:
            path = tmp_path_factory.mktemp("hf") / name
            made[name] = script.make_folder(path, family, std=STD, **settings)
        return made[name]

    return folder


def imported(folder: Path, out: Path) -> minigpt.Run:
    import_hf(folder, out, progress=False)
    return minigpt.load(out)


def transformers_model(folder: Path, dtype: torch.dtype = torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()


def transformers_stages(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What transformers' model computes at each of minigpt's stage names, read with forward hooks."""
    stages: dict[str, torch.Tensor] = {}

    def keep(name: str, what: str = "output"):
        def hook(module, args, output):
            value = args[0] if what == "input" else output[0] if isinstance(output, tuple) else output
            stages[name] = value.detach().clone()

        return hook

    inner = model.model
    modules = [(inner.embed_tokens, "input", "output"), (inner.norm, "final_norm", "output")]
    for i, layer in enumerate(inner.layers):
        block = f"blocks.{i}."
        modules += [
            (layer.input_layernorm, block + "norm1", "output"),
            (layer.self_attn, block + "attention", "output"),
            (layer.post_attention_layernorm, block + "residual1", "input"),
            (layer.post_attention_layernorm, block + "norm2", "output"),
            (layer.mlp.down_proj, block + "hidden", "input"),  # silu(gate) * up
            (layer.mlp, block + "ffn", "output"),
            (layer, block + "output", "output"),
        ]
    hooks = [module.register_forward_hook(keep(name, what)) for module, name, what in modules]
    try:
        with torch.no_grad():
            stages["logits"] = model(ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    return stages


def minigpt_stages(run: minigpt.Run, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    recorder = Recorder(run.model.cfg)
    with torch.no_grad():
        run.model(ids, recorder=recorder)
    return recorder.stages


def assert_agrees(run: minigpt.Run, model, ids: torch.Tensor, tolerance: float) -> None:
    """Every stage transformers computes within `tolerance` of its largest magnitude (the stages of
    these random models reach 50, where float32's rounding alone is 3e-6: minigpt's one qkv and one
    W1 product round otherwise than transformers' separate ones), and the next-token probabilities
    within `tolerance`."""
    theirs, ours = transformers_stages(model, ids), minigpt_stages(run, ids)
    n_layer = run.model.cfg.n_layer
    assert len(theirs) == 3 + 7 * n_layer
    for name, value in theirs.items():
        assert ours[name].shape == value.shape, name
        assert ours[name].dtype == value.dtype, name
        difference = (ours[name] - value).abs().max().item()
        assert difference <= tolerance * max(1.0, value.abs().max().item()), f"{name}: {difference}"
    probabilities = [stages["logits"].softmax(-1) for stages in (theirs, ours)]
    assert (probabilities[0] - probabilities[1]).abs().max().item() <= tolerance
    assert probabilities[0].max() > 0.2  # the random model is decided about something: not a trivial check


def tokens(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (2, count), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def float64_exact(monkeypatch):
    """transformers' float32 casts in RMSNorm and in eager attention's softmax, patched out."""

    def rms_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module, name in (("llama", "LlamaRMSNorm"), ("mistral", "MistralRMSNorm"), ("qwen2", "Qwen2RMSNorm")):
        norm = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
        monkeypatch.setattr(norm, "forward", rms_norm)
    softmax = torch.nn.functional.softmax
    monkeypatch.setattr(torch.nn.functional, "softmax", lambda x, dim=None, dtype=None, **_: softmax(x, dim=dim))


# ---------------------------------------------------------------- the three families, stage by stage


def test_llama_with_grouped_query_attention_biases_and_llama3_scaling_agrees_with_transformers(make, cli, tmp_path):
    folder = make(
        "llama-gqa",
        "llama",
        heads=6,
        kv_heads=2,
        attention_bias=True,
        mlp_bias=True,
        rope_theta=500000.0,
        rope_scaling={**LLAMA3, "original_max_position_embeddings": ORIGINAL},
    )
    result = cli("import", "hf", folder, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "imported hf-llama" in result.stderr and "6 heads (2 key/value heads), width 48, swiglu" in result.stderr
    run = minigpt.load(tmp_path / "run")
    m = run.model.cfg
    assert (m.n_kv_head, m.head_width, m.qkv_bias, m.out_bias, m.ffn_bias) == (2, 0, True, True, True)
    assert (m.norm, m.activation, m.positions, m.rope_angles, m.bias) == ("rmsnorm", "swiglu", "rope", "float32", False)
    assert m.rope_scaling == "llama3:4.0,original_context=16" and m.rope_theta == 500000.0 and m.context == 64
    # 40 positions: inside the original 16 and past them, where the llama3 rule stretches the slow pairs
    assert_agrees(run, transformers_model(folder), tokens(40), 1e-5)
    traced = json.loads(cli("trace", "--run", tmp_path / "run", "--ids", "5,9,11,2", "--json").stdout)
    assert len(traced["blocks"]) == 2


def test_qwen2_tied_with_biases_stored_in_bfloat16_and_sharded_agrees_with_transformers(make, tmp_path):
    folder = make("qwen2", "qwen2", tie=True, config_shape="legacy", dtype=torch.bfloat16, shards=2)
    assert len(list(folder.glob("model-*.safetensors"))) >= 2 and not (folder / "model.safetensors").exists()
    run = imported(folder, tmp_path / "run")
    m = run.model.cfg
    assert (m.qkv_bias, m.out_bias, m.ffn_bias, m.tie_embeddings, m.dtype) == (True, False, False, True, "float32")
    origin = json.loads((tmp_path / "run" / "origin.json").read_text())
    assert origin["weights_dtype"] == "bfloat16" and origin["widened"] == "bfloat16 weights read as float32, exactly"
    assert origin["weights"].startswith("model.safetensors.index.json") and len(origin["sha256"]) >= 2
    # every weight as stored: bfloat16 widened to float32 loses nothing
    stored = {}
    for shard in folder.glob("model-*.safetensors"):
        stored.update(safetensors_torch.load_file(shard))
    table = run.model.state_dict()["token_table.weight"]
    assert torch.equal(table, stored["model.embed_tokens.weight"].float())
    assert run.model.head.weight is run.model.token_table.weight
    assert_agrees(run, transformers_model(folder), tokens(40), 1e-5)


def test_mistral_with_a_sliding_window_agrees_within_it_and_refuses_longer_texts(make, tmp_path):
    folder = make("mistral", "mistral", sliding_window=24)
    run = imported(folder, tmp_path / "run")
    assert run.model.cfg.sliding_window == 24 and run.model.cfg.qkv_bias is False
    assert_agrees(run, transformers_model(folder), tokens(24), 1e-5)
    with pytest.raises(ContextTooLongError, match=r"has 25 tokens .* sliding window of 24 \(\[model\] sliding_window"):
        run.model(tokens(25))


class WindowedLayer(LayerCache):
    """One block's keys and values, every one kept, of which attention reads the last `window`
    (the new position's included), each at its own position: Mistral's rolling buffer."""

    def __init__(self, capacity: int, window: int):
        super().__init__(capacity)
        self.window = window

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().extend(k, v)
        return keys[:, :, -self.window :], values[:, :, -self.window :]


def test_mistral_past_its_window_agrees_with_transformers_at_every_position(make, tmp_path):
    """On a text of two and a half windows, transformers' sliding-window attention against the
    imported weights read one token at a time, each position reading the last 24 keys at their own
    positions (WindowedLayer; the model's window set to 0, since minigpt itself refuses such a text
    rather than read every key): within 1e-5 at every position, past the window too. Attention over
    every key agrees inside the window and nowhere past it: the window is what is compared there, and
    transformers' window is the last 24 keys, as minigpt's refusal of a 25th token assumes."""
    window, length = 24, 60  # max_position_embeddings is 64
    folder = make("mistral", "mistral", sliding_window=window)
    run = imported(folder, tmp_path / "run")
    every_key = MiniGPT(dataclasses.replace(run.model.cfg, sliding_window=0), run.model.vocab_size).eval()
    every_key.load_state_dict(run.model.state_dict())
    ids = tokens(length)
    cache = KVCache(every_key.cfg.n_layer, every_key.cfg.context)
    cache.layers = [WindowedLayer(every_key.cfg.context, window) for _ in cache.layers]
    with torch.no_grad():
        theirs = transformers_model(folder)(ids).logits
        ours = torch.cat([every_key(ids[:, i : i + 1], cache=cache)[0] for i in range(length)], dim=1)
        unwindowed = every_key(ids)[0]
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 1e-5 * scale
    assert (ours.softmax(-1) - theirs.softmax(-1)).abs().max().item() <= 1e-5
    assert (unwindowed[:, :window] - theirs[:, :window]).abs().max().item() <= 1e-5 * scale
    parted = (unwindowed[:, window:] - theirs[:, window:]).abs().amax(dim=(0, 2))  # per position past the window
    assert parted.min().item() > 1e-3 * scale


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_the_defaults_of_absent_keys_are_transformers_config_classes(model_type):
    """llama_layout.DEFAULTS, key by key, against the config class transformers builds for the
    model_type (LlamaConfig(), MistralConfig(), Qwen2Config()): the value it takes, and for a derived
    key (None) what it derives; every config.json key minigpt reads that the class has is among them;
    and where neither config shape names rope_theta, its default."""
    config_class = getattr(transformers, ARCHITECTURES[model_type].replace("ForCausalLM", "Config"))
    theirs = config_class()
    for key, ours in DEFAULTS[model_type].items():
        if key == "num_key_value_heads" and ours is None:  # as many as the query heads
            assert theirs.num_key_value_heads == theirs.num_attention_heads
        elif key == "head_dim":  # hidden_size // num_attention_heads, or left to the model (Qwen2)
            assert ours is None
            assert getattr(theirs, key, None) in (None, theirs.hidden_size // theirs.num_attention_heads)
        elif key == "sliding_window" and model_type == "qwen2":  # read only with use_sliding_window = true
            assert theirs.sliding_window is None and config_class(use_sliding_window=True).sliding_window == ours
        else:
            assert getattr(theirs, key) == ours, key
    read = [key for key in (*CONFIG_KEYS.values(), VOCAB_SIZE, ACTIVATION) if key != "rope_theta"]
    assert [key for key in read if hasattr(theirs, key) and key not in DEFAULTS[model_type]] == []
    rope = getattr(theirs, "rope_parameters", None) or {"rope_theta": theirs.rope_theta}  # 5.x, or 4.x
    assert rope["rope_theta"] == DEFAULT_THETA


def test_a_hand_written_mistral_config_gets_transformers_defaults(make, tmp_path):
    """A key config.json leaves out is what transformers' MistralConfig takes: a sliding window of
    4,096 and 8 key/value heads here."""
    folder = tmp_path / "mistral"
    shutil.copytree(make("mistral-eight", "mistral", heads=8, kv_heads=8), folder)
    config = json.loads((folder / "config.json").read_text())
    for key in ("sliding_window", "num_key_value_heads", "rope_parameters", "tie_word_embeddings"):
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))
    run = imported(folder, tmp_path / "run")
    assert (run.model.cfg.sliding_window, run.model.cfg.kv_heads, run.model.cfg.rope_theta) == (4096, 8, 10000.0)
    assert_agrees(run, transformers_model(folder), tokens(20), 1e-5)


# ---------------------------------------------------------------- rope's scaling rules


@pytest.mark.parametrize("shape", ["v5", "legacy"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rope_scaling_rule_agrees_inside_and_past_the_trained_length(make, tmp_path, rule, shape):
    """linear and dynamic scale against max_position_embeddings (64): read past it on purpose;
    yarn and llama3 against original_max_position_embeddings (16): 40 positions cross it. yarn here
    with heads narrower than width / heads (head_dim 12 with 6 heads of width 48)."""
    head_dim = 12 if rule.startswith("yarn") else None
    folder = make(f"{rule}-{shape}", "llama", rope_scaling=RULES[rule], config_shape=shape, head_dim=head_dim)
    run = imported(folder, tmp_path / "run")
    assert run.model.cfg.head_width == (12 if head_dim else 0)
    model = transformers_model(folder)
    assert_agrees(run, model, tokens(40), 1e-5)
    if rule in ("linear", "dynamic"):
        run.read_with(extrapolate=True)
        assert_agrees(run, model, tokens(80, seed=1), 1e-5)


def test_a_shorter_context_keeps_the_dynamic_rule_scaling_against_max_position_embeddings(make, tmp_path):
    folder = make("dynamic-v5", "llama", rope_scaling=RULES["dynamic"])
    import_hf(folder, tmp_path / "run", context=32, progress=False)
    run = minigpt.load(tmp_path / "run")
    assert run.model.cfg.context == 32 and run.model.cfg.rope_scaling == "dynamic:3.0,original_context=64"
    with pytest.raises(ContextTooLongError, match="trained on at most 32"):
        run.model(tokens(40))
    assert_agrees(run.read_with(extrapolate=True), transformers_model(folder), tokens(40), 1e-5)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_inverse_frequencies_are_transformers_bit_for_bit(make, tmp_path, rule):
    folder = make(f"{rule}-v5", "llama", rope_scaling=RULES[rule], head_dim=12 if rule.startswith("yarn") else None)
    run = imported(folder, tmp_path / "run")
    m = run.model.cfg
    config = transformers.AutoConfig.from_pretrained(folder)
    scaling = parse_rope_scaling(m.rope_scaling)
    lengths = [None, 64] + ([80, 200] if rule == "dynamic" else [])  # dynamic changes past the trained length
    for length in lengths:
        seq_len = None if length is None else torch.tensor(length)  # a tensor, as transformers' forward passes it
        theirs, their_factor = rope_utils.ROPE_INIT_FUNCTIONS[RULES[rule]["rope_type"]](config, None, seq_len=seq_len)
        ours, our_factor = inverse_frequencies(m.resolved_head_width, m.rope_theta, scaling, m.context, length or 1)
        assert torch.equal(ours, theirs), (rule, length)
        assert our_factor == their_factor


# ---------------------------------------------------------------- float64: 1e-10


@pytest.mark.parametrize(
    "name, family, settings, length",
    [
        ("llama-gqa-64", "llama", dict(attention_bias=True, mlp_bias=True, rope_scaling=RULES["llama3"]), 40),
        ("qwen2-64", "qwen2", dict(tie=True), 30),
        ("mistral-64", "mistral", dict(sliding_window=32, head_dim=12), 32),
        ("yarn-64", "llama", dict(rope_scaling=RULES["yarn-mscale"], head_dim=12), 40),
        ("dynamic-64", "llama", dict(rope_scaling=RULES["dynamic"]), 80),  # past max_position_embeddings
    ],
)
def test_a_float64_folder_agrees_within_1e_10(make, tmp_path, float64_exact, name, family, settings, length):
    folder = make(name, family, dtype=torch.float64, **settings)
    run = imported(folder, tmp_path / "run")
    assert run.model.cfg.dtype == "float64" and run.model.cfg.rope_angles == "float32"
    run.read_with(extrapolate=length > run.model.cfg.context)
    assert_agrees(run, transformers_model(folder, torch.float64), tokens(length), 1e-10)


# ---------------------------------------------------------------- the weights files


def test_a_tied_folder_may_keep_its_head_if_it_is_the_table(make, cli, tmp_path):
    source = make("tied", "llama", tie=True)
    weights = safetensors_torch.load_file(source / "model.safetensors")
    assert "lm_head.weight" not in weights  # transformers leaves a tied head out
    kept = tmp_path / "kept"
    shutil.copytree(source, kept)
    safetensors_torch.save_file(
        {**weights, "lm_head.weight": weights["model.embed_tokens.weight"].clone()}, kept / "model.safetensors"
    )
    run = imported(kept, tmp_path / "run")
    assert run.model.head.weight is run.model.token_table.weight
    assert_agrees(run, transformers_model(kept), tokens(20), 1e-5)
    other = weights["model.embed_tokens.weight"].clone()
    other[3, 4] += 1
    safetensors_torch.save_file({**weights, "lm_head.weight": other}, kept / "model.safetensors")
    line = refused(cli, "import", "hf", kept, "--out", tmp_path / "refused")
    assert "lm_head.weight differs from model.embed_tokens.weight" in line and "tie_word_embeddings = true" in line


def test_pytorch_model_bin_with_old_rotary_buffers_imports_the_same_weights(make, tmp_path):
    source = make("bin-source", "llama")
    folder = tmp_path / "bin"
    shutil.copytree(source, folder)
    weights = safetensors_torch.load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # what transformers 4.3x saved
    torch.save(weights, folder / "pytorch_model.bin")
    a, b = imported(source, tmp_path / "a"), imported(folder, tmp_path / "b")
    assert a.model.state_dict().keys() == b.model.state_dict().keys()
    assert all(torch.equal(a.model.state_dict()[k], b.model.state_dict()[k]) for k in a.model.state_dict())
    assert json.loads((tmp_path / "b" / "origin.json").read_text())["weights"] == "pytorch_model.bin"


def test_a_gpt2_folder_still_imports_through_the_same_command(cli, tmp_path):
    from test_convert import gpt2_folder, gpt2_model, train_tokenizer

    folder = gpt2_folder(tmp_path / "gpt2", gpt2_model(), train_tokenizer("bpe", 299, "First Citizen:\n" * 50))
    result = cli("import", "hf", folder, "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "imported hf-gpt2" in result.stderr


# ---------------------------------------------------------------- refusals: one line naming the key


def edited(source: Path, folder: Path, **changes) -> Path:
    """A copy of `source` whose config.json has `changes` (a value None removes the key)."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "family, changes, named",
    [
        ("llama", {"hidden_act": "gelu"}, 'hidden_act = "gelu"'),
        (
            "llama",
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            'rope_parameters.rope_type = "longrope"',
        ),
        ("llama", {"rope_scaling": {"type": "su", "factor": 2.0}}, 'rope_scaling.type = "su"'),
        ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5"),
        ("llama", {"num_local_experts": 8}, "num_local_experts = 8"),
        ("llama", {"pretraining_tp": 2}, "pretraining_tp = 2"),
        ("llama", {"model_type": "gemma"}, 'model_type = "gemma"'),
        ("llama", {"model_type": None}, "model_type = absent"),
        ("llama", {"architectures": ["LlamaForSequenceClassification"]}, "architectures = "),
        ("llama", {"quantization_config": {"quant_method": "gptq"}}, "quantization_config = "),
        ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "no low_freq_factor"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 0.5}}, "rope_parameters.factor = 0.5"),
        ("llama", {"num_key_value_heads": 4}, "num_key_value_heads = 4"),
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window = true"),
        ("qwen2", {"layer_types": ["full_attention", "sliding_attention"]}, "layer_types = "),
    ],
)
def test_what_minigpt_does_not_compute_is_refused_naming_the_key(make, cli, tmp_path, family, changes, named):
    folder = edited(make(f"{family}-plain", family), tmp_path / "folder", **changes)
    line = refused(cli, "import", "hf", folder, "--out", tmp_path / "run")
    assert named in line
    assert not (tmp_path / "run").exists()


def test_damaged_weights_are_refused_naming_the_tensor(make, cli, tmp_path):
    source = make("llama-plain", "llama")
    weights = safetensors_torch.load_file(source / "model.safetensors")
    cases = {
        "lacks model.layers.1.mlp.up_proj.weight": {
            k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"
        },
        "holds model.layers.0.self_attn.q_proj.bias, which no part": {
            **weights,
            "model.layers.0.self_attn.q_proj.bias": torch.zeros(48),
        },
        "model.norm.weight holds NaN": {**weights, "model.norm.weight": torch.full((48,), float("nan"))},
        "model.layers.0.self_attn.k_proj.weight has shape [24, 40]": {
            **weights,
            "model.layers.0.self_attn.k_proj.weight": torch.zeros(24, 40),
        },
    }
    for i, (named, tensors) in enumerate(cases.items()):
        folder = tmp_path / f"folder{i}"
        shutil.copytree(source, folder)
        safetensors_torch.save_file(tensors, folder / "model.safetensors")
        line = refused(cli, "import", "hf", folder, "--out", tmp_path / f"run{i}")
        assert named in line, line
        assert not (tmp_path / f"run{i}").exists()
