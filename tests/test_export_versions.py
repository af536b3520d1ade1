"""`minigpt export --format hf` of a rope model writes config.json so that every transformers the
`export` and `peft` extras allow reads one rope: 5.x reads `rope_parameters`, 4.x (from 4.56, the
extras' floor) a top-level `rope_theta` beside `rope_scaling`. transformers 4.x cannot be installed
beside the suite's 5.x, so `read_as_4_56` mirrors how 4.56.0 reads the file, and each export's
inverse frequencies and attention scaling, computed from that reading, must equal the ones
transformers 5 builds from the same file. The same reading of the file without 4.x's keys (what
export wrote before) gets theta 10000 and no scaling: the check can tell the two apart.

Checked by hand outside the suite: these exports loaded in transformers 4.56.0 (torch 2.13) give
transformers 5's logits bitwise; in 4.55.4 a yarn rule whose factor is not max_position_embeddings /
original_max_position_embeddings (an import cropped with --context) is read otherwise, hence 4.56;
4.40 reads neither head_dim, mlp_bias, Qwen2's or Mistral's rope_scaling, nor yarn or llama3."""

from __future__ import annotations

import json
import tomllib
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, lazy_module, train_tiny_run
from test_export_llama import LLAMA_BLOCK, overrides, random_hf_folder

transformers = lazy_module("transformers")
rope_utils = lazy_module("transformers.modeling_rope_utils")

OLDEST = "4.56"  # the extras' floor: the release read_as_4_56 mirrors
# positions read: past every folder's max_position_embeddings, where the dynamic rule reads its factor
LENGTH = 100
THETA_4X = 10000.0  # LlamaConfig's, Qwen2Config's and MistralConfig's rope_theta in 4.56 when config.json has none


def read_as_4_56(config: dict) -> dict:
    """The rope parameters transformers 4.56.0 computes from config.json, in 5.x's spelling (rope_type
    and rope_theta beside the rule's keys). It mirrors models/llama/configuration_llama.py
    (LlamaConfig.__init__ keeps rope_theta and rope_scaling as given; Qwen2Config and MistralConfig
    do the same) and models/llama/modeling_llama.py (LlamaRotaryEmbedding.__init__: the rule is
    rope_scaling's rope_type, or its older name type, and "default" without a rope_scaling); the
    rules in modeling_rope_utils.py read rope_theta from the config, everything else from
    rope_scaling. rope_parameters is a key 4.56 does not know."""
    scaling = config.get("rope_scaling")
    scaling = scaling if isinstance(scaling, dict) else {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    return {**scaling, "rope_type": rope_type, "rope_theta": config.get("rope_theta", THETA_4X)}


def frequencies(config: dict, parameters: dict) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling of rope `parameters` (read_as_4_56's) for the model
    config.json describes, reading LENGTH positions, by transformers' own rules (modeling_rope_utils'
    ROPE_INIT_FUNCTIONS, whose arithmetic 4.56 and 5.x share: they differ in where they read each
    key, which `parameters` settles; "default" is 4.56's _compute_default_rope_parameters, one line)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if parameters["rope_type"] == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (parameters["rope_theta"] ** exponents), 1.0
    model = SimpleNamespace(
        rope_parameters=parameters,
        standardize_rope_params=lambda: None,  # parameters are already what 4.56 read
        head_dim=head_dim,
        hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"],
        max_position_embeddings=config["max_position_embeddings"],
    )
    length = torch.tensor(LENGTH)  # as the dynamic rule's update passes it: max(position_ids) + 1
    return rope_utils.ROPE_INIT_FUNCTIONS[parameters["rope_type"]](model, None, seq_len=length)


def transformers_5(folder) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and attention scaling transformers 5 reads LENGTH positions with, from
    the folder's model (its rotary embedding, after the dynamic rule's update for that length)."""
    rotary = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).model.rotary_emb
    rotary(torch.zeros(1), torch.arange(LENGTH)[None])
    return rotary.inv_freq, rotary.attention_scaling


# name -> the folder an import reads (random_hf_folder's make_folder settings) and its --context
IMPORTED = {
    "llama3": (dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), None),
    "yarn-cropped": (dict(rope_theta=1e6, head_dim=12, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                     "original_max_position_embeddings": 16, "beta_fast": 16.0, "mscale": 1.0,
                     "mscale_all_dim": 0.5, "truncate": False}), 32),
    "dynamic-cropped": (dict(max_pos=16, rope_scaling={"rope_type": "dynamic", "factor": 2.0}), 8),
    "qwen2-linear": (dict(family="qwen2", rope_theta=1e6, rope_scaling={"rope_type": "linear", "factor": 2.0}), None),
    "mistral-unscaled": (dict(family="mistral", rope_theta=1e5, sliding_window=16), None),
}  # fmt: skip
# name -> a minigpt-trained run's [model] settings (Mistral: its window; with a rule of its own)
TRAINED = {
    "mistral-trained-linear": ["model.sliding_window=8", 'model.rope_scaling="linear:2"', "model.rope_theta=50000.0"],
    "llama-trained-unscaled": [],
}


def exported(name: str, cli, tmp_path):
    """The folder `minigpt export --format hf` writes of an import of IMPORTED[name]'s folder, or of a
    run trained with TRAINED[name]."""
    if name in IMPORTED:
        settings, context = IMPORTED[name]
        source = random_hf_folder().make_folder(tmp_path / "folder", std=0.2, **settings)
        cropped = ("--context", context) if context else ()
        assert cli("import", "hf", source, "--out", tmp_path / "run", *cropped).exit_code == 0
        run = tmp_path / "run"
    else:
        run = train_tiny_run(tmp_path, *overrides([*LLAMA_BLOCK, *TRAINED[name], "train.steps=2"]))
    result = cli("export", "--run", run, "--format", "hf", "--out", tmp_path / "hf")
    assert result.exit_code == 0, result.output
    return tmp_path / "hf"


@pytest.mark.parametrize("name", [*IMPORTED, *TRAINED])
def test_transformers_4_56_reads_the_rope_transformers_5_reads(cli, tmp_path, name):
    folder = exported(name, cli, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    theirs, their_scaling = transformers_5(folder)
    ours, our_scaling = frequencies(config, read_as_4_56(config))
    assert torch.equal(ours, theirs) and our_scaling == their_scaling
    assert read_as_4_56(config)["rope_type"] == config["rope_parameters"]["rope_type"]
    # without 4.x's keys, the file 4.56 reads is a model of theta 10000 and no rule: a different rope
    before = {key: value for key, value in config.items() if key not in ("rope_theta", "rope_scaling")}
    if name != "llama-trained-unscaled":  # theta 10000 and no rule: the one rope both readings agree on
        unread, _ = frequencies(before, read_as_4_56(before))
        assert not torch.equal(unread, theirs)


def test_the_extras_require_the_transformers_whose_reading_the_tests_mirror():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("export", "peft"):
        assert f"transformers>={OLDEST}" in extras[extra], extra
