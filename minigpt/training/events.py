"""What the trainer tells its listeners, and the listener interface.

The training loop (train.Trainer) only computes; everything else that happens during a run is a
listener: the metrics log and checkpoints (the run folder), the progress bar and Ctrl-C (the
command), and whatever comes next (samples during training, plots, rank 0 of a distributed run).
Events arrive in this order after each optimizer step: StepDone, then EvalDone when an evaluation
ran, then CheckpointDue when one is due, then StopRequested when the run stops early. A step whose
loss is not finite is not applied: Diverged is the only event it sends, and the run ends.
"""

from __future__ import annotations

from dataclasses import dataclass


def logged(step: int, total: int, log_interval: int) -> bool:
    """Whether step `step` (optimizer steps taken, 1 after the first) is one the metrics log records:
    every `[train] log_interval`-th, and the last. The trainer measures what only those steps show
    (each block's gradient norm) by the same rule the logs write them by."""
    return step % log_interval == 0 or step == total


@dataclass(frozen=True)
class StepDone:
    step: int  # optimizer steps taken so far (1 after the first)
    total: int  # the run's [train] steps
    loss: float  # mean training loss of this step's micro-batches, nats/token
    lr: float  # the learning rate this step used
    tokens_per_s: float  # since this process started training
    elapsed_s: float
    # On a logged step: each block's gradient norm (L2 over all its parameters' gradients, the whole
    # step's, before clipping; under torchrun the ranks' average), block 0 first; else None.
    block_grad_norms: tuple[float, ...] | None = None


@dataclass(frozen=True)
class EvalDone:
    step: int
    val_loss: float  # nats/token on the fixed validation windows
    val_bpb: float  # bits per byte of validation text


@dataclass(frozen=True)
class CheckpointDue:
    step: int
    reason: str  # "start", "interval", "end" or "stop"


@dataclass(frozen=True)
class Diverged:
    """A step whose loss or gradient norm is not finite: it was not applied, and training stops."""

    step: int  # the step that was attempted (optimizer steps taken so far + 1)
    loss: float
    grad_norm: float


@dataclass(frozen=True)
class StopRequested:
    step: int
    total: int


class Listener:
    """Override what you need; every method does nothing by default."""

    def on_step(self, event: StepDone) -> None: ...

    def on_eval(self, event: EvalDone) -> None: ...

    def on_checkpoint(self, event: CheckpointDue) -> None: ...

    def on_stop(self, event: StopRequested) -> None: ...

    def on_diverged(self, event: Diverged) -> None: ...

    def close(self) -> None: ...
