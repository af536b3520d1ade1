"""Attribution, patching and gradients of an Attention Residuals model (`[model] residual = "attention"`).

- Attribution: the final norm reads final_read = sum over sources k of alpha_k s_k (s_0 the embedding,
  every other source the sum of one block of sublayer outputs), so the logit is a sum of the same parts
  as in the residual stream, each times its source's alpha. Checked part by part, in float64 within
  1e-10, against a plain loop of Python floats over what forward hooks saw (no Recorder), with alpha
  computed here from the sources and the final query, and the parts summing to the model's logit.
- Patching: every effect against patching done with forward hooks on the model's modules, one full pass
  each (no Recorder, no cache, no batching); the end points exact: final_read put back at the last
  position restores 1, any stage before the first differing token 0.
- Gradients: every row stage's gradient (read1, read2, final_read among them) against autograd of a
  second, shifted pass and finite differences; the training log's per-block norms count the queries.
- The command line on a tiny trained run: trace --attribute, trace --grad, patch.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import Numbered, random_run, train_tiny_run
from test_gradients import autograd_row, finite_row
from typer.testing import CliRunner

from minigpt.api import MinigptError
from minigpt.cli import app
from minigpt.config import ModelConfig
from minigpt.inspection.attribution import check_decomposable, check_patch_attributable
from minigpt.inspection.patching import Pass, Patch, patched_finals, patched_stages, sweep
from minigpt.model import stages
from minigpt.model.gpt import MiniGPT
from minigpt.training.trainer import block_grad_norms

VOCAB = 12
CLEAN, CORRUPT = [3, 1, 4, 1, 5, 9, 2], [3, 1, 7, 1, 5, 9, 2]  # differ at position 2 only
FIRST = 2  # the first position the prompts differ at
LAST = len(CLEAN) - 1
ANSWER, VERSUS = 6, 8


def text(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def attnres_run(seed: int = 0, **changes):
    """A seeded float64 Run of an Attention Residuals model: weights N(0, 0.5), pseudo-queries N(0, 1)
    (so the depth weights are far from uniform)."""
    shape = dict(context=8, n_layer=3, n_head=2, n_embd=8, ffn_hidden=12, dtype="float64", residual="attention")
    run = random_run(ModelConfig(**{**shape, **changes}), VOCAB, Numbered(), seed=seed)
    torch.manual_seed(seed + 100)
    for n, p in run.model.named_parameters():
        if n.endswith("query"):
            p.data.normal_()
    return run


CASES = {
    "full": {},
    "blocks of 3 layers (N = 2)": {"attention_residual_blocks": 2},
    "blocks of 2 layers (N = 3)": {"attention_residual_blocks": 3},
    "one block (N = 1)": {"attention_residual_blocks": 1},
    "no FFN": {"ffn_hidden": 0},
    "rmsnorm without biases": {"norm": "rmsnorm", "bias": False, "attention_residual_blocks": 3},
    "no norm": {"norm": "none"},
    "rope": {"positions": "rope"},
    "no positions": {"positions": "none"},
}


# ---------------------------------------------------------------- the reference: hooks and plain floats


def layer_list(cfg: ModelConfig) -> list[tuple[int, str]]:
    kinds = ("attention", "ffn") if cfg.ffn_hidden > 0 else ("attention",)
    return [(i, kind) for i in range(cfg.n_layer) for kind in kinds]


def hooked(model: MiniGPT, ids: list[int], puts: dict | None = None) -> dict:
    """One plain forward pass (no Recorder): every sublayer's output, each attention's W_O input (the
    heads side by side), each read and the final read, as hooks see them ([T, C] each), and the last
    position's logits; `puts` {(block, stage): (positions, values [T, C])} replaces rows on the way."""
    seen, handles, puts = {}, [], puts or {}

    def output_hook(key):
        def hook(module, args, output):
            if key in puts:
                positions, values = puts[key]
                output = output.clone()
                output[0, positions] = values[positions]
            seen[key] = output[0].detach().clone()
            return output

        return hook

    def input_hook(key):
        def hook(module, args):
            joined = args[0]
            if key in puts:
                positions, values = puts[key]
                joined = joined.clone()
                joined[0, positions] = values[positions]
            seen[key] = joined[0].detach().clone()
            return (joined,)

        return hook

    for i, block in enumerate(model.blocks):
        handles += [
            block.depth1.register_forward_hook(output_hook((i, "read1"))),
            block.attention.register_forward_hook(output_hook((i, "attention"))),
            block.attention.out.register_forward_pre_hook(input_hook((i, "heads"))),
        ]
        if hasattr(block, "ffn"):
            handles += [
                block.depth2.register_forward_hook(output_hook((i, "read2"))),
                block.ffn.register_forward_hook(output_hook((i, "ffn"))),
            ]
    handles.append(model.final_depth.register_forward_hook(output_hook((None, "final_read"))))
    if (0, "input") in puts:  # the embedding: the token rows, so that token + position is the clean row
        positions, values = puts[(0, "input")]
        rows = model.position_table.weight[: len(ids)] if hasattr(model, "position_table") else 0.0

        def token_hook(module, args, output):
            output = output.clone()
            output[0, positions] = (values - rows)[positions]
            return output

        handles.append(model.token_table.register_forward_hook(token_hook))
    try:
        with torch.no_grad():
            seen["logits"] = model(torch.tensor([ids]))[0][0, -1]
    finally:
        for handle in handles:
            handle.remove()
    return seen


