"""A training session's whole lifetime, owned here and entered as a context manager:

    with TrainingSession(read_config, resume=..., force=...) as session:
        result = Trainer(session, listeners).run()

Entering: torchrun's ranks join (a world of one without torchrun), every rank reads the config
(agreed: a mistake is said once), the run folder is locked, everything is checked (the folder, the
text, a resume's identity, the memory the model needs), the corpus is prepared, the starting
weights are chosen (fresh, or the checkpoint of a resumed run), and only then the run folder is
created or reopened with a loadable checkpoint in it; under torchrun the model is wrapped for
data parallelism. Leaving: the wrapper goes, the lock is released, and the ranks leave their
process group together when they ended together. Nothing here prints, exits or handles signals:
the command does that, from what the session and the trainer return or raise.

Exact resume: a checkpoint is only ever taken at a step boundary and holds the model, the
optimizer, the step and every RNG state (the batch generator included), so an interrupted and
resumed run on the CPU in float32 ends with bitwise identical weights.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from .. import memory
from ..config import Config
from ..device import check_dtype, default_threads, pick_device, use_threads
from ..errors import MinigptError
from ..model import lora
from ..model.gpt import MiniGPT, Parts, check_context
from ..runs import checkpoints, folder, identity, reading
from ..runs import exercise as exercises
from ..runs.lock import RunLock
from ..text import sources
from ..text.corpus import Batches, Corpus, load_corpus
from ..text.examples import ExampleBatches, Examples
from ..text.tokenizer import TextTokenizer
from . import checks, distributed, measured, threads
from .distributed import RankLost, World
from .optimizers import Optimizers, make_optimizer
from .starting import Origin, model_rows, restore_rng_states, rng_states, starting_point


class TrainingSession:
    """Everything a run trains with, from the first check to the last exchange between ranks.

    `config`: the Config, or a function that reads it (called on every rank, agreed, so a mistake
    in it stops every rank with one line). `preparing(message)` wraps the slow corpus preparation
    and `progress(label, total)` follows it (see data.load_corpus); a command shows both."""

    def __init__(
        self,
        config: Config | Callable[[], Config],
        *,
        resume: bool = False,
        force: bool = False,
        trust_exercise: bool = False,
        preparing: Callable[[str], ContextManager] = lambda message: nullcontext(),
        progress: Callable[[str, int], ContextManager] | None = None,
    ):
        self.config, self.resume, self.force, self.trust_exercise = config, resume, force, trust_exercise
        self.preparing, self.progress = preparing, progress
        self.world: World | None = None
        self.session: Session | None = None

    @property
    def speaks(self) -> bool:
        """Whether this process talks to the user (under torchrun, rank 0 alone)."""
        return distributed.speaks()

    def __enter__(self) -> Session:
        self.world = distributed.from_environment()
        try:
            cfg = distributed.agree(self.world, self.config) if callable(self.config) else self.config
            self.session = _open(
                cfg, Asked(self.resume, self.force, self.trust_exercise), self.preparing, self.progress, self.world
            )
        except BaseException as exc:
            self._leave(exc)
            raise
        return self.session

    def __exit__(self, kind, exc, traceback) -> None:
        if self.session is not None:
            self.session.forward_model = None  # the DDP wrapper goes before its process group
            self.session.close()
        lost = self.world is not None and distributed.lost_contact(self.world, exc)
        self._leave(exc)
        if lost:
            raise RankLost(
                "another rank of this torchrun job stopped without warning (its process ended or its machine "
                "went away), so this one stops too; that rank's output says why. Once training has begun the run "
                "folder's last checkpoint is intact: fix the cause, then run the same launch with {resume:on} "
                "(before that, nothing was written: run it again as it was)"
            ) from exc

    def _leave(self, exc: BaseException | None) -> None:
        """Leave the process group: after a barrier when every rank ended at the same point (done,
        or stopped by a refusal or a write failure they all agreed on), at once otherwise."""
        if self.world is not None:
            distributed.finish(self.world, together=exc is None or isinstance(exc, (MinigptError, OSError)))
            self.world = None


@dataclass
class Session:
    """Everything one run trains with, validated and built; `step` is where it starts."""

    cfg: Config
    corpus: Corpus | Examples  # a text's token ids, or prompt/answer examples (a task, a .jsonl file)
    device: str
    model: MiniGPT
    optimizer: torch.optim.Optimizer | Optimizers
    generator: torch.Generator  # draws the training batches
    train_batches: Batches | ExampleBatches
    val_windows: list
    step: int = 0
    precision: str = "float32"  # what the forward and backward matmuls run in ([train] precision, resolved)
    resumed: bool = False
    notes: list[str] = field(default_factory=list)  # things worth telling the user, said by the command
    lock: RunLock | None = None  # held while this session may write its run folder
    world: World = field(default_factory=World)  # this process's place in a data-parallel run
    forward_model: Any = None  # what the step calls: the model, or its DistributedDataParallel wrapper
    origin: Origin | None = None  # the run a fine-tune started from; None for fresh weights
    threads: int | None = None  # with [train] threads = 0 on a CPU: the count the run trains at, recorded
    auto: measured.Auto | None = None  # what `auto` came to and the figures measured for it

    def close(self) -> None:
        """Release the run folder for the next writer."""
        if self.lock is not None:
            self.lock.release()

    @property
    def tokens_per_step(self) -> int:
        tc = self.cfg.train
        return tc.batch_size * tc.grad_accum * self.corpus.row_tokens(self.cfg.model.context) * self.world.size

    @property
    def identity_cfg(self) -> Config:
        return global_batch_config(self.cfg, self.world)

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.train.steps

    def choices(self) -> dict[str, Any]:
        """What `auto` and `threads = 0` came to for this session (the run's config says what was
        asked): the optimizer built, the matmul precision, torch's CPU threads, the device. Every
        checkpoint records them (`minigpt info` shows them) and `train` says them before the first step."""
        return {
            "optimizer": "muon" if isinstance(self.optimizer, Optimizers) else "adamw",
            "precision": self.precision,
            "threads": torch.get_num_threads(),
            "device": self.device,
        }

    def hashes(self) -> dict[str, str]:
        return {
            "config": identity.config_hash(identity.training_identity(self.identity_cfg)),
            "tokenizer": self.corpus.tokenizer.fingerprint(),
            "corpus": self.corpus.sha256,
        }

    def checkpoint(self, step: int) -> dict[str, Any]:
        """What a checkpoint at `step` holds: enough to continue bitwise where it stopped."""
        state = checkpoints.model_payload(self.cfg, self.model, tokenizer_size=self.corpus.tokenizer.vocab_size)
        state.update(
            optimizer=self.optimizer.state_dict(),
            step=step,
            rng=rng_states(self.generator),
            hashes=self.hashes(),
            identity=identity.training_identity(self.identity_cfg),
            # Every file's name and sha256, so a refused resume can say which file changed.
            corpus_files=[list(f) for f in self.corpus.files],
        )
        if self.origin is not None:
            state["origin"] = asdict(self.origin)
        if self.threads is not None:  # a resume continues at the count the steps so far ran at
            state["threads"] = self.threads
        state["choices"] = self.choices()  # what `auto` chose, in the run folder whether or not it was said
        if self.auto is not None and self.auto.figures:
            state["measured"] = self.auto.figures  # and what it measured to choose so
        return state


def global_batch_config(cfg: Config, world: World) -> Config:
    """What a run computes is fixed by its global batch (batch_size x world size): a 2-rank run of
    4 and a 1-process run of 8 are the same run, so identity and resume compare that."""
    if not world.distributed:
        return cfg
    return replace(cfg, train=replace(cfg.train, batch_size=cfg.train.batch_size * world.size))


def build(
    cfg: Config,
    corpus: Corpus,
    device: str = "cpu",
    payload: dict[str, Any] | None = None,
    world: World = World(),
    weights: dict[str, torch.Tensor] | None = None,
    origin: Origin | None = None,
    parts: Parts | None = None,
) -> Session:
    """Model, optimizer and batches for `cfg`, seeded; restored from a checkpoint payload if given,
    or starting from `weights` (a fine-tune's: the model's state, with a fresh optimizer). With
    `[train] lora_rank`, the weights are frozen and adapters of the `origin` checkpoint train (a
    resumed LoRA run reads that base again: its checkpoint holds the adapters alone)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    if payload is not None and "lora" in payload:
        weights = reading.model_state(reading.base_weights(payload["lora"]["base"]))
    model = MiniGPT(cfg.model, model_rows(corpus, payload, weights), parts).to(device)  # parts: a learner's module
    model.recompute = tc.recompute
    if weights is not None:
        model.load_state_dict(weights)
    if tc.lora_rank:
        base = payload["lora"]["base"] if payload is not None else asdict(origin)
        lora.attach(model, lora.settings_of(tc, base))
    row_tokens = corpus.row_tokens(cfg.model.context)
    auto = measured.decide(cfg, model, row_tokens, device, payload, learner=parts is not None)
    optimizer = make_optimizer(model, tc, row_tokens, auto.optimizer, auto.ns_dtype)
    generator = torch.Generator().manual_seed(tc.seed)
    step = 0
    if payload is not None:
        if tc.lora_rank:
            lora.load_adapters(model, payload["model"])
        else:
            model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        restore_rng_states(payload["rng"], generator)
        step = payload["step"]
    # Each rank trains and evaluates on its rows of the batches one process with the global batch reads.
    train_batches = corpus.training_batches(cfg.model.context, tc.batch_size, device, world.rank, world.size)
    val_windows = corpus.validation_windows(
        cfg.model.context, tc.batch_size, device, world.rank, world.size, tc.eval_batches
    )
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
        auto.precision,
        resumed=payload is not None,
        world=world,
        forward_model=model,
        auto=auto,
    )


