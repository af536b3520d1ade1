"""The Python API, the layer the commands stand on: training a run, and a run opened for reading.

    result = minigpt.train(data="my.txt", out="runs/mine", steps=200, set={"model.n_layer": 2})
    minigpt.train(data="books/", out="runs/books")      # every *.txt under a folder (or a list of paths)
    run = minigpt.load("runs/default")                 # or checkpoint="best"
    run.sample("ROMEO:", max_new_tokens=100, seed=1)    # the text; num_samples=3 gives a list
    run.trace("ROMEO:")                                 # a Trace, as `minigpt trace --json` prints
    run.trace("ROMEO:", grad=True).gradient             # d loss / d row of every stage, as `trace --grad`
    run.trace("ROMEO:", scale={"0.attention": 0.0})     # a Comparison, as `trace --compare`
    run.trace("ROMEO:", compare_run="origin")           # what fine-tuning changed: its origin run, then it
    run.attribute("ROMEO:", " the", versus=" a")        # the logit difference as a sum of parts
    run.patch("ROMEO: I", "JULIET: I", " am", " will")  # activation patching between two prompts
    run.eval("my.txt")                                  # Scores: bits per byte, perplexity, surprisal
    run.accuracy()                                      # a task run's held-out exact-match accuracy
    run.export("safetensors", "out/")                   # or "hf": a GPT-2 folder transformers loads
    minigpt.api.import_hf("gpt2/", "runs/gpt2")         # a GPT-2 folder (or import_nanogpt) as a run
    minigpt.api.metrics("runs/mine")                    # the metrics log: training and evaluation records

Refusals are `MinigptError`s with the messages the command line prints (parameters named as the
arguments here, where the command line names its flags); nothing here prints or exits. The command
line stands on this module alone (and on the text and picture renderers of minigpt.inspection), so
the errors a caller may catch are importable from here too. A method
computes where `[train] device` says, on `[train] threads` threads: one for a single sample and for
a trace when threads is 0, as the commands do, since their matmuls are too small to share.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from . import failpoints
from .config import Config, SampleConfig, load_config, updated
from .device import keep_freed_memory, pick_device, use_threads
from .errors import MinigptError, Phrase, parameter
from .inspection import attribution, patching
from .inspection import interventions as edits
from .inspection.accuracy import Accuracy, accuracy
from .inspection.attribution import Attribution, check_decomposable
from .inspection.patching import Patching
from .inspection.scoring import Scores, score
from .inspection.trace import Comparison, Trace, put_back, shape_differences, tokens_to_trace, trace_position
from .inspection.trace import compare as compare_passes
from .interchange import convert, hf, nanogpt, peft
from .interchange import export as exporting
from .io import no_progress
from .model.gpt import MiniGPT
from .runs.folder import check_new_run
from .runs.metrics import read_metrics
from .runs.origin import origin_run
from .runs.reading import NotARun, load_model, read_weights, reading_config
from .sampling.generate import SampleResult, complete, generate
from .text.pairs import encode_pairs, is_pairs, pair_examples, read_pairs
from .text.reading import read_text
from .text.tasks import task_examples
from .text.tokenizer import TextTokenizer
from .training import distributed
from .training.distributed import RankLost, RefusedElsewhere, speaks
from .training.events import Listener
from .training.listeners import CheckpointSaver, run_folder_listeners
from .training.progress import TrainingProgress, preparation, task
from .training.session import Session, TrainingSession
from .training.trainer import DivergedError, Trainer, TrainResult, WriteFailed, estimate_seconds

__all__ = [
    "Accuracy",
    "Attribution",
    "Comparison",
    "DivergedError",
    "MinigptError",
    "Patching",
    "RankLost",
    "RefusedElsewhere",
    "Run",
    "Scores",
    "Trace",
    "TrainResult",
    "WriteFailed",
    "estimate_seconds",
    "export",
    "import_hf",
    "import_nanogpt",
    "load",
    "metrics",
    "read_prompt",
    "speaks",
    "train",
]

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
    task: str | None = None,
    task_length: int | None = None,
    resume: bool = False,
    force: bool = False,
    progress: bool = True,
    listeners: Sequence[Listener] = (),
    on_start: Callable[[Session], None] | None = None,
    preparing: Callable[[str], AbstractContextManager] | None = None,
) -> TrainResult:
    """Train a run: `config` (default: the shipped configs/default.toml) with `set` overrides, on
    `data` (a text file, a folder of *.txt files, a list of them, or a .jsonl file of prompt/completion
    pairs), or on a generated `task` ("reverse", "sort", "copy", "add"; `task_length` its size), into
    the run folder `out`, for `steps` steps; `init_from` a run folder fine-tunes it
    (`init_checkpoint` "last" or "best"); `resume` continues the run in `out`, `force` replaces it.
    `progress` shows a bar (a widget in a notebook) and the samples of `[train] sample_every`;
    `listeners` hear every event (events.py); `on_start(session)` is called once everything is
    checked, before the first step (the command prints its summary there). Interrupting (Ctrl-C, a
    notebook's stop button, or SIGTERM) finishes the step, saves a checkpoint and returns with
    `stopped`; `resume=True` continues. After a SIGTERM the process ignores SIGTERM (the copies a
    scheduler and torchrun send of that one request), so it ends on its own. Returns the
    TrainResult (`result.run` is the folder to load)."""
    given = {"data": data, "out": out, "steps": steps, "init_from": init_from, "init_checkpoint": init_checkpoint}
    given |= {"task": task, "task_length": task_length}
    train_keys = {key: _plain(value) for key, value in given.items() if value is not None}

    def read_config() -> Config:
        if resume and force:
            raise MinigptError(
                "{resume:on} and {force:on} contradict each other; {resume:on} continues a run, {force:on} replaces it"
            )
        cfg = load_config(config, overrides(set), {"train": train_keys})
        if not cfg.train.recompute:  # recompute asks for memory: freed blocks go back to the system
            keep_freed_memory()  # fewer fresh pages per step: see device.py
        if cfg.train.tensorboard:
            from .training.tensorboard import require

            require()  # before anything is written
        return cfg

    session = TrainingSession(
        read_config,
        resume=resume,
        force=force,
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
        bar = TrainingProgress(s.step, s.cfg.train.steps) if progress else None
        prompt = s.cfg.train.sample_prompt or s.corpus.sample_start.strip("\n")

        def sample_shown(step: int, text: str) -> None:
            bar.write(f"--- sample at step {step} ---\n{prompt + text}")

        saver = CheckpointSaver(s)
        try:
            # Opening the metrics log rewrites it on resume, which can fail (a disk still full): agreed,
            # so the other ranks stop with rank 0 instead of waiting for it at the first step.
            writers = distributed.agree(s.world, lambda: run_folder_listeners(s, saver, sample_shown if bar else None))
            trainer = Trainer(s, [*writers, *([bar] if bar else []), *listeners])
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
            "{run_dir}. Lower train.learning_rate (and train.muon_learning_rate, which Muon's matrices take){clip} "
            "and train again with {force:on}; {resume:on} retries from step {last_step} with the same settings",
            clip=" or set train.grad_clip (for example 1.0)" if s.cfg.train.grad_clip == 0 else "",
            step=d.step,
            loss=d.loss,
            grad_norm=d.grad_norm,
            last_step=saver.last_step,
            run_dir=s.cfg.run_dir,
        )
    return result


def _changes(scale, replace_residual, ablate_head, set_input) -> list:
    """Interventions as the API takes them (a mapping or texts, numbers or texts), parsed."""
    return edits.parse(
        scale=[f"{k}={v}" for k, v in scale.items()] if isinstance(scale, Mapping) else list(scale),
        replace_residual=[str(b) for b in replace_residual],
        ablate_head=[str(h) for h in ablate_head],
        set_input=set_input if isinstance(set_input, str) or set_input is None else ",".join(map(str, set_input)),
    )


def _plain(value: Any) -> Any:
    """A path as the text config reads, a list of paths (several `data`) as a list of texts."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return str(value) if isinstance(value, Path) else value


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


def load(
    run: str | Path | None = None,
    *,
    checkpoint: str = "last",
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
) -> Run:
    """Open a run folder for reading. `run` alone: the run describes itself (its config.toml).
    `config` alone: that TOML file and the run folder it names; both: the file's [sample], device
    and threads for the run at `run`. `set` overrides config keys ({"sample.top_k": 5} or
    ["sample.top_k=5"]). `checkpoint`: "last" or "best" (the weights at the lowest validation loss).
    The model is built from the [model] section its checkpoint stores."""
    cfg, run_dir = reading_config(config, run, overrides(set))
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
            raise MinigptError(
                "sample settings {unknown} are unknown; use: {known}",
                unknown=", ".join(unknown),
                known=", ".join(SAMPLE_SETTINGS),
            )
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
        attribute: str | int | None = None,
        versus: str | int | None = None,
        patch: Mapping[str, Any] | None = None,
        grad: bool = False,
        target: str | int | None = None,
        compare_run: Run | str | Path | None = None,
    ) -> Trace | Comparison:
        """One position (default: the last) followed through every block of one forward pass.
        Interventions change stages of that same pass: `scale` {"0.attention": 0.0} (or
        ["all.ffn=0.5"]), `replace_residual` [0] (or ["all"]), `ablate_head` ["0.1"], `set_input`
        [2, 2, 2, 2]; `at_position` applies the first three at the traced position only. `patch`
        {"clean": TEXT or ids, "block": B, "stage": S, "position": P or None, "head": H or None}
        puts back what the clean prompt's own pass computed there, as `patch` does (S: input,
        attention, residual1, ffn, output, any other stage of the block, or heads for head H's
        mixed values; position None: every position; the same number of tokens as the traced
        prompt). With any intervention the result is a Comparison of both passes (`compare=False`:
        the modified Trace alone). `attribute` (a token's text, "#ID" or an id) adds the traced
        position's logit for it (minus `versus`'s) split into the parts that wrote it, as
        `attribute` returns it (`trace.attribution`; in a Comparison, before and after); refused
        at a position where a patch of a residual-stream row or of the attention update breaks
        the sum it splits. `grad` adds the gradient of the loss of the traced position's next token
        (the prompt's, at the last position the model's top prediction; or `target`, a token as
        `attribute` takes it) with respect to every stage's row, through the same pass
        (`trace.gradient`; in a Comparison, each pass's, of the same target).

        `compare_run` (a run folder, a loaded Run, or "origin": the run this one was fine-tuned
        from, `origin_run()`) gives a Comparison of two runs of one shape and tokenizer: `before`
        the compared run's pass, `after` this run's, of the same tokens, each with the same
        interventions (a patch is refused: it would put back each run's own clean activation)."""
        changes = _changes(scale, replace_residual, ablate_head, set_input)
        if compare_run is not None and compare:
            raise MinigptError(
                "{compare:on} compares a pass with and without interventions, {compare_run} two runs; give one "
                "(with {compare_run}, interventions are made in both runs' passes)"
            )
        if compare_run is not None and patch is not None:
            raise MinigptError(
                "a patch puts back one run's clean activation, so it is not made in two runs; trace the patch "
                "without {compare_run}, or compare the runs without a patch"
            )
        if compare and not changes and patch is None:
            raise MinigptError(
                "{compare:on} needs at least one intervention ({scale}, {replace_residual}, {ablate_head} or "
                "{set_input}) or a patch to compare with"
            )
        if versus is not None and attribute is None:
            raise MinigptError("{versus} is the token an attribution compares with; give {attribute} TOKEN too")
        tokens = self._tokens(attribute, versus, "attribute", changes)
        if target is not None and not grad:
            raise MinigptError("{target} is the token whose loss a gradient differentiates; give {grad:on} too")
        target_id = self._token(target, parameter("target"))
        other = None if compare_run is None else self.comparison_run(compare_run)
        if other is not None and tokens is not None:
            try:
                check_decomposable(other.model, changes)
            except MinigptError as exc:
                raise MinigptError("the compared run {folder}: {reason}", folder=other.path, reason=exc) from None
        return self._trace(
            prompt, ids, position, block, top, changes, at_position, compare, tokens, patch, grad, target_id, other
        )

    def origin_run(self) -> Run:
        """The run this one was fine-tuned from (`train(init_from=...)`), at the checkpoint it
        started from, as its origin.json records them; refused, saying which folder was expected
        and to pass `compare_run`, when it has no origin run, the folder is gone, or its checkpoint
        has changed since (its sha256 is not the recorded one)."""
        origin = origin_run(self.path)
        return load(origin.folder, checkpoint=origin.checkpoint)

    def comparison_run(self, compare_run: Run | str | Path) -> Run:
        """The run `trace(compare_run=...)` traces beside this one: a loaded Run, a run folder, or
        "origin" (`origin_run()`; a folder named origin is "./origin"), checked to have this run's
        shape (trace.SHAPE_KEYS) and tokenizer (the same fingerprint), or refused naming what differs."""
        if isinstance(compare_run, Run):
            other = compare_run
        elif isinstance(compare_run, str) and compare_run == "origin":
            other = self.origin_run()
        else:
            folder = Path(compare_run)
            if not folder.is_dir():
                raise MinigptError(
                    "{compare_run} {folder}: no such run folder; give a run of the same shape and tokenizer",
                    folder=folder,
                )
            try:
                other = load(folder)
            except NotARun as refused:
                raise MinigptError(
                    "{compare_run} {folder} is not a run folder (it has no {lacks}); give a run of the same shape "
                    "and tokenizer",
                    folder=refused.folder,
                    lacks=refused.lacks,
                ) from None
        differences = shape_differences(self.model, other.model)
        if differences:
            raise MinigptError(
                "{compare_run} {folder} is not the shape of {this} ({join}: this run's first), so their stages "
                "cannot be compared one by one; compare runs of the same shape (a fine-tune and its origin)",
                folder=other.path,
                this=self.path,
                join="; ".join(differences),
            )
        if other.tokenizer.fingerprint() != self.tokenizer.fingerprint():
            raise MinigptError(
                "{compare_run} {folder} has another tokenizer than {this} (their tokenizer.json differ), so the "
                "same ids are not the same text; compare runs with one tokenizer (a fine-tune and its origin)",
                folder=other.path,
                this=self.path,
            )
        return other

    def attribute(
        self,
        prompt: str | None = None,
        answer: str | int | None = None,
        *,
        ids: Sequence[int] | str | None = None,
        position: int | None = None,
        versus: str | int | None = None,
        scale: Mapping[str, float] | Sequence[str] = (),
        ablate_head: Sequence[str] = (),
        set_input: Sequence[float] | str | None = None,
        at_position: bool = False,
    ) -> Attribution:
        """The traced position's logit for `answer` (a token's text, "#ID" or an id), minus
        `versus`'s, as the sum of what each part wrote into the residual stream: the token and
        position rows, each block's heads (each through its slice of W_O) and W_O's bias, each
        block's FFN and the final norm's bias, all through the final norm with this pass's scale.
        The parts sum to the pass's own logit (`error`: by how much they miss it). Interventions
        as in `trace`, whose modified pass is then the one split."""
        if answer is None:
            raise MinigptError("give the token to attribute: {answer} TOKEN (its text, or #ID)")
        changes = _changes(scale, (), ablate_head, set_input)
        tokens = self._tokens(answer, versus, "answer", changes)
        return self._trace(prompt, ids, position, None, 5, changes, at_position, False, tokens).attribution

    def _tokens(
        self, answer: str | int | None, versus: str | int | None, name: str, changes: list
    ) -> tuple[int, int | None] | None:
        """The attributed token and the one it is compared with, as ids, checked before any pass
        (`name`: the parameter that gave the first)."""
        if answer is None:
            return None
        check_decomposable(self.model, changes)  # a post-norm model has no sum to split
        token, other = self._token(answer, parameter(name)), self._token(versus, parameter("versus"))
        if token == other:
            raise MinigptError(
                "{what} and {versus} are the same token ({token!r}); give two different tokens",
                what=parameter(name),
                token=self.tokenizer.token_text(token),
            )
        return token, other

    def _token(self, value: str | int | None, what: Phrase) -> int | None:
        """A token given by its text, "#ID" or an id (None stays None)."""
        if value is None:
            return None
        text = f"#{value}" if isinstance(value, int) else value
        return attribution.resolve_token(self.tokenizer, text, what, self.model.vocab_size)

    def _trace(
        self,
        prompt,
        ids,
        position,
        block,
        top,
        changes,
        at_position,
        compare,
        tokens,
        patch=None,
        grad=False,
        target=None,
        other: Run | None = None,
    ) -> Trace | Comparison:
        token_ids = tokens_to_trace(self.tokenizer, prompt, ids)
        use_threads(self.cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        if patch is not None:  # the clean prompt's pass, recorded first
            changes = [*changes, put_back(self.model, self.tokenizer, patch, len(token_ids))]
        if other is not None or (changes and compare is not False):
            result = compare_passes(
                self.model,
                self.tokenizer,
                token_ids,
                changes,
                position=position,
                block=block,
                top=top,
                only_at_position=at_position,
                grad=grad,
                target=target,
                before_model=None if other is None else other.model,
            )
            if other is None:  # this run without the changes, then with them
                passes = [(result.before, self.model, []), (result.after, self.model, changes)]
            else:  # the other run's pass, then this one's, each with the changes
                result.run, result.compared_run = str(self.path), str(other.path)
                passes = [(result.before, other.model, changes), (result.after, self.model, changes)]
        else:
            result = trace_position(
                self.model,
                self.tokenizer,
                token_ids,
                position=position,
                block=block,
                top=top,
                interventions=changes,
                only_at_position=at_position,
                grad=grad,
                target=target,
            )
            passes = [(result, self.model, changes)]
        if tokens is not None:
            for traced, model, applied in passes:
                traced.attribution = attribution.attribute(model, self.tokenizer, traced, *tokens, applied)
        return result

    def patch(
        self,
        clean: str | Sequence[int] | None = None,
        corrupt: str | Sequence[int] | None = None,
        answer: str | int | None = None,
        versus: str | int | None = None,
        *,
        by: str = "stage",
    ) -> Patching:
        """Activation patching: the corrupt prompt run with one activation of the clean prompt's pass
        put back at a time, and how much of the clean logit difference (`answer` minus `versus` at
        the last position) each restores: 0 is the corrupt run's, 1 the clean run's. The prompts
        are texts or lists of token ids. `by` "stage":
        every block's input, attention, residual1, ffn and output at each position; "head": each
        head's output at every position at once and at each position alone. The prompts must have
        the same number of tokens."""
        for value, name in ((clean, "clean"), (corrupt, "corrupt"), (answer, "answer"), (versus, "versus")):
            if value is None or value == "":
                raise MinigptError(
                    "patching needs {clean} TEXT, {corrupt} TEXT, {answer} TOKEN and {versus} TOKEN; {what} is missing",
                    what=parameter(name),
                )
        check_decomposable(self.model)
        token, other = self._token(answer, parameter("answer")), self._token(versus, parameter("versus"))
        use_threads(self.cfg.train.threads)  # batches of passes: big enough to share
        return patching.patch(
            self.model,
            self.tokenizer,
            self.tokenizer.encode(clean) if isinstance(clean, str) else list(clean),
            self.tokenizer.encode(corrupt) if isinstance(corrupt, str) else list(corrupt),
            token,
            other,
            by=by,
            clean_text=clean if isinstance(clean, str) else None,
            corrupt_text=corrupt if isinstance(corrupt, str) else None,
        )

    # ------------------------------------------------------------ scoring

    def eval(self, data: str | Path) -> Scores:
        """Every token of a UTF-8 text file scored once, with at least half a table of left context."""
        text, _ = read_text(data, what="text to score")
        use_threads(self.cfg.train.threads)
        ids = self.tokenizer.encode(text)  # a char tokenizer names the characters it never saw
        if len(ids) < 2:
            raise MinigptError(
                "text to score {given} has {n_ids} token(s); scoring needs at least two (the first token "
                "has no prediction)",
                given=data,
                n_ids=len(ids),
            )
        return score(self.model, ids, len(text.encode("utf-8")), writable=self.tokenizer.vocab_size)

    @property
    def trained_on(self) -> str:
        """ "task", "pairs" (a .jsonl file of prompt/completion pairs) or "text"."""
        return "task" if self.cfg.train.task != "none" else "pairs" if is_pairs(self.cfg.train.data) else "text"

    def _examples(self):
        """A task or pairs run's examples, as training made them."""
        return (task_examples if self.trained_on == "task" else pair_examples)(self.cfg, self.tokenizer)

    @property
    def example_format(self) -> str:
        """What a task or pairs run was trained on, with one held-out example ("" for a text run)."""
        if self.trained_on == "text":
            return ""
        examples = self._examples()
        if examples.task is not None:
            return examples.source
        prompt, completion = (self.tokenizer.decode(ids) for ids in examples.held_out[0])
        return f"pairs of {examples.source}, e.g. {prompt!r} -> {completion!r}"

    @property
    def first_held_out_prompt(self) -> str:
        return self._examples().sample_start

    def accuracy(self, task: str | None = None, data: str | Path | None = None) -> Accuracy:
        """Exact-match and per-position accuracy: on the held-out examples of the task this run was
        trained on (`task` names it, as a check), on every line of a .jsonl file of prompt/completion
        pairs (`data`), or on the held-out lines of the .jsonl file a run was trained on."""
        use_threads(self.cfg.train.threads)
        if data is not None:
            if task is not None:
                raise MinigptError("{task} and {data} are both given; give one: the run's task, or a .jsonl file")
            pairs = encode_pairs(read_pairs(Path(data))[0], self.tokenizer, self.model.context, Path(data))
            what = f"{len(pairs):,} prompt/completion pairs of {data}"
        elif task is None and self.trained_on == "pairs":
            examples = self._examples()
            pairs, what = examples.held_out, f"the {len(examples.held_out):,} held-out pairs of {examples.source}"
        else:
            trained = self.cfg.train.task
            if trained == "none" or (task is not None and task != trained):
                given = (
                    Phrase("is trained on {trained}", trained=f"task {trained}")
                    if trained != "none"
                    else (Phrase("was not trained on a task"))
                )
                raise MinigptError(
                    "run {run} {given}, so it has no held-out examples of {asked}; evaluate a run trained with "
                    "{task} {asked}, or score a text with {data}",
                    run=self.path,
                    given=given,
                    asked=task or "a task",
                )
            examples = self._examples()
            pairs, what = examples.held_out, f"{examples.source}; {len(examples.held_out):,} held-out examples"
        writable = self.tokenizer.vocab_size
        result = accuracy(self.model, pairs, writable=writable)
        decode = self.tokenizer.decode
        for prompt, completion in result.wrong_pairs:  # what greedy decoding writes instead
            greedy = SampleConfig(max_new_tokens=len(completion), greedy=True)
            got = [int(step.tokens[0]) for step in generate(self.model, prompt, greedy, writable=writable)]
            result.wrong.append({"prompt": decode(prompt), "expected": decode(completion), "got": decode(got)})
        result.what = what
        return result

    # ------------------------------------------------------------ exporting

    def export(self, format: str, out: str | Path) -> list[Path]:
        """The run's weights written to the folder `out` (new or empty): "safetensors" (minigpt's
        names and a config.json), "hf" (a GPT-2 folder transformers loads; a LoRA run's merged), or
        "peft" (a LoRA run's adapters as PEFT saves them, for the GPT-2 folder "hf" writes of its
        base). Returns the files."""
        exporting.check_export(format, Path(out))
        if format != "peft":
            return exporting.export(self.model, self.tokenizer, format=format, out=Path(out))
        saved = read_weights(self.path, self.checkpoint).payload
        if "lora" not in saved:
            raise MinigptError(
                "{format} peft writes a LoRA run's adapters, and {run} {path} has none (it is not a LoRA run); "
                "export it with {format} hf, or fine-tune it with [train] lora_rank",
                path=self.path,
            )
        refusal = exporting.gpt2_refusal(self.model)
        if refusal:
            raise MinigptError("{format} peft adapts a GPT-2 folder, which cannot express {refusal}", refusal=refusal)
        return peft.write_adapter(saved["model"], saved["lora"], saved["lora"]["base"]["run"], Path(out))


def export(
    run: str | Path | None = None,
    *,
    format: str,
    out: str | Path,
    checkpoint: str = "last",
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
) -> list[Path]:
    """`load(run, ...)` then `Run.export(format, out)`, with the format and the folder checked
    before the model is read (a large one takes a while)."""
    exporting.check_export(format, Path(out))
    return load(run, checkpoint=checkpoint, config=config, set=set).export(format, out)


# ---------------------------------------------------------------- models from elsewhere


def import_hf(
    folder: str | Path,
    out: str | Path,
    *,
    context: int | None = None,
    force: bool = False,
    progress: bool = True,
    adapter: str | Path | None = None,
) -> convert.Imported:
    """A Hugging Face GPT-2 folder (config.json, model.safetensors or pytorch_model.bin, and its
    tokenizer) as the run folder `out`, which every reading method and `train(init_from=out)` then
    use like any other. `context` keeps the position table's first rows; `force` replaces what
    `out` holds (checked before anything is read); `progress` shows a bar while a large file is read.
    `adapter`: a PEFT LoRA adapter folder for it, merged into the weights (W + scale B A). Returns
    what was imported (its [model] section, tokenizer and origin)."""

    def read(bar) -> convert.Imported:
        imported = hf.read_hf_gpt2(Path(folder), context=context, progress=bar)
        if adapter is not None:
            for name, delta in peft.read_adapter(Path(adapter), imported.model.n_layer).items():
                weight = imported.state[name]
                imported.state[name] = (weight.double() + delta).to(weight.dtype)
            imported.origin["adapter"] = str(Path(adapter).resolve())
        return imported

    return _imported(out, force, read, progress)


def import_nanogpt(
    path: str | Path,
    out: str | Path,
    *,
    meta: str | Path | None = None,
    tokenizer: str | Path | None = None,
    context: int | None = None,
    force: bool = False,
    progress: bool = True,
) -> convert.Imported:
    """A nanoGPT checkpoint (its ckpt.pt, or the out folder holding it) as the run folder `out`:
    with `meta` its char-level dataset's meta.pkl, with `tokenizer` a GPT-2 tokenizer folder for its
    BPE checkpoints. The rest as `import_hf`."""

    def read(bar) -> convert.Imported:
        return nanogpt.read_nanogpt(
            Path(path),
            meta=None if meta is None else Path(meta),
            tokenizer_dir=None if tokenizer is None else Path(tokenizer),
            context=context,
            progress=bar,
        )

    return _imported(out, force, read, progress)


def _imported(out: str | Path, force: bool, read: Callable, progress: bool) -> convert.Imported:
    check_new_run(Path(out), force)  # before reading anything: a large checkpoint takes a while
    imported = read(task if progress else no_progress)
    convert.write_run(imported, Path(out), force=force)
    return imported


def metrics(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A run's metrics.jsonl: {"train": [...], "eval": [...]}, one dict per logged step and per
    evaluation, as `minigpt plot` draws them."""
    return read_metrics(Path(path))


def read_prompt(path: str | Path) -> str:
    """A prompt kept in a UTF-8 file (refused, saying why, when it cannot be read as text)."""
    return read_text(path, "prompt file")[0]
