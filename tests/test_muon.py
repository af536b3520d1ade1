"""BatchedMuon (optimizers.py): torch.optim.Muon with same-shape matrices stepped as one stack. The
reference is torch.optim.Muon itself, stepped on copies of the same matrices with the same gradients."""

from __future__ import annotations

import io

import pytest
import torch

from minigpt.training.optimizers import BatchedMuon

# tall, wide, square and a second tall shape, two of each, plus one matrix of a shape of its own
SHAPES = [(48, 16), (16, 48), (16, 16), (32, 16)] * 2 + [(24, 40)]
# The update is orthogonalised in bf16 (about 3 significant digits): a batched matmul that sums in
# another order may move an element by a few bf16 steps of the update (lr x 0.2 x sqrt(48) ~ 0.03).
ATOL = 5e-4


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.1) for shape in SHAPES]


def gradients(step: int, skip: int | None = None) -> list[torch.Tensor | None]:
    generator = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(shape, generator=generator) for shape in SHAPES]
    if skip is not None:
        grads[skip] = None  # a matrix the loss did not reach this step
    return grads


def step_both(reference, batched, a, b, step: int, skip: int | None = None) -> None:
    for p, q, g in zip(a, b, gradients(step, skip), strict=True):
        p.grad = None if g is None else g.clone()
        q.grad = None if g is None else g.clone()
    reference.step()
    batched.step()


def assert_same(a, b) -> None:
    for i, (p, q) in enumerate(zip(a, b, strict=True)):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=0, atol=ATOL, msg=f"matrix {i} {SHAPES[i]}")


@pytest.mark.parametrize(
    "options",
    [
        {"adjust_lr_fn": "match_rms_adamw"},
        {"adjust_lr_fn": None, "nesterov": False},
        {"adjust_lr_fn": "original", "momentum": 0.8, "weight_decay": 0.0},
    ],
)
def test_batched_muon_steps_as_torch_muon_does(options):
    a, b = matrices(), matrices()
    reference = torch.optim.Muon(a, lr=0.02, **options)
    batched = BatchedMuon(b, lr=0.02, ns_dtype=torch.bfloat16, **options)  # as torch.optim.Muon does
    for step in range(8):
        step_both(reference, batched, a, b, step, skip=3 if step == 4 else None)
    assert_same(a, b)
    moved = max((p.detach() - q).abs().max().item() for p, q in zip(a, matrices(), strict=True))
    assert moved > 50 * ATOL  # the comparison is not between two runs that barely moved


def test_a_matrix_missing_its_gradient_keeps_its_weights_and_momentum():
    b = matrices()
    batched = BatchedMuon(b, lr=0.02, weight_decay=0.1)
    for p, g in zip(b, gradients(0), strict=True):
        p.grad = g
    batched.step()
    before = b[3].detach().clone()
    buffer = batched.state[b[3]]["momentum_buffer"].clone()
    for i, (p, g) in enumerate(zip(b, gradients(1, skip=3), strict=True)):
        p.grad = g if i != 3 else None
    batched.step()
    assert torch.equal(b[3].detach(), before)
    assert torch.equal(batched.state[b[3]]["momentum_buffer"], buffer)


