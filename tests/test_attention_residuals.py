"""Attention Residuals (`[model] residual = "attention"`, Kimi Team, arXiv 2603.15031) held against a
second implementation written here from the equations, not from minigpt's code: plain Python floats
and explicit loops over the depth sources, reading the model's parameters by name only (as
reference.py does for the ordinary block), agreeing with the model's logits within 1e-12 in float64.

The equations (paper section 3, Eq. 2-6, Algorithm 1; minigpt's choices where the paper is open):

    layers        every attention and every FFN sublayer, in order (the paper's L = 2 x blocks)
    v_0           the embedding: token row (+ position row with learned positions)
    v_j           layer j's output (what an ordinary residual would add)
    sources(l)    [v_0, b_1, ..., b_{n-1}, p]: b_k the sum of the outputs of completed block k,
                  p the sum of the current block's outputs so far, absent while that block is empty
                  (full form: every layer its own block, so sources(l) = [v_0, v_1, ..., v_{l-1}])
    alpha_i       softmax over i of w_l . RMSNorm(source_i), RMSNorm without a gain, eps = norm_eps
    h_l           sum_i alpha_i source_i (the un-normed sources); the sublayer reads its own pre-norm of h_l
    logits        head(final_norm(h_final)), h_final the same read over every source after the last layer,
                  with its own pseudo-query

Then: the recorded depth weights (sum to 1, one weight per source, uniform at initialisation), and
every command on such a model: train (the loss falls, the queries move), resume bitwise, sample (the
KV cache gives the full-pass tokens), trace (the depth weights per layer) and the refusals.
"""

from __future__ import annotations

import json
import math

import pytest
import reference  # tests/ is on sys.path under `pytest` and `python -m pytest` alike
import torch
from conftest import SHAKESPEARE, TINY_CONFIG, trained_and_resumed
from test_positions import assert_samples_agree
from typer.testing import CliRunner

from minigpt.cli import app
from minigpt.config import ModelConfig, load_config
from minigpt.model.gpt import MiniGPT
from minigpt.model.recorder import Recorder

VOCAB = 13
CONTEXT = 8
IDS = [[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]]  # two sequences: the depth read is per example and position
ATTENTION = '"attention"'  # the TOML value of [model] residual for --set


# As the tiny config says (threads = 1): tiny matmuls only lose from a second thread (conftest.py).
pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------------------------
# the reference: scalars and loops, from the equations above


def rms_key(x: list[float], eps: float) -> list[float]:
    """RMSNorm without a gain: x_c / sqrt(mean(x^2) + eps)."""
    total = 0.0
    for v in x:
        total += v * v
    denom = math.sqrt(total / len(x) + eps)
    return [v / denom for v in x]


def depth_read(sources: list[list[float]], query: list[float], eps: float) -> tuple[list[float], list[float]]:
    """One position's read over depth: (alpha over the sources, h = sum_i alpha_i source_i)."""
    logits = []
    for source in sources:
        key = rms_key(source, eps)
        dot = 0.0
        for c in range(len(query)):
            dot += query[c] * key[c]
        logits.append(dot)
    alpha = reference.softmax(logits)
    h = []
    for c in range(len(query)):
        total = 0.0
        for i in range(len(sources)):
            total += alpha[i] * sources[i][c]
        h.append(total)
    return alpha, h


def read_all(sources: list[list[list[float]]], query: list[float], eps: float):
    """Every position's read over the sources (each [T][C]): (weights [T][S], h [T][C])."""
    reads = [depth_read([source[t] for source in sources], query, eps) for t in range(len(sources[0]))]
    return [r[0] for r in reads], [r[1] for r in reads]


def norm_row(x: list[float], gain, bias, kind: str, eps: float) -> list[float]:
    if kind == "none":
        return list(x)
    if kind == "layernorm":
        return reference.layer_norm(x, gain, bias, eps)
    normed = rms_key(x, eps)  # rmsnorm: the same rescaling, then the gain
    return [gain[c] * normed[c] for c in range(len(x))]


