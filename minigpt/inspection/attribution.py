"""Direct logit attribution: one position's logit for a token (or the difference between two
tokens' logits) written as the sum of what each part of the model wrote into the residual stream.

In a pre-norm model the stream that reaches the final norm is a plain sum (chapter 17.2, "every
block's update is a correction to the same running x"):

    x = token row + position row + sum over blocks of (attention + ffn)
    attention = sum over heads h of heads[h] W_O[h] + b_O           (W_O[h]: head h's columns of W_O)

With grouped-query attention (`[model] n_kv_head`) the sum is over the query heads: heads that share
a key and value head still each weigh them their own way, and each has its own d columns of W_O
([C, n_head d], d = `head_width` where it is set); b_O is a part only where W_O has a bias.

With `[model] positions = "none"`, "rope" or "alibi" there is no position row: rope's rotation and
ALiBi's bias act inside attention, in what each head reads, so they are in its head's part and the
parts still sum to the logit.

The final norm is linear in x once its scale is fixed: LayerNorm is gamma * (x - mean(x)) * s + beta
and centring is linear, RMSNorm is gamma * x * s, with s = 1 / sqrt(var(x) + eps) (RMSNorm: the mean
square) taken from the real pass. So each part p contributes s * (gamma * centred(p)) . w to the
logit, where w is the head's row for the token (minus the versus token's row), and beta . w is a
part of its own. The parts sum to the logit the forward pass computed, up to rounding; `error`
says by how much.

Every row comes from the trace's own recorded pass (trace.py), interventions included: an ablated
head is a zero part, a scaled sublayer's parts are scaled, a replaced input row is one `input` part,
a patch's clean ffn update or head is that part.

With `[model] residual = "attention"` (Attention Residuals, model/depth.py) no stream is summed, but
the final norm still reads a sum of the same parts: its input is the final query's mix over depth,

    final_read = sum over sources k of alpha_k s_k      (alpha: this pass's final_depth_weights)

where s_0 is the embedding (token row + position row) and every other source is the sum of the
outputs of one block of layers (full form: one sublayer's output). Each part sits in exactly one
source, so it contributes alpha_k s * (gamma * centred(part)) . w, with alpha_k its source's weight
(`Part.weight`) and s the final norm's scale taken from final_read; the parts still sum to the logit.
Like the ordinary attribution this is the direct path alone: what a part changed in the later
layers' reads (and in alpha itself) is in those layers' parts, not in its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..config import Residual
from ..errors import MinigptError, Phrase
from ..model import stages
from ..model.gpt import MiniGPT
from ..model.layers import LayerNorm, NoNorm
from ..text.tokenizer import TextTokenizer
from .interventions import Intervention, PutBack, ReplaceResidual, Scale, SetInput
from .trace import Trace


def resolve_token(tokenizer: TextTokenizer, text: str, what: Phrase, vocab_size: int) -> int:
    """A token named by the user: `#ID`, or a text that is exactly one token of the run's tokenizer."""
    if text.startswith("#") and len(text) > 1:
        try:
            token = int(text[1:])
        except ValueError:
            raise MinigptError(
                "{what} {text!r}: {rest!r} is not a token id; give #ID with ID in 0..{last}, or the token's text",
                what=what,
                text=text,
                rest=text[1:],
                last=vocab_size - 1,
            ) from None
        if not 0 <= token < vocab_size:
            raise MinigptError(
                "{what} {text!r}: this model has {vocab_size} tokens, ids 0..{last}",
                what=what,
                text=text,
                vocab_size=vocab_size,
                last=vocab_size - 1,
            )
        return token
    ids = tokenizer.encode(text, special=False) if text else []  # a char tokenizer refuses a character it never saw
    if len(ids) != 1:
        pieces = ", ".join(f"{tokenizer.token_text(i)!r} (#{i})" for i in ids) or "nothing"
        raise MinigptError(
            "{what} {text!r} encodes to {n_ids} tokens ({pieces}); give exactly one token of the run's "
            "tokenizer, or its id as #ID",
            what=what,
            text=text,
            n_ids=len(ids),
            pieces=pieces,
        )
    return ids[0]


@dataclass
class Part:
    """What one part of the model added to the attributed logit (difference)."""

    name: str  # token, position (or input), B.attention.headH, B.attention.bias, B.ffn, final_norm.bias
    value: float
    # residual = "attention": the final read's weight of the source this part sits in (already in
    # `value`); None in the ordinary residual stream, where every part counts once
    weight: float | None = None

    def as_dict(self) -> dict:
        out = {"name": self.name, "value": self.value}
        if self.weight is not None:
            out["weight"] = self.weight
        return out


