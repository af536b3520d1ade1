"""minigpt.fastpath: the folded model sampling uses for its full-window recomputes. It must be the
same model up to float32 rounding (against MiniGPT's own float32 forward, and against a float64
copy of the same weights as the reference both are rounded from), apply only where the fold holds,
and leave sampling's tokens as the model itself gives them. Tiny seeded models, so every test is fast.
"""

from __future__ import annotations

import pytest
import torch

from minigpt import fastpath
from minigpt.config import ModelConfig
from minigpt.fastpath import FoldedModel, supports
from minigpt.generate import generate
from minigpt.model import ContextTooLongError, MiniGPT

VOCAB = 13
CONTEXT = 8
TINY = dict(context=CONTEXT, n_layer=2, n_head=4, n_embd=16, ffn_hidden=24)
# Stated tolerance: the folded logits agree with MiniGPT.forward's within 1e-5 (absolute, on logits
# of magnitude ~5), and each is as close to the float64 model as the other, within that same 1e-5.
TOLERANCE = 1e-5


def randomised(seed: int = 0, scale: float = 0.3, **changes) -> MiniGPT:
    """A float32 model in eval mode with every parameter drawn from a seeded generator: norm gains
    away from one, non-zero biases (norms included), weights large enough that every stage matters."""
    torch.manual_seed(seed)
    model = MiniGPT(ModelConfig(**{**TINY, **changes}), VOCAB).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.5 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(scale * noise)
    return model


def float64_copy(model: MiniGPT) -> MiniGPT:
    """The same weights in float64: the reference that float32 forward and fold both round from."""
    cfg = ModelConfig(**{**vars(model.cfg), "dtype": "float64"})
    wide = MiniGPT(cfg, model.vocab_size).eval()
    wide.load_state_dict(model.state_dict())  # copy_ widens each float32 value exactly
    return wide


def last_logits(model: MiniGPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids)[0][:, -1]


# ----------------------------------------------------------------------------------------------
# the fold is the same model


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie_embeddings", [False, True])
def test_folded_logits_match_the_model_up_to_float32_rounding(activation, bias, tie_embeddings):
    model = randomised(activation=activation, bias=bias, tie_embeddings=tie_embeddings)
    assert supports(model)
    folded, wide = FoldedModel(model), float64_copy(model)
    g = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        for T in (1, 5, CONTEXT):
            ids = torch.randint(0, VOCAB, (batch, T), generator=g)
            plain = last_logits(model, ids)
            fast = folded(ids)
            reference = last_logits(wide, ids)
            assert fast.shape == (batch, VOCAB) and fast.dtype == torch.float32
            assert 1.0 < reference.abs().max().item() < 20.0  # logits big enough to mean something
            assert (fast - plain).abs().max().item() <= TOLERANCE
            assert (fast.double() - reference).abs().max().item() <= TOLERANCE
            assert (plain.double() - reference).abs().max().item() <= TOLERANCE
            # every sample of a batch is computed as if it were alone
            assert torch.allclose(folded(ids[-1:]), fast[-1:], rtol=0, atol=TOLERANCE)


def test_folded_model_is_the_last_only_forward_sampling_called():
    model = randomised(seed=3)
    ids = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        last_only = model(ids, last_only=True)[0][:, -1]
    assert (FoldedModel(model)(ids) - last_only).abs().max().item() <= TOLERANCE


def test_folded_model_refuses_more_than_the_position_table_like_the_model():
    folded = FoldedModel(randomised())
    with pytest.raises(ContextTooLongError, match=r"has 9 tokens but the position table has 8 rows"):
        folded(torch.zeros(1, CONTEXT + 1, dtype=torch.long))


def test_folded_model_reads_the_weights_it_was_built_from():
    """A snapshot: training the model afterwards does not reach it (Generation builds one per run)."""
    model = randomised()
    folded = FoldedModel(model)
    ids = torch.arange(CONTEXT).unsqueeze(0)
    before = folded(ids).clone()
    with torch.no_grad():
        model.blocks[0].norm1.weight.mul_(2.0)
    assert torch.equal(folded(ids), before)
    assert (FoldedModel(model)(ids) - last_logits(model, ids)).abs().max().item() <= TOLERANCE


# ----------------------------------------------------------------------------------------------
# where it applies


