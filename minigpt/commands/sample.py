"""`minigpt sample`: load a run, continue a prompt, print the text as it is produced.

One sample streams to stdout as it is produced (prompt first); several are printed when done, each
under a `--- sample i ---` header; `--json` prints one JSON object per sample instead. A one-line
summary goes to stderr in text mode. The sampling itself is generate.py's.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from ..config import Config
from ..data import read_text
from ..device import pick_device, use_threads
from ..errors import MinigptError
from ..generate import CompletionText, generate
from ..run import load_model, reading_config
from .common import flags, user_errors


def main(
    config: Path | None,
    run: Path | None,
    prompt: str | None,
    prompt_file: Path | None,
    options: dict,
    stop: str | None,
    as_json: bool,
    overrides: list[str],
    kv_cache: bool,
    checkpoint: str = "last",
) -> None:
    """`options`: the [sample] flags as {"sample.key": value or None}."""
    with user_errors():
        if prompt is not None and prompt_file is not None:
            raise MinigptError("--prompt and --prompt-file were both given; pass the prompt one way")
        cfg, run_dir = reading_config(config, run, overrides, flags(options))
        # Prompt and stop text are free text: taken as given, not round-tripped through TOML.
        if stop is not None:
            cfg.sample.stop = stop
        text = (
            read_text(prompt_file, "prompt file", "--prompt-file")[0]
            if prompt_file is not None
            else prompt
            if prompt is not None
            else cfg.sample.prompt
        )
        sample_command(cfg, text, run_dir, as_json=as_json, use_cache=kv_cache, checkpoint=checkpoint)


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
        }


def sample_command(
    cfg: Config,
    prompt: str,
    run_dir: Path | None = None,
    *,
    as_json: bool = False,
    use_cache: bool = True,
    out: TextIO | None = None,
    err: TextIO | None = None,
    checkpoint: str = "last",
) -> list[SampleResult]:
    """`minigpt sample`: load the run the config names, continue `prompt` as `cfg.sample` says.

    One sample streams to `out` as it is produced (prompt first); several are printed when done,
    each under a `--- sample i ---` header; `as_json` prints one JSON object per sample instead.
    A one-line summary goes to `err` in text mode.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    s = cfg.sample
    # One sample at a time is a chain of tiny matmuls: a second thread only adds waiting (and
    # stalls badly when another process is busy), so `threads = 0` means one thread here.
    use_threads(cfg.train.threads or (1 if s.num_samples == 1 else 0))
    model, tokenizer = load_model(cfg, run_dir, pick_device(cfg.train.device), checkpoint)
    text = prompt if prompt else "\n"
    prompt_ids = tokenizer.encode(text)  # a char tokenizer names the characters it never saw
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(s.seed)
    generation = generate(
        model,
        prompt_ids,
        s.max_new_tokens,
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        greedy=s.greedy,
        generator=generator,
        num_samples=s.num_samples,
        use_cache=use_cache,
        slide=s.slide,
    )
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
        results.append(
            SampleResult(
                text,
                list(prompt_ids),
                sample.text,
                sample.ids,
                sample.probs,
                reason,
                (sample.finished_at or end) - start,
            )
        )

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
    note = (
        f" (the text fills the {model.context}-row position table; drop --no-slide to continue with a sliding window)"
        if "context_limit" in reasons
        else ""
    )
    err.write(
        f"minigpt: {len(results)} sample{'s' if len(results) > 1 else ''}, {total} new tokens in "
        f"{end - start:.2f} s ({total / (end - start) if end > start else 0.0:.1f} tokens/s); "
        f"stopped: {reasons}{note}\n"
    )
    err.flush()
    return results