@dataclass
class Attribution:
    """The traced position's logit for `token` (minus `versus`'s) as the sum of its parts."""

    position: int
    token: str
    id: int
    versus: str | None
    versus_id: int | None
    total: float  # what the forward pass computed: logits[token] - logits[versus]
    parts: list[Part]  # in the model's order: token, position, block by block, final_norm.bias
    error: float  # sum of the parts minus total
    scale: float  # the final norm's 1 / sqrt(var + eps) in this pass, which every part is taken through
    interventions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "position": self.position,
            "token": self.token,
            "id": self.id,
            "versus": self.versus,
            "versus_id": self.versus_id,
            "total": self.total,
            "error": self.error,
            "scale": self.scale,
            "parts": [part.as_dict() for part in self.parts],
        }


def check_decomposable(model: MiniGPT, interventions: Sequence[Intervention] = (), position: int | None = None) -> None:
    """Refuse what has no residual-stream sum to attribute, in one line saying why; with the
    traced `position` known, a patch that breaks the sum there too."""
    if model.cfg.norm_position != "pre":
        raise MinigptError(
            "attribution needs the residual stream to reach the final norm as a sum of the parts; this model "
            "is post-norm ([model] norm_position = {given}), whose blocks normalise the sum itself, so its "
            "logits are not a sum of what each part wrote",
            given=model.cfg.norm_position,
        )
    if model.cfg.residual_kind is Residual.NONE:  # SUM: the stream; ATTENTION: a mix over depth of the same parts
        raise MinigptError(
            "attribution needs the residual stream to reach the final norm as a sum of the parts; this model "
            "has no residual ([model] residual = false): each block's output is its last sublayer's alone, "
            "not a sum of what each part wrote"
        )
    if any(isinstance(item, ReplaceResidual) for item in interventions):
        raise MinigptError(
            "attribution with {replace_residual}: replacing the residual sums removes the running sum the "
            "attribution splits; attribute the unmodified pass, or use {scale} or {ablate_head}"
        )
    for item in interventions:
        if isinstance(item, PutBack) and position is not None and item.position in (None, position):
            check_patch_attributable(item.stage)


def check_patch_attributable(stage: str) -> None:
    """Refuse splitting the logit at a position where a patch put back the clean prompt's `stage`
    where that breaks the sum: a residual-stream row is then the clean pass's, not the sum of this
    pass's parts, and an attention update the clean pass's, not the sum of this pass's heads. A
    patched ffn update or head is itself one of the parts, so the sum stays exact; so does any
    patch at another position, whose row the traced one's parts only read."""
    if stage in (stages.INPUT, stages.RESIDUAL1, stages.OUTPUT):
        raise MinigptError(
            "attribution at a position where a patch puts back the clean prompt's {stage}: that residual-"
            "stream row is the clean pass's, not the sum of this pass's parts the attribution splits; "
            "attribute another position, or patch the ffn or a head",
            stage=stage,
        )
    if stage == stages.FINAL_READ:
        raise MinigptError(
            "attribution at a position where a patch puts back the clean prompt's final_read: the final norm "
            "then reads the clean pass's mix, not this pass's parts weighted by its depth weights, which the "
            "attribution splits; attribute another position, or patch a sublayer's ffn or a head"
        )
    if stage == stages.ATTENTION:
        raise MinigptError(
            "attribution at a position where a patch puts back the clean prompt's attention update: it is "
            "the clean pass's, not the sum of the heads this pass computed there, which the attribution "
            "splits it into; attribute another position, or patch a head"
        )


