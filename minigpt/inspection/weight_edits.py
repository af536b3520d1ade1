"""Interventions that change the model itself, not a stage of its pass: carried out on a copy of it,
never on the run's own weights (nor, so, on its checkpoint).

    SetRow(table, row, vector)   a row of the token table (a token's text or #ID, resolved to its id
                                 by Run.trace, which has the tokenizer) or of the position table (a
                                 position) set to the given numbers (chapter 17.8, exercise 1)
    NormOverPositions()          every block's norm1 and norm2 replaced by PositionNorm: the same gain
                                 and bias, but its statistics over the positions instead of the
                                 coordinates, the wrong axis of chapter 17.3 (exercise 3), for watching
                                 a later token change an earlier row through the causal mask

The copy shares every parameter it does not change with the model (no second copy of a GPT-2's
weights to set one row): only an edited table is copied. The forward pass that runs it is the
model's own (gpt.py); PositionNorm exists only here, so a model that trains never has it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..errors import MinigptError
from ..model.gpt import MiniGPT
from .interventions import MODEL_EDITS, Intervention, NormOverPositions, SetRow


def edited(model: MiniGPT, interventions: Sequence[Intervention]) -> MiniGPT:
    """`model` itself when no intervention edits it; else a copy with every edit made (checked first,
    each refusal one line), sharing the parameters it leaves alone."""
    edits = [item for item in interventions if isinstance(item, MODEL_EDITS)]
    if not edits:
        return model
    rows = [(item, *_resolved(item, model)) for item in edits if isinstance(item, SetRow)]
    if any(isinstance(item, NormOverPositions) for item in edits):
        _check_norm(model)
    changed = {f"{table}.weight" for _, table, _ in rows}
    shared = {id(p): p for name, p in model.named_parameters() if name not in changed}
    copied = copy.deepcopy(model, memo=shared)
    with torch.no_grad():
        for item, table, index in rows:
            weight = getattr(copied, table).weight
            weight[index] = torch.tensor(item.vector, dtype=weight.dtype, device=weight.device)
    if any(isinstance(item, NormOverPositions) for item in edits):
        for block in copied.blocks:
            block.norm1 = PositionNorm(block.norm1, model.cfg.norm, model.cfg.norm_eps)
            if hasattr(block, "norm2"):
                block.norm2 = PositionNorm(block.norm2, model.cfg.norm, model.cfg.norm_eps)
    return copied


def _resolved(item: SetRow, model: MiniGPT) -> tuple[str, int]:
    """(table, row index) of a SetRow on this model, its numbers checked."""
    where = item.where
    width = model.cfg.n_embd
    if len(item.vector) != width:
        raise MinigptError(
            "{where}: {n_vector} numbers but the model's width is {width}; give exactly {width} comma-separated "
            "numbers",
            where=where,
            n_vector=len(item.vector),
            width=width,
        )
    if not all(math.isfinite(v) for v in item.vector):
        raise MinigptError("{where}: every number must be finite", where=where)
    if item.table == "token_table":
        if item.index is None:  # a token's text needs the run's tokenizer: Run.trace resolves it
            raise ValueError(f"{item}: the token row is not resolved to an id (SetRow.index)")
        return item.table, item.index
    if getattr(model, "position_table", None) is None:
        fixed = " (its sinusoids are fixed, not learned weights)" if model.cfg.positions == "sinusoidal" else ""
        raise MinigptError(
            "{where}: this model has no position table ([model] positions = {positions!r}){fixed}; set a row of "
            "token_table",
            where=where,
            positions=model.cfg.positions,
            fixed=fixed,
        )
    rows = model.position_table.weight.shape[0]
    try:
        index = int(item.row)
    except ValueError:
        index = -1
    if not 0 <= index < rows:
        raise MinigptError(
            "{where}: position_table has rows 0..{last} ([model] context = {rows}); {row!r} is not one of them",
            where=where,
            last=rows - 1,
            rows=rows,
            row=item.row,
        )
    return item.table, index


def _check_norm(model: MiniGPT) -> None:
    if model.cfg.norm == "none":
        raise MinigptError(
            '{norm_over} positions: this model has no norm ([model] norm = "none") to average over the '
            "positions; use a run with a norm"
        )


class PositionNorm(nn.Module):
    """A norm over the wrong axis, on purpose: for each coordinate c, statistics over the positions
    t of one example, then `norm`'s own gain and bias:

        LayerNorm:  (x[t, c] - mean_t x[., c]) / sqrt(var_t x[., c] + eps) * gamma_c + beta_c
        RMSNorm:    x[t, c] / sqrt(mean_t x[., c]^2 + eps) * g_c

    so every row depends on every position's, a later token's included, whatever the attention
    mask says (chapter 17.3: "Mixing future positions into these statistics could leak
    information even if attention were correctly masked")."""

    def __init__(self, norm: nn.Module, kind: str, eps: float):
        super().__init__()
        self.kind, self.eps = kind, getattr(norm, "eps", eps)
        self.weight, self.bias = getattr(norm, "weight", None), getattr(norm, "bias", None)  # shared, not copied

    def forward(self, x: Tensor) -> Tensor:  # x: [B, T, C]; statistics over T (dim 1)
        if self.kind == "layernorm":
            mean = x.mean(1, keepdim=True)
            normed = (x - mean) / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + self.eps)
        else:
            normed = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)
        if self.weight is not None:
            normed = normed * self.weight
        return normed + self.bias if self.bias is not None else normed
