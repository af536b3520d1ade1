"""`minigpt.train`: a run trained (or resumed, or fine-tuned) from Python as `minigpt train` trains
one, with Ctrl-C and SIGTERM stopping it at a step boundary with a checkpoint."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from .. import failpoints
from ..config import Config, load_config
from ..device import keep_freed_memory
from ..errors import MinigptError
from ..runs.exercise import divergence_hint
from ..training import distributed
from ..training.events import Listener, StepDone
from ..training.listeners import CheckpointSaver, run_folder_listeners
from ..training.progress import preparation, training_progress
from ..training.session import Session, TrainingSession
from ..training.trainer import DivergedError, Trainer, TrainResult, WriteFailed
from .arguments import overrides, plain


def train(
    data: str | Path | Sequence[str | Path] | None = None,
    out: str | Path | None = None,
    steps: int | None = None,
    *,
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
    init_from: str | Path | None = None,
    init_checkpoint: str | None = None,
    task: str | None = None,
    task_length: int | None = None,
    exercise: str | None = None,
    exercise_file: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
    trust_exercise: bool = False,
    progress: bool = True,
    listeners: Sequence[Listener] = (),
    on_start: Callable[[Session], None] | None = None,
    preparing: Callable[[str], AbstractContextManager] | None = None,
    stop_when: Callable[[StepDone], bool] | None = None,
) -> TrainResult:
    """Train a run: `config` (default: the shipped configs/default.toml) with `set` overrides, on
    `data` (a text file, a folder of *.txt files, a list of them, or a .jsonl file of prompt/completion
    pairs), or on a generated `task` ("reverse", "sort", "copy", "add"; `task_length` its size), into
    the run folder `out`, for `steps` steps, with a learner's module in place of minigpt's where
    `exercise` names one (`minigpt exercise`: its file `exercise_file`, by default
    exercises/NAME.py here, must pass its checks); `init_from` a run folder fine-tunes it
    (`init_checkpoint` "last" or "best"); `resume` continues the run in `out`, `force` replaces it:
    the run alone (a folder holding anything else, or what the run reads, is refused), and only
    once every check has passed and the new step-0 checkpoint is written. `trust_exercise` trains
    with an exercise file that lies inside a run folder (one handed to you can carry code of its own).
    `progress` shows a bar (a widget in a notebook) and the samples of `[train] sample_every`;
    `listeners` hear every event (events.py); `on_start(session)` is called once everything is
    checked, before the first step (the command prints its summary there); `stop_when(step_done)`,
    asked after every step, ends training at that step when it says True, as an interruption does
    (a sweep's rule for a loss that explodes). Interrupting (Ctrl-C, a
    notebook's stop button, or SIGTERM) finishes the step, saves a checkpoint and returns with
    `stopped`; `resume=True` continues. After a SIGTERM the process ignores SIGTERM (the copies a
    scheduler and torchrun send of that one request), so it ends on its own. Returns the
    TrainResult (`result.run` is the folder to load)."""
    given = {"data": data, "out": out, "steps": steps, "init_from": init_from, "init_checkpoint": init_checkpoint}
    given |= {"task": task, "task_length": task_length, "exercise_file": exercise_file}
    train_keys = {key: plain(value) for key, value in given.items() if value is not None}
    model_keys = {"exercise": exercise} if exercise is not None else {}

    def read_config() -> Config:
        if resume and force:
            raise MinigptError(
                "{resume:on} and {force:on} contradict each other; {resume:on} continues a run, {force:on} replaces it"
            )
        cfg = load_config(config, overrides(set), {"train": train_keys, "model": model_keys})
        if not cfg.train.recompute:  # recompute asks for memory: freed blocks go back to the system
            keep_freed_memory()  # fewer fresh pages per step: see device.py
        if cfg.train.tensorboard:
            from ..training.tensorboard import require

            require()  # before anything is written
        return cfg

    session = TrainingSession(
        read_config,
        resume=resume,
        force=force,
        trust_exercise=trust_exercise,
        preparing=preparing or (lambda message: nullcontext()),
        progress=preparation if progress else None,
    )
    progress = progress and session.speaks  # under torchrun, rank 0 alone shows anything
    interrupts = _Interrupts()
    # Entered before the session, so left after it: a SIGTERM that arrives while the ranks leave
    # together is still one of the stop's copies, not an interruption of leaving.
    with interrupts, session as s:
        if s.finished:
            return TrainResult(s.step, 0, 0.0, 0.0, total=s.cfg.train.steps, run=s.cfg.run_dir, checkpoint_step=s.step)
        if on_start is not None:
            on_start(s)
        bar = training_progress(s.step, s.cfg.train.steps) if progress else None
        prompt = s.cfg.train.sample_prompt or s.corpus.sample_start.strip("\n")

        def sample_shown(step: int, text: str) -> None:
            bar.write(f"--- sample at step {step} ---\n{prompt + text}")

        saver = CheckpointSaver(s)
        try:
            # Opening the metrics log rewrites it on resume, which can fail (a disk still full): agreed,
            # so the other ranks stop with rank 0 instead of waiting for it at the first step.
            writers = distributed.agree(s.world, lambda: run_folder_listeners(s, saver, sample_shown if bar else None))
            trainer = Trainer(s, [*writers, *([bar] if bar else []), *listeners])
            if stop_when is not None:
                trainer.listeners.append(_StopWhen(stop_when, trainer.request_stop))
            interrupts.stop_with(trainer.request_stop)
            result = trainer.run()
            if result.stopped and s.world.distributed:
                # Perhaps at another rank's request, whose SIGTERM may still be on its way here.
                interrupts.terminating = True
        except OSError as exc:  # a full disk, a vanished folder: the last checkpoint was replaced atomically
            raise WriteFailed(str(exc.strerror or exc), s.cfg.run_dir, saver.last_step) from None
    failpoints.reach("train-end")
    result.run, result.checkpoint_step = s.cfg.run_dir, saver.last_step
    if result.diverged is not None:
        d = result.diverged
        raise DivergedError(
            "step {step}'s loss or gradient is not finite (loss {loss}, gradient norm {grad_norm}): it was "
            "not applied and training stopped; the last good checkpoint (step {last_step}) is intact in "
            "{run_dir}. {learner}Lower train.learning_rate (and train.muon_learning_rate, which Muon's matrices "
            "take){clip} and train again with {force:on}; {resume:on} retries from step {last_step} with the same "
            "settings",
            learner=divergence_hint(s.model),  # a learner's module: its file first
            clip=" or set train.grad_clip (for example 1.0)" if s.cfg.train.grad_clip == 0 else "",
            step=d.step,
            loss=d.loss,
            grad_norm=d.grad_norm,
            last_step=saver.last_step,
            run_dir=s.cfg.run_dir,
        )
    return result


class _StopWhen(Listener):
    """Asks `stop_when` after every step, and stops training at the first step it says True of."""

    def __init__(self, stop_when: Callable[[StepDone], bool], request_stop: Callable[[], None]):
        self.stop_when, self.request_stop = stop_when, request_stop

    def on_step(self, event: StepDone) -> None:
        if self.stop_when(event):
            self.request_stop()


class _Interrupts:
    """Ctrl-C and SIGTERM from the training loop on, through the ranks leaving together: the first
    asks for a stop at the next step boundary, with a checkpoint; a second Ctrl-C stops at once. A
    second SIGTERM never does: one stop arrives as several SIGTERMs, each at a moment of its own (a
    scheduler signals torchrun and every worker, and torchrun forwards its own copy to each), so a
    copy can come after the loop has stopped, even after train() has returned. Hence once a SIGTERM
    has arrived (or, under torchrun, the ranks have agreed to stop: perhaps for another rank's),
    leaving does not put back the caller's SIGTERM handler but one that ignores the copies: the
    process was asked to end, and a copy must not cut short its cleanup or its last message."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] | None = None  # the handlers replaced; None before stop_with
        self.asked: list[int] = []
        self.terminating = False  # copies of a SIGTERM may still come

    def stop_with(self, request_stop: Callable[[], None]) -> None:
        """From now on a signal calls `request_stop` (where handlers can be set: the main thread)."""
        self.request_stop = request_stop
        try:
            self.previous = {sig: signal.signal(sig, self._handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread (e.g. some test runners): leave Ctrl-C alone
            self.previous = None

    def _handler(self, signum, frame) -> None:
        if self.asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.asked.append(signum)
        self.terminating = self.terminating or signum == signal.SIGTERM
        self.request_stop()

    def __enter__(self) -> _Interrupts:
        return self

    def __exit__(self, *exc_info) -> None:
        if self.previous is None:
            return
        signal.signal(signal.SIGINT, self.previous[signal.SIGINT])
        signal.signal(signal.SIGTERM, _ignore_copy if self.terminating else self.previous[signal.SIGTERM])


def _ignore_copy(signum, frame) -> None:
    """SIGTERM once training has stopped on one: a copy of that request (see _Interrupts)."""
