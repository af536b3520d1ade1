"""What a reading command says of a run folder it cannot read (issue 44, parts 7 and 8): a checkpoint
whose tensors are not the model's (one missing, one extra, one of another shape) is refused in one
line naming the tensor, and a file given as --run is said to be a file, with what to pass instead."""

from __future__ import annotations

import pytest
import torch
from conftest import make_run, refused


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path)
    return tmp_path / "run"


CHANGES = {
    "missing": (
        lambda model: model.pop("blocks.0.ffn.W1.bias"),
        "blocks.0.ffn.W1.bias is missing (the model has it, [32])",
    ),
    "extra": (
        lambda model: model.__setitem__("blocks.0.ffn.W3.weight", torch.zeros(16, 32)),
        "blocks.0.ffn.W3.weight is not a tensor of this model",
    ),
    "misshapen": (
        lambda model: model.__setitem__("blocks.0.ffn.W2.weight", torch.zeros(16, 31)),
        "blocks.0.ffn.W2.weight is [16, 31] where the model has [16, 32]",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("command", [("info",), ("sample", "-n", "3")])
def test_a_checkpoint_whose_tensors_are_not_the_models_is_refused_naming_the_tensor(cli, run, change, command):
    edit, said = CHANGES[change]
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    edit(payload["model"])
    torch.save(payload, run / "checkpoint.pt")
    assert refused(cli, *command, "--run", "run") == (
        f"minigpt: error: checkpoint {run / 'checkpoint.pt'} does not hold the tensors of the model its [model] "
        f"section describes: {said}; the file was damaged or changed: read another checkpoint, or train the run again"
    )


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            "small.txt",
            "--run small.txt is a text file, not a run folder (what training writes: config.toml, checkpoint.pt, "
            "tokenizer.json); pass --run such a folder, or train one on it with --data small.txt --out DIR",
        ),
        (
            "tiny.toml",
            "--run tiny.toml is a config file, not a run folder; pass it as --config tiny.toml (it names the run "
            "folder its training wrote), or pass --run that folder",
        ),
        (
            "run/checkpoint.pt",
            "--run run/checkpoint.pt is a file of the run folder run, not the folder itself; pass --run run",
        ),
    ],
)
@pytest.mark.parametrize("command", ["info", "sample"])
def test_a_file_given_as_the_run_is_said_to_be_one_with_what_to_pass(cli, run, given, said, command):
    (run.parent / "small.txt").write_text("a few words\n")
    assert refused(cli, command, "--run", given) == f"minigpt: error: {said}"
