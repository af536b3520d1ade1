"""`minigpt.load` and the Run it returns: a run folder opened for reading, to sample from, trace,
attribute, patch, score and export."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..config import Config, SampleConfig, length_range, updated
from ..device import pick_device, use_threads
from ..errors import MinigptError, Phrase, parameter
from ..inspection import attribution, patching
from ..inspection import interventions as edits
from ..inspection.accuracy import Accuracy, ByLength, accuracy
from ..inspection.attribution import Attribution, check_decomposable
from ..inspection.by_position import PositionLosses, window_starts
from ..inspection.by_position import loss_by_position as losses_by_position
from ..inspection.counting import Info, describe
from ..inspection.feed import Fed, parse_feed
from ..inspection.feed import feed as feed_part
from ..inspection.patching import Patching
from ..inspection.scoring import Scores, score
from ..inspection.trace import Comparison, Trace, put_back, shape_differences, tokens_to_trace, trace_position
from ..inspection.trace import compare as compare_passes
from ..interchange import export as exporting
from ..interchange import peft
from ..model.gpt import MiniGPT, check_token_ids
from ..runs.exercise import learner_note
from ..runs.origin import origin_run
from ..runs.reading import NotARun, load_model, read_weights, reading_config
from ..sampling.generate import SampleResult, complete, generate
from ..text.pairs import encode_pairs, is_pairs, pair_examples, read_pairs
from ..text.reading import read_text
from ..text.tasks import Task, held_out_at, lengths_text, task_examples, trained_lengths
from ..text.tokenizer import TextTokenizer
from ..training.optimizers import chosen_optimizer
from .arguments import overrides

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


def _lengths(task_length: str | int | range) -> range:
    """A task length (12) or range ("5-16", range(5, 17)) as the lengths it names."""
    lengths = task_length if isinstance(task_length, range) else length_range(str(task_length))
    if not lengths or lengths.start < 1 or lengths.step != 1:
        raise MinigptError(
            "{task_length} {given} is not a length or a range of lengths; give N or A-B with 1 <= A <= B (e.g. 5-16)",
            given=task_length,
        )
    return lengths


def _changes(scale, replace_residual, ablate_head, set_input, set_row=(), norm_over=None, broadcast_update=()) -> list:
    """Interventions as the API takes them (a mapping or texts, numbers or texts), parsed."""
    return edits.parse(
        scale=[f"{k}={v}" for k, v in scale.items()] if isinstance(scale, Mapping) else list(scale),
        replace_residual=[str(b) for b in replace_residual],
        ablate_head=[str(h) for h in ablate_head],
        set_input=set_input if isinstance(set_input, str) or set_input is None else ",".join(map(str, set_input)),
        set_row=[f"{k}={','.join(map(str, v))}" for k, v in set_row.items()]
        if isinstance(set_row, Mapping)
        else list(set_row),
        norm_over=norm_over,
        broadcast_update=list(broadcast_update),
    )


@dataclass
class Run:
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
        (`extrapolate`: rope, alibi and none models), or with rope's rotations stretched
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
        set_row: Mapping[str, Sequence[float]] | Sequence[str] = (),
        norm_over: str | None = None,
        broadcast_update: Sequence[str] = (),
        compare_ids: Sequence[int] | str | None = None,
        all_positions: bool = False,
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
        interventions (a patch is refused: it would put back each run's own clean activation). The
        two runs' blocks may compute in different orders (pre-norm beside post-norm, chapter 17.6):
        their stages are aligned by name.

        The chapter's exercises (17.8): `set_row` {"token_table.a": [2, 1]} (or
        ["position_table.1=0,1"]; a token by its text or "#ID") sets table rows in a copy of the
        weights; `norm_over` "positions" makes every block's norms average over the positions (the
        wrong axis, for watching); `broadcast_update` ["0.attention"] hands the residual add the
        update of position 0 alone, which it refuses; `compare_ids` gives a Comparison of another
        prompt of as many tokens (`before`) with this one (`after`), each with the interventions;
        `all_positions` adds every row stage at every position (`trace.all_positions`)."""
        changes = _changes(scale, replace_residual, ablate_head, set_input, set_row, norm_over, broadcast_update)
        changes = [self._token_row(item) if isinstance(item, edits.SetRow) else item for item in changes]
        if compare_ids is not None and (compare or compare_run is not None or patch is not None):
            raise MinigptError(
                "{compare_ids} compares two prompts through this run; leave out {compare:on}, {compare_run} "
                "and a patch (trace them separately)"
            )
        if all_positions and (compare or compare_run is not None or compare_ids is not None):
            raise MinigptError(
                "{all_positions:on} shows every position of one pass; a comparison shows one position of two, "
                "so give one or the other"
            )
        if all_positions and grad:
            raise MinigptError(
                "{grad:on} is the gradient of one position's loss, beside that position's rows; leave out "
                "{all_positions:on} to see it"
            )
        if all_positions:
            compare = False  # one pass, the modified one, whatever the interventions
        if attribute is not None and any(isinstance(item, edits.MODEL_EDITS) for item in changes):
            raise MinigptError(
                "{attribute} splits the logit of the run's own weights; {set_row} and {norm_over} change a copy "
                "of them, so trace those without {attribute}"
            )
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
        other = None if compare_run is None else self.comparison_run(compare_run, order_may_differ=True)
        if other is not None and tokens is not None:
            try:
                check_decomposable(other.model, changes)
            except MinigptError as exc:
                raise MinigptError("the compared run {folder}: {reason}", folder=other.path, reason=exc) from None
        before_ids = None
        if compare_ids is not None:
            try:
                before_ids = tokens_to_trace(self.tokenizer, None, compare_ids)
                check_token_ids(before_ids, self.model.vocab_size)
            except MinigptError as exc:
                raise MinigptError("{compare_ids}: {reason}", reason=exc) from None
        return self._trace(
            prompt,
            ids,
            position,
            block,
            top,
            changes,
            at_position,
            compare,
            tokens,
            patch,
            grad,
            target_id,
            other,
            before_ids,
            all_positions,
        )

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
        shape (trace.SHAPE_KEYS; `order_may_differ`: but for its norm_position) and tokenizer (the
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
        block's FFN and the final norm's bias, all through the final norm with this pass's scale
        (with residual = "attention", each times its source's weight in the final norm's read over
        depth: `Part.weight`). The parts sum to the pass's own logit (`error`: by how much they
        miss it). Interventions as in `trace`, whose modified pass is then the one split."""
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

    def _token_row(self, item: edits.SetRow) -> edits.SetRow:
        """A set-row of the token table with its token (text or #ID) resolved to its id."""
        if item.table != "token_table":
            return item
        if not item.row.startswith("#"):
            try:
                self.tokenizer.encode(item.row)
            except MinigptError as exc:  # a character a char tokenizer never saw: say where it came from
                raise MinigptError("{where}: {reason}", where=item.where, reason=exc) from None
        return replace(item, index=self._token(item.row, item.where))

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
        before_ids: list[int] | None = None,
        all_positions: bool = False,
    ) -> Trace | Comparison:
        token_ids = tokens_to_trace(self.tokenizer, prompt, ids)
        use_threads(self.cfg.train.threads or 1)  # one forward pass of one prompt: tiny matmuls
        if patch is not None:  # the clean prompt's pass, recorded first
            changes = [*changes, put_back(self.model, self.tokenizer, patch, len(token_ids))]
        if other is not None or before_ids is not None or (changes and compare is not False):
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
                before_ids=before_ids,
            )
            if before_ids is not None:  # the other prompt's pass, then this one's, each with the changes
                passes = [(result.before, self.model, changes), (result.after, self.model, changes)]
            elif other is None:  # this run without the changes, then with them
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
                all_positions=all_positions,
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

    def loss_by_position(
        self, data: str | Path, length: int | None = None, windows: int | None = None
    ) -> PositionLosses:
        """The mean next-token loss at each position 0 .. length-1 (default: the model's context) of
        the non-overlapping windows of `length` tokens a UTF-8 text file holds (`windows`: at most
        that many, spread evenly over the text), each read from position 0: where the loss climbs
        past the length the model was trained at. Past that length a rope, alibi or none model needs
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

    def accuracy(
        self, task: str | None = None, data: str | Path | None = None, task_length: int | str | None = None
    ) -> Accuracy:
        """Exact-match and per-position accuracy: on the held-out examples of the task this run was
        trained on (`task` names it, as a check), on every line of a .jsonl file of prompt/completion
        pairs (`data`), or on the held-out lines of the .jsonl file a run was trained on.
        `task_length`: the task's held-out examples at that length instead, trained on or not (one
        longer than the model accepts is refused unless it is read with extrapolate)."""
        use_threads(self.cfg.train.threads)
        if task_length is not None:
            if data is not None:
                raise MinigptError("{task_length} reads a task run's task at a length; it is not taken with {data}")
            lengths = _lengths(task_length)
            if len(lengths) > 1:
                raise MinigptError(
                    "{task_length} {given} names {count} lengths, and accuracy reads one; read several with "
                    "accuracy_by_length",
                    given=task_length,
                    count=len(lengths),
                )
            return self.accuracy_by_length(lengths, task, show=5).rows[0]
        if data is not None:
            if task is not None:
                raise MinigptError("{task} and {data} are both given; give one: the run's task, or a .jsonl file")
            pairs = encode_pairs(read_pairs(Path(data))[0], self.tokenizer, self.model.context, Path(data))
            what = f"{len(pairs):,} prompt/completion pairs of {data}"
        elif task is None and self.trained_on == "pairs":
            examples = self._examples()
            pairs, what = examples.held_out, f"the {len(examples.held_out):,} held-out pairs of {examples.source}"
        else:
            self._check_task(task)
            examples = self._examples()
            pairs, what = examples.held_out, f"{examples.source}; {len(examples.held_out):,} held-out examples"
        result = self._scored(pairs, show=5)
        result.what = what
        return result

    def accuracy_by_length(self, task_length: str | int | range, task: str | None = None, show: int = 0) -> ByLength:
        """Exact match of a task run's task at each length of `task_length` ("5-16", 12, or a
        range), on the held-out examples of each length (those training held out, or, at a length
        it never trained on, drawn the same way), each row saying whether the run trained at it.
        Refused as a whole when the longest example is longer than the model accepts (the learned
        table's rows, or the trained length unless the run is read with extrapolate); `show`: wrong
        examples kept per length, decoded greedily."""
        use_threads(self.cfg.train.threads)
        self._check_task(task)
        lengths = _lengths(task_length)
        name, trained, window = self.cfg.train.task, trained_lengths(self.cfg.train), self.model.window
        if window is not None:  # refused before anything is computed, naming the longest length that fits
            fits = [n for n in range(1, lengths[-1]) if Task(name, n).window <= window]
            self.model.check_length(
                Task(name, lengths[-1]).window,
                f"an example of task {name} at length {lengths[-1]} (prompt and answer, less the last token)",
                f"lengths up to {fits[-1]}" if fits else "",
            )
        rows = []
        for n in lengths:
            pairs, described = held_out_at(self.cfg, self.tokenizer, n)
            result = self._scored(pairs, show)
            result.length, result.trained = n, n in trained
            where = "a length it trained on" if n in trained else "a length it never trained on"
            result.what = f"{described}; {len(pairs):,} held-out examples, {where} ({lengths_text(trained)})"
            rows.append(result)
        return ByLength(name, trained, self.model.context, window, rows)

    def _check_task(self, task: str | None) -> None:
        """Refuse a run not trained on a task, or on another task than `task`."""
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

    def _scored(self, pairs: list, show: int) -> Accuracy:
        """Accuracy on `pairs`, the first `show` wrong ones decoded as greedy sampling writes them."""
        writable = self.tokenizer.vocab_size
        result = accuracy(self.model, pairs, writable=writable, show=show)
        decode = self.tokenizer.decode
        for prompt, completion in result.wrong_pairs:  # what greedy decoding writes instead
            greedy = SampleConfig(max_new_tokens=len(completion), greedy=True)
            got = [int(step.tokens[0]) for step in generate(self.model, prompt, greedy, writable=writable)]
            result.wrong.append({"prompt": decode(prompt), "expected": decode(completion), "got": decode(got)})
        return result

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
