"""training.trainer: carved from trainer.py (docstring to write)

The trainer: schedule, accumulation, clipping, the optimizer step and evaluation, emitting events.

    with TrainingSession(...) as session:          session.py: checks, run folder, ranks, weights
        trainer = Trainer(session, listeners)      listeners: metrics log, checkpoints, progress, ...
        result = trainer.run()                     StepDone / EvalDone / CheckpointDue / StopRequested

`Trainer.train_step` is one optimizer step, the unit scripts/bench.py times. Nothing here prints or
exits: a command (or the Python API) talks to the user and handles Ctrl-C by calling
`Trainer.request_stop`, which the loop honours at the next step boundary.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import failpoints
from ..device import autocast, default_threads
from ..errors import MinigptError, Phrase
from ..model.gpt import MiniGPT
from . import distributed, threads
from .distributed import RefusedElsewhere, World
from .events import CheckpointDue, Diverged, EvalDone, Listener, StepDone, StopRequested, logged
from .session import Session
from .threads import Watch


def learning_rate(step: int, cfg) -> float:
    """Linear warmup to `learning_rate` over `warmup_steps`, then cosine decay to `min_lr`, which the
    last step (steps - 1) uses."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - 1 - cfg.warmup_steps)  # the last step the loop runs is steps - 1
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


@torch.no_grad()
def evaluate(model: MiniGPT, windows: list, tokens_per_byte: float, world: World = World()) -> dict[str, float]:
    """Mean next-token loss over the fixed validation windows, in nats per token and bits per byte
    (nats/token x tokens/byte / ln 2: comparable across tokenizers). Under torchrun each rank scores
    its rows of every window and the ranks' means are averaged: the one-process figure."""
    failpoints.reach("eval")
    was_training = model.training
    model.eval()
    total = distributed.mean(world, sum(model(x, y)[1].item() for x, y in windows) / len(windows))
    model.train(was_training)
    return {"val_loss": total, "val_bpb": total * tokens_per_byte / math.log(2)}


def block_grad_norms(model: MiniGPT) -> tuple[float, ...]:
    """Each block's gradient norm: the L2 norm over every gradient of its parameters (the
    blocks' alone: not the tables, the final norm or the head), block 0 first; one host sync."""
    norms = []
    for block in model.blocks:
        grads = [p.grad for p in block.parameters() if p.grad is not None]  # none: frozen, or unused
        each = [torch.linalg.vector_norm(grad) for grad in grads]
        norms.append(torch.linalg.vector_norm(torch.stack(each)) if each else model.token_table.weight.new_zeros(()))
    return tuple(torch.stack(norms).tolist())


def estimate_seconds(session: Session, steps: int) -> float:
    """Time one forward and backward pass (after one untimed warm-up, in the run's precision) on a
    validation batch and scale it to `steps` steps. Leaves no trace: gradients are cleared and the
    RNG state is restored, so a run that shows an estimate computes exactly what one that does not
    (a quiet one) computes."""
    model, tc, precision = session.model, session.cfg.train, session.precision
    batch = session.val_windows[0]
    x, y = batch
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        seconds = 0.0
        for _ in range(2):
            started = time.perf_counter()
            with autocast(str(x.device), precision):
                loss = model(x, y)[1]
            loss.backward()
            seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    evaluations = steps // tc.eval_interval + 1
    # An evaluation is forward passes only, about a third of a forward and backward pass.
    return seconds * (steps * tc.grad_accum + evaluations * tc.eval_batches / 3)


@dataclass
class TrainResult:
    step: int
    steps_taken: int
    seconds: float
    tokens_per_s: float
    val_loss: float | None = None
    val_bpb: float | None = None
    stopped: bool = False  # ended early at a step boundary because a stop was requested
    diverged: Diverged | None = None  # ended because this step's loss or gradient norm was not finite
    total: int = 0  # the run's [train] steps
    run: Path | None = None  # the run folder (minigpt.load(result.run) reads it)
    checkpoint_step: int | None = None  # the step of the newest checkpoint on disk


class DivergedError(MinigptError):
    """A step's loss or gradient norm was not finite: it was not applied, and training stopped."""

    exit_code = 1


class WriteFailed(MinigptError):
    """The run folder could not be written mid-run (a full disk); its last checkpoint stands.
    `resume_with`: the command that resumes the run, where the caller can write it out."""

    exit_code = 1

    def __init__(self, reason: str, run: Path, checkpoint_step: int, resume_with: str | None = None):
        resume = (
            Phrase("resume with: {command}", command=resume_with) if resume_with else Phrase("resume it ({resume:on})")
        )
        super().__init__(
            "could not write to the run folder {folder} ({reason}); its last checkpoint (step "
            "{checkpoint_step}) is intact: make room, then {then}",
            folder=run,
            reason=reason,
            checkpoint_step=checkpoint_step,
            then=resume,
        )
        self.reason, self.run, self.checkpoint_step = reason, run, checkpoint_step