def rotate(row: list[float], position: int, n_head: int, theta: float) -> list[float]:
    """rope on one query or key row [C]: in each head of width d, coordinate i pairs with i + d/2 and
    the pair turns by position * theta^(-2i/d) radians (the half-split layout)."""
    C = len(row)
    d = C // n_head
    out = list(row)
    for h in range(n_head):
        for i in range(d // 2):
            angle = position * theta ** (-2 * i / d)
            a, b = row[h * d + i], row[h * d + i + d // 2]
            out[h * d + i] = a * math.cos(angle) - b * math.sin(angle)
            out[h * d + i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def attention(rows: list[list[float]], p: dict, n_head: int, theta: float | None) -> list[list[float]]:
    """Causal multi-head attention over one sequence (reference.attention's arithmetic), with rope's
    turn of every query and key by its position when `theta` is given."""
    if theta is None:
        return reference.attention(rows, p["qkv_w"], p["qkv_b"], p["out_w"], p["out_b"], n_head)[0]
    T, C = len(rows), len(rows[0])
    d = C // n_head
    projected = [reference.linear(row, p["qkv_w"], p["qkv_b"]) for row in rows]
    q = [rotate(x[0:C], t, n_head, theta) for t, x in enumerate(projected)]
    k = [rotate(x[C : 2 * C], t, n_head, theta) for t, x in enumerate(projected)]
    v = [x[2 * C : 3 * C] for x in projected]
    joined = [reference.zeros(C) for _ in range(T)]
    for h in range(n_head):
        lo, hi = h * d, (h + 1) * d
        for i in range(T):
            scores = []
            for j in range(i + 1):
                dot = 0.0
                for c in range(lo, hi):
                    dot += q[i][c] * k[j][c]
                scores.append(dot / math.sqrt(d))
            weights = reference.softmax(scores)
            for c in range(lo, hi):
                total = 0.0
                for j in range(i + 1):
                    total += weights[j] * v[j][c]
                joined[i][c] = total
    return [reference.linear(row, p["out_w"], p["out_b"]) for row in joined]


def layer_list(cfg: ModelConfig) -> list[tuple[int, str]]:
    """(block, "attention" | "ffn") for every layer, in order."""
    kinds = ("attention", "ffn") if cfg.ffn_hidden > 0 else ("attention",)
    return [(block, kind) for block in range(cfg.n_layer) for kind in kinds]


def layers_per_block(cfg: ModelConfig) -> int:
    """S = L / N: the layers summed into one block (1 in the full form, N = 0)."""
    L = len(layer_list(cfg))
    return 1 if cfg.attention_residual_blocks == 0 else L // cfg.attention_residual_blocks


def expected_groups(cfg: ModelConfig) -> tuple[list[list[list[str]]], list[list[str]]]:
    """The sources each layer reads (in order) and those the final norm reads, each source the list
    of the layers it sums (`b{block}.{attention|ffn}`, or `embedding`), from Eq. 6: v_0, the
    completed blocks, and the current block's partial sum once it has an output."""
    S = layers_per_block(cfg)
    names = [f"b{block}.{kind}" for block, kind in layer_list(cfg)]
    per_layer = []
    for j in range(len(names)):
        completed = [names[k * S : (k + 1) * S] for k in range(j // S)]
        partial = [names[(j // S) * S : j]] if j % S else []
        per_layer.append([["embedding"], *completed, *partial])
    final = [["embedding"], *(names[k * S : (k + 1) * S] for k in range(len(names) // S))]
    return per_layer, final


def expected_sources(cfg: ModelConfig) -> tuple[list[int], int]:
    """How many sources each layer reads, and the final norm."""
    per_layer, final = expected_groups(cfg)
    return [len(groups) for groups in per_layer], len(final)


def add_rows(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [reference.add(a[t], b[t]) for t in range(len(a))]


def attnres_forward(state: dict[str, list], cfg: ModelConfig, ids: list[list[int]]) -> dict:
    """The whole model on a batch of id lists, from {parameter name: nested list}.

    Returns {"input": [B][T][C], "layers": [{"block", "kind", "weights": [B][T][S_l], "read": [B][T][C]}],
    "final_weights": [B][T][S], "final_read": [B][T][C], "logits": [B][T][V]}."""
    eps, kind = cfg.norm_eps, cfg.norm
    theta = cfg.rope_theta if cfg.positions == "rope" else None
    E = state["token_table.weight"]
    S = layers_per_block(cfg)
    layers = layer_list(cfg)

    def norm(name: str, rows):
        return [norm_row(r, state.get(name + ".weight"), state.get(name + ".bias"), kind, eps) for r in rows]

    def linear(name: str, rows):
        return [reference.linear(r, state[name + ".weight"], state.get(name + ".bias")) for r in rows]

    result = {"input": [], "layers": [], "final_weights": [], "final_read": [], "logits": []}
    result["layers"] = [{"block": b, "kind": k, "weights": [], "read": []} for b, k in layers]
    for sequence in ids:
        x = [list(E[token]) for token in sequence]
        if cfg.positions == "learned":
            P = state["position_table.weight"]
            x = [reference.add(E[token], P[t]) for t, token in enumerate(sequence)]
        result["input"].append(x)
        completed: list[list[list[float]]] = []  # b_1, b_2, ...: each [T][C]
        partial: list[list[float]] | None = None  # the current block's sum so far; None while it is empty
        in_block = 0

        for n, (block, what) in enumerate(layers):
            p = f"blocks.{block}."
            query = state[p + ("depth1.query" if what == "attention" else "depth2.query")]
            weights, h = read_all([x, *completed, *([partial] if partial is not None else [])], query, eps)
            result["layers"][n]["weights"].append(weights)
            result["layers"][n]["read"].append(h)
            if what == "attention":
                parts = dict(
                    qkv_w=state[p + "attention.qkv.weight"],
                    qkv_b=state.get(p + "attention.qkv.bias"),
                    out_w=state[p + "attention.out.weight"],
                    out_b=state.get(p + "attention.out.bias"),
                )
                out = attention(norm(p + "norm1", h), parts, cfg.n_head, theta)
            else:
                hidden = [reference.relu(r) for r in linear(p + "ffn.W1", norm(p + "norm2", h))]
                out = linear(p + "ffn.W2", hidden)
            partial = out if partial is None else add_rows(partial, out)
            in_block += 1
            if in_block == S:  # the block is complete: its sum becomes a source of its own
                completed.append(partial)
                partial, in_block = None, 0
        weights, h = read_all(
            [x, *completed, *([partial] if partial is not None else [])], state["final_depth.query"], eps
        )
        result["final_weights"].append(weights)
        result["final_read"].append(h)
        final = norm("final_norm", h)
        result["logits"].append([reference.linear(r, state["head.weight"], None) for r in final])
    return result


# ----------------------------------------------------------------------------------------------
# models


def attnres_config(**changes) -> ModelConfig:
    shape = dict(context=CONTEXT, n_layer=3, n_head=2, n_embd=8, ffn_hidden=12, dtype="float64")
    return ModelConfig(**{**shape, "residual": "attention", **changes})


def random_model(cfg: ModelConfig, seed: int = 0) -> MiniGPT:
    """A seeded float64 model far from its initialisation: weights N(0, 0.5), norm gains 1 + N(0, 0.2)
    and biases N(0, 0.2) (so a norm read in the wrong place shows), pseudo-queries N(0, 1) (so the
    depth weights are far from uniform)."""
    torch.manual_seed(seed)
    model = MiniGPT(cfg, VOCAB).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".query"):
                parameter.copy_(torch.randn(parameter.shape, dtype=parameter.dtype))
            elif "norm" in name:
                parameter.normal_(1.0 if name.endswith(".weight") else 0.0, 0.2)
            else:
                parameter.normal_(0.0, 0.5)
    return model


def recorded(model: MiniGPT, ids) -> Recorder:
    recorder = Recorder(model.cfg)
    with torch.no_grad():
        model(torch.tensor(ids), recorder=recorder)
    return recorder


def plain(model: MiniGPT) -> dict[str, list]:
    return {name: value.tolist() for name, value in model.state_dict().items()}


def close(got: torch.Tensor, expected) -> float:
    """The largest absolute difference between a tensor and nested lists of floats."""
    return float((got - torch.tensor(expected, dtype=torch.float64)).abs().max())


CASES = {
    "full": dict(),
    "full, N = L": dict(attention_residual_blocks=6),
    "blocks of 3 layers (N = 2: a boundary inside block 1)": dict(attention_residual_blocks=2),
    "blocks of 2 layers (N = 3)": dict(attention_residual_blocks=3),
    "one block (N = 1)": dict(attention_residual_blocks=1),
    "no FFN, full": dict(ffn_hidden=0),
    "no FFN, N = 1": dict(ffn_hidden=0, attention_residual_blocks=1),
    "rope, full": dict(positions="rope"),
    "rope, N = 2": dict(positions="rope", attention_residual_blocks=2),
    "rmsnorm without biases, N = 3": dict(norm="rmsnorm", bias=False, attention_residual_blocks=3),
    "no positions, two blocks of the model": dict(positions="none", n_layer=2),
}


@pytest.mark.parametrize("changes", list(CASES.values()), ids=list(CASES))
def test_logits_and_every_depth_read_are_the_plain_loop_in_float64(changes):
    cfg = attnres_config(**changes)
    model = random_model(cfg)
    expected = attnres_forward(plain(model), cfg, IDS)
    with torch.no_grad():
        logits, _ = model(torch.tensor(IDS))
    assert close(logits, expected["logits"]) < 1e-12
    r = recorded(model, IDS)  # the written-out path (weights recorded) computes the same
    assert close(r["logits"], expected["logits"]) < 1e-12
    assert close(r["input"], expected["input"]) < 1e-12
    for layer in expected["layers"]:
        n = "1" if layer["kind"] == "attention" else "2"
        prefix = f"blocks.{layer['block']}."
        assert close(r[prefix + "depth_weights" + n], layer["weights"]) < 1e-12, (prefix, n)
        assert close(r[prefix + "read" + n], layer["read"]) < 1e-12, (prefix, n)
    assert close(r["final_depth_weights"], expected["final_weights"]) < 1e-12
    assert close(r["final_read"], expected["final_read"]) < 1e-12
    # and the random queries did make the weights far from uniform: the test is not of an average
    spread = max(max(row) - min(row) for layer in expected["layers"] for row in layer["weights"][0])
    assert spread > 0.3


def test_the_reference_is_not_blind_to_the_block_structure():
    """N = 1, 2, 3 and 6 give different logits from the same weights (so each case above tests its
    own source lists), and N = L is the full form itself."""
    full = random_model(attnres_config())
    logits = {}
    for blocks in (0, 1, 2, 3, 6):
        model = MiniGPT(attnres_config(attention_residual_blocks=blocks), VOCAB).eval()
        model.load_state_dict(full.state_dict())
        with torch.no_grad():
            logits[blocks] = model(torch.tensor(IDS))[0]
    assert torch.allclose(logits[6], logits[0], rtol=0, atol=1e-12)
    for a, b in ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)):
        assert not torch.allclose(logits[a], logits[b], atol=1e-6), (a, b)


def test_the_parameters_are_one_zero_query_per_layer_and_one_for_the_final_norm():
    cfg = attnres_config(attention_residual_blocks=2)
    torch.manual_seed(0)
    model = MiniGPT(cfg, VOCAB)
    queries = {name: p for name, p in model.named_parameters() if name.endswith(".query")}
    expected = {f"blocks.{i}.depth{n}.query" for i in range(3) for n in (1, 2)} | {"final_depth.query"}
    assert set(queries) == expected
    assert all(p.shape == (cfg.n_embd,) and not p.any() for p in queries.values())
    # attention only: no query before an FFN that is not there
    model = MiniGPT(attnres_config(ffn_hidden=0), VOCAB)
    assert {n for n, _ in model.named_parameters() if n.endswith(".query")} == {
        "blocks.0.depth1.query",
        "blocks.1.depth1.query",
        "blocks.2.depth1.query",
        "final_depth.query",
    }


def loss_of(model: MiniGPT) -> torch.Tensor:
    ids = torch.tensor(IDS)
    return model(ids[:, :-1], ids[:, 1:])[1]


@pytest.mark.parametrize("blocks", [0, 2])
def test_the_gradient_is_the_finite_difference_of_the_loss(blocks):
    """Every pseudo-query's gradient (and a few other coordinates the depth read passes through: the
    embedding reaches every layer through its key and its value) against central differences."""
    model = random_model(attnres_config(attention_residual_blocks=blocks)).train()
    loss_of(model).backward()
    checked = [(name, i) for name, _ in model.named_parameters() if name.endswith(".query") for i in (0, 3, 7)]
    checked += [("token_table.weight", 3 * 8 + 2), ("blocks.0.norm1.weight", 5), ("blocks.2.ffn.W2.weight", 17)]
    parameters = dict(model.named_parameters())
    step = 1e-6
    for name, i in checked:
        flat = parameters[name].data.view(-1)
        kept = float(flat[i])
        with torch.no_grad():
            flat[i] = kept + step
            up = float(loss_of(model))
            flat[i] = kept - step
            down = float(loss_of(model))
            flat[i] = kept
        numeric = (up - down) / (2 * step)
        assert abs(float(parameters[name].grad.view(-1)[i]) - numeric) < 1e-7 * max(1.0, abs(numeric)), (name, i)
    # the first layer's query gets none: it weighs a single source
    assert not parameters["blocks.0.depth1.query"].grad.any()


@pytest.mark.parametrize("blocks", [0, 2])
def test_recompute_gives_the_same_gradients_bitwise(blocks):
    """`[train] recompute` runs each block again in the backward pass, handing it what the blocks so
    far wrote (not one stream): the gradients must not change by a bit."""
    grads = []
    for recompute in (False, True):
        model = random_model(attnres_config(attention_residual_blocks=blocks)).train()
        model.recompute = recompute
        loss_of(model).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert all(torch.equal(grads[0][name], grads[1][name]) for name in grads[0])


# ----------------------------------------------------------------------------------------------
# the recorded depth weights


def depth_stages(cfg: ModelConfig) -> list[str]:
    names = []
    for block, kind in layer_list(cfg):
        names.append(f"blocks.{block}.depth_weights{'1' if kind == 'attention' else '2'}")
    return names


@pytest.mark.parametrize("blocks", [0, 1, 2, 3])
@pytest.mark.parametrize("trained", [False, True], ids=["at initialisation", "random queries"])
def test_depth_weights_sum_to_one_over_the_sources_each_layer_reads(blocks, trained):
    cfg = attnres_config(attention_residual_blocks=blocks)
    if trained:
        model = random_model(cfg)
    else:
        torch.manual_seed(0)
        model = MiniGPT(cfg, VOCAB).eval()
    r = recorded(model, IDS)
    counts, final = expected_sources(cfg)
    names = depth_stages(cfg)
    assert len(names) == len(counts)
    for name, count in [*zip(names, counts), ("final_depth_weights", final)]:
        weights = r[name]
        assert weights.shape == (2, 6, count), name
        assert (weights.sum(-1) - 1).abs().max() <= 1e-12, name
        assert (weights >= 0).all(), name
        if not trained:  # zero queries: every logit is 0, the softmax uniform over the sources
            assert (weights - 1 / count).abs().max() <= 1e-15, name
    # the first layer has one source, the embedding: it reads it exactly, weight 1
    assert torch.equal(r["blocks.0.depth_weights1"], torch.ones(2, 6, 1, dtype=torch.float64))
    assert torch.equal(r["blocks.0.read1"], r["input"])


def test_source_counts_follow_equation_6():
    # full form, 3 blocks with an FFN: layer l reads l sources, the final norm all 7
    assert expected_sources(attnres_config()) == ([1, 2, 3, 4, 5, 6], 7)
    # N = 2 (S = 3): [v0] [v0 p] [v0 p] | [v0 b1] [v0 b1 p] [v0 b1 p] | final [v0 b1 b2]
    assert expected_sources(attnres_config(attention_residual_blocks=2)) == ([1, 2, 2, 2, 3, 3], 3)
    # N = 1: v0 and the running sum of everything before
    assert expected_sources(attnres_config(attention_residual_blocks=1)) == ([1, 2, 2, 2, 2, 2], 2)


def test_a_block_records_the_reads_in_place_of_the_residual_sums():
    cfg = attnres_config(n_layer=2, attention_residual_blocks=2)
    names = list(recorded(random_model(cfg), IDS).stages)
    per_block = [
        "depth_weights1",
        "read1",
        "norm1",
        "attention_weights",
        "attention",
        "depth_weights2",
        "read2",
        "norm2",
        "hidden",
        "ffn",
    ]
    assert names == [
        "input",
        *(f"blocks.{i}.{stage}" for i in range(2) for stage in per_block),
        "final_depth_weights",
        "final_read",
        "final_norm",
        "logits",
    ]


# ----------------------------------------------------------------------------------------------
# sampling: the KV cache (and the folded copy) against one full pass per token


@pytest.mark.parametrize(
    "changes",
    [dict(), dict(attention_residual_blocks=2), dict(positions="rope"), dict(positions="rope", ffn_hidden=0)],
    ids=["full", "N = 2", "rope", "rope, no FFN"],
)
def test_kv_cache_and_folded_sampling_give_the_full_pass_tokens(changes):
    # from 3 tokens to 3 + 14: the window fills, then slides past the trained length
    assert_samples_agree(random_model(attnres_config(**changes), seed=4), [1, 2, 3], 14)


# ----------------------------------------------------------------------------------------------
# through the commands: train, resume, sample, trace, eval


def write_tiny(folder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.txt").write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


RUNS = {
    "full": ("model.n_layer=2", f"model.residual={ATTENTION}"),
    "N = 2": ("model.n_layer=2", f"model.residual={ATTENTION}", "model.attention_residual_blocks=2"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return {name: trained_and_resumed(tmp_path_factory.mktemp("attnres"), *sets) for name, sets in RUNS.items()}


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("name", list(RUNS))
def test_training_lowers_the_loss_and_moves_the_queries(trained, name):
    straight, _ = trained[name]
    cfg = load_config(straight / "config.toml").model
    assert cfg.residual == "attention" and cfg.attention_residual_blocks == (2 if name == "N = 2" else 0)
    losses = [r["loss"] for r in metrics(straight) if "loss" in r]
    evals = [r["val_loss"] for r in metrics(straight) if r.get("eval")]
    assert all(math.isfinite(v) for v in losses + evals)
    # 20 steps of tiny.toml take the ordinary residual from 3.95 to 3.83 (logged every 5 steps)
    assert losses[-1] < losses[0] - 0.05 and evals[-1] < evals[0]
    state = torch.load(straight / "checkpoint.pt", weights_only=True)["model"]
    queries = {k: v for k, v in state.items() if k.endswith(".query")}
    assert len(queries) == 2 * 2 + 1  # two sublayers in each of 2 blocks, and the final norm's
    # the first layer reads one source, the embedding, with weight 1 whatever its query: a softmax over
    # one logit has no gradient, so that query stays exactly at its zero initialisation; every other moved
    first = queries.pop("blocks.0.depth1.query")
    assert not first.any()
    assert all(v.abs().max() > 1e-3 for v in queries.values()), {k: float(v.abs().max()) for k, v in queries.items()}


@pytest.mark.parametrize("name", list(RUNS))
def test_an_interrupted_attention_residual_run_resumes_bitwise(trained, name):
    straight, resumed = trained[name]
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20
    assert a["model"].keys() == b["model"].keys() and "final_depth.query" in a["model"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for i, state in a["optimizer"]["state"].items():
        assert all(torch.equal(value, b["optimizer"]["state"][i][key]) for key, value in state.items()), i
    assert a["hashes"] == b["hashes"]


def test_sampling_a_trained_run_with_and_without_the_kv_cache_writes_the_same_text(trained):
    straight, _ = trained["N = 2"]
    sample = ["sample", "--run", straight, "-n", "12", "--greedy", "--prompt", "ROMEO:"]
    cached, recomputed = invoke(*sample), invoke(*sample, "--no-kv-cache")
    assert cached.exit_code == 0, cached.output
    assert recomputed.exit_code == 0, recomputed.output
    assert cached.stdout == recomputed.stdout and len(cached.stdout.strip()) > len("ROMEO:")


def test_eval_reads_an_attention_residual_run(trained):
    straight, _ = trained["full"]
    result = invoke("eval", "--run", straight, "--data", straight.parent / "tiny.txt", "--json")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and result.stdout.strip()


def traced(run, *args: str) -> str:
    """`minigpt trace --run RUN --prompt PROMPT ARGS`: its output."""
    result = invoke("trace", "--run", run, "--prompt", PROMPT, *args)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


PROMPT = "ROMEO: "


@pytest.mark.parametrize("name", list(RUNS))
def test_trace_shows_each_layers_depth_weights_over_its_sources(trained, name):
    from minigpt.runs.reading import load_model

    straight, _ = trained[name]
    cfg = load_config(straight / "config.toml")
    per_layer, final = expected_groups(cfg.model)
    model, tokenizer = load_model(cfg, straight)
    own = recorded(model, [tokenizer.encode(PROMPT)])  # the model's own weights, at the traced (last) position
    T = len(PROMPT)
    data = json.loads(traced(straight, "--json"))
    assert data["model"]["residual"] == "attention"
    entries = [entry for block in data["blocks"] for entry in block["depth"]]
    assert [e["layer"] for e in entries] == list(range(1, len(per_layer) + 1))
    for entry, (block, kind), groups in zip(entries, layer_list(cfg.model), per_layer):
        stage = f"blocks.{block}.depth_weights{'1' if kind == 'attention' else '2'}"
        assert entry["reader"] == f"b{block}.{kind}" and entry["stage"] == stage
        assert entry["layers"] == groups and entry["shape"] == [1, T, len(groups)]
        assert entry["weights"] == own[stage][0, -1].tolist()
        assert abs(math.fsum(entry["weights"]) - 1.0) < 1e-6
    last = data["final_depth"]
    assert last["reader"] == "final_norm" and last["stage"] == "final_depth_weights" and last["layers"] == final
    assert last["weights"] == own["final_depth_weights"][0, -1].tolist()
    assert data["final_read"]["row"] == own["final_read"][0, -1].tolist()

    # the logit lens after the last block reads what the final norm reads: the model's own prediction
    # (to float32 rounding: the ordinary residual's trace differs there by an ulp too)
    lens, next_tokens = data["blocks"][-1]["logit_lens"], data["next_tokens"]
    assert [c["id"] for c in lens] == [c["id"] for c in next_tokens]
    assert all(abs(a["logit"] - b["logit"]) < 1e-6 for a, b in zip(lens, next_tokens))

    text = traced(straight)
    assert text.count("depth weights at position 6") == cfg.model.n_layer + 1  # each block's, the final norm's
    lines = text.splitlines()
    for entry in entries:  # one line per layer naming it and its reader, the embedding first
        start = f"    layer {entry['layer']} ({entry['reader']}) reads embedding "
        assert any(line.startswith(start) for line in lines), start
    assert any(line.startswith("    final_norm reads embedding ") for line in lines)


def test_the_explore_page_is_answered_each_layers_depth_weights(trained):
    import minigpt
    from minigpt.explore.explorer import Explorer

    straight, _ = trained["N = 2"]
    cfg = load_config(straight / "config.toml").model
    per_layer, final = expected_groups(cfg)
    explorer = Explorer(minigpt.load(straight))
    depth = explorer.model_info()["depth"]
    assert depth["layers"] == 4 and depth["groups"] == 2 and depth["per_group"] == 2
    readers = depth["readers"]  # every layer's read, then the final norm's
    assert [r["layer"] for r in readers] == list(range(1, len(per_layer) + 2))
    assert [len(r["sources"]) for r in readers] == [len(groups) for groups in [*per_layer, final]]
    assert readers[-1]["reader"] == "final_norm"
    answer = explorer.trace({"prompt": PROMPT, "views": True})
    entries = [entry for block in answer["blocks"] for entry in block["depth"]]
    assert [len(e["weights"]) for e in entries] == [len(groups) for groups in per_layer]
    assert all(abs(math.fsum(e["weights"]) - 1.0) < 1e-6 for e in [*entries, answer["final_depth"]])


# ----------------------------------------------------------------------------------------------
# refusals: one line, exit 2, naming the key


@pytest.mark.parametrize(
    ("sets", "keys"),
    [
        ((f"model.residual={ATTENTION}", 'model.norm_position="post"'), ("residual", "norm_position")),
        ((f"model.residual={ATTENTION}", "model.attention_residual_blocks=4"), ("attention_residual_blocks",)),
        (("model.n_layer=3", f"model.residual={ATTENTION}", "model.attention_residual_blocks=4"), ("divide",)),
        (("model.attention_residual_blocks=2",), ("attention_residual_blocks", "residual")),
        (("model.residual=false", "model.attention_residual_blocks=1"), ("attention_residual_blocks",)),
    ],
    ids=["post-norm", "N does not divide 2 layers", "N does not divide 6 layers", "N without", "N with false"],
)
def test_a_contradictory_model_section_is_refused_in_one_line(tmp_path, sets, keys):
    write_tiny(tmp_path)
    args = [arg for s in sets for arg in ("--set", s)]
    result = invoke("train", "-c", tmp_path / "tiny.toml", "--quiet", *args, "--out", tmp_path / "run")
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    for key in keys:
        assert key in result.stderr, (key, result.stderr)
    assert not (tmp_path / "run").exists()  # refused before anything was written
