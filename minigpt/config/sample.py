"""`[sample]`: what `minigpt sample` does; the one place that lists its keys (every other module
takes the section whole)."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import spec


@dataclass
class SampleConfig:
    """What `minigpt sample` does; every key is also one of its flags."""

    prompt: str = spec("", "text to continue; empty starts from a newline", short="p")
    max_new_tokens: int = spec(200, "tokens to generate", minimum=0, short="n")
    temperature: float = spec(0.8, "softmax temperature (> 0)", positive=True)
    top_k: int = spec(0, "keep only the k most likely tokens (0 = off)", minimum=0)
    top_p: float = spec(1.0, "nucleus sampling mass in (0, 1] (1.0 = off)", positive=True, maximum=1.0)
    greedy: bool = spec(False, "always take the most likely token")
    seed: int = spec(1337, "sampling seed")
    num_samples: int = spec(1, "independent samples, generated as one batch", minimum=1)
    stop: str = spec("", "stop a sample once this text appears in its completion (empty = never)")
    slide: bool = spec(True, "past the position table, continue with a sliding window (false: stop there)")
    runtime: str = spec(
        "torch",
        "what runs the window's forward past the position table: torch, or onnxruntime (the onnx "
        "extra: the same graph, exported by torch, with less cost per operation on the CPU)",
        choices=("torch", "onnxruntime"),
    )
    precision: str = spec(
        "float32",
        "the matrices each new token is multiplied by while the text fits the model's context: float32 "
        "(the default: the model's own numbers), or bfloat16 (a bfloat16 copy: half the bytes a token "
        "reads, so a large imported model samples faster; no faster on a small one; the logits are no "
        "longer float32's); a model that is not float32 is refused",
        choices=("float32", "bfloat16"),
    )