@dataclass(frozen=True)
class Asked:
    """What the user asked of the run folder and of a learner's file: continue the run, replace it,
    run an exercise file that lies inside a run folder."""

    resume: bool = False
    force: bool = False
    trust_exercise: bool = False


def _open(
    cfg: Config,
    asked: Asked,
    preparing: Callable[[str], ContextManager],
    progress: Callable[[str, int], ContextManager] | None,
    world: World,
) -> Session:
    """Check everything, then build the session and create (or reopen) the run folder `cfg.run_dir`
    with a loadable checkpoint in it. Nothing is written before every check has passed (on every
    rank, under torchrun)."""
    run_dir = cfg.run_dir
    # The lock comes first, so a second trainer hears that the folder is busy, whatever its flags;
    # a folder whose parent does not exist yet is locked once the parent is made (after the checks).
    lock = RunLock(run_dir) if world.is_main else None
    try:

        def check_and_prepare() -> Session:
            if run_dir.parent.is_dir():
                lock.acquire()
            folder.check_writable(run_dir, asked.resume, asked.force, checks.read_sources(cfg))
            return _prepare(cfg, asked, preparing, progress, world)

        session = distributed.agree(world, check_and_prepare if world.is_main else lambda: None)
        if world.distributed:
            session = _join(session, cfg, asked, world)
        distributed.agree(world, lambda: _open_folder(session, lock) if world.is_main else None)
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


