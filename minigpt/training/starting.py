"""Where a training run starts: fresh weights, the checkpoint of the run it resumes (with every RNG
state, so the resumed run is bitwise the uninterrupted one), or the run a fine-tune starts from
(whose [model] and [tokenizer] it keeps, and whose checkpoint it names by sha256).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import Config, ModelConfig, TokenizerConfig
from ..errors import MinigptError
from ..io import file_sha256
from ..runs import checkpoints, identity, layout, reading
from ..text.corpus import Corpus
from ..text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class Origin:
    """Where a fine-tune's starting weights came from: a run folder's checkpoint, and its sha256."""

    run: str
    checkpoint: str  # "last" or "best"
    sha256: str
    kind: str = "init_from"  # beside an import's origin ("hf-gpt2", "nanogpt") in origin.json


@dataclass
class Start:
    """Where a run starts: its config (a fine-tune's takes the [model] and [tokenizer] of the run it
    starts from), the checkpoint it resumes, the weights it starts from, their origin, and the
    tokenizer it must use (None: fit one to the text)."""

    cfg: Config
    payload: dict[str, Any] | None = None
    origin: Origin | None = None
    weights: dict[str, torch.Tensor] | None = None
    tokenizer: TextTokenizer | None = None


def starting_point(cfg: Config, resume: bool) -> Start:
    """Fresh weights, the run folder's checkpoint (`resume`), or a fine-tune's source run, checked."""
    run_dir = cfg.run_dir
    start = Start(cfg, payload=checkpoints.load_checkpoint(run_dir / layout.CHECKPOINT_FILE) if resume else None)
    if cfg.train.init_from:
        # A fine-tune keeps the [model] and tokenizer of the run it starts from; resumed, it reads
        # them back from its own folder (so the source may since have moved).
        if resume:  # what the run recorded of itself: the identity in its checkpoint
            source = reading.read_weights(run_dir, "last")
            settings = TokenizerConfig(**start.payload["identity"]["tokenizer"])
            start.origin = Origin(**start.payload["origin"]) if "origin" in start.payload else None
        else:
            try:
                source = reading.read_weights(Path(cfg.train.init_from), cfg.train.init_checkpoint)
                settings = reading.saved_config(Path(cfg.train.init_from)).tokenizer
            except reading.NotARun as refused:
                raise MinigptError(
                    "{init_from} {folder}: {why}; give a folder a training run wrote",
                    folder=refused.folder,
                    why="no such run folder"
                    if refused.lacks == "folder"
                    else f"is not a run folder (it has no {refused.lacks})",
                ) from None
            source_run = str(Path(cfg.train.init_from).resolve())
            start.origin = Origin(source_run, cfg.train.init_checkpoint, file_sha256(source.path))
            start.weights = reading.model_state(source)  # a LoRA run's: its base with its adapters merged
        start.cfg = fine_tune_config(cfg, source.model_config, settings)
        start.tokenizer = source.tokenizer
    if start.payload is not None:
        try:
            identity.check_model_matches(start.cfg, start.payload, run_dir)
        except MinigptError as refusal:  # said as train takes a run: by its config.toml (train has no --run)
            raise MinigptError(RESUMED_ANOTHER_MODEL, **refusal.values) from None
    return start


# check_model_matches' refusal (its values: run_dir, source, join, value) with what train takes to resume
RESUMED_ANOTHER_MODEL = (
    "{resume:on} {run_dir}: its checkpoint was trained with another [model] section than {source} ({join} "
    "(config != checkpoint)); resume with the config it was trained with, saved in the run folder: {config} {value} "
    "{resume:on} (without {set} values for [model]), or train a new run with another {out}"
)


def fine_tune_config(cfg: Config, model: ModelConfig, tokenizer: TokenizerConfig) -> Config:
    """A fine-tune's config: its own [train] and [sample], and the [model] and [tokenizer] of the run it
    starts from. What the user chose for those two sections must agree with that run, dropout aside
    (a fine-tune may regularise differently)."""
    theirs = {"model": asdict(model), "tokenizer": asdict(tokenizer)}
    differences = [
        f"[{section}] {key}: {getattr(getattr(cfg, section), key)!r} != {theirs[section][key]!r}"
        for section, key in sorted(cfg.chosen)
        if section in theirs and key != "dropout" and getattr(getattr(cfg, section), key) != theirs[section][key]
    ]
    if differences:
        raise MinigptError(
            "{init_from} {given}: a fine-tune keeps the [model] and [tokenizer] of the run it "
            "starts from, but the config sets them otherwise ({join} (config != that run)); leave those keys "
            "out (or match them); only dropout may differ",
            given=cfg.train.init_from,
            join="; ".join(differences),
        )
    dropout = cfg.model.dropout if ("model", "dropout") in cfg.chosen else model.dropout
    return replace(cfg, model=replace(model, dropout=dropout), tokenizer=tokenizer)


def model_rows(corpus: Corpus, payload: dict[str, Any] | None, weights: dict[str, torch.Tensor] | None) -> int:
    """The rows of the token table and head: the tokenizer's ids, unless the weights a run starts
    from (or resumes) have more (a padded vocabulary: nanoGPT's 50,304 rows for GPT-2's 50,257 ids)."""
    if payload is not None:
        return payload["vocab_size"]
    if weights is not None:
        return weights["token_table.weight"].shape[0]
    return corpus.tokenizer.vocab_size


# ---------------------------------------------------------------- random state


def rng_states(generator: torch.Generator) -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "batches": generator.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }


def restore_rng_states(states: dict[str, Any], generator: torch.Generator) -> None:
    torch.set_rng_state(states["torch"])
    generator.set_state(states["batches"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    kind, keys, *rest = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
