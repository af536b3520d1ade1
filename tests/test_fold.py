"""minigpt.fold: folding the norms is a transformation of the weights, not a second forward pass.
The folded model is a MiniGPT running MiniGPT.forward, with plain norms; it is the same model up to
float32 rounding (against the model's own float32 forward, and against a float64 copy of the same
weights, the reference both are rounded from); the original is untouched; where a fold does not
apply, sampling runs the model itself; and sampling's tokens are the model's. Tiny seeded models.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from minigpt.config import ModelConfig, SampleConfig
from minigpt.errors import MinigptError
from minigpt.model.fold import fold_norms, unfoldable
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.model.layers import LayerNorm, RMSNorm
from minigpt.sampling import generate as generate_module
from minigpt.sampling.generate import generate

VOCAB = 13
CONTEXT = 8
TINY = dict(context=CONTEXT, n_layer=2, n_head=4, n_embd=16, ffn_hidden=24)
# Stated tolerance, relative to the largest |logit| of the float64 reference: the folded model's
# float32 logits agree with the model's own within 1e-5 of it, and each of the two is that close to
# the float64 model (float32's epsilon is 1.2e-7; the worst measured over 20 draws of every config
# below is 2.9e-6, with swiglu, where the model itself is as far from float64 as its fold).
# A float64 model folds to within 1e-12 absolute.
TOLERANCE = 1e-5
FOLD_SOURCE = Path(__file__).resolve().parents[1] / "minigpt" / "model" / "fold.py"


def randomised(seed: int = 0, scale: float = 0.3, **changes) -> MiniGPT:
    """A model in eval mode with every parameter drawn from a seeded generator: norm gains away
    from one, non-zero biases (norms included), weights large enough that every stage matters."""
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
    """The same weights in float64: the reference that the float32 model and its fold round from."""
    cfg = ModelConfig(**{**vars(model.cfg), "dtype": "float64"})
    wide = MiniGPT(cfg, model.vocab_size).eval()
    wide.load_state_dict(model.state_dict())  # copy_ widens each float32 value exactly
    return wide


def logits(model: MiniGPT, ids: torch.Tensor, **options) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids, **options)[0]


def within(a: torch.Tensor, b: torch.Tensor, reference: torch.Tensor, tolerance: float = TOLERANCE) -> bool:
    """|a - b| <= tolerance x the largest |reference| logit, everywhere."""
    return (a.double() - b.double()).abs().max().item() <= tolerance * reference.abs().max().item()


def norms(model: MiniGPT) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, (LayerNorm, RMSNorm))]


# ----------------------------------------------------------------------------------------------
# one class, one forward


def forward_calls(monkeypatch) -> list:
    """The models MiniGPT.forward runs on from now on (a forward patched onto the class)."""
    seen = []
    real = MiniGPT.forward

    def spy(self, ids, targets=None, recorder=None, cache=None, last_only=False):
        seen.append(self)
        return real(self, ids, targets, recorder, cache, last_only)

    monkeypatch.setattr(MiniGPT, "forward", spy)
    return seen


def test_the_folded_model_is_a_minigpt_running_minigpt_forward(monkeypatch):
    model = randomised(tie_embeddings=True)
    folded = fold_norms(model)
    # MiniGPT's own forward, its modules called straight through it (no user holds the copy)
    assert isinstance(folded, MiniGPT) and type(folded).forward is MiniGPT.forward and "forward" not in vars(folded)
    assert all(type(m).__call__ is not torch.nn.Module.__call__ for m in folded.modules())
    assert all(type(m).__call__ is torch.nn.Module.__call__ for m in model.modules())  # the model's hooks fire
    assert len(norms(folded)) == 2 * TINY["n_layer"] + 1
    assert all(n.weight is None and getattr(n, "bias", None) is None for n in norms(folded))  # plain norms
    assert folded.head.weight is not folded.token_table.weight and not folded.cfg.tie_embeddings
    assert folded.head.bias is not None  # final_norm's beta, folded into the head
    assert not any(p.requires_grad for p in folded.parameters())
    linears = [m for m in folded.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * TINY["n_layer"] + 1 and all(m.weight.T.is_contiguous() for m in linears)  # [in, out]
    # fold.py defines no module and no forward of its own: it transforms weights, and calls each
    # module's own forward (a Linear's is F.linear on its weight and bias)
    tree = ast.parse(FOLD_SOURCE.read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    assert "forward" not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    # the forward on the class when the copy is made is what the folded model runs: nothing to guard
    seen = forward_calls(monkeypatch)
    again = fold_norms(model)
    logits(again, torch.tensor([[1, 2]]), last_only=True)
    assert seen == [again]


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie_embeddings", [False, True])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_folded_logits_match_the_model_up_to_float32_rounding(activation, bias, tie_embeddings, norm):
    model = randomised(activation=activation, bias=bias, tie_embeddings=tie_embeddings, norm=norm)
    folded, wide = fold_norms(model), float64_copy(model)
    g = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        for T in (1, 5, CONTEXT):
            ids = torch.randint(0, VOCAB, (batch, T), generator=g)
            plain, fast, reference = logits(model, ids), logits(folded, ids), logits(wide, ids)
            assert fast.shape == (batch, T, VOCAB) and fast.dtype == torch.float32
            assert 1.0 < reference.abs().max().item() < 20.0  # logits big enough to mean something
            assert within(fast, plain, reference)
            assert within(fast, reference, reference) and within(plain, reference, reference)
            # sampling's pass: the last position alone, through the same forward
            last = logits(folded, ids, last_only=True)
            assert last.shape == (batch, 1, VOCAB) and within(last, plain[:, -1:], reference)
            # every sample of a batch is computed as if it were alone
            assert within(logits(folded, ids[-1:], last_only=True), last[-1:], reference)


def test_a_float64_model_folds_to_float64_rounding():
    model = randomised(dtype="float64", tie_embeddings=True)
    folded = fold_norms(model)
    ids = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(4))
    assert next(folded.parameters()).dtype == torch.float64
    assert (logits(folded, ids) - logits(model, ids)).abs().max().item() <= 1e-12


def test_the_original_model_is_untouched_and_the_fold_is_a_snapshot():
    model = randomised(tie_embeddings=True).train()
    before = {name: t.clone() for name, t in model.state_dict().items()}
    folded = fold_norms(model)
    assert folded.training  # the same mode as the original
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert model.head.weight is model.token_table.weight and model.cfg.tie_embeddings
    assert all(n.weight is not None for n in norms(model)) and all(p.requires_grad for p in model.parameters())
    model.eval()
    ids = torch.arange(CONTEXT).unsqueeze(0)
    snapshot = logits(folded.eval(), ids).clone()
    with torch.no_grad():
        model.blocks[0].norm1.weight.mul_(2.0)  # training the original later does not reach the fold
    assert torch.equal(logits(folded, ids), snapshot)
    assert within(logits(fold_norms(model), ids), logits(model, ids), logits(model, ids))


def test_live_dropout_draws_the_same_masks_in_the_folded_model():
    """Dropout acts on the stream and the attention weights, never on a norm's output, so the fold
    keeps it: the same seed draws the same masks in both models."""
    model = randomised(dropout=0.2).train()
    folded = fold_norms(model)
    ids = torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(7)
    plain = logits(model, ids)
    torch.manual_seed(7)
    fast = logits(folded, ids)
    assert not torch.allclose(plain, logits(model.eval(), ids))  # dropout really acted
    assert within(fast, plain, plain)


def test_the_folded_model_refuses_more_than_the_position_table_like_the_model():
    with pytest.raises(ContextTooLongError, match=r"has 9 tokens but the position table has 8 rows"):
        logits(fold_norms(randomised()), torch.zeros(1, CONTEXT + 1, dtype=torch.long), last_only=True)


# ----------------------------------------------------------------------------------------------
# where it applies


def test_post_norm_and_subclasses_do_not_fold_and_say_why():
    post = randomised(norm_position="post")
    assert "post-norm" in unfoldable(post)
    with pytest.raises(MinigptError, match=r"cannot fold this model's norms: a post-norm block's norms"):
        fold_norms(post)

    class Scripted(MiniGPT):
        pass

    torch.manual_seed(0)
    assert "Scripted is not a MiniGPT" in unfoldable(Scripted(ModelConfig(**TINY), VOCAB))
    for changes in (dict(), dict(norm="rmsnorm"), dict(dtype="float64"), dict(dropout=0.1)):
        assert unfoldable(randomised(**changes)) is None, changes


def settings(new_tokens: int, **changes) -> SampleConfig:
    """[sample] as these tests draw: `new_tokens` tokens at temperature 1."""
    return SampleConfig(max_new_tokens=new_tokens, temperature=1.0, **changes)


def test_a_model_that_does_not_fold_samples_through_itself(monkeypatch):
    model = randomised(norm_position="post")
    monkeypatch.setattr(generate_module, "fold_norms", lambda m: pytest.fail("folded a post-norm model"))
    seen = forward_calls(monkeypatch)
    draw = settings(2 * CONTEXT)
    runs = [
        [s.tokens for s in generate(model, [1, 2, 3], draw, generator=torch.Generator().manual_seed(5), **o)]
        for o in (dict(use_cache=True), dict(use_cache=False))
    ]
    assert seen and all(m is model for m in seen)
    assert len(runs[0]) == 2 * CONTEXT and torch.equal(torch.cat(runs[0]), torch.cat(runs[1]))


# ----------------------------------------------------------------------------------------------
# sampling through it


def sampled(model: MiniGPT, **options) -> tuple[torch.Tensor, torch.Tensor]:
    prompt = torch.tensor([[1, 2, 3], [7, 5, 0]])  # two rows: the batch is one forward per step
    steps = list(generate(model, prompt, settings(3 * CONTEXT), generator=torch.Generator().manual_seed(11), **options))
    return torch.stack([s.tokens for s in steps], 1), torch.stack([s.logits for s in steps], 1)


def test_sampling_past_the_table_gives_the_same_tokens_with_the_fold_as_without(monkeypatch):
    # Weights scaled up: distributions far from uniform, so a draw near a boundary between two
    # tokens (where a rounding difference could flip it) is unlikely; seeded, so it is not flaky.
    model = randomised(seed=2, scale=0.6)
    calls = []
    real = MiniGPT.forward

    def spy(self, ids, targets=None, recorder=None, cache=None, last_only=False):
        calls.append((self, ids.clone(), cache is not None, last_only))
        return real(self, ids, targets, recorder, cache, last_only)

    monkeypatch.setattr(MiniGPT, "forward", spy)
    plain_tokens, plain_logits = sampled(model, fast_path=False)
    assert all(call[0] is model for call in calls)  # forced off: the model itself did every step
    calls.clear()
    fast_tokens, fast_logits = sampled(model)
    assert len(set(fast_tokens[0].tolist())) > 1 and fast_tokens[0].tolist() != fast_tokens[1].tolist()
    assert torch.equal(fast_tokens, plain_tokens)
    assert within(fast_logits, plain_logits, plain_logits, 2 * TOLERANCE)
    # the KV cache on the model while the text fills the table, then one full `context` window per
    # step on one folded copy, built once, through the same forward with last_only
    prompt_length, filling = 3, CONTEXT - 3 + 1
    assert all(m is model and cached for m, _, cached, _ in calls[:filling])
    windows = calls[filling:]
    folded = windows[0][0]
    assert folded is not model and isinstance(folded, MiniGPT) and folded.final_norm.weight is None
    assert len(windows) == 3 * CONTEXT - filling
    text = torch.cat([torch.tensor([[1, 2, 3], [7, 5, 0]]), fast_tokens], 1)
    for step, (m, window, cached, last_only) in enumerate(windows, start=filling):
        assert m is folded and not cached and last_only
        length = prompt_length + step
        assert torch.equal(window, text[:, length - CONTEXT : length])


def test_kv_cache_and_full_recompute_give_the_same_tokens_through_the_fold():
    model = randomised(seed=2, scale=0.6)
    (cached_tokens, cached_logits), (plain_tokens, plain_logits) = (sampled(model, use_cache=c) for c in (True, False))
    assert torch.equal(cached_tokens, plain_tokens)
    assert within(cached_logits, plain_logits, plain_logits, 2 * TOLERANCE)
    for greedy in (True, False):  # and the same seed gives the same text every time
        first = list(generate(model, [4, 1], settings(20, greedy=greedy), generator=torch.Generator().manual_seed(3)))
        again = list(generate(model, [4, 1], settings(20, greedy=greedy), generator=torch.Generator().manual_seed(3)))
        assert [s.tokens.tolist() for s in first] == [s.tokens.tolist() for s in again]


# ----------------------------------------------------------------------------------------------
# the [model] switches (docs/guide/remove-it-and-watch.md)

SWITCHES = [
    dict(norm="none"),
    dict(ffn_hidden=0),
    dict(positions="none"),
    dict(residual=False),
    dict(norm="none", ffn_hidden=0, positions="none", residual=False, tie_embeddings=True),
    dict(norm="rmsnorm", ffn_hidden=0, bias=False),
]


@pytest.mark.parametrize("changes", SWITCHES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_a_switched_model_folds_to_the_same_logits_and_samples_the_same_tokens(changes):
    model = randomised(seed=2, scale=0.6, **changes)
    assert unfoldable(model) is None
    folded, wide = fold_norms(model), float64_copy(model)
    ids = torch.randint(0, VOCAB, (3, CONTEXT), generator=torch.Generator().manual_seed(1))
    plain, fast, reference = logits(model, ids), logits(folded, ids), logits(wide, ids)
    assert within(fast, plain, reference) and within(fast, reference, reference)
    assert within(logits(folded, ids, last_only=True), plain[:, -1:], reference)
    assert len(norms(folded)) == (0 if changes.get("norm") == "none" else len(norms(model)))
    plain_tokens, plain_logits = sampled(model, fast_path=False)
    fast_tokens, fast_logits = sampled(model)
    assert torch.equal(fast_tokens, plain_tokens)
    assert within(fast_logits, plain_logits, plain_logits, 2 * TOLERANCE)
