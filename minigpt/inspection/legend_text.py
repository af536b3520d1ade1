"""A trace's legend: what each stage of a block computes, as a formula in the stages' names for the
model as built (norm, residual, FFN, attention), and where positions enter a model whose stream
carries none (rope, alibi). trace_text.py prints it above the tables; comparison_text.py writes a
stage's formula beside its rows where the two blocks compute in different orders.
"""

from __future__ import annotations

from typing import Any

from ..model.positions import alibi_slopes
from ..model.stages import (
    ATTENTION,
    FFN,
    HIDDEN,
    INPUT,
    NORM1,
    NORM2,
    OUTPUT,
    READ1,
    READ2,
    RESIDUAL1,
    RESIDUAL2,
    block_stages,
)


def stage_formulas(model: dict[str, Any]) -> dict[str, str]:
    """What each stage of a block is, in the stages' names, for the model as built: no `+` without
    the residual, no FFN stages without an FFN, `norm1 = input` where the norm is the identity
    (`norm = "none"`); post-norm's output is its norm2."""
    kind = model["norm"]
    norm = {"layernorm": "LN", "rmsnorm": "RMS"}.get(kind, "")
    b1, b2 = (" + b1", " + b2") if model["bias"] or model.get("ffn_bias") else ("", "")
    skip = model.get("residual", True)
    # grouped-query attention: query heads share key and value heads
    mha = "GQA" if model.get("n_kv_head", model.get("n_head")) != model.get("n_head") else "MHA"
    ffn = model.get("ffn_hidden", 1) > 0

    def normed(which: str, x: str) -> str:
        return x if kind == "none" else f"{norm}{which}({x})"

    def add(stream: str, update: str) -> str:
        return f"{stream} + {update}" if skip else update

    def hidden(x: str) -> str:
        if model["activation"] == "swiglu":  # W1 holds the gate and value projections side by side
            return f"SiLU(gate) * value, [gate | value] = {x} W1{b1}"
        return f"{model['activation']}({x} W1{b1})"

    if model.get("residual") == "attention":  # Attention Residuals: each sublayer reads a mix over depth
        formulas = {
            READ1: depth_mix("depth1"),
            NORM1: normed("1", READ1),
            ATTENTION: f"{mha}({NORM1})",
            READ2: depth_mix("depth2"),
            NORM2: normed("2", READ2),
            HIDDEN: hidden(NORM2),
            FFN: f"{HIDDEN} W2{b2}",
        }
    elif model["norm_position"] == "pre":
        formulas = {
            NORM1: normed("1", INPUT),
            ATTENTION: f"{mha}({NORM1})",
            RESIDUAL1: add(INPUT, ATTENTION),
            NORM2: normed("2", RESIDUAL1),
            HIDDEN: hidden(NORM2),
            FFN: f"{HIDDEN} W2{b2}",
            OUTPUT: add(RESIDUAL1, FFN) if ffn else RESIDUAL1,
        }
    else:
        formulas = {
            ATTENTION: f"{mha}({INPUT})",
            RESIDUAL1: add(INPUT, ATTENTION),
            NORM1: normed("1", RESIDUAL1),
            HIDDEN: hidden(NORM1),
            FFN: f"{HIDDEN} W2{b2}",
            RESIDUAL2: add(NORM1, FFN),
            NORM2: normed("2", RESIDUAL2),
            OUTPUT: NORM2 if ffn else NORM1,
        }
    depth = model.get("residual") == "attention"
    return {stage: formulas[stage] for stage in block_stages(model["norm_position"], ffn, depth)}


def depth_mix(query: str) -> str:
    """An Attention Residuals read (model/depth.py): the softmax over the sources v_i of the query's
    dot product with each source's RMS-normed row (no gain), and the mix of the sources themselves."""
    return f"sum_i a_i v_i, a = softmax_i({query}.query . v_i / rms(v_i))"


# What the sources of an Attention Residuals read are, under the legend.
DEPTH_SOURCES = (
    "v_i: the sources each read weighs, the embedding and the earlier sublayers' outputs (summed in "
    "groups with attention_residual_blocks), named under each block's depth weights"
)


def legend_lines(model: dict[str, Any]) -> list[str]:
    """One formula per stage, in the order the block computes them (stages.py), in the stages' names
    (`stage_formulas`)."""
    formulas = stage_formulas(model)
    if model["norm_position"] == "post" and NORM2 in formulas:  # post-norm's output is LN2's: one line names both
        del formulas[OUTPUT]
        formulas[NORM2] = f"{OUTPUT} = {formulas[NORM2]}"
    steps = [f"{stage} = {formula}" for stage, formula in formulas.items()]
    steps = [step + ";" for step in steps[:-1]] + [steps[-1]]
    if model.get("residual") == "attention":
        return [f"{model['norm_position']}-norm block, Attention Residuals:"] + steps  # a read's formula is long
    return [f"{model['norm_position']}-norm block: {steps[0]}"] + steps[1:]


def ffn_bias_note(model: dict[str, Any]) -> str | None:
    """Where the FFN's b1 and b2 come from, where the config could be read otherwise: a SwiGLU FFN
    (lesson 09's and Llama's have none) or biases that only ffn_bias gives; trace_text.py prints it
    under the legend. A config that shows `ffn_bias = false` beside the legend's `+ b1` is then read
    right: `bias = true` gives every linear layer its bias."""
    if model.get("ffn_hidden", 1) <= 0 or not (model["bias"] or model.get("ffn_bias")):
        return None
    if not model["bias"]:
        return "(b1, b2: the FFN's biases, from [model] ffn_bias = true; the other linear layers have none)"
    if model["activation"] == "swiglu":
        return (
            "(b1, b2: the FFN's biases, there because [model] bias = true gives every linear layer one; "
            "ffn_bias = false adds none of its own)"
        )
    return None


def positions_note(model: dict[str, Any], json_at: str = "the trace's JSON") -> str | None:
    """Where positions enter a model whose stream carries none (rope, alibi): one sentence, for
    the trace's text and the explore page (`json_at`: what holds the trace's JSON there); None for a
    learned table (its row is in block 0's input table) and for none (no position enters at all)."""
    if model["positions"] == "rope":
        share = model.get("rope_fraction", 1.0)
        turned = f"the first {share:.0%} of each head " if share != 1.0 else ""
        return (
            f"rope: queries and keys turned {turned}by their position inside attention (rope_theta "
            f"{model['rope_theta']:g}; {json_at} has the rotated rows)"
        )
    if model["positions"] == "t5":
        return (
            f"t5: a learned bias b[bucket(distance), head] added to each head's scores inside attention "
            f"({model['t5_buckets']} buckets up to distance {model['t5_max_distance']}, shared by every block)"
        )
    if model["positions"] == "alibi":
        slopes = ", ".join(f"{s:.4g}" for s in alibi_slopes(model["n_head"]))
        return f"alibi: -slope x distance added to each head's scores inside attention (slopes {slopes})"
    return None
