"""The names of the stages a forward pass computes: one definition that model.py records under,
interventions.py checks against, and trace.py, trace_text.py and the explore page read.

    input                                      X = E[ids] + P[0:T] (E[ids] alone without positions), what enters block 0
    blocks.{i}.{stage}                         every stage of block i, in the order it computes them
    blocks.{i}.attention_weights               softmax(mask(Q K^T / sqrt(d))), recorded inside attention
    blocks.{i}.heads                           each head's mixed values before W_O: replaceable, not recorded
    blocks.{i}.rotated_query, rotated_key      rope only: Q and K [B, H, T, d] turned by their positions
    blocks.{i}.pre_activation                  x W1 + b1 inside the FFN, before the activation: replaceable,
                                               not recorded (kept where asked: a part fed one row, feed.py)
    final_norm, logits                         after the last block

With `[model] residual = "attention"` (Attention Residuals, depth.py) a block adds nothing to a stream:
    blocks.{i}.depth_weights1, read1           the softmax weights over the embedding and the earlier
                                               sublayers' outputs [B, T, S], and their mix, which norm1 reads
    blocks.{i}.depth_weights2, read2           the same before the FFN, which norm2 reads
    final_depth_weights, final_read            the same before the final norm

Plain names only, no torch: anything (the command layer, the page's server) can read them cheaply.
"""

from __future__ import annotations

# one block's stages
NORM1 = "norm1"
ATTENTION = "attention"
RESIDUAL1 = "residual1"
NORM2 = "norm2"
HIDDEN = "hidden"
FFN = "ffn"
RESIDUAL2 = "residual2"
OUTPUT = "output"

# Pre-norm (chapter 17.5), in the order Block.forward computes and records them.
PRE_NORM = (NORM1, ATTENTION, RESIDUAL1, NORM2, HIDDEN, FFN, OUTPUT)
# Post-norm (chapter 17.6) computes the same kinds of value in another order; `residual2` is the
# second sum before LN2, and `output` is LN2 of it (the same values as `norm2`).
POST_NORM = (ATTENTION, RESIDUAL1, NORM1, HIDDEN, FFN, RESIDUAL2, NORM2, OUTPUT)
BLOCK_STAGES = {"pre": PRE_NORM, "post": POST_NORM}

# Attention Residuals (`[model] residual = "attention"`): each sublayer reads a learned mix over depth
# (`read1`, `read2`, their weights recorded just before them like attention's), and adds to no stream,
# so a block has no `residual1` and no `output`: what it leaves is its two sublayers' outputs.
DEPTH_WEIGHTS1 = "depth_weights1"
READ1 = "read1"
DEPTH_WEIGHTS2 = "depth_weights2"
READ2 = "read2"
DEPTH_READ = (READ1, NORM1, ATTENTION, READ2, NORM2, HIDDEN, FFN)
DEPTH_WEIGHTS = {READ1: DEPTH_WEIGHTS1, READ2: DEPTH_WEIGHTS2}  # recorded just before the mix they make

# inside attention: recorded just before `attention` (its weights), and replaceable only (`heads`)
ATTENTION_WEIGHTS = "attention_weights"
HEADS = "heads"
# inside the FFN: x W1 + b1 before the activation (`hidden` is after it). Replaceable only, like
# `heads`: a pass keeps it where a replacement asks (a part fed one row), so a trace's table and the
# names a pass records stay the chapter's seven.
PRE_ACTIVATION = "pre_activation"
# inside attention, rope only (`[model] positions = "rope"`): the queries and keys [B, H, T, d] after
# their rotation, recorded as computed (a trace's --json shows the traced position's rows)
ROTATED_QUERY = "rotated_query"
ROTATED_KEY = "rotated_key"
ROTATED = (ROTATED_QUERY, ROTATED_KEY)

# the model's own, around the blocks
INPUT = "input"
FINAL_NORM = "final_norm"
LOGITS = "logits"
FINAL_DEPTH_WEIGHTS = "final_depth_weights"  # Attention Residuals: the final norm's read over depth
FINAL_READ = "final_read"

# The two sublayer updates that an intervention may scale (each is added to the residual stream).
SCALABLE = (ATTENTION, FFN)