def embedding(model: MiniGPT, ids: list[int]) -> torch.Tensor:
    """The token rows plus the position rows (learned positions), from the tables: [T, C]."""
    x = model.token_table.weight[ids].detach()
    if hasattr(model, "position_table"):
        x = x + model.position_table.weight[: len(ids)].detach()
    return x


def rms_key(row: list[float], eps: float) -> list[float]:
    denom = math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
    return [v / denom for v in row]


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    total = math.fsum(e)
    return [v / total for v in e]


def plain_attribution(model: MiniGPT, ids: list[int], p: int, token: int, versus: int) -> tuple[list, float, list]:
    """(parts [(name, value)], the model's logit difference at p, the final alpha), by plain loops over
    what hooks saw: the sources at p, alpha from the final query, the final norm linearised at its
    input with this pass's scale, each part times its source's alpha."""
    cfg = model.cfg
    seen = hooked(model, ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0][0, p]
    C, d = cfg.n_embd, cfg.n_embd // cfg.n_head
    layers = layer_list(cfg)
    per = len(layers) // (cfg.attention_residual_blocks or len(layers))  # layers summed into one source
    token_row = model.token_table.weight[ids[p]].tolist()
    position_row = model.position_table.weight[p].tolist() if hasattr(model, "position_table") else None
    v0 = [a + (position_row[c] if position_row else 0.0) for c, a in enumerate(token_row)]
    sources = [v0]
    for j, (i, kind) in enumerate(layers):
        row = seen[(i, kind)][p].tolist()
        if j % per == 0:
            sources.append(row)
        else:
            sources[-1] = [a + b for a, b in zip(sources[-1], row)]
    query = model.final_depth.query.tolist()
    alpha = softmax([math.fsum(q * k for q, k in zip(query, rms_key(s, cfg.norm_eps))) for s in sources])
    h = [math.fsum(alpha[k] * sources[k][c] for k in range(len(sources))) for c in range(C)]
    head = model.head.weight.tolist()
    w = [head[token][c] - head[versus][c] for c in range(C)]
    norm = model.final_norm
    gain = norm.weight.tolist() if getattr(norm, "weight", None) is not None else [1.0] * C
    if cfg.norm == "layernorm":
        mean = math.fsum(h) / C
        scale = 1 / math.sqrt(math.fsum((x - mean) ** 2 for x in h) / C + norm.eps)
    elif cfg.norm == "rmsnorm":
        scale = 1 / math.sqrt(math.fsum(x * x for x in h) / C + norm.eps)
    else:
        scale = 1.0

    def through(row: list[float]) -> float:
        centre = math.fsum(row) / C if cfg.norm == "layernorm" else 0.0
        return scale * math.fsum(gain[c] * (row[c] - centre) * w[c] for c in range(C))

    parts = [("token", alpha[0] * through(token_row))]
    if position_row is not None:
        parts.append(("position", alpha[0] * through(position_row)))
    for j, (i, kind) in enumerate(layers):
        a = alpha[j // per + 1]
        if kind == "ffn":
            parts.append((f"{i}.ffn", a * through(seen[(i, "ffn")][p].tolist())))
            continue
        out = model.blocks[i].attention.out
        W_O = out.weight.tolist()  # [out, in]
        joined = seen[(i, "heads")][p].tolist()
        for hh in range(cfg.n_head):
            row = [math.fsum(joined[k] * W_O[c][k] for k in range(hh * d, (hh + 1) * d)) for c in range(C)]
            parts.append((f"{i}.attention.head{hh}", a * through(row)))
        if out.bias is not None:
            parts.append((f"{i}.attention.bias", a * through(out.bias.tolist())))
    if getattr(norm, "bias", None) is not None:
        parts.append(("final_norm.bias", math.fsum(b * x for b, x in zip(norm.bias.tolist(), w))))
    return parts, float(logits[token] - logits[versus]), alpha


# ---------------------------------------------------------------- attribution


@pytest.mark.parametrize("changes", list(CASES.values()), ids=list(CASES))
def test_the_attribution_is_the_plain_loop_part_by_part_and_sums_to_the_logit(changes):
    run = attnres_run(**changes)
    p = 5
    traced = run.trace(text(CLEAN), position=p, attribute=ANSWER, versus=VERSUS)
    result = traced.attribution
    parts, logit, alpha = plain_attribution(run.model, CLEAN, p, ANSWER, VERSUS)
    assert [part.name for part in result.parts] == [name for name, _ in parts]
    for part, (name, value) in zip(result.parts, parts):
        assert abs(part.value - value) < 1e-10, name
    assert abs(math.fsum(value for _, value in parts) - logit) < 1e-10  # the plain loop itself is exact
    assert abs(result.total - logit) < 1e-12 and abs(result.error) < 1e-10
    # each part carries its source's alpha, which the plain loop computed from the final query
    assert traced.stage(None, "final_depth_weights").tolist() == pytest.approx(alpha, abs=1e-13)
    assert max(alpha) - min(alpha) > 0.05  # far from uniform: the weights matter
    weights = {part.name: part.weight for part in result.parts}
    assert weights["token"] == pytest.approx(alpha[0], abs=1e-15)
    assert weights.get("final_norm.bias") is None
    as_dict = result.as_dict()
    assert as_dict["parts"][0] == {"name": "token", "value": result.parts[0].value, "weight": weights["token"]}


def test_interventions_keep_the_sum_exact():
    run = attnres_run(attention_residual_blocks=3)
    changed = run.attribute(
        text(CLEAN), ANSWER, versus=VERSUS, scale=["1.attention=0.5", "0.ffn=2"], ablate_head=["2.1"], position=4
    )
    plain = run.attribute(text(CLEAN), ANSWER, versus=VERSUS, position=4)
    assert abs(changed.error) < 1e-10 and changed.total != plain.total
    assert next(p for p in changed.parts if p.name == "2.attention.head1").value == 0.0
    replaced = run.attribute(text(CLEAN), ANSWER, set_input=[0.3] * 8, position=4)
    assert replaced.parts[0].name == "input" and abs(replaced.error) < 1e-10


@pytest.mark.parametrize(
    "where, exact",
    [
        ({"block": 1, "stage": "read2", "position": 5}, True),  # a read is no part: the parts stay this pass's
        ({"block": 2, "stage": "read1", "position": 5}, True),
        ({"block": 1, "stage": "ffn", "position": 5}, True),  # a patched ffn output is the ffn part
        ({"block": 0, "stage": "heads", "position": 5, "head": 1}, True),
        ({"block": 1, "stage": "attention", "position": 3}, True),  # another position: only read from
        ({"block": 1, "stage": "attention", "position": 5}, False),
        ({"block": 0, "stage": "input", "position": 5}, False),
    ],
)
def test_a_patch_keeps_the_sum_exact_or_is_refused_where_it_breaks_it(where, exact):
    run = attnres_run()
    patch = {"clean": text(CLEAN), "position": None, "head": None, **where}
    if not exact:
        with pytest.raises(MinigptError) as caught:
            run.trace(text(CORRUPT), position=5, patch=patch, attribute=ANSWER)
        assert "attribute another position" in str(caught.value) and "\n" not in str(caught.value)
        return
    after = run.trace(text(CORRUPT), position=5, patch=patch, attribute=ANSWER, versus=VERSUS).after
    logits = after.stage(None, "logits")
    assert after.attribution.total == float(logits[ANSWER] - logits[VERSUS])
    assert abs(after.attribution.error) < 1e-10


def test_what_has_no_sum_is_refused_in_one_line():
    with pytest.raises(MinigptError, match="final norm then reads the clean pass's mix") as caught:
        check_patch_attributable("final_read")
    assert "\n" not in str(caught.value)
    check_patch_attributable("read1")  # a read is no part
    check_decomposable(attnres_run().model)  # decomposable
    no_residual = random_run(ModelConfig(n_layer=1, n_head=2, n_embd=8, context=8, residual=False), VOCAB, Numbered())
    with pytest.raises(MinigptError, match=r"has no residual \(\[model\] residual = false\)"):
        check_decomposable(no_residual.model)


# ---------------------------------------------------------------- patching


PATCH_CASES = {
    "full": {},
    "blocks of 3 layers (N = 2)": {"attention_residual_blocks": 2},
    "no FFN": {"ffn_hidden": 0},
    "rope, N = 3": {"positions": "rope", "attention_residual_blocks": 3},
}


def hooked_effect(model, clean_seen, patch: Patch, high: float, low: float) -> float:
    """The corrupt prompt's logit difference with one clean value put back by hooks, as a share."""
    positions = slice(None) if patch.position is None else patch.position
    if patch.stage == "input":
        puts = {(0, "input"): (positions, embedding(model, CLEAN))}
    elif patch.stage == "final_read":
        puts = {(None, "final_read"): (positions, clean_seen[(None, "final_read")])}
    elif patch.stage == "heads":
        d = model.cfg.n_embd // model.cfg.n_head
        columns = slice(patch.head * d, (patch.head + 1) * d)
        return _share(_heads_difference(model, patch.block, positions, columns, clean_seen), high, low)
    else:
        puts = {(patch.block, patch.stage): (positions, clean_seen[(patch.block, patch.stage)])}
    logits = hooked(model, CORRUPT, puts)["logits"]
    return _share(float(logits[ANSWER] - logits[VERSUS]), high, low)


def _heads_difference(model, block, positions, columns, clean_seen) -> float:
    """One head's slice of W_O's input set to the clean pass's, the other heads left as computed."""

    def hook(module, args):
        joined = args[0].clone()
        joined[0, positions, columns] = clean_seen[(block, "heads")][positions, columns]
        return (joined,)

    handle = model.blocks[block].attention.out.register_forward_pre_hook(hook)
    try:
        logits = hooked(model, CORRUPT)["logits"]
    finally:
        handle.remove()
    return float(logits[ANSWER] - logits[VERSUS])


def _share(value: float, high: float, low: float) -> float:
    return (value - low) / (high - low)


@pytest.mark.parametrize("changes", list(PATCH_CASES.values()), ids=list(PATCH_CASES))
@pytest.mark.parametrize("by", ["stage", "head"])
def test_every_effect_equals_patching_by_hooks_one_full_pass_each(changes, by):
    run = attnres_run(seed=1, **changes)
    model, cfg = run.model, run.model.cfg
    result = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by=by)
    clean_seen, corrupt_seen = hooked(model, CLEAN), hooked(model, CORRUPT)
    high = float(clean_seen["logits"][ANSWER] - clean_seen["logits"][VERSUS])
    low = float(corrupt_seen["logits"][ANSWER] - corrupt_seen["logits"][VERSUS])
    assert result.clean.logit_difference == pytest.approx(high, abs=1e-12)
    assert result.corrupt.logit_difference == pytest.approx(low, abs=1e-12)
    T, n = len(CLEAN), cfg.n_layer
    inside = 4 if cfg.ffn_hidden > 0 else 2
    assert len(result.effects) == (T + n * inside * T + T if by == "stage" else n * cfg.n_head * (T + 1))
    for e in result.effects:
        expected = hooked_effect(model, clean_seen, Patch(e.block, e.stage, e.position, e.head), high, low)
        assert e.effect == pytest.approx(expected, abs=1e-9), e
    if by == "stage":  # and the sweep is not trivial: reads and outputs in every block move the answer
        assert {e.stage for e in result.effects if abs(e.effect) > 1e-3} == set(patched_stages(cfg))


