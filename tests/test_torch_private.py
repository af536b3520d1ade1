"""torch_private.py: the private parts of torch minigpt reads, each checked here so that a torch
which changes one fails by name, rather than as a BatchedMuon that drifts, a wrong precision
choice, or hooks sampling never sees: torch.optim._muon._adjust_lr against the formulas
torch.optim.Muon's docstring gives, the CPU flags, and nn.Module's hook dicts."""

from __future__ import annotations

import inspect
import math
import sys
import types

import pytest
import torch

from minigpt import torch_private

PRIVATE = f"torch.optim._muon._adjust_lr (torch {torch.__version__})"
# tall, wide, square, GPT-2 small's W1, a single row
SHAPES = [(48, 16), (16, 48), (16, 16), (3072, 768), (1, 5)]


def documented(lr: float, adjust_lr_fn: str | None, rows: int, columns: int) -> float:
    """torch.optim.Muon's docstring: "original" (the default, None) scales by sqrt(max(1, A/B)),
    Keller Jordan's; "match_rms_adamw" by 0.2 sqrt(max(A, B)), Moonshot's."""
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, columns))
    return lr * math.sqrt(max(1, rows / columns))


def test_the_private_function_takes_what_minigpt_passes():
    from torch.optim import _muon

    assert hasattr(_muon, "_adjust_lr"), f"{PRIVATE} is gone; minigpt.torch_private needs another way"
    try:
        inspect.signature(_muon._adjust_lr).bind(0.02, "original", torch.Size([4, 8]))
    except TypeError as exc:
        pytest.fail(f"{PRIVATE} no longer takes (lr, adjust_lr_fn, shape): {exc}; update minigpt.torch_private")


@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
def test_its_scale_is_the_one_torch_documents(adjust_lr_fn):
    for rows, columns in SHAPES:
        got = torch_private.muon_lr(0.02, adjust_lr_fn, torch.Size([rows, columns]))
        expected = documented(0.02, adjust_lr_fn, rows, columns)
        assert got == pytest.approx(expected, rel=1e-12), (
            f"{PRIVATE} scales a {rows}x{columns} matrix's lr 0.02 with adjust_lr_fn={adjust_lr_fn!r} to {got}, "
            f"not the documented {expected}; update minigpt.torch_private"
        )


def test_a_torch_without_it_is_refused_naming_it_and_the_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.optim._muon", types.ModuleType("torch.optim._muon"))
    with pytest.raises(ImportError) as refused:
        torch_private.muon_lr(0.02, None, torch.Size([4, 8]))
    assert f"torch.optim._muon._adjust_lr, which torch {torch.__version__} does not have" in str(refused.value)


def test_the_cpu_flags_say_whether_bfloat16_is_native():
    flags = torch_private.cpu_flags()
    assert flags is not None, f"{torch_private.CPU_CAPABILITY} is gone in torch {torch.__version__}"
    assert isinstance(flags.get("avx512_bf16"), bool) and isinstance(flags.get("amx_bf16"), bool), (
        f"{torch_private.CPU_CAPABILITY} no longer names avx512_bf16 and amx_bf16: {sorted(flags)}"
    )


def test_the_hook_dicts_are_where_minigpt_reads_them():
    for name in torch_private.MODULE_HOOKS:
        assert isinstance(getattr(torch.nn.Linear(2, 2), name, None), dict), f"torch.nn.Module.{name} is gone"
    for name in torch_private.GLOBAL_HOOKS:
        found = getattr(torch.nn.modules.module, name, None)
        assert isinstance(found, dict), f"torch.nn.modules.module.{name} is gone"
    layer = torch.nn.Linear(2, 2)
    handle = layer.register_forward_hook(lambda *a: None)
    assert torch_private.has_forward_hooks(layer)
    handle.remove()
    assert not torch_private.has_forward_hooks(layer) and not torch_private.has_global_forward_hooks()
