"""`precision = "auto"` and `optimizer = "auto"` decided by measuring the machine (training/measured.py).
The decisions are tested on given figures, never on this machine's, so nothing depends on the CPU
kind or on how busy the machine running the tests is; the real measurements are tested for what
they leave behind (nothing) and for the figures a run records (consistent with its choice)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from minigpt.api import train
from minigpt.config import load_config
from minigpt.device import BFLOAT16_OVERRIDE
from minigpt.model.gpt import MiniGPT
from minigpt.training import measured
from minigpt.training.optimizers import MUON_MAX_SHARE


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty measurement cache, no figures remembered in this process, no CPU-kind override."""
    monkeypatch.setenv("MINIGPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(BFLOAT16_OVERRIDE, raising=False)
    monkeypatch.setattr(measured, "_memo", {})


def given(monkeypatch, matmul=(100.0, 500.0), passes=None, ortho=0.001):
    """The measurements answer these figures: matmul GFLOP/s (float32, bfloat16), each precision's
    pass seconds, the orthogonalisation's seconds. Returns what step_seconds was asked to time."""
    asked = []
    passes = passes or {"float32": 0.020, "bfloat16": 0.010}

    def matmul_rates(inner, outer):
        return {**given_rates(*matmul), "shape": [256, inner, outer]}

    def step_seconds(model, rows, row_tokens, precisions, shapes, ns_dtype):
        asked.append((precisions, shapes is not None, ns_dtype))
        timed = {"tokens": rows * row_tokens, **{f"{p}_s": passes[p] for p in precisions}}
        return {**timed, **({"orthogonalisation_s": ortho} if shapes else {})}

    monkeypatch.setattr(measured, "matmul_rates", matmul_rates)
    monkeypatch.setattr(measured, "step_seconds", step_seconds)
    return asked


def given_rates(float32: float, bfloat16: float) -> dict:
    return {"shape": [256, 32, 128], "float32_gflops": float32, "bfloat16_gflops": bfloat16, "steady": True}


def decide(changes=(), payload=None, learner=False):
    cfg = load_config(None, ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.context=16", *changes])
    torch.manual_seed(0)
    model = MiniGPT(cfg.model, 50)
    return measured.decide(cfg, model, cfg.model.context, "cpu", payload, learner)


def test_bfloat16_measured_fast_and_a_faster_pass_takes_bfloat16_and_cheap_orthogonalisation_takes_muon(
    fresh, monkeypatch
):
    asked = given(monkeypatch)
    auto = decide()
    assert (auto.precision, auto.optimizer, auto.ns_dtype) == ("bfloat16", "muon", torch.bfloat16)
    assert asked == [(("float32", "bfloat16"), True, torch.bfloat16)]  # one alternating measurement
    assert auto.figures["matmul"]["bfloat16_gflops"] == 500.0 and auto.figures["pass"]["bfloat16_s"] == 0.010
    assert auto.notes[0].startswith(
        'note: precision = "auto": bfloat16 (measured here on one thread: matmuls at this model\'s width bfloat16 '
        "500.0 GFLOP/s, float32 100.0; a 512-token forward and backward pass bfloat16 10.0 ms, float32 20.0 ms)"
    )
    assert auto.notes[1].startswith('note: optimizer = "auto": muon (Muon\'s orthogonalisation costs ')
    assert auto.notes[1].endswith("measured here on one thread; Muon is taken under 50%)")
    again = decide()  # the next run: from the cache, and said so
    assert (again.precision, again.optimizer) == ("bfloat16", "muon") and len(asked) == 1
    assert all("measured on this machine before, on one thread" in note for note in again.notes)


def test_the_figures_are_taken_on_one_thread_whatever_the_run_trains_on(fresh, monkeypatch):
    given(monkeypatch)
    seen = []
    monkeypatch.setattr(
        measured, "matmul_rates", lambda i, o: seen.append(torch.get_num_threads()) or given_rates(1, 3)
    )
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        decide()
        assert seen == [1] and torch.get_num_threads() == 2  # and the run's own count back
    finally:
        torch.set_num_threads(was)


def test_figures_taken_while_the_load_changed_decide_one_run_and_are_not_kept(fresh, monkeypatch):
    unsteady = {"shape": [256, 32, 128], "float32_gflops": 100.0, "bfloat16_gflops": 3.0, "steady": False}
    given(monkeypatch, matmul=(100.0, 3.0))
    monkeypatch.setattr(measured, "matmul_rates", lambda i, o: dict(unsteady))
    first = decide()
    assert first.precision == "float32" and "while the machine's load changed: kept for this run only" in first.notes[0]
    monkeypatch.setattr(measured, "_memo", {})
    steady = {**unsteady, "bfloat16_gflops": 500.0, "steady": True}
    monkeypatch.setattr(measured, "matmul_rates", lambda i, o: dict(steady))
    assert decide().precision == "bfloat16"  # measured again, and this time kept


def test_a_steady_round_and_a_disturbed_one_are_told_apart():
    quiet = iter([0.010, 0.011, 0.010, 0.012])
    best, steady = measured._alternating({"pass": lambda: next(quiet)})
    assert best == {"pass": 0.010} and steady
    busy = iter([0.010, 0.010, 0.030, 0.031])  # warm-up, then two of three rounds slowed threefold
    assert measured._alternating({"pass": lambda: next(busy)}) == ({"pass": 0.010}, False)


def test_emulated_bfloat16_keeps_float32_and_never_times_a_bfloat16_pass(fresh, monkeypatch):
    asked = given(monkeypatch, matmul=(120.0, 3.0))  # ONEDNN_MAX_CPU_ISA=AVX2 on an avx512_bf16 CPU
    auto = decide()
    assert (auto.precision, auto.ns_dtype) == ("float32", torch.float32)
    assert asked == [(("float32",), True, torch.float32)]


def test_where_the_casts_eat_the_gain_the_whole_pass_decides(fresh, monkeypatch):
    given(monkeypatch, passes={"float32": 0.010, "bfloat16": 0.012})  # fast matmuls, a slower pass
    assert decide().precision == "float32"


@pytest.mark.parametrize(("share", "optimizer"), [(MUON_MAX_SHARE * 0.9, "muon"), (MUON_MAX_SHARE * 1.1, "adamw")])
def test_muon_is_taken_while_its_orthogonalisation_costs_under_the_share_of_a_step(
    fresh, monkeypatch, share, optimizer
):
    # The pass times 16 rows x 16 tokens; a step is the default batch (64 rows) of them: 4 passes.
    ortho = share * 0.020 * 64 * 16 / (32 * 16)
    given(monkeypatch, passes={"float32": 0.020, "bfloat16": 0.010}, ortho=ortho)
    auto = decide(['train.precision="float32"', "train.batch_size=64"])
    assert auto.optimizer == optimizer and auto.figures["muon_share"] == pytest.approx(share, rel=1e-3)


def test_what_the_config_names_is_never_measured(fresh, monkeypatch):
    monkeypatch.setattr(measured, "matmul_rates", lambda *a: pytest.fail("nothing to decide"))
    auto = decide(['train.precision="float32"', 'train.optimizer="adamw"'])
    assert (auto.precision, auto.optimizer, auto.figures) == ("float32", "adamw", {})


def test_the_cpu_kind_override_decides_by_the_rules_without_measuring(fresh, monkeypatch):
    monkeypatch.setattr(measured, "matmul_rates", lambda *a: pytest.fail("the override decides"))
    for kind, precision in (("native", "bfloat16"), ("emulated", "float32")):
        monkeypatch.setenv(BFLOAT16_OVERRIDE, kind)
        assert decide().precision == precision


def test_a_learners_module_is_not_run_to_decide(fresh, monkeypatch):
    asked = given(monkeypatch)
    auto = decide(learner=True)
    assert asked == [] and auto.precision == "bfloat16"  # by the matmuls alone
    assert auto.optimizer in ("adamw", "muon") and "arithmetic" in auto.notes[-1]  # by the share of the arithmetic


def test_a_resume_takes_the_recorded_choice_and_figures_without_measuring(fresh, monkeypatch):
    monkeypatch.setattr(measured, "matmul_rates", lambda *a: pytest.fail("a resume does not measure"))
    figures = {"matmul": {"shape": [256, 32, 128], "float32_gflops": 120.0, "bfloat16_gflops": 3.0}}
    payload = {"choices": {"optimizer": "muon", "precision": "float32", "threads": 1, "device": "cpu"}}
    auto = decide(payload={**payload, "measured": figures})
    assert (auto.precision, auto.optimizer, auto.ns_dtype, auto.figures) == ("float32", "muon", torch.float32, figures)
    assert auto.notes == []


def test_the_first_figures_written_are_kept_by_every_later_process(fresh, monkeypatch):
    first, _ = measured._cached("matmul", {"width": [8, 8]}, lambda: {"figure": 1})
    monkeypatch.setattr(measured, "_memo", {})  # another process: nothing remembered
    again, cached = measured._cached("matmul", {"width": [8, 8]}, lambda: {"figure": 2})
    assert first == again == {"figure": 1} and cached
    other, cached = measured._cached("matmul", {"width": [8, 16]}, lambda: {"figure": 3})
    assert other == {"figure": 3} and not cached


def test_a_cache_that_cannot_be_written_still_decides(fresh, monkeypatch, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("MINIGPT_CACHE", str(blocked))
    assert measured._cached("matmul", {"width": [8, 8]}, lambda: {"figure": 1}) == ({"figure": 1}, False)


def test_the_measurements_leave_no_gradient_and_no_trace_on_the_random_state():
    cfg = dataclasses.replace(load_config(None).model, n_layer=1, n_embd=16, n_head=2, ffn_hidden=32, context=8)
    torch.manual_seed(0)
    model = MiniGPT(cfg, 20).train()
    before = torch.get_rng_state()
    shapes = measured.block_matrix_shapes(model)
    assert sum(shapes.values()) == 4  # qkv, out, W1, W2 of one block
    timed = measured.step_seconds(model, 4, 8, ("float32", "bfloat16"), shapes, torch.float32)
    assert timed["tokens"] == 32 and all(timed[k] > 0 for k in ("float32_s", "bfloat16_s", "orthogonalisation_s"))
    assert torch.equal(torch.get_rng_state(), before)
    assert all(p.grad is None for p in model.parameters())
    rates = measured.matmul_rates(16, 32)
    assert rates["shape"][1:] == [16, 32] and rates["float32_gflops"] > 0 and rates["bfloat16_gflops"] > 0


def test_a_run_records_the_figures_its_choice_rests_on_and_info_shows_them(fresh, tiny_config, tmp_path, cli):
    out = tmp_path / "run"
    auto = {"train.optimizer": "auto", "train.precision": "auto"}
    train(config=tiny_config, out=out, steps=2, set=auto, progress=False)
    payload = torch.load(out / "checkpoint.pt", weights_only=False)
    choices, figures = payload["choices"], payload["measured"]
    fast = figures["matmul"]["bfloat16_gflops"] >= measured.MARGIN * figures["matmul"]["float32_gflops"]
    timed = figures["pass"]
    if fast:  # whichever this machine measured, the choice is the one its figures say
        assert choices["precision"] == min(("float32", "bfloat16"), key=lambda p: timed[f"{p}_s"])
    else:
        assert choices["precision"] == "float32" and "bfloat16_s" not in timed
    assert choices["optimizer"] == ("muon" if figures["muon_share"] < MUON_MAX_SHARE else "adamw")
    text = cli("info", "--run", out).stdout
    assert "  measured on the machine it started on:" in text
    assert "forward and backward pass: float32 " in text and "Muon's orthogonalisation of every block matrix: " in text
