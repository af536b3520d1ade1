"""minigpt.config: the shipped default, strict keys with suggestions, type and range checks, `--set`
overrides validated the same way, to_toml round-trips, and config-relative paths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from minigpt.config import (
    DEFAULT_CONFIG,
    DEFAULT_CORPUS,
    ModelConfig,
    SampleConfig,
    TokenizerConfig,
    TrainConfig,
    load_config,
    parse_override,
)
from minigpt.errors import ConfigError, MinigptError


def write_config(folder: Path, text: str, name: str = "experiment.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(*args) -> str:
    with pytest.raises(ConfigError) as excinfo:
        load_config(*args)
    assert isinstance(excinfo.value, MinigptError)
    return excinfo.value.for_command_line  # as the command line says it: options named as flags


# ----------------------------------------------------------------------------------------------
# the shipped default


def test_default_config_has_the_documented_model():
    cfg = load_config()
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.ffn_hidden, m.context) == (4, 4, 128, 512, 32)
    assert (m.norm, m.norm_position, m.activation, m.dtype) == ("layernorm", "pre", "relu", "float32")
    assert m.norm_eps == 1e-5 and m.dropout == 0.0
    assert cfg.name == "default" and cfg.source == str(DEFAULT_CONFIG)


def test_default_config_file_agrees_with_the_dataclass_defaults():
    cfg = load_config()
    assert cfg.model == ModelConfig()
    assert cfg.tokenizer == TokenizerConfig()
    assert cfg.sample == SampleConfig()
    assert cfg.train == TrainConfig()


def test_default_corpus_path_resolves_against_the_config_folder():
    # default.toml says data = "../data/tinyshakespeare.txt", relative to configs/
    assert Path(load_config().train.data) == DEFAULT_CORPUS.resolve()


def test_loading_the_default_by_path_equals_loading_it_by_none():
    assert load_config(DEFAULT_CONFIG).model == load_config(None).model


# ----------------------------------------------------------------------------------------------
# strict keys, types and values


def test_unknown_key_is_refused_with_file_section_key_and_suggestion(tmp_path):
    path = write_config(tmp_path, "[model]\nn_layers = 2\n")
    message = refusal(path)
    assert str(path) in message
    assert "[model]" in message
    assert "'n_layers'" in message
    assert "did you mean 'n_layer'" in message


def test_unknown_section_is_refused_with_suggestion(tmp_path):
    path = write_config(tmp_path, "[modle]\nn_layer = 2\n")
    message = refusal(path)
    assert str(path) in message and "'modle'" in message and "section" in message
    assert "'model'" in message


def test_wrong_type_is_refused(tmp_path):
    path = write_config(tmp_path, '[model]\nn_layer = "four"\n')
    message = refusal(path)
    assert str(path) in message and "n_layer" in message and '"four"' in message
    assert "integer" in message


@pytest.mark.parametrize(
    "text",
    [
        "[model]\nn_layer = 2.0\n",
        "[model]\nn_layer = true\n",
        "[model]\nbias = 1\n",
        '[train]\nlearning_rate = "fast"\n',
    ],
)
def test_near_miss_types_are_refused(tmp_path, text):
    refusal(write_config(tmp_path, text))


def test_width_not_divisible_by_heads_is_refused(tmp_path):
    path = write_config(tmp_path, "[model]\nn_embd = 130\nn_head = 4\n")
    message = refusal(path)
    assert str(path) in message and "130" in message and "divisible" in message


def test_zero_context_is_refused(tmp_path):
    path = write_config(tmp_path, "[model]\ncontext = 0\n")
    message = refusal(path)
    assert "context" in message and "at least 1" in message


def test_unknown_activation_lists_the_choices(tmp_path):
    path = write_config(tmp_path, '[model]\nactivation = "tanh"\n')
    message = refusal(path)
    assert "tanh" in message
    for choice in ("relu", "gelu", "gelu_tanh", "swiglu"):
        assert choice in message


@pytest.mark.parametrize(
    "text, words",
    [
        ("[model]\ndropout = 1.0\n", ("dropout", "below 1")),
        ("[model]\nnorm_eps = 0.0\n", ("norm_eps", "greater than 0")),
        ("[sample]\ntop_p = 1.5\n", ("top_p", "at most 1")),
        ("[train]\nmin_lr = 0.01\nlearning_rate = 0.001\n", ("min_lr", "learning_rate")),
        ('[tokenizer]\nkind = "bpe"\nvocab_size = 256\n', ("vocab_size", "257")),
    ],
)
def test_out_of_range_values_are_refused(tmp_path, text, words):
    message = refusal(write_config(tmp_path, text))
    for word in words:
        assert word in message, message


def test_missing_file_and_invalid_toml_are_refused(tmp_path):
    assert "does not exist" in refusal(tmp_path / "nope.toml")
    broken = write_config(tmp_path, "[model\nn_layer = 2\n")
    assert str(broken) in refusal(broken)


def test_partial_file_keeps_defaults_for_the_rest(tmp_path):
    cfg = load_config(write_config(tmp_path, "[model]\nn_layer = 2\n"))
    assert cfg.model == dataclasses.replace(ModelConfig(), n_layer=2)
    assert cfg.name == "experiment"


# ----------------------------------------------------------------------------------------------
# --set overrides


def test_set_override_changes_the_value():
    cfg = load_config(None, ["model.n_layer=2", "tokenizer.kind=char", "sample.temperature=0.5"])
    assert cfg.model.n_layer == 2
    assert cfg.tokenizer.kind == "char"
    assert cfg.sample.temperature == 0.5
    assert cfg.model.n_head == 4  # untouched keys keep the file's values


def test_set_override_wins_over_the_file(tmp_path):
    path = write_config(tmp_path, "[model]\nn_layer = 3\n")
    assert load_config(path, ["model.n_layer=6"]).model.n_layer == 6


def test_set_override_with_bad_value_names_the_override():
    message = refusal(None, ["model.n_layer=x"])
    assert "--set model.n_layer=x" in message
    assert "integer" in message


def test_the_python_api_names_an_override_as_its_argument_not_as_a_flag():
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, ["model.n_layer=x"])
    assert str(excinfo.value).startswith('set model.n_layer=x: [model] n_layer = "x" is not an integer')


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.context=0", ("--set model.context=0", "at least 1")),
        ("model.activation=tanh", ("--set model.activation=tanh", "swiglu")),
        ("model.n_layers=2", ("--set model.n_layers=2", "did you mean 'n_layer'")),
        ("modle.n_layer=2", ("--set modle.n_layer=2", "'model'")),
        ("model.n_embd=130", ("130", "divisible")),
    ],
)
def test_set_overrides_are_validated_like_the_file(override, words):
    message = refusal(None, [override])
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("text", ["model.n_layer", "n_layer=2", "model.=2", ".n_layer=2"])
def test_malformed_override_is_refused(text):
    with pytest.raises(ConfigError) as excinfo:
        parse_override(text)
    assert "section.key=value" in str(excinfo.value)
    assert "section.key=value" in refusal(None, [text])


def test_override_path_resolves_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["train.data=corpus.txt"])
    assert Path(cfg.train.data) == (tmp_path / "corpus.txt").resolve()


# ----------------------------------------------------------------------------------------------
# to_toml and relative paths


@pytest.mark.parametrize(
    "prompt",
    [
        'He said "ho!"\nand then \\ left — ü',
        "tab\there",
        "delete\x7fcharacter",  # U+007F must be escaped in a TOML basic string
    ],
    ids=["quotes-newline-backslash-unicode", "tab", "delete-character"],
)
def test_to_toml_round_trips(tmp_path, prompt):
    cfg = load_config(
        None,
        [
            "model.n_layer=2",
            "model.norm_eps=1e-6",
            "model.tie_embeddings=true",
            "train.learning_rate=3e-4",
            "train.out=runs/x",
        ],
    )
    cfg.sample.prompt = prompt
    path = write_config(tmp_path, cfg.to_toml(), name="resolved.toml")
    again = load_config(path)
    for section in ("model", "tokenizer", "train", "sample"):
        assert getattr(again, section) == getattr(cfg, section), section
    assert again.model.norm_eps == 1e-6 and again.model.tie_embeddings is True
    assert again.sample.prompt == prompt


def test_to_toml_round_trips_when_an_override_contained_a_newline(tmp_path):
    # e.g. --set sample.prompt="$(cat opening.txt)": the value is accepted as a bare string, and the
    # resolved file written from it must still load
    cfg = load_config(None, ["sample.prompt=To be\nor not"])
    assert cfg.sample.prompt == "To be\nor not"
    path = write_config(tmp_path, cfg.to_toml(), name="resolved.toml")
    assert load_config(path).sample == cfg.sample


def test_refusal_message_shows_the_value_as_written_in_toml(tmp_path):
    # "[model] context = 0", not "[model] context = '0'" (which reads as if a string was given)
    assert "[model] context = 0 must be at least 1" in refusal(None, ["model.context=0"])
    message = refusal(write_config(tmp_path, '[model]\nn_layer = "four"\n'))
    assert '[model] n_layer = "four" is not an integer' in message, message


def test_relative_data_path_in_a_config_file_resolves_against_its_folder(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the current directory must not matter
    path = write_config(folder, '[train]\ndata = "corpus.txt"\nout = "../runs/mine"\n')
    cfg = load_config(path)
    assert Path(cfg.train.data) == (folder / "corpus.txt").resolve()
    assert Path(cfg.train.out) == (tmp_path / "runs" / "mine").resolve()


def test_absolute_data_path_is_kept(tmp_path):
    target = tmp_path / "abs" / "corpus.txt"
    path = write_config(tmp_path, f'[train]\ndata = "{target.as_posix()}"\n')
    assert Path(load_config(path).train.data) == target


def test_what_the_model_keys_mean_is_read_as_what_it_is():
    """`residual` keeps its TOML values (true, false, "attention") and `head_width` its 0 for
    "derived", so every run's config and hash stay; the model reads them resolved."""
    from minigpt.config import ModelConfig, Residual

    assert [ModelConfig(residual=value).residual_kind for value in (True, False, "attention")] == [
        Residual.SUM,
        Residual.NONE,
        Residual.ATTENTION,
    ]
    assert ModelConfig(n_embd=16, n_head=2).resolved_head_width == 8  # head_width = 0: n_embd / n_head
    assert ModelConfig(n_embd=16, n_head=2, head_width=6).resolved_head_width == 6
