"""`minigpt train`: options -> a training session -> a trainer with listeners -> a summary.

The listeners this command attaches: the metrics log and checkpoints (the run folder), a progress
bar, and Ctrl-C, which asks the trainer to stop at the next step boundary (a second Ctrl-C stops
at once). The run folder describes itself, so the follow-up command shown is `sample --run DIR`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from .. import distributed
from ..config import load_config
from ..device import keep_freed_memory
from ..distributed import RankLost, RefusedElsewhere
from ..errors import MinigptError, option
from ..events import EvalDone, Listener, StepDone
from ..run import METRICS_FILE, BestKeeper, MetricsLog, read_metrics
from ..session import TrainingSession
from ..train import CheckpointSaver, Sampler, Trainer, TrainResult, estimate_seconds
from .common import command_line, refuse, say, shown_path, user_errors
from .options import TrainOptions, config_flags


class _WriteFailed(MinigptError):
    """The run folder could not be written mid-run (a full disk); its last checkpoint stands."""

    exit_code = 1


def main(o: TrainOptions) -> None:
    before = _sigterm_interrupts()
    try:
        with user_errors():
            try:
                _train(o)
            except RefusedElsewhere:  # rank 0 printed the refusal; this rank stops with it, silently
                raise typer.Exit(2) from None
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _sigterm_interrupts():
    """Before the training loop, SIGTERM stops the command as Ctrl-C does, through its cleanup (the
    run folder's lock is removed, nothing half-made stays), instead of killing the process where it
    stands. Returns the handler it replaced (None off the main thread, where none can be set)."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        return None


def _read_config(o: TrainOptions):
    if o.resume and o.force:
        raise MinigptError(
            f"{option('resume')} and {option('force')} contradict each other; {option('resume')} continues a run, "
            f"{option('force')} replaces it"
        )
    return load_config(o.config, o.overrides, config_flags(o))


def _train(o: TrainOptions) -> None:
    keep_freed_memory()  # fewer fresh pages per step: see device.py
    quiet = o.quiet
    session = TrainingSession(
        lambda: _read_config(o),
        resume=o.resume,
        force=o.force,
        preparing=lambda message: _transient(quiet, message),
        progress=lambda label, total: _progress(quiet, label, total),
    )
    quiet = quiet or not session.speaks  # one voice: rank 0's (the callbacks above read it when called)
    try:
        with session as s:
            if s.finished:
                say(f"run in {s.cfg.run_dir} already finished {s.step} steps; nothing to do", quiet)
                return
            result, last_checkpoint = _run(s, o, quiet)
    except RankLost as exc:  # rank 0 says it; the others stop with it
        if session.speaks:
            raise
        raise typer.Exit(exc.exit_code) from None
    _report(result, s, o, last_checkpoint=last_checkpoint, quiet=quiet)


def _run(session, o: TrainOptions, quiet: bool) -> tuple[TrainResult, int]:
    """Train with the listeners this command attaches; the result and the step of the newest
    checkpoint on disk."""
    cfg, tc = session.cfg, session.cfg.train
    run_dir = cfg.run_dir
    for note in session.notes:
        say(note, quiet)
    if not quiet:
        estimate = _seconds(estimate_seconds(session, steps=tc.steps - session.step))
        say(
            f"minigpt train: {session.model.num_parameters():,} parameters, "
            f"{len(session.corpus.train_ids):,} train / "
            f"{len(session.corpus.val_ids):,} val tokens ({session.corpus.tokenizer.vocab_size} ids), "
            f"{session.tokens_per_step:,} tokens/step, steps {session.step}->{tc.steps} on {session.device}, "
            f"about {estimate}; run folder {run_dir}"
        )
    saver = CheckpointSaver(session)
    bar = ProgressBar(session.step, tc.steps, quiet)

    def run_folder_writers() -> list[Listener]:
        if not session.world.is_main:  # only rank 0 writes the run folder
            return []
        metrics = MetricsLog(
            run_dir / METRICS_FILE, tc.log_interval, keep_through_step=session.step if session.resumed else None
        )

        def show(step: int, text: str) -> None:
            metrics.write({"step": step, "sample": text})
            if not quiet:
                bar.bar.write(f"--- sample at step {step} ---\n{(tc.sample_prompt or '') + text}", file=sys.stderr)

        return [metrics, saver, BestKeeper(run_dir, cfg, session.model), Sampler(session, show)]

    try:
        # Opening the metrics log rewrites it on resume, which can fail (a disk still full): agreed,
        # so the other ranks stop with rank 0 instead of waiting for it at the first step.
        writers = distributed.agree(session.world, run_folder_writers)
        trainer = Trainer(session, [*writers, bar])
        with _ctrl_c_stops(trainer.request_stop):
            result = trainer.run()
    except OSError as exc:  # a full disk, a vanished folder: the last checkpoint was replaced atomically, so it stands
        raise _WriteFailed(
            f"could not write to the run folder {run_dir} ({exc.strerror or exc}); its last checkpoint (step "
            f"{saver.last_step}) is intact: make room, then resume with: {_resume_command(session.world, o)}"
        ) from None
    return result, saver.last_step


def _report(result: TrainResult, session, o: TrainOptions, *, last_checkpoint: int, quiet: bool) -> None:
    """How the run ended, said once (by rank 0): a divergence or a stop, or the summary."""
    tc, run_dir, main = session.cfg.train, session.cfg.run_dir, session.world.is_main
    if result.diverged is not None:
        if not main:  # every rank stops; rank 0 says why
            raise typer.Exit(1)
        d = result.diverged
        refuse(
            f"step {d.step}'s loss or gradient is not finite (loss {d.loss}, gradient norm {d.grad_norm}): "
            f"it was not applied "
            f"and training stopped; the last good checkpoint (step {last_checkpoint}) is intact in {run_dir}. Lower "
            f"train.learning_rate or set train.grad_clip (for example 1.0) and train again with --force; "
            f"--resume retries from step {last_checkpoint} with the same settings",
            code=1,
        )
    if result.stopped:
        say(
            f"interrupted at step {result.step}/{tc.steps}; checkpoint saved in {run_dir}. "
            f"Resume with: {_resume_command(session.world, o)}",
            quiet=not main,
        )
        raise typer.Exit(130)
    if quiet:  # the summary reads the metrics log: rank 0's alone
        return
    val = f"{result.val_loss:.4f} nats/token = {result.val_bpb:.4f} bits/byte" if result.val_loss is not None else "n/a"
    say(
        f"done: {result.steps_taken} steps in {_seconds(result.seconds)} ({result.tokens_per_s:,.0f} tokens/s); "
        f"val loss {val}; run folder {run_dir}\n"
        f"{_val_curve(run_dir)}"
        f'sample with: {command_line("minigpt", "sample", "--run", shown_path(run_dir))} -p "ROMEO:"'
    )


def _resume_command(world: distributed.World, o: TrainOptions) -> str:
    """What continues this run: the same command with --resume, under the same kind of launch."""
    again = ["-c", o.config] if o.config else []
    again += [a for override in o.overrides for a in ("--set", override)]
    again += (["--data", o.data] if o.data else []) + (["--out", o.out] if o.out else [])
    again += (["--init-from", o.init_from] if o.init_from else []) + (
        ["--init-checkpoint", o.init_checkpoint] if o.init_checkpoint else []
    )
    again += ["--steps", o.steps] if o.steps is not None else []
    if not world.distributed:
        return command_line("minigpt", "train", *again, "--resume")
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    if per_machine == world.size:  # one machine: the whole launch can be written out
        return command_line(
            "torchrun", "--standalone", f"--nproc_per_node={per_machine}", "-m", "minigpt", "train", *again, "--resume"
        )
    return (
        f"the same torchrun launch on every machine, of: {command_line('-m', 'minigpt', 'train', *again, '--resume')}"
    )


class ProgressBar(Listener):
    """tqdm on stderr: step, loss, last validation loss, tokens/s and the time left."""

    def __init__(self, initial: int, total: int, quiet: bool):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=quiet,
            unit="step",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )
        self.val: float | None = None
        self.last: StepDone | None = None

    def on_step(self, event: StepDone) -> None:
        self.last = event
        self._show()
        self.bar.update(1)

    def on_eval(self, event: EvalDone) -> None:
        self.val = event.val_loss
        self._show()

    def _show(self) -> None:
        e = self.last
        shown = [f"loss {e.loss:.3f}"] if e is not None else []  # a fine-tune is evaluated before its first step
        shown += [f"val {self.val:.3f}"] if self.val is not None else []
        shown += [f"{e.tokens_per_s:,.0f} tok/s"] if e is not None else []
        self.bar.set_postfix_str(", ".join(shown), refresh=False)

    def close(self) -> None:
        self.bar.close()


