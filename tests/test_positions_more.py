"""The newer [model] position keys (model/positions.py) and `init` (model/init.py), each held against a
reference written here from its paper's definition, not from minigpt's code: sinusoidal positions
(Vaswani et al.'s table, scalar by scalar), T5's relative bias (its buckets, transformers' rule, and one
learned table shared by every block), rope on a share of each head (GPT-NeoX's rotary_pct), and Xavier's
initialisation (each matrix within its own Glorot bound; gpt2's the weights every earlier run drew).

The reference is a plain float64 forward pass over heads and positions from the state dict alone: its
logits, every block's attention weights, rope's rotated rows and the sinusoidal rows agree with the model
and its trace within 1e-12, inside the trained length and past it (--extrapolate), and through sampling
with a KV cache. The commands are tests/test_positions_more_commands.py's."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import Numbered, need
from torch import Tensor

from minigpt.config import ModelConfig, SampleConfig
from minigpt.model.cache import KVCache
from minigpt.model.gpt import ContextTooLongError, MiniGPT
from minigpt.model.positions import t5_buckets
from minigpt.model.recorder import Recorder
from minigpt.sampling.generate import generate

TOLERANCE = 1e-12
VOCAB = 13
CONTEXT = 24
PAST = CONTEXT + 12  # read with --extrapolate
T5 = dict(positions="t5", t5_buckets=8, t5_max_distance=12)  # buckets 4..7 logarithmic within 24 tokens
SCHEMES = {
    "sinusoidal": dict(positions="sinusoidal"),
    "t5": T5,
    "rope 0.5": dict(positions="rope", rope_fraction=0.5),  # heads 8 wide: r = 4
    "rope 0.25": dict(positions="rope", rope_fraction=0.25),  # r = 2
}
IDS = torch.randint(0, VOCAB, (PAST,), generator=torch.Generator().manual_seed(2)).tolist()


def model_of(scheme: str, seed: int = 0) -> MiniGPT:
    """A seeded random float64 model, every weight (the norms' too) drawn with std 0.5: 2 blocks, 2 heads
    of width 8."""
    shape = dict(context=CONTEXT, n_layer=2, n_head=2, n_embd=16, ffn_hidden=16, dtype="float64")
    torch.manual_seed(seed)
    model = MiniGPT(ModelConfig(**shape, **SCHEMES[scheme]), VOCAB).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


# ---------------------------------------------------------------- the reference, from the papers


def sinusoid(t: int, c: int, width: int) -> float:
    """Vaswani et al.: PE[t, 2i] = sin(t / 10000^(2i/C)), PE[t, 2i + 1] = cos(t / 10000^(2i/C))."""
    angle = t / 10000 ** (2 * (c // 2) / width)
    return math.sin(angle) if c % 2 == 0 else math.cos(angle)


def t5_bucket(n: int, buckets: int, max_distance: int) -> int:
    """T5's bucket of a distance n = i - j >= 0 (causal): half the buckets hold one distance each, the
    rest split the distances up to max_distance logarithmically, every farther one the last bucket."""
    exact = buckets // 2
    if n < exact:
        return n
    return min(exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact)), buckets - 1)


def rope_share(x: Tensor, fraction: float, theta: float = 10000.0) -> Tensor:
    """x [T, d], row t turned by position t on its first r = int(d fraction) coordinates: coordinate i
    pairs with i + r/2 and the pair turns by t theta^(-2i/r); the other d - r pass unchanged."""
    T, d = x.shape
    r = int(d * fraction)
    out = x.clone()
    for i in range(r // 2):
        angle = torch.tensor([t * theta ** (-2 * i / r) for t in range(T)], dtype=torch.float64)
        a, b = x[:, i], x[:, i + r // 2]
        out[:, i] = a * torch.cos(angle) - b * torch.sin(angle)
        out[:, i + r // 2] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def layer_norm(x: Tensor, gain: Tensor, bias: Tensor, eps: float) -> Tensor:
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + eps) * gain + bias


def reference(model: MiniGPT, ids: list[int], tables: list[Tensor] | None = None) -> dict:
    """logits [T, V], and per block its attention weights [H, T, T] and (rope) rotated queries and keys
    [H, T, d], from the state dict alone; `tables`: T5's bias table each block reads (default: the
    model's, the same for every block), which may require a gradient."""
    cfg = model.cfg
    w = {name: value.detach() for name, value in model.state_dict().items()}
    T, C, H = len(ids), cfg.n_embd, cfg.n_head
    d = C // H
    x = w["token_table.weight"][ids]
    out = {"blocks": []}
    if cfg.positions == "sinusoidal":
        out["position_rows"] = torch.tensor(
            [[sinusoid(t, c, C) for c in range(C)] for t in range(T)], dtype=torch.float64
        )
        x = x + out["position_rows"]
    out["input"] = x
    for b in range(cfg.n_layer):
        p = f"blocks.{b}."
        table = (tables or [w.get("relative_bias.weight")] * cfg.n_layer)[b]
        h = layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], cfg.norm_eps)
        qkv = h @ w[p + "attention.qkv.weight"].T + w[p + "attention.qkv.bias"]
        q, k, v = qkv[:, :C], qkv[:, C : 2 * C], qkv[:, 2 * C :]
        weights, rotated_q, rotated_k, mixed = [], [], [], []
        for head in range(H):
            qh, kh, vh = (m[:, head * d : (head + 1) * d] for m in (q, k, v))
            if cfg.positions == "rope":
                qh, kh = rope_share(qh, cfg.rope_fraction), rope_share(kh, cfg.rope_fraction)
                rotated_q.append(qh)
                rotated_k.append(kh)
            rows, heads = [], []
            for i in range(T):
                scores = torch.stack([qh[i] @ kh[j] / math.sqrt(d) for j in range(i + 1)])
                if cfg.positions == "t5":
                    buckets = [t5_bucket(i - j, cfg.t5_buckets, cfg.t5_max_distance) for j in range(i + 1)]
                    scores = scores + table[buckets, head]
                e = torch.exp(scores - scores.max().detach())
                a = e / e.sum()
                rows.append(torch.cat((a, torch.zeros(T - i - 1, dtype=torch.float64))))
                heads.append(a @ vh[: i + 1])
            weights.append(torch.stack(rows))
            mixed.append(torch.stack(heads))
        x = x + torch.cat(mixed, dim=-1) @ w[p + "attention.out.weight"].T + w[p + "attention.out.bias"]
        h = layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"], cfg.norm_eps)
        hidden = torch.relu(h @ w[p + "ffn.W1.weight"].T + w[p + "ffn.W1.bias"])
        x = x + hidden @ w[p + "ffn.W2.weight"].T + w[p + "ffn.W2.bias"]
        block = {"attention_weights": torch.stack(weights)}
        if rotated_q:
            block |= {"rotated_query": torch.stack(rotated_q), "rotated_key": torch.stack(rotated_k)}
        out["blocks"].append(block)
    final = layer_norm(x, w["final_norm.weight"], w["final_norm.bias"], cfg.norm_eps)
    out["logits"] = final @ w["head.weight"].T
    return out