def test_the_end_points_are_exact():
    run = attnres_run(seed=2, attention_residual_blocks=3)
    result = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS)
    assert result.effect(2, "final_read", LAST) == 1.0  # the final norm's input itself: the whole difference
    for e in result.effects:
        if e.position < FIRST:  # equal tokens before the first difference: equal rows, nothing restored
            assert e.effect == 0.0, e
        if e.block == 2 and e.stage not in ("input", "read1") and e.position < LAST:  # past the last attention
            assert e.effect == 0.0, e
    assert result.effect(0, "input", FIRST) == pytest.approx(1.0, abs=1e-12)  # the one differing token
    heads = run.patch(text(CLEAN), text(CORRUPT), ANSWER, VERSUS, by="head")
    assert all(e.effect == 0.0 for e in heads.effects if e.position is not None and e.position < FIRST)


def test_patching_nothing_reproduces_the_corrupt_run_bitwise():
    run = attnres_run(seed=2)
    model = run.model
    with torch.inference_mode():
        clean, corrupt = Pass(model, CLEAN), Pass(model, CORRUPT)
        early = [Patch(b, s, p) for b in range(3) for s in ("read1", "attention", "read2", "ffn") for p in (0, 1)]
        rows = patched_finals(
            model, clean, corrupt, [*early, Patch(2, "final_read", 3), Patch(0, "final_read", 4), Patch(0, "input", 1)]
        )
    plain = run.trace(ids=CORRUPT).whole(None, "final_read")[-1]  # the corrupt prompt's own pass, recorded
    assert all(torch.equal(row, plain) for row in rows)
    with torch.inference_mode():  # the differing token's embedding put back: the clean pass, recomputed
        changed = patched_finals(model, clean, corrupt, [Patch(0, "input", FIRST)])[0]
    torch.testing.assert_close(changed, clean.final, rtol=0, atol=1e-12)
    assert not torch.equal(changed, plain)


