"""What each layer of an Attention Residuals model reads (`[model] residual = "attention"`,
model/depth.py), named for a reader: the sources its depth weights are over, in the model's order.

Every attention and every FFN sublayer is a layer: block 0's attention is layer 1, its FFN layer 2,
block 1's attention layer 3, ... (without an FFN, only the attentions). Layer l reads, in order:
the embedding (v_0), the sum of each finished group of `per_block` consecutive layers, then the sum so
far of its own unfinished group, if that has an output yet ("partial"). The full form has groups of
one layer: layer l reads the embedding and every earlier layer's output by its own name. The final
norm reads after the last layer, with its own query.

    full form:   embedding, b0.attention, b0.ffn, b1.attention, ...
    Block AttnRes (2 layers a group): embedding, b0.attention+b0.ffn, ..., partial b2.attention
    (4 layers a group): embedding, b0.attention+...+b1.ffn, ...

Plain names only, no torch: the trace, its text and the explore page's server read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model import stages

EMBEDDING = "embedding"  # v_0: the token row (plus the position row with a learned table)
PARTIAL = "partial"  # the reader's own unfinished group, summed so far
FINAL = "final_norm"  # the reader after the last layer


@dataclass(frozen=True)
class Reader:
    """One read over depth: layer `layer` (1-based; the final norm's is the number of layers + 1),
    the sublayer it feeds (`reader`: "b0.attention", "b0.ffn" or "final_norm"), the recorded names
    of its weights and of its mix, and its sources: each a label and the layers summed in it."""

    layer: int
    reader: str
    weights: str  # the recorded weights' full name: blocks.0.depth_weights1, ..., final_depth_weights
    read: str  # the recorded mix's full name: blocks.0.read1, ..., final_read
    sources: tuple[str, ...]
    layers: tuple[tuple[str, ...], ...]  # per source, the layers it sums ((embedding,) for v_0)


def layer_names(n_layer: int, ffn: bool = True) -> list[str]:
    """Every layer's name in order: b0.attention, b0.ffn, b1.attention, ..."""
    kinds = (stages.ATTENTION, stages.FFN) if ffn else (stages.ATTENTION,)
    return [f"b{i}.{kind}" for i in range(n_layer) for kind in kinds]


def group_label(names: list[str] | tuple[str, ...]) -> str:
    """A sum of layers as the trace names it: one layer by its name, up to three joined by +, more
    as first+...+last."""
    if len(names) <= 3:
        return "+".join(names)
    return f"{names[0]}+...+{names[-1]}"


def readers(n_layer: int, ffn: bool = True, blocks: int = 0) -> list[Reader]:
    """Every read over depth of a model of `n_layer` blocks (`ffn`: each with an FFN) and
    `blocks` = `[model] attention_residual_blocks` (0: the full form), in the pass's order: layer 1's
    (block 0's read1), layer 2's (read2), ..., the final norm's."""
    names = layer_names(n_layer, ffn)
    per_block = len(names) // (blocks or len(names))
    out = []
    for layer in range(1, len(names) + 2):  # len(names) + 1: the final norm
        done = layer - 1  # the layers computed before this read
        finished, partial = divmod(done, per_block)
        groups = [tuple(names[k * per_block : (k + 1) * per_block]) for k in range(finished)]
        sources = [EMBEDDING] + [group_label(group) for group in groups]
        layers = [(EMBEDDING,), *groups]
        if partial:
            own = tuple(names[finished * per_block : done])
            sources.append(f"{PARTIAL} {group_label(own)}")
            layers.append(own)
        if layer <= len(names):
            block, kind = divmod(layer - 1, 2 if ffn else 1)
            first = kind == 0
            reader = names[layer - 1]
            weights = stages.block_name(block, stages.DEPTH_WEIGHTS1 if first else stages.DEPTH_WEIGHTS2)
            read = stages.block_name(block, stages.READ1 if first else stages.READ2)
        else:
            reader, weights, read = FINAL, stages.FINAL_DEPTH_WEIGHTS, stages.FINAL_READ
        out.append(Reader(layer, reader, weights, read, tuple(sources), tuple(layers)))
    return out


def model_readers(model: dict[str, Any]) -> list[Reader]:
    """`readers` of a model as `MiniGPT.architecture()` describes it (none without Attention
    Residuals)."""
    if model.get("residual") != "attention":
        return []
    return readers(model["n_layer"], model["ffn_hidden"] > 0, model.get("attention_residual_blocks", 0))