def close(got, expected) -> bool:
    return torch.allclose(torch.as_tensor(got, dtype=torch.float64), expected, rtol=0, atol=TOLERANCE)


# ---------------------------------------------------------------- the model and its trace


@pytest.mark.parametrize("past", [False, True], ids=["inside", "extrapolated"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_logits_attention_weights_and_position_rows_are_the_references(scheme, past):
    from minigpt.inspection.trace import trace_position

    model = model_of(scheme)
    ids = IDS if past else IDS[:CONTEXT]
    if past:
        with pytest.raises(ContextTooLongError):
            model(torch.tensor([ids]))
        model.read_with(extrapolate=True)
    expected = reference(model, ids)
    with torch.no_grad():
        assert close(model(torch.tensor([ids]))[0][0], expected["logits"])  # the fused kernel's path
    trace = trace_position(model, Numbered(), ids, all_positions=True)  # the written-out path, recorded
    assert close(trace.whole(None, "logits"), expected["logits"])
    assert close(trace.whole(None, "input"), expected["input"])
    for b, block in enumerate(expected["blocks"]):
        assert close(trace.whole(b, "attention_weights"), block["attention_weights"]), b
        for name in ("rotated_query", "rotated_key"):
            if name in block:
                assert close(trace.whole(b, name), block[name]), (b, name)
    if scheme == "sinusoidal":
        rows = expected["position_rows"]
        assert close(trace.all_positions["position_rows"], rows)
        assert close(trace.input.position_row, rows[-1])
        assert trace.input.position_table_shape == [len(ids), 16]
        assert close(model.position_rows(len(ids) - 3, 3), rows[-3:])
    else:
        assert trace.input.position_row is None and "position_rows" not in trace.all_positions
    if scheme == "t5":  # the logarithmic buckets are read, not only the exact ones
        assert {t5_bucket(n, 8, 12) for n in range(len(ids))} == set(range(8))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_kv_cache_read_a_token_at_a_time_past_the_trained_length_gives_the_references_logits(scheme):
    model = model_of(scheme).read_with(extrapolate=True)
    expected = reference(model, IDS)["logits"]
    cache = KVCache(2, CONTEXT)  # room for the trained length only: it grows
    with torch.no_grad():
        assert close(model(torch.tensor([IDS[:5]]), cache=cache)[0][0], expected[:5])
        for t in range(5, PAST):
            step = model(torch.tensor([IDS[t : t + 1]]), cache=cache, last_only=True)[0][0, -1]
            assert close(step, expected[t]), t
    assert cache.length == PAST


def sampled(model: MiniGPT, prompt: list[int], n: int, **how) -> tuple[list[int], Tensor]:
    """Tokens drawn at temperature 1 (seeded) and each step's logits, as sampling draws them."""
    steps = list(generate(model, prompt, SampleConfig(max_new_tokens=n, temperature=1.0, seed=5), **how))
    return [int(step.tokens[0]) for step in steps], torch.stack([step.logits[0] for step in steps])


@pytest.mark.parametrize("extrapolate", [False, True])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_sampling_with_a_cache_and_folded_draws_from_the_references_logits(scheme, extrapolate):
    model = model_of(scheme).read_with(extrapolate=extrapolate)
    prompt, n = [1, 2, 3], CONTEXT + 8  # within the trained length the window slides past 24 tokens
    tokens, logits = sampled(model, prompt, n)
    assert len(set(tokens)) > 4, tokens  # choices that tell the paths apart
    text = prompt + tokens
    for step in range(n):  # each step reads the text so far (extrapolated), else its last 24 tokens
        seen = text[: len(prompt) + step]
        window = seen if extrapolate else seen[-CONTEXT:]
        assert close(logits[step], reference(model, window)["logits"][-1]), step
    for how in ({"use_cache": False}, {"fast_path": False}, {"use_cache": False, "fast_path": False}):
        again, their_logits = sampled(model, prompt, n, **how)
        assert again == tokens and close(their_logits, logits), how


# ---------------------------------------------------------------- T5's buckets and its one table


@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 12), (16, 40), (2, 5), (10, 7), (64, 256)])
def test_t5_buckets_are_the_papers_and_transformers(buckets, max_distance):
    distances = torch.arange(301)
    ours = t5_buckets(distances, buckets, max_distance).tolist()
    assert ours == [t5_bucket(n, buckets, max_distance) for n in range(301)]
    t5 = need("transformers.models.t5.modeling_t5")
    theirs = t5.T5Attention._relative_position_bucket(
        -distances, bidirectional=False, num_buckets=buckets, max_distance=max_distance
    )  # memory position - query position = j - i
    assert ours == theirs.tolist()
    if (buckets, max_distance) == (32, 128):  # T5's: 0..15 alone, then 16 bins up to 128, then the last
        assert ours[:16] == list(range(16)) and ours[16:19] == [16, 16, 16] and ours[112:114] == [30, 31]


