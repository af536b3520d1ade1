"""torch_private.py: the one private function of torch minigpt calls, torch.optim._muon._adjust_lr,
checked against the formulas torch.optim.Muon's docstring gives, so that a torch which changes its
signature or its results fails here, by name, rather than as a BatchedMuon that drifts."""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
import types

import pytest
import torch

from minigpt.training import torch_private

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
    assert hasattr(torch_private, "_adjust_lr"), f"{PRIVATE} is gone; minigpt.training.torch_private needs another way"
    try:
        inspect.signature(torch_private._adjust_lr).bind(0.02, "original", torch.Size([4, 8]))
    except TypeError as exc:
        pytest.fail(
            f"{PRIVATE} no longer takes (lr, adjust_lr_fn, shape): {exc}; update minigpt.training.torch_private"
        )


@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
def test_its_scale_is_the_one_torch_documents(adjust_lr_fn):
    for rows, columns in SHAPES:
        got = torch_private.muon_lr(0.02, adjust_lr_fn, torch.Size([rows, columns]))
        expected = documented(0.02, adjust_lr_fn, rows, columns)
        assert got == pytest.approx(expected, rel=1e-12), (
            f"{PRIVATE} scales a {rows}x{columns} matrix's lr 0.02 with adjust_lr_fn={adjust_lr_fn!r} to {got}, "
            f"not the documented {expected}; update minigpt.training.torch_private"
        )


def test_a_torch_without_it_is_refused_at_import_naming_it_and_the_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.optim._muon", types.ModuleType("torch.optim._muon"))
    spec = importlib.util.spec_from_file_location("torch_private_probe", torch_private.__file__)
    with pytest.raises(ImportError) as refused:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert f"torch.optim._muon._adjust_lr, which torch {torch.__version__} does not have" in str(refused.value)
