"""The trainer: schedule, accumulation, clipping, the optimizer step and evaluation, emitting events.

    session = start(cfg, resume=..., force=...)   validate, build, create the run folder
    trainer = Trainer(session, listeners)          listeners: metrics log, checkpoints, progress, ...
    result = trainer.run()                         StepDone / EvalDone / CheckpointDue / StopRequested

`Trainer.train_step` is one optimizer step, the unit scripts/bench.py times. Nothing here prints or
exits: the command layer (commands/train.py) talks to the user and handles Ctrl-C by calling
`Trainer.request_stop`, which the loop honours at the next step boundary.

Exact resume: a checkpoint is only ever taken at a step boundary and holds the model, the optimizer,
the step and every RNG state (the batch generator included), so an interrupted and resumed run on
the CPU in float32 ends with bitwise identical weights.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from . import distributed, failpoints
from . import run as run_folder
from .config import Config
from .data import Batches, Corpus, load_corpus
from .device import autocast, available_memory, check_dtype, pick_device, pick_precision, use_threads
from .distributed import RefusedElsewhere, World
from .errors import MinigptError
from .events import CheckpointDue, Diverged, EvalDone, Listener, StepDone, StopRequested
from .generate import generate
from .model import MiniGPT, check_context
from .tokenizer import TextTokenizer


def learning_rate(step: int, cfg) -> float:
    """Linear warmup to `learning_rate` over `warmup_steps`, then cosine decay to `min_lr`, which the
    last step (steps - 1) uses."""
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - 1 - cfg.warmup_steps)  # the last step the loop runs is steps - 1
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def _adamw(params: list, cfg) -> torch.optim.AdamW:
    """Weight decay on matrices (dim >= 2: linear weights, token and position tables) only;
    biases and norm gains are not pulled towards zero."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


class Optimizers:
    """Several optimizers stepped, cleared, saved and restored as one (Muon beside AdamW)."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)


def make_optimizer(model: MiniGPT, cfg) -> torch.optim.Optimizer | Optimizers:
    """`adamw`: AdamW for everything. `muon`: Muon (momentum, then each update orthogonalised by
    Newton-Schulz iterations) for the weight matrices inside the blocks, whose updates it keeps
    well spread across directions; AdamW for the two tables, the head, gains and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return _adamw(params, cfg)
    if not hasattr(torch.optim, "Muon"):
        raise MinigptError(
            f'[train] optimizer = "muon" needs torch 2.9 or newer (this is {torch.__version__}); '
            f"upgrade torch, or use --set train.optimizer=adamw"
        )
    in_blocks = {id(p) for name, p in model.blocks.named_parameters() if p.dim() == 2}
    matrices = [p for p in params if id(p) in in_blocks]
    muon = torch.optim.Muon(
        matrices, lr=cfg.muon_learning_rate, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw"
    )
    for group in muon.param_groups:
        group["peak_lr"] = cfg.muon_learning_rate  # follows the schedule in proportion
    return Optimizers(muon, _adamw([p for p in params if id(p) not in in_blocks], cfg))


def rng_states(generator: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "batches": generator.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }


