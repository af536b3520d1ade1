"""A run folder describes itself: `sample` and `trace` work from `--run DIR` alone, from any working
directory, and the model is built from the [model] section stored in the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

RUN_FILES = {"config.toml", "tokenizer.json", "checkpoint.pt", "metrics.jsonl", "best.pt"}


@pytest.fixture(scope="module")
def two_block_run(tmp_path_factory):
    """The default config with two blocks, trained for five steps, as a real process."""
    from conftest import run_minigpt

    folder = tmp_path_factory.mktemp("trained")
    run = folder / "R"
    result = run_minigpt(
        "train", "--out", run, "--set", "model.n_layer=2", "--steps", "5", "--quiet", cwd=folder, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return run


def test_a_run_trained_with_set_is_sampled_and_traced_with_run_alone_elsewhere(
    two_block_run, tmp_path, minigpt_process
):
    assert {p.name for p in two_block_run.iterdir()} == RUN_FILES
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)

    sampled = minigpt_process("sample", "--run", two_block_run, "-p", "ROMEO:", "-n", "12", "--json", cwd=elsewhere)
    assert sampled.returncode == 0, sampled.stderr
    [sample] = [json.loads(line) for line in sampled.stdout.splitlines()]
    assert sample["prompt"] == "ROMEO:" and sample["new_tokens"] == 12

    traced = minigpt_process("trace", "--run", two_block_run, "-p", "ROMEO:", "--json", cwd=elsewhere)
    assert traced.returncode == 0, traced.stderr
    trace = json.loads(traced.stdout)
    assert trace["model"]["n_layer"] == 2 and len(trace["blocks"]) == 2  # the run's model, not the default's
    assert list(elsewhere.iterdir()) == []  # reading a run writes nothing where it runs


def test_the_default_config_and_the_two_block_run_disagree_and_are_refused_together(two_block_run, minigpt_process):
    refused = minigpt_process(
        "sample", "-c", Path(__file__).parents[1] / "configs" / "default.toml", "--run", two_block_run, "-p", "ROMEO:"
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "n_layer: 4 != 2 (config != checkpoint)" in refused.stderr


def test_a_run_folder_without_its_config_needs_one(two_block_run, tmp_path, cli):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_block_run, copy)
    (copy / "config.toml").unlink()
    result = cli("sample", "--run", copy, "-p", "ROMEO:")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"minigpt: error: --run {copy} has no config.toml, so it does not describe itself; "
        f"pass the config it was trained with as --config\n"
    )


def test_a_checkpoint_without_its_model_section_is_refused(two_block_run, tmp_path, cli):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_block_run, copy)
    payload = torch.load(copy / "checkpoint.pt", weights_only=True)
    del payload["model_config"]
    torch.save(payload, copy / "checkpoint.pt")
    result = cli("trace", "--run", copy, "-p", "ROMEO:")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert f"checkpoint {copy / 'checkpoint.pt'} holds no [model] section" in result.stderr


def test_a_checkpoint_with_an_impossible_model_section_is_refused(two_block_run, tmp_path, cli):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_block_run, copy)
    payload = torch.load(copy / "checkpoint.pt", weights_only=True)
    payload["model_config"]["n_layer"] = 0
    torch.save(payload, copy / "checkpoint.pt")
    result = cli("trace", "--run", copy, "-p", "ROMEO:", "--set", "model.n_layer=0")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "[model] n_layer = 0 must be at least 1" in result.stderr


def test_the_loaded_model_is_built_from_the_checkpoint_and_keeps_its_tied_head(tmp_path):
    from minigpt.config import load_config
    from minigpt.model.gpt import MiniGPT
    from minigpt.runs.folder import write_model_run
    from minigpt.runs.reading import load_model
    from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

    config = tmp_path / "tied.toml"
    config.write_text(
        "[model]\ncontext = 8\nn_layer = 1\nn_head = 2\nn_embd = 8\nffn_hidden = 16\n"
        'tie_embeddings = true\n[tokenizer]\nkind = "char"\n[train]\nout = "run"\n',
        encoding="utf-8",
    )
    cfg = load_config(config)
    torch.manual_seed(3)
    model = MiniGPT(cfg.model, 5).eval()
    write_model_run(cfg.run_dir, cfg, model, TextTokenizer(train_tokenizer("char", 0, "abcde")))
    loaded, _ = load_model(cfg)
    assert loaded.head.weight is loaded.token_table.weight
    ids = torch.tensor([[0, 1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(loaded(ids)[0], model(ids)[0])
