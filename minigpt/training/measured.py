"""`precision = "auto"` and `optimizer = "auto"`, decided by measuring this machine at the model's
own shapes rather than by reading its CPU flags or counting arithmetic.

A CPU's flags say what it could do, not what it does: with `ONEDNN_MAX_CPU_ISA=AVX2` (or a
laptop whose torch build lacks the kernels) a CPU that lists avx512_bf16 runs a bfloat16 matmul
thirty times slower than float32, and Muon's orthogonalisation in float32 costs more of a step than
its share of the arithmetic says. So before the first step a CPU run times, on the CPU it runs on:

- a matmul of the model's widest layer (a few hundred tokens x n_embd x ffn_hidden) in float32
  and in bfloat16: bfloat16 counts as fast here when it runs at least MARGIN times float32's rate;
- where it is fast, one forward and backward pass of PROBE_TOKENS tokens in each precision:
  `precision = "auto"` takes the faster (at a small width the casts can eat the gain);
- Muon's orthogonalisation of every block matrix, exactly the stacks BatchedMuon steps, against
  that pass scaled to the step's tokens: `optimizer = "auto"` takes Muon while it costs under
  MUON_MAX_SHARE of the step (its fewer steps to a given loss pay for that much; see
  docs/guide/performance.md).

Everything is timed on one thread (`_one_thread`: another program keeping a core busy then barely
moves the figures) in a fraction of a second, and cached per machine (CPU model and flags, oneDNN's
ISA cap), torch version and shape under the cache folder (MINIGPT_CACHE, else ~/.cache/minigpt) in
`measured/`: the first figures written are kept, so every later run on this machine, and every
process racing to write them, decides the same. Figures taken while the load changed (a timer's
rounds spread past UNSTEADY) decide that run alone and are not kept; deleting `measured/` makes
the next run measure again. A run records
what it chose and the figures in every checkpoint (`minigpt info` shows them), and a resume takes the
recorded choice, never a new measurement: the bits of a resumed run are those of an uninterrupted one.

Elsewhere (a GPU, a float64 teaching model, a learner's exercise module, whose code runs only once
its checks pass) `auto` decides as before: the device's bfloat16 support, and Muon's share of the
arithmetic (optimizers.chosen_optimizer).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import BFLOAT16_OVERRIDE, pick_precision
from ..io import creation_mode
from ..model.gpt import MiniGPT
from ..text.token_cache import cache_root
from .optimizers import MUON_MAX_SHARE, chosen_optimizer, orthogonalised
from .threads import alternating_rounds, timed_pass

MARGIN = 1.25  # bfloat16 matmuls this much faster than float32 count as fast (timer noise never decides)
PROBE_TOKENS = 512  # tokens of the timed forward and backward pass (whole rows, at least one)
ROUNDS = 3  # timed rounds of each measurement after a warm-up; the fastest counts (noise only slows)
UNSTEADY = 1.5  # a middle round this much slower than the fastest: the load changed while measuring
FORMAT = 1  # bump when the cached figures' meaning changes
# The environment that changes which kernels run (and so the figures) on the same CPU and torch.
KERNEL_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_DEFAULT_FPMATH_MODE")

_memo: dict[str, dict[str, Any]] = {}  # this process's figures, by cache key


@dataclass
class Auto:
    """What `auto` came to for a run, with the figures it rests on (empty where nothing was measured)."""

    precision: str
    optimizer: str
    ns_dtype: torch.dtype | None = None  # Muon's Newton-Schulz precision; None: BatchedMuon's own rule
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def decide(cfg, model: MiniGPT, row_tokens: int, device: str, payload: dict | None, learner: bool) -> Auto:
    """`[train] precision` and `optimizer` for this run: the ask where it names one, the choice its
    checkpoint records on a resume, else a measurement here (see the module's docstring)."""
    tc, dtype = cfg.train, cfg.model.dtype
    recorded = (payload or {}).get("choices")
    if isinstance(recorded, dict):  # a resume (or a torchrun rank joining rank 0): what was chosen
        figures = dict((payload or {}).get("measured") or {})
        precision = recorded["precision"] if tc.precision == "auto" else pick_precision(tc.precision, device, dtype)
        optimizer = recorded["optimizer"] if tc.optimizer == "auto" else tc.optimizer
        ns_dtype = None if "matmul" not in figures else _ns_dtype(_fast(figures["matmul"]), dtype)
        return Auto(precision, optimizer, ns_dtype, figures)
    tokens = tc.batch_size * tc.grad_accum * row_tokens
    flop_rule = chosen_optimizer(model, tc, row_tokens)  # the optimizer where nothing is measured
    said = [f"note: {flop_rule[1]}"] if flop_rule[1] else []
    here = device == "cpu" and dtype == "float32" and not os.environ.get(BFLOAT16_OVERRIDE)
    if not here or tc.lora_rank or (tc.precision != "auto" and tc.optimizer == "adamw"):
        return Auto(pick_precision(tc.precision, device, dtype), flop_rule[0], notes=said)
    with _one_thread():  # see _one_thread: another program's load then barely moves the figures
        return _measured(cfg, model, row_tokens, learner, tokens, flop_rule, said)


def _measured(cfg, model: MiniGPT, row_tokens: int, learner: bool, tokens: int, flop_rule, said: list[str]) -> Auto:
    tc, dtype = cfg.train, cfg.model.dtype
    auto = Auto(pick_precision(tc.precision, "cpu", dtype), tc.optimizer)
    width = _widest(model, cfg.model.n_embd)
    matmul, cached = _cached("matmul", {"width": width}, lambda: matmul_rates(*width))
    auto.figures["matmul"] = matmul
    fast = _fast(matmul)
    auto.ns_dtype = _ns_dtype(fast, dtype)
    if tc.precision == "auto":
        auto.precision = "bfloat16" if fast else "float32"  # unless the whole pass says otherwise, below
    if not learner and (tc.precision == "auto" and fast or tc.optimizer == "auto"):
        # A learner's module runs only once its checks pass, so its run decides without a pass. Else
        # the pass in each precision still open, and Muon's iterations where it may be chosen, timed
        # in alternating rounds so that a change in the machine's load falls on every figure alike.
        rows = max(1, PROBE_TOKENS // row_tokens)
        precisions = ("float32", "bfloat16") if tc.precision == "auto" and fast else (auto.precision,)
        shapes = block_matrix_shapes(model) if tc.optimizer == "auto" else None
        settings = {
            "model": _model_key(cfg.model, model),
            "rows": rows,
            "row_tokens": row_tokens,
            "precisions": precisions,
            "shapes": sorted((shapes or {}).items()),
            "dtype": str(auto.ns_dtype),
        }
        timed, step_cached = _cached(
            "step", settings, lambda: step_seconds(model, rows, row_tokens, precisions, shapes, auto.ns_dtype)
        )
        auto.figures["pass"] = timed
        auto.precision = min(precisions, key=lambda p: timed[f"{p}_s"])
    if tc.precision == "auto":
        auto.notes.append(_precision_note(auto, cached))
    if tc.optimizer == "auto":
        if learner:
            auto.optimizer = flop_rule[0]
            auto.notes += said
        else:
            auto.optimizer, note = _muon_or_adamw(auto, tokens, step_cached)
            auto.notes.append(note)
    return auto


@contextmanager
def _one_thread() -> Iterator[None]:
    """Measure on one thread, whatever the run trains on. A pass on every core waits at each
    operation for its slowest thread, so another program keeping one core busy would slow every
    figure by whatever that program happened to do; one thread runs on a core of its own. What
    `auto` compares are ratios (bfloat16 to float32, Muon to the step), which one thread gives as
    every core does."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def _where(cached: bool, figures: dict[str, Any]) -> str:
    """How the figures were come by, for the notes."""
    if cached:
        return "measured on this machine before, on one thread"
    if figures.get("steady") is False:
        return "measured here on one thread while the machine's load changed: kept for this run only"
    return "measured here on one thread"


def _muon_or_adamw(auto: Auto, tokens: int, cached: bool) -> tuple[str, str]:
    timed = auto.figures["pass"]
    step_s = timed[f"{auto.precision}_s"] * tokens / timed["tokens"]
    ortho_s = timed["orthogonalisation_s"]
    share = ortho_s / step_s
    name = "muon" if share < MUON_MAX_SHARE else "adamw"
    auto.figures["muon_share"] = round(share, 4)
    return name, (
        f'note: optimizer = "auto": {name} (Muon\'s orthogonalisation costs {share:.0%} of a {tokens:,}-token '
        f"step's forward and backward, {ortho_s * 1e3:.1f} ms against {step_s * 1e3:.1f} ms, {_where(cached, timed)}; "
        f"Muon is taken under {MUON_MAX_SHARE:.0%})"
    )


def _precision_note(auto: Auto, cached: bool) -> str:
    m = auto.figures["matmul"]
    said = (
        f'note: precision = "auto": {auto.precision} ({_where(cached, m)}: matmuls at this model\'s width '
        f"bfloat16 {m['bfloat16_gflops']:,.1f} GFLOP/s, float32 {m['float32_gflops']:,.1f}"
    )
    timed = auto.figures.get("pass")
    if timed and "bfloat16_s" in timed and "float32_s" in timed:
        bf16, f32 = timed["bfloat16_s"] * 1e3, timed["float32_s"] * 1e3
        said += f"; a {timed['tokens']}-token forward and backward pass bfloat16 {bf16:.1f} ms, float32 {f32:.1f} ms"
    return said + ")"


def _fast(matmul: dict[str, Any]) -> bool:
    return matmul["bfloat16_gflops"] >= MARGIN * matmul["float32_gflops"]


def _ns_dtype(fast: bool, dtype: str) -> torch.dtype | None:
    """Muon's iterations in bfloat16 where it was measured fast and the model is float32, else in
    the parameters' dtype (None: BatchedMuon reads the device's flags, for runs that measured nothing)."""
    return torch.bfloat16 if fast and dtype == "float32" else getattr(torch, dtype)


# ---------------------------------------------------------------- the measurements


def matmul_rates(inner: int, outer: int) -> dict[str, Any]:
    """GFLOP/s of [rows, inner] x [inner, outer] in float32 and bfloat16, rows chosen so that the
    bfloat16 product takes a few milliseconds even where it is emulated."""
    rows = max(16, min(PROBE_TOKENS, (1 << 24) // (inner * outer)))
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, inner, generator=generator), torch.randn(inner, outer, generator=generator)
    flops = 2 * rows * inner * outer
    pairs = {
        name: (a.to(dtype), b.to(dtype)) for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
    }
    timers = {name: _timer(lambda x=x, y=y: x @ y) for name, (x, y) in pairs.items()}
    best, steady = _alternating(timers, rounds=5)
    rates = {f"{name}_gflops": round(flops / s / 1e9, 2) for name, s in best.items()}
    return {"shape": [rows, inner, outer], **rates, "steady": steady}


def step_seconds(
    model: MiniGPT,
    rows: int,
    row_tokens: int,
    precisions: tuple[str, ...],
    shapes: Counter | None,
    ns_dtype: torch.dtype | None,
) -> dict[str, Any]:
    """One forward and backward pass of `rows` random rows in each precision and, given `shapes`,
    one step's orthogonalisations (a stack per shape, as BatchedMuon runs them): the best of
    alternating rounds. Leaves no trace: RNG states restored, gradients cleared."""
    generator = torch.Generator().manual_seed(0)
    device = model.token_table.weight.device
    ids = torch.randint(0, model.vocab_size, (rows, row_tokens + 1), generator=generator).to(device)
    batch = (ids[:, :-1], ids[:, 1:])
    threads = torch.get_num_threads()
    timers = {f"{p}_s": (lambda t=timed_pass(model, batch, p): t(threads)) for p in precisions}
    if shapes:
        dtype = ns_dtype or torch.float32
        stacks = [torch.randn(n, r, c, generator=generator).to(dtype) for (r, c), n in shapes.items()]
        defaults = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults
        ns = defaults["ns_coefficients"], defaults["ns_steps"]
        timers["orthogonalisation_s"] = _timer(
            lambda: [orthogonalised(s, s.shape[1] > s.shape[2], *ns) for s in stacks]
        )
    with torch.random.fork_rng(devices=[]):
        best, steady = _alternating(timers)
    model.zero_grad(set_to_none=True)
    return {"tokens": rows * row_tokens, **{name: round(s, 6) for name, s in best.items()}, "steady": steady}


def _widest(model: MiniGPT, n_embd: int) -> tuple[int, int]:
    """(inner, outer) of the model's largest block matrix as a matmul reads it ([out, in] stored);
    a model without one (no blocks) is measured at n_embd x n_embd."""
    shapes = block_matrix_shapes(model)
    rows, columns = max(shapes, key=lambda shape: shape[0] * shape[1]) if shapes else (n_embd, n_embd)
    return columns, rows


def block_matrix_shapes(model: MiniGPT) -> Counter:
    """How many block matrices of each shape Muon steps (one batched orthogonalisation per shape)."""
    return Counter(tuple(p.shape) for p in model.blocks.parameters() if p.dim() == 2 and p.requires_grad)


def _alternating(timers: dict[str, Callable[[], float]], rounds: int = ROUNDS) -> tuple[dict[str, float], bool]:
    """Each timer's fastest of `rounds` rounds after a warm-up, the rounds alternating between them,
    and whether the machine held steady meanwhile: every timer's middle round within UNSTEADY times
    its fastest (another program starting or stopping spreads them far wider than noise does)."""
    for once in timers.values():
        once()  # warm-up: the first call allocates, packs weights and resizes the thread pool
    times = alternating_rounds(timers, rounds)
    best = {name: min(t) for name, t in times.items()}
    steady = all(sorted(t)[len(t) // 2] <= UNSTEADY * min(t) for t in times.values())
    return best, steady


def _timer(work: Callable[[], Any]) -> Callable[[], float]:
    def once() -> float:
        started = time.perf_counter()
        work()
        return time.perf_counter() - started

    return once


# ---------------------------------------------------------------- the cache


def _machine() -> dict[str, Any]:
    """What makes this machine's figures its own: the CPU (model name and flags), the kernels' ISA
    cap, torch's version and its thread count."""
    cpu: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "flags") and name.strip() not in cpu:
                    cpu[name.strip()] = value.strip()
    except OSError:
        cpu["model name"] = platform.processor()
    return {
        "cpu": cpu.get("model name", ""),
        "flags": hashlib.sha256(cpu.get("flags", "").encode()).hexdigest()[:16],
        "arch": platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "kernels": {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ},
    }