def test_the_sweep_lists_the_embedding_the_reads_the_outputs_and_the_final_read():
    found = sweep(2, 2, 3, "stage", depth=True)
    assert [(p.block, p.stage) for p in found[::3]] == [
        (0, "input"),
        *[(b, s) for b in (0, 1) for s in ("read1", "attention", "read2", "ffn")],
        (1, "final_read"),
    ]
    assert [p.position for p in found[:3]] == [0, 1, 2]
    without = sweep(2, 2, 3, "stage", ffn=False, depth=True)
    assert {p.stage for p in without} == {"input", "read1", "attention", "final_read"}
    assert patched_stages(ModelConfig(residual="attention", ffn_hidden=0)) == (
        "input",
        "read1",
        "attention",
        "final_read",
    )


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize(
    "changes", [{}, {"attention_residual_blocks": 2}, {"ffn_hidden": 0}], ids=["full", "N=2", "no FFN"]
)
def test_every_stages_gradient_is_autograds_of_a_shifted_pass_and_the_finite_differences(changes):
    run = attnres_run(seed=3, n_layer=2, **changes)
    model, position, ids = run.model, 2, CLEAN[:5]
    gradient = run.trace(ids=ids, position=position, grad=True).gradient
    target = ids[position + 1]
    rows = {stages.INPUT: gradient.input.row, stages.FINAL_NORM: gradient.final_norm.row}
    rows[stages.FINAL_READ] = gradient.final_read.row
    for block in gradient.blocks:
        rows.update({stages.block_name(block.index, name): g.row for name, g in block.stages.items()})
    not_rows = ("attention_weights", "depth_weights1", "depth_weights2", "final_depth_weights", "logits")
    expected = [n for n in stages.recorded_names(2, **stages.of(model.cfg)) if n.rsplit(".", 1)[-1] not in not_rows]
    assert sorted(rows) == sorted(expected) and "blocks.1.read1" in rows and "blocks.1.output" not in rows
    for name, row in rows.items():
        torch.testing.assert_close(
            torch.tensor(row, dtype=torch.float64),
            autograd_row(model, ids, position, target, name, len(row)),
            rtol=0,
            atol=1e-12,
        )
        fd = finite_row(model, ids, position, target, name, len(row))
        assert max(abs(a - b) for a, b in zip(row, fd)) < 1e-8, name
    # no one row enters a block past the first; block 0's input is the embedding, which every read reads
    assert gradient.blocks[0].input.row == gradient.input.row and gradient.blocks[1].input is None
    assert gradient.input.row != rows["blocks.0.read1"]  # the embedding is read past block 0's attention too