def _join(session: Session | None, cfg: Config, asked: Asked, world: World) -> Session:
    """The other ranks build the session rank 0 prepared. Rank 0 sends its tokenizer, the names and
    sha256s of its training files and its starting state (a checkpoint payload), so no other rank
    reads the run folder, fits a tokenizer or needs rank 0's files: another machine needs only the
    same training files at the same path (its ids come from its own cache, or are encoded there once)."""
    sent = distributed.share(
        world,
        (
            shared_settings(cfg),
            (session.cfg.model, session.cfg.tokenizer),
            session.corpus.tokenizer.to_str(),
            session.corpus.files,
            session.checkpoint(session.step),
        )
        if world.is_main
        else None,
    )

    def build_here() -> Session:
        settings, (model, tokenizer), tokenizer_json, files, payload = sent
        differences = identity.sections_differences(shared_settings(cfg), settings)
        if differences:  # the ranks would train different runs, or wait on each other at different steps
            raise MinigptError(
                "the config here differs from rank 0's ({join} (here != rank 0)); launch every process with the "
                "same config file, {set} values and options",
                join="; ".join(differences),
            )
        here = replace(cfg, model=model, tokenizer=tokenizer)  # a fine-tune's, from the run it starts from
        corpus = load_corpus(here, tokenizer=TextTokenizer.from_str(tokenizer_json), same_as=files)
        parts = exercises.training_parts(here, payload, asked.trust_exercise)
        joined = _build_checked(here, corpus, payload, world, parts=parts)
        joined.resumed = asked.resume
        joined.origin = Origin(**payload["origin"]) if "origin" in payload else None
        return joined

    return distributed.agree(world, (lambda: session) if world.is_main else build_here)


# What each machine of a data-parallel run may set for itself; every other key must be rank 0's.
PER_MACHINE = {("train", k) for k in ("data", "out", "device", "threads", "adaptive_threads")}


