"""Activation patching (`Run.patch`, `Run.trace(patch=...)`) and the attribution on models of the newer
[model] position keys: sinusoidal positions, T5's relative bias and rope on a quarter of each head. Each
is held against a float64 forward pass written here from the state dict, every stage of it (each head's
mixed values too) open to a clean row put back as it is computed; its positions come from
tests/test_positions_more.py's helpers (the sinusoid, T5's bucket, rope's share), not from minigpt's code.

Patching restores what it says: a stream stage (a block's input, residual1, output) put back at every
position is the clean pass from there on, its logits at every position the clean ones; each patch of
both sweeps ends in the logit difference of the reference's patched pass, and a patched trace's logits
at every position are the reference's, inside the trained length and past it (--extrapolate, where the
patched rows sit beyond the table's positions). The attribution's parts are the reference's, part by
part, with and without a patch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import REPO, Numbered
from test_patching import ANSWER, CLEAN, CORRUPT, VERSUS
from test_positions_more import IDS, PAST, layer_norm, model_of, reference, rope_share, sinusoid, t5_bucket
from torch import Tensor

from minigpt.api import Run
from minigpt.config import load_config
from minigpt.inspection.patching import Pass, Patch, patched_finals, sweep

SCHEMES = ("sinusoidal", "t5", "rope 0.25")
STREAM = ("input", "residual1", "output")  # the stages that are the whole residual stream
# past the trained length (24 rows): 36 tokens that differ at position 28 alone
FAR_CORRUPT = IDS
FAR_CLEAN = [*IDS[:28], (IDS[28] + 5) % 13, *IDS[29:]]
FAR_ANSWER, FAR_VERSUS = 4, 9


def run_of(scheme: str, extrapolate: bool = False) -> Run:
    """tests/test_positions_more.py's random float64 model (2 blocks, 2 heads of width 8) as a Run."""
    run = Run(Path("random"), load_config(REPO / "configs" / "default.toml"), model_of(scheme), Numbered())
    return run.read_with(extrapolate)


@pytest.fixture(scope="module", params=SCHEMES)
def run(request) -> Run:
    return run_of(request.param)


# ---------------------------------------------------------------- the reference, stage by stage


def staged(model, ids: list[int], puts: dict | None = None) -> dict:
    """Every stage of a float64 pass from the state dict alone: {(block, stage): [T, C]}, each head's
    mixed values as (block, "heads", head): [T, d], and (None, "logits"): [T, V]. `puts`, keyed the
    same, {position: row}: the rows written over a stage as it is computed, before anything reads it
    (block b's input is block b - 1's output: a row put back in either is read by both)."""
    cfg, puts, seen = model.cfg, puts or {}, {}
    w = {name: value.detach() for name, value in model.state_dict().items()}
    T, C, H = len(ids), cfg.n_embd, cfg.n_head
    d = C // H
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def put(key: tuple, value: Tensor) -> Tensor:
        value = value.clone()
        for p, row in puts.get(key, {}).items():
            value[p] = row
        seen[key] = value
        return value

    x = w["token_table.weight"][ids]
    if cfg.positions == "sinusoidal":
        x = x + torch.tensor([[sinusoid(t, c, C) for c in range(C)] for t in range(T)], dtype=torch.float64)
    for b in range(cfg.n_layer):
        p = f"blocks.{b}."
        x = put((b, "input"), x)
        norm1 = layer_norm(x, w[p + "norm1.weight"], w[p + "norm1.bias"], cfg.norm_eps)
        q, k, v = (norm1 @ w[p + "attention.qkv.weight"].T + w[p + "attention.qkv.bias"]).split(C, dim=-1)
        mixed = []
        for h in range(H):
            qh, kh, vh = (m[:, h * d : (h + 1) * d] for m in (q, k, v))
            if cfg.positions == "rope":
                qh, kh = rope_share(qh, cfg.rope_fraction), rope_share(kh, cfg.rope_fraction)
            scores = qh @ kh.T / math.sqrt(d)
            if cfg.positions == "t5":  # distance i - j, for j <= i; the rest is masked below
                bucket = [
                    [t5_bucket(max(i - j, 0), cfg.t5_buckets, cfg.t5_max_distance) for j in range(T)] for i in range(T)
                ]
                scores = scores + w["relative_bias.weight"][torch.tensor(bucket), h]
            scores = scores.masked_fill(~causal, float("-inf"))
            weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
            mixed.append(put((b, "heads", h), (weights / weights.sum(-1, keepdim=True)) @ vh))
        joined = torch.cat(mixed, -1)
        attention = put((b, "attention"), joined @ w[p + "attention.out.weight"].T + w[p + "attention.out.bias"])
        x = put((b, "residual1"), x + attention)
        norm2 = layer_norm(x, w[p + "norm2.weight"], w[p + "norm2.bias"], cfg.norm_eps)
        hidden = torch.relu(norm2 @ w[p + "ffn.W1.weight"].T + w[p + "ffn.W1.bias"])
        x = put((b, "output"), x + put((b, "ffn"), hidden @ w[p + "ffn.W2.weight"].T + w[p + "ffn.W2.bias"]))
    seen[(None, "final")] = x
    final = layer_norm(x, w["final_norm.weight"], w["final_norm.bias"], cfg.norm_eps)
    seen[(None, "logits")] = final @ w["head.weight"].T
    return seen


