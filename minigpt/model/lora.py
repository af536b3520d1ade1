"""LoRA (Hu et al., 2021): fine-tune a trained model by a low-rank update of chosen matrices, the
model's own weights frozen.

    W' = W + (alpha / r) B A          A: [r, in], B: [out, r]; x W'^T = x W^T + (alpha / r) (x A^T) B^T

A targeted nn.Linear becomes a `LoRALinear`: the same module (same weight and bias Parameters,
same state-dict names) with `lora_A` and `lora_B` beside them, the layout PEFT uses for GPT-2's
matrices (lora_A.weight [r, in], lora_B.weight [out, r]). A is drawn as nn.Linear's default
(Kaiming uniform), B starts at zero, so the adapted model starts as exactly the base: each
targeted output is the base's plus an exact 0. Only the adapters train: every other parameter is
frozen (no gradient, no optimizer state), and a checkpoint stores the adapters alone.

Reading commands never see a LoRALinear: `merged` writes W + (alpha / r) B A into a plain copy of
the model (in float64, rounded once), which traces, samples and exports as any other.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import lora_targets
from ..errors import MinigptError

ADAPTER_NAMES = ("lora_A", "lora_B")


class LoRALinear(nn.Linear):
    """An nn.Linear with a trainable low-rank update: y = x W^T + b + (alpha / r) dropout(x) A^T B^T."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        nn.Module.__init__(self)  # the base's own Parameters, not fresh ones
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scale, self.dropout = rank, alpha, alpha / rank, dropout
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's (and PEFT's) draw for A

    def forward(self, x: Tensor) -> Tensor:
        update = F.dropout(x, self.dropout) if self.training and self.dropout > 0 else x
        return F.linear(x, self.weight, self.bias) + (update @ self.lora_A.T @ self.lora_B.T) * self.scale

    def delta(self) -> Tensor:
        """(alpha / r) B A as [out, in], in float64."""
        return self.lora_B.detach().double() @ self.lora_A.detach().double() * self.scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}"


def targeted(model: nn.Module, targets: str) -> list[tuple[str, nn.Linear]]:
    """(name, module) of every matrix `[train] lora_targets` names, in each block, in model order
    (a block without an FFN has no W1 and W2 to adapt)."""
    wanted = set(lora_targets(targets))
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.startswith("blocks.") and name.rsplit(".", 1)[-1] in wanted:
            found.append((name, module))
    return found


def settings_of(train, base: dict) -> dict:
    """What a LoRA checkpoint records of its adapters: the [train] keys that shape them, and the
    checkpoint they adapt (`base`: an Origin's fields)."""
    return {
        "rank": train.lora_rank,
        "alpha": train.lora_alpha,
        "dropout": train.lora_dropout,
        "targets": train.lora_targets,
        "base": dict(base),
    }


def attach(model: nn.Module, settings: dict) -> list[str]:
    """Freeze every parameter of `model` and put an adapter on each matrix `settings` targets (A
    drawn from torch's global generator, as the model's own init is); the model keeps `settings`
    as `lora_settings`, for its checkpoints. Returns the adapted matrices' names."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    names = []
    for name, linear in targeted(model, settings["targets"]):
        parent_name, _, child = name.rpartition(".")
        adapter = LoRALinear(linear, settings["rank"], settings["alpha"], settings["dropout"])
        setattr(model.get_submodule(parent_name), child, adapter)
        names.append(name)
    model.lora_settings = settings
    return names


def load_adapters(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Set the adapters of `model` from a LoRA checkpoint's tensors, which must be exactly them."""
    expected = adapter_state(model)
    if set(state) != set(expected):
        raise MinigptError(
            "the checkpoint's LoRA adapters ({given}) are not this model's ({expected}); the run folder is "
            "damaged: train the LoRA run again",
            given=len(state),
            expected=len(expected),
        )
    model.load_state_dict(state, strict=False)


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' tensors by state-dict name (`blocks.0.attention.qkv.lora_A`, ...): what a LoRA
    checkpoint stores instead of the model."""
    return {name: t for name, t in model.state_dict().items() if name.rsplit(".", 1)[-1] in ADAPTER_NAMES}


def merged(model: nn.Module) -> nn.Module:
    """A copy of `model` with every LoRALinear replaced by a plain nn.Linear holding W + (alpha/r) B A
    (computed in float64, rounded once to the model's dtype), gradients on as for any model read."""
    plain = copy.deepcopy(model)
    for name, module in list(plain.named_modules()):
        if isinstance(module, LoRALinear):
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear = linear.to(dtype=module.weight.dtype, device=module.weight.device)
            with torch.no_grad():
                linear.weight.copy_((module.weight.detach().double() + module.delta()).to(module.weight.dtype))
                if module.bias is not None:
                    linear.bias.copy_(module.bias.detach())
            parent_name, _, child = name.rpartition(".")
            setattr(plain.get_submodule(parent_name), child, linear)
    for parameter in plain.parameters():
        parameter.requires_grad_(True)
    return plain
