"""An independent reference forward pass for a pre-norm decoder-only GPT, in scalar Python loops.

This is the second implementation that the tests hold `minigpt.model` against (chapter 17's
`reference.py`): plain nested lists of floats, one multiplication at a time, `math` only. It never
imports torch, numpy or minigpt, so a mistake in the model's vectorised code cannot be copied here.

Conventions (row vectors, as in the chapter):

- A linear layer is given the way `nn.Linear` stores it, weight [out][in] and bias [out], and
  computes y_o = sum_i x_i * weight[o][i] + bias[o], i.e. y = x @ weight.T + bias.
- The attention projection `qkv` stacks W_Q, W_K and W_V as rows of one [3C][C] weight:
  q uses rows 0..C-1, k rows C..2C-1, v rows 2C..3C-1. Head h reads coordinates h*d..(h+1)*d-1.
- LayerNorm over the last axis: mean, BIASED variance (divide by C), eps, gain gamma, offset beta.

`weights_from_state_dict` turns a mapping of minigpt parameter names to nested lists (the caller
does `{name: tensor.tolist()}`) into the plain structure `forward` reads.
"""

from __future__ import annotations

import math

STAGES = ("norm1", "attention", "residual1", "norm2", "hidden", "ffn", "output")


# ----------------------------------------------------------------------------------------------
# scalar building blocks


def zeros(n: int) -> list[float]:
    return [0.0 for _ in range(n)]


def add(a: list[float], b: list[float]) -> list[float]:
    """Residual add of two rows; refuses unequal lengths (no broadcasting)."""
    if len(a) != len(b):
        raise ValueError(f"residual add of rows of length {len(a)} and {len(b)}")
    return [a[i] + b[i] for i in range(len(a))]


def linear(x: list[float], weight: list[list[float]], bias: list[float] | None) -> list[float]:
    """y = x @ weight.T + bias with weight stored [out][in]."""
    out = []
    for o in range(len(weight)):
        row = weight[o]
        if len(row) != len(x):
            raise ValueError(f"linear layer expects {len(row)} inputs, got {len(x)}")
        total = 0.0
        for i in range(len(x)):
            total += x[i] * row[i]
        if bias is not None:
            total += bias[o]
        out.append(total)
    return out


def layer_norm(x: list[float], gamma: list[float], beta: list[float] | None, eps: float) -> list[float]:
    """gamma_c (x_c - mu) / sqrt(sigma^2 + eps) + beta_c with the biased variance (divide by C)."""
    C = len(x)
    mu = 0.0
    for c in range(C):
        mu += x[c]
    mu /= C
    var = 0.0
    for c in range(C):
        var += (x[c] - mu) * (x[c] - mu)
    var /= C
    denom = math.sqrt(var + eps)
    out = []
    for c in range(C):
        value = gamma[c] * (x[c] - mu) / denom
        if beta is not None:
            value += beta[c]
        out.append(value)
    return out


def relu(x: list[float]) -> list[float]:
    return [v if v > 0.0 else 0.0 for v in x]


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = 0.0
    for e in exps:
        total += e
    return [e / total for e in exps]


# ----------------------------------------------------------------------------------------------
# the sublayers, one sequence at a time


def attention(
    rows: list[list[float]], qkv_weight, qkv_bias, out_weight, out_bias, n_head: int, causal: bool = True
) -> tuple[list[list[float]], list[list[list[float]]]]:
    """Multi-head self-attention over one sequence of T rows of width C.

    Returns (output rows [T][C], weights [H][T][T]); a masked (future) key gets weight 0.0."""
    T = len(rows)
    C = len(rows[0])
    if C % n_head:
        raise ValueError(f"width {C} is not divisible by {n_head} heads")
    d = C // n_head
    projected = [linear(row, qkv_weight, qkv_bias) for row in rows]  # [T][3C]
    q = [p[0:C] for p in projected]
    k = [p[C : 2 * C] for p in projected]
    v = [p[2 * C : 3 * C] for p in projected]
    scale = math.sqrt(d)

    joined = [zeros(C) for _ in range(T)]
    all_weights = []
    for h in range(n_head):
        lo, hi = h * d, (h + 1) * d
        head_weights = []
        for i in range(T):
            visible = range(i + 1) if causal else range(T)
            scores = []
            for j in visible:
                dot = 0.0
                for c in range(lo, hi):
                    dot += q[i][c] * k[j][c]
                scores.append(dot / scale)
            probs = softmax(scores)
            row_weights = zeros(T)
            for n, j in enumerate(visible):
                row_weights[j] = probs[n]
            head_weights.append(row_weights)
            for c in range(lo, hi):
                total = 0.0
                for j in range(T):
                    total += row_weights[j] * v[j][c]
                joined[i][c] = total
        all_weights.append(head_weights)
    output = [linear(row, out_weight, out_bias) for row in joined]
    return output, all_weights


