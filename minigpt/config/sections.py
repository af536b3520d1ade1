"""The whole config: its four sections by name, the keys that are paths, and `Config`, which holds
one of each and writes itself back as TOML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .fields import toml_value
from .model import ModelConfig
from .sample import SampleConfig
from .tokenizer import TokenizerConfig
from .train import TrainConfig

SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "tokenizer": TokenizerConfig,
    "train": TrainConfig,
    "sample": SampleConfig,
}
PATH_KEYS = {("train", "data"), ("train", "out"), ("train", "init_from"), ("train", "exercise_file")}
# Path keys that may also be a list of paths (a TOML array; a repeated option).
PATH_LISTS = {("train", "data")}
# Typed values for keys, by name, per section: {"train": {"steps": 500}} (flags, API arguments).
Given = Mapping[str, Mapping[str, Any]]


@dataclass
class Config:
    model: ModelConfig
    tokenizer: TokenizerConfig
    train: TrainConfig
    sample: SampleConfig
    name: str = "default"  # the config file's stem; names the default run folder
    source: str = "<defaults>"  # where it came from, for messages
    # The (section, key) pairs the user chose: in a config file they named, by an override or by an
    # option (a fine-tune checks these against the run it starts from; the rest it takes from there).
    chosen: frozenset[tuple[str, str]] = frozenset()

    @property
    def run_dir(self) -> Path:
        return Path(self.train.out) if self.train.out else Path.cwd() / "runs" / self.name

    def to_toml(self) -> str:
        """The resolved config, written so that `load_config` reads back exactly these values."""
        lines = [f"# resolved minigpt config (from {json.dumps(self.source, ensure_ascii=False)})"]
        for section in SECTIONS:
            lines.append(f"\n[{section}]")
            for key, value in asdict(getattr(self, section)).items():
                lines.append(f"{key} = {toml_value(value)}")
        return "\n".join(lines) + "\n"
