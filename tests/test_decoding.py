"""minigpt.sampling.decoding: the KV-cache steps' copy of a model holds the same weights, each
matrix stored [in, out], shares everything else, leaves the model untouched, computes its logits
within float32 rounding, and is used only where enough cached steps will read it and the model may
be copied. Tiny seeded models (rope, RMSNorm, SwiGLU, grouped-query heads, a tied head: the
imported Llama family's parts)."""

from __future__ import annotations

import torch
from torch import nn

from minigpt.config import ModelConfig, SampleConfig
from minigpt.model import lora
from minigpt.model.cache import KVCache
from minigpt.model.gpt import MiniGPT
from minigpt.sampling import decoding
from minigpt.sampling.generate import generate

VOCAB = 23
LLAMA_LIKE = dict(
    context=64,
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    n_embd=16,
    ffn_hidden=24,
    norm="rmsnorm",
    activation="swiglu",
    positions="rope",
    bias=False,
    tie_embeddings=True,
)


def randomised(seed: int = 0, **changes) -> MiniGPT:
    torch.manual_seed(seed)
    model = MiniGPT(ModelConfig(**{**LLAMA_LIKE, **changes}), VOCAB).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def test_the_copy_stores_each_matrix_the_other_way_and_shares_everything_else():
    model = randomised()
    before = {name: (id(p), p.stride(), p.requires_grad) for name, p in model.named_parameters()}
    copy = decoding.decoding_copy(model)
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert linears == ["blocks.0.attention.qkv", "blocks.0.attention.out", "blocks.0.ffn.W1", "blocks.0.ffn.W2",
                       "blocks.1.attention.qkv", "blocks.1.attention.out", "blocks.1.ffn.W1", "blocks.1.ffn.W2",
                       "head"]  # fmt: skip
    for name in linears:
        ours, theirs = copy.get_submodule(name).weight, model.get_submodule(name).weight
        assert torch.equal(ours, theirs) and ours.shape == theirs.shape  # the same values, [out, in]
        assert ours.stride() == (1, ours.shape[0]) and theirs.stride() == (ours.shape[1], 1)
        assert ours.data_ptr() != theirs.data_ptr() and not ours.requires_grad
    # the token table keeps its row layout (a lookup reads a row); the tied head got its own copy
    assert copy.token_table.weight is model.token_table.weight and copy.head.weight is not model.head.weight
    assert copy.blocks[1].norm2.weight is model.blocks[1].norm2.weight
    assert copy.final_norm.weight is model.final_norm.weight
    # the model is as it was: the same parameters, layouts and gradient switches, still tied
    assert {name: (id(p), p.stride(), p.requires_grad) for name, p in model.named_parameters()} == before
    assert model.head.weight is model.token_table.weight
    # 16 x 16 and 16 x 24 matrices: bytes of every block matrix and the head, not the table twice
    assert decoding.matrix_bytes(model) == 4 * (2 * (16 * 32 + 16 * 16 + 16 * 48 + 24 * 16) + VOCAB * 16)
    assert decoding.matrix_bytes(copy) == 0  # already laid out: a copy of the copy shares them all
    assert all(a is b for a, b in zip(decoding.decoding_copy(copy).parameters(), copy.parameters()))


def test_the_copy_computes_the_models_logits_within_float32_rounding_at_every_cached_step():
    model = randomised(1)
    copy = decoding.decoding_copy(model)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    caches = KVCache(2, 40), KVCache(2, 40)
    with torch.inference_mode():
        for end in range(5, 41):  # a 5-token prompt at once, then one token a step
            ours, theirs = (
                m(ids[:, c.length : end], cache=c, last_only=True)[0] for m, c in zip((copy, model), caches)
            )
            assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
        whole = model(ids)[0][:, -1]
    assert (ours[:, -1] - whole).abs().max() <= 1e-5 * whole.abs().max()


def copies_made(monkeypatch) -> list:
    made = []
    real = decoding.decoding_copy

    def counted(model):
        made.append(model)
        return real(model)

    monkeypatch.setattr(decoding, "decoding_copy", counted)
    return made


def test_sampling_uses_the_copy_only_when_enough_cached_steps_read_it(monkeypatch):
    model = randomised(3)
    made = copies_made(monkeypatch)
    monkeypatch.setattr(decoding, "WORTH_STEPS", 30)
    prompt = [1, 2, 3, 4, 5]

    def tokens(n: int, **options) -> list[int]:
        settings = SampleConfig(max_new_tokens=n, greedy=True)
        return [int(step.tokens[0]) for step in generate(model, prompt, settings, **options)]

    reference = tokens(40, fast_path=False)  # the model itself at every step
    assert made == []
    assert tokens(40) == reference and made == [model]  # 40 cached steps: one copy, the same tokens
    assert tokens(29) == reference[:29] and made == [model]  # 29: the model itself
    # a 64-row table: 5 + 30 tokens fit, the steps past it recompute a window (the folded copy)
    made.clear()
    assert len(tokens(70)) == 70 and made == [model]
    long_prompt = list(range(20)) + [1] * 20  # 40 tokens: 25 steps are left before the table is full
    settings = SampleConfig(max_new_tokens=60, greedy=True)
    made.clear()
    assert len(list(generate(model, long_prompt, settings))) == 60 and made == []


def test_hooked_lora_and_learner_models_are_sampled_as_they_are(monkeypatch):
    model = randomised(4)
    assert decoding.decodable(model) is None
    handle = model.blocks[0].register_forward_hook(lambda *args: None)
    assert "hooks" in decoding.decodable(model)
    handle.remove()
    adapted = randomised(4)
    lora.attach(adapted, {"rank": 2, "alpha": 4.0, "dropout": 0.0, "targets": "qkv", "base": {}})
    assert "LoRA" in decoding.decodable(adapted)
    monkeypatch.setattr(decoding, "available_memory", lambda device: 2 * decoding.matrix_bytes(model) - 1)
    assert "free memory" in decoding.decodable(model)
    made = copies_made(monkeypatch)
    monkeypatch.setattr(decoding, "WORTH_STEPS", 2)
    list(generate(model, [1, 2], SampleConfig(max_new_tokens=10, greedy=True)))
    list(generate(adapted, [1, 2], SampleConfig(max_new_tokens=10, greedy=True)))
    assert made == []
