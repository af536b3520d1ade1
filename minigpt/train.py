"""The training loop: AdamW, warmup + cosine schedule, evaluation, progress, checkpoints, resume.

Exact resume: a checkpoint is only ever taken at a step boundary and holds the model, the optimizer,
the step and every RNG state (the batch generator included). Ctrl-C sets a flag that the loop reads
between steps, so an interrupted run saves the same state an uninterrupted one passes through, and
resuming on the CPU in float32 ends with bitwise identical weights.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import checkpoint as ckpt
from .config import Config, model_section_differences
from .data import Batches, Corpus, load_corpus
from .device import pick_device, use_threads
from .errors import MinigptError
from .model import MiniGPT


def learning_rate(step: int, cfg) -> float:
    """Linear warmup to `learning_rate` over `warmup_steps`, then cosine decay to `min_lr`, which the
    last step (steps - 1) uses."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - 1 - cfg.warmup_steps)  # the last step the loop runs is steps - 1
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def make_optimizer(model: MiniGPT, cfg) -> torch.optim.AdamW:
    """Weight decay on matrices (dim >= 2: linear weights, token and position tables) only;
    biases and norm gains are not pulled towards zero."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


def rng_states(generator: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(), "batches": generator.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "python": random.getstate(),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}


def restore_rng_states(states: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    generator.set_state(states["batches"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    kind, keys, *rest = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))


@torch.no_grad()
def evaluate(model: MiniGPT, windows: list, tokens_per_byte: float) -> dict[str, float]:
    """Mean next-token loss over the fixed validation windows, in nats per token and bits per byte
    (nats/token x tokens/byte / ln 2: comparable across tokenizers)."""
    was_training = model.training
    model.eval()
    total = sum(model(x, y)[1].item() for x, y in windows) / len(windows)
    model.train(was_training)
    return {"val_loss": total, "val_bpb": total * tokens_per_byte / math.log(2)}


def estimate_seconds(model: MiniGPT, batch: tuple, tc, steps: int) -> float:
    """Time one forward and backward pass (after one untimed warm-up) on a validation batch and scale
    it to the run. Leaves no trace: gradients are cleared and the RNG state is restored, so a run
    that prints an estimate computes exactly what one that does not (`--quiet`) computes."""
    x, y = batch
    with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
        seconds = 0.0
        for _ in range(2):
            started = time.perf_counter()
            model(x, y)[1].backward()
            seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    evaluations = steps // tc.eval_interval + 1
    # An evaluation is forward passes only, about a third of a forward and backward pass.
    return seconds * (steps * tc.grad_accum + evaluations * tc.eval_batches / 3)


class StopFlag:
    """Ctrl-C asks the loop to stop at the next step boundary; a second Ctrl-C stops at once."""

    def __init__(self):
        self.requested = False

    @contextmanager
    def installed(self):
        def handler(signum, frame):
            if self.requested:
                raise KeyboardInterrupt
            self.requested = True
        try:
            previous = signal.signal(signal.SIGINT, handler)
        except ValueError:  # not the main thread (e.g. some test runners): leave Ctrl-C alone
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


@contextmanager
def _transient_status(quiet: bool, message: str):
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


def _format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _prepare_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to overwrite or to resume nothing, and prove the folder can be written, before any
    expensive work and before anything is written."""
    try:
        _check_run_dir(run_dir, resume, force)
    except OSError as exc:  # e.g. a name too long for the file system, a folder under /proc
        raise MinigptError(f"run folder {run_dir} cannot be used ({exc.strerror or exc}); choose another --out") from None


def _check_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    has_run = run_dir.is_dir() and any(run_dir.iterdir())
    if resume and not (run_dir / ckpt.CHECKPOINT_FILE).is_file():
        raise MinigptError(f"--resume: no checkpoint in {run_dir}; train without --resume first")
    if has_run and not resume and not force:
        raise MinigptError(f"run folder {run_dir} already holds a run; pass --resume to continue it, "
                           f"--force to replace it, or --out to choose another folder")
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError(f"run folder {run_dir} is a file; choose another --out")
    probe = run_dir if run_dir.exists() else next(p for p in run_dir.parents if p.exists())
    if not probe.is_dir() or not _writable(probe):
        raise MinigptError(f"run folder {run_dir} cannot be written ({probe} is not writable); choose another --out")


