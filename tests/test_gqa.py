"""Grouped-query attention (`[model] n_kv_head`), heads of their own width (`head_width`) and the
per-part biases (`qkv_bias`, `out_bias`, `ffn_bias`) through everything that reads the model.

The model is held against an independent float64 reference written here from the definition, a
plain loop over the query heads in which head h reads key and value head h // (n_head / n_kv_head):
its logits and the trace's recorded stages (attention weights, the heads' mixed values, rope's
rotated queries and keys, the gradient) agree within 1e-12. Then the readers: the attribution's
parts (one per query head, each through its d columns of W_O [C, n_head d]) sum to the logit; the
patching end points hold by stage and by head, and a head's patch is what tracing that patch gives;
sampling with the KV cache (n_kv_head heads) writes what recomputing writes; the folded copy
computes what the model does; info's counts are the tensors'; training resumes bitwise, LoRA trains
on it (torchrun computing what one process does is tests/test_distributed.py's); refusals are
one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import CORPUS, trained_and_resumed
from typer.testing import CliRunner

import minigpt
from minigpt.cli import app
from minigpt.config import ModelConfig, SampleConfig, load_config
from minigpt.counts import parameter_counts
from minigpt.memory import lora_parameter_count
from minigpt.model.fold import fold_norms
from minigpt.model.gpt import MiniGPT
from minigpt.runs.folder import write_model_run
from minigpt.sampling.generate import generate
from minigpt.text.tokenizer import TextTokenizer, train_tokenizer

TOLERANCE = 1e-12  # float64: the model and the reference differ only in the order of their sums

# Each a [model] section on top of BASE: K = 1 (multi-query), K = H / 2, K = H (written out), a head
# width of its own, one bias part alone, rope, ALiBi and learned positions.
CONFIGS = {
    "K=1 learned layernorm gelu biases": dict(n_head=4, n_kv_head=1, activation="gelu"),
    "K=H/2 rope rmsnorm swiglu head_width qkv_bias": dict(
        n_head=4,
        n_kv_head=2,
        head_width=6,
        positions="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        qkv_bias=True,
    ),
    "K=H head_width learned out_bias ffn_bias": dict(
        n_head=2, n_kv_head=2, head_width=10, bias=False, out_bias=True, ffn_bias=True
    ),
    "K=H/2 rope no biases": dict(n_head=4, n_kv_head=2, positions="rope", bias=False, activation="relu"),
    "K=H/4 alibi qkv_bias": dict(n_head=4, n_kv_head=1, head_width=2, positions="alibi", bias=False, qkv_bias=True),
}
BASE = dict(context=16, n_layer=2, n_embd=16, ffn_hidden=24, dtype="float64")


def toml_value(value) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower()


def write_config(folder: Path, model: dict, name: str = "gqa.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["[model]", *(f"{k} = {toml_value(v)}" for k, v in {**BASE, **model}.items())]
    lines += [
        "[tokenizer]",
        'kind = "char"',
        "vocab_size = 300",
        "[train]",
        'out = "run"',
        'device = "cpu"',
        "threads = 1",
    ]
    path = folder / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_run(folder: Path, model: dict, seed: int = 0) -> Path:
    """A seeded random float64 run folder (weights std 0.5, norms' gains and biases too, so every
    part matters), its tokenizer fitted to CORPUS."""
    cfg = load_config(write_config(folder, model))
    tokenizer = TextTokenizer(train_tokenizer("char", cfg.tokenizer.vocab_size, CORPUS))
    torch.manual_seed(seed)
    built = MiniGPT(cfg.model, tokenizer.vocab_size).eval()
    with torch.no_grad():
        for parameter in built.parameters():
            parameter.normal_(0.0, 0.5)
    write_model_run(cfg.run_dir, cfg, built, tokenizer)
    return cfg.run_dir


@pytest.fixture(scope="module", params=list(CONFIGS))
def run(request, tmp_path_factory):
    return minigpt.load(make_run(tmp_path_factory.mktemp("gqa"), CONFIGS[request.param]))


IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


# ---------------------------------------------------------------- the reference, from the definition


def norm(x: torch.Tensor, kind: str, gain, bias, eps: float) -> torch.Tensor:
    if kind == "layernorm":
        centred = x - x.mean(-1, keepdim=True)
        out = centred / torch.sqrt((centred**2).mean(-1, keepdim=True) + eps) * gain
        return out if bias is None else out + bias
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * gain  # rmsnorm


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, d], row t turned by position t: coordinate i pairs with i + d/2, the pair by
    t * theta^(-2i/d) radians."""
    T, d = x.shape
    out = torch.empty_like(x)
    for i in range(d // 2):
        angle = torch.arange(T, dtype=torch.float64) * theta ** (-2 * i / d)
        a, b = x[:, i], x[:, i + d // 2]
        out[:, i] = a * torch.cos(angle) - b * torch.sin(angle)
        out[:, i + d // 2] = a * torch.sin(angle) + b * torch.cos(angle)
    return out


def alibi_slope(h: int, n_head: int) -> float:
    return 2 ** (-8 * (h + 1) / n_head)  # the paper's slopes for a power-of-two head count


def reference(cfg: ModelConfig, weights: dict[str, torch.Tensor], ids: list[int], x: torch.Tensor | None = None):
    """logits [T, V] and per block its attention weights [H, T, T], heads [H, T, d] and rotated
    queries [H, T, d] and keys [K, T, d], from `weights` (the state dict) alone; `x`: the input
    rows to start from (default: token rows plus position rows)."""
    w = {k: v.double() for k, v in weights.items()}
    H, C = cfg.n_head, cfg.n_embd
    K = cfg.n_kv_head or H
    d = cfg.head_width or C // H
    T = len(ids)
    if x is None:
        x = w["token_table.weight"][ids]
        if cfg.positions == "learned":
            x = x + w["position_table.weight"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    recorded = []
    for b in range(cfg.n_layer):
        p = f"blocks.{b}."
        n1 = norm(x, cfg.norm, w[p + "norm1.weight"], w.get(p + "norm1.bias"), cfg.norm_eps)
        qkv = n1 @ w[p + "attention.qkv.weight"].T
        if p + "attention.qkv.bias" in w:
            qkv = qkv + w[p + "attention.qkv.bias"]
        # rows: H query heads, then K key heads, then K value heads, d rows each
        queries = [qkv[:, h * d : (h + 1) * d] for h in range(H)]
        keys = [qkv[:, (H + j) * d : (H + j + 1) * d] for j in range(K)]
        values = [qkv[:, (H + K + j) * d : (H + K + j + 1) * d] for j in range(K)]
        if cfg.positions == "rope":
            queries = [rope(q, cfg.rope_theta) for q in queries]
            keys = [rope(k, cfg.rope_theta) for k in keys]
        weights_h, heads = [], []
        for h in range(H):
            j = h // (H // K)  # the key and value head query head h reads
            scores = queries[h] @ keys[j].T / math.sqrt(d)
            if cfg.positions == "alibi":
                distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]
                scores = scores - alibi_slope(h, H) * distance.double()
            a = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            weights_h.append(a)
            heads.append(a @ values[j])
        joined = torch.cat(heads, dim=-1)  # [T, H d]
        attention = joined @ w[p + "attention.out.weight"].T
        if p + "attention.out.bias" in w:
            attention = attention + w[p + "attention.out.bias"]
        r1 = x + attention
        n2 = norm(r1, cfg.norm, w[p + "norm2.weight"], w.get(p + "norm2.bias"), cfg.norm_eps)
        pre = n2 @ w[p + "ffn.W1.weight"].T + w.get(p + "ffn.W1.bias", 0.0)
        if cfg.activation == "swiglu":
            gate, up = pre[:, : cfg.ffn_hidden], pre[:, cfg.ffn_hidden :]
            hidden = gate * torch.sigmoid(gate) * up
        elif cfg.activation == "gelu":
            hidden = 0.5 * pre * (1 + torch.erf(pre / math.sqrt(2)))
        else:
            hidden = pre.clamp(min=0)
        x = r1 + hidden @ w[p + "ffn.W2.weight"].T + w.get(p + "ffn.W2.bias", 0.0)
        recorded.append(
            {
                "attention_weights": torch.stack(weights_h),
                "heads": torch.stack(heads),
                "rotated_query": torch.stack(queries),
                "rotated_key": torch.stack(keys),
            }
        )
    final = norm(x, cfg.norm, w["final_norm.weight"], w.get("final_norm.bias"), cfg.norm_eps)
    return final @ w["head.weight"].T, recorded


def test_the_configs_are_what_they_say(run):
    cfg = run.model.cfg
    attention = run.model.blocks[0].attention
    H, K, d = cfg.n_head, cfg.kv_heads, cfg.resolved_head_width
    assert attention.qkv.weight.shape == (H * d + 2 * K * d, cfg.n_embd)
    assert attention.out.weight.shape == (cfg.n_embd, H * d)
    assert (attention.qkv.bias is not None) == (cfg.bias or cfg.qkv_bias)
    assert (attention.out.bias is not None) == (cfg.bias or cfg.out_bias)
    assert (run.model.blocks[0].ffn.W1.bias is not None) == (cfg.bias or cfg.ffn_bias)


def test_logits_and_every_recorded_stage_agree_with_the_reference(run):
    model, cfg = run.model, run.model.cfg
    expected, blocks = reference(cfg, model.state_dict(), IDS)
    with torch.no_grad():
        fast = model(torch.tensor([IDS]))[0][0]  # the fused kernel (enable_gqa)
    assert (fast - expected).abs().max() < TOLERANCE
    trace = run.trace(ids=IDS)
    assert (trace.recorded["logits"][0] - expected).abs().max() < TOLERANCE
    for b, own in enumerate(blocks):
        assert (trace.whole(b, "attention_weights") - own["attention_weights"]).abs().max() < TOLERANCE
        assert (trace.whole(b, "heads") - own["heads"]).abs().max() < TOLERANCE
        if cfg.positions == "rope":  # [H, T, d] and [K, T, d]: the keys are the kv heads' alone
            assert trace.whole(b, "rotated_key").shape == (cfg.kv_heads, len(IDS), cfg.resolved_head_width)
            assert (trace.whole(b, "rotated_query") - own["rotated_query"]).abs().max() < TOLERANCE
            assert (trace.whole(b, "rotated_key") - own["rotated_key"]).abs().max() < TOLERANCE
            data = trace.as_dict()["blocks"][b]
            assert data["rotated_shape"] == [1, cfg.n_head, len(IDS), cfg.resolved_head_width]
            assert data["rotated_key_shape"] == [1, cfg.kv_heads, len(IDS), cfg.resolved_head_width]
        # the JSON's weights at the traced position: one row per query head
        assert len(trace.blocks[b].attention_weights) == cfg.n_head


def test_the_gradient_is_the_reference_s_by_autograd(run):
    model, cfg = run.model, run.model.cfg
    trace = run.trace(ids=IDS, grad=True)
    target, p = trace.gradient.target_id, trace.position
    ids = IDS
    x = model.token_table.weight.detach()[ids].double()
    if cfg.positions == "learned":
        x = x + model.position_table.weight.detach()[: len(ids)].double()
    x.requires_grad_(True)
    logits, _ = reference(cfg, model.state_dict(), ids, x)
    loss = -torch.log_softmax(logits[p], dim=-1)[target]
    (grad,) = torch.autograd.grad(loss, x)
    assert abs(trace.gradient.loss - loss.item()) < TOLERANCE
    assert (torch.tensor(trace.gradient.input.row, dtype=torch.float64) - grad[p]).abs().max() < TOLERANCE


def test_ablating_a_query_head_zeroes_it_alone_and_leaves_its_kv_head_to_the_others(run):
    cfg = run.model.cfg
    h = cfg.n_head - 1
    modified = run.trace(ids=IDS, ablate_head=[f"0.{h}"], compare=False)
    plain = run.trace(ids=IDS)
    heads, before = modified.whole(0, "heads"), plain.whole(0, "heads")
    assert not heads[h].any()
    assert torch.equal(heads[:h], before[:h])  # the heads sharing its key and value head are untouched
    assert torch.equal(modified.whole(0, "attention_weights"), plain.whole(0, "attention_weights"))


# ---------------------------------------------------------------- the readers


def test_attribution_has_a_part_per_query_head_and_the_parts_sum_to_the_logit(run):
    model, cfg = run.model, run.model.cfg
    for versus in (None, "#2"):
        result = run.attribute(ids=IDS, answer="#7", versus=versus)
        names = [part.name for part in result.parts]
        for b in range(cfg.n_layer):
            assert [n for n in names if n.startswith(f"{b}.attention.head")] == [
                f"{b}.attention.head{h}" for h in range(cfg.n_head)
            ]
            assert (f"{b}.attention.bias" in names) == (model.blocks[b].attention.out.bias is not None)
        assert abs(math.fsum(part.value for part in result.parts) - result.total) < 1e-10
        assert abs(result.error) < 1e-10
    # an ablated query head is a zero part, and the rest still sum to the modified pass's logit
    ablated = run.attribute(ids=IDS, answer="#7", ablate_head=["1.0"])
    assert next(p.value for p in ablated.parts if p.name == "1.attention.head0") == 0.0
    assert abs(ablated.error) < 1e-10


CLEAN, CORRUPT = [3, 1, 4, 1, 5, 9, 2, 6], [3, 1, 4, 7, 5, 9, 2, 6]  # they differ at position 3


def test_patching_by_stage_and_by_head_keeps_its_end_points(run):
    cfg, last = run.model.cfg, run.model.cfg.n_layer - 1
    first_difference = 3
    by_stage = run.patch(CLEAN, CORRUPT, "#7", "#2", by="stage")
    effects = {(e.block, e.stage, e.position): e.effect for e in by_stage.effects}
    assert effects[(last, "output", len(CLEAN) - 1)] == 1.0
    assert all(e.effect == 0.0 for e in by_stage.effects if e.position is not None and e.position < first_difference)
    by_head = run.patch(CLEAN, CORRUPT, "#7", "#2", by="head")
    assert {(e.block, e.head) for e in by_head.effects} == {
        (b, h) for b in range(cfg.n_layer) for h in range(cfg.n_head)
    }
    assert all(e.effect == 0.0 for e in by_head.effects if e.position is not None and e.position < first_difference)
    # a head's patch is what tracing that patch gives: the head put back is the query head named
    high, low = by_head.clean.logit_difference, by_head.corrupt.logit_difference
    for e in by_head.effects:
        if e.position is None and e.head in (0, cfg.n_head - 1):
            patch = {"clean": CLEAN, "block": e.block, "stage": "heads", "position": None, "head": e.head}
            logits = run.trace(ids=CORRUPT, patch=patch, compare=False).recorded["logits"][0, -1]
            traced = (float(logits[7] - logits[2]) - low) / (high - low)
            assert abs(traced - e.effect) < 1e-9, (e, traced)


def test_sampling_with_the_kv_cache_writes_what_recomputing_writes(run):
    model = run.model
    settings = SampleConfig(max_new_tokens=20, temperature=1.0, seed=5)  # 4 + 20 > context 16: the window slides
    cached = list(generate(model, IDS[:4], settings, use_cache=True))
    recomputed = list(generate(model, IDS[:4], settings, use_cache=False))
    assert [s.tokens.tolist() for s in cached] == [s.tokens.tolist() for s in recomputed]
    for a, b in zip(cached, recomputed):
        assert (a.logits - b.logits).abs().max() < 1e-10
    # the cache holds the kv heads alone
    from minigpt.model.cache import KVCache

    cache = KVCache(model.cfg.n_layer, 16)
    with torch.no_grad():
        model(torch.tensor([IDS]), cache=cache)
    assert cache.layers[0].keys.shape == (1, model.cfg.kv_heads, 16, model.cfg.resolved_head_width)


def test_the_folded_copy_computes_what_the_model_computes(run):
    with torch.no_grad():
        folded = fold_norms(run.model)(torch.tensor([IDS]))[0]
        plain = run.model(torch.tensor([IDS]))[0]
    assert (folded - plain).abs().max() < 1e-12


def test_each_counted_part_is_its_tensors_and_they_add_up_to_num_parameters(run):
    model, cfg = run.model, run.model.cfg
    counts = parameter_counts(cfg, model.vocab_size)
    named = {p.name: counts.count(p) for p in counts.block}
    attention = model.blocks[0].attention
    H, K, d = cfg.n_head, cfg.kv_heads, cfg.resolved_head_width
    rows = {"W_Q": slice(0, H * d), "W_K": slice(H * d, (H + K) * d), "W_V": slice((H + K) * d, None)}
    for name, part in rows.items():
        bias = attention.qkv.bias[part].numel() if attention.qkv.bias is not None else 0
        assert named[f"attention.{name}"] == attention.qkv.weight[part].numel() + bias, name
    assert named["attention.W_O"] == sum(p.numel() for p in attention.out.parameters())
    assert named["ffn.W1"] == sum(p.numel() for p in model.blocks[0].ffn.W1.parameters())
    assert counts.count(counts.block_formula) == sum(p.numel() for p in model.blocks[0].parameters())
    assert counts.total == model.num_parameters()


def test_info_counts_the_model_s_real_parameters(run):
    result = CliRunner().invoke(app, ["info", "--run", str(run.path), "--json"])
    assert result.exit_code == 0, result.output
    parameters = json.loads(result.stdout)["parameters"]
    real = sum(p.numel() for p in run.model.parameters())
    assert parameters["total"] == parameters["num_parameters"] == real
    text = CliRunner().invoke(app, ["info", "--run", str(run.path)]).stdout
    assert "the total equals num_parameters()" in text
    assert f"d = {run.model.cfg.resolved_head_width} (a head's width)" in text


def test_trace_names_the_kv_head_each_query_head_reads(run):
    cfg = run.model.cfg
    result = CliRunner().invoke(app, ["trace", "--run", str(run.path), "--ids", "3,1,4", "--block", "0"])
    assert result.exit_code == 0, result.output
    grouped = cfg.kv_heads != cfg.n_head
    assert ("attention = GQA(norm1)" in result.stdout) == grouped
    assert (f"{cfg.kv_heads} kv heads," in result.stdout) == grouped
    header = next(i for i, line in enumerate(result.stdout.splitlines()) if line.strip().startswith("key  token"))
    under = result.stdout.splitlines()[header + 1].split()
    if grouped:
        assert under == [f"{w}" for h in range(cfg.n_head) for w in ("kv", str(h // (cfg.n_head // cfg.kv_heads)))]
    else:
        assert under[0] == "0"  # no kv row: the weights start


def test_comparing_runs_of_other_kv_heads_or_head_width_is_refused_naming_the_key(tmp_path):
    from minigpt.inspection.comparison import shape_differences

    def built(**changes):
        return MiniGPT(ModelConfig(**{**BASE, "n_head": 4, **changes}), 20)

    assert shape_differences(built(), built(n_kv_head=4)) == []  # 4 of 4 is the default's shape
    assert shape_differences(built(), built(n_kv_head=2)) == ["n_kv_head 4 != 2"]
    assert shape_differences(built(), built(head_width=4)) == []
    assert shape_differences(built(), built(head_width=6)) == ["head_width 4 != 6"]


# ---------------------------------------------------------------- the commands: train, resume, LoRA, refusals


GQA_SETS = (
    "model.n_layer=2",
    "model.n_kv_head=1",
    "model.head_width=6",
    'model.positions="rope"',
    'model.norm="rmsnorm"',
    'model.activation="swiglu"',
    "model.bias=false",
    "model.qkv_bias=true",
)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(straight, resumed): tiny.toml as a GQA model trained 20 steps, and the same run cut short
    by a power cut at step 20 and resumed from its checkpoint of step 10."""
    return trained_and_resumed(tmp_path_factory.mktemp("gqa-train"), *GQA_SETS)


def test_a_gqa_run_trains_and_resumes_bitwise(trained):
    straight, resumed = trained
    a = torch.load(straight / "checkpoint.pt", weights_only=True)
    b = torch.load(resumed / "checkpoint.pt", weights_only=True)
    assert a["step"] == b["step"] == 20
    assert a["model"]["blocks.0.attention.qkv.weight"].shape == ((2 + 2 * 1) * 6, 16)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    losses = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    evals = [r["val_loss"] for r in losses if r.get("eval")]
    assert all(math.isfinite(v) for v in evals) and evals[-1] < evals[0]


def test_lora_trains_on_a_gqa_model_with_adapters_of_its_shapes(trained, tmp_path):
    straight, _ = trained
    lora = tmp_path / "lora"
    targets = "qkv,out,W1,W2"
    sets = ["--set", "train.lora_rank=2", "--set", f'train.lora_targets="{targets}"']
    result = invoke(
        "train",
        "-c",
        straight / "config.toml",
        "--init-from",
        straight,
        "--out",
        lora,
        "--steps",
        "10",
        "--quiet",
        *sets,
    )
    assert result.exit_code == 0, result.output
    state = torch.load(lora / "checkpoint.pt", weights_only=True)["model"]
    adapters = {k: v for k, v in state.items() if k.endswith(("lora_A", "lora_B"))}
    H, K, d = 2, 1, 6
    assert adapters["blocks.0.attention.qkv.lora_B"].shape == ((H + 2 * K) * d, 2)
    assert adapters["blocks.0.attention.out.lora_A"].shape == (2, H * d)
    assert any(v.abs().max() > 0 for k, v in adapters.items() if k.endswith("lora_B"))  # they trained
    cfg = load_config(lora / "config.toml").model
    assert lora_parameter_count(cfg, 2, targets) == sum(v.numel() for v in adapters.values())
    info = json.loads(invoke("info", "--run", lora, "--json").stdout)
    assert info["memory"]["gradients"] == 4 * sum(v.numel() for v in adapters.values())  # float32
    attribution = minigpt.load(lora).attribute(ids=[1, 2, 3], answer="#4")
    assert abs(attribution.error) < 1e-4


@pytest.mark.parametrize(
    "name, biases",
    [
        ("ffn", {"ffn_bias": True}),
        ("swiglu", {"ffn_bias": True}),
        ("attention", {"qkv_bias": True, "out_bias": True}),
        ("block", {"qkv_bias": True, "ffn_bias": True}),
    ],
)
def test_a_learner_s_module_gets_the_bias_its_part_has(name, biases):
    """bias = false with a part's own bias: the learner's module is built with that part's bias, so
    the model holds the tensors minigpt's own would (one state dict loads into the other)."""
    from dataclasses import replace

    from minigpt.config import load_config, with_exercise
    from minigpt.exercises.learner import read_learner
    from minigpt.exercises.plug import parts_of

    solutions = Path(__file__).parent / "data" / "exercises"
    cfg = with_exercise(replace(load_config(None), model=replace(ModelConfig(), exercise=name))).model
    cfg = replace(cfg, n_layer=1, n_head=2, n_embd=8, ffn_hidden=12, context=8, bias=False, **biases)
    mine = MiniGPT(cfg, 11, parts_of(read_learner(name, solutions / f"{name}.py")))
    own = MiniGPT(replace(cfg, exercise="none"), 11)
    assert mine.state_dict().keys() == own.state_dict().keys()
    assert any(key.endswith(".bias") for key in own.state_dict())


def test_the_attention_exercise_with_only_one_of_qkv_bias_and_out_bias_is_refused(tmp_path):
    from minigpt.errors import ConfigError

    path = write_config(tmp_path, {"n_head": 2, "bias": False, "qkv_bias": True, "exercise": "attention"})
    with pytest.raises(ConfigError, match="one bias switch for W_Q, W_K, W_V and W_O together"):
        load_config(path)


@pytest.mark.parametrize(
    "change, expected",
    [
        ("model.n_kv_head=3", "n_kv_head = 3 does not divide n_head = 2"),
        ("model.head_width=5", 'positions = "rope" with heads of width 5'),
    ],
)
def test_a_kv_head_count_that_does_not_divide_and_an_odd_rope_head_are_refused_in_one_line(tmp_path, change, expected):
    from conftest import TINY_CONFIG

    (tmp_path / "tiny.txt").write_text("hello world\n" * 50, encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(TINY_CONFIG, encoding="utf-8")
    result = invoke(
        "train",
        "-c",
        tmp_path / "tiny.toml",
        "--set",
        'model.positions="rope"',
        "--set",
        change,
        "--out",
        tmp_path / "r",
    )
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minigpt: error:") and expected in lines[0], result.stderr
    assert not (tmp_path / "r").exists()