def _model_key(model_cfg, model: MiniGPT) -> str:
    """The model's whole config and vocabulary: whatever changes a pass's time."""
    return json.dumps([repr(model_cfg), model.vocab_size], sort_keys=True)


def _cached(kind: str, settings: dict[str, Any], measure: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """`measure()`'s figures for `settings` on this machine, from the cache when they were measured
    before (then True): the first figures written for a key are kept, by every process, unless
    they were taken while the machine's load changed (`steady` false): those decide this run
    alone, and the next run measures again."""
    described = {"kind": kind, "format": FORMAT, "machine": _machine(), **settings}
    key = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:24]
    path = cache_root() / "measured" / f"{kind}-{key}.json"
    # The file first, even where this process measured before: another process may have written
    # the figures its runs use (the first written win), and this process's must be those.
    figures = _read(path)
    cached = figures is not None or key in _memo
    if figures is None:
        figures = _memo[key] if key in _memo else measure()
        if figures.get("steady") is False:  # taken while the load changed: used once, never kept
            return figures, False
        figures = _keep_first(path, figures)
    _memo[key] = figures
    return figures, cached


def _read(path: Path) -> dict[str, Any] | None:
    try:
        figures = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return figures if isinstance(figures, dict) else None


def _keep_first(path: Path, figures: dict[str, Any]) -> dict[str, Any]:
    """Write `figures` to `path` unless another process wrote it first, whose figures then win. A
    cache that cannot be written is no reason to stop a run: the figures are used uncached."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.chmod(tmp, creation_mode())  # mkstemp makes 0600; the mode open() would give, as the token cache's
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(figures, f)
            os.link(tmp, path)  # fails where the file exists: never a half-written or replaced one
        except FileExistsError:
            return _read(path) or figures
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass
    return figures
