"""Follow one position through every block, with the numbers the model used.

Every row comes from a `Recorder` passed to the model's own forward pass (model.py), never from a
second computation here. The only arithmetic on top is
  - the logit lens: a block's recorded output row through the model's own `final_norm` and `head`
    modules, then softmax ("what would the head predict if the model stopped after this block"),
  - probabilities: softmax of the recorded logits row,
  - with Attention Residuals (`[model] residual = "attention"`), where no block leaves an output row,
    the logit lens reads the model's own `final_depth` over the rows the pass recorded up to that
    block (the embedding and the sublayers' outputs, depth.py's Depth): the final norm's read had
    the model stopped there,
  - with `grad`, the gradient of the traced position's next-token loss with respect to every
    stage's row, by autograd through the graph of that same recorded pass (gradients.py).

`trace_position` returns a typed `Trace`; `Trace.to_json()` is the `--json` object, and
trace_text.py lays the same data out as tables for a terminal. What a trace is given is checked in
trace_input.py; two passes side by side are comparison.py's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

from ..config import Residual
from ..errors import MinigptError
from ..model import stages
from ..model.gpt import MiniGPT
from ..model.layers import ResidualShapeError
from ..model.positions import Rotary
from ..model.recorder import Recorder, Replacement
from ..text.tokenizer import TextTokenizer
from . import gradients
from .depth_reads import Reader, model_readers
from .gradients import Gradient, Target
from .interventions import BroadcastUpdate, Intervention, SetInput
from .interventions_apply import replacements
from .trace_input import check_ids, resolve_blocks, resolve_position
from .weight_edits import edited

# ---------------------------------------------------------------- the result, typed


@dataclass
class Candidate:
    """One possible next token: its text, id, probability (softmax of the logits) and logit."""

    token: str
    id: int
    probability: float
    logit: float


@dataclass
class Row:
    """A stage's row at the traced position, and the shape of the whole array it comes from."""

    row: list[float]
    shape: list[int]


@dataclass
class InputRows:
    """Block 0's input at the traced position: token row + position row = X (without a position
    table, `[model] positions = "none"`, the position row and its table's shape are None: absent).
    `replaced`: set-input replaced X at this position, so `row` is not the sum of the two (in the
    JSON only then)."""

    token_row: list[float]
    position_row: list[float] | None
    row: list[float]
    shape: list[int]
    token_table_shape: list[int]
    position_table_shape: list[int] | None
    replaced: bool = False


@dataclass
class DepthRead:
    """One read over depth at the traced position (`[model] residual = "attention"`, depth.py):
    layer `layer` (1-based; the final norm's: the number of layers + 1), the sublayer it feeds
    (`reader`: "b0.attention", "b0.ffn" or "final_norm"), the recorded name of its weights, its
    sources' labels (depth_reads.py: "embedding", "b0.attention", ..., "partial ..."), the layers
    each sums, the softmax weights over them (they sum to 1, `total`, math.fsum) and the whole
    weights' shape [1, T, S]."""

    layer: int
    reader: str
    stage: str
    sources: list[str]
    layers: list[list[str]]
    weights: list[float]
    total: float
    shape: list[int]


@dataclass
class BlockTrace:
    index: int
    # what enters the block; None where no one row does (Attention Residuals past block 0: each
    # sublayer reads its own mix over depth, `read1` and `read2`)
    input: Row | None
    stages: dict[str, list[float]]  # stage name -> row, in the order the block computed them
    shapes: dict[str, list[int]]  # stage name -> whole-array shape
    attention_weights: list[list[float]]  # [head][key] over the visible keys 0..position
    attention_shape: list[int]  # [1, H, T, T]
    logit_lens: list[Candidate]  # this block's output through final_norm and the head
    full_attention: list[list[list[float]]] = field(default_factory=list, repr=False)  # [head][query][key]; not in JSON
    # rope only (`[model] positions = "rope"`): the traced position's query and key rows after their
    # rotation, [head][d], and the whole arrays' shapes, the queries' [1, H, T, d] and the keys' [1, K,
    # T, d] (K = n_kv_head: fewer than H with grouped-query attention); in the JSON only then
    rotated_query: list[list[float]] | None = None
    rotated_key: list[list[float]] | None = None
    rotated_shape: list[int] | None = None
    rotated_key_shape: list[int] | None = None
    # Attention Residuals only: the block's reads over depth (read1's, then read2's); in the JSON only then
    depth: list[DepthRead] = field(default_factory=list)