@contextmanager
def _ctrl_c_stops(request_stop) -> Iterator[None]:
    """Ctrl-C or SIGTERM asks for a stop at the next step boundary, with a checkpoint; a second
    Ctrl-C stops at once. A second SIGTERM never does: a scheduler may signal torchrun and every
    worker together, and torchrun forwards its own to each worker, so one stop arrives twice."""
    asked = []

    def handler(signum, frame):
        if asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        asked.append(signum)
        request_stop()

    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread (e.g. some test runners): leave Ctrl-C alone
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def _transient(quiet: bool, message: str) -> Iterator[None]:
    """Say what a slow step is doing on a terminal, then erase the line, so that what stays on the
    screen (a refusal above all) is unchanged. Off a terminal nothing is written."""
    show = not quiet and sys.stderr.isatty()
    if show:
        sys.stderr.write(message + "\r")
        sys.stderr.flush()
    try:
        yield
    finally:
        if show:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# Texts shorter than this are prepared in a few seconds: the transient status line is enough.
PROGRESS_FROM_CHARACTERS = 5_000_000


@contextmanager
def _progress(quiet: bool, label: str, total: int) -> Iterator:
    """A progress bar over the characters of a large text while it is tokenized."""
    if quiet or total < PROGRESS_FROM_CHARACTERS:
        yield lambda n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=label, unit="char", unit_scale=True, dynamic_ncols=True, leave=False) as bar:
        yield bar.update


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """One character per value, its height between the lowest and the highest."""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARKS[round((v - low) / span * (len(SPARKS) - 1))] for v in values)


def _val_curve(run_dir: Path) -> str:
    """The validation loss of every evaluation so far, as a sparkline (a curve without matplotlib)."""
    try:
        evals = read_metrics(run_dir)["eval"]
    except MinigptError:
        return ""
    if len(evals) < 2:
        return ""
    return (
        f"val loss by evaluation: {sparkline([r['val_loss'] for r in evals])}  {evals[0]['val_loss']:.3f} at step "
        f"{evals[0]['step']} -> {evals[-1]['val_loss']:.3f} at step {evals[-1]['step']}\n"
    )


def _seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
