"""Behaviour of minigpt.model: agreement with an independent scalar reference, the fast path, causality,
batch independence, permutation equivariance, pre-/post-norm, the norms, refusals, the KV cache, the
loss at initialisation, activations and tied embeddings. Tiny models; float64 where exactness matters.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import reference  # tests/ is on sys.path under `pytest` and `python -m pytest` alike
import torch
import torch.nn.functional as F

from minigpt.config import ModelConfig
from minigpt.errors import MinigptError
from minigpt.model.cache import KVCache
from minigpt.model.gpt import ContextTooLongError, MiniGPT, TokenOutOfRangeError, check_token_ids
from minigpt.model.layers import LayerNorm, ResidualShapeError, RMSNorm, residual
from minigpt.model.recorder import Recorder

VOCAB = 11
SMALL = dict(context=8, n_layer=2, n_head=4, n_embd=8, ffn_hidden=12)


def small_config(**changes) -> ModelConfig:
    return ModelConfig(**{**SMALL, "dtype": "float64", **changes})


def randomised(cfg: ModelConfig, vocab: int = VOCAB, seed: int = 0) -> MiniGPT:
    """A model in eval mode with every parameter drawn from a seeded generator: non-zero biases,
    norm gains away from one, weights large enough that every stage matters."""
    torch.manual_seed(seed)
    model = MiniGPT(cfg, vocab).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.5 * noise)  # gains: non-unit, mostly positive
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.6 * noise)
    return model


def random_ids(batch: int, T: int, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, T), generator=g)


def recorded(model: MiniGPT, ids: torch.Tensor) -> tuple[torch.Tensor, Recorder]:
    recorder = Recorder(model.cfg)
    with torch.no_grad():
        logits, _ = model(ids, recorder=recorder)
    return logits, recorder


def fast(model: MiniGPT, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = model(ids, cache=cache)
    return logits


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


# ----------------------------------------------------------------------------------------------
# the independent scalar reference


def test_scalar_reference_agrees_with_every_recorded_stage_within_1e_12():
    cfg = small_config()
    model = randomised(cfg)
    ids = random_ids(2, 6)
    logits, rec = recorded(model, ids)
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in model.state_dict().items()})
    ref = reference.forward(weights, ids.tolist(), n_head=cfg.n_head, eps=cfg.norm_eps)

    def ref_tensor(value):
        return torch.tensor(value, dtype=torch.float64)

    assert max_diff(rec["input"], ref_tensor(ref["input"])) <= 1e-12
    for i in range(cfg.n_layer):
        stages = rec.block(i)
        assert set(reference.STAGES) | {"attention_weights"} <= set(stages)
        for name in reference.STAGES:
            assert max_diff(stages[name], ref_tensor(ref["blocks"][i][name])) <= 1e-12, (i, name)
        # per-head weights [B, H, T, T], masked entries exactly zero in both
        weights_i = stages["attention_weights"]
        assert list(weights_i.shape) == [2, cfg.n_head, 6, 6]
        assert max_diff(weights_i, ref_tensor(ref["blocks"][i]["attention_weights"])) <= 1e-12, i
    assert max_diff(rec["final_norm"], ref_tensor(ref["final_norm"])) <= 1e-12
    assert max_diff(rec["logits"], ref_tensor(ref["logits"])) <= 1e-12
    assert max_diff(logits, ref_tensor(ref["logits"])) <= 1e-12
    # The comparison is not vacuous: the stages carry real, varied values.
    assert float(rec["logits"].std()) > 0.1
    assert float(rec.block(1)["ffn"].abs().max()) > 0.1


def test_scalar_reference_agrees_with_a_model_without_biases():
    cfg = small_config(bias=False, n_layer=1)
    model = randomised(cfg, seed=4)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    ids = random_ids(2, 5, seed=4)
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in model.state_dict().items()})
    ref = reference.forward(weights, ids.tolist(), n_head=cfg.n_head, eps=cfg.norm_eps)
    assert max_diff(fast(model, ids), torch.tensor(ref["logits"], dtype=torch.float64)) <= 1e-12


def test_scalar_reference_detects_a_perturbed_weight():
    # The agreement above can fail: nudge one W_O entry and the reference no longer matches.
    model = randomised(small_config())
    ids = random_ids(1, 5)
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in model.state_dict().items()})
    weights["blocks"][1]["out_weight"][2][3] += 1e-6
    ref = reference.forward(weights, ids.tolist(), n_head=4)
    logits, _ = recorded(model, ids)
    assert max_diff(logits, torch.tensor(ref["logits"], dtype=torch.float64)) > 1e-9


# ----------------------------------------------------------------------------------------------
# fast path (fused SDPA, no recorder) versus the recorded path


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 1e-5)])
def test_fast_path_agrees_with_recorded_path(dtype, tolerance):
    model = randomised(small_config(dtype=dtype))
    ids = random_ids(2, 8)
    slow, _ = recorded(model, ids)
    quick = fast(model, ids)
    assert quick.dtype == slow.dtype == getattr(torch, dtype)
    assert max_diff(quick, slow) <= tolerance


def test_recorder_names_every_stage_of_every_block():
    model = randomised(small_config())
    _, rec = recorded(model, random_ids(1, 4))
    expected = {"input", "final_norm", "logits"}
    for i in range(2):
        expected |= {f"blocks.{i}.{s}" for s in reference.STAGES + ("attention_weights",)}
    assert set(rec.stages) == expected


# ----------------------------------------------------------------------------------------------
# causality and batch independence


@pytest.mark.parametrize("t", [0, 2, 4])
def test_changing_later_tokens_leaves_earlier_positions_unchanged(t):
    model = randomised(small_config())
    ids = random_ids(1, 7)
    changed = ids.clone()
    changed[0, t + 1 :] = (changed[0, t + 1 :] + 1 + torch.arange(7 - t - 1)) % VOCAB
    assert not torch.equal(ids, changed)

    before, rec_before = recorded(model, ids)
    after, rec_after = recorded(model, changed)
    for name, value in rec_before.stages.items():
        if name.endswith("attention_weights"):
            same = torch.equal(value[:, :, : t + 1], rec_after[name][:, :, : t + 1])
        else:
            same = torch.equal(value[:, : t + 1], rec_after[name][:, : t + 1])
        assert same, name
    assert torch.equal(fast(model, ids)[:, : t + 1], fast(model, changed)[:, : t + 1])
    # ... and the later positions do see the change
    assert max_diff(before[:, t + 1 :], after[:, t + 1 :]) > 1e-6
    assert max_diff(fast(model, ids)[:, t + 1 :], fast(model, changed)[:, t + 1 :]) > 1e-6


@pytest.mark.parametrize("use_recorder", [False, True])
def test_example_gives_the_same_outputs_alone_and_inside_a_batch(use_recorder):
    model = randomised(small_config())
    batch = random_ids(3, 6, seed=7)
    run = (lambda ids: recorded(model, ids)[0]) if use_recorder else (lambda ids: fast(model, ids))
    together = run(batch)
    for b in range(3):
        alone = run(batch[b : b + 1])
        assert max_diff(alone[0], together[b]) <= 1e-13, b
    # the examples are different, so the batch really holds three separate computations
    assert max_diff(together[0], together[1]) > 1e-3


# ----------------------------------------------------------------------------------------------
# permutation equivariance (chapter 17.1): a property of mask-free attention, broken by the mask


def block_by_hand(block, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The model's own pre-norm Block, composed here from its modules (norm1, attention.qkv,
    attention.out, norm2, ffn) with attention written out so the causal mask can be left off."""
    B, T, C = x.shape
    attention = block.attention
    H, d = attention.n_head, attention.head_width
    norm1 = block.norm1(x)
    q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in attention.qkv(norm1).split(C, dim=2))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    mixed = torch.softmax(scores, dim=-1) @ v
    residual1 = x + attention.out(mixed.transpose(1, 2).reshape(B, T, C))
    return residual1 + block.ffn(block.norm2(residual1))


