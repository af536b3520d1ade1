"""`minigpt.load` and the Run it returns: a run folder opened for reading, to sample from, trace,
attribute, patch, score and export."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..config import Config, SampleConfig, updated
from ..device import pick_device, use_threads
from ..errors import MinigptError, Phrase, parameter
from ..inspection import patching
from ..inspection.attribution import check_decomposable
from ..inspection.by_position import PositionLosses, window_starts
from ..inspection.by_position import loss_by_position as losses_by_position
from ..inspection.comparison import shape_differences
from ..inspection.counting import Info, describe
from ..inspection.feed import Fed, parse_feed
from ..inspection.feed import feed as feed_part
from ..inspection.patching import Patching
from ..inspection.scoring import Scores, score
from ..interchange import export as exporting
from ..interchange import peft
from ..model.gpt import MiniGPT
from ..runs.exercise import learner_note
from ..runs.origin import origin_run
from ..runs.reading import NotARun, load_model, read_weights, reading_config
from ..sampling.generate import SampleResult, complete
from ..text.reading import read_text
from ..text.tokenizer import TextTokenizer
from ..training.optimizers import chosen_optimizer
from .arguments import overrides
from .task_accuracy import TaskAccuracy
from .tracing import Tracing

# What `sample` takes, beside the prompt: the [sample] keys a call may set.
SAMPLE_SETTINGS = tuple(f.name for f in fields(SampleConfig) if f.name != "prompt")


def load(
    run: str | Path | None = None,
    *,
    checkpoint: str = "last",
    config: str | Path | None = None,
    set: Mapping[str, Any] | Sequence[str] = (),
    extrapolate: bool = False,
    rope_scaling: str | None = None,
    trust_exercise: bool = False,
    learner_code: bool = True,
) -> Run:
    """Open a run folder for reading. `run` alone: the run describes itself (its config.toml).
    `config` alone: that TOML file and the run folder it names; both: the file's [sample], device
    and threads for the run at `run`. `set` overrides config keys ({"sample.top_k": 5} or
    ["sample.top_k=5"]). `checkpoint`: "last" or "best" (the weights at the lowest validation loss).
    The model is built from the [model] section its checkpoint stores. `extrapolate` and
    `rope_scaling`: how it is read past the length it was trained at (Run.read_with).

    A run trained with a learner's module (an exercise) imports it, which runs its code: without
    asking only the learner's own file, at the absolute path recorded, outside the run folder, as it
    was trained; `trust_exercise=True` runs another (a relative path, a file inside the run folder,
    or the run folder's copy), once you have read it. `run.notes` says which file runs. With
    `learner_code=False` none of it runs: minigpt's own modules stand in its place, with the same
    parameters, for counting them (`Run.info`), not for computing."""
    cfg, run_dir = reading_config(config, run, overrides(set))
    device = pick_device(cfg.train.device)
    model, tokenizer = load_model(
        cfg, run_dir, device, checkpoint, trust_exercise=trust_exercise, learner_code=learner_code
    )
    notes = [learner_note(model.parts)] if model.parts is not None else []
    run = Run(Path(run_dir), cfg, model, tokenizer, checkpoint, trust_exercise=trust_exercise, notes=notes)
    return run.read_with(extrapolate, rope_scaling)


@dataclass
class Run(Tracing, TaskAccuracy):
    """A trained (or imported) model with its tokenizer and resolved config, ready to use."""

    path: Path
    cfg: Config
    model: MiniGPT
    tokenizer: TextTokenizer
    checkpoint: str = "last"
    trust_exercise: bool = False  # the runs opened through this one (an origin, a comparison) are read so too
    notes: list[str] = field(default_factory=list)  # what a command says on stderr: the learner's files that run

    def __repr__(self) -> str:
        m = self.model.cfg
        return (
            f"Run({str(self.path)!r}, {self.model.num_parameters():,} parameters: {m.n_layer} blocks, "
            f"{m.n_head} heads, width {m.n_embd}, context {m.context}, {self.model.vocab_size} tokens)"
        )

    def read_with(self, extrapolate: bool = False, rope_scaling: str | None = None) -> Run:
        """Read the model past the length it was trained at ([model] context) on purpose
        (`extrapolate`: any positions but a learned table), or with rope's rotations stretched
        (`rope_scaling`: "linear:F", "ntk:F" or "yarn:F", accepting F x context tokens); every later
        sample, trace and eval reads it so. Returns the run."""
        self.model.read_with(extrapolate=extrapolate, rope_scaling=rope_scaling)
        return self

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

    def feed(self, feed: str, row: Sequence[float] | str | None = None) -> Fed:
        """One part of the model run on one row of your own numbers, every step shown (chapter 17's
        exercises 2 and 4): `feed` "PART=NUMBERS" ("0.ffn=1,-1"), or the part alone with `row` (C
        numbers or "1,-1"). PART "B.ffn": x W1 + b1, the activation, hidden W2 + b2, as the module
        computed them; "B.norm1", "B.norm2" or "final_norm": mean, variance, denominator, normalised
        row, gain and bias, then the module's output."""
        part, numbers = parse_feed(feed) if row is None else (feed, row)
        return feed_part(self.model, part, numbers)

    def info(self, context: int | None = None) -> Info:
        """Where this run's parameters and arithmetic are, part by part with each formula, training's
        memory, and what its `auto` settings chose (`minigpt info`); the arithmetic per token at
        `context` positions (default: the model's context)."""
        planned = chosen_optimizer(self.model, self.cfg.train)[0]
        return describe(self.path, self.cfg, self.model, planned, context)

    def origin_run(self) -> Run:
        """The run this one was fine-tuned from (`train(init_from=...)`), at the checkpoint it
        started from, as its origin.json records them; refused, saying which folder was expected
        and to pass `compare_run`, when it has no origin run, the folder is gone, or its checkpoint
        has changed since (its sha256 is not the recorded one)."""
        origin = origin_run(self.path)
        return self._through(load(origin.folder, checkpoint=origin.checkpoint, trust_exercise=self.trust_exercise))

    def _through(self, other: Run) -> Run:
        """A run opened through this one, whose notes this run's notes take up (the command says them)."""
        self.notes.extend(note for note in other.notes if note not in self.notes)
        return other

    def comparison_run(self, compare_run: Run | str | Path, order_may_differ: bool = False) -> Run:
        """The run `trace(compare_run=...)` traces beside this one: a loaded Run, a run folder, or
        "origin" (`origin_run()`; a folder named origin is "./origin"), checked to have this run's
        shape (comparison.SHAPE_KEYS; `order_may_differ`: but for its norm_position) and tokenizer (the
        same fingerprint), or refused naming what differs."""
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
                other = self._through(load(folder, trust_exercise=self.trust_exercise))
            except NotARun as refused:
                raise MinigptError(
                    "{compare_run} {folder} is not a run folder (it has no {lacks}); give a run of the same shape "
                    "and tokenizer",
                    folder=refused.folder,
                    lacks=refused.lacks,
                ) from None
        differences = shape_differences(self.model, other.model, order_may_differ)
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
        every block's input, attention, residual1, ffn and output at each position (with
        residual = "attention": the embedding, each block's read1, attention, read2 and ffn, and
        the final norm's final_read); "head": each
        head's output at every position at once and at each position alone. The prompts must have
        the same number of tokens."""
        for value, name in ((clean, "clean"), (corrupt, "corrupt"), (answer, "answer"), (versus, "versus")):
            if value is None or value == "":
                raise MinigptError(
                    "patching needs {clean} TEXT, {corrupt} TEXT, {answer} TOKEN and {versus} TOKEN; {what} is missing",
                    what=parameter(name),
                )
        check_decomposable(self.model)
        token = self.token_id(answer, parameter("answer"))
        other = self.token_id(versus, parameter("versus"))
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

    def loss_by_position(
        self, data: str | Path, length: int | None = None, windows: int | None = None
    ) -> PositionLosses:
        """The mean next-token loss at each position 0 .. length-1 (default: the model's context) of
        the non-overlapping windows of `length` tokens a UTF-8 text file holds (`windows`: at most
        that many, spread evenly over the text), each read from position 0: where the loss climbs
        past the length the model was trained at. Past that length a model without a learned table needs
        read_with (extrapolate, or a rope scaling factor that covers it); a learned one refuses."""
        length = self.model.context if length is None else length
        for value, name in ((length, "length"), (windows, "windows")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise MinigptError(
                    "{what} {given} is not a whole number of at least 1", what=parameter(name), given=value
                )
        self.model.check_length(length, Phrase("the scoring window ({length})"))
        text, _ = read_text(data, what="text to score")
        ids = self.tokenizer.encode(text)
        if not window_starts(len(ids), length):
            raise MinigptError(
                "text to score {given} has {n_ids} token(s), and one window of {length} {value} needs {needed} "
                "tokens (each position predicts the token after it); give a longer text or a smaller {length}",
                given=data,
                n_ids=len(ids),
                value=length,
                needed=length + 1,
            )
        use_threads(self.cfg.train.threads)
        return losses_by_position(self.model, ids, length, windows, writable=self.tokenizer.vocab_size)

    # ------------------------------------------------------------ exporting

    def export(self, format: str, out: str | Path) -> list[Path]:
        """The run's weights written to the folder `out` (new or empty): "safetensors" (minigpt's
        names and a config.json), "hf" (a folder transformers loads, GPT-2's or a Llama family's; a
        LoRA run's merged), or "peft" (a LoRA run's adapters as PEFT saves them, for the folder "hf"
        writes of its base, or the one it was imported from). Returns the files."""
        exporting.check_export(format, Path(out))
        if format != "peft":
            imported = exporting.imported_from(self.path)
            return exporting.export(self.model, self.tokenizer, format=format, out=Path(out), imported=imported)
        saved = read_weights(self.path, self.checkpoint).payload
        if "lora" not in saved:
            raise MinigptError(
                "{format} peft writes a LoRA run's adapters, and {run} {path} has none (it is not a LoRA run); "
                "export it with {format} hf, or fine-tune it with [train] lora_rank",
                path=self.path,
            )
        return peft.export_adapter(self.model, saved["model"], saved["lora"], Path(out))

    def export_note(self, format: str) -> str | None:
        """What transformers computes in float32 of this run exported as `format` (a float64
        Llama-family model's RMSNorm and rope angles; the weights stay float64), as the export's
        note says it; None: nothing."""
        return exporting.transformers_float32(self.model, format)
