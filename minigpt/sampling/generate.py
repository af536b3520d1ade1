"""Sampling: continue a prompt one token at a time.

    logits = model(window)[:, -1]                       the next-token scores
    probs  = softmax(filter(logits / temperature))      top-k, then top-p (nucleus)
    token  = argmax(logits) if greedy else draw(probs)  a seeded torch.Generator, never the global RNG

The position table is a hard limit. A prompt longer than `context` tokens is refused, never cropped.
While the text still fits the table, a KV cache lets each step feed only the new token. Past the
table the model reads a sliding window of the last `context` tokens, recomputed in full each step
(a learned position table gives every token a new row when the window moves, so no cached key or
value stays valid); with `[sample] slide = false` generation stops once the text fills the table,
as the book's Mini GPT does. No forward pass ever sees more than `context` positions.

Those full recomputes (and every step with `use_cache=False`) run the model's own forward pass on
the last position only (`last_only`), and on the folded copy wherever a fold applies (model/fold.py:
the same forward, with each norm's gain and bias folded into the matrix that reads it, the same
model up to float32 rounding, called without nn.Module's hook machinery since no user holds it);
`fast_path=False` keeps the model itself, and so does a model someone has registered hooks on (its
hooks see every pass). The KV-cache steps while the window fills run a decoding copy when at least
decoding.WORTH_STEPS of them will (an imported model's table has thousands of rows): the same
weights, each matrix stored the way a one-row product reads it fastest, called without hooks
(decoding.py); fewer cached steps (a small table) run the model itself, since copying would cost
more than it saves. The decoding copy is not folded: folding a large model (float64 products) takes
seconds, and unfolded it computes every norm as the model does.

Pieces, from pure to plumbing:
    filter_logits, next_token_distribution, choose     one step's distribution and choice
    generate -> Generation                              Steps as a [sample] section says; `.stop_reason`
    CompletionText                                      streaming decode and stop text
    complete                                            prompt text in, SampleResults out
The command that prints (commands/sample.py) and the benchmark (scripts/bench.py) live elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import SampleConfig
from ..model.cache import KVCache
from ..model.fold import fold_norms, unfoldable
from ..model.gpt import MiniGPT, check_token_ids
from ..model.hooks import hooked
from ..model.reading import Reading
from . import decoding

# ----------------------------------------------------------------------------------------------
# one step: scores -> distribution -> token


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Scores with every token outside the top-k, then outside the nucleus, set to -inf.

    top_k = 0 (or >= vocabulary) keeps all; exactly k tokens survive (ties broken by torch.topk).
    top_p keeps the smallest set of most likely tokens whose probability reaches p: a token stays
    when the mass of the tokens ranked above it is below p, so the most likely token always stays.
    top_p >= 1 keeps all.
    """
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kept = torch.topk(logits, top_k, dim=-1).indices
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, kept, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(ranked, dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs
        drop_ranked = mass_above >= top_p
        drop_ranked[..., 0] = False
        drop = torch.zeros_like(drop_ranked).scatter_(-1, order, drop_ranked)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token_distribution(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """[..., V] scores -> [..., V] probabilities: divide by the temperature, filter, softmax."""
    if temperature <= 0:
        raise ValueError(f"temperature must be greater than 0, got {temperature}")
    return torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)


def choose(logits: Tensor, probs: Tensor, greedy: bool, generator: torch.Generator | None) -> Tensor:
    """[B, V] -> [B] token ids: the highest score under greedy, else one draw from `probs`."""
    if greedy:
        return logits.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


# ----------------------------------------------------------------------------------------------
# the loop


@dataclass
class Step:
    """One new token for every sample of the batch."""

    index: int  # 0 for the first new token
    tokens: Tensor  # [B] chosen ids
    probs: Tensor  # [B] probability of each chosen id under the distribution it was chosen from
    logits: Tensor  # [B, V] the model's raw scores that step (before temperature and filters)


class Generation:
    """Iterate to get one `Step` per new token; once the iteration ends by itself, `stop_reason` is
    "max_new_tokens" or "context_limit" (a caller that stops early, e.g. on stop text, knows why).
    It draws as the [sample] section `settings` says; the prompt (its batch) and the stop text are
    the caller's. The model is read as `reading` says (Reading)."""

    def __init__(
        self,
        model: MiniGPT,
        prompt: Tensor,
        settings: SampleConfig,
        generator: torch.Generator,
        use_cache: bool,
        fast_path: bool = True,
        writable: int | None = None,
        reading: Reading | None = None,
    ):
        self.model, self.prompt, self.settings = model, prompt, settings
        self.reading = model.reading if reading is None else reading
        # what each pass is handed: nothing for the model's default reading (its copies below read
        # the same by default), else the reading itself
        self._read = {} if self.reading == model.reading else {"reading": self.reading}
        self.writable = writable  # ids 0 .. writable - 1 only: a padded model's extra rows are never drawn
        self.generator, self.use_cache, self.fast_path = generator, use_cache, fast_path
        self.stop_reason: str | None = None
        # A model someone hooks is sampled as it is: its hooks see every pass (model/hooks.py).
        self._hooked = hooked(model)
        self._foldable = fast_path and not self._hooked and unfoldable(model) is None
        self._folded: MiniGPT | None = None
        # what the KV-cache steps run: the model, or its decoding copy (decoding.py) when enough
        # steps will read it; chosen at the first cached step
        self._decoder: MiniGPT | None = None
        self._window_runtime = None  # onnx_window.WindowRuntime, built at the first full window

    def _recompute(self, window: Tensor) -> Tensor:
        """[B, T <= context] ids -> [B, V] scores of the last position, with no cache. The folded
        model is built at the first full recompute, from the weights as they are then (a few ms,
        once per Generation, so a model trained between two generations is never stale)."""
        if self._folded is None and self._foldable:
            self._folded = fold_norms(self.model)
        model = self.model if self._folded is None else self._folded
        if self.settings.runtime == "onnxruntime" and window.shape[1] == model.context and not self._hooked:
            if self._window_runtime is None:
                from .onnx_window import WindowRuntime  # the onnx extra: imported only when chosen

                self._window_runtime = WindowRuntime(model, window.shape[0], self.reading)
            return self._window_runtime(window)
        return model(window, last_only=True, **self._read)[0][:, -1]

    def _decoding_model(self, steps: int) -> MiniGPT:
        """The model the cached steps run: its decoding copy (decoding.py: each matrix stored the way a
        one-row product reads it fastest) when at least `decoding.WORTH_STEPS` of them will read it and the
        model may be copied, else the model itself."""
        if self.settings.precision == "bfloat16":  # asked for: whatever the steps (generate checked it can be)
            return decoding.decoding_copy(self.model, torch.bfloat16)
        if self.fast_path and steps >= decoding.WORTH_STEPS and decoding.decodable(self.model) is None:
            return decoding.decoding_copy(self.model)
        return self.model

    def __iter__(self) -> Iterator[Step]:
        model, s = self.model, self.settings
        # the longest window the model reads (None: the whole text, read past its trained length on
        # purpose), and how long its KV cache stays valid
        window, reach = self.reading.window, self.reading.cache_reach
        batch, length = self.prompt.shape
        with torch.inference_mode():
            # One buffer for the whole text, written in place: no concatenation per token.
            text = self.prompt.new_empty((batch, length + s.max_new_tokens))
            text[:, :length] = self.prompt
            # no more room than this text can take (an imported model's window may be 131,072)
            capacity = length + s.max_new_tokens if window is None else min(window, length + s.max_new_tokens)
            cache = KVCache(len(model.blocks), capacity) if self.use_cache else None
        for index in range(s.max_new_tokens):
            if window is not None and length >= window and not s.slide:
                self.stop_reason = "context_limit"  # the text fills the table; every token has a row
                return
            with torch.inference_mode():
                if cache is not None and (reach is None or length <= reach):
                    # The window is still filling: feed only what the cache has not seen.
                    if self._decoder is None:  # chosen by how many steps will read the cache
                        left = s.max_new_tokens - index
                        self._decoder = self._decoding_model(left if reach is None else min(left, reach - length + 1))
                    new = text[:, cache.length : length]
                    logits = self._decoder(new, cache=cache, last_only=True, **self._read)[0][:, -1]
                else:
                    # past the table every position moves: recompute the last `window` (with rope's
                    # dynamic rule every key turns with the length: recompute the whole text)
                    cache = self._decoder = None  # the decoding copy's memory back before any fold
                    logits = self._recompute(text[:, max(0, length - window) if window is not None else 0 : length])
                if self.writable is not None:
                    logits = logits[:, : self.writable]
                probs = next_token_distribution(logits, s.temperature, s.top_k, s.top_p)
                tokens = choose(logits, probs, s.greedy, self.generator)
                chosen = probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
                text[:, length] = tokens
            length += 1
            yield Step(index, tokens, chosen, logits)
        self.stop_reason = "max_new_tokens"


def generate(
    model: MiniGPT,
    prompt_ids: Sequence[int] | Tensor,
    settings: SampleConfig,
    *,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    fast_path: bool = True,
    writable: int | None = None,
    reading: Reading | None = None,
) -> Generation:
    """Continue `prompt_ids` ([T] ids, or a [B, T] tensor) as the [sample] section `settings` says:
    up to `max_new_tokens` tokens, as `num_samples` rows of one batch (a [T] prompt is repeated; a
    [B, T] one is taken as it is).

    The draws come from `generator`, or where none is given from one seeded with `settings.seed` on
    the model's device: reproducible without touching the global RNG.
    `use_cache=False` recomputes the whole window every step: the reference the KV cache must match.
    `fast_path=False` makes every step run the model itself, never its folded or decoding copy.
    `runtime = "onnxruntime"` runs the full windows past the table on onnxruntime (onnx_window.py).
    `precision = "bfloat16"` runs the KV-cache steps on a bfloat16 decoding copy (decoding.py).
    `writable`: how many ids the tokenizer can write, when the model has more rows than that
    (nanoGPT pads GPT-2's 50,257 ids to 50,304 rows): only those ids are ever drawn, the
    distribution normalised over them. `reading`: how the model is read (Reading; by default its
    default reading). The model should be in eval mode (dropout would make every run differ).
    """
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0).expand(settings.num_samples, -1)
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt_ids must be a non-empty [T] or [B, T] sequence, got shape {list(prompt.shape)}")
    if settings.max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {settings.max_new_tokens}")
    reading = model.reading if reading is None else reading
    # Refused, never cropped: cropping silently would hide the problem.
    reading.refuse_length(
        prompt.shape[1],
        "the prompt",
        "shorten the prompt (e.g. keep its end; it is never cropped), or train a model with a larger [model] context",
    )
    check_token_ids(prompt.flatten(), model.vocab_size)  # before any work
    # a text that would grow past a sliding window: refused before the first token, not partway
    reading.refuse_sample(prompt.shape[1], settings.max_new_tokens, settings.slide)
    decoding.check_precision(model, settings.precision)  # before anything is computed
    return Generation(
        model,
        prompt.contiguous(),
        settings,
        generator if generator is not None else torch.Generator(device=device).manual_seed(settings.seed),
        use_cache,
        fast_path,
        writable=writable if writable is not None and writable < model.vocab_size else None,
        reading=reading,
    )