def test_block_by_hand_with_the_mask_is_the_models_block():
    # guards the next test: the hand composition differs from the Block only by the mask switch
    model = randomised(small_config())
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for block in model.blocks:
            assert max_diff(block_by_hand(block, x, causal=True), block(x)) <= 1e-12
            assert max_diff(block_by_hand(block, x, causal=False), block(x)) > 1e-6


def test_mask_free_block_without_positions_is_permutation_equivariant_and_causal_block_is_not():
    model = randomised(small_config())
    with torch.no_grad():
        model.position_table.weight.zero_()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    perm = torch.tensor([5, 0, 3, 1, 2, 4])
    positions = torch.arange(6)

    def embed(token_ids):
        return model.token_table(token_ids) + model.position_table(positions)

    with torch.no_grad():
        x, x_perm = embed(ids), embed(ids[:, perm])
        assert torch.equal(x[:, perm], x_perm)  # zero position table: input rows just reorder
        for block in model.blocks:
            free, free_perm = block_by_hand(block, x, False), block_by_hand(block, x_perm, False)
            assert max_diff(free[:, perm], free_perm) <= 1e-12
            # equivariance, not invariance: the output really is reordered
            assert max_diff(free, free_perm) > 1e-3
            # the model's causal block does not have the property
            masked, masked_perm = block(x), block(x_perm)
            assert max_diff(masked[:, perm], masked_perm) > 1e-3
            x, x_perm = free, free_perm