class Trainer:
    def __init__(self, session: Session, listeners: Sequence[Listener] = ()):
        self.session = session
        self.listeners = list(listeners)
        self.stop_requested = False
        self.diverged: Diverged | None = None
        self.failure: Exception | None = None  # a listener's, raised at the step's end
        self.block_grad_norms: tuple[float, ...] | None = None  # the last step's, when it is logged

    def request_stop(self) -> None:
        """Stop at the next step boundary, with a checkpoint (safe to call from a signal handler)."""
        self.stop_requested = True

    def train_step(self) -> tuple[float, float]:
        """One optimizer step: set the scheduled learning rate, accumulate `grad_accum` micro-batches,
        clip, step. Returns (mean loss in nats/token, learning rate). A step whose loss or gradient
        norm is not finite is not applied: `diverged` says so, and the step count stays."""
        s, tc = self.session, self.session.cfg.train
        lr = learning_rate(s.step, tc)
        for group in s.optimizer.param_groups:  # AdamW takes the schedule as is, Muon in proportion
            group["lr"] = lr if "peak_lr" not in group else group["peak_lr"] * lr / tc.learning_rate
        total = 0.0
        forward = s.forward_model or s.model
        if s.world.rank > 0 and s.cfg.model.dropout > 0:
            # Rank 0 continues the run's RNG (the checkpoint's); the others would draw the very same
            # dropout masks from their copy of it, so each takes a stream of its own per step, which
            # a resume recreates.
            torch.manual_seed((tc.seed * 1_000_003 + s.step) * 8_191 + s.world.rank)
        for micro in range(tc.grad_accum):
            x, y = s.train_batches.sample(s.generator)
            failpoints.reach("batch")
            # Ranks exchange gradients once a step: not on the micro-steps before the last.
            quiet = forward.no_sync() if s.world.distributed and micro < tc.grad_accum - 1 else nullcontext()
            with quiet:
                with autocast(s.device, s.precision):
                    _, loss = forward(x, y)
                (loss / tc.grad_accum).backward()
            total += loss.item() / tc.grad_accum
        total = distributed.mean(s.world, total)  # the global batch's loss, the same on every rank
        # Measured only on a step the logs record, before clipping (under torchrun: averaged already).
        self.block_grad_norms = block_grad_norms(s.model) if logged(s.step + 1, tc.steps, tc.log_interval) else None
        # With grad_clip = 0 the norm is still measured (a clip at infinity multiplies by exactly 1).
        norm = float(
            torch.nn.utils.clip_grad_norm_(s.model.parameters(), tc.grad_clip if tc.grad_clip > 0 else math.inf)
        )
        # The same verdict on every rank without another exchange: the loss is the ranks' mean and the
        # norm is taken over the averaged gradients, so a NaN or inf on any rank is in both everywhere.
        if not (math.isfinite(total) and math.isfinite(norm)):
            s.optimizer.zero_grad(set_to_none=True)
            self.diverged = Diverged(s.step + 1, total, norm)
            return total, lr
        s.optimizer.step()
        s.optimizer.zero_grad(set_to_none=True)
        s.step += 1
        return total, lr

    def _emit(self, method: str, event) -> None:
        """Tell the listeners, unless one has already failed. A failure (a full disk under the
        metrics log or a checkpoint) is kept and raised at the step's end, after the ranks have
        agreed on it, so that under torchrun every rank stops at the same point."""
        if self.failure is not None:
            return
        try:
            for listener in self.listeners:
                getattr(listener, method)(event)
        except Exception as exc:  # noqa: BLE001 - raised again below, once every rank knows
            self.failure = exc

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure
        raise RefusedElsewhere("another rank failed")

    def run(self) -> TrainResult:
        """Train from the session's step to `[train] steps`, emitting events; closes the listeners."""
        s, tc = self.session, self.session.cfg.train
        started, start_step = time.perf_counter(), s.step
        last_val: dict[str, float] = {}
        try:
            if s.step == 0 and s.origin is not None and not s.resumed:  # where a fine-tune starts: its source's score
                last_val = evaluate(s.model, s.val_windows, s.corpus.val_tokens_per_byte, s.world)
                self._emit("on_eval", EvalDone(0, **last_val))
            s.model.train()
            # adaptive_threads alone times the count again: a switch changes the last bits from there on.
            adaptive = tc.adaptive_threads and s.threads is not None and default_threads() > 1
            watch = Watch(s.threads, default_threads()) if adaptive else None
            while s.step < tc.steps:
                step_started = time.perf_counter()
                loss, lr = self.train_step()
                if watch is not None and watch.due(time.perf_counter() - step_started):
                    # something else started or stopped on this machine: the fastest count again
                    s.threads = threads.choose(s.model, s.val_windows[0], s.precision, watch.cores)
                    watch.reset(s.threads)
                if self.diverged is not None:
                    self._emit("on_diverged", self.diverged)
                    break
                step = s.step
                elapsed = time.perf_counter() - started
                tokens_per_s = (step - start_step) * s.tokens_per_step / max(elapsed, 1e-9)
                self._emit("on_step", StepDone(step, tc.steps, loss, lr, tokens_per_s, elapsed, self.block_grad_norms))
                if step % tc.eval_interval == 0 or step == tc.steps:
                    last_val = evaluate(s.model, s.val_windows, s.corpus.val_tokens_per_byte, s.world)
                    self._emit("on_eval", EvalDone(step, **last_val))
                if step % tc.checkpoint_interval == 0 or step == tc.steps:
                    self._emit("on_checkpoint", CheckpointDue(step, "end" if step == tc.steps else "interval"))
                stop, failed = distributed.any_rank(s.world, self.stop_requested, self.failure is not None)
                if failed:
                    self._raise_failure()
                if stop and step < tc.steps:
                    self._emit("on_checkpoint", CheckpointDue(step, "stop"))
                    self._emit("on_stop", StopRequested(step, tc.steps))
                    break
            if self.failure is not None:  # telling of the divergence or the stop failed
                raise self.failure
        finally:
            for listener in self.listeners:
                listener.close()
        elapsed = time.perf_counter() - started
        taken = s.step - start_step
        return TrainResult(
            s.step,
            taken,
            elapsed,
            taken * s.tokens_per_step / max(elapsed, 1e-9),
            last_val.get("val_loss"),
            last_val.get("val_bpb"),
            stopped=s.step < tc.steps and self.diverged is None,
            diverged=self.diverged,
            total=tc.steps,
        )
