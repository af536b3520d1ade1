"""How a model is read (model/reading.py): one frozen Reading per way of reading it.

- A model with a rope rule of its own (an imported llama3 one) keeps it whatever the reader asks:
  a rule of the reader's (`--rope-scaling`, `rope_scaling=`) is refused naming both rules, on the
  command line and in the API, and inside the trained length every reading allowed gives
  transformers' logits (within 1e-5 of their largest magnitude), the folder written by
  scripts/random_hf_folder.py, nothing downloaded.
- Two readings of one model coexist: passes (and samples) under each, interleaved in one process,
  give each reading's own numbers, those of a copy of the model read only that way.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import lazy_module
from hf_folders import random_hf_folder
from test_llama_commands import LLAMA3  # trained length 64, the rule's original 16
from typer.testing import CliRunner

import minigpt
from minigpt.cli import app
from minigpt.config import ModelConfig, SampleConfig
from minigpt.errors import MinigptError
from minigpt.model.gpt import MiniGPT
from minigpt.model.reading import Reading
from minigpt.sampling.generate import generate

transformers = lazy_module("transformers")

CONTEXT = 8  # the rope model's trained length


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """(folder, run): a random Llama folder with transformers' llama3 rule (trained length 64, the
    rule's original 16), and its import by the command line."""
    root = tmp_path_factory.mktemp("reading")
    folder = random_hf_folder().make_folder(root / "folder", "llama", rope_scaling=LLAMA3, rope_theta=500000.0, std=0.3)
    result = CliRunner().invoke(app, ["import", "hf", str(folder), "--out", str(root / "run")])
    assert result.exit_code == 0, result.output
    return folder, root / "run"


def one_line(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("command", ["sample", "trace"])
def test_a_user_rule_on_a_model_with_a_rule_of_its_own_is_refused_naming_both(llama3, command):
    _, run = llama3
    line = one_line(command, "--run", run, "--prompt", "ROMEO", "--rope-scaling", "linear:2")
    assert line == (
        "minigpt: error: --rope-scaling linear:2 is refused for this model: it has a rope scaling rule of its own, "
        "llama3:4.0,original_context=16 ([model] rope_scaling), always applied as transformers applies it, and no "
        "way of applying a second rule with it is defined; read it without --rope-scaling (its own rule covers its "
        "trained length, 64 tokens), or pass --extrapolate to read past that length on purpose"
    )


def test_the_api_refuses_it_too_and_keeps_reading_the_model_as_before(llama3):
    _, run = llama3
    with pytest.raises(MinigptError, match=r"^rope_scaling yarn:2 is refused .* its own, llama3:4\.0"):
        minigpt.load(run, rope_scaling="yarn:2")
    opened = minigpt.load(run)
    before = opened.model.reading
    with pytest.raises(MinigptError, match=r"or pass extrapolate=True to read past that length on purpose$"):
        opened.read_with(rope_scaling="linear:2")
    assert opened.model.reading is before and str(before.rule) == "llama3:4.0,original_context=16"


def test_inside_the_trained_length_every_reading_allowed_gives_transformers_logits(llama3):
    folder, run = llama3
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.randint(0, 300, (2, 64), generator=torch.Generator().manual_seed(0))  # the whole trained length
    with torch.no_grad():
        theirs = theirs_model(ids).logits
    bound = 1e-5 * max(1.0, theirs.abs().max().item())
    assert theirs.softmax(-1).max() > 0.2  # a model decided about something: not a trivial comparison
    for extrapolate in (False, True):
        opened = minigpt.load(run, extrapolate=extrapolate)
        model = opened.model
        with torch.no_grad():
            read = model(ids)[0]  # its default reading, as every command reads it
            given = model(ids, reading=Reading.of(model.cfg, extrapolate=not extrapolate))[0]  # the other, handed in
        assert (read - theirs).abs().max().item() <= bound, extrapolate
        assert (given - theirs).abs().max().item() <= bound, extrapolate


def rope_model() -> MiniGPT:
    """A seeded random float64 rope model, weights far from their initial scale."""
    cfg = ModelConfig(context=CONTEXT, n_layer=2, n_head=2, n_embd=16, ffn_hidden=16, dtype="float64", positions="rope")
    torch.manual_seed(5)
    model = MiniGPT(cfg, 13).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5)
    return model


READINGS = {
    "plain": {},
    "linear:2": {"rope_scaling": "linear:2"},
    "yarn:2": {"rope_scaling": "yarn:2"},
    "ntk:2": {"rope_scaling": "ntk:2"},
    "extrapolate": {"extrapolate": True},
}


def test_two_readings_of_one_model_interleaved_give_each_its_own_logits():
    model = rope_model()
    alone = {name: copy.deepcopy(model).read_with(**how) for name, how in READINGS.items()}  # each read one way
    readings = {name: Reading.of(model.cfg, **how) for name, how in READINGS.items()}
    ids = torch.randint(0, 13, (1, 16), generator=torch.Generator().manual_seed(1))  # twice the trained length
    with torch.no_grad():
        expected = {name: alone[name](ids if name != "plain" else ids[:, :CONTEXT])[0] for name in READINGS}
        assert not torch.allclose(expected["linear:2"], expected["yarn:2"])  # readings that tell apart
        assert not torch.allclose(expected["ntk:2"], expected["extrapolate"])
        for name in ("plain", "linear:2", "plain", "yarn:2", "linear:2", "ntk:2", "extrapolate", "yarn:2", "plain"):
            got = model(ids if name != "plain" else ids[:, :CONTEXT], reading=readings[name])[0]
            assert torch.equal(got, expected[name]), name
    assert model.reading == Reading.of(model.cfg)  # the model's default reading never moved


def test_two_samples_under_two_readings_interleaved_draw_each_its_own_tokens():
    model = rope_model()
    settings = SampleConfig(max_new_tokens=3 * CONTEXT, greedy=True)  # past 16: both slide, recomputed

    def steps(generation) -> list[tuple[int, torch.Tensor]]:
        return [(int(step.tokens[0]), step.logits[0]) for step in generation]

    alone = {
        name: steps(generate(copy.deepcopy(model).read_with(rope_scaling=name), [1, 2, 3], settings))
        for name in ("linear:2", "ntk:2")
    }
    assert [token for token, _ in alone["linear:2"]] != [token for token, _ in alone["ntk:2"]]
    both = [
        iter(generate(model, [1, 2, 3], settings, reading=Reading.of(model.cfg, rope_scaling=name))) for name in alone
    ]
    interleaved: dict[str, list] = {name: [] for name in alone}
    for _ in range(settings.max_new_tokens):
        for name, generation in zip(alone, both):
            step = next(generation)
            interleaved[name].append((int(step.tokens[0]), step.logits[0]))
    for name, expected in alone.items():
        assert [token for token, _ in interleaved[name]] == [token for token, _ in expected], name
        assert torch.allclose(torch.stack([t for _, t in interleaved[name]]), torch.stack([t for _, t in expected]))


def test_a_reading_of_another_model_is_not_taken():
    model = rope_model()
    other = ModelConfig(context=2 * CONTEXT, n_layer=2, n_head=2, n_embd=16, ffn_hidden=16, positions="rope")
    with pytest.raises(ValueError, match="reads another model"):
        model(torch.zeros(1, 4, dtype=torch.long), reading=Reading.of(other))