def test_scalar_reference_without_mask_is_permutation_equivariant_too():
    model = randomised(small_config(n_layer=1))
    with torch.no_grad():
        model.position_table.weight.zero_()
    weights = reference.weights_from_state_dict({k: v.tolist() for k, v in model.state_dict().items()})
    ids, perm = [2, 7, 1, 8, 2], [4, 2, 0, 3, 1]
    out = reference.forward(weights, [ids], n_head=4, causal=False)["logits"][0]
    out_perm = reference.forward(weights, [[ids[p] for p in perm]], n_head=4, causal=False)["logits"][0]
    assert max_diff(torch.tensor([out[p] for p in perm]), torch.tensor(out_perm)) <= 1e-12
    causal = reference.forward(weights, [ids], n_head=4)["logits"][0]
    causal_perm = reference.forward(weights, [[ids[p] for p in perm]], n_head=4)["logits"][0]
    assert max_diff(torch.tensor([causal[p] for p in perm]), torch.tensor(causal_perm)) > 1e-3


# ----------------------------------------------------------------------------------------------
# pre-norm versus post-norm (chapter 17.6)


def test_post_norm_on_the_same_weights_is_a_different_block_that_follows_chapter_17_6():
    pre = randomised(small_config())
    post = MiniGPT(small_config(norm_position="post"), VOCAB).eval()
    post.load_state_dict(pre.state_dict())  # every shape matches...
    ids = random_ids(2, 6)
    pre_logits, post_logits = fast(pre, ids), fast(post, ids)
    assert max_diff(pre_logits, post_logits) > 1e-3  # ...but it is not the same function

    # R = LN1(X + MHA(X)), Y = LN2(R + FFN(R)), with FFN(x) = ReLU(x W1 + b1) W2 + b2
    _, rec = recorded(post, ids)
    with torch.no_grad():
        x = post.token_table(ids) + post.position_table(torch.arange(6))
        assert max_diff(rec["input"], x) == 0.0
        for i, block in enumerate(post.blocks):
            R = block.norm1(x + block.attention(x))
            Y = block.norm2(R + block.ffn.W2(torch.relu(block.ffn.W1(R))))
            assert max_diff(rec[f"blocks.{i}.output"], Y) <= 1e-12, i
            # post-norm attention reads X itself, not LN1(X)
            assert max_diff(rec[f"blocks.{i}.attention"], block.attention(x)) <= 1e-12
            x = Y
        assert max_diff(post_logits, post.head(post.final_norm(x))) <= 1e-12
        # the final sum is normalised: with unit-ish gains a post-norm output row has ~zero mean
        unit = MiniGPT(small_config(norm_position="post"), VOCAB).eval()
        _, rec_unit = recorded(unit, ids)
        assert float(rec_unit["blocks.1.output"].mean(-1).abs().max()) <= 1e-12


# ----------------------------------------------------------------------------------------------
# the norms (chapter 17.3)