@pytest.mark.parametrize("changes", [dict(norm="rmsnorm"), dict(norm_position="post"), dict(dtype="float64")])
def test_not_supported_models_sample_through_the_model_itself(changes, monkeypatch):
    model = randomised(**changes)
    assert not supports(model)
    with pytest.raises(ValueError, match="supports"):
        FoldedModel(model)
    built = []
    monkeypatch.setattr(fastpath.FoldedModel, "__init__", lambda self, m: built.append(m))
    runs = [
        [
            s.tokens
            for s in generate(
                model, [1, 2, 3], 2 * CONTEXT, generator=torch.Generator().manual_seed(5), use_cache=use_cache
            )
        ]
        for use_cache in (True, False)
    ]
    assert built == []  # never built: every step called the model
    assert len(runs[0]) == 2 * CONTEXT and torch.equal(torch.cat(runs[0]), torch.cat(runs[1]))


def test_not_supported_while_dropout_is_live_or_the_forward_is_replaced(monkeypatch):
    model = randomised(dropout=0.1)
    assert supports(model)  # eval mode: dropout does nothing
    assert not supports(model.train())
    assert supports(randomised(dropout=0.0).train())  # no dropout to apply
    model = randomised()

    def scripted(self, ids, targets=None, recorder=None, cache=None, last_only=False):
        return torch.zeros(ids.shape[0], ids.shape[1], self.vocab_size), None

    monkeypatch.setattr(MiniGPT, "forward", scripted)  # a forward the fold does not copy
    assert not supports(model)


# ----------------------------------------------------------------------------------------------
# sampling through it


def sampled(model: MiniGPT, **options) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = torch.tensor([[1, 2, 3], [7, 5, 0]])  # two rows: the batch is one forward per step
    steps = list(
        generate(model, prompt, 3 * CONTEXT, temperature=1.0, generator=torch.Generator().manual_seed(11), **options)
    )
    return torch.stack([s.tokens for s in steps], 1), torch.stack([s.logits for s in steps], 1)


def test_sampling_past_the_table_gives_the_same_tokens_with_the_fast_path_as_without(monkeypatch):
    # Weights scaled up: distributions far from uniform, so a draw near a boundary between two
    # tokens (where a rounding difference could flip it) is unlikely; seeded, so it is not flaky.
    model = randomised(seed=2, scale=0.6)
    windows = []
    real_call = FoldedModel.__call__

    def spy(self, ids):
        windows.append(ids.clone())
        return real_call(self, ids)

    monkeypatch.setattr(FoldedModel, "__call__", spy)
    plain_tokens, plain_logits = sampled(model, fast_path=False)
    assert windows == []  # forced off: the model itself did every step
    fast_tokens, fast_logits = sampled(model)
    assert len(set(fast_tokens[0].tolist())) > 1 and fast_tokens[0].tolist() != fast_tokens[1].tolist()
    assert torch.equal(fast_tokens, plain_tokens)
    assert (fast_logits - plain_logits).abs().max().item() <= 2 * TOLERANCE
    # the KV cache while the text fills the table, then one full `context` window per step
    prompt_length = 3
    filling = CONTEXT - prompt_length + 1
    assert len(windows) == 3 * CONTEXT - filling
    text = torch.cat([torch.tensor([[1, 2, 3], [7, 5, 0]]), fast_tokens], 1)
    for step, window in enumerate(windows, start=filling):
        length = prompt_length + step
        assert torch.equal(window, text[:, length - CONTEXT : length])


def test_kv_cache_and_full_recompute_give_the_same_tokens_through_the_fast_path():
    model = randomised(seed=2, scale=0.6)
    (cached_tokens, cached_logits), (plain_tokens, plain_logits) = (sampled(model, use_cache=c) for c in (True, False))
    assert torch.equal(cached_tokens, plain_tokens)
    assert (cached_logits - plain_logits).abs().max().item() <= 2 * TOLERANCE
    for greedy in (True, False):  # and the same seed gives the same text every time
        first = list(generate(model, [4, 1], 20, greedy=greedy, generator=torch.Generator().manual_seed(3)))
        again = list(generate(model, [4, 1], 20, greedy=greedy, generator=torch.Generator().manual_seed(3)))
        assert [s.tokens.tolist() for s in first] == [s.tokens.tolist() for s in again]
