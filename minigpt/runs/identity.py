"""What a run is: the config keys that decide its numbers, their hash, and the checks that a resume
computes what the interrupted run would have (same config, text and tokenizer) and that a config
reading a run agrees with its checkpoint's [model].
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from ..config import LATER_MODEL_KEYS, LATER_TRAIN_KEYS, Config, ModelConfig, TrainConfig, model_section_differences
from ..errors import MinigptError, Phrase
from ..text.sources import first_difference
from ..text.tokenizer import TextTokenizer
from .layout import CONFIG_FILE

# ---------------------------------------------------------------- identity

# Keys that do not change what a run computes; a resume may differ in them.
# `data` is the path only: the corpus itself is identified by its sha256, so a moved file resumes.
_NOT_IDENTITY = {
    ("train", k)
    for k in (
        "data",
        "out",
        "device",
        # How many threads, and whether they are timed: they change the last bits of a run, not what
        # it computes, and a resume on another machine may need others (threads = 0 resumes at the
        # count its checkpoint records).
        "threads",
        "adaptive_threads",
        "log_interval",
        "eval_interval",
        "checkpoint_interval",
        "sample_every",
        "sample_prompt",
        "sample_tokens",
        "tensorboard",
        # A fine-tune is identified by its weights, not by where they were read: the source's sha256
        # is in its checkpoint, and the path may change.
        "init_from",
        "init_checkpoint",
        # A learner's file is identified by its sha256 (in the checkpoint), not by where it is.
        "exercise_file",
    )
}


def config_sections(cfg: Config, leaving_out: set[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """[model], [tokenizer] and [train] as plain values, without the (section, key) pairs named."""
    return {
        section: {k: v for k, v in asdict(getattr(cfg, section)).items() if (section, k) not in leaving_out}
        for section in ("model", "tokenizer", "train")
    }


def sections_differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    """`[section] key: a-value != b-value` for every key on which two `config_sections` disagree."""
    return [f"[{section}] {d}" for section in a for d in model_section_differences(a[section], b.get(section, {}))]


def training_identity(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections that determine a training run's numbers ([sample] never does). A
    [model] key added later is left out at its default, which is what every earlier run computed,
    so a run trained before it existed hashes as it did and resumes (a later [train] key likewise)."""
    identity = config_sections(cfg, _NOT_IDENTITY)
    for section, keys, defaults in (
        ("model", LATER_MODEL_KEYS, ModelConfig()),
        ("train", LATER_TRAIN_KEYS, TrainConfig()),
    ):
        for key in keys:
            if identity[section].get(key) == getattr(defaults, key):
                del identity[section][key]
    return identity


def config_hash(identity: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def check_model_matches(cfg: Config, payload: dict[str, Any], run_dir: Path) -> None:
    """Refuse a checkpoint whose [model] section disagrees with the config, listing the keys."""
    differences = model_section_differences(asdict(cfg.model), payload["model_config"])
    if differences:
        raise MinigptError(
            "checkpoint in {run_dir} was trained with another [model] section than {source} ({join} (config "
            "!= checkpoint)); use the config it was trained with (it is saved as {config} {value}), or pass "
            "{run} {run_dir} alone, which reads it",
            run_dir=run_dir,
            source=cfg.source,
            join="; ".join(differences),
            value=run_dir / CONFIG_FILE,
        )


class CorpusIdentity(Protocol):
    """What a resume compares of a corpus (data.Corpus has it)."""

    sha256: str  # the file's, or the digest of every file's name and sha256
    path: Path
    source: str  # the corpus in a few words
    files: list[tuple[str, str]]  # (name, sha256) of every file


def check_resume(
    payload: dict[str, Any], cfg: Config, tokenizer: TextTokenizer, corpus: CorpusIdentity, processes: int = 1
) -> None:
    """A resume must compute what the interrupted run would have: same config, text and tokenizer.
    `cfg` holds the global batch (batch_size x `processes`, the run's identity under torchrun).
    The text comes before the tokenizer: a tokenizer fitted to a changed text differs too, and
    the text is what to name."""
    stored = payload["identity"]
    now = training_identity(cfg)
    if config_hash(now) != payload["hashes"]["config"]:
        diffs = sections_differences(now, stored)
        advice = Phrase("resume with the same config file, {set} values and options")
        batch, was = now["train"]["batch_size"], stored.get("train", {}).get("batch_size")
        if was is not None and batch != was:  # the global batch: any number of processes that divides it
            if processes > 1:
                diffs = [
                    f"[train] batch_size x {processes} processes: {batch} != {was}"
                    if d.startswith("[train] batch_size:")
                    else d
                    for d in diffs
                ]
            per_process = (
                Phrase("{set} train.batch_size={size}", size=was // processes)
                if was % processes == 0
                else f"a number of processes that divides {was}"
            )
            advice = Phrase(
                "resume with the same config file, {set} values and options (the checkpoint's global batch is "
                "{was}: use {per_process})",
                was=was,
                per_process=per_process,
            )
        if [d for d in diffs if not d.startswith("[train] steps:")] == []:
            advice = Phrase(
                "a run's schedule is fixed by its steps (the cosine reaches min_lr on the last one), so a run "
                "cannot be lengthened or shortened; train a new run with the {steps} you want ({force:on} or "
                "another {out}), or resume with the run's own"
            )
        raise MinigptError(
            "{resume:on} refused: the config differs from the checkpoint's ({join} (now != checkpoint)); {advice}",
            join="; ".join(diffs),
            advice=advice,
        )
    if corpus.sha256 != payload["hashes"]["corpus"]:
        then = payload.get("corpus_files")  # absent from checkpoints written before runs had several files
        if then is not None and max(len(then), len(corpus.files)) > 1:
            raise MinigptError(
                "{resume:on} refused: the training files ({source}) differ from the ones the checkpoint was "
                "trained on: {first_difference}; resume with the original files",
                source=corpus.source,
                first_difference=first_difference(then, corpus.files),
            )
        raise MinigptError(
            "{resume:on} refused: the corpus {path} differs from the one the checkpoint was trained on "
            "(sha256 {sha256}... != {corpus}...); resume with the original text",
            path=corpus.path,
            sha256=corpus.sha256[:12],
            corpus=payload["hashes"]["corpus"][:12],
        )
    if tokenizer.fingerprint() != payload["hashes"]["tokenizer"]:
        raise MinigptError(
            "{resume:on} refused: the tokenizer differs from the one the checkpoint was trained with "
            "(tokenizer.json hash changed); start a new run with {force:on} or another {out}"
        )