def test_rmsnorm_does_not_mean_centre_a_constant_vector_but_layernorm_does():
    x = torch.tensor([[2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    rms = RMSNorm(4, eps=1e-5).double()
    ln = LayerNorm(4, eps=1e-5).double()
    with torch.no_grad():
        assert max_diff(rms(x), torch.ones(1, 4, dtype=torch.float64)) <= 1e-5
        assert torch.equal(ln(x), torch.zeros(1, 4, dtype=torch.float64))
        # the RMSNorm formula: g x / sqrt(mean(x^2) + eps)
        y = torch.tensor([[1.0, -2.0, 3.0, 0.5]], dtype=torch.float64)
        expected = y / math.sqrt(float((y**2).mean()) + 1e-5)
        assert max_diff(rms(y), expected) <= 1e-14


def test_rmsnorm_config_builds_rmsnorm_everywhere():
    model = MiniGPT(small_config(norm="rmsnorm"), VOCAB)
    norms = [model.final_norm] + [n for b in model.blocks for n in (b.norm1, b.norm2)]
    assert all(isinstance(n, RMSNorm) for n in norms)
    assert isinstance(MiniGPT(small_config(), VOCAB).final_norm, LayerNorm)


def test_layernorm_equals_explicit_formula_with_biased_variance_and_torch_layer_norm():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 5, generator=g, dtype=torch.float64) * 3 + 1
    ln = LayerNorm(5, eps=1e-5).double()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(5, generator=g, dtype=torch.float64))
        ln.bias.copy_(torch.randn(5, generator=g, dtype=torch.float64))
        got = ln(x)
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).sum(-1, keepdim=True) / 5  # divide by C, not C - 1
    explicit = ln.weight.detach() * (x - mu) / torch.sqrt(var + 1e-5) + ln.bias.detach()
    assert max_diff(got, explicit) <= 1e-12
    assert max_diff(got, F.layer_norm(x, (5,), ln.weight.detach(), ln.bias.detach(), 1e-5)) <= 1e-14
    # the unbiased (C - 1) variance would give a measurably different answer
    unbiased = ln.weight.detach() * (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) + ln.bias.detach()
    assert max_diff(got, unbiased) > 1e-3
    # the scalar reference agrees as well, row by row
    for b in range(2):
        for t in range(3):
            row = reference.layer_norm(x[b, t].tolist(), ln.weight.tolist(), ln.bias.tolist(), 1e-5)
            assert max_diff(got[b, t], torch.tensor(row, dtype=torch.float64)) <= 1e-12


def test_layernorm_normalises_each_position_separately():
    ln = LayerNorm(4, eps=1e-5).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        before = ln(x)
        x2 = x.clone()
        x2[1, 2] *= 100  # another example and position
        after = ln(x2)
    assert torch.equal(before[0], after[0])
    assert torch.equal(before[1, :2], after[1, :2])


def test_chapter_17_3_layernorm_numbers():
    ln = LayerNorm(2, eps=1e-5).double()
    with torch.no_grad():
        out = ln(torch.tensor([[1.0, 3.0], [10.0, 10.0], [2.0, 4.0], [20.0, 20.0]], dtype=torch.float64))
    assert [round(v, 6) for v in out[0].tolist()] == [-0.999995, 0.999995]
    assert out[1].tolist() == [0.0, 0.0]
    assert max_diff(out[0], torch.tensor([-1.0, 1.0], dtype=torch.float64) / math.sqrt(1.00001)) <= 1e-15
    assert [round(v, 6) for v in out[2].tolist()] == [-0.999995, 0.999995]  # exercise 2
    assert out[3].tolist() == [0.0, 0.0]
    # with another beta a constant row becomes beta
    with torch.no_grad():
        ln.bias.copy_(torch.tensor([0.25, -0.5], dtype=torch.float64))
        assert ln(torch.tensor([10.0, 10.0], dtype=torch.float64)).tolist() == [0.25, -0.5]


# ----------------------------------------------------------------------------------------------
# refusals


def table32_model() -> MiniGPT:
    return MiniGPT(ModelConfig(context=32, n_layer=1, n_head=2, n_embd=4, ffn_hidden=8, dtype="float64"), 5).eval()


def test_sequence_longer_than_position_table_is_refused():
    model = table32_model()
    assert fast(model, torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, 5)  # 32 rows: fine
    with pytest.raises(ContextTooLongError) as excinfo:
        fast(model, torch.zeros(1, 33, dtype=torch.long))
    message = str(excinfo.value)
    assert re.search(r"\b33\b", message) and re.search(r"\b32\b", message), message
    assert isinstance(excinfo.value, MinigptError)  # a user-facing refusal, not a crash


def test_kv_cache_that_would_pass_the_position_table_is_refused():
    model = table32_model()
    cache = KVCache(1, 32)
    fast(model, torch.zeros(1, 30, dtype=torch.long), cache)
    assert cache.length == 30
    with pytest.raises(ContextTooLongError) as excinfo:
        fast(model, torch.zeros(1, 3, dtype=torch.long), cache)
    message = str(excinfo.value)
    assert "33" in message and "32" in message and "30" in message, message
    assert cache.length == 30  # refused before anything was written
    fast(model, torch.zeros(1, 2, dtype=torch.long), cache)  # exactly filling the table is fine
    assert cache.length == 32
    with pytest.raises(ContextTooLongError):
        fast(model, torch.zeros(1, 1, dtype=torch.long), cache)


