"""The Python API: a run folder opened for reading, the layer every reading command stands on.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import interventions as edits
from .config import Config, updated
from .data import read_text
from .device import pick_device, use_threads
from .errors import MinigptError, option
from .generate import SampleResult, complete
from .model import MiniGPT
from .run import load_model, reading_config
from .scoring import Scores, score
from .tokenizer import TextTokenizer
from .trace import Comparison, Trace, parse_ids, prompt_ids, trace_position
from .trace import compare as compare_passes

# What `sample` takes, beside the prompt: the [sample] keys a call may set.
SAMPLE_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "greedy", "seed", "num_samples", "stop", "slide")


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
        are the [sample] keys (`max_new_tokens`, `temperature`, `top_k`, `top_p`, `greedy`, `seed`,
        `num_samples`, `stop`, `slide`), defaulting to the run's config; with num_samples > 1 the
        result is a list."""
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
        given = {f"sample.{key}": (key, value) for key, value in settings.items() if value is not None}
        s = updated(self.cfg, given).sample
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
        return score(self.model, ids, len(text.encode("utf-8")))
