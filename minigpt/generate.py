"""Sampling: continue a prompt one token at a time.

    logits = model(window)[:, -1]                       the next-token scores
    probs  = softmax(filter(logits / temperature))      top-k, then top-p (nucleus)
    token  = argmax(logits) if greedy else draw(probs)  a seeded torch.Generator, never the global RNG

The position table is a hard limit. A prompt longer than `context` tokens is refused, never cropped.
While the text still fits the table, a KV cache lets each step feed only the new token. Past the
table the model reads a sliding window of the last `context` tokens, recomputed in full each step
(a learned position table gives every token a new row when the window moves, so no cached key or
value stays valid); with `slide=False` generation stops once the text fills the table, as the
book's Mini GPT does. No forward pass ever sees more than `context` positions.

Pieces, from pure to plumbing:
    filter_logits, next_token_distribution, choose     one step's distribution and choice
    generate -> Generation                              iterate Steps; then `.stop_reason`
    sample_command                                      what `minigpt sample` runs
    bench_sampling                                      tokens/s with and without the KV cache
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence, TextIO

import torch
from torch import Tensor

from .device import pick_device, use_threads
from .errors import MinigptError
from .model import KVCache, MiniGPT, context_refusal


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


def next_token_distribution(logits: Tensor, temperature: float = 1.0, top_k: int = 0,
                            top_p: float = 1.0) -> Tensor:
    """[..., V] scores -> [..., V] probabilities: divide by the temperature, filter, softmax."""
    if temperature <= 0:
        raise ValueError(f"temperature must be greater than 0, got {temperature}")
    return torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)


def choose(logits: Tensor, probs: Tensor, greedy: bool, generator: torch.Generator | None) -> Tensor:
    """[B, V] -> [B] token ids: the highest score under greedy, else one draw from `probs`."""
    if greedy:
        return logits.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def check_prompt_fits(n_tokens: int, context: int) -> None:
    """Refuse a prompt the position table cannot hold; cropping it silently would hide the problem."""
    if n_tokens > context:
        raise context_refusal(n_tokens, context, "the prompt",
                              "shorten the prompt (e.g. keep its end; it is never cropped), or train a model "
                              "with a larger [model] context")


# ----------------------------------------------------------------------------------------------
# the loop

@dataclass
class Step:
    """One new token for every sample of the batch."""
    index: int       # 0 for the first new token
    tokens: Tensor   # [B] chosen ids
    probs: Tensor    # [B] probability of each chosen id under the distribution it was chosen from
    logits: Tensor   # [B, V] the model's raw scores that step (before temperature and filters)


class Generation:
    """Iterate to get one `Step` per new token; once the iteration ends by itself, `stop_reason` is
    "max_new_tokens" or "context_limit" (a caller that stops early, e.g. on stop text, knows why)."""

    def __init__(self, model: MiniGPT, prompt: Tensor, max_new_tokens: int, temperature: float,
                 top_k: int, top_p: float, greedy: bool, generator: torch.Generator | None,
                 use_cache: bool, slide: bool):
        self.model, self.prompt = model, prompt
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_k, self.top_p, self.greedy = temperature, top_k, top_p, greedy
        self.generator, self.use_cache, self.slide = generator, use_cache, slide
        self.stop_reason: str | None = None

    def __iter__(self) -> Iterator[Step]:
        model, context = self.model, self.model.context
        batch, length = self.prompt.shape
        with torch.inference_mode():
            # One buffer for the whole text, written in place: no concatenation per token.
            text = self.prompt.new_empty((batch, length + self.max_new_tokens))
            text[:, :length] = self.prompt
            cache = KVCache(len(model.blocks), context) if self.use_cache else None
        for index in range(self.max_new_tokens):
            if length >= context and not self.slide:
                self.stop_reason = "context_limit"  # the text fills the table; every token has a row
                return
            with torch.inference_mode():
                if cache is not None and length <= context:
                    # The window is still filling: feed only what the cache has not seen.
                    logits = model(text[:, cache.length:length], cache=cache, last_only=True)[0][:, -1]
                else:
                    cache = None  # past the table every position moves: recompute the last `context`
                    logits = model(text[:, max(0, length - context):length], last_only=True)[0][:, -1]
                probs = next_token_distribution(logits, self.temperature, self.top_k, self.top_p)
                tokens = choose(logits, probs, self.greedy, self.generator)
                chosen = probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
                text[:, length] = tokens
            length += 1
            yield Step(index, tokens, chosen, logits)
        self.stop_reason = "max_new_tokens"


def generate(model: MiniGPT, prompt_ids: Sequence[int] | Tensor, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, num_samples: int = 1, use_cache: bool = True,
             slide: bool = True) -> Generation:
    """Continue `prompt_ids` ([T] ids, or a [B, T] tensor) for up to `max_new_tokens` tokens, as
    `num_samples` rows of one batch (a [T] prompt is repeated; a [B, T] one is taken as it is).

    `generator` (on the model's device) makes sampling reproducible without touching the global RNG.
    `use_cache=False` recomputes the whole window every step: the reference the KV cache must match.
    The model should be in eval mode (dropout would make every run differ).
    """
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0).expand(num_samples, -1)
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt_ids must be a non-empty [T] or [B, T] sequence, got shape {list(prompt.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}")
    check_prompt_fits(prompt.shape[1], model.context)
    model.check_ids(prompt)  # ids outside the vocabulary are refused before any work
    return Generation(model, prompt.contiguous(), max_new_tokens, temperature, top_k, top_p, greedy,
                      generator, use_cache, slide)


# ----------------------------------------------------------------------------------------------
# text: streaming decode and stop text

class CompletionText:
    """One sample's completion as it grows: bytes decoded as complete UTF-8 characters only, and a
    stop text searched for, with any tail that could be the start of the stop text held back so
    the stop text itself is never shown."""

    def __init__(self, tokenizer, stop: str = ""):
        self.decoder = tokenizer.stream()
        self.stop = stop
        self.text = ""        # the completion so far (trimmed at the stop text once found)
        self.shown = 0        # how much of `text` has been handed out for printing
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
            held = next((k for k in range(min(len(self.stop) - 1, len(self.text)), 0, -1)
                         if self.text.endswith(self.stop[:k])), 0)
        end = len(self.text) - held
        out, self.shown = self.text[self.shown:end], max(self.shown, end)
        return out


# ----------------------------------------------------------------------------------------------
# the command

@dataclass
class SampleResult:
    prompt: str
    prompt_ids: list[int]
    completion: str
    token_ids: list[int]
    token_probs: list[float]
    stop_reason: str
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self, sample: int) -> dict:
        return {"sample": sample, "prompt": self.prompt, "completion": self.completion,
                "prompt_ids": self.prompt_ids, "token_ids": self.token_ids,
                "token_probs": [round(p, 6) for p in self.token_probs], "stop_reason": self.stop_reason,
                "new_tokens": len(self.token_ids), "seconds": round(self.seconds, 6),
                "tokens_per_second": round(self.tokens_per_second, 2)}


def read_prompt_file(path: Path) -> str:
    path = Path(path)
    if not path.exists():
        raise MinigptError(f"prompt file {path} does not exist; pass an existing UTF-8 text file")
    if path.is_dir():
        raise MinigptError(f"prompt file {path} is a directory; pass a UTF-8 text file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MinigptError(f"prompt file {path} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset "
                           f"{exc.start}); save it as UTF-8") from None


def sample_command(cfg, prompt: str, run_dir: Path | None = None, *, as_json: bool = False,
                   use_cache: bool = True, out: TextIO | None = None,
                   err: TextIO | None = None) -> list[SampleResult]:
    """`minigpt sample`: load the run the config names, continue `prompt` as `cfg.sample` says.

    One sample streams to `out` as it is produced (prompt first); several are printed when done,
    each under a `--- sample i ---` header; `as_json` prints one JSON object per sample instead.
    A one-line summary goes to `err` in text mode.
    """
    from .checkpoint import load_model

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    s = cfg.sample
    use_threads(cfg.train.threads)
    model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device))
    text = prompt if prompt else "\n"
    prompt_ids = tokenizer.encode(text)  # a char tokenizer names the characters it never saw
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(s.seed)
    generation = generate(model, prompt_ids, s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                          top_p=s.top_p, greedy=s.greedy, generator=generator, num_samples=s.num_samples,
                          use_cache=use_cache, slide=s.slide)
    samples = [CompletionText(tokenizer, s.stop) for _ in range(s.num_samples)]
    stream = s.num_samples == 1 and not as_json

    def write(piece: str) -> None:
        if piece:
            out.write(piece)
            out.flush()

    if stream:
        write(text)
    start = time.perf_counter()
    for step in generation:
        ids, probs = step.tokens.tolist(), step.probs.tolist()
        now = None
        for sample, token_id, prob in zip(samples, ids, probs):
            if sample.stopped:
                continue
            piece = sample.push(token_id, prob)
            if stream:
                write(piece)
            if sample.stopped:
                sample.finished_at = now = now or time.perf_counter()
        if all(sample.stopped for sample in samples):
            break
    end = time.perf_counter()

    results = []
    for sample in samples:
        tail = sample.finish()
        if stream:
            write(tail)
        reason = "stop_text" if sample.stopped else generation.stop_reason
        results.append(SampleResult(text, list(prompt_ids), sample.text, sample.ids, sample.probs, reason,
                                    (sample.finished_at or end) - start))

    if as_json:
        for i, result in enumerate(results, 1):
            write(json.dumps(result.to_json(i), ensure_ascii=False) + "\n")
        return results
    if stream:
        write("" if (text + results[0].completion).endswith("\n") else "\n")
    else:
        for i, result in enumerate(results, 1):
            whole = text + result.completion
            write(f"--- sample {i} ---\n{whole}{'' if whole.endswith(chr(10)) else chr(10)}")
    total = sum(len(r.token_ids) for r in results)
    reasons = ", ".join(dict.fromkeys(r.stop_reason for r in results))
    note = (f" (the text fills the {model.context}-row position table; drop --no-slide to continue "
            f"with a sliding window)" if "context_limit" in reasons else "")
    err.write(f"minigpt: {len(results)} sample{'s' if len(results) > 1 else ''}, {total} new tokens in "
              f"{end - start:.2f} s ({total / (end - start) if end > start else 0.0:.1f} tokens/s); "
              f"stopped: {reasons}{note}\n")
    err.flush()
    return results


# ----------------------------------------------------------------------------------------------
# benchmark

def _timed_tokens(model: MiniGPT, prompt_ids: list[int], new_tokens: int, seed: int,
                  use_cache: bool) -> tuple[list[int], float]:
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    generation = generate(model, prompt_ids, new_tokens, temperature=1.0, generator=generator,
                          use_cache=use_cache, slide=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    tokens = [step.tokens for step in generation]
    ids = torch.cat(tokens).tolist() if tokens else []  # one sync at the end, as a consumer would
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return ids, time.perf_counter() - start


def bench_sampling(model: MiniGPT, tokenizer, new_tokens: int = 1000, prompt: str = "\n",
                   seed: int = 1337, warmup_tokens: int = 16, repeats: int = 3) -> dict:
    """Sampling speed at batch 1: `new_tokens` tokens (temperature 1, sliding window past the
    table) with the KV cache and with full recompute, in the same process on the same model; the
    best of `repeats` alternating runs of each.

    Returns {"new_tokens", "context", "device", "dtype", "with_kv_cache_tokens_per_s",
    "without_kv_cache_tokens_per_s", "speedup", "same_tokens"}. Past the table every step is a full
    recompute of `context` positions in both modes, so the cache only speeds up the first
    `context - len(prompt)` tokens; `speedup` says what that is worth over `new_tokens`.
    """
    model.eval()
    prompt_ids = tokenizer.encode(prompt if prompt else "\n")
    for use_cache in (True, False):  # warm up kernels and allocator outside the clock
        _timed_tokens(model, prompt_ids, min(warmup_tokens, new_tokens), seed, use_cache)
    # Alternate the two modes and keep each one's fastest run, so a passing load on the machine
    # does not land on one mode only.
    runs = {True: [], False: []}
    for _ in range(repeats):
        for use_cache in (True, False):
            runs[use_cache].append(_timed_tokens(model, prompt_ids, new_tokens, seed, use_cache))
    (cached_ids, cached_s), (plain_ids, plain_s) = (min(runs[mode], key=lambda r: r[1]) for mode in (True, False))
    with_cache = new_tokens / cached_s if cached_s > 0 else 0.0
    without_cache = new_tokens / plain_s if plain_s > 0 else 0.0
    parameter = next(model.parameters())
    return {"new_tokens": new_tokens, "context": model.context, "device": str(parameter.device),
            "dtype": str(parameter.dtype).removeprefix("torch."),
            "with_kv_cache_tokens_per_s": round(with_cache, 1),
            "without_kv_cache_tokens_per_s": round(without_cache, 1),
            "speedup": round(with_cache / without_cache, 3) if without_cache else None,
            "same_tokens": cached_ids == plain_ids}