@dataclass
class Trace:
    position: int
    ids: list[int]
    tokens: list[str]
    model: dict[str, Any]
    input: InputRows
    blocks: list[BlockTrace]
    final_norm: Row
    next_tokens: list[Candidate]
    interventions: list[str] = field(default_factory=list)  # as applied; in the JSON only when any
    probabilities: list[float] = field(default_factory=list, repr=False)  # the whole next-token distribution
    # Every stage the pass recorded, whole ([1, T, ...]), by full name: what `stage` reads; not in JSON.
    recorded: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    attribution: Any = None  # an attribution.Attribution of this pass's logit, when one was asked for
    gradient: Gradient | None = None  # with `grad`: d loss / d row of every stage; in the JSON only then
    # With `all_positions`: each row stage at every position ([T][width]), by full name in the order
    # computed: token_rows and position_rows (the table rows block 0's input adds), input, the shown
    # blocks' stages, final_norm. In the JSON only then.
    all_positions: dict[str, list[list[float]]] = field(default_factory=dict)
    # The length the model was trained at ([model] context), and whether the traced position lies
    # past it (read with --extrapolate or a rope scaling): in the JSON only then.
    trained_length: int = 0
    past_trained_length: bool = False
    # Attention Residuals only: the final norm's read over depth, its row (`final_read`, what the final
    # norm reads) and its weights; in the JSON only then
    final_read: Row | None = None
    final_depth: DepthRead | None = None

    def stage(self, block: int | None, name: str, position: int | None = None) -> torch.Tensor:
        """A stage of the traced pass by the chapter's names, as the model computed it: block 0's
        "residual1", "attention_weights", ..., or with block None the model's "input", "final_norm"
        and "logits"; the row at the traced position, or at `position` (`whole` gives them all).
        For attention_weights, that position's weights in every head over the keys it sees (0..p):
        [H, p + 1], as `attention_weights` in the JSON; for a rope model's rotated_query and
        rotated_key, that position's row in every head: [H, d] (the keys' [K, d], K = n_kv_head);
        for depth_weights1, depth_weights2 and final_depth_weights (Attention Residuals), that
        position's weights over its sources: [S]."""
        p = self.position if position is None else position
        whole = self.whole(block, name)
        if name == stages.ATTENTION_WEIGHTS:
            return whole[:, p, : p + 1]
        return whole[:, p] if name in stages.ROTATED else whole[p]

    def whole(self, block: int | None, name: str) -> torch.Tensor:
        """A stage at every position: [T, C] for a row stage, [H, T, T] for attention_weights,
        [H, T, d] for rotated_query and heads, [K, T, d] for rotated_key (K = n_kv_head)."""
        key = name if block is None else stages.block_name(block, name)
        if key not in self.recorded:
            scope = stages.block_prefix(block) + "." if block is not None else ""
            known = ", ".join(k for k in self.recorded if k.startswith(scope))
            raise MinigptError(
                "the trace has no stage {key!r}; it recorded: {known}", key=key, known=known or "no such block"
            )
        return self.recorded[key][0]

    def as_dict(self) -> dict[str, Any]:
        bare = replace(
            self,
            recorded={},
            probabilities=[],
            attribution=None,
            blocks=[replace(b, full_attention=[]) for b in self.blocks],
        )
        out = plain(bare)
        del out["probabilities"], out["recorded"], out["attribution"]
        if self.gradient is None:
            del out["gradient"]
        elif self.gradient.final_read is None:  # not Attention Residuals: no final read to differentiate
            del out["gradient"]["final_read"]
        if not self.all_positions:
            del out["all_positions"]
        if not self.input.replaced:
            del out["input"]["replaced"]
        if not self.past_trained_length:
            del out["trained_length"], out["past_trained_length"]
        if self.attribution is not None:
            out["attribution"] = self.attribution.as_dict()
        if self.final_depth is None:  # not Attention Residuals: no reads over depth
            del out["final_read"], out["final_depth"]
        for block in out["blocks"]:
            del block["full_attention"]
            if not block["depth"]:
                del block["depth"]
            if block["rotated_shape"] is None:  # not a rope model: no rotated rows
                del block["rotated_query"], block["rotated_key"], block["rotated_shape"], block["rotated_key_shape"]
        if not self.interventions:
            del out["interventions"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


def plain(value: Any) -> Any:
    """What dataclasses.asdict makes of a trace, without its deep copy of every number one by one
    (most of the time of a GPT-2 trace's JSON): a list of numbers is copied whole."""
    if is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and isinstance(value[0], (int, float, str)):
            return list(value)
        return [plain(v) for v in value]
    return value


# ---------------------------------------------------------------- the trace, from the recorder


def _ranked(tokenizer: TextTokenizer, logits: torch.Tensor, top: int) -> list[Candidate]:
    """The `top` most likely tokens under softmax(logits); ties keep the lower id first."""
    logits = logits.double()
    probabilities = torch.softmax(logits, dim=-1)
    # A stable sort of only the tokens at least as likely as the top-th (ties included), which is
    # the head of a stable sort of all of them: GPT-2 has 50,257 to rank, once per block.
    least = torch.topk(probabilities, min(top, len(probabilities))).values[-1]
    contenders = torch.nonzero(probabilities >= least).squeeze(1)  # in id order
    ranked = torch.sort(probabilities[contenders], descending=True, stable=True).indices
    order = contenders[ranked][:top].tolist()
    return [Candidate(tokenizer.token_text(i), i, float(probabilities[i]), float(logits[i])) for i in order]


def trace_position(
    model: MiniGPT,
    tokenizer: TextTokenizer,
    ids: list[int],
    position: int | None = None,
    block: int | None = None,
    top: int = 5,
    interventions: Sequence[Intervention] = (),
    only_at_position: bool = False,
    grad: bool = False,
    target: int | Target | None = None,
    all_positions: bool = False,
) -> Trace:
    """Run the model once on `ids` with a recorder and collect what happened at one position;
    `interventions` change stages of that same pass (at every position, or at the traced one only),
    or the model itself (set-row, norm-over positions: a copy of it, weight_edits.py).
    `grad`: also the gradient of the loss of `target` (an id; default: the prompt's next token, at
    the last position the model's top prediction) at that position with respect to every stage's
    row, through the graph of this same pass (gradients.py). `all_positions`: also every row
    stage at every position (`Trace.all_positions`)."""
    check_ids(model, ids, grad)
    if top < 1:
        raise MinigptError("{top} {given} is too small; show at least 1 next-token candidate", given=top)
    p = resolve_position(position, len(ids))
    shown = resolve_blocks(block, len(model.blocks))
    top = min(top, model.vocab_size)
    changes = replacements(list(interventions), model, p, only_at_position)
    model = edited(model, interventions)
    recorder = recorded_pass(model, ids, changes, grad, interventions)
    gradient = None
    if grad:
        chosen = gradients.choose_target(target, ids, p, recorder[stages.LOGITS][0, p])
        gradient = gradients.differentiate(recorder, tokenizer, p, shown, chosen)
        recorder.detach()  # differentiated: the values alone from here on
    with torch.inference_mode():
        # The logit lens of every shown block in one pass over the head (GPT-2's is 154 MB), by the
        # model's own modules (norms and a linear map: the same in training mode).
        lens = model.head(model.final_norm(_lens_rows(model, recorder, shown, p)))
        readers = model_readers(model.architecture())
        blocks = [_block_entry(tokenizer, recorder, i, p, top, lens[k], readers) for k, i in enumerate(shown)]
    x = recorder[stages.INPUT]
    final = recorder[stages.FINAL_NORM]
    final_read = recorder.stages.get(stages.FINAL_READ)  # Attention Residuals: what the final norm read
    rows = model.position_rows(0, len(ids))  # a learned table's or the sinusoids; None: no row enters
    table = getattr(model, "position_table", None)
    table_shape = list(table.weight.shape) if table is not None else None
    if rows is not None and table is None:  # sinusoidal: a fixed table as long as the text read
        table_shape = [max(model.context, len(ids)), model.cfg.n_embd]
    return Trace(
        position=p,
        ids=list(ids),
        tokens=[tokenizer.token_text(i) for i in ids],
        model=model.architecture(),
        input=InputRows(
            token_row=model.token_table.weight[ids[p]].tolist(),
            position_row=rows[p].tolist() if rows is not None else None,
            row=x[0, p].tolist(),
            shape=list(x.shape),
            token_table_shape=list(model.token_table.weight.shape),
            position_table_shape=table_shape,
            replaced=any(isinstance(item, SetInput) for item in interventions),
        ),
        blocks=blocks,
        final_norm=Row(final[0, p].tolist(), list(final.shape)),
        next_tokens=_ranked(tokenizer, recorder[stages.LOGITS][0, p], top),
        interventions=[str(item) for item in interventions],
        probabilities=torch.softmax(recorder[stages.LOGITS][0, p].double(), dim=-1).tolist(),
        recorded=dict(recorder.stages),
        gradient=gradient,
        all_positions=_every_position(model, ids, recorder, shown) if all_positions else {},
        trained_length=model.context,
        past_trained_length=past_trained_length(model, len(ids), p),
        final_read=None if final_read is None else Row(final_read[0, p].tolist(), list(final_read.shape)),
        final_depth=_depth_read(readers[-1], recorder, p) if readers else None,
    )


def _lens_rows(model: MiniGPT, recorder: Recorder, shown: list[int], p: int) -> torch.Tensor:
    """What the final norm would read at position `p` if the model stopped after each shown block,
    [len(shown), C]: that block's output row; with Attention Residuals (no output row) the final
    norm's own read over depth (`final_depth`) of the embedding and the sublayer outputs the pass
    recorded up to that block, summed into groups as the model sums them (depth.py's Depth)."""
    if model.cfg.residual_kind is not Residual.ATTENTION:
        return torch.stack([recorder[stages.block_name(i, stages.OUTPUT)][0, p] for i in shown])
    depth = model.depth_from(recorder[stages.INPUT][:, p : p + 1])
    rows = {}
    for i in range(max(shown) + 1):
        for stage in (stages.ATTENTION, stages.FFN):
            name = stages.block_name(i, stage)
            if name in recorder.stages:  # no FFN ([model] ffn_hidden = 0): the attention alone
                depth = depth.add(recorder[name][:, p : p + 1])
        if i in shown:
            rows[i] = model.final_depth(depth)[0, 0]
    return torch.stack([rows[i] for i in shown])


def _depth_read(reader: Reader, recorder: Recorder, p: int) -> DepthRead:
    """A read over depth's weights at position `p`, with what they weigh."""
    weights = recorder[reader.weights]  # [1, T, S]
    row = weights[0, p].tolist()
    return DepthRead(
        layer=reader.layer,
        reader=reader.reader,
        stage=reader.weights,
        sources=list(reader.sources),
        layers=[list(group) for group in reader.layers],
        weights=row,
        total=math.fsum(row),
        shape=list(weights.shape),
    )


def past_trained_length(model: MiniGPT, length: int, position: int) -> bool:
    """Whether what a pass of `length` tokens computes at `position` comes from past the length the
    model was trained at: the position itself lies past it, or (rope's dynamic scaling) every
    rotation depends on a text longer than it."""
    if position >= model.context:
        return True
    rotary = model.positions
    return length > model.context and isinstance(rotary, Rotary) and rotary.length_dependent


def _every_position(model: MiniGPT, ids: list[int], recorder: Recorder, shown: list[int]) -> dict[str, list]:
    """Each row stage at every position: the table rows block 0's input adds, then the pass's
    recorded stages of the shown blocks (and what enters each: the output before it), not the
    attention weights (a [T, T] per head, not a row)."""
    out = {"token_rows": model.token_table.weight[ids].tolist()}
    rows = model.position_rows(0, len(ids))  # learned or sinusoidal
    if rows is not None:
        out["position_rows"] = rows.tolist()
    out[stages.INPUT] = recorder[stages.INPUT][0].tolist()
    # no output row enters a block: each sublayer reads its own mix
    depth = model.cfg.residual_kind is Residual.ATTENTION
    for i in shown:
        if i > 0 and i - 1 not in shown and not depth:  # what enters block i: the output of the block before it
            out[stages.block_name(i - 1, stages.OUTPUT)] = recorder[stages.block_name(i - 1, stages.OUTPUT)][0].tolist()
        for name, value in recorder.block(i).items():
            if name not in NOT_ROWS:
                out[stages.block_name(i, name)] = value[0].tolist()
    if depth:
        out[stages.FINAL_READ] = recorder[stages.FINAL_READ][0].tolist()
    out[stages.FINAL_NORM] = recorder[stages.FINAL_NORM][0].tolist()
    return out


# A block's recorded stages that are not rows of width C: the attention weights [H, T, T], the heads
# and rope's rotated rows (a row per head), the depth weights over S sources.
NOT_ROWS = (stages.ATTENTION_WEIGHTS, stages.HEADS, *stages.ROTATED, stages.DEPTH_WEIGHTS1, stages.DEPTH_WEIGHTS2)


def recorded_pass(
    model: MiniGPT,
    ids: list[int],
    changes: dict[str, Replacement],
    keep_graph: bool = False,
    interventions: Sequence[Intervention] = (),
) -> Recorder:
    """One pass of `ids` in eval mode with `changes` made, every stage recorded and the heads kept;
    `keep_graph`: each stage a node of the pass's autograd graph, for its gradient (Recorder).
    A residual add the changes gave unequal shapes (a broadcast update) refuses the pass: the
    model's own refusal (chapter 17.2), said in one line."""
    recorder = Recorder(model.cfg, kept_heads(changes, model), keep_graph)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(not keep_graph), torch.set_grad_enabled(keep_graph):
            model(torch.tensor([ids], dtype=torch.long, device=model.token_table.weight.device), recorder=recorder)
    except ResidualShapeError as refused:
        broadcast = [str(item) for item in interventions if isinstance(item, BroadcastUpdate)]
        if not broadcast:
            raise  # no intervention asked for unequal shapes: a bug, with its traceback
        raise MinigptError(
            "{broadcast_update} {what}: the block refused it (chapter 17.2): {reason}",
            what="; ".join(b.removeprefix("broadcast-update ") for b in broadcast),
            reason=str(refused),
        ) from None
    finally:
        model.train(was_training)
    return recorder


def kept_heads(changes: dict[str, Replacement], model: MiniGPT) -> dict[str, Replacement]:
    """`changes`, and each block's `heads` ([B, H, T, d], replaceable but not recorded) kept in the
    recorded stages as the pass continues with them (after any intervention's change): what each
    head writes through its slice of W_O, which the attribution reads."""
    kept = dict(changes)
    for i in range(len(model.blocks)):
        name = stages.block_name(i, stages.HEADS)
        kept[name] = _keep(name, changes.get(name))
    return kept


def _keep(name: str, change: Replacement | None) -> Replacement:
    def apply(value: torch.Tensor, recorded: dict[str, torch.Tensor]) -> torch.Tensor:
        value = value if change is None else change(value, recorded)
        recorded[name] = value.detach()
        return value

    return apply


def _block_entry(
    tokenizer: TextTokenizer,
    recorder: Recorder,
    i: int,
    p: int,
    top: int,
    lens_logits: torch.Tensor,
    readers: list[Reader] = (),
) -> BlockTrace:
    """Block `i` at position `p`; `readers`: every read over depth of an Attention Residuals model
    (depth_reads.py), of which the block's own are shown with it."""
    recorded = recorder.block(i)
    weights = recorded.pop(stages.ATTENTION_WEIGHTS)  # [B, H, T, S]
    recorded.pop(stages.HEADS)  # kept for the attribution, not a row of the trace
    # rope: the rotated queries and keys [B, H, T, d], a row per head, not a row of the stream
    query, key = (recorded.pop(name, None) for name in stages.ROTATED)
    for name in (stages.DEPTH_WEIGHTS1, stages.DEPTH_WEIGHTS2):  # shown as the block's reads, below
        recorded.pop(name, None)
    prefix = stages.block_prefix(i) + "."
    depth = [_depth_read(reader, recorder, p) for reader in readers if reader.weights.startswith(prefix)]
    if i == 0:
        entering = recorder[stages.INPUT]
    else:  # Attention Residuals: no one row enters a block past the first
        entering = recorder.stages.get(stages.block_name(i - 1, stages.OUTPUT))
    return BlockTrace(
        index=i,
        input=None if entering is None else Row(entering[0, p].tolist(), list(entering.shape)),
        # in the order the block computed them (post-norm adds residual2)
        stages={name: value[0, p].tolist() for name, value in recorded.items()},
        shapes={name: list(value.shape) for name, value in recorded.items()},
        attention_weights=weights[0, :, p, : p + 1].tolist(),  # [head][key], the visible keys 0..p
        attention_shape=list(weights.shape),
        logit_lens=_ranked(tokenizer, lens_logits, top),
        full_attention=weights[0].tolist(),
        rotated_query=None if query is None else query[0, :, p].tolist(),
        rotated_key=None if key is None else key[0, :, p].tolist(),
        rotated_shape=None if query is None else list(query.shape),
        rotated_key_shape=None if key is None else list(key.shape),
        depth=depth,
    )
