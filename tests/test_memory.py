"""minigpt.memory: the parameter count worked out from [model] alone equals the model's own, and a
model the device has no room for is refused in one line before anything is allocated."""

from __future__ import annotations

import itertools

import pytest

from minigpt import memory
from minigpt.config import ModelConfig
from minigpt.errors import MinigptError
from minigpt.model.gpt import MiniGPT


@pytest.mark.parametrize(
    "norm, activation, bias, tie",
    list(itertools.product(["layernorm", "rmsnorm"], ["relu", "gelu_tanh", "swiglu"], [True, False], [True, False])),
)
def test_parameter_count_is_the_model_s_own(norm, activation, bias, tie):
    cfg = ModelConfig(
        context=5,
        n_layer=3,
        n_head=2,
        n_embd=6,
        ffn_hidden=10,
        norm=norm,
        activation=activation,
        bias=bias,
        tie_embeddings=tie,
    )
    assert memory.parameter_count(cfg, 13) == MiniGPT(cfg, 13).num_parameters()


def test_gpt2_small_is_124_million_parameters_and_needs_about_a_gigabyte_and_a_half_to_sample():
    gpt2 = ModelConfig(context=1024, n_layer=12, n_head=12, n_embd=768, ffn_hidden=3072, tie_embeddings=True)
    assert memory.parameter_count(gpt2, 50257) == 124_439_808  # GPT-2 small, as transformers counts it
    # two copies of 475 MiB, the cache, a forward over the whole table (sampling past it), the margin;
    # measured: 2.05 GiB resident at the peak of `sample -n 1100`, torch's libraries included
    assert 1.5 * 2**30 < memory.reading_bytes(gpt2, 50257) < 1.7 * 2**30
    # A trace of the whole table keeps every block's stages and attention weights: over 2 GiB.
    traced = memory.forward_bytes(gpt2, 50257, 1024, recorded=True)
    assert 2 * 2**30 < traced < 2.5 * 2**30 and traced > 4 * memory.forward_bytes(gpt2, 50257, 1024)


def test_what_does_not_fit_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda device: 3 * 2**30)
    memory.check_memory(2 * 2**30, "cpu", "loading this model", "free memory")  # fits: nothing said
    with pytest.raises(MinigptError) as refused:
        memory.check_memory(5 * 2**30, "cpu", "loading this model", "free memory")
    assert str(refused.value) == "loading this model needs about 5.00 GiB but cpu has 3.00 GiB available; free memory"
    monkeypatch.setattr(memory, "available_memory", lambda device: None)
    memory.check_memory(1 << 60, "cpu", "anything", "")  # unknown free memory: no refusal