@pytest.mark.parametrize("bad", [5, 7, -1])
@pytest.mark.parametrize("kind", [list, torch.tensor, np.array])
def test_token_id_outside_the_vocabulary_is_refused_where_ids_enter(bad, kind):
    ids = kind([0, 1, bad, 2])
    with pytest.raises(TokenOutOfRangeError) as excinfo:
        check_token_ids(ids, 5)
    assert re.search(rf"(?<![\d-]){re.escape(str(bad))}(?!\d)", str(excinfo.value)), str(excinfo.value)
    assert "5 tokens, ids 0..4" in str(excinfo.value)
    assert isinstance(excinfo.value, MinigptError)
    check_token_ids(kind([0, 1, 4, 2]), 5)  # the largest valid id is accepted
    fast(table32_model(), torch.tensor([[0, 1, 4, 2]]))


def test_residual_add_refuses_broadcasting():
    stream = torch.zeros(2, 5, 16)
    update = torch.ones(1, 5, 16)
    assert (stream + update).shape == (2, 5, 16)  # the library would broadcast...
    with pytest.raises(ResidualShapeError) as excinfo:
        residual(stream, update)  # ...the residual refuses
    message = str(excinfo.value)
    assert "[2, 5, 16]" in message and "[1, 5, 16]" in message, message
    with pytest.raises(ResidualShapeError):
        residual(stream, torch.ones(16))
    same = torch.full((2, 5, 16), 0.5)
    assert torch.equal(residual(stream + 1, same), torch.full((2, 5, 16), 1.5))


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_last_only_with_a_cache_fills_the_cache_and_gives_the_full_forwards_logits(norm_position):
    model = randomised(small_config(norm_position=norm_position))
    ids = random_ids(2, 7)
    full = fast(model, ids)
    cache = KVCache(len(model.blocks), model.context)
    with torch.no_grad():
        first, _ = model(ids[:, :5], cache=cache, last_only=True)  # the last block saw all 5 keys...
        second, _ = model(ids[:, 5:], cache=cache, last_only=True)  # ...so the next ones can read them
    assert cache.length == 7
    assert max_diff(first, full[:, 4:5]) <= 1e-12 and max_diff(second, full[:, -1:]) <= 1e-12


def test_last_only_gives_the_last_positions_logits_of_the_full_forward():
    model = randomised(small_config())
    ids = random_ids(2, 7)
    full = fast(model, ids)
    with torch.no_grad():
        last, _ = model(ids, last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    assert max_diff(last, full[:, -1:]) <= 1e-12
    with pytest.raises(ValueError, match="last_only"):
        model(ids, targets=ids, last_only=True)


# ----------------------------------------------------------------------------------------------
# the KV cache


def test_kv_cache_token_by_token_matches_one_full_forward():
    model = randomised(small_config())
    ids = random_ids(2, 8)
    full = fast(model, ids)
    cache = KVCache(SMALL["n_layer"], SMALL["context"])
    steps = [fast(model, ids[:, t : t + 1], cache) for t in range(8)]
    assert cache.length == 8
    assert max_diff(torch.cat(steps, dim=1), full) <= 1e-10


@pytest.mark.parametrize("chunks", [(3, 1, 1, 1, 1, 1), (2, 3, 1, 2), (5, 3)])
def test_kv_cache_prefill_then_more_tokens_matches_one_full_forward(chunks):
    model = randomised(small_config())
    ids = random_ids(2, 8)
    full = fast(model, ids)
    cache = KVCache(SMALL["n_layer"], SMALL["context"])
    pieces, start = [], 0
    for n in chunks:
        pieces.append(fast(model, ids[:, start : start + n], cache))
        start += n
    assert max_diff(torch.cat(pieces, dim=1), full) <= 1e-10


def test_kv_cache_with_recorder_matches_and_records_weights_over_all_cached_keys():
    model = randomised(small_config())
    ids = random_ids(1, 6)
    full, rec_full = recorded(model, ids)
    cache = KVCache(SMALL["n_layer"], SMALL["context"])
    fast(model, ids[:, :4], cache)
    rec = Recorder(model.cfg)
    with torch.no_grad():
        step, _ = model(ids[:, 4:6], recorder=rec, cache=cache)
    assert max_diff(step, full[:, 4:6]) <= 1e-10
    weights = rec["blocks.1.attention_weights"]
    assert list(weights.shape) == [1, 4, 2, 6]
    assert max_diff(weights, rec_full["blocks.1.attention_weights"][:, :, 4:6]) <= 1e-10


# ----------------------------------------------------------------------------------------------
# initialisation, activations, tied embeddings


def test_loss_at_initialisation_is_close_to_log_vocabulary():
    torch.manual_seed(0)
    V = 512
    model = MiniGPT(ModelConfig(), V).eval()  # the default config: 4 x 128, context 32
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (4, 32), generator=g)
    targets = torch.randint(0, V, (4, 32), generator=g)
    with torch.no_grad():
        logits, loss = model(ids, targets)
    assert logits.shape == (4, 32, V)
    assert abs(float(loss) - math.log(V)) < 0.1
    assert abs(float(loss) - float(F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1)))) < 1e-6


