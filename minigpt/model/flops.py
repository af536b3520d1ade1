"""Arithmetic estimates of a training step: for choices made before it runs (which optimizer the
`auto` recipe takes) and for the benchmark's utilisation figures.

    training_flops_per_token   6 x the weights a token multiplies + attention (nanoGPT's estimate)
    orthogonalisation_flops    one Muon update of one matrix: Newton-Schulz iterations
    muon_share                 Muon's orthogonalisations over the step's own arithmetic
"""

from __future__ import annotations

from .gpt import MiniGPT

NEWTON_SCHULZ_STEPS = 5  # torch.optim.Muon's default, which optimizers.py keeps


def training_flops_per_token(model: MiniGPT) -> float:
    """6 x the weights every token multiplies (every parameter but the two tables' rows, the head
    included even when it shares the token table), plus attention's 12 x layers x width x context:
    the estimate nanoGPT's estimate_mfu uses."""
    cfg = model.cfg
    tables = model.token_table.weight.numel() + (
        model.position_table.weight.numel() if hasattr(model, "position_table") else 0
    )
    multiplied = model.num_parameters() - tables + (model.head.weight.numel() if cfg.tie_embeddings else 0)
    return 6 * multiplied + 12 * cfg.n_layer * cfg.n_embd * cfg.context


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