def _create_run_dir(run_dir: Path, force: bool, config_text: str, tokenizer_text: str) -> None:
    """Make (or, with --force, replace) the run folder and write what never changes during the run.
    A failure here removes what it made, so no half-written run is left behind."""
    created = not run_dir.exists()
    try:
        if force and not created:
            shutil.rmtree(run_dir)
            created = True
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_write_text(run_dir / ckpt.CONFIG_FILE, config_text)
        ckpt.atomic_write_text(run_dir / ckpt.TOKENIZER_FILE, tokenizer_text)
    except OSError as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise MinigptError(f"run folder {run_dir} cannot be written ({exc.strerror or exc}); "
                           f"choose another --out") from None


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _check_resume(payload: dict[str, Any], cfg: Config, corpus: Corpus) -> None:
    stored = payload["identity"]
    now = ckpt.training_identity(cfg)
    if ckpt.config_hash(now) != payload["hashes"]["config"]:
        diffs = [f"[{s}] {d}" for s in now for d in model_section_differences(now[s], stored.get(s, {}))]
        advice = "resume with the same config file, --set values and flags"
        if [d for d in diffs if not d.startswith("[train] steps:")] == []:
            advice = ("a run's schedule is fixed by its steps (the cosine reaches min_lr on the last one), so a "
                      "run cannot be lengthened; train a new run with more --steps (--force or another --out)")
        raise MinigptError(f"--resume refused: the config differs from the checkpoint's "
                           f"({'; '.join(diffs)} (now != checkpoint)); {advice}")
    if corpus.tokenizer.fingerprint() != payload["hashes"]["tokenizer"]:
        raise MinigptError("--resume refused: the tokenizer differs from the one the checkpoint was trained "
                           "with (tokenizer.json hash changed); start a new run with --force or another --out")
    if corpus.sha256 != payload["hashes"]["corpus"]:
        raise MinigptError(f"--resume refused: the corpus {corpus.path} differs from the one the checkpoint was "
                           f"trained on (sha256 {corpus.sha256[:12]}... != {payload['hashes']['corpus'][:12]}...); "
                           f"resume with the original text")


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed as written, so a crash loses at most a line."""

    def __init__(self, path: Path, keep_through_step: int | None):
        self.path = path
        if keep_through_step is not None and path.exists():
            # A run that crashed after its last checkpoint logged steps the resume will redo.
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= keep_through_step]
            ckpt.atomic_write_text(path, "".join(line + "\n" for line in kept))
        self.file = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_training(cfg: Config, resume: bool = False, force: bool = False, quiet: bool = False,
                 resume_command: str = "minigpt train --resume",
                 sample_command: str = "minigpt sample") -> dict[str, Any]:
    """Train as `cfg` says and return the final metrics. Writes the run folder `cfg.run_dir`.
    The two commands are shown to the user: how to resume after Ctrl-C, how to sample when done."""
    tc = cfg.train
    run_dir = cfg.run_dir
    _prepare_run_dir(run_dir, resume, force)
    payload = ckpt.load_checkpoint(run_dir / ckpt.CHECKPOINT_FILE) if resume else None
    if payload is not None:
        ckpt.check_model_matches(cfg, payload, run_dir)

    notes: list[str] = []  # shown once every check has passed, so a refusal stays one line
    with _transient_status(quiet, f"preparing {cfg.train.data} (tokenizer and token ids) ..."):
        corpus = load_corpus(cfg, on_status=notes.append)
    if payload is not None:
        _check_resume(payload, cfg, corpus)

    device = pick_device(tc.device)
    use_threads(tc.threads)
    torch.manual_seed(tc.seed)
    model = MiniGPT(cfg.model, corpus.tokenizer.vocab_size).to(device)
    optimizer = make_optimizer(model, tc)
    generator = torch.Generator().manual_seed(tc.seed)
    step = 0
    if payload is not None:
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        restore_rng_states(payload["rng"], generator)
        step = payload["step"]
    hashes = {"config": ckpt.config_hash(ckpt.training_identity(cfg)),
              "tokenizer": corpus.tokenizer.fingerprint(), "corpus": corpus.sha256}

    # Everything is validated: only now is the run folder created or replaced.
    if payload is None:
        _create_run_dir(run_dir, force, cfg.to_toml(), corpus.tokenizer.to_str())
    if cfg.tokenizer.kind == "bpe" and corpus.tokenizer.vocab_size < cfg.tokenizer.vocab_size:
        notes.append(f"note: BPE stopped at {corpus.tokenizer.vocab_size} ids, fewer than [tokenizer] vocab_size = "
                     f"{cfg.tokenizer.vocab_size}: the training text has no more pairs to merge")
    if tc.warmup_steps >= tc.steps:
        notes.append(f"note: warmup_steps = {tc.warmup_steps} is not below steps = {tc.steps}, so the learning "
                     f"rate never reaches learning_rate = {tc.learning_rate} (set train.warmup_steps lower)")

    train_batches = Batches(corpus.train_ids, cfg.model.context, tc.batch_size, device)
    val_windows = Batches(corpus.val_ids, cfg.model.context, tc.batch_size, device).fixed(tc.eval_batches)
    tokens_per_step = tc.batch_size * tc.grad_accum * cfg.model.context

    def save(at_step: int) -> None:
        state = ckpt.model_payload(cfg, model)
        state.update(optimizer=optimizer.state_dict(), step=at_step, rng=rng_states(generator),
                     hashes=hashes, identity=ckpt.training_identity(cfg))
        ckpt.save_checkpoint(run_dir / ckpt.CHECKPOINT_FILE, state)

    if payload is None:
        save(0)  # a run folder always holds a loadable checkpoint
    if step >= tc.steps:
        _say(quiet, f"run in {run_dir} already finished {step} steps; nothing to do")
        return {"step": step}

    for note in notes:
        _say(quiet, note)
    if not quiet:
        estimate = _format_seconds(estimate_seconds(model, val_windows[0], tc, tc.steps - step))
        _say(quiet, f"minigpt train: {model.num_parameters():,} parameters, {len(corpus.train_ids):,} train / "
                    f"{len(corpus.val_ids):,} val tokens ({corpus.tokenizer.vocab_size} ids), {tokens_per_step:,} "
                    f"tokens/step, steps {step}->{tc.steps} on {device}, about {estimate}; run folder {run_dir}")

    metrics = MetricsLog(run_dir / ckpt.METRICS_FILE, keep_through_step=step if payload is not None else None)
    stop = StopFlag()
    from tqdm import tqdm

    bar = tqdm(total=tc.steps, initial=step, disable=quiet, unit="step", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
    started, start_step = time.perf_counter(), step
    last_val = None
    model.train()
    try:
        with stop.installed():
            while step < tc.steps:
                lr = learning_rate(step, tc)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                total = 0.0
                for _ in range(tc.grad_accum):
                    x, y = train_batches.sample(generator)
                    _, loss = model(x, y)
                    (loss / tc.grad_accum).backward()
                    total += loss.item() / tc.grad_accum
                if tc.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1

                elapsed = time.perf_counter() - started
                tokens_per_s = (step - start_step) * tokens_per_step / max(elapsed, 1e-9)
                if step % tc.log_interval == 0 or step == tc.steps:
                    metrics.write({"step": step, "loss": total, "lr": lr, "tokens_per_s": round(tokens_per_s, 1),
                                   "elapsed_s": round(elapsed, 3)})
                if step % tc.eval_interval == 0 or step == tc.steps:
                    last_val = evaluate(model, val_windows, corpus.val_tokens_per_byte)
                    metrics.write({"step": step, "eval": True, **last_val})
                if step % tc.checkpoint_interval == 0 or step == tc.steps:
                    save(step)
                postfix = f"loss {total:.3f}" + (f", val {last_val['val_loss']:.3f}" if last_val else "")
                bar.set_postfix_str(f"{postfix}, {tokens_per_s:,.0f} tok/s", refresh=False)
                bar.update(1)
                if stop.requested and step < tc.steps:
                    save(step)
                    bar.close()
                    _say(False, f"interrupted at step {step}/{tc.steps}; checkpoint saved in {run_dir}. "
                                f"Resume with: {resume_command}")
                    raise SystemExit(130)
    finally:
        bar.close()
        metrics.close()

    elapsed = time.perf_counter() - started
    result = {"step": step, "seconds": elapsed,
              "tokens_per_s": (step - start_step) * tokens_per_step / max(elapsed, 1e-9), **(last_val or {})}
    _say(quiet, f"done: {step - start_step} steps in {_format_seconds(elapsed)} "
                f"({result['tokens_per_s']:,.0f} tokens/s); val loss {result.get('val_loss', float('nan')):.4f} "
                f"nats/token = {result.get('val_bpb', float('nan')):.4f} bits/byte; run folder {run_dir}\n"
                f"sample with: {sample_command} -p \"ROMEO:\"")
    return result
