"""The position schemes of [model] positions (model/positions.py), each checked against a reference
written here: rope by its formula pair by pair and by transformers' Llama rotary embedding, its
relative property (a score depends on m - n alone), ALiBi's slopes as the paper's code computes
them and its biases, the scaling rules against transformers' modeling_rope_utils. Then every scheme
through what reads it: sampling (KV cache, folded norms, --extrapolate, rope scaling), the refusals
past the trained length, training's resume and identity, attribution and patching."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import SHAKESPEARE, Numbered, need, random_run, trained_and_resumed
from test_patching import ANSWER, CLEAN, CORRUPT, VERSUS, hooked_difference, hooked_values, text
from torch import Tensor
from typer.testing import CliRunner

from minigpt.cli import app
from minigpt.config import ModelConfig, SampleConfig, load_config
from minigpt.errors import MinigptError
from minigpt.inspection.patching import Patch
from minigpt.model.cache import KVCache
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.model.positions import (
    Alibi,
    RopeScaling,
    Rotary,
    alibi_slopes,
    inverse_frequencies,
    parse_rope_scaling,
)
from minigpt.model.recorder import Recorder
from minigpt.runs.identity import config_hash, training_identity
from minigpt.sampling.generate import generate

VOCAB = 13
CONTEXT = 8
SCHEMES = ("learned", "none", "rope", "alibi")
PAST_THE_TABLE = ("none", "rope", "alibi")  # the schemes that can be read past their trained length


def model_of(positions: str, *, seed: int = 3, **changes) -> MiniGPT:
    """A seeded random float64 model, every weight but the norms' drawn with std 0.5 (far from
    uniform distributions, so greedy choices are clear)."""
    shape = dict(context=CONTEXT, n_layer=2, n_head=2, n_embd=16, ffn_hidden=16, dtype="float64")
    torch.manual_seed(seed)
    model = MiniGPT(ModelConfig(**{**shape, "positions": positions, **changes}), VOCAB).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5)
    return model


def recorded(model: MiniGPT, ids: list[int], cache: KVCache | None = None) -> Recorder:
    recorder = Recorder(model.cfg)
    with torch.no_grad():
        model(torch.tensor([ids]), recorder=recorder, cache=cache)
    return recorder


def by_hand_qkv(model: MiniGPT, recorder: Recorder, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v [H, T, d] of one block, unrotated: its recorded norm1 through its qkv weights."""
    attention = model.blocks[block].attention
    norm1 = recorder[f"blocks.{block}.norm1"][0]  # [T, C]
    qkv = norm1 @ attention.qkv.weight.detach().T + attention.qkv.bias.detach()
    H, C = model.cfg.n_head, model.cfg.n_embd
    q, k, v = (part.view(-1, H, C // H).transpose(0, 1) for part in qkv.split(C, dim=-1))
    return q, k, v


# ---------------------------------------------------------------- rope: the formula, pair by pair


def rope_by_formula(x: Tensor, positions, theta: float) -> Tensor:
    """x [T, d] with row r turned to position positions[r], as rope says in the half-split layout:
    coordinate i pairs with i + d/2 and the pair turns by t * theta^(-2i/d) radians. Scalars in
    Python's float64, one pair at a time."""
    d = x.shape[-1]
    out = torch.empty_like(x, dtype=torch.float64)
    for r, t in enumerate(positions):
        for i in range(d // 2):
            angle = t * theta ** (-2 * i / d)
            a, b = float(x[r, i]), float(x[r, i + d // 2])
            out[r, i] = a * math.cos(angle) - b * math.sin(angle)
            out[r, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


@pytest.mark.parametrize("theta", [10000.0, 50.0])
def test_the_recorded_rotated_query_and_key_are_q_and_k_turned_pair_by_pair(theta):
    model = model_of("rope", rope_theta=theta, n_head=4)  # heads of width 4: two pairs each
    ids = [3, 1, 4, 1, 5, 9, 2]
    r = recorded(model, ids)
    for block in range(2):
        q, k, _ = by_hand_qkv(model, r, block)
        for h in range(4):
            for name, unrotated in (("rotated_query", q), ("rotated_key", k)):
                expected = rope_by_formula(unrotated[h], range(len(ids)), theta)
                got = r[f"blocks.{block}.{name}"][0, h]
                assert torch.allclose(got, expected, rtol=0, atol=1e-12), (block, h, name)
        # and position 0 is not turned at all
        assert torch.allclose(r[f"blocks.{block}.rotated_query"][0, :, 0], q[:, 0], rtol=0, atol=1e-12)


def test_rows_read_after_a_kv_cache_are_turned_by_their_absolute_position():
    model = model_of("rope")
    ids = [3, 1, 4, 1, 5, 9, 2]
    cache = KVCache(2, CONTEXT)
    recorded(model, ids[:4], cache)
    later = recorded(model, ids[4:], cache)  # positions 4, 5, 6
    whole = recorded(model, ids)
    for block in range(2):
        for name in ("rotated_query", "rotated_key"):
            got, expected = later[f"blocks.{block}.{name}"][0], whole[f"blocks.{block}.{name}"][0, :, 4:]
            assert torch.allclose(got, expected, rtol=0, atol=1e-12), (block, name)


@pytest.fixture(scope="module")
def llama():
    """transformers' Llama module (the test extra has it; skipped where it is not installed)."""
    return need("transformers.models.llama.modeling_llama")


def llama_config(llama, head_width: int, theta: float, context: int, scaling: RopeScaling | None = None):
    """A LlamaConfig whose rotary embedding is minigpt's rope of this head width, theta and trained
    length, with `scaling` as transformers 5's rope_parameters (max_position_embeddings: the length
    a scaled model reads; the dynamic rule reads it as the trained length)."""
    parameters = {"rope_type": "default", "rope_theta": theta}
    length = context
    if scaling is not None:
        parameters |= {"rope_type": scaling.kind, "factor": scaling.factor}
        if scaling.kind in ("yarn", "llama3"):
            parameters["original_max_position_embeddings"] = scaling.original_context or context
            length = int(scaling.factor * context)
        if scaling.kind == "yarn":
            parameters |= {"beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow, "truncate": scaling.truncate}
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if getattr(scaling, key) is not None:
                    parameters[key] = getattr(scaling, key)
        if scaling.kind == "llama3":
            parameters |= {"low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor}
    return llama.LlamaConfig(
        hidden_size=2 * head_width, num_attention_heads=2, max_position_embeddings=length, rope_parameters=parameters
    )


@pytest.mark.parametrize(
    ("head_width", "theta", "rule", "length"),
    [
        (8, 10000.0, None, 8),
        (64, 10000.0, None, 40),  # past the trained length: the same formula, further
        (128, 500000.0, None, 33),
        (64, 10000.0, "linear:4", 100),
        (64, 10000.0, "yarn:4", 100),
        (16, 10000.0, "yarn:2.5", 50),
        (64, 500000.0, "llama3:8", 100),
        (64, 10000.0, "ntk:4", 20),  # dynamic, below the trained length: plain rope
        (64, 10000.0, "ntk:4", 77),  # dynamic, above it: theta grown for this length
    ],
)
def test_cos_and_sin_tables_are_transformers_llama_bitwise_in_float32(llama, head_width, theta, rule, length):
    context = 32
    scaling = parse_rope_scaling(rule) if rule else None
    embedding = llama.LlamaRotaryEmbedding(llama_config(llama, head_width, theta, context, scaling))
    x = torch.zeros(1, length, head_width)
    their_cos, their_sin = embedding(x, torch.arange(length)[None])
    rotary = Rotary(head_width, theta, context)
    rotary.set_scaling(scaling)
    cos, sin = rotary.tables(length, torch.device("cpu"), torch.float32)
    assert torch.equal(cos[:length], their_cos[0]) and torch.equal(sin[:length], their_sin[0])

    # and the rotation itself is apply_rotary_pos_emb's, on [B, H, T, d] queries and keys
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, length, head_width, generator=generator) for _ in range(2))
    their_q, their_k = llama.apply_rotary_pos_emb(q, k, their_cos, their_sin)
    assert torch.equal(rotary.rotate(q.transpose(1, 2), 0).transpose(1, 2), their_q)
    assert torch.equal(rotary.rotate(k.transpose(1, 2), 0).transpose(1, 2), their_k)


# ---------------------------------------------------------------- rope: the relative property


def test_a_rope_score_depends_on_the_distance_between_query_and_key_only():
    d, theta = 16, 10000.0
    rotary = Rotary(d, theta, CONTEXT)
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, d, generator=generator, dtype=torch.float64) for _ in range(2))

    def score(m: int, n: int) -> float:  # the query placed at m, the key at n
        return float(rotary.rotate(q, m)[0, 0] @ rotary.rotate(k, n)[0, 0])

    for distance in (0, 1, 3, 7, 40):
        scores = [score(n + distance, n) for n in (0, 1, 5, 17, 100)]
        assert max(scores) - min(scores) < 1e-12, (distance, scores)
    # and it does depend on the distance: the property is not that of a constant
    assert abs(score(5, 0) - score(6, 0)) > 1e-3 and abs(score(9, 9) - score(9, 0)) > 1e-3


def test_turning_query_and_key_by_the_same_offset_leaves_every_score_unchanged():
    model = model_of("rope")
    r = recorded(model, [3, 1, 4, 1, 5, 9, 2, 6])
    rotary = model.positions
    for block in range(2):
        q, k, _ = by_hand_qkv(model, r, block)  # [H, T, d]
        plain = r[f"blocks.{block}.rotated_query"][0] @ r[f"blocks.{block}.rotated_key"][0].transpose(-1, -2)
        for offset in (1, 5, 29):
            turned_q = rotary.rotate(q.transpose(0, 1)[None], offset)[0].transpose(0, 1)
            turned_k = rotary.rotate(k.transpose(0, 1)[None], offset)[0].transpose(0, 1)
            shifted = turned_q @ turned_k.transpose(-1, -2)
            assert torch.allclose(shifted, plain, rtol=0, atol=1e-12), (block, offset)


class ShiftedRotary(Rotary):
    """The model's own rope tables read `by` positions further on: every query and key turned to
    its position + by (what the model computes for the same tokens read from position `by`)."""

    def __init__(self, rotary: Rotary, by: int):
        self.__dict__.update(rotary.__dict__)
        self.by = by

    def rotate(self, x: Tensor, start: int) -> Tensor:
        return super().rotate(x, start + self.by)


class ShiftedAlibi(Alibi):
    """The model's own ALiBi biases for queries and keys placed `by` positions further on."""

    def __init__(self, alibi: Alibi, by: int):
        self.__dict__.update(alibi.__dict__)
        self.by = by

    def bias(self, T: int, S: int, past: int, device, dtype) -> Tensor:
        whole = super().bias(past + self.by + T, S + self.by, 0, device, dtype)
        return whole[:, past + self.by :, self.by :]


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_the_same_tokens_read_from_a_later_position_give_the_same_logits(scheme, monkeypatch):
    model = model_of(scheme)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        plain = model(torch.tensor([ids]))[0]
        for by in (1, 6, 50):
            shifted = (ShiftedRotary if scheme == "rope" else ShiftedAlibi)(model.positions, by)
            for block in model.blocks:
                monkeypatch.setattr(block.attention, "positions", shifted)
            assert torch.allclose(model(torch.tensor([ids]))[0], plain, rtol=0, atol=1e-12), by
            # the written-out path (weights recorded) too
            assert torch.allclose(recorded(model, ids)["logits"], plain, rtol=0, atol=1e-12), by
    if scheme == "rope":  # the shift did reach the rotation: the rotated rows themselves moved
        assert not torch.allclose(
            recorded(model, ids)["blocks.0.rotated_key"], recorded(model_of(scheme), ids)["blocks.0.rotated_key"]
        )


# ---------------------------------------------------------------- ALiBi


def paper_slopes(n: int) -> list[float]:
    """The slopes as Press et al.'s reference code (attention_with_linear_biases) computes them:
    a geometric sequence starting at 2^(-8/n) for n a power of two; otherwise the power of two
    just below n, then every other slope of twice that power."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [1 / 2**i for i in range(1, 9)]  # the paper's example, exactly
    assert alibi_slopes(1) == [2**-8]
    assert alibi_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3], rel=1e-15)
    for n in (2, 3, 4, 5, 6, 7, 12, 16, 20, 24, 32):
        assert alibi_slopes(n) == pytest.approx(paper_slopes(n), rel=1e-15), n


def test_the_alibi_bias_is_minus_slope_times_distance_and_masks_the_future():
    alibi = Alibi(3, 8)  # a trained length of 8: the 40-row bias below is computed on the fly
    slopes = alibi_slopes(3)
    bias = alibi.bias(3, 6, 2, torch.device("cpu"), torch.float64)  # queries 2, 3, 4 reading keys 0..5
    assert bias.shape == (3, 3, 6)
    for h in range(3):
        for row, i in enumerate((2, 3, 4)):
            for j in range(6):
                expected = -slopes[h] * (i - j) if j <= i else float("-inf")
                assert float(bias[h, row, j]) == expected, (h, i, j)
    # a longer table afterwards, and the short one sliced from it again: the same values
    assert torch.equal(alibi.bias(40, 40, 0, torch.device("cpu"), torch.float64)[:, 2:5, :6], bias)


def test_alibi_attention_weights_are_the_softmax_of_scaled_scores_minus_slope_times_distance():
    model = model_of("alibi", n_head=4)
    ids = [3, 1, 4, 1, 5, 9, 2]
    T, d = len(ids), 4
    r = recorded(model, ids)
    slopes = alibi_slopes(4)
    for block in range(2):
        q, k, _ = by_hand_qkv(model, r, block)
        for h in range(4):
            expected = torch.empty(T, T, dtype=torch.float64)
            for i in range(T):
                scores = [float(q[h, i] @ k[h, j]) / math.sqrt(d) - slopes[h] * (i - j) for j in range(i + 1)]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                expected[i] = torch.tensor(
                    [w / math.fsum(weights) for w in weights] + [0.0] * (T - i - 1), dtype=torch.float64
                )
            got = r[f"blocks.{block}.attention_weights"][0, h]
            assert torch.allclose(got, expected, rtol=0, atol=1e-12), (block, h)


def test_alibis_fused_path_and_its_written_out_path_agree_with_and_without_a_cache():
    model = model_of("alibi")
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        fused = model(torch.tensor([ids]))[0]  # no recorder: scaled_dot_product_attention, the bias as its mask
        cache = KVCache(2, CONTEXT)
        model(torch.tensor([ids[:5]]), cache=cache)
        cached = model(torch.tensor([ids[5:]]), cache=cache)[0]  # queries 5..7: the bias sliced at past = 5
    explicit = recorded(model, ids)["logits"]
    assert torch.allclose(fused, explicit, rtol=0, atol=1e-12)
    assert torch.allclose(cached, explicit[:, 5:], rtol=0, atol=1e-12)
    # the bias matters: the same weights without it compute something else
    assert not torch.allclose(model_of("none")(torch.tensor([ids]))[0], fused, atol=1e-3)


# ---------------------------------------------------------------- scaling against transformers


@pytest.fixture(scope="module")
def rope_init():
    utils = need("transformers.modeling_rope_utils")
    return utils.ROPE_INIT_FUNCTIONS


SCALED = [
    *(("linear", f, w, 32, 32) for f in (2.0, 4.0, 8.0) for w in (8, 64, 128)),
    # dynamic: below, at and above the trained length (theta grows only above it)
    *(("dynamic", f, w, 32, n) for f in (2.0, 4.0) for w in (8, 64) for n in (16, 32, 33, 100, 1000)),
    *(("yarn", f, w, c, c) for f in (2.0, 4.0, 16.0) for w in (8, 64, 128) for c in (32, 4096)),
    *(("llama3", f, w, c, c) for f in (8.0, 32.0) for w in (64, 128) for c in (32, 8192)),
]


@pytest.mark.parametrize(("kind", "factor", "head_width", "context", "length"), SCALED)
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_inverse_frequencies_are_transformers_for_each_rule(
    rope_init, llama, kind, factor, head_width, context, length, theta
):
    scaling = RopeScaling(kind, factor)
    config = llama_config(llama, head_width, theta, context, scaling)
    # a tensor, as transformers' forward passes it (torch.max(position_ids) + 1)
    theirs, their_factor = rope_init[kind](config, "cpu", seq_len=torch.tensor(length))
    ours, our_factor = inverse_frequencies(head_width, theta, scaling, context, length)
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(ours, theirs)
    assert our_factor == their_factor


@pytest.mark.parametrize(
    "scaling",
    [
        RopeScaling("yarn", 40.0, original_context=64, mscale=1.0, mscale_all_dim=1.0),  # DeepSeek-V3's keys
        RopeScaling("yarn", 4.0, mscale=0.707, mscale_all_dim=1.0),
        RopeScaling("yarn", 4.0, attention_factor=0.5, beta_fast=16.0, beta_slow=2.0),
        RopeScaling("yarn", 8.0, truncate=False),
        RopeScaling("llama3", 8.0, low_freq_factor=2.0, high_freq_factor=8.0),
    ],
    ids=str,
)
def test_a_checkpoints_extra_scaling_keys_give_transformers_frequencies(rope_init, llama, scaling):
    config = llama_config(llama, 64, 10000.0, 64, scaling)
    theirs, their_factor = rope_init[scaling.kind](config, "cpu")
    ours, our_factor = inverse_frequencies(64, 10000.0, scaling, 64, 64)
    assert torch.equal(ours, theirs) and our_factor == their_factor


def test_linear_scaling_reads_position_f_u_as_the_plain_model_reads_u():
    plain, scaled = Rotary(16, 10000.0, CONTEXT), Rotary(16, 10000.0, CONTEXT)
    scaled.set_scaling(parse_rope_scaling("linear:2"))
    cpu = torch.device("cpu")
    for dtype in (torch.float32, torch.float64):
        cos, sin = plain.tables(CONTEXT, cpu, dtype)
        scaled_cos, scaled_sin = scaled.tables(2 * CONTEXT, cpu, dtype)
        assert torch.equal(scaled_cos[0 : 2 * CONTEXT : 2], cos[:CONTEXT])
        assert torch.equal(scaled_sin[0 : 2 * CONTEXT : 2], sin[:CONTEXT])


def test_a_scaled_rope_model_accepts_factor_times_context_and_refuses_one_more():
    model = model_of("rope").read_with(rope_scaling="linear:2")
    assert model.window == 2 * CONTEXT and model.cache_reach == 2 * CONTEXT
    with torch.no_grad():
        model(torch.zeros(1, 2 * CONTEXT, dtype=torch.long))
        with pytest.raises(ContextTooLongError) as refusal:
            model(torch.zeros(1, 2 * CONTEXT + 1, dtype=torch.long))
    message = refusal.value.for_command_line
    assert "\n" not in message and "(read with rope scaling linear:2: 16 tokens)" in message
    assert "use at most 16 tokens" in message and "--extrapolate" in message
    assert model_of("rope").read_with(rope_scaling="yarn:3").window == 3 * CONTEXT


def test_rope_scaling_on_a_model_without_rope_is_refused_naming_the_flag():
    for scheme in ("learned", "none", "alibi"):
        with pytest.raises(MinigptError) as refusal:
            model_of(scheme).read_with(rope_scaling="linear:2")
        message = refusal.value.for_command_line
        assert message.startswith("--rope-scaling linear:2 is refused") and f'are "{scheme}"' in message


def greedy_by_full_passes(model: MiniGPT, prompt: list[int], n: int) -> tuple[list[int], Tensor]:
    """Greedy tokens and their logits by the plainest loop: one whole forward pass per token over
    the text's last `model.window` tokens (all of it where the model is read without a bound)."""
    text, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            seen = text if model.window is None else text[-model.window :]
            logits.append(model(torch.tensor([seen]))[0][0, -1])
            text.append(int(logits[-1].argmax()))
    return text[len(prompt) :], torch.stack(logits)


def greedy(model: MiniGPT, prompt: list[int], n: int, **how) -> tuple[list[int], Tensor]:
    """Greedy tokens and their logits as sampling draws them (generate.py)."""
    steps = list(generate(model, prompt, SampleConfig(max_new_tokens=n, greedy=True), **how))
    return [int(step.tokens[0]) for step in steps], torch.stack([step.logits[0] for step in steps])


def assert_samples_agree(model: MiniGPT, prompt: list[int], n: int) -> list[int]:
    """KV cache and no cache, folded and unfolded: the tokens of the full-pass loop, logits within
    float64 rounding."""
    expected, logits = greedy_by_full_passes(model, prompt, n)
    assert len(set(expected)) > 2, expected  # a model whose choices tell the paths apart
    for how in ({}, {"use_cache": False}, {"fast_path": False}, {"use_cache": False, "fast_path": False}):
        tokens, got = greedy(model, prompt, n, **how)
        assert tokens == expected, how
        assert torch.allclose(got, logits, rtol=0, atol=1e-10), how
    return expected


def test_dynamic_ntk_sampling_recomputes_past_the_trained_length_and_matches_no_cache():
    model = model_of("rope").read_with(rope_scaling="ntk:2")
    assert model.window == 2 * CONTEXT and model.cache_reach == CONTEXT  # keys turn with the length past 8
    assert_samples_agree(model, [1, 2, 3], 3 * CONTEXT)  # past 8 (recomputed), then past 16 (sliding)
    # the rule changes what is read past the trained length, and only there: steps 0..5 read 3..8
    # tokens, step 6 reads 9
    scaled = greedy_by_full_passes(model, [1, 2, 3], CONTEXT)[1]
    plain = greedy_by_full_passes(model_of("rope").read_with(extrapolate=True), [1, 2, 3], CONTEXT)[1]
    assert torch.equal(scaled[: CONTEXT - 2], plain[: CONTEXT - 2])
    assert not torch.allclose(scaled[CONTEXT - 2], plain[CONTEXT - 2], atol=1e-6)


def test_the_dynamic_rule_keeps_one_lengths_tables_not_one_per_length_read():
    rotary = model_of("rope").read_with(rope_scaling="ntk:4").positions
    cpu = torch.device("cpu")
    plain = rotary.tables(CONTEXT, cpu, torch.float64)
    for length in range(CONTEXT + 1, 8 * CONTEXT):  # a text recomputed a token at a time past the trained length
        rotary.tables(length, cpu, torch.float64)
    assert sorted(key[0] for key in rotary._tables) == [0, 8 * CONTEXT - 1]
    assert rotary.tables(CONTEXT, cpu, torch.float64)[0] is plain[0]  # within the trained length: computed once


@pytest.mark.parametrize("rule", ["linear:2", "yarn:2"])
def test_scaled_rope_sampling_with_a_cache_is_the_full_pass_loop(rule):
    assert_samples_agree(model_of("rope").read_with(rope_scaling=rule), [1, 2, 3], 3 * CONTEXT)


def test_sampling_from_a_scaled_rope_run_accepts_factor_times_context_tokens(rope_run):
    runner = CliRunner()
    prompt = SHAKESPEARE.read_text(encoding="utf-8")[: 2 * CONTEXT + 1]
    sample = ["sample", "--run", rope_run, "-n", "3", "--greedy", "--prompt"]
    accepted = runner.invoke(app, [*sample, prompt[:-1], "--rope-scaling", "linear:2"])
    assert accepted.exit_code == 0, accepted.output
    refused = runner.invoke(app, [*sample, prompt, "--rope-scaling", "linear:2"])
    assert refused.exit_code == 2 and refused.stderr.count("\n") == 1
    assert "the prompt has 17 tokens" in refused.stderr and "use at most 16 tokens" in refused.stderr
    assert "--extrapolate" in refused.stderr and "Traceback" not in refused.stderr


# ---------------------------------------------------------------- every scheme through sampling


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kv_cache_and_folded_sampling_give_the_full_pass_tokens_for_every_scheme(scheme):
    # from 3 tokens to 3 + 14: the window fills, then slides past the trained length
    assert_samples_agree(model_of(scheme), [1, 2, 3], 14)


@pytest.mark.parametrize("scheme", PAST_THE_TABLE)
def test_extrapolated_sampling_reads_the_whole_text_with_a_growing_cache(scheme):
    model = model_of(scheme).read_with(extrapolate=True)
    assert model.window is None and model.cache_reach is None
    tokens = assert_samples_agree(model, [1, 2, 3], 3 * CONTEXT)
    # not a sliding window in disguise: past the trained length the logits are the whole text's
    sliding = greedy_by_full_passes(model_of(scheme), [1, 2, 3], 3 * CONTEXT)
    assert sliding[0] != tokens


@pytest.mark.parametrize("scheme", PAST_THE_TABLE)
def test_a_kv_cache_grows_past_its_capacity_when_read_past_the_trained_length(scheme):
    model = model_of(scheme).read_with(extrapolate=True)
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
    cache = KVCache(2, CONTEXT)  # room for the trained length only
    with torch.no_grad():
        model(torch.tensor([ids[:5]]), cache=cache)
        for end in range(6, len(ids) + 1):
            step = model(torch.tensor([ids[end - 1 : end]]), cache=cache, last_only=True)[0][0, -1]
            whole = model(torch.tensor([ids[:end]]))[0][0, -1]
            assert torch.allclose(step, whole, rtol=0, atol=1e-10), end
    assert cache.length == len(ids)


def test_a_learned_table_refuses_extrapolate_in_one_line():
    model = model_of("learned")
    with pytest.raises(ContextTooLongError) as refusal:
        model.read_with(extrapolate=True)
    line = refusal.value.for_command_line
    assert "\n" not in line and line.startswith("--extrapolate is refused for this model")
    assert "position table has 8 rows" in line
    assert str(refusal.value).startswith("extrapolate=True is refused for this model")
    assert model.window == CONTEXT  # and the model is read as before


@pytest.mark.parametrize("scheme", PAST_THE_TABLE)
def test_past_the_trained_length_the_refusal_names_extrapolate(scheme):
    model = model_of(scheme)
    with pytest.raises(ContextTooLongError) as refusal:
        model.check_length(9, "the prompt", "shorten the prompt")
    line = refusal.value.for_command_line
    assert "\n" not in line
    assert line == (
        "the prompt has 9 tokens but the model was trained on at most 8 ([model] context = 8); with positions = "
        f'"{scheme}" it has no table to run out of, but it was never trained past that length, so use at most 8 '
        "tokens: shorten the prompt, or pass --extrapolate to read past it on purpose"
    )
    assert str(refusal.value).endswith("or pass extrapolate=True to read past it on purpose")  # the API's words
    model.read_with(extrapolate=True).check_length(1000, "the prompt")  # crossed on purpose: accepted


def test_a_learned_table_keeps_its_message():
    with pytest.raises(ContextTooLongError) as refusal:
        model_of("learned").check_length(9, "the prompt", "shorten the prompt")
    assert refusal.value.for_command_line == (
        "the prompt has 9 tokens but the position table has 8 rows ([model] context = 8); the model has no row "
        "for position 8 and will not invent one, so use at most 8 tokens: shorten the prompt"
    )


# ---------------------------------------------------------------- training: resume and identity


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return {
        scheme: trained_and_resumed(tmp_path_factory.mktemp(scheme), f'model.positions="{scheme}"')
        for scheme in ("rope", "alibi")
    }


@pytest.fixture(scope="module")
def rope_run(trained):
    return trained["rope"][0]


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_an_interrupted_rope_or_alibi_run_resumes_bitwise(trained, scheme):
    straight, resumed = trained[scheme]
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20
    assert load_config(straight / "config.toml").model.positions == scheme
    assert a["model"].keys() == b["model"].keys() and "position_table.weight" not in a["model"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for i, state in a["optimizer"]["state"].items():
        assert all(torch.equal(value, b["optimizer"]["state"][i][key]) for key, value in state.items()), i
    assert a["hashes"] == b["hashes"]


def test_a_run_without_rope_theta_keeps_its_identity():
    plain = load_config(None)
    assert "rope_theta" not in training_identity(plain)["model"]  # hashed as runs before rope were
    rope = training_identity(load_config(None, ['model.positions="rope"']))
    assert rope["model"]["positions"] == "rope" and "rope_theta" not in rope["model"]
    # the key written out at its default is the run without it: the same hash
    explicit = training_identity(load_config(None, ['model.positions="rope"', "model.rope_theta=10000.0"]))
    assert config_hash(explicit) == config_hash(rope)
    other = training_identity(load_config(None, ['model.positions="rope"', "model.rope_theta=500000.0"]))
    assert other["model"]["rope_theta"] == 500000.0 and config_hash(other) != config_hash(rope)


# ---------------------------------------------------------------- attribution and patching stay exact


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_attribution_parts_sum_to_the_logit_with_positions_inside_attention(scheme):
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=8, ffn_hidden=16, context=8, dtype="float64", positions=scheme)
    run = random_run(cfg, 50, Numbered(), seed=0, std=0.3)
    ids = [3, 1, 4, 1, 5, 9]
    for position, token, versus in [(5, 7, None), (2, 11, 13), (0, 4, 40)]:
        result = run.attribute(ids=ids, position=position, answer=token, versus=versus)
        names = [part.name for part in result.parts]
        assert names[0] == "token" and "position" not in names  # no position row enters the stream
        assert [n for n in names if n.startswith("2.")] == ["2.attention.head0", "2.attention.head1"] + [
            "2.attention.bias",
            "2.ffn",
        ]
        with torch.no_grad():
            logits = run.model(torch.tensor([ids]))[0][0, position]
        total = float(logits[token] - (logits[versus] if versus is not None else 0))
        assert result.total == pytest.approx(total, abs=1e-12)
        assert abs(math.fsum(part.value for part in result.parts) - total) < 1e-12
        assert abs(result.error) < 1e-12


@pytest.fixture(scope="module", params=["rope", "alibi"])
def patching_run(request):
    cfg = ModelConfig(n_layer=3, n_head=2, n_embd=8, ffn_hidden=16, context=8, dtype="float64", positions=request.param)
    return random_run(cfg, 12, Numbered(), seed=0)


@pytest.mark.parametrize("by", ["stage", "head"])
def test_patching_effects_equal_hooks_with_positions_inside_attention(patching_run, by):
    run = patching_run
    result = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by=by)
    clean = hooked_values(run.model, CLEAN)
    high, low = float(clean["difference"]), float(hooked_values(run.model, CORRUPT)["difference"])
    assert result.clean.logit_difference == pytest.approx(high, abs=1e-12)
    assert result.corrupt.logit_difference == pytest.approx(low, abs=1e-12)
    for e in result.effects:
        expected = (hooked_difference(run.model, clean, Patch(e.block, e.stage, e.position, e.head), 4) - low) / (
            high - low
        )
        assert e.effect == pytest.approx(expected, abs=1e-9), e


def test_patching_end_points_stay_one_and_zero_with_positions_inside_attention(patching_run):
    result = patching_run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS)
    last = len(CLEAN) - 1
    assert result.effect(2, "output", last) == 1.0  # the last block's output at the last position: the clean run
    for e in result.effects:
        if e.position < 2:  # before the first difference: the clean and corrupt rows are the same
            assert e.effect == 0.0, e
        if e.block == 2 and e.stage != "input" and e.position < last:  # past the last attention: reaches nothing
            assert e.effect == 0.0, e
