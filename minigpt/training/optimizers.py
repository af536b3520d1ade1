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

from ..device import native_bfloat16
from ..model.flops import muon_share
from ..model.gpt import MiniGPT
from ..torch_private import muon_lr

# optimizer = "auto" takes Muon while its orthogonalisations cost less than this share of the step's
# forward and backward arithmetic: where they cost more, AdamW's cheaper steps reach a given loss
# sooner in wall time (docs/guide/performance.md has the measurements this rests on).
MUON_MAX_SHARE = 0.5


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon with the matrices of one shape stepped together: their momentum buffers
    live in one stacked tensor (each parameter's state is a view of its row, so the state dict is
    torch.optim.Muon's and checkpoints load into either), and each Newton-Schulz iteration is one
    batched matmul over the stack instead of one small matmul per matrix. A model of N blocks has
    four shapes (qkv, out, W1, W2), so a step runs four batched orthogonalisations, not 4N, and
    Python's per-matrix work goes with them. Same algorithm and coefficients; the results equal
    torch.optim.Muon's within bf16 rounding (tests/test_muon.py), since a batched kernel may sum in
    another order than one matrix at a time.

    `ns_dtype`: the precision of the Newton-Schulz iterations. torch.optim.Muon always runs them in
    bfloat16, which is fast where bfloat16 matmuls are native (AVX-512 BF16, AMX, CUDA) but emulated
    elsewhere: on a 2-core AVX2 CPU a 512x512 bfloat16 matmul ran at 1.2 GFLOP/s against float32's
    81, and the default recipe trained 6x slower with Muon than with AdamW. By default (None) they
    run in bfloat16 where it is native on the parameters' device and they are float32, and otherwise
    in the parameters' own dtype: a float64 teaching run then steps the same on every machine."""

    def __init__(self, *args: Any, ns_dtype: torch.dtype | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if ns_dtype is None:
            first = next((p for g in self.param_groups for p in g["params"]), None)
            device, dtype = (first.device, first.dtype) if first is not None else (torch.device("cpu"), torch.float32)
            lowered = dtype == torch.float32 and native_bfloat16(str(device))
            ns_dtype = torch.bfloat16 if lowered else dtype
        self.ns_dtype = ns_dtype
        # (group index, rows, columns) -> the stack last made for that shape: the state's buffers
        # are its rows until a checkpoint is loaded or a matrix misses its gradient for a step
        self._momentum_stacks: dict[tuple[int, int, int], torch.Tensor] = {}

    def _stacks(self, index: int, group: dict) -> list[tuple[list[torch.Tensor], torch.Tensor, bool]]:
        """(parameters, stacked momentum buffer, tall) per shape of the group's matrices with
        gradients; a tall matrix is orthogonalised transposed, as Newton-Schulz works on the wide
        side."""
        by_shape: dict[tuple[int, int], list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.grad is not None:
                by_shape.setdefault((p.shape[0], p.shape[1]), []).append(p)
        stacks = []
        for (rows, columns), params in by_shape.items():
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            stacked = self._momentum_stacks.get((index, rows, columns))
            shared = stacked is not None and stacked.shape[0] == len(params)
            shared = shared and all(b is not None and b.data_ptr() == stacked[i].data_ptr() for i, b in enumerate(bufs))
            if not shared:
                # First step, or state loaded from a checkpoint (one tensor per parameter): stack it.
                stacked = torch.stack(
                    [b if b is not None else torch.zeros_like(p) for b, p in zip(bufs, params, strict=True)]
                )
                for i, p in enumerate(params):
                    self.state[p]["momentum_buffer"] = stacked[i]
                self._momentum_stacks[(index, rows, columns)] = stacked
            stacks.append((params, stacked, rows > columns))
        return stacks

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            lr, momentum, eps = float(group["lr"]), group["momentum"], group["eps"]
            for params, buf, tall in self._stacks(index, group):
                grads = torch.stack([p.grad for p in params])
                buf.lerp_(grads, 1 - momentum)
                update = grads.lerp_(buf, momentum) if group["nesterov"] else buf
                x = orthogonalised(update.to(self.ns_dtype), tall, group["ns_coefficients"], group["ns_steps"], eps)
                adjusted = muon_lr(lr, group["adjust_lr_fn"], params[0].shape)
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
                torch._foreach_add_(params, list(x.unbind(0)), alpha=-adjusted)
        return loss


def orthogonalised(x: torch.Tensor, tall: bool, coefficients, steps: int, eps: float = 1e-7) -> torch.Tensor:
    """A stack of updates [n, rows, columns] orthogonalised by `steps` Newton-Schulz iterations with
    torch.optim.Muon's quintic `coefficients` (a tall stack transposed first, so that the Gram
    matrix is the small side's). Also what `auto` times (measured.py): the cost Muon adds per step."""
    a, b, c = coefficients
    if tall:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


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


def chosen_optimizer(model: MiniGPT, cfg, row_tokens: int | None = None) -> tuple[str, str | None]:
    """`[train] optimizer` with `auto` settled: (adamw or muon, a note saying why, for auto). The
    choice depends on the config and the data alone (the global batch; `row_tokens`, the tokens a
    row of it reads: a window of `context`, or an example's), so every rank and every resume makes
    it the same."""
    if cfg.optimizer != "auto":
        return cfg.optimizer, None
    if cfg.lora_rank:  # rank-r factors: nothing for Muon to orthogonalise
        return "adamw", 'optimizer = "auto": adamw for the LoRA adapters (the model\'s own weights are frozen)'
    tokens = cfg.batch_size * cfg.grad_accum * (row_tokens or model.context)
    share = muon_share(model, tokens)
    name = "muon" if share < MUON_MAX_SHARE else "adamw"
    return name, (
        f'optimizer = "auto": {name} (Muon\'s orthogonalisation would be {share:.0%} of the arithmetic of a '
        f"{tokens:,}-token step; it is taken under {MUON_MAX_SHARE:.0%})"
    )


def make_optimizer(
    model: MiniGPT, cfg, row_tokens: int | None = None, name: str | None = None, ns_dtype: torch.dtype | None = None
) -> torch.optim.Optimizer | Optimizers:
    """`adamw`: AdamW for everything. `muon`: Muon (momentum, then each update orthogonalised by
    Newton-Schulz iterations) for the weight matrices inside the blocks, whose updates it keeps
    well spread across directions; AdamW for the two tables, the head, gains and biases. `auto`:
    `name` where training measured which (measured.py), else as `chosen_optimizer` says.
    `ns_dtype`: Muon's iterations' precision where it was measured (None: BatchedMuon's rule)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if (name or chosen_optimizer(model, cfg, row_tokens)[0]) == "adamw":
        return _adamw(params, cfg)
    in_blocks = {id(p) for name, p in model.blocks.named_parameters() if p.dim() == 2}
    matrices = [p for p in params if id(p) in in_blocks]
    muon = BatchedMuon(
        matrices,
        lr=cfg.muon_learning_rate,
        weight_decay=cfg.weight_decay,
        adjust_lr_fn="match_rms_adamw",
        ns_dtype=ns_dtype,
    )
    for group in muon.param_groups:
        group["peak_lr"] = cfg.muon_learning_rate  # follows the schedule in proportion
    return Optimizers(muon, _adamw([p for p in params if id(p) not in in_blocks], cfg))
