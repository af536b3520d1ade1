"""The optimizers a run trains with, and their parameter groups.

    adamw   AdamW for every parameter
    muon    Muon (momentum, then each update orthogonalised by Newton-Schulz iterations) for the
            weight matrices inside the blocks; AdamW for the tables, the head, gains and biases

Decoupled weight decay applies to matrices only. Each parameter group that follows the schedule in
proportion to AdamW's learning rate carries its own `peak_lr` (Muon's); the trainer sets `lr` on
every group at each step.
"""

from __future__ import annotations

from typing import Any

import torch

from .model import MiniGPT


def _adamw(params: list, cfg) -> torch.optim.AdamW:
    """Weight decay on matrices (dim >= 2: linear weights, token and position tables) only;
    biases and norm gains are not pulled towards zero."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


class Optimizers:
    """Several optimizers stepped, cleared, saved and restored as one (Muon beside AdamW)."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)


def make_optimizer(model: MiniGPT, cfg) -> torch.optim.Optimizer | Optimizers:
    """`adamw`: AdamW for everything. `muon`: Muon (momentum, then each update orthogonalised by
    Newton-Schulz iterations) for the weight matrices inside the blocks, whose updates it keeps
    well spread across directions; AdamW for the two tables, the head, gains and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return _adamw(params, cfg)
    in_blocks = {id(p) for name, p in model.blocks.named_parameters() if p.dim() == 2}
    matrices = [p for p in params if id(p) in in_blocks]
    muon = torch.optim.Muon(
        matrices, lr=cfg.muon_learning_rate, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw"
    )
    for group in muon.param_groups:
        group["peak_lr"] = cfg.muon_learning_rate  # follows the schedule in proportion
    return Optimizers(muon, _adamw([p for p in params if id(p) not in in_blocks], cfg))
