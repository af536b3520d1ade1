"""`minigpt train`: options -> the API's train (session, trainer, run folder, progress, Ctrl-C) ->
what happened, said once.

Before training it prints the session's notes and a one-line summary with an estimate; after it, the
result with the validation curve as a sparkline, or how to resume an interrupted run (Ctrl-C or
SIGTERM stop at the next step boundary, with a checkpoint; a second Ctrl-C stops at once, a second
SIGTERM is a copy of the first). The run folder describes itself, so the follow-up command shown is
`sample --run DIR`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import typer

from .. import api
from ..api import DivergedError, RankLost, RefusedElsewhere, WriteFailed, estimate_seconds
from ..errors import MinigptError
from .common import command_line, say, shown_path, transient, user_errors, wait_to_be_stopped
from .options_make import TrainOptions


def main(o: TrainOptions) -> None:
    before = _sigterm_interrupts()
    try:
        with user_errors():
            try:
                _train(o)
            except RefusedElsewhere:  # rank 0 prints the refusal; this rank stops with it, silently
                _after_rank_0()
                raise typer.Exit(2) from None
    finally:
        if before is not None and signal.getsignal(signal.SIGTERM) is _interrupt:
            signal.signal(signal.SIGTERM, before)
        elif before is not None:
            # A SIGTERM stopped training, and more copies of it may come (see api/training.py) while the
            # process ends. SIG_IGN rather than the Python handler training left: the interpreter
            # drops Python handlers early in its shutdown, and a copy arriving after that would
            # turn exit status 130 into death by signal.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _after_rank_0() -> None:
    """On a rank that leaves a failure to rank 0 to say: wait for rank 0 to say it, where one
    torchrun launched both (rank 0 is on this machine: GROUP_RANK 0), since that torchrun stops the
    two together. Another machine's torchrun does not stop this one when rank 0 fails."""
    if not api.speaks() and os.environ.get("GROUP_RANK", "0") == "0":
        wait_to_be_stopped()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _sigterm_interrupts():
    """Before the training loop, SIGTERM stops the command as Ctrl-C does, through its cleanup (the
    run folder's lock is removed, nothing half-made stays), instead of killing the process where it
    stands. Returns the handler it replaced (None off the main thread, where none can be set)."""
    try:
        return signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:
        return None


def _train(o: TrainOptions) -> None:
    speaks = api.speaks()  # under torchrun only rank 0 talks to the user
    quiet = o.quiet or not speaks
    started = []  # the session, once it has started
    try:
        result = api.train(
            **o.config_values()["train"],
            **o.config_values()["model"],  # --exercise
            config=o.config,
            set=o.overrides,
            resume=o.resume,
            force=o.force,
            trust_exercise=o.trust_exercise,
            progress=not quiet,
            on_start=lambda session: (_announce(session, quiet), started.append(session)),
            preparing=lambda message: transient(message, quiet),
        )
    except (RankLost, DivergedError) as exc:  # rank 0 says it; the others stop with it
        if speaks:
            raise
        _after_rank_0()
        raise typer.Exit(exc.exit_code) from None
    except WriteFailed as exc:  # said with the command that resumes
        raise WriteFailed(exc.reason, exc.run, exc.checkpoint_step, resume_with=_resume_command(o)) from None
    if result.total == 0:  # steps = 0: the model as initialised, for reading it before any update
        say(f"trained 0 steps: {result.run} holds the initial weights (step 0), as [model] init drew them", quiet)
        return
    if result.steps_taken == 0 and not result.stopped:
        say(f"run in {result.run} already finished {result.step} steps; nothing to do", quiet)
        return
    if result.stopped:
        say(
            f"interrupted at step {result.step}/{result.total}; checkpoint saved in {result.run}. "
            f"Resume with: {_resume_command(o)}",
            quiet=not speaks,
        )
        raise typer.Exit(130)
    if quiet:  # the summary reads the metrics log: rank 0's alone
        return
    val = f"{result.val_loss:.4f} nats/token = {result.val_bpb:.4f} bits/byte" if result.val_loss is not None else "n/a"
    say(
        f"done: {result.steps_taken} steps in {_seconds(result.seconds)} ({result.tokens_per_s:,.0f} tokens/s); "
        f"val loss {val}; run folder {result.run}\n"
        f"{_val_curve(result.run)}{_next_commands(result.run, started[0] if started else None)}"
    )


