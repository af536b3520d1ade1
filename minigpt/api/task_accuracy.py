"""What a run trained on, and its accuracy there (run.py's Run is a TaskAccuracy): a task run's
or a pairs run's examples, and exact match on the held-out ones, at the lengths trained on or past
them, each wrong example decoded as greedy sampling writes it."""

from __future__ import annotations

from pathlib import Path

from ..config import Config, SampleConfig, length_range
from ..device import use_threads
from ..errors import MinigptError, Phrase
from ..inspection.accuracy import Accuracy, ByLength
from ..inspection.accuracy import accuracy as exact_match
from ..model.gpt import MiniGPT
from ..sampling.generate import generate
from ..text.pairs import encode_pairs, is_pairs, pair_examples, read_pairs
from ..text.tasks import Task, held_out_at, lengths_text, task_examples, trained_lengths
from ..text.tokenizer import TextTokenizer


def lengths_of(task_length: str | int | range) -> range:
    """A task length (12) or range ("5-16", range(5, 17)) as the lengths it names."""
    lengths = task_length if isinstance(task_length, range) else length_range(str(task_length))
    if not lengths or lengths.start < 1 or lengths.step != 1:
        raise MinigptError(
            "{task_length} {given} is not a length or a range of lengths; give N or A-B with 1 <= A <= B (e.g. 5-16)",
            given=task_length,
        )
    return lengths


class TaskAccuracy:
    """What a run scores with (Run's fields)."""

    path: Path
    cfg: Config
    model: MiniGPT
    tokenizer: TextTokenizer

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
            lengths = lengths_of(task_length)
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
        lengths = lengths_of(task_length)
        name, trained, window = self.cfg.train.task, trained_lengths(self.cfg.train), self.model.window
        if window is not None:  # refused before anything is computed, naming the longest length that fits
            start = self.cfg.train.task_start
            fits = [n for n in range(1, lengths[-1]) if Task(name, n, start).window <= window]
            self.model.check_length(
                Task(name, lengths[-1], start).window,
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
        result = exact_match(self.model, pairs, writable=writable, show=show)
        decode = self.tokenizer.decode
        for prompt, completion in result.wrong_pairs:  # what greedy decoding writes instead
            greedy = SampleConfig(max_new_tokens=len(completion), greedy=True)
            got = [int(step.tokens[0]) for step in generate(self.model, prompt, greedy, writable=writable)]
            result.wrong.append({"prompt": decode(prompt), "expected": decode(completion), "got": decode(got)})
        return result