def key_of(patch: Patch) -> tuple:
    return (patch.block, patch.stage, patch.head) if patch.stage == "heads" else (patch.block, patch.stage)


def patched_reference(model, clean: dict, corrupt: list[int], patch: Patch) -> dict:
    """The reference's corrupt pass with the reference's clean rows of `patch` put back."""
    key = key_of(patch)
    positions = range(len(corrupt)) if patch.position is None else [patch.position]
    return staged(model, corrupt, {key: {p: clean[key][p] for p in positions}})


def difference(seen: dict, answer: int, versus: int) -> float:
    logits = seen[(None, "logits")][-1]
    return float(logits[answer] - logits[versus])


def near(got: Tensor, expected: Tensor) -> bool:
    return torch.allclose(got.double(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_staged_reference_is_the_papers_reference_and_the_models_pass(scheme):
    model = model_of(scheme).read_with(extrapolate=True)
    seen = staged(model, IDS)
    assert near(seen[(None, "logits")], reference(model, IDS)["logits"])
    recorded = Pass(model, IDS)
    for b in range(2):
        for stage in ("input", "attention", "residual1", "ffn", "output"):
            assert near(recorded.stage(b, stage)[0], seen[(b, stage)]), (b, stage)
        for h in range(2):
            assert near(recorded.stage(b, "heads")[0, h], seen[(b, "heads", h)]), (b, h)


# ---------------------------------------------------------------- patching


@pytest.mark.parametrize("stage", STREAM)
@pytest.mark.parametrize("block", [0, 1])
def test_the_stream_put_back_at_every_position_restores_the_clean_logits(run, block, stage):
    clean = run.trace(ids=CLEAN, compare=False).recorded["logits"][0]
    where = {"clean": CLEAN, "block": block, "stage": stage, "position": None, "head": None}
    patched = run.trace(ids=CORRUPT, patch=where, compare=False)
    assert torch.equal(patched.recorded["logits"][0], clean)  # the same arithmetic on the same rows
    with torch.inference_mode():  # patching's batched path: corrupt keys and values before the first change
        clean_pass, corrupt_pass = Pass(run.model, CLEAN), Pass(run.model, CORRUPT)
        (final,) = patched_finals(run.model, clean_pass, corrupt_pass, [Patch(block, stage)])
    assert near(final, clean_pass.final.double())


@pytest.mark.parametrize("by", ["stage", "head"])
def test_every_patch_of_a_sweep_is_the_references_patched_pass(run, by):
    result = run.patch(CLEAN, CORRUPT, ANSWER, VERSUS, by=by)
    clean, corrupt = staged(run.model, CLEAN), staged(run.model, CORRUPT)
    high, low = difference(clean, ANSWER, VERSUS), difference(corrupt, ANSWER, VERSUS)
    assert result.clean.logit_difference == pytest.approx(high, abs=1e-12)
    assert result.corrupt.logit_difference == pytest.approx(low, abs=1e-12)
    assert len(result.effects) == len(sweep(2, 2, len(CLEAN), by))
    for e in result.effects:
        patched = patched_reference(run.model, clean, CORRUPT, Patch(e.block, e.stage, e.position, e.head))
        assert e.effect == pytest.approx((difference(patched, ANSWER, VERSUS) - low) / (high - low), abs=1e-9), e
    if by == "stage":
        assert result.effect(1, "output", len(CLEAN) - 1) == 1.0


@pytest.mark.parametrize(
    "where",
    [Patch(0, s, 4) for s in ("input", "attention", "residual1", "ffn", "output")]
    + [Patch(1, "attention", None), Patch(1, "ffn", 2), Patch(0, "heads", None, 1), Patch(1, "heads", 5, 0)],
    ids=str,
)
def test_a_patched_trace_is_the_references_patched_pass_at_every_position(run, where):
    expected = patched_reference(run.model, staged(run.model, CLEAN), CORRUPT, where)
    given = {"clean": CLEAN, "block": where.block, "stage": where.stage, "position": where.position, "head": where.head}
    trace = run.trace(ids=CORRUPT, patch=given, compare=False)
    assert near(trace.recorded["logits"][0], expected[(None, "logits")])
    assert near(trace.recorded["blocks.1.output"][0], expected[(1, "output")])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_patching_past_the_trained_length_is_the_references_patched_pass(scheme):
    """36 tokens read with --extrapolate, differing at position 28: every patched row lies past the 24
    the model was trained on, where T5's buckets and the sinusoids are computed for the pass alone."""
    run = run_of(scheme, extrapolate=True)
    clean, corrupt = staged(run.model, FAR_CLEAN), staged(run.model, FAR_CORRUPT)
    high, low = difference(clean, FAR_ANSWER, FAR_VERSUS), difference(corrupt, FAR_ANSWER, FAR_VERSUS)
    for by in ("stage", "head"):
        result = run.patch(FAR_CLEAN, FAR_CORRUPT, FAR_ANSWER, FAR_VERSUS, by=by)
        assert len(result.effects) == len(sweep(2, 2, PAST, by))
        assert result.corrupt.logit_difference == pytest.approx(low, abs=1e-12)
        for e in result.effects:
            if e.position is not None and e.position < 28:  # equal rows in both prompts: nothing to put back
                assert e.effect == 0.0, e
                continue
            patched = patched_reference(run.model, clean, FAR_CORRUPT, Patch(e.block, e.stage, e.position, e.head))
            expected = (difference(patched, FAR_ANSWER, FAR_VERSUS) - low) / (high - low)
            assert e.effect == pytest.approx(expected, abs=1e-9), e
    where = {"clean": FAR_CLEAN, "block": 0, "stage": "heads", "position": 30, "head": 1}
    trace = run.trace(ids=FAR_CORRUPT, patch=where, compare=False)
    expected = patched_reference(run.model, clean, FAR_CORRUPT, Patch(0, "heads", 30, 1))
    assert trace.past_trained_length and near(trace.recorded["logits"][0], expected[(None, "logits")])


# ---------------------------------------------------------------- the attribution, part by part


def reference_parts(model, ids: list[int], seen: dict, p: int, answer: int, versus: int) -> dict[str, float]:
    """Each part of the stream at position p through the final norm (its scale fixed by the pass) onto
    head[answer] - head[versus]: the token and sinusoid rows, each head's mixed values through its
    columns of W_O, W_O's bias, each ffn update, and the final norm's bias."""
    w = {name: value.detach() for name, value in model.state_dict().items()}
    cfg, d = model.cfg, model.cfg.n_embd // model.cfg.n_head
    direction = w["head.weight"][answer] - w["head.weight"][versus]
    stream = seen[(None, "final")][p]
    scale = 1 / math.sqrt(float(((stream - stream.mean()) ** 2).mean()) + cfg.norm_eps)

    def through(row: Tensor) -> float:
        return float(scale * ((row - row.mean()) * w["final_norm.weight"]) @ direction)

    parts = {"token": through(w["token_table.weight"][ids[p]])}
    if cfg.positions == "sinusoidal":
        parts["position"] = through(
            torch.tensor([sinusoid(p, c, cfg.n_embd) for c in range(cfg.n_embd)], dtype=torch.float64)
        )
    for b in range(cfg.n_layer):
        W_O = w[f"blocks.{b}.attention.out.weight"]
        for h in range(cfg.n_head):
            parts[f"{b}.attention.head{h}"] = through(seen[(b, "heads", h)][p] @ W_O[:, h * d : (h + 1) * d].T)
        parts[f"{b}.attention.bias"] = through(w[f"blocks.{b}.attention.out.bias"])
        parts[f"{b}.ffn"] = through(seen[(b, "ffn")][p])
    parts["final_norm.bias"] = float(w["final_norm.bias"] @ direction)
    return parts


@pytest.mark.parametrize(
    "position, where",
    [(6, None), (3, None), (6, Patch(0, "heads", None, 1)), (6, Patch(1, "ffn", 6)), (6, Patch(0, "residual1", 4))],
    ids=["last", "earlier", "head everywhere", "ffn there", "stream before"],
)
def test_the_attribution_is_the_references_part_by_part(run, position, where):
    if where is None:
        seen = staged(run.model, CORRUPT)
        trace = run.trace(ids=CORRUPT, position=position, attribute=ANSWER, versus=VERSUS, compare=False)
    else:
        seen = patched_reference(run.model, staged(run.model, CLEAN), CORRUPT, where)
        patch = {"clean": CLEAN, "block": where.block, "stage": where.stage, "position": where.position}
        patch["head"] = where.head
        trace = run.trace(ids=CORRUPT, position=position, patch=patch, attribute=ANSWER, versus=VERSUS, compare=False)
    expected = reference_parts(run.model, CORRUPT, seen, position, ANSWER, VERSUS)
    got = {part.name: part.value for part in trace.attribution.parts}
    assert list(got) == list(expected)
    assert all(got[name] == pytest.approx(value, abs=1e-12) for name, value in expected.items()), (got, expected)
    logits = seen[(None, "logits")][position]
    assert math.fsum(expected.values()) == pytest.approx(float(logits[ANSWER] - logits[VERSUS]), abs=1e-12)
    assert abs(trace.attribution.error) < 1e-12