def saved(optimizer) -> dict:
    """The state dict through torch.save / torch.load, as a checkpoint file carries it."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("saved_by", ["torch", "batched"])
def test_the_state_dict_is_torch_muons_and_loads_either_way(saved_by):
    # Train both for a few steps, save one, load it into a fresh optimizer of the other kind over
    # copies of the weights, and continue: the run goes on as the saver would have gone on.
    a, b = matrices(), matrices()
    reference = torch.optim.Muon(a, lr=0.02, adjust_lr_fn="match_rms_adamw")
    batched = BatchedMuon(b, lr=0.02, adjust_lr_fn="match_rms_adamw", ns_dtype=torch.bfloat16)
    for step in range(3):
        step_both(reference, batched, a, b, step)
    state = saved(reference if saved_by == "torch" else batched)
    assert set(state["state"]) == set(range(len(SHAPES)))
    assert all(set(s) == {"momentum_buffer"} for s in state["state"].values())

    c = [torch.nn.Parameter(p.detach().clone()) for p in (a if saved_by == "torch" else b)]
    kind = BatchedMuon if saved_by == "torch" else torch.optim.Muon
    extra = {"ns_dtype": torch.bfloat16} if kind is BatchedMuon else {}
    loaded = kind(c, lr=0.02, adjust_lr_fn="match_rms_adamw", **extra)
    loaded.load_state_dict(state)
    going_on = a if saved_by == "torch" else b
    for step in range(3, 6):
        for p, q, g in zip(going_on, c, gradients(step), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        (reference if saved_by == "torch" else batched).step()
        loaded.step()
    assert_same(going_on, c)


@pytest.mark.parametrize("native", [True, False])
def test_newton_schulz_runs_in_bfloat16_only_where_bfloat16_is_native(native, monkeypatch):
    # Emulated bfloat16 matmuls (a CPU without AVX-512 BF16 or AMX) ran 70x slower than float32 ones:
    # there the iterations run in float32, the same algorithm, within bf16 rounding of torch's.
    monkeypatch.setattr("minigpt.training.optimizers.native_bfloat16", lambda device: native)
    a, b = matrices(), matrices()
    reference = torch.optim.Muon(a, lr=0.02, adjust_lr_fn="match_rms_adamw")
    batched = BatchedMuon(b, lr=0.02, adjust_lr_fn="match_rms_adamw")
    assert batched.ns_dtype == (torch.bfloat16 if native else torch.float32)
    for step in range(8):
        step_both(reference, batched, a, b, step)
    # float32 against torch's bfloat16: each step differs by bf16's rounding of the update (measured:
    # 5e-4 after one step, 6.5e-4 after eight, of updates that moved the weights by 0.07)
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=0, atol=ATOL if native else 2 * ATOL)
    assert all(p.dtype == torch.float32 for p in b)


@pytest.mark.parametrize("native", [True, False])
def test_a_float64_run_orthogonalises_in_float64_on_every_machine(native, monkeypatch):
    monkeypatch.setattr("minigpt.training.optimizers.native_bfloat16", lambda device: native)
    b = [torch.nn.Parameter(p.detach().double()) for p in matrices()]
    batched = BatchedMuon(b, lr=0.02)
    assert batched.ns_dtype == torch.float64
    for p, g in zip(b, gradients(0), strict=True):
        p.grad = g.double()
    batched.step()
    assert all(p.dtype == torch.float64 for p in b)


def test_its_momentum_buffers_are_views_of_one_stack_per_shape():
    b = matrices()
    batched = BatchedMuon(b, lr=0.02)
    for p, g in zip(b, gradients(0), strict=True):
        p.grad = g
    batched.step()
    bases = {}
    for p in b:
        buffer = batched.state[p]["momentum_buffer"]
        assert buffer.shape == p.shape
        bases.setdefault(tuple(p.shape), set()).add(id(buffer._base))
    assert all(len(ids) == 1 for ids in bases.values())  # one stack per shape
    assert len({i for ids in bases.values() for i in ids}) == len(set(SHAPES))


# ----------------------------------------------------------------------------------------------
# optimizer = "auto": Muon where its orthogonalisation is cheap beside the step


def test_orthogonalisation_flops_count_five_iterations_on_the_wide_side():
    from minigpt.model.flops import orthogonalisation_flops

    # r = 2, c = 3: X Xt 2*2*2*3 = 24, its square 2*2*2*2 = 16, the product with X 24; five times
    assert orthogonalisation_flops(2, 3) == orthogonalisation_flops(3, 2) == 5 * (24 + 16 + 24)


def test_auto_takes_muon_at_the_default_batch_and_adamw_at_a_small_one():
    from minigpt.config import load_config
    from minigpt.model.gpt import MiniGPT
    from minigpt.training.optimizers import Optimizers, chosen_optimizer, make_optimizer

    def chosen(*changes):
        cfg = load_config(None, ['train.optimizer="auto"', *changes])
        model = MiniGPT(cfg.model, 1024)
        name, note = chosen_optimizer(model, cfg.train)
        built = make_optimizer(model, cfg.train)
        assert isinstance(built, Optimizers) == (name == "muon")
        return name, note

    name, note = chosen()  # 64 windows of 32: the orthogonalisation is a fifth of the step
    assert name == "muon" and "20%" in note and "2,048-token" in note
    name, note = chosen("train.batch_size=16")  # the same once a step, over a quarter of the tokens
    assert name == "adamw" and "80%" in note
    assert chosen("train.batch_size=16", "train.grad_accum=4")[0] == "muon"  # the step's tokens count
    assert chosen_optimizer(
        MiniGPT(load_config(None).model, 1024), load_config(None, ['train.optimizer="adamw"']).train
    ) == (
        "adamw",
        None,
    )