def test_no_targets_means_no_loss():
    model = MiniGPT(small_config(), VOCAB)
    logits, loss = model(random_ids(1, 3))
    assert loss is None and logits.shape == (1, 3, VOCAB)


@pytest.mark.parametrize(
    "activation, hidden_fn",
    [
        ("gelu", lambda pre, F_: F.gelu(pre)),
        # GPT-2's tanh approximation, written out as transformers' gelu_new writes it
        (
            "gelu_tanh",
            lambda pre, F_: 0.5 * pre * (1 + torch.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre**3))),
        ),
        ("swiglu", lambda pre, F_: F.silu(pre[..., :F_]) * pre[..., F_:]),
    ],
)
def test_gelu_gelu_tanh_and_swiglu_hidden_widths_and_values(activation, hidden_fn):
    cfg = small_config(activation=activation)
    model = randomised(cfg)
    F_ = cfg.ffn_hidden
    W1 = model.blocks[0].ffn.W1
    assert W1.weight.shape == ((2 * F_ if activation == "swiglu" else F_), cfg.n_embd)
    assert model.blocks[0].ffn.W2.weight.shape == (cfg.n_embd, F_)
    logits, rec = recorded(model, random_ids(2, 5))
    assert logits.shape == (2, 5, VOCAB)
    for i, block in enumerate(model.blocks):
        hidden = rec[f"blocks.{i}.hidden"]
        assert hidden.shape == (2, 5, F_)
        with torch.no_grad():
            expected = hidden_fn(block.ffn.W1(rec[f"blocks.{i}.norm2"]), F_)
        assert max_diff(hidden, expected) <= 1e-12
        assert (hidden < 0).any()  # unlike ReLU, all three let negative values through
    assert max_diff(fast(model, random_ids(2, 5)), logits) <= 1e-12


def test_gelu_tanh_is_gpt2_s_approximation_and_not_the_exact_gelu():
    """GPT-2's GELU (transformers' gelu_new) is the tanh approximation; at x = 1 it is 0.841192 where
    the exact one, x Phi(x), is 0.841345: two activations, told apart by name."""
    x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0], dtype=torch.float64)
    exact = [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()]
    tanh = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x.tolist()]
    for name, expected in (("gelu", exact), ("gelu_tanh", tanh)):
        ffn = MiniGPT(small_config(activation=name), VOCAB).blocks[0].ffn
        with torch.no_grad():
            ffn.W1.weight.zero_()
            ffn.W1.weight[: len(x), 0] = x  # hidden unit j sees x_j when the input is e_0
            ffn.W1.bias.zero_()
            e0 = torch.zeros(1, SMALL["n_embd"], dtype=torch.float64)
            e0[0, 0] = 1.0
            got = ffn.activate(ffn.W1(e0))[0, : len(x)].tolist()
        assert max(abs(a - b) for a, b in zip(got, expected)) <= 1e-15
    assert abs(tanh[3] - 0.8411919906082768) <= 1e-15 and abs(exact[3] - 0.8413447460685429) <= 1e-15


def test_tie_embeddings_shares_one_tensor_between_token_table_and_head():
    tied = MiniGPT(small_config(tie_embeddings=True), VOCAB)
    untied = MiniGPT(small_config(), VOCAB)
    assert tied.head.weight is tied.token_table.weight
    assert tied.head.weight.data_ptr() == tied.token_table.weight.data_ptr()
    assert tied.head.weight.dtype == torch.float64  # still shared after the dtype conversion
    assert untied.head.weight is not untied.token_table.weight
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * SMALL["n_embd"]
    with torch.no_grad():
        tied.token_table.weight[3, 0] = 42.0
    assert tied.head.weight.detach()[3, 0].item() == 42.0