# ----------------------------------------------------------------------------------------------
# text: streaming decode and stop text


class CompletionText:
    """One sample's completion as it grows: bytes decoded as complete UTF-8 characters only, and a
    stop text searched for, with any tail that could be the start of the stop text held back so
    the stop text itself is never shown."""

    def __init__(self, tokenizer, stop: str = ""):
        self.decoder = tokenizer.stream()
        self.stop = stop
        self.text = ""  # the completion so far (trimmed at the stop text once found)
        self.shown = 0  # how much of `text` has been handed out for printing
        self.ids: list[int] = []
        self.probs: list[float] = []
        self.stopped = False  # the stop text was found
        self.finished_at: float | None = None

    def push(self, token_id: int, prob: float) -> str:
        """Add one token; return the text that can be printed now (possibly empty)."""
        self.ids.append(token_id)
        self.probs.append(prob)
        return self._extend(self.decoder.push(token_id), final=False)

    def finish(self) -> str:
        """End of generation: whatever was held back (an unfinished character shows as U+FFFD)."""
        return "" if self.stopped else self._extend(self.decoder.flush(), final=True)

    def _extend(self, piece: str, final: bool) -> str:
        search_from = max(0, len(self.text) - len(self.stop) + 1)  # a new match ends in `piece`
        self.text += piece
        if piece and self.stop:
            at = self.text.find(self.stop, search_from)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        held = 0
        if self.stop and not self.stopped and not final:
            held = next(
                (k for k in range(min(len(self.stop) - 1, len(self.text)), 0, -1) if self.text.endswith(self.stop[:k])),
                0,
            )
        end = len(self.text) - held
        out, self.shown = self.text[self.shown : end], max(self.shown, end)
        return out