def restore_rng_states(states: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    generator.set_state(states["batches"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    kind, keys, *rest = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))


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


def estimate_seconds(model: MiniGPT, batch: tuple, tc, steps: int, precision: str = "float32") -> float:
    """Time one forward and backward pass (after one untimed warm-up, in the run's precision) on a
    validation batch and scale it to the run. Leaves no trace: gradients are cleared and the RNG
    state is restored, so a run that shows an estimate computes exactly what one that does not
    (`--quiet`) computes."""
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


# ---------------------------------------------------------------- a training session


@dataclass
class Session:
    """Everything one run trains with, validated and built; `step` is where it starts."""

    cfg: Config
    corpus: Corpus
    device: str
    model: MiniGPT
    optimizer: torch.optim.Optimizer | Optimizers
    generator: torch.Generator  # draws the training batches
    train_batches: Batches
    val_windows: list
    step: int = 0
    precision: str = "float32"  # what the forward and backward matmuls run in ([train] precision, resolved)
    resumed: bool = False
    notes: list[str] = field(default_factory=list)  # things worth telling the user, said by the command
    lock: run_folder.RunLock | None = None  # held while this session may write its run folder
    world: World = field(default_factory=World)  # this process's place in a data-parallel run
    forward_model: Any = None  # what the step calls: the model, or its DistributedDataParallel wrapper

    def close(self) -> None:
        """Release the run folder for the next writer."""
        if self.lock is not None:
            self.lock.release()

    @property
    def tokens_per_step(self) -> int:
        tc = self.cfg.train
        return tc.batch_size * tc.grad_accum * self.cfg.model.context * self.world.size

    @property
    def identity_cfg(self) -> Config:
        return global_batch_config(self.cfg, self.world)

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.train.steps

    def hashes(self) -> dict[str, str]:
        return {
            "config": run_folder.config_hash(run_folder.training_identity(self.identity_cfg)),
            "tokenizer": self.corpus.tokenizer.fingerprint(),
            "corpus": self.corpus.sha256,
        }

    def checkpoint(self, step: int) -> dict[str, Any]:
        """What a checkpoint at `step` holds: enough to continue bitwise where it stopped."""
        state = run_folder.model_payload(self.cfg, self.model)
        state.update(
            optimizer=self.optimizer.state_dict(),
            step=step,
            rng=rng_states(self.generator),
            hashes=self.hashes(),
            identity=run_folder.training_identity(self.identity_cfg),
        )
        return state


def global_batch_config(cfg: Config, world: World) -> Config:
    """What a run computes is fixed by its global batch (batch_size x world size): a 2-rank run of
    4 and a 1-process run of 8 are the same run, so identity and resume compare that."""
    if not world.distributed:
        return cfg
    return replace(cfg, train=replace(cfg.train, batch_size=cfg.train.batch_size * world.size))


def build(
    cfg: Config, corpus: Corpus, device: str = "cpu", payload: dict[str, Any] | None = None, world: World = World()
) -> Session:
    """Model, optimizer and batches for `cfg`, seeded; restored from a checkpoint payload if given."""
    tc = cfg.train
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
    # Each rank trains and evaluates on its rows of the batches one process with the global batch reads.
    train_batches = Batches(corpus.train_ids, cfg.model.context, tc.batch_size, device, world.rank, world.size)
    val_windows = Batches(corpus.val_ids, cfg.model.context, tc.batch_size, device, world.rank, world.size).fixed(
        tc.eval_batches
    )
    precision = pick_precision(tc.precision, device, cfg.model.dtype)
    return Session(
        cfg,
        corpus,
        device,
        model,
        optimizer,
        generator,
        train_batches,
        val_windows,
        step,
        precision,
        resumed=payload is not None,
        world=world,
        forward_model=model,
    )


def start(
    cfg: Config,
    resume: bool = False,
    force: bool = False,
    preparing: Callable[[str], ContextManager] = lambda message: nullcontext(),
    progress: Callable[[str, int], ContextManager] | None = None,
    world: World = World(),
) -> Session:
    """Check everything, then build the session and create (or reopen) the run folder `cfg.run_dir`
    with a loadable checkpoint in it. Nothing is written before every check has passed (on every
    rank, under torchrun). `preparing(message)` wraps the slow corpus preparation and
    `progress(label, total)` follows it (see data.load_corpus); the command shows both on a terminal."""
    run_dir = cfg.run_dir
    # The lock comes first, so a second trainer hears that the folder is busy, whatever its flags;
    # a folder whose parent does not exist yet is locked once the parent is made (after the checks).
    lock = run_folder.RunLock(run_dir) if world.is_main else None
    try:

        def check_and_prepare() -> Session:
            if run_dir.parent.is_dir():
                lock.acquire()
            run_folder.check_writable(run_dir, resume, force)
            return _prepare(cfg, resume, preparing, progress, world)

        session = distributed.agree(world, check_and_prepare if world.is_main else lambda: None)
        if world.distributed:
            session = _join(session, cfg, resume, world)
        distributed.agree(world, lambda: _open_folder(session, lock, force) if world.is_main else None)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    session.lock = lock
    if world.distributed:  # gradients averaged across ranks at each step
        session.forward_model = torch.nn.parallel.DistributedDataParallel(session.model)
    return session


def rank_device(name: str, world: World) -> str:
    """`[train] device` for this process: under torchrun each rank has its own GPU (LOCAL_RANK)."""
    device = pick_device(name)
    return f"cuda:{world.local_rank}" if world.distributed and device.startswith("cuda") else device


def _join(session: Session | None, cfg: Config, resume: bool, world: World) -> Session:
    """The other ranks build the session rank 0 prepared. Rank 0 sends its tokenizer, the text's
    sha256 and its starting state (a checkpoint payload), so no other rank reads the run folder,
    fits a tokenizer or needs rank 0's files: another machine needs only the same training text
    at the same path (its ids come from its own cache, or are encoded there once)."""
    sent = distributed.share(
        world,
        (
            shared_settings(cfg),
            session.corpus.tokenizer.to_str(),
            session.corpus.sha256,
            session.checkpoint(session.step),
        )
        if world.is_main
        else None,
    )

    def build_here() -> Session:
        settings, tokenizer_json, sha256, payload = sent
        differences = run_folder.sections_differences(shared_settings(cfg), settings)
        if differences:  # the ranks would train different runs, or wait on each other at different steps
            raise MinigptError(
                f"the config here differs from rank 0's ({'; '.join(differences)} (here != rank 0)); "
                f"launch every process with the same config file, --set values and flags"
            )
        corpus = load_corpus(cfg, fitted=(TextTokenizer.from_str(tokenizer_json), sha256))
        joined = _build_checked(cfg, corpus, payload, world)
        joined.resumed = resume
        return joined

    return distributed.agree(world, (lambda: session) if world.is_main else build_here)


# What each machine of a data-parallel run may set for itself; every other key must be rank 0's.
PER_MACHINE = {("train", k) for k in ("data", "out", "device", "threads")}


def shared_settings(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections every rank must agree on."""
    return run_folder.config_sections(cfg, PER_MACHINE)


def _prepare(
    cfg: Config,
    resume: bool,
    preparing: Callable[[str], ContextManager],
    progress: Callable[[str, int], ContextManager] | None,
    world: World = World(),
) -> Session:
    """Every check, the corpus and the built session; nothing in the run folder is touched."""
    tc = cfg.train
    run_dir = cfg.run_dir
    payload = run_folder.load_checkpoint(run_dir / run_folder.CHECKPOINT_FILE) if resume else None
    if payload is not None:
        run_folder.check_model_matches(cfg, payload, run_dir)

    notes: list[str] = []
    with preparing(f"preparing {tc.data} (tokenizer and token ids) ..."):
        corpus = load_corpus(cfg, on_status=notes.append, **({"progress": progress} if progress else {}))
    if payload is not None:
        run_folder.check_resume(
            payload, global_batch_config(cfg, world), corpus.tokenizer, corpus.sha256, corpus.path, world.size
        )

    if tc.sample_every:  # samples during training: a prompt the table cannot hold is refused, never cropped
        check_context(
            len(corpus.tokenizer.encode(tc.sample_prompt or "\n")),
            cfg.model.context,
            "[train] sample_prompt",
            "shorten it",
        )
    session = _build_checked(cfg, corpus, payload, world)
    session.notes = notes
    if cfg.tokenizer.kind == "bpe" and corpus.tokenizer.vocab_size < cfg.tokenizer.vocab_size:
        notes.append(
            f"note: BPE stopped at {corpus.tokenizer.vocab_size} ids, fewer than [tokenizer] vocab_size = "
            f"{cfg.tokenizer.vocab_size}: the training text has no more pairs to merge"
        )
    if tc.warmup_steps >= tc.steps:
        notes.append(
            f"note: warmup_steps = {tc.warmup_steps} is not below steps = {tc.steps}, so the learning "
            f"rate never reaches learning_rate = {tc.learning_rate} (set train.warmup_steps lower)"
        )
    return session


def _build_checked(cfg: Config, corpus: Corpus, payload: dict[str, Any] | None, world: World) -> Session:
    """The session on this rank's device, once the device can hold the model in its dtype."""
    device = rank_device(cfg.train.device, world)
    check_dtype(device, cfg.model.dtype)
    if world.distributed and device.startswith("cuda"):
        torch.cuda.set_device(device)  # NCCL talks to each rank's own GPU
    check_memory(cfg, corpus.tokenizer.vocab_size, device)
    use_threads(cfg.train.threads)
    return build(cfg, corpus, device, payload, world)


def _open_folder(session: Session, lock: run_folder.RunLock, force: bool) -> None:
    """Everything is validated: only now is the run folder created (or replaced), with the step-0
    checkpoint, or a resumed one cleared of a killed run's half-written files."""
    run_dir = session.cfg.run_dir
    if session.resumed:
        run_folder.remove_stale_temporaries(run_dir)
        run_folder.restore_missing(run_dir, session.cfg, session.corpus.tokenizer)
        return
    if lock.fd is None:  # the parent did not exist: create() makes it, then the lock is taken
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    run_folder.create(run_dir, force, session.cfg, session.corpus.tokenizer, session.checkpoint(0))


def training_bytes(cfg: Config, vocab_size: int) -> int:
    """About what training holds at once: parameters, gradients and optimizer state (two AdamW
    moments, or one Muon momentum), and one micro-batch's activations kept for the backward pass
    (per block and position: about 12 width-sized rows, 3 FFN-sized ones, the attention weights;
    then the logits three times over)."""
    m, tc = cfg.model, cfg.train
    with torch.device("meta"):  # counts the parameters without allocating them
        parameters = MiniGPT(m, vocab_size).num_parameters()
    width = DTYPE_BYTES[m.dtype]
    state = 2 if tc.optimizer == "adamw" else 1.5  # Muon's matrices keep one buffer, AdamW's rest two
    hidden = m.ffn_hidden * (5 if m.activation == "swiglu" else 3)
    per_position = m.n_layer * (12 * m.n_embd + hidden + 2 * m.n_head * m.context) + 3 * vocab_size
    return int(parameters * width * (2 + state) + tc.batch_size * m.context * per_position * width)


DTYPE_BYTES = {"float32": 4, "float64": 8}


def check_memory(cfg: Config, vocab_size: int, device: str) -> None:
    """Refuse a model that cannot fit before any of it is allocated."""
    available = available_memory(device)
    if available is None:
        return
    needed = training_bytes(cfg, vocab_size)
    if needed > available:
        raise MinigptError(
            f"this model needs about {needed / 2**30:,.1f} GiB to train (parameters, gradients, optimizer "
            f"state and one batch's activations) but {device} has {available / 2**30:,.1f} GiB available; "
            f"make [model] n_embd, ffn_hidden or n_layer, or [train] batch_size smaller"
        )


# ---------------------------------------------------------------- the loop


class CheckpointSaver(Listener):
    """Writes the session's checkpoint into its run folder whenever one is due; `last_step` is the
    step of the newest checkpoint on disk (where a resume would start)."""

    def __init__(self, session: Session):
        self.session = session
        self.last_step = session.step

    def on_checkpoint(self, event: CheckpointDue) -> None:
        path = self.session.cfg.run_dir / run_folder.CHECKPOINT_FILE
        run_folder.save_checkpoint(path, self.session.checkpoint(event.step))
        self.last_step = event.step


class Sampler(Listener):
    """Every `[train] sample_every` steps, a short continuation of `sample_prompt` from the model as
    it is, handed to `show(step, text)`. It draws from a generator of its own, seeded by the step,
    in eval mode and without gradients, so a run with samples computes exactly what one without
    does, and a resumed run shows the same samples."""

    def __init__(self, session: Session, show: Callable[[int, str], None]):
        self.session, self.show = session, show
        tc = session.cfg.train
        self.every, self.tokens = tc.sample_every, tc.sample_tokens
        self.prompt = session.corpus.tokenizer.encode(tc.sample_prompt or "\n")  # start() checked its length

    def on_step(self, event: StepDone) -> None:
        if not self.every or event.step % self.every:
            return
        s = self.session
        generator = torch.Generator(device=s.device).manual_seed(s.cfg.train.seed + event.step)
        s.model.eval()
        try:
            steps = generate(s.model, self.prompt, self.tokens, temperature=1.0, generator=generator)
            ids = [int(step.tokens[0]) for step in steps]
        finally:
            s.model.train()
        self.show(event.step, s.corpus.tokenizer.decode(ids))


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


class Trainer:
    def __init__(self, session: Session, listeners: Sequence[Listener] = ()):
        self.session = session
        self.listeners = list(listeners)
        self.stop_requested = False
        self.diverged: Diverged | None = None
        self.failure: Exception | None = None  # a listener's, raised at the step's end

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
        s.model.train()
        try:
            while s.step < tc.steps:
                loss, lr = self.train_step()
                if self.diverged is not None:
                    self._emit("on_diverged", self.diverged)
                    break
                step = s.step
                elapsed = time.perf_counter() - started
                tokens_per_s = (step - start_step) * s.tokens_per_step / max(elapsed, 1e-9)
                self._emit("on_step", StepDone(step, tc.steps, loss, lr, tokens_per_s, elapsed))
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
        )
