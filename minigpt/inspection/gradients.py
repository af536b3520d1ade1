"""The gradient a trace shows: of the loss of the traced position's next token with respect to every
stage's row at that position, through the very pass the trace records (a `Recorder` with
`keep_graph`: each stage a node of that pass's graph), never a second pass.

    loss = -log softmax(logits[p])[target]                 cross-entropy, nats, in the model's dtype
    d loss / d row   for input, each block's stages, final_norm, at position p

The target is the prompt's own next token (ids[p + 1]); at the prompt's last position, which has
none, the model's top prediction there (ties: the lower id), and the trace says so; or the token
asked for. The gradient of a stage is what a change of that stage alone does to the loss, a change
the rest of the pass then carries (`input` includes the skip connections around every block; with
`norm = "none"`, `norm1` is read by attention alone). This is the lesson's question ("without
residual connections, how much of the gradient reaches the bottom?") answered on a real model: the
norm at block 0's input beside the norm at the last block's output.

With `[model] residual = "attention"` (Attention Residuals) there is no stream between blocks: the
block's own reads (`read1`, `read2`) have their gradients like any stage, what enters block 0 is the
embedding (`input`, which every later read reads too), no one row enters a later block (its input
is None, as in the trace), and the top of the stack is `final_read`, the final norm's input
(`Gradient.final_read`). The depth weights are not rows of the stream (one weight per source), so,
as in the trace's rows, they have no gradient here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import Residual
from ..model import stages
from ..model.recorder import Recorder
from ..text.tokenizer import TextTokenizer

# where the target came from
PROMPT = "prompt"  # the prompt's own next token
GIVEN = "given"  # the token asked for
PREDICTION = "prediction"  # the model's top next token (at the prompt's last position, none is given)


@dataclass(frozen=True)
class Target:
    """The token whose loss is differentiated, and where it came from (PROMPT, GIVEN or PREDICTION)."""

    id: int
    source: str


def choose_target(target: int | Target | None, ids: list[int], position: int, logits: torch.Tensor) -> Target:
    """`target` as a Target: an id is the token asked for; None is the prompt's next token, or at
    the last position the top of `logits` (the traced position's row; argmax keeps the lower id)."""
    if isinstance(target, Target):
        return target
    if target is not None:
        return Target(target, GIVEN)
    if position + 1 < len(ids):
        return Target(ids[position + 1], PROMPT)
    return Target(int(torch.argmax(logits)), PREDICTION)


@dataclass
class StageGradient:
    """d loss / d row at the traced position, and its Euclidean norm."""

    row: list[float]
    norm: float


@dataclass
class BlockGradient:
    index: int
    # what enters the block: `input` for block 0, else the previous block's output; None where no
    # one row does (Attention Residuals past block 0: each sublayer reads its own mix, read1, read2)
    input: StageGradient | None
    stages: dict[str, StageGradient]  # stage name -> gradient, in the order the block computed them


@dataclass
class Gradient:
    target: str  # the token's text
    target_id: int
    target_from: str  # PROMPT, GIVEN or PREDICTION
    loss: float  # -log p(target) at the traced position, nats
    input: StageGradient  # the model's input X = token row + position row
    blocks: list[BlockGradient]  # the shown blocks
    final_norm: StageGradient
    # residual = "attention": the final norm's read over depth, the top of the stack (None otherwise)
    final_read: StageGradient | None = None


def entering(cfg, block: int) -> str | None:
    """The stage that enters block `block`: `input` for block 0, else the block before's `output`;
    None with Attention Residuals past block 0, which pass no stream from block to block."""
    if block == 0:
        return stages.INPUT
    if cfg.residual_kind is Residual.ATTENTION:
        return None
    return stages.block_name(block - 1, stages.OUTPUT)


def differentiate(
    recorder: Recorder, tokenizer: TextTokenizer, position: int, shown: list[int], target: Target
) -> Gradient:
    """The gradient of the target's loss at `position` with respect to every recorded row stage, from
    the graph `recorder` (keep_graph) kept of its pass; `shown`: the blocks to report."""
    names = [name for name in recorder.stages if _is_row(name)]
    with torch.inference_mode(False), torch.enable_grad():  # the loss is a node of the same graph
        logits = recorder[stages.LOGITS][0, position]
        loss = F.cross_entropy(logits.unsqueeze(0), torch.tensor([target.id], device=logits.device))
        found = torch.autograd.grad(loss, [recorder[name] for name in names], allow_unused=True)
    rows = {name: _at(recorder[name], grad, position) for name, grad in zip(names, found)}
    blocks = []
    for i in shown:
        head = stages.block_prefix(i) + "."
        inside = {name[len(head) :]: row for name, row in rows.items() if name.startswith(head)}
        name = entering(recorder.cfg, i)
        blocks.append(BlockGradient(i, None if name is None else rows[name], inside))
    return Gradient(
        target=tokenizer.token_text(target.id),
        target_id=target.id,
        target_from=target.source,
        loss=float(loss.detach()),
        input=rows[stages.INPUT],
        blocks=blocks,
        final_norm=rows[stages.FINAL_NORM],
        final_read=rows.get(stages.FINAL_READ),
    )


def _is_row(name: str) -> bool:
    """A stage whose rows are the trace's: not the attention weights, the heads, rope's rotated
    queries and keys (a row per head), the depth weights (Attention Residuals: a weight per source)
    or the logits."""
    last = name.rsplit(".", 1)[-1]
    return last not in (stages.ATTENTION_WEIGHTS, stages.HEADS, *stages.ROTATED, *DEPTH_WEIGHTS, stages.LOGITS)


DEPTH_WEIGHTS = (stages.DEPTH_WEIGHTS1, stages.DEPTH_WEIGHTS2, stages.FINAL_DEPTH_WEIGHTS)


def _at(value: torch.Tensor, grad: torch.Tensor | None, position: int) -> StageGradient:
    """The gradient's row at `position` (a stage the loss never reads has none: zero)."""
    row = torch.zeros_like(value[0, position]) if grad is None else grad[0, position]
    return StageGradient(row.tolist(), float(torch.linalg.vector_norm(row.double())))
