"""The Python API, the layer the commands stand on: training a run, and a run opened for reading.

    result = minigpt.train(data="my.txt", out="runs/mine", steps=200, set={"model.n_layer": 2})
    minigpt.train(data="books/", out="runs/books")      # every *.txt under a folder (or a list of paths)
    run = minigpt.load("runs/default")                 # or checkpoint="best"
    run.sample("ROMEO:", max_new_tokens=100, seed=1)    # the text; num_samples=3 gives a list
    run.trace("ROMEO:")                                 # a Trace, as `minigpt trace --json` prints
    run.trace("ROMEO:", scale={"0.attention": 0.0})     # a Comparison, as `trace --compare`
    run.eval("my.txt")                                  # Scores: bits per byte, perplexity, surprisal

Refusals are `MinigptError`s with the messages the command line prints (parameters named as the
arguments here, where the command line names its flags); nothing here prints or exits. A method
computes where `[train] device` says, on `[train] threads` threads: one for a single sample and for
a trace when threads is 0, as the commands do, since their matmuls are too small to share.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .config import Config, SampleConfig, load_config, updated
from .device import keep_freed_memory, pick_device, use_threads
from .errors import MinigptError, option
from .inspection import interventions as edits
from .inspection.scoring import Scores, score
from .inspection.trace import Comparison, Trace, parse_ids, prompt_ids, trace_position
from .inspection.trace import compare as compare_passes
from .model.gpt import MiniGPT
from .runs.reading import load_model, reading_config
from .sampling.generate import SampleResult, complete
from .text.reading import read_text
from .text.tokenizer import TextTokenizer
from .training import distributed
from .training.events import Listener
from .training.listeners import CheckpointSaver, run_folder_listeners
from .training.progress import TrainingProgress, preparation
from .training.session import Session, TrainingSession
from .training.trainer import DivergedError, Trainer, TrainResult, WriteFailed

# What `sample` takes, beside the prompt: the [sample] keys a call may set.
SAMPLE_SETTINGS = tuple(f.name for f in fields(SampleConfig) if f.name != "prompt")


def train(
    data: str | Path | Sequence[str | Path] | None = None,
    out: str | Path | None = None,
    steps: int | None = None,
    *,
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
    init_from: str | Path | None = None,
    init_checkpoint: str | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    listeners: Sequence[Listener] = (),
    on_start: Callable[[Session], None] | None = None,
    preparing: Callable[[str], AbstractContextManager] | None = None,
) -> TrainResult:
    """Train a run: `config` (default: the shipped configs/default.toml) with `set` overrides, on
    `data` (a text file, a folder of *.txt files, or a list of them), into the run folder `out`,
    for `steps` steps; `init_from` a run folder fine-tunes it
    (`init_checkpoint` "last" or "best"); `resume` continues the run in `out`, `force` replaces it.
    `progress` shows a bar (a widget in a notebook) and the samples of `[train] sample_every`;
    `listeners` hear every event (events.py); `on_start(session)` is called once everything is
    checked, before the first step (the command prints its summary there). Interrupting (Ctrl-C, or
    a notebook's stop button) finishes the step, saves a checkpoint and returns with `stopped`;
    `resume=True` continues. Returns the TrainResult (`result.run` is the folder to load)."""
    given = {"data": data, "out": out, "steps": steps, "init_from": init_from, "init_checkpoint": init_checkpoint}
    train_keys = {key: _plain(value) for key, value in given.items() if value is not None}

    def read_config() -> Config:
        if resume and force:
            raise MinigptError(
                f"{option('resume')} and {option('force')} contradict each other; {option('resume')} continues a "
                f"run, {option('force')} replaces it"
            )
        cfg = load_config(config, overrides(set), {"train": train_keys})
        if cfg.train.tensorboard:
            from .training.tensorboard import require

            require()  # before anything is written
        return cfg

    keep_freed_memory()  # fewer fresh pages per step: see device.py
    session = TrainingSession(
        read_config,
        resume=resume,
        force=force,
        preparing=preparing or (lambda message: nullcontext()),
        progress=preparation if progress else None,
    )
    progress = progress and session.speaks  # under torchrun, rank 0 alone shows anything
    with session as s:
        if s.finished:
            return TrainResult(s.step, 0, 0.0, 0.0, total=s.cfg.train.steps, run=s.cfg.run_dir, checkpoint_step=s.step)
        if on_start is not None:
            on_start(s)
        bar = TrainingProgress(s.step, s.cfg.train.steps) if progress else None
        prompt = s.cfg.train.sample_prompt

        def sample_shown(step: int, text: str) -> None:
            bar.write(f"--- sample at step {step} ---\n{prompt + text}")

        saver = CheckpointSaver(s)
        try:
            # Opening the metrics log rewrites it on resume, which can fail (a disk still full): agreed,
            # so the other ranks stop with rank 0 instead of waiting for it at the first step.
            writers = distributed.agree(s.world, lambda: run_folder_listeners(s, saver, sample_shown if bar else None))
            trainer = Trainer(s, [*writers, *([bar] if bar else []), *listeners])
            with _interrupt_stops(trainer.request_stop):
                result = trainer.run()
        except OSError as exc:  # a full disk, a vanished folder: the last checkpoint was replaced atomically
            raise WriteFailed(str(exc.strerror or exc), s.cfg.run_dir, saver.last_step) from None
    result.run, result.checkpoint_step = s.cfg.run_dir, saver.last_step
    if result.diverged is not None:
        d = result.diverged
        raise DivergedError(
            f"step {d.step}'s loss or gradient is not finite (loss {d.loss}, gradient norm {d.grad_norm}): it was not "
            f"applied and training stopped; the last good checkpoint (step {saver.last_step}) is intact in "
            f"{s.cfg.run_dir}. Lower train.learning_rate or set train.grad_clip (for example 1.0) and train again "
            f"with {option('force')}; {option('resume')} retries from step {saver.last_step} with the same settings"
        )
    return result


def _plain(value: Any) -> Any:
    """A path as the text config reads, a list of paths (several `data`) as a list of texts."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return str(value) if isinstance(value, Path) else value


@contextmanager
def _interrupt_stops(request_stop: Callable[[], None]) -> Iterator[None]:
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


def load(
    path: str | Path | None = None,
    *,
    checkpoint: str = "last",
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
) -> Run:
    """Open a run folder for reading. `path` alone: the run describes itself (its config.toml).
    `config` alone: that TOML file and the run folder it names; both: the file's [sample], device
    and threads for the run at `path`. `set` overrides config keys ({"sample.top_k": 5} or
    ["sample.top_k=5"]). `checkpoint`: "last" or "best" (the weights at the lowest validation loss).
    The model is built from the [model] section its checkpoint stores."""
    cfg, run_dir = reading_config(config, path, overrides(set))
    model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device), checkpoint)
    return Run(Path(run_dir), cfg, model, tokenizer, checkpoint)