# Which stream value each residual add adds its sublayer's update to (chapter 17.5 pre-norm, 17.6
# post-norm): the skip connections of Figure 17.1, as the explore page draws them.
RESIDUAL_ADDS = {
    "pre": {RESIDUAL1: INPUT, OUTPUT: RESIDUAL1},
    "post": {RESIDUAL1: INPUT, RESIDUAL2: NORM1},
}


# Stages a block without an FFN (`[model] ffn_hidden = 0`) does not compute: absent, not zero. Its
# `output` is then what the attention sublayer leaves: `residual1` (pre-norm) or `norm1` (post-norm).
FFN_STAGES = (READ2, NORM2, HIDDEN, FFN, RESIDUAL2)


def block_stages(norm_position: str, ffn: bool = True, depth: bool = False) -> tuple[str, ...]:
    """A block's stages in the order it computes them: PRE_NORM or POST_NORM (DEPTH_READ with
    Attention Residuals, `depth`), less FFN_STAGES without an FFN (`ffn` False)."""
    try:
        names = BLOCK_STAGES[norm_position]
    except KeyError:
        raise ValueError(f"norm_position {norm_position!r}: expected one of {', '.join(BLOCK_STAGES)}") from None
    names = DEPTH_READ if depth else names
    return names if ffn else tuple(name for name in names if name not in FFN_STAGES)


def of(cfg) -> dict:
    """The keyword arguments naming a config's stages: block_stages(**of(cfg)), recorded_names(n, **of(cfg))."""
    return {
        "norm_position": cfg.norm_position,
        "ffn": cfg.ffn_hidden > 0,
        "depth": cfg.residual_kind.value == "attention",  # config.Residual: this module imports nothing
    }


def residual_adds(norm_position: str, ffn: bool = True, depth: bool = False, residual: bool = True) -> dict[str, str]:
    """RESIDUAL_ADDS for a model as built: none without the residual (or with Attention Residuals,
    `depth`, which adds nothing to a stream), the FFN's none without an FFN."""
    if not residual or depth:
        return {}
    adds = dict(RESIDUAL_ADDS.get(norm_position, {}))
    return adds if ffn else {k: v for k, v in adds.items() if k == RESIDUAL1}


def second_sum(norm_position: str) -> str:
    """The stage holding a block's second residual sum (input of the FFN's add): `output` in a
    pre-norm block, `residual2` in a post-norm one, where `output` is LN2 of it."""
    return OUTPUT if norm_position == "pre" else RESIDUAL2


def block_prefix(index: int) -> str:
    """`blocks.{index}`: the scope under which block `index` records its stages."""
    return f"blocks.{index}"


def block_name(index: int, stage: str) -> str:
    """The full name of one block's stage: `blocks.{index}.{stage}`."""
    return f"{block_prefix(index)}.{stage}"


def recorded_names(n_layer: int, norm_position: str, ffn: bool = True, depth: bool = False) -> tuple[str, ...]:
    """Every name a recorded forward pass holds, in the order the pass records them: `input`, each
    block's stages (its attention weights just before `attention`, its depth weights just before
    each read), `final_norm`, `logits` (after `final_depth_weights` and `final_read`, with `depth`)."""
    names = [INPUT]
    for i in range(n_layer):
        for stage in block_stages(norm_position, ffn, depth):
            if stage == ATTENTION:
                names.append(block_name(i, ATTENTION_WEIGHTS))
            if stage in DEPTH_WEIGHTS:
                names.append(block_name(i, DEPTH_WEIGHTS[stage]))
            names.append(block_name(i, stage))
    final = (FINAL_DEPTH_WEIGHTS, FINAL_READ) if depth else ()
    return (*names, *final, FINAL_NORM, LOGITS)


def rotated_names(n_layer: int) -> tuple[str, ...]:
    """The names a rope model's attention records besides recorded_names: each block's ROTATED."""
    return tuple(block_name(i, stage) for i in range(n_layer) for stage in ROTATED)


def replaceable_names(n_layer: int, norm_position: str, ffn: bool = True, depth: bool = False) -> tuple[str, ...]:
    """Every name a replacement may target: the recorded ones, each block's `pre_activation` (with an
    FFN) and each block's `heads`."""
    inner = tuple(block_name(i, PRE_ACTIVATION) for i in range(n_layer)) if ffn else ()
    return (
        recorded_names(n_layer, norm_position, ffn, depth) + inner + tuple(block_name(i, HEADS) for i in range(n_layer))
    )
