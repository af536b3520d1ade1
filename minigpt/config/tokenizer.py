"""`[tokenizer]`: which tokenizer a run fits to its text (or takes from an imported model)."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import spec


@dataclass
class TokenizerConfig:
    kind: str = spec(
        "bpe",
        "byte-level BPE, one id per character, or 256 byte ids, fitted to the training text; imported: the "
        "tokenizer an imported model came with (the run's tokenizer.json), never fitted again",
        choices=("bpe", "char", "byte", "imported"),
    )
    vocab_size: int = spec(
        1024, "BPE vocabulary size (at least 257: 256 bytes plus merges); imported: the tokenizer's ids", minimum=1
    )