def test_the_t5_bias_is_one_table_for_every_block_and_its_gradient_gathers_from_all_of_them():
    model = model_of("t5")
    names = [name for name, _ in model.named_parameters() if "relative" in name]
    assert names == ["relative_bias.weight"] and model.relative_bias.weight.shape == (8, 2)
    assert all(block.attention.positions is model.positions for block in model.blocks)
    assert model.positions.table is model.relative_bias
    ids = IDS[:CONTEXT]
    readout = torch.randn(CONTEXT, VOCAB, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    table = model.relative_bias.weight.detach().clone().requires_grad_()
    (reference(model, ids, [table, table])["logits"] * readout).sum().backward()
    for recorder in (None, Recorder(model.cfg)):  # the fused kernel, then the written-out path
        model.zero_grad()
        (model(torch.tensor([ids]), recorder=recorder)[0][0] * readout).sum().backward()
        assert close(model.relative_bias.weight.grad, table.grad)
    # both blocks contribute: block 1's share alone (block 0 reading a constant table) is not the whole
    alone = model.relative_bias.weight.detach().clone().requires_grad_()
    (reference(model, ids, [table.detach(), alone])["logits"] * readout).sum().backward()
    assert (alone.grad - table.grad).abs().max() > 1e-3


# ---------------------------------------------------------------- init


def glorot_bound(matrix: Tensor) -> float:
    fan_out, fan_in = matrix.shape
    return math.sqrt(6 / (fan_in + fan_out))


def head_config(**changes) -> ModelConfig:
    shape = dict(context=16, n_layer=2, n_head=4, n_embd=64, ffn_hidden=96, init="xavier")
    return ModelConfig(**{**shape, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(n_kv_head=2, positions="t5"),
        dict(n_kv_head=1, head_width=24, tie_embeddings=True, positions="rope"),
        dict(activation="swiglu", positions="sinusoidal"),
    ],
    ids=["mha", "gqa-t5", "mqa-wide-tied", "swiglu-sinusoidal"],
)
def test_xavier_draws_each_matrix_within_its_own_glorot_bound(changes):
    cfg = head_config(**changes)
    torch.manual_seed(0)
    model = MiniGPT(cfg, 200)
    H, K, d = cfg.n_head, cfg.kv_heads, cfg.resolved_head_width
    matrices = {}
    for b, block in enumerate(model.blocks):
        q, k, v = block.attention.qkv.weight.detach().split((H * d, K * d, K * d))
        assert q.shape == (H * d, 64) and k.shape == v.shape == (K * d, 64)
        matrices |= {f"{b}.W_Q": q, f"{b}.W_K": k, f"{b}.W_V": v, f"{b}.W_O": block.attention.out.weight}
        if cfg.activation == "swiglu":  # W1 stores the gate and the value matrices, each with its own fans
            gate, value = block.ffn.W1.weight.chunk(2)
            matrices |= {f"{b}.W1.gate": gate, f"{b}.W1.value": value}
        else:
            matrices[f"{b}.W1"] = block.ffn.W1.weight
        matrices[f"{b}.W2"] = block.ffn.W2.weight
    if not cfg.tie_embeddings:
        matrices["head"] = model.head.weight
    for name, matrix in matrices.items():
        matrix = matrix.detach()
        bound = glorot_bound(matrix)
        assert matrix.abs().max() <= bound, name
        assert matrix.abs().max() > 0.9 * bound, name  # the whole range is used, not a narrower one
        assert float(matrix.std()) == pytest.approx(bound / math.sqrt(3), rel=0.08), name
    tables = {"token_table": model.token_table.weight}
    tables |= {"position_table": model.position_table.weight} if cfg.positions == "learned" else {}
    for name, table in tables.items():
        assert float(table.detach().std()) == pytest.approx(64**-0.5, rel=0.05), name
    if cfg.positions == "t5":  # a table too: 32 x 4 values
        assert float(model.relative_bias.weight.detach().std()) == pytest.approx(64**-0.5, rel=0.3)
    for name, parameter in model.named_parameters():
        if name.endswith("bias") and "relative" not in name:
            assert torch.equal(parameter, torch.zeros_like(parameter)), name
        if "norm" in name and name.endswith("weight"):
            assert torch.equal(parameter, torch.ones_like(parameter)), name
    if cfg.tie_embeddings:
        assert model.head.weight is model.token_table.weight


def weights_of(cfg: ModelConfig, seed: int = 0) -> dict[str, Tensor]:
    torch.manual_seed(seed)
    return MiniGPT(cfg, 11).state_dict()


def small(**changes) -> ModelConfig:
    return ModelConfig(**{**dict(context=8, n_layer=2, n_head=2, n_embd=16, ffn_hidden=32), **changes})


# math.fsum of every parameter and of their squares, and the token table's first value, as the code
# before `init` existed drew them (seed 0, vocabulary 11): float.hex, so the check is bitwise
BEFORE_INIT = {
    "default": ({}, "0x1.3d601e9122ea0p+6", "0x1.458d1ca2bcb9bp+6", "0x1.d8ed440000000p-5"),
    "rope gqa tied": (
        dict(positions="rope", n_kv_head=1, tie_embeddings=True),
        "0x1.38eaccd0d5220p+6",
        "0x1.443d7e2e61fcbp+6",
        "0x1.3d778e0000000p-6",
    ),
    "alibi no biases": (
        dict(positions="alibi", bias=False, n_head=4),
        "0x1.3c4522ccf44a0p+6",
        "0x1.45625dede8782p+6",
        "-0x1.ea532a0000000p-7",
    ),
}


@pytest.mark.parametrize("case", list(BEFORE_INIT))
def test_gpt2_init_draws_the_weights_every_earlier_run_drew(case):
    changes, total, squares, first = BEFORE_INIT[case]
    default = weights_of(small(**changes))
    named = weights_of(small(**changes, init="gpt2"))
    assert default.keys() == named.keys() and all(torch.equal(default[k], named[k]) for k in default)
    torch.manual_seed(0)
    values = [v for p in MiniGPT(small(**changes), 11).parameters() for v in p.detach().flatten().tolist()]
    assert (math.fsum(values).hex(), math.fsum(v * v for v in values).hex()) == (total, squares)
    assert float(default["token_table.weight"][0, 0]).hex() == first
    xavier = weights_of(small(**changes, init="xavier"))
    assert not torch.equal(xavier["blocks.0.attention.qkv.weight"], default["blocks.0.attention.qkv.weight"])


def test_xavier_and_gpt2_differ_only_in_the_drawn_matrices_and_tables():
    gpt2, xavier = weights_of(small()), weights_of(small(init="xavier"))
    drawn = {k for k in gpt2 if not torch.equal(gpt2[k], xavier[k])}
    assert drawn == {k for k in gpt2 if k.endswith("weight") and "norm" not in k}