def overrides(values: Mapping[str, Any] | Sequence[str]) -> list[str]:
    """{"model.n_layer": 2} or ["model.n_layer=2"] as the `section.key=value` texts config reads."""
    if isinstance(values, Mapping):
        return [f"{key}={_toml(value)}" for key, value in values.items()]
    return [str(v) for v in values]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class Run:
    """A trained (or imported) model with its tokenizer and resolved config, ready to use."""

    path: Path
    cfg: Config
    model: MiniGPT
    tokenizer: TextTokenizer
    checkpoint: str = "last"

    def __repr__(self) -> str:
        m = self.model.cfg
        return (
            f"Run({str(self.path)!r}, {self.model.num_parameters():,} parameters: {m.n_layer} blocks, "
            f"{m.n_head} heads, width {m.n_embd}, context {m.context}, {self.model.vocab_size} tokens)"
        )

    # ------------------------------------------------------------ sampling

    def sample(self, prompt: str = "", **settings: Any) -> str | list[str]:
        """The prompt continued, as `minigpt sample` prints it (prompt and completion). Settings
        are the [sample] keys but the prompt (`max_new_tokens`, `temperature`, `seed`, ...: every
        field of config.SampleConfig), defaulting to the run's config, each checked as a config
        file's would be; with num_samples > 1 the result is a list."""
        results = self.samples(prompt, **settings)
        texts = [result.text for result in results]
        return texts if len(texts) > 1 else texts[0]

    def samples(
        self,
        prompt: str = "",
        *,
        on_text: Callable[[str], None] | None = None,
        use_cache: bool = True,
        **settings: Any,
    ) -> list[SampleResult]:
        """Every sample with its token ids, probabilities and stop reason. With one sample,
        `on_text` is handed the text as it is produced (the prompt first)."""
        unknown = sorted(set(settings) - set(SAMPLE_SETTINGS))
        if unknown:
            raise MinigptError(f"sample settings {', '.join(unknown)} are unknown; use: {', '.join(SAMPLE_SETTINGS)}")
        given = {key: value for key, value in settings.items() if value is not None}
        s = updated(self.cfg, {"sample": given}).sample
        # One sample at a time is a chain of tiny matmuls: a second thread only adds waiting (and
        # stalls badly when another process is busy), so `threads = 0` means one thread here.
        use_threads(self.cfg.train.threads or (1 if s.num_samples == 1 else 0))
        return complete(self.model, self.tokenizer, prompt, s, on_text=on_text, use_cache=use_cache)

    # ------------------------------------------------------------ tracing

    def trace(
        self,
        prompt: str | None = None,
        *,
        ids: Sequence[int] | str | None = None,
        position: int | None = None,
        block: int | None = None,
        top: int = 5,
        scale: Mapping[str, float] | Sequence[str] = (),
        replace_residual: Sequence[int | str] = (),
        ablate_head: Sequence[str] = (),
        set_input: Sequence[float] | str | None = None,
        at_position: bool = False,
        compare: bool | None = None,
    ) -> Trace | Comparison:
        """One position (default: the last) followed through every block of one forward pass.
        Interventions change stages of that same pass: `scale` {"0.attention": 0.0} (or
        ["all.ffn=0.5"]), `replace_residual` [0] (or ["all"]), `ablate_head` ["0.1"], `set_input`
        [2, 2, 2, 2]; `at_position` applies the first three at the traced position only. With any
        intervention the result is a Comparison of both passes (`compare=False`: the modified
        Trace alone)."""
        if (prompt is None) == (ids is None):
            raise MinigptError(
                f"give the tokens to trace with exactly one of {option('prompt')} TEXT or {option('ids')} 3,1,4"
            )
        changes = edits.parse(
            scale=[f"{k}={v}" for k, v in scale.items()] if isinstance(scale, Mapping) else list(scale),
            replace_residual=[str(b) for b in replace_residual],
            ablate_head=[str(h) for h in ablate_head],
            set_input=set_input if isinstance(set_input, str) or set_input is None else ",".join(map(str, set_input)),
        )
        if compare and not changes:
            raise MinigptError(
                f"{option('compare')} needs at least one intervention ({option('scale')}, "
                f"{option('replace_residual')}, {option('ablate_head')} or {option('set_input')}) to compare with"
            )
        token_ids = (
            parse_ids(ids)
            if isinstance(ids, str)
            else list(ids)
            if ids is not None
            else prompt_ids(self.tokenizer, prompt)
        )
        use_threads(self.cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        if changes and compare is not False:
            return compare_passes(
                self.model,
                self.tokenizer,
                token_ids,
                changes,
                position=position,
                block=block,
                top=top,
                only_at_position=at_position,
            )
        return trace_position(
            self.model,
            self.tokenizer,
            token_ids,
            position=position,
            block=block,
            top=top,
            interventions=changes,
            only_at_position=at_position,
        )

    # ------------------------------------------------------------ scoring

    def eval(self, data: str | Path) -> Scores:
        """Every token of a UTF-8 text file scored once, with at least half a table of left context."""
        text, _ = read_text(data, what="text to score")
        use_threads(self.cfg.train.threads)
        ids = self.tokenizer.encode(text)  # a char tokenizer names the characters it never saw
        if len(ids) < 2:
            raise MinigptError(
                f"text to score {data} has {len(ids)} token(s); scoring needs at least two "
                f"(the first token has no prediction)"
            )
        return score(self.model, ids, len(text.encode("utf-8")), writable=self.tokenizer.vocab_size)