def test_the_logged_block_gradient_norms_count_each_blocks_pseudo_queries():
    run = attnres_run(seed=4, n_layer=2)
    model = run.model.train()
    torch.manual_seed(0)
    x, y = torch.randint(0, VOCAB, (3, 6)), torch.randint(0, VOCAB, (3, 6))
    model(x, y)[1].backward()
    by_hand = [
        math.sqrt(math.fsum(float(v) ** 2 for p in block.parameters() for v in p.grad.flatten().tolist()))
        for block in model.blocks
    ]
    assert list(block_grad_norms(model)) == pytest.approx(by_hand, rel=1e-12)
    assert model.blocks[0].depth1.query.grad.abs().max() == 0.0  # one source (the embedding): alpha is 1
    assert model.blocks[1].depth1.query.grad.abs().max() > 0.0  # counted in block 1's norm above
    model.eval()


# ---------------------------------------------------------------- the command line, a tiny trained run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    sets = ["model.n_layer=2", 'model.residual="attention"', 'model.dtype="float64"', "train.steps=10"]
    return train_tiny_run(tmp_path_factory.mktemp("attnres"), *[a for s in sets for a in ("--set", s)])


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_trace_attribute_from_the_command_line_sums_exactly(trained):
    args = ["trace", "--run", trained, "-p", "to be or", "--attribute", "t", "--versus", "e"]
    shown = invoke(*args)
    assert shown.exit_code == 0, shown.output
    assert "times the weight of its source in final_read" in shown.stdout
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    data = json.loads(invoke(*args, "--json").stdout)["attribution"]
    assert abs(data["error"]) < 1e-10 and abs(math.fsum(p["value"] for p in data["parts"]) - data["total"]) < 1e-10
    names = [p["name"] for p in data["parts"]]
    assert names[:2] == ["token", "position"] and "1.ffn" in names and "1.attention.head1" in names
    assert all(0 < p["weight"] < 1 for p in data["parts"] if p["name"] != "final_norm.bias")


