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
trace_text.py lays the same data out as tables for a terminal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

from ..config import Residual
from ..errors import MinigptError, Phrase
from ..memory import check_memory, forward_bytes
from ..model import stages
from ..model.gpt import MiniGPT, check_token_ids
from ..model.layers import ResidualShapeError
from ..model.positions import Rotary
from ..model.recorder import Recorder, Replacement
from ..text.tokenizer import TextTokenizer
from . import gradients
from .depth_reads import Reader, model_readers
from .gradients import Gradient, Target
from .interventions import BroadcastUpdate, Intervention, PutBack, SetInput, put_back_name, read_patch, replacements
from .weight_edits import edited

# ---------------------------------------------------------------- input checks (one-line refusals)


GIVE_TOKENS = Phrase("pass {prompt} TEXT or {ids} 3,1,4")


def tokens_to_trace(tokenizer: TextTokenizer, prompt: str | None, ids: str | Sequence[int] | None) -> list[int]:
    """The ids a trace follows, from exactly one of a prompt or ids (a list, or "3,1,4")."""
    if (prompt is None) == (ids is None):
        raise MinigptError("give the tokens to trace with exactly one of {prompt} TEXT or {ids} 3,1,4")
    if ids is not None:
        ids = parse_ids(ids) if isinstance(ids, str) else list(ids)
        if not ids:
            raise MinigptError("{ids} is empty; give at least one token id, e.g. {ids} 3,1,4")
        return ids
    if prompt == "":
        raise MinigptError("the prompt is empty; trace needs at least one token: {give}", give=GIVE_TOKENS)
    return tokenizer.encode(prompt)  # a char tokenizer refuses characters it never saw


def parse_ids(text: str) -> list[int]:
    """`3,1,4` -> [3, 1, 4]; anything but comma-separated integers is refused."""
    if not text.strip():
        raise MinigptError("{ids} is empty; trace needs at least one token id, e.g. {ids} 3,1,4")
    ids = []
    for part in text.split(","):
        try:
            ids.append(int(part.strip()))
        except ValueError:
            raise MinigptError(
                "{ids} {text!r}: {strip!r} is not an integer; give comma-separated token ids, e.g. {ids} 3,1,4",
                text=text,
                strip=part.strip(),
            ) from None
    return ids


def check_ids(model: MiniGPT, ids: list[int], grad: bool = False) -> None:
    if not ids:
        raise MinigptError("the prompt has no tokens; trace needs at least one: {give}", give=GIVE_TOKENS)
    model.check_length(len(ids), "the prompt", "shorten the prompt")
    check_token_ids(ids, model.vocab_size)
    # A trace keeps every block's stages and attention weights: for GPT-2 at 1,024 tokens, gigabytes.
    # With its gradient, the graph's saved values and the gradients' rows too: about twice that.
    check_memory(
        forward_bytes(model.cfg, model.vocab_size, len(ids), recorded=True) * (2 if grad else 1),
        model.token_table.weight.device.type,
        f"tracing {len(ids)} tokens through this model (every block's stages kept)",
        "trace a shorter prompt",
    )


def resolve_position(position: int | None, length: int) -> int:
    """Default: the last token; negative counts from the end, as in Python."""
    if position is None:
        return length - 1
    index = position + length if position < 0 else position
    if not 0 <= index < length:
        raise MinigptError(
            "{position} {given} is beyond the prompt: it has {length} token(s), positions "
            "0..{value} (or -{length}..-1 from the end)",
            given=position,
            length=length,
            value=length - 1,
        )
    return index


def resolve_blocks(block: int | None, n_layer: int) -> list[int]:
    if block is None:
        return list(range(n_layer))
    index = block + n_layer if block < 0 else block
    if not 0 <= index < n_layer:
        raise MinigptError(
            "{block} {given} does not exist: the model has {n_layer} block(s), 0..{value} (or "
            "-{n_layer}..-1 from the end)",
            given=block,
            n_layer=n_layer,
            value=n_layer - 1,
        )
    return [index]


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
        out = _plain(bare)
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


def _plain(value: Any) -> Any:
    """What dataclasses.asdict makes of a trace, without its deep copy of every number one by one
    (most of the time of a GPT-2 trace's JSON): a list of numbers is copied whole."""
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and isinstance(value[0], (int, float, str)):
            return list(value)
        return [_plain(v) for v in value]
    return value


@dataclass
class StageChange:
    """One stage at the traced position, before and after the interventions. Two runs whose blocks
    compute in another order (pre-norm and post-norm) each have a stage the other has not
    (post-norm's residual2): None on the side that has none."""

    before: list[float] | None
    after: list[float] | None
    norm_before: float | None
    norm_after: float | None
    change: float | None  # the norm of after - before


