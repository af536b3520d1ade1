"""Arithmetic estimates: a forward pass per token and per part (`minigpt info`), a training step's
(for choices made before it runs, such as which optimizer the `auto` recipe takes, and for the
benchmark's utilisation figures), and Muon's orthogonalisations.

    forward_counts             multiply-adds per token, by part, at T positions (counts.py's shape)
    training_flops_per_token   6 x the forward multiply-adds: the benchmark's estimate (nanoGPT's)
    orthogonalisation_flops    one Muon update of one matrix: Newton-Schulz iterations
    muon_share                 Muon's orthogonalisations over the step's own arithmetic

The count is nanoGPT's estimate_mfu (and Megatron-LM's, the one c21 quotes): every parameter a
token's row is multiplied by is one multiply-add (biases and gains counted alike; the two tables
are looked up, not multiplied, while the head multiplies even when it shares the token table), and
attention's two products with the keys and values are D per key, over all T keys (the causal mask
leaves about half of them unread: the count ignores it, as both do). Softmax, the activation and the
norms' own arithmetic are not counted. One multiply-add is 2 FLOPs; the backward pass costs about
twice the forward, so training is 3 x 2 = 6 FLOPs per multiply-add.

Attention Residuals (`[model] residual = "attention"`) reads over depth before every sublayer and
the final norm: a read of S sources is S·D for its pseudo-query against the S keys (as Q Kᵀ is
counted) and S·D for the weighted sum of the sources (as the attention's weighted sum is), one
part, `depth.reads`, summed over every read (S grows with depth, so no block costs what another
does). The keys' RMS norm and the softmax are elementwise: not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ModelConfig
from ..counts import Counts, Formula, Part, depth_reads, grouped_attention, parameter_counts, sizes_of

if TYPE_CHECKING:
    from .gpt import MiniGPT

NEWTON_SCHULZ_STEPS = 5  # torch.optim.Muon's default, which optimizers.py keeps
TRAINING_FLOPS = 6  # per forward multiply-add: 2 FLOPs each, forward and backward (twice the forward)


def forward_counts(cfg: ModelConfig, vocab_size: int, positions: int | None = None) -> Counts:
    """Multiply-adds per token of one forward pass over `positions` (T; default: the context), by part,
    in the order a token's row meets them. The projections cost what their parameters count; the
    attention table (Q Kᵀ, T·D: every head's D/H coordinates against T keys; n_head T·d with heads of
    width d that do not add up to D, or grouped-query attention) and its weighted sum of the values
    (the same) are the terms that grow with T."""
    params = parameter_counts(cfg, vocab_size)
    by_name = {p.name: p for p in params.block}
    norm = [by_name["norm1"]] if "norm1" in by_name else []
    block = [*norm]
    for name, shown in (("W_Q", "Q"), ("W_K", "K"), ("W_V", "V")):
        block.append(Part(f"attention.{shown}", by_name[f"attention.{name}"].formula, f"x {name}"))
    # each query head's d coordinates against T keys: T·D while the heads split the width (n_head d = D),
    # else n_head T·d (grouped-query attention reads a shared key as often as a key of its own)
    table = Formula.of(Td=cfg.n_head) if grouped_attention(cfg) else Formula.of(TD=1)
    block.append(Part("attention.scores", table, "Q Kᵀ"))
    block.append(Part("attention.weighted_sum", table, "weights x V"))
    block.append(Part("attention.W_O", by_name["attention.W_O"].formula, "x W_O"))
    block += [by_name[name] for name in ("norm2", "ffn.W1", "ffn.W2") if name in by_name]
    reads = depth_reads(cfg)
    says = f"{len(reads)} reads of {sum(reads)} sources in all, 2D a source"
    after = [Part("depth.reads", Formula.of(D=2 * sum(reads)), says)] if reads else []
    # the final read's query is in depth.reads: it meets S keys, not one row
    after += [Part(p.name, p.formula, p.says) for p in params.after if p.name not in ("head", "final_depth.query")]
    after.append(Part("head", Formula.of(VD=1), "x token_table" if cfg.tie_embeddings else ""))
    return Counts(sizes_of(cfg, vocab_size, positions), (), tuple(block), cfg.n_layer, tuple(after))


def training_flops_per_token(model: MiniGPT, positions: int | None = None) -> float:
    """6 x the forward multiply-adds per token (`forward_counts`) at the model's context: 6 x every
    parameter but the two tables' rows, the head included even when it shares the token table, plus
    attention's 12 x layers x width x context: the estimate nanoGPT's estimate_mfu uses."""
    return TRAINING_FLOPS * forward_counts(model.cfg, model.vocab_size, positions).total


def orthogonalisation_flops(rows: int, columns: int, steps: int = NEWTON_SCHULZ_STEPS) -> float:
    """Each Newton-Schulz iteration on the wide side (r <= c): the gram matrix X Xt (2 r r c), its
    square (2 r r r) and the polynomial applied to X (2 r r c)."""
    r, c = sorted((rows, columns))
    return steps * (4 * r * r * c + 2 * r**3)


def muon_share(model: MiniGPT, tokens_per_step: int) -> float:
    """Muon's orthogonalisation of every block matrix, once a step whatever the batch, over the
    forward and backward arithmetic of the step's tokens: the cost Muon adds per step."""
    ortho = sum(orthogonalisation_flops(*p.shape) for p in model.blocks.parameters() if p.dim() == 2)
    return ortho / (training_flops_per_token(model) * tokens_per_step)