def test_trace_grad_from_the_command_line_has_the_final_read(trained):
    shown = invoke("trace", "--run", trained, "-p", "to be or", "--grad", "--json")
    assert shown.exit_code == 0, shown.output
    gradient = json.loads(shown.stdout)["gradient"]
    assert gradient["final_read"]["norm"] > 0 and gradient["blocks"][1]["input"] is None
    assert set(gradient["blocks"][1]["stages"]) == {"read1", "norm1", "attention", "read2", "norm2", "hidden", "ffn"}


def test_patch_from_the_command_line(trained):
    args = ["patch", "--run", trained, "--clean", "to be or", "--corrupt", "to me or", "--answer", "t", "--versus", "e"]
    shown = invoke(*args)
    assert shown.exit_code == 0, shown.output
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    for heading in ("input patched", "read1 patched", "read2 patched", "ffn patched", "final_read patched"):
        assert heading in shown.stdout
    assert "residual1" not in shown.stdout
    data = json.loads(invoke(*args, "--json").stdout)
    effects = {(e["block"], e["stage"], e["position"]): e["effect"] for e in data["effects"]}
    assert effects[(1, "final_read", 7)] == 1.0
    assert all(value == 0.0 for (_, _, p), value in effects.items() if p < 3)  # before 'm' (position 3)
    heads = invoke(*args, "--by", "head")
    assert heads.exit_code == 0 and "head 1" in heads.stdout