@dataclass
class Comparison:
    """Two passes, stage by stage at one position: the unmodified and the modified pass of one model;
    or (`compared_run` set) another run's pass and this run's; or (`compared_ids`) another prompt's
    pass and this one's; the last two each with the same `interventions`."""

    interventions: list[str]
    before: Trace
    after: Trace
    stages: list[dict[str, StageChange]]  # per shown block: "input" and each stage
    kl_divergence: float  # KL(before || after) of the two next-token distributions, in nats
    run: str | None = None  # comparing runs: the run folder of `after`
    compared_run: str | None = None  # and of `before`; in the JSON only then
    compared_ids: list[int] | None = None  # comparing prompts: `before`'s ids; in the JSON only then

    def as_dict(self) -> dict[str, Any]:
        runs = {} if self.compared_run is None else {"run": self.run, "compared_run": self.compared_run}
        if self.compared_ids is not None:
            runs["compared_ids"] = self.compared_ids
        return {
            **runs,
            "interventions": self.interventions,
            "before": self.before.as_dict(),
            "after": self.after.as_dict(),
            "kl_divergence": self.kl_divergence,
            "stages": [{name: _plain(change) for name, change in block.items()} for block in self.stages],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


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
    recorder = _recorded(model, ids, changes, grad, interventions)
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
    table = getattr(model, "position_table", None)  # positions = "none": no table
    return Trace(
        position=p,
        ids=list(ids),
        tokens=[tokenizer.token_text(i) for i in ids],
        model=model.architecture(),
        input=InputRows(
            token_row=model.token_table.weight[ids[p]].tolist(),
            position_row=model.position_table.weight[p].tolist() if table is not None else None,
            row=x[0, p].tolist(),
            shape=list(x.shape),
            token_table_shape=list(model.token_table.weight.shape),
            position_table_shape=list(table.weight.shape) if table is not None else None,
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
    if getattr(model, "position_table", None) is not None:
        out["position_rows"] = model.position_table.weight[: len(ids)].tolist()
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


def _recorded(
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


def put_back(model: MiniGPT, tokenizer: TextTokenizer, patch: Any, length: int) -> PutBack:
    """Run.trace's `patch` ({"clean": TEXT or ids, "block", "stage", "position": P or None, "head":
    H or None}) for a traced prompt of `length` tokens, checked, as a PutBack of what the clean
    prompt's own unmodified pass computed there."""
    clean, block, stage, position, head = read_patch(patch, model, length)
    try:
        ids = tokenizer.encode(clean) if isinstance(clean, str) else list(clean)
        check_ids(model, ids)
    except MinigptError as exc:
        raise MinigptError("the patch's clean prompt: {reason}", reason=exc) from None
    if len(ids) != length:
        raise MinigptError(
            "the patch's clean prompt has {n_clean} tokens and the traced one {length}; a patch puts back "
            "one position's activation at the same position, so give prompts of the same token length "
            "(clean: {clean_tokens})",
            n_clean=len(ids),
            length=length,
            clean_tokens=" ".join(repr(tokenizer.token_text(i)) for i in ids),
        )
    values = _recorded(model, ids, {})[put_back_name(block, stage)]
    return PutBack(block, stage, position, head, values)


def compare(
    model: MiniGPT,
    tokenizer: TextTokenizer,
    ids: list[int],
    interventions: Sequence[Intervention],
    position: int | None = None,
    block: int | None = None,
    top: int = 5,
    only_at_position: bool = False,
    grad: bool = False,
    target: int | None = None,
    *,
    before_model: MiniGPT | None = None,
    before_ids: list[int] | None = None,
) -> Comparison:
    """The same prompt traced without and with `interventions`: each stage's row at the traced
    position before and after, their norms and the norm of the change, and how far the next-token
    distribution moved (KL divergence, nats). `grad`: each pass's gradient, both of the loss of
    one target (at the last position by default the `before` pass's top prediction).

    `before_model`: another model of `model`'s shape (no shape_differences; its blocks may compute
    in the other order, `norm_position`) and tokenizer, another run's: `before` is then its pass
    and `after` this model's, both with `interventions`, so the changes are what the other weights
    compute differently. `before_ids`: another prompt of as many tokens, traced before with the
    same `interventions`, so the changes are what the other tokens change at this position (a
    later token changes nothing at an earlier position, unless something reads across positions
    without the causal mask: norm-over positions)."""
    if before_ids is not None and len(before_ids) != len(ids):
        raise MinigptError(
            "{compare_ids} has {n_before} tokens and the traced prompt {n_ids}; the two passes are compared "
            "position by position, so give as many tokens",
            n_before=len(before_ids),
            n_ids=len(ids),
        )
    edits_before = () if before_model is None and before_ids is None else interventions
    before = trace_position(
        model if before_model is None else before_model,
        tokenizer,
        ids if before_ids is None else before_ids,
        position,
        block,
        top,
        edits_before,
        only_at_position,
        grad=grad,
        target=target,
    )
    chosen = None if before.gradient is None else Target(before.gradient.target_id, before.gradient.target_from)
    after = trace_position(
        model, tokenizer, ids, position, block, top, interventions, only_at_position, grad=grad, target=chosen
    )
    changes = []
    for first, second in zip(before.blocks, after.blocks):
        rows = {} if first.input is None and second.input is None else {stages.INPUT: (_row(first), _row(second))}
        rows.update({name: (first.stages.get(name), second.stages.get(name)) for name in _aligned(first, second)})
        changes.append({name: _change(a, b) for name, (a, b) in rows.items()})
    kl = math.fsum(
        0.0 if p == 0 else math.inf if q == 0 else p * (math.log(p) - math.log(q))
        for p, q in zip(before.probabilities, after.probabilities)
    )
    compared_ids = None if before_ids is None else list(before_ids)
    return Comparison([str(item) for item in interventions], before, after, changes, kl, compared_ids=compared_ids)


def _row(block: BlockTrace) -> list[float] | None:
    """What enters the block, where one row does."""
    return None if block.input is None else block.input.row


def _aligned(first: BlockTrace, second: BlockTrace) -> list[str]:
    """Both blocks' stage names, in the order `second` computes them, a stage only `first` has
    (post-norm's residual2 beside a pre-norm block) after the stage it follows there."""
    names = list(second.stages)
    previous = None
    for name in first.stages:
        if name not in names:
            names.insert(names.index(previous) + 1 if previous in names else len(names), name)
        previous = name
    return names


# What two models must share for their passes to be compared stage by stage: the stages recorded
# (blocks, the FFN's, their order, the position row) and each one's shape, the heads whose weights
# are listed, and the vocabulary the next-token distributions are over. Everything else in [model]
# (the norm's kind, the activation, biases, the residual, the tied head, the dtype) changes what is
# computed, not what is recorded: the comparison shows it. The order (`norm_position`) may differ
# where the reader of the comparison aligns the stages by name (a trace's text and JSON: post-norm's
# residual2 has no pre-norm row beside it); ORDER_KEYS are the keys that allows.
SHAPE_KEYS = (
    "n_layer",
    "n_head",
    "n_kv_head",
    "head_width",
    "n_embd",
    "ffn_hidden",
    "context",
    "vocab_size",
    "norm_position",
    "positions",
)
# What architecture() leaves out at its default: the key and value heads (n_head's), a head's width
# (n_embd / n_head's)
SHAPE_DEFAULTS = {"n_kv_head": lambda arch: arch["n_head"], "head_width": lambda arch: arch["n_embd"] // arch["n_head"]}
ORDER_KEYS = ("norm_position",)


def shape_differences(model: MiniGPT, other: MiniGPT, order_may_differ: bool = False) -> list[str]:
    """`key this != other` for each SHAPE_KEYS entry where the two models differ (none: comparable);
    `order_may_differ`: not the ORDER_KEYS (pre-norm beside post-norm: the same parameters)."""
    given = model.architecture().keys() | other.architecture().keys()
    this, that = (_with_defaults(m.architecture()) for m in (model, other))
    # n_kv_head and head_width only where either run sets one (a head's width follows n_embd otherwise)
    keys = [key for key in SHAPE_KEYS if not (order_may_differ and key in ORDER_KEYS)]
    keys = [key for key in keys if key not in SHAPE_DEFAULTS or key in given]
    # Attention Residuals records other stages (read1 and read2; no residual1 and no output): beside
    # a model with a residual stream, or without one, half the rows would have nothing to compare with
    if "attention" in (this["residual"], that["residual"]):
        keys.append("residual")
    return [f"{key} {this[key]!r} != {that[key]!r}" for key in keys if this[key] != that[key]]


def _with_defaults(arch: dict[str, Any]) -> dict[str, Any]:
    return {**{key: default(arch) for key, default in SHAPE_DEFAULTS.items()}, **arch}


def row_norm(row: list[float]) -> float:
    """A row's Euclidean norm, its squares summed exactly (math.fsum)."""
    return math.sqrt(math.fsum(v * v for v in row))


def _change(before: list[float] | None, after: list[float] | None) -> StageChange:
    if before is None or after is None:  # a stage one of two runs' blocks does not compute
        return StageChange(before, after, _norm(before), _norm(after), None)
    return StageChange(
        before, after, row_norm(before), row_norm(after), row_norm([b - a for a, b in zip(before, after)])
    )


def _norm(row: list[float] | None) -> float | None:
    return None if row is None else row_norm(row)


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