def block_forward(x: list[list[float]], block: dict, n_head: int, eps: float, causal: bool = True) -> dict:
    """One pre-norm block (chapter 17.5) over one sequence; returns every named stage."""
    norm1 = [layer_norm(row, block["norm1_gain"], block["norm1_bias"], eps) for row in x]
    attn, weights = attention(
        norm1, block["qkv_weight"], block["qkv_bias"], block["out_weight"], block["out_bias"], n_head, causal
    )
    residual1 = [add(x[t], attn[t]) for t in range(len(x))]
    norm2 = [layer_norm(row, block["norm2_gain"], block["norm2_bias"], eps) for row in residual1]
    hidden = [relu(linear(row, block["W1_weight"], block["W1_bias"])) for row in norm2]
    ffn = [linear(row, block["W2_weight"], block["W2_bias"]) for row in hidden]
    output = [add(residual1[t], ffn[t]) for t in range(len(x))]
    return dict(
        norm1=norm1,
        attention=attn,
        residual1=residual1,
        norm2=norm2,
        hidden=hidden,
        ffn=ffn,
        output=output,
        attention_weights=weights,
    )


def forward(weights: dict, ids: list[list[int]], n_head: int, eps: float = 1e-5, causal: bool = True) -> dict:
    """The whole model on a batch of token-id lists.

    Returns {"input": [B][T][C], "blocks": [ {stage: [B][T][...], "attention_weights": [B][H][T][T]} ],
    "final_norm": [B][T][C], "logits": [B][T][V]}."""
    E, P = weights["token_table"], weights["position_table"]
    result = {"input": [], "blocks": [dict() for _ in weights["blocks"]], "final_norm": [], "logits": []}
    for stages in result["blocks"]:
        for name in STAGES + ("attention_weights",):
            stages[name] = []
    for sequence in ids:
        if len(sequence) > len(P):
            raise ValueError(f"{len(sequence)} positions but only {len(P)} position rows")
        x = [add(E[token], P[t]) for t, token in enumerate(sequence)]
        result["input"].append(x)
        for b, block in enumerate(weights["blocks"]):
            stages = block_forward(x, block, n_head, eps, causal)
            for name, value in stages.items():
                result["blocks"][b][name].append(value)
            x = stages["output"]
        final = [layer_norm(row, weights["final_gain"], weights["final_bias"], eps) for row in x]
        result["final_norm"].append(final)
        result["logits"].append([linear(row, weights["head_weight"], None) for row in final])
    return result


# ----------------------------------------------------------------------------------------------
# reading minigpt's parameter names (plain lists in, plain lists out: no torch here)


def weights_from_state_dict(state: dict[str, list]) -> dict:
    """{minigpt parameter name: nested list} -> the structure `forward` reads. Missing biases
    (a model built with bias = false) become None."""
    n_layer = 0
    while f"blocks.{n_layer}.norm1.weight" in state:
        n_layer += 1
    blocks = []
    for i in range(n_layer):
        p = f"blocks.{i}."
        blocks.append(
            dict(
                norm1_gain=state[p + "norm1.weight"],
                norm1_bias=state.get(p + "norm1.bias"),
                qkv_weight=state[p + "attention.qkv.weight"],
                qkv_bias=state.get(p + "attention.qkv.bias"),
                out_weight=state[p + "attention.out.weight"],
                out_bias=state.get(p + "attention.out.bias"),
                norm2_gain=state[p + "norm2.weight"],
                norm2_bias=state.get(p + "norm2.bias"),
                W1_weight=state[p + "ffn.W1.weight"],
                W1_bias=state.get(p + "ffn.W1.bias"),
                W2_weight=state[p + "ffn.W2.weight"],
                W2_bias=state.get(p + "ffn.W2.bias"),
            )
        )
    return dict(
        token_table=state["token_table.weight"],
        position_table=state["position_table.weight"],
        blocks=blocks,
        final_gain=state["final_norm.weight"],
        final_bias=state.get("final_norm.bias"),
        head_weight=state["head.weight"],
    )
