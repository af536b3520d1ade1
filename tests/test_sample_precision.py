"""`[sample] precision = "bfloat16"`: the KV-cache steps run on a bfloat16 copy of the matrices
(sampling/decoding.py), said to compute other numbers than float32, refused where it cannot apply."""

from __future__ import annotations

import pytest
import torch
from conftest import refused, train_tiny_run

from minigpt.config import SampleConfig, load_config
from minigpt.errors import MinigptError
from minigpt.model.gpt import MiniGPT
from minigpt.sampling import decoding
from minigpt.sampling.generate import generate


def tiny(dtype: str = "float32") -> MiniGPT:
    cfg = load_config(
        None, ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.context=32", f'model.dtype="{dtype}"']
    )
    torch.manual_seed(0)
    return MiniGPT(cfg.model, 60).eval()


def test_the_bfloat16_copy_narrows_every_matrix_and_leaves_the_model_as_it_was():
    model = tiny()
    before = {name: p.clone() for name, p in model.named_parameters()}
    copy = decoding.decoding_copy(model, torch.bfloat16)
    matrices = [m.weight for m in copy.modules() if isinstance(m, torch.nn.Linear)]
    assert matrices and all(w.dtype == torch.bfloat16 for w in matrices)
    assert all(p.dtype == torch.float32 and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert copy.token_table.weight is model.token_table.weight  # looked up, not multiplied: shared


def test_the_cached_steps_in_bfloat16_are_float32s_logits_to_bfloat16s_rounding():
    model = tiny()
    prompt = [1, 2, 3, 4]
    steps = {}
    for precision in ("float32", "bfloat16"):
        settings = SampleConfig(max_new_tokens=20, greedy=True, precision=precision)
        steps[precision] = list(generate(model, prompt, settings))
    first32, first16 = steps["float32"][0].logits, steps["bfloat16"][0].logits
    assert not torch.equal(first32, first16)  # other numbers, as the key says
    torch.testing.assert_close(first16, first32, rtol=0, atol=0.05 * first32.abs().max().item())


def test_a_model_that_is_not_float32_or_cannot_be_copied_is_refused_before_anything_runs():
    settings = SampleConfig(max_new_tokens=4, precision="bfloat16")
    with pytest.raises(
        MinigptError, match=r'precision = "bfloat16" narrows a float32 model\'s matrices, and this model is float64'
    ):
        generate(tiny("float64"), [1, 2], settings)
    hooked = tiny()
    hooked.blocks[0].register_forward_hook(lambda *a: None)
    with pytest.raises(MinigptError, match=r"cannot have: hooks are registered on it"):
        generate(hooked, [1, 2], settings)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("precision"))


def test_sample_takes_the_key_as_a_flag_and_refuses_another_value(cli, run):
    done = cli("sample", "--run", run, "-p", "Th", "-n", "6", "--precision", "bfloat16", "--seed", "3")
    assert done.exit_code == 0, done.output
    line = refused(cli, "sample", "--run", run, "-n", "6", "--precision", "float16")
    assert "float16" in line and "bfloat16" in line