# ----------------------------------------------------------------------------------------------
# whole samples: prompt text in, completions out


@dataclass
class SampleResult:
    """One finished sample: its completion (without the prompt) and how it was made."""

    prompt: str
    prompt_ids: list[int]
    completion: str
    token_ids: list[int]
    token_probs: list[float]
    stop_reason: str  # "max_new_tokens", "stop_text" or "context_limit"
    seconds: float
    trained_length: int = 0  # [model] context: the longest text the model was trained on
    longest_read: int = 0  # the most tokens one forward pass read (past trained_length: --extrapolate)

    @property
    def past_trained_length(self) -> bool:
        return self.longest_read > self.trained_length

    @property
    def text(self) -> str:
        """The prompt and its completion, as `minigpt sample` prints them."""
        return self.prompt + self.completion

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self, sample: int) -> dict:
        return {
            "sample": sample,
            "prompt": self.prompt,
            "completion": self.completion,
            "prompt_ids": self.prompt_ids,
            "token_ids": self.token_ids,
            "token_probs": [round(p, 6) for p in self.token_probs],
            "stop_reason": self.stop_reason,
            "new_tokens": len(self.token_ids),
            "seconds": round(self.seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "trained_length": self.trained_length,
            "longest_read": self.longest_read,
            "past_trained_length": self.past_trained_length,
        }


def complete(
    model: MiniGPT,
    tokenizer,
    prompt: str,
    settings: SampleConfig,
    *,
    on_text: Callable[[str], None] | None = None,
    use_cache: bool = True,
    reading: Reading | None = None,
) -> list[SampleResult]:
    """`settings.num_samples` continuations of `prompt` (an empty prompt is a newline), as the
    [sample] section `settings` says. With one sample, `on_text` is handed the text as it is
    produced: the prompt first, then every piece that can be shown (a split UTF-8 character or a
    possible start of the stop text is held back until it is settled). `reading`: how the model is
    read (by default its default reading)."""
    s = settings
    if s.runtime == "onnxruntime":
        from .onnx_window import require

        require()  # a missing extra is refused before any token
    text = prompt if prompt else "\n"
    prompt_ids = tokenizer.encode(text)  # a char tokenizer names the characters it never saw
    generation = generate(model, prompt_ids, s, use_cache=use_cache, writable=tokenizer.vocab_size, reading=reading)
    samples = [CompletionText(tokenizer, s.stop) for _ in range(s.num_samples)]
    stream = on_text if s.num_samples == 1 else None
    if stream:
        stream(text)
    start = time.perf_counter()
    for step in generation:
        ids, probs = step.tokens.tolist(), step.probs.tolist()
        now = None
        for sample, token_id, prob in zip(samples, ids, probs):
            if sample.stopped:
                continue
            piece = sample.push(token_id, prob)
            if stream and piece:
                stream(piece)
            if sample.stopped:
                sample.finished_at = now = now or time.perf_counter()
        if all(sample.stopped for sample in samples):
            break
    end = time.perf_counter()
    read_at_most = generation.reading.window or len(prompt_ids) + s.max_new_tokens
    results = []
    for sample in samples:
        tail = sample.finish()
        if stream and tail:
            stream(tail)
        results.append(
            SampleResult(
                prompt=text,
                prompt_ids=list(prompt_ids),
                completion=sample.text,
                token_ids=sample.ids,
                token_probs=sample.probs,
                stop_reason="stop_text" if sample.stopped else generation.stop_reason,
                seconds=(sample.finished_at or end) - start,
                trained_length=model.context,
                # every token but the last one drawn was read, in windows of at most the reading's window
                longest_read=min(len(prompt_ids) + len(sample.ids) - 1, read_at_most),
            )
        )
    return results
