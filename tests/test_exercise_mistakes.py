"""Each exercise's common mistakes, each named by the first failing line of `minigpt exercise check`
(issue 48): a table per exercise of a mistaken module (the kept solution with one edit, or the
starter as shipped) and what its first FAIL line must say. The fourteen mistakes a learner wrote in
issue 48 are among them (marked "issue 48"), and so is every starter's own.

The count a report ends with is the count of its FAIL lines, and no FAIL line shows two numbers
that print alike (a difference is shown with the digits that make it, or said as the largest one).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minigpt.exercises.catalogue import EXERCISES
from minigpt.exercises.checks import check_file
from minigpt.exercises.folder import starter_text
from minigpt.exercises.learner import read_learner

SOLUTIONS = Path(__file__).resolve().parent / "data" / "exercises"
STARTER = "the starter"  # in place of an edit: the starter as shipped

RMS = "torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)"
RMSNORM = [
    ("starter", STARTER, "", r"your RMSNorm subtracts the mean: \[2, 2, 2, 2\] became \[0, 0, 0, 0\]; "),
    (
        "mean of x (issue 48)",
        "x.pow(2).mean(",
        "x.mean(",
        r"your RMSNorm divides by the root of the mean of x, not of the mean of the squares x_i\^2 \(a row of "
        r"negative mean gives nan\): \[1, -3, 5, -7\] became \[nan, nan, nan, nan\]",
    ),
    (
        "mean of |x| (issue 48)",
        "x.pow(2).mean(",
        "x.abs().mean(",
        r"your RMSNorm divides by the root of the mean of \|x\|, not of the mean of the squares x_i\^2: "
        r"\[1, -3, 5, -7\] became \[0\.5, -1\.5, 2\.5, -3\.5\]",
    ),
    (
        "sum of squares (issue 48)",
        "x.pow(2).mean(",
        "x.pow(2).sum(",
        r"your RMSNorm divides by the root of the sum of the squares, not of their mean \(the sum divided by d\): "
        r"\[1, -3, 5, -7\] became \[0\.1091, -0\.3273, 0\.5455, -0\.7638\]",
    ),
    ("x.norm()", RMS, "x.norm(dim=-1, keepdim=True)", r"your RMSNorm divides by the root of the sum of the squares"),
    ("x.var()", RMS, "torch.sqrt(x.var(dim=-1, keepdim=True) + self.eps)", r"divides by x\.std\(\), the spread around"),
    (
        "the spread around the mean",
        RMS,
        "torch.sqrt((x - x.mean(dim=-1, keepdim=True)).pow(2).mean(dim=-1, keepdim=True) + self.eps)",
        r"your RMSNorm divides by the spread around the mean \(a standard deviation, as LayerNorm does\)",
    ),
    ("no square root", RMS, "(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)", r"divides by the mean square itself"),
    ("epsilon outside", RMS, "(torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)) + self.eps)", r"epsilon outside"),
    ("epsilon left out", RMS, "torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True))", r"your RMSNorm leaves epsilon out"),
    ("the positions' axis", "mean(dim=-1,", "mean(dim=-2,", r"takes its statistics over the positions \(axis -2\)"),
    ("no dim", "x.pow(2).mean(dim=-1, keepdim=True)", "x.pow(2).mean()", r"over the whole tensor at once"),
    (
        "no keepdim",
        "mean(dim=-1, keepdim=True)",
        "mean(dim=-1)",
        r"RMSNorm\.forward raised RuntimeError: .*, line 15; a statistic over the last axis must keep that axis",
    ),
    ("gain ignored", "return self.weight * x / rms", "return x / rms", r"your RMSNorm ignores its gain"),
    ("gain at zeros", "torch.ones(width)", "torch.zeros(width)", r"your RMSNorm starts self\.weight at \[0, 0, 0, 0\]"),
    ("in place", "self.weight * x / rms", "self.weight * x.div_(rms)", r"your RMSNorm changes its input in place"),
    ("float32", "        rms =", "        x = x.float()\n        rms =", r"your RMSNorm loses float64's precision"),
    ("replaces", "return x + sublayer(norm(x))", "return sublayer(norm(x))", r"residual_sublayer replaces instead"),
    ("adds to norm(x)", "return x + sublayer(norm(x))", "return norm(x) + sublayer(norm(x))", r"adds the update to"),
    ("sublayer reads x", "return x + sublayer(norm(x))", "return x + sublayer(x)", r"hands the sublayer x itself"),
    ("x += update", "return x + sublayer(norm(x))", "x += sublayer(norm(x))\n    return x", r"changes x in place"),
]

LAYERNORM = [
    (
        "starter",
        STARTER,
        "",
        r"your LayerNorm divides the squared deviations by C - 1 \(torch's x\.std\(\) and x\.var\(\) do by default\): "
        r"\[1, 3\] became \[-0\.707102, 0\.707102\]",
    ),
    ("x.var()", "(x - mu).pow(2).mean(dim=-1, keepdim=True)", "x.var(dim=-1, keepdim=True)", r"by C - 1"),
    ("no centring", "return self.weight * (x - mu)", "return self.weight * x", r"your LayerNorm does not subtract"),
    ("no beta", " + self.bias", "", r"your LayerNorm ignores beta \(self\.bias\)"),
    ("no gamma", "self.weight * (x - mu)", "(x - mu)", r"your LayerNorm ignores gamma \(self\.weight\)"),
    ("epsilon outside", "torch.sqrt(variance + self.eps)", "(torch.sqrt(variance) + self.eps)", r"epsilon outside"),
    ("epsilon left out", "torch.sqrt(variance + self.eps)", "torch.sqrt(variance)", r"leaves epsilon out"),
    ("no square root", "torch.sqrt(variance + self.eps)", "(variance + self.eps)", r"divides by the variance itself"),
    ("the positions' axis", "(dim=-1, keepdim=True)", "(dim=-2, keepdim=True)", r"over the positions \(axis -2\)"),
    ("mean square", "(x - mu).pow(2).mean(", "x.pow(2).mean(", r"divides by the root mean square of x, not by the"),
    ("sum of squares", "(x - mu).pow(2).mean(", "(x - mu).pow(2).sum(", r"sigma\^2 is the sum of the squared"),
    ("mean |x - mu|", "(x - mu).pow(2).mean(", "(x - mu).abs().mean(", r"sigma\^2 is the mean of \|x_c - mu\|"),
    ("no keepdim", "mu = x.mean(dim=-1, keepdim=True)", "mu = x.mean(dim=-1)", r"raised RuntimeError: .*keep that"),
    ("beta at ones", "torch.zeros(width)", "torch.ones(width)", r"your LayerNorm starts self\.bias at \[1, 1, 1, 1\]"),
    (
        "in place",
        "return self.weight * (x - mu)",
        "x.sub_(mu)\n        return self.weight * x",
        r"your LayerNorm changes its input in place",
    ),
]

FFN_SOLUTION = "return self.W2(F.relu(self.W1(x)))"
FFN = [
    ("starter", STARTER, "", r"your FeedForward returns the hidden-width vector: \[2, 3, 4\] became \[2, 3, 8\]"),
    ("no ReLU", FFN_SOLUTION, "return self.W2(self.W1(x))", r"your FeedForward has no ReLU"),
    ("GELU", "F.relu(", "F.gelu(", r"your FeedForward uses gelu where chapter 17\.4 uses ReLU"),
    ("sigmoid", "F.relu(", "torch.sigmoid(", r"your FeedForward uses sigmoid where"),
    ("ReLU after W2", FFN_SOLUTION, "return F.relu(self.W2(self.W1(x)))", r"applies its activation after W2"),
    ("adds x", FFN_SOLUTION, "return x + self.W2(F.relu(self.W1(x)))", r"your FeedForward adds its input back"),
    ("no b1", FFN_SOLUTION, "return self.W2(F.relu(x @ self.W1.weight.T))", r"your FeedForward leaves out b1:"),
    ("W2's weight", FFN_SOLUTION, "return F.relu(self.W1(x)) @ self.W2.weight.T + self.W2.bias", r"calls self\.W2 0"),
    ("bias not passed", ", bias=bias)", ")", r"FeedForward\(4, 8, bias=False\) has the parameters .*: pass `bias`"),
]

SWIGLU_SPLIT = "gate, value = self.W1(n).chunk(2, dim=-1)"
SWIGLU = [
    ("starter", STARTER, "", r"SwiGLU\.forward raised NotImplementedError: .*, line 42; the other 12 checks"),
    (
        "interleaved halves (issue 48)",
        SWIGLU_SPLIT,
        "h = self.W1(n)\n        gate, value = h[..., ::2], h[..., 1::2]",
        r"your SwiGLU takes the gate from the even columns of self\.W1\(n\) and the value from the others",
    ),
    ("halves swapped", "gate, value = self", "value, gate = self", r"takes the second half of self\.W1\(n\) as the"),
    ("sigmoid", "F.silu(gate)", "torch.sigmoid(gate)", r"your SwiGLU multiplies the value by sigmoid\(gate\)"),
    ("ReLU", "F.silu(gate)", "F.relu(gate)", r"your SwiGLU multiplies the value by ReLU\(gate\) \(a ReGLU\)"),
    ("no activation", "F.silu(gate)", "gate", r"by the gate itself, unactivated \(a bilinear GLU\)"),
    ("SiLU on both", "F.silu(gate) * value", "F.silu(gate) * F.silu(value)", r"applies SiLU to the value too"),
    ("SiLU after *", "F.silu(gate) * value", "F.silu(gate * value)", r"applies SiLU after multiplying"),
    ("added", "F.silu(gate) * value", "F.silu(gate) + value", r"your SwiGLU adds SiLU\(gate\) and value"),
    ("no W2", "return self.W2(F.silu(gate) * value)", "return F.silu(gate) * value", r"returns the hidden-width"),
    ("adds n", "return self.W2(", "return n + self.W2(", r"your SwiGLU adds its input back"),
]

ATTENTION_SPLIT = "t.view(B, T, self.heads, d).transpose(1, 2)"
MASK = 'scores.masked_fill(later, float("-inf"))'
ATTENTION = [
    ("starter", STARTER, "", r"your CausalSelfAttention reads the future, having no mask: changing position 3's"),
    ("no mask", MASK, "scores", r"reads the future, having no mask"),
    ("mask by 0", MASK, "scores * ~later", r"your mask sets later keys' scores to 0, not -inf"),
    (
        "no transpose before the head reshape (issue 48)",
        ATTENTION_SPLIT,
        "t.reshape(B, self.heads, T, d)",
        r"your heads are cut from \[B, T, C\] straight into \[B, 2, T, 4\] \(view or reshape\), with no transpose",
    ),
    (
        "diagonal=0 (issue 48)",
        ".triu(1)",
        ".triu(0)",
        r"your mask hides each position from itself too \(triu\(diagonal=0\), j >= i\)",
    ),
    ("diagonal=2", ".triu(1)", ".triu(2)", r"your mask lets each position read the next one \(triu\(diagonal=2\)"),
    ("tril for triu", ".triu(1)", ".tril()", r"your mask is turned round"),
    (
        "mask after softmax",
        f"torch.softmax({MASK}, dim=-1)",
        "torch.softmax(scores, dim=-1).masked_fill(later, 0.0)",
        r"your mask zeroes the later keys' weights after the softmax",
    ),
    (
        "join without transpose",
        "(weights @ v).transpose(1, 2).reshape",
        "(weights @ v).reshape",
        r"without transposing",
    ),
    ("H and d swapped", ATTENTION_SPLIT, "t.view(B, T, d, self.heads).transpose(1, 2)", r"view\(B, T, 4, 2\), d and H"),
    ("sqrt(C)", "math.sqrt(d)", "math.sqrt(C)", r"divides the scores by sqrt\(C\) = sqrt\(8\)"),
    ("divided by d", "/ math.sqrt(d)", "/ d", r"divides the scores by d = 4 itself"),
    ("not scaled", "/ math.sqrt(d)", "", r"your CausalSelfAttention does not scale the scores"),
    ("softmax over queries", "dim=-1)\n        joined", "dim=-2)\n        joined", r"softmax runs over the queries"),
    ("no W_O", "return self.out(joined)", "return joined", r"returns the joined heads without W_O"),
    ("K not transposed", "q @ k.transpose(-2, -1)", "q @ k", r"raised RuntimeError: .*; Q K\^T multiplies Q by K"),
    ("mask on the CPU", ", device=x.device).triu(1)", ").triu(1)", r"does not run on another device than the CPU"),
]

BLOCK_SOLUTION = (
    "residual1 = x + self.attention(self.norm1(x))\n        return residual1 + self.ffn(self.norm2(residual1))"
)
BLOCK = [
    ("starter", STARTER, "", r"your Block normalises the stream itself: with both updates zero it returned"),
    ("replaces", "residual1 = x + self", "residual1 = self", r"your Block replaces instead of adding"),
    (
        "post-norm",
        BLOCK_SOLUTION,
        "residual1 = self.norm1(x + self.attention(x))\n        return self.norm2(residual1 + self.ffn(residual1))",
        r"your Block normalises after each add \(post-norm, chapter 17\.6\): its attention reads x itself",
    ),
    ("no norm1", "self.attention(self.norm1(x))", "self.attention(x)", r"your attention reads x itself, not norm1"),
    ("no norm2", "self.ffn(self.norm2(residual1))", "self.ffn(residual1)", r"your FFN reads the residual R = X \+ U"),
    ("norm1 twice", "self.ffn(self.norm2(residual1))", "self.ffn(self.norm1(residual1))", r"your FFN reads norm1"),
    (
        "parallel",
        "return residual1 + self.ffn(self.norm2(residual1))",
        "return residual1 + self.ffn(self.norm2(x))",
        r"your FFN reads norm2\(x\), the block's input",
    ),
    ("starts again from x", "return residual1 + self", "return x + self", r"starts again from x"),
    ("no FFN", "return residual1 + self.ffn(self.norm2(residual1))", "return residual1", r"never calls self\.ffn"),
    ("FFN twice", "residual1 + self.ffn(", "residual1 + 2 * self.ffn(", r"your Block adds the FFN's update twice"),
    (
        "drops attention",
        "residual1 = x + self.attention(self.norm1(x))",
        "self.attention(self.norm1(x))\n        residual1 = x",
        r"your Block drops attention's update",
    ),
    ("in place", "residual1 = x + self", "residual1 = x\n        residual1 += self", r"changes its input in place"),
]

ROPE_RETURN = "return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v"
ROPE_POSITIONS = "torch.arange(start, start + T, device=q.device, dtype=q.dtype)"
ROPE = [
    (
        "starter",
        STARTER,
        "",
        r"your apply_rope pairs coordinate 2i with 2i \+ 1 \(the RoFormer paper's interleaved layout\)",
    ),
    (
        "theta^(-i/d)",
        "torch.arange(0, d, 2,",
        "torch.arange(0, d // 2,",
        r"turns pair i at theta\^\(-i/d\), the step of 2",
    ),
    (
        "d/2 for d",
        "dtype=q.dtype) / d)",
        "dtype=q.dtype) / (d // 2))",
        r"at theta\^\(-2i/\(d/2\)\), d/2 where d belongs",
    ),
    ("the minus sign lost", "1.0 / theta **", "theta **", r"theta\^\(\+2i/d\), the exponent's minus sign lost"),
    ("values turned", "* sin, v", "* sin, v * cos + rotate_half(v) * sin", r"your apply_rope turns the values too"),
    (
        "start ignored (KV cache)",
        ROPE_POSITIONS,
        "torch.arange(0, T, device=q.device, dtype=q.dtype)",
        r"as if it were at 0",
    ),
    (
        "turned the other way",
        "torch.cat((-x2, x1)",
        "torch.cat((x2, -x1)",
        r"your apply_rope turns each pair the other way",
    ),
    (
        "queries alone",
        ROPE_RETURN,
        "return q * cos + rotate_half(q) * sin, k, v",
        r"turns the queries but not the keys",
    ),
    (
        "half-split pairs, interleaved angles",
        "torch.cat((angles, angles), dim=-1)",
        "angles.repeat_interleave(2, dim=-1)",
        r"pairs coordinates i and i \+ d/2 \(rotate_half\) but lays the angles out as the interleaved layout does",
    ),
    ("positions on the CPU", ROPE_POSITIONS, "torch.arange(start, start + T, dtype=q.dtype)", r"another device than"),
    (
        "in place",
        ROPE_RETURN,
        "turned = rotate_half(q) * sin\n    q.mul_(cos).add_(turned)\n    return q, k * cos + rotate_half(k) * sin, v",
        r"your apply_rope changes q in place",
    ),
]

ALIBI_MASK = 'bias.masked_fill(j > i, float("-inf"))'
ALIBI = [
    ("starter", STARTER, "", r"your alibi_slopes\(6\) takes the geometric sequence of 6 itself, 2\^\(-8/6\)"),
    ("from 2^0", "(h + 1)", "h", r"your alibi_slopes\(8\) starts the sequence at 2\^0 = 1"),
    ("ascending", "torch.tensor(slopes,", "torch.tensor(slopes[::-1],", r"alibi_slopes\(8\) lists the slopes from the"),
    (
        "the power of two above",
        "slopes = _geometric(below) + _geometric(2 * below)[0::2][: n_head - below]",
        "slopes = _geometric(2 ** math.ceil(math.log2(n_head)))[:n_head]",
        r"your alibi_slopes\(6\) takes the first of the sequence of the power of two above",
    ),
    ("consecutive", "[0::2][: n_head - below]", "[: n_head - below]", r"alibi_slopes\(6\) takes the rest .* one after"),
    ("+slope (i - j)", "bias = -slopes", "bias = slopes", r"your alibi_bias adds \+slope \(i - j\): the farther back"),
    ("no mask", ALIBI_MASK, "bias", r"your alibi_bias leaves the keys after the query unmasked"),
    (
        "the earlier keys masked",
        "masked_fill(j > i,",
        "masked_fill(j < i,",
        r"masks the keys before the query \(j < i\)",
    ),
    (
        "its own key masked",
        "masked_fill(j > i,",
        "masked_fill(j >= i,",
        r"your alibi_bias masks each query's own key too",
    ),
    (
        "queries from 0 (KV cache)",
        "torch.arange(S - T, S,",
        "torch.arange(T,",
        r"takes the T queries as positions 0 .. T - 1",
    ),
    (
        "the transposed triangle",
        f"(i - j).to(slopes.dtype)\n    return {ALIBI_MASK}",
        '(j - i).to(slopes.dtype)\n    return bias.masked_fill(j < i, float("-inf"))',
        r"your alibi_bias is the transposed triangle",
    ),
]

GQA_SHARE = "k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)"
GQA_CACHE = "        if cache is not None:\n            k, v = cache.extend(k, v)"
GQA = [
    (
        "starter",
        STARTER,
        "",
        r"your GroupedQueryAttention tiles the kv heads \(k\.repeat\(1, 2, 1, 1\)\): query head h",
    ),
    (
        "repeat for repeat_interleave",
        GQA_SHARE,
        "k, v = k.repeat(1, H // K, 1, 1), v.repeat(1, H // K, 1, 1)",
        r"tiles",
    ),
    (
        "the cache holds the copies",
        f"{GQA_CACHE}  # every position so far: [B, K, S, d]\n        {GQA_SHARE}",
        f"        {GQA_SHARE}\n{GQA_CACHE}",
        r"your GroupedQueryAttention's cache holds 4 key heads \(\[2, 4, 8, 4\]\): a copy of the kv heads",
    ),
    (
        "the mask's offset",
        ".triu(S - T + 1)",
        ".triu(1)",
        r"fed positions 3, 4 after a KV cache of 0, 1, 2, your Grouped",
    ),
    ("the cache not read", "k, v = cache.extend(k, v)", "cache.extend(k, v)", r"fed positions 3, 4 after a KV cache"),
    ("qkv in thirds", "split((H * d, K * d, K * d), dim=-1)", "split(C, dim=-1)", r"raised ValueError: .*three parts"),
    ("qkv as multi-head's", "(heads + 2 * kv_heads) * d", "3 * width", r"has the parameters qkv\.weight \[48, 16\]"),
]

DEPTH_MIX = "alpha = torch.softmax(keys @ self.query, dim=0)  # [S, B, T]"
DEPTH_KEYS = "keys = sources * torch.rsqrt(sources.pow(2).mean(dim=-1, keepdim=True) + self.eps)"
ATTENTION_RESIDUAL = [
    ("starter", STARTER, "", r"your DepthAttention scores each source by w \. v_i, the key norm left out"),
    ("softmax over the positions", DEPTH_MIX, DEPTH_MIX.replace("dim=0", "dim=-1"), r"runs over the positions"),
    ("softmax over the examples", DEPTH_MIX, DEPTH_MIX.replace("dim=0", "dim=1"), r"softmax runs over the examples"),
    (
        "the norm on the output",
        f"{DEPTH_MIX}\n        return (alpha.unsqueeze(-1) * sources).sum(dim=0)",
        "alpha = torch.softmax(sources @ self.query, dim=0)\n        h = (alpha.unsqueeze(-1) * sources).sum(dim=0)\n"
        "        return h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
        r"your DepthAttention applies the RMSNorm to its output h instead of to each source's key",
    ),
    (
        "a gain on the key norm",
        "self.query = nn.Parameter(torch.zeros(width))",
        "self.query = nn.Parameter(torch.zeros(width))\n        self.gain = nn.Parameter(torch.ones(width))",
        r"has the parameters query \[8\], gain \[8\]; .*the key norm has no gain",
    ),
    ("a random query", "torch.zeros(width)", "torch.randn(width)", r"starts self\.query at \[.*\]: start it at zeros"),
    ("the keys mixed", "* sources).sum(dim=0)", "* keys).sum(dim=0)", r"mixes the normed keys, not the sources"),
    (
        "LayerNorm keys",
        DEPTH_KEYS,
        "keys = torch.nn.functional.layer_norm(sources, sources.shape[-1:], eps=self.eps)",
        r"your DepthAttention's key norm subtracts each key's mean \(a LayerNorm\)",
    ),
    ("scaled as attention", "keys @ self.query,", "keys @ self.query / 8**0.5,", r"divides the scores by sqrt\(C\)"),
]

TABLES = {
    "rmsnorm": RMSNORM,
    "layernorm": LAYERNORM,
    "ffn": FFN,
    "swiglu": SWIGLU,
    "attention": ATTENTION,
    "block": BLOCK,
    "rope": ROPE,
    "alibi": ALIBI,
    "gqa": GQA,
    "attention_residual": ATTENTION_RESIDUAL,
}
CASES = [(name, *case) for name, table in TABLES.items() for case in table]


# A number shown beside the one it should have been: the two must print differently.
SHOWN_APART = re.compile(
    r"(?:gave|became|returned|is now) (\[[^\[\]]*\])[^\[]*?(?:gives|it is|makes it|not|must give) (\[[^\[\]]*\])"
)


def mistaken(name: str, right: str, wrong: str) -> str:
    if right == STARTER:
        return starter_text(name)
    solution = (SOLUTIONS / f"{name}.py").read_text()
    assert right in solution, right
    return solution.replace(right, wrong)


def report_of(name: str, text: str, tmp_path: Path):
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return check_file(read_learner(name, path))


def test_every_exercise_has_a_table_of_at_least_five_mistakes_and_its_starter():
    assert set(TABLES) == set(EXERCISES)
    for name, table in TABLES.items():
        assert len(table) >= 6, name
        assert [case[0] for case in table].count("starter") == 1, name
    assert sum("(issue 48)" in case[1] for case in CASES) == 6  # the six issue 48 found named wrongly


@pytest.mark.parametrize(("name", "mistake", "right", "wrong", "first"), CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_the_first_failing_line_names_the_mistake(name, mistake, right, wrong, first, tmp_path):
    report = report_of(name, mistaken(name, right, wrong), tmp_path)
    assert not report.passed
    lines = [result.line for result in report.failures]
    assert re.search(first, lines[0]), lines
    assert len(set(lines)) == len(lines), lines  # each failing line says something of its own
    for line in lines:  # no "gave [x] ..., minigpt's gives [x]"
        assert all(got != expected for got, expected in SHOWN_APART.findall(line)), line


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_correct_module_passes_every_check(name, tmp_path):
    report = report_of(name, (SOLUTIONS / f"{name}.py").read_text(), tmp_path)
    assert report.passed, [r.line for r in report.failures]
    assert report.summary == f"0 of {report.total} checks fail"


def test_the_count_is_the_count_of_failing_lines(tmp_path):
    report = report_of("rmsnorm", mistaken("rmsnorm", "x.pow(2).mean(", "x.pow(2).sum("), tmp_path)
    assert report.not_run == 0
    assert report.summary == f"{len(report.failures)} of {len(report.results)} checks fail"
    raised = report_of("swiglu", starter_text("swiglu"), tmp_path)
    assert raised.summary == "1 of 15 checks fails, and 12 were not run"
    assert raised.failures[0].line.endswith("the other 12 checks of SwiGLU were not run")


def test_a_difference_below_the_shown_digits_is_shown_with_more_or_as_the_largest_difference():
    import torch

    from minigpt.exercises.checks.common import apart

    a = torch.tensor([1.11280001, 1.0659, -0.101, -0.7299], dtype=torch.float64)
    assert apart(a, a + torch.tensor([0.0, 0.0, 3e-7, 0.0], dtype=torch.float64)) == (
        "[1.1128, 1.0659, -0.101, -0.7299]",
        "[1.1128, 1.0659, -0.1009997, -0.7299]",
    )
    shown, _ = apart(a, a + 1e-12)
    assert shown.endswith("(the largest difference, 1.0e-12, at coordinate 0)")


def test_a_wrong_output_no_known_mistake_explains_is_said_once_and_its_facets_wait(tmp_path):
    report = report_of(
        "rmsnorm", mistaken("rmsnorm", "return self.weight * x / rms", "return self.weight * x / rms + 0.5"), tmp_path
    )
    lines = [r.line for r in report.failures]
    assert lines[0].startswith("your RMSNorm differs from g_i x_i / sqrt(mean(x^2) + eps) in a way these checks do not")
    assert lines[0].endswith("; the other 5 checks of RMSNorm's formula wait until it matches")
    assert report.not_run == 5
    assert report.summary == f"{len(lines)} of {report.total} checks fail, and 5 were not run"


def test_two_mistakes_the_probe_cannot_tell_apart_are_both_named():
    """A fitting whose two wrong choices give the same numbers: each facet's line names its own
    choice and, as likely, the other's."""
    import torch
    from torch import nn

    from minigpt.exercises.checks.common import Fitting

    class Negated(nn.Module):
        def forward(self, x):
            return -x

    class Calls:  # the learner's module called as a Probe calls it
        def forward(self, name, module, *args):
            return module(*args)

    x = torch.tensor([[1.0, -2.0, 3.0]], dtype=torch.float64)
    fitting = Fitting(
        Calls(),
        "Part",
        "x",
        lambda: (Negated(), nn.Identity()),
        x,
        lambda given, theirs, *, sign, order: -given if sign == "minus" or order == "reversed" else given,
        {"sign": ["plus", "minus"], "order": ["kept", "reversed"]},
    )
    sign = fitting.check("sign", "the sign is kept", lambda c: "the sign is turned" if c["sign"] == "minus" else None)
    order = fitting.check(
        "order", "the order is kept", lambda c: "the order is turned" if c["order"] != "kept" else None
    )
    both = "; or else (these checks cannot tell the two apart) "
    assert sign.run() == f"the sign is turned{both}the order is turned"
    assert order.run() == f"the order is turned{both}the sign is turned"
