"""A new model's first weights, by `[model] init`:

    gpt2     GPT-2's: N(0, 0.02) for every matrix and table, and the two projections that write into
             the residual stream (W_O and the FFN's W2) N(0, 0.02 / sqrt(2 n_layer)), so that the
             stream's variance does not grow with depth. The default; every run before `init`
             existed was initialised so.
    xavier   Glorot's uniform for every matrix, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)),
             W_Q, W_K and W_V each as its own matrix (as they are stored stacked, each slice is drawn
             with its own fans), and the tables N(0, 1/n_embd), as fairseq's Transformer and Xiong et
             al. 2020 initialise: the scheme whose gradients their Theorem 1 describes (pre-norm's
             last-layer gradient falling as 1/sqrt(L), post-norm's not).

Biases start at zero, norm gains at one and biases at zero, Attention Residuals' queries at zero, in
both. A tied head is the token table, initialised once, as a table.
"""

from __future__ import annotations

import math

from torch import nn

from ..config import ModelConfig


def initialise(model: nn.Module, cfg: ModelConfig) -> None:
    """Draw `model`'s matrices and tables as `cfg.init` says (the module's table)."""
    if cfg.init == "xavier":
        _xavier(model, cfg)
        return
    # GPT-2's, drawn in the modules' order (a tied head draws the table again): the same numbers
    # from the same seed as every run before `init` existed
    std = 0.02
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    for block in model.blocks:
        for proj in (block.attention.out, *((block.ffn.W2,) if hasattr(block, "ffn") else ())):
            nn.init.normal_(proj.weight, 0.0, std / math.sqrt(2 * cfg.n_layer))


def _xavier(model: nn.Module, cfg: ModelConfig) -> None:
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    shared = {id(t.weight) for t in tables}  # a tied head: the table's, drawn as a table
    for table in tables:
        nn.init.normal_(table.weight, 0.0, cfg.n_embd**-0.5)
    stacked = _stacked_matrices(model, cfg)
    for matrix in model.modules():
        if isinstance(matrix, nn.Linear) and id(matrix.weight) not in shared:
            for rows in stacked.get(id(matrix), [matrix.weight.data]):
                nn.init.xavier_uniform_(rows)
            if matrix.bias is not None:
                nn.init.zeros_(matrix.bias)


def _stacked_matrices(model: nn.Module, cfg: ModelConfig) -> dict[int, list]:
    """The Linears that store several matrices, by id, each as views of its weight: an attention's
    qkv (W_Q, W_K and W_V, each with its own fan-out) and SwiGLU's W1 (the gate and the value)."""
    stacked = {}
    for block in getattr(model, "blocks", ()):
        attention = getattr(block, "attention", None)
        qkv = getattr(attention, "qkv", None)
        if qkv is not None:
            d = attention.head_width
            sizes = (attention.n_head * d, attention.n_kv_head * d, attention.n_kv_head * d)
            stacked[id(qkv)] = list(qkv.weight.data.split(sizes, dim=0))
        W1 = getattr(getattr(block, "ffn", None), "W1", None)
        if W1 is not None and cfg.activation == "swiglu":
            stacked[id(W1)] = list(W1.weight.data.chunk(2, dim=0))
    return stacked