def _next_commands(run: Path, session) -> str:
    """What to run next: a sample of Shakespeare's kind, or, for prompt/answer examples, the
    accuracy and a greedy answer to the first held-out prompt."""
    shown = shown_path(run)
    if session is None or not hasattr(session.corpus, "held_out"):  # a text
        return f'sample with: {command_line("minigpt", "sample", "--run", shown)} -p "ROMEO:"'
    prompt = session.corpus.sample_start
    return (
        f"accuracy with: {command_line('minigpt', 'eval', '--run', shown)}\n"
        f"answer with: {command_line('minigpt', 'sample', '--run', shown, '-p', prompt, '--greedy', '--stop', '.')}"
        if session.corpus.task is not None
        else f"accuracy with: {command_line('minigpt', 'eval', '--run', shown, '--data', str(session.corpus.path))}"
    )


def _announce(session, quiet: bool) -> None:
    """Before the first step: what the session noticed, and the run in one line with an estimate."""
    tc = session.cfg.train
    for note in session.notes:
        say(note, quiet)
    if quiet:
        return
    estimate = _seconds(estimate_seconds(session, steps=tc.steps - session.step))
    corpus = session.corpus
    trainable = sum(p.numel() for p in session.model.parameters() if p.requires_grad)
    frozen = session.model.num_parameters() - trainable
    sizes = (
        f"{frozen:,} parameters frozen, {trainable:,} of LoRA adapters trained"
        if frozen
        else (f"{trainable:,} parameters")
    )
    say(
        f"minigpt train: {sizes}, {corpus.summary} "
        f"({corpus.tokenizer.vocab_size} ids), "
        f"{session.tokens_per_step:,} tokens/step, steps {session.step}->{tc.steps} on {session.device} "
        f"({_chosen(session.choices(), tc.threads == 0, session.resumed)}), about {estimate}; run folder "
        f"{session.cfg.run_dir}"
    )


def _chosen(choices: dict, timed: bool = False, resumed: bool = False) -> str:
    """What the optimizer, precision and threads came to ("auto" and "threads = 0" resolved; every
    checkpoint records them, so `minigpt info` says them for a run trained with --quiet too).
    `timed`: threads = 0, whose count a busy machine can make fewer than its cores; `resumed`: the
    count is then the one the checkpoint records, not a new timing."""
    from ..device import default_threads

    n, cores = choices["threads"], default_threads()
    threads = f", {n} thread{'s' if n != 1 else ''}" if choices["device"] == "cpu" else ""
    why = "kept from its checkpoint" if resumed else "the machine is busy"
    threads += f" of {cores} cores ({why})" if threads and timed and n < cores else ""
    return f"{choices['optimizer']}, {choices['precision']} matmuls{threads}"


def _resume_command(o: TrainOptions) -> str:
    """What continues this run: the same command with --resume, under the same kind of launch."""
    again = ["-c", o.config] if o.config else []
    again += [a for override in o.overrides for a in ("--set", override)]
    again += o.config_flag_words()
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return command_line("minigpt", "train", *again, "--resume")
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    if per_machine == size:  # one machine: the whole launch can be written out
        return command_line(
            "torchrun", "--standalone", f"--nproc_per_node={per_machine}", "-m", "minigpt", "train", *again, "--resume"
        )
    return (
        f"the same torchrun launch on every machine, of: {command_line('-m', 'minigpt', 'train', *again, '--resume')}"
    )


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """One character per value, its height between the lowest and the highest."""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(SPARKS[round((v - low) / span * (len(SPARKS) - 1))] for v in values)


def _val_curve(run_dir: Path) -> str:
    """The validation loss of every evaluation so far, as a sparkline (a curve without matplotlib)."""
    try:
        evals = api.metrics(run_dir)["eval"]
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