def attribute(
    model: MiniGPT,
    tokenizer: TextTokenizer,
    trace: Trace,
    token: int,
    versus: int | None = None,
    interventions: Sequence[Intervention] = (),
) -> Attribution:
    """Split `trace`'s logit for `token` at its position (minus `versus`'s) into the parts that wrote
    the residual stream (Attention Residuals: the sources the final norm's read mixes, each part
    weighted by its source's weight). `interventions` are those the trace's pass applied."""
    check_decomposable(model, interventions, trace.position)
    cfg, p, recorded = model.cfg, trace.position, trace.recorded
    last = len(model.blocks) - 1
    head = model.head.weight.detach().double()  # [V, C]
    direction = head[token] - (head[versus] if versus is not None else 0.0)  # w: [C]
    depth = cfg.residual_kind is Residual.ATTENTION
    # what enters the final norm: the stream after the last block, or (Attention Residuals) the final read
    entering = stages.FINAL_READ if depth else stages.block_name(last, stages.OUTPUT)
    stream = recorded[entering][0, p].double()
    # the weight of each part's source in the final read (1 in the ordinary stream)
    weigh = _source_weights(model, recorded, p) if depth else (lambda layer: None)
    norm = model.final_norm
    gain = norm.weight.detach().double() if norm.weight is not None else torch.ones_like(stream)
    if isinstance(norm, NoNorm):  # norm = "none": the final norm is the identity, scale 1, no centring
        scale = 1.0

        def through_norm(row: torch.Tensor) -> float:
            return float(row @ direction)
    elif isinstance(norm, LayerNorm):
        scale = 1.0 / math.sqrt(float(((stream - stream.mean()) ** 2).mean()) + norm.eps)

        def through_norm(row: torch.Tensor) -> float:
            return float(scale * ((row - row.mean()) * gain) @ direction)
    else:
        scale = 1.0 / math.sqrt(float((stream**2).mean()) + norm.eps)

        def through_norm(row: torch.Tensor) -> float:
            return float(scale * (row * gain) @ direction)

    def part(name: str, row: torch.Tensor, layer: int, factor: float = 1.0) -> Part:
        """`row` (what layer `layer` wrote; 0: the embedding) through the final norm, times its
        source's weight in the final read (Attention Residuals)."""
        weight = weigh(layer)
        value = factor * through_norm(row)
        return Part(name, value if weight is None else weight * value, weight)

    parts: list[Part] = []
    if any(isinstance(item, SetInput) for item in interventions):  # the replaced row has no token/position split
        parts.append(part(stages.INPUT, recorded[stages.INPUT][0, p].double(), 0))
    else:
        parts.append(part("token", model.token_table.weight.detach()[trace.ids[p]].double(), 0))
        rows = model.position_rows(p, 1)  # learned or sinusoidal; none, rope, alibi, t5: inside each head or none
        if rows is not None:
            parts.append(part("position", rows.detach()[0].double(), 0))
    d = cfg.resolved_head_width  # head_width, or n_embd / n_head
    sublayers = 2 if cfg.ffn_hidden > 0 else 1  # layers per block of the model: its attention, then its FFN
    for i, block in enumerate(model.blocks):
        factor = _attention_factor(interventions, i)
        mixed = recorded[stages.block_name(i, stages.HEADS)][0, :, p].double()  # [H, d], after any ablation
        out = block.attention.out
        # [C, H d] as [out, in]: query head h writes through columns h*d .. (h+1)*d - 1 (with grouped-query
        # attention too: the heads share keys and values, each still mixes its own row of them)
        W_O = out.weight.detach().double()
        layer = sublayers * i + 1  # block i's attention is layer 2i + 1 (i + 1 without FFNs), its FFN the next
        for h in range(cfg.n_head):
            parts.append(part(f"{i}.attention.head{h}", mixed[h] @ W_O[:, h * d : (h + 1) * d].T, layer, factor))
        if out.bias is not None:
            parts.append(part(f"{i}.attention.bias", out.bias.detach().double(), layer, factor))
        if cfg.ffn_hidden > 0:  # ffn_hidden = 0: no ffn part
            parts.append(part(f"{i}.ffn", recorded[stages.block_name(i, stages.FFN)][0, p].double(), layer + 1))
    if getattr(norm, "bias", None) is not None:
        parts.append(Part("final_norm.bias", float(norm.bias.detach().double() @ direction)))
    logits = recorded[stages.LOGITS][0, p].double()
    total = float(logits[token] - (logits[versus] if versus is not None else 0.0))
    return Attribution(
        position=p,
        token=tokenizer.token_text(token),
        id=token,
        versus=tokenizer.token_text(versus) if versus is not None else None,
        versus_id=versus,
        total=total,
        parts=parts,
        error=math.fsum(part.value for part in parts) - total,
        scale=scale,
        interventions=[str(item) for item in interventions],
    )


def _source_weights(model: MiniGPT, recorded: dict[str, torch.Tensor], position: int):
    """Attention Residuals: layer j (0: the embedding; 1, 2, ...: the sublayers in order) -> the
    final read's weight at `position` of the source that holds its output: the embedding is source
    0, and the layers fill sources 1, 2, ... `per_block` at a time (one each in the full form)."""
    alpha = recorded[stages.FINAL_DEPTH_WEIGHTS][0, position].double().tolist()  # [S]
    per_block = model.per_block

    def weight(layer: int) -> float:
        return alpha[0 if layer == 0 else (layer - 1) // per_block + 1]

    return weight


def _attention_factor(interventions: Sequence[Intervention], block: int) -> float:
    """What the scale interventions multiply block `block`'s attention update by (at the traced
    position, where the attribution reads it, whether they apply everywhere or there only)."""
    factor = 1.0
    for item in interventions:
        if isinstance(item, Scale) and item.stage == stages.ATTENTION and item.block in (None, block):
            factor *= item.factor
    return factor