def shared_settings(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections every rank must agree on."""
    return identity.config_sections(cfg, PER_MACHINE)


def _prepare(
    cfg: Config,
    asked: Asked,
    preparing: Callable[[str], ContextManager],
    progress: Callable[[str, int], ContextManager] | None,
    world: World = World(),
) -> Session:
    """Every check, the corpus and the built session; nothing in the run folder is touched."""
    start = starting_point(cfg, asked.resume)
    cfg, payload, origin, weights, tokenizer = start.cfg, start.payload, start.origin, start.weights, start.tokenizer
    checks.check_trainable(cfg)
    tc = cfg.train
    # A learner's module (an exercise): refused unless its file passes every check (and, resumed, is
    # unchanged), before the text is prepared.
    parts = exercises.training_parts(cfg, payload, asked.trust_exercise)

    notes: list[str] = [] if parts is None else [exercises.learner_note(parts)]  # which learner's file runs
    with preparing(f"preparing {sources.describe(tc.data)} (tokenizer and token ids) ..."):
        corpus = load_corpus(
            cfg, on_status=notes.append, tokenizer=tokenizer, **({"progress": progress} if progress else {})
        )
    if payload is not None:
        identity.check_resume(payload, global_batch_config(cfg, world), corpus.tokenizer, corpus, world.size)

    if tc.sample_every:  # samples during training: a prompt the table cannot hold is refused, never cropped
        check_context(
            len(corpus.tokenizer.encode(tc.sample_prompt or corpus.sample_start)),
            cfg.model.context,
            "[train] sample_prompt",
            "shorten it",
            positions=cfg.model.positions,
        )
    session = _build_checked(cfg, corpus, payload, world, weights=weights, origin=origin, parts=parts)
    session.notes, session.origin = notes, origin
    if origin is None and cfg.tokenizer.kind == "bpe" and corpus.tokenizer.vocab_size < cfg.tokenizer.vocab_size:
        notes.append(
            f"note: BPE stopped at {corpus.tokenizer.vocab_size} ids, fewer than [tokenizer] vocab_size = "
            f"{cfg.tokenizer.vocab_size}: the training text has no more pairs to merge"
        )
    notes += session.auto.notes
    here = default_threads()
    if session.resumed and session.threads not in (None, here) and not tc.adaptive_threads:
        # A run from a machine with other cores: bitwise by default, and the user may prefer speed.
        notes.append(
            f"note: continuing on the {session.threads} thread{'s' if session.threads != 1 else ''} this run "
            f"trained at (one per core here: {here}), so that it computes what the run would have; set "
            f"train.threads={here} to trade that for speed"
        )
    if tc.warmup_steps >= tc.steps:
        notes.append(
            f"note: warmup_steps = {tc.warmup_steps} is not below steps = {tc.steps}, so the learning "
            f"rate never reaches learning_rate = {tc.learning_rate} (set train.warmup_steps lower)"
        )
    return session


def _build_checked(
    cfg: Config,
    corpus: Corpus,
    payload: dict[str, Any] | None,
    world: World,
    weights: dict[str, torch.Tensor] | None = None,
    origin: Origin | None = None,
    parts: Parts | None = None,
) -> Session:
    """The session on this rank's device, once the device can hold the model in its dtype."""
    device = rank_device(cfg.train.device, world)
    check_dtype(device, cfg.model.dtype)
    if world.distributed and device.startswith("cuda"):
        torch.cuda.set_device(device)  # NCCL talks to each rank's own GPU
    check_memory(cfg, model_rows(corpus, payload, weights), device)
    use_threads(cfg.train.threads)
    session = build(cfg, corpus, device, payload, world, weights=weights, origin=origin, parts=parts)
    # A learner's module, first: at the run's batch, forward and backward, said as its file's fault.
    exercises.try_training_batch(session.model, session.val_windows, cfg.train.batch_size, session.precision)
    checks.check_first_pass(session.model, session.val_windows, session.precision)
    if cfg.train.threads == 0 and device == "cpu" and not world.distributed:
        session.threads, note = threads.starting_count(session, payload, default_threads())
        session.auto.notes += [note] if note else []
    return session


def _open_folder(session: Session, lock: RunLock) -> None:
    """Everything is validated: only now is the run folder created (or replaced), with the step-0
    checkpoint, or a resumed one cleared of a killed run's half-written files."""
    run_dir = session.cfg.run_dir
    if session.resumed:
        folder.remove_stale_temporaries(run_dir)
        folder.restore_missing(run_dir, session.cfg, session.corpus.tokenizer)
        return
    if lock.fd is None:  # the parent did not exist: create() makes it, then the lock is taken
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    folder.create(run_dir, session.cfg, session.corpus.tokenizer, session.checkpoint(0))


def check_memory(cfg: Config, vocab_size: int, device: str) -> None:
    """Refuse a model that cannot be trained here before any of it is allocated."""
    memory.check_memory(
        memory.training_bytes(
            cfg.model,
            vocab_size,
            cfg.train.batch_size,
            cfg.train.optimizer,
            (cfg.train.lora_rank, cfg.train.lora_targets) if cfg.train.lora_rank else None,
            cfg.train.recompute,
        ),
        device,
        "training this model (parameters, gradients, optimizer state and one batch's activations)",
        "make [model] n_embd, ffn_hidden or n_layer, or [train] batch_size smaller",
    )
