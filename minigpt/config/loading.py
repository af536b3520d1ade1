"""A config read and resolved: the file (the shipped default when none is named), then the
`section.key=value` overrides, then the typed values given by name, each key checked on its own
(`read_config`); then what the keys ask of each other (`resolved`: the exercise's values, the table
of cross-checks, a task's tokenizer). `load_config` is both, and so is the sweep's check of each
cell; a checkpoint's stored [model] section and a config updated in place are checked the same way.

Relative paths inside a config file are resolved against the file's own folder (as pyproject and
tsconfig do), so a config works whatever directory the command runs in. Paths given with `--set`
are resolved against the current directory, like any other shell argument.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, Phrase
from .cross_checks import cross_check
from .exercise import with_exercise
from .keys import Values, apply, apply_given, checked_override, unknown
from .model import LATER_MODEL_KEYS, ModelConfig
from .sample import SampleConfig
from .sections import SECTIONS, Config, Given
from .shipped import DEFAULT_CONFIG
from .tokenizer import TokenizerConfig
from .train import TrainConfig


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    given: Given | None = None,
) -> Config:
    """Read a config file (the shipped default when None), apply `section.key=value` overrides, then
    the values given for keys by name, per section ({"train": {"steps": 500}}: already typed; a
    message names each by its key, which the command line shows as its flag), and validate."""
    return resolved(read_config(path, overrides, given))


def read_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    given: Given | None = None,
) -> Config:
    """The config as read, as load_config reads it, each key checked on its own (name, type, range)
    but not yet against the others: `resolved` does that."""
    named = path is not None
    path = Path(path) if named else DEFAULT_CONFIG
    where = str(path)
    if not path.exists():
        if path == DEFAULT_CONFIG:
            raise ConfigError(
                "the default config {where} is not installed; install minigpt from its checkout (`pip install -e "
                ".` or `pip install .`), or pass your own TOML file as {config}",
                where=where,
            )
        raise ConfigError(
            "config file {where} does not exist; pass an existing TOML file as {config} (the default is "
            "{DEFAULT_CONFIG})",
            where=where,
            DEFAULT_CONFIG=DEFAULT_CONFIG,
        )
    if path.is_dir():
        raise ConfigError("config file {where} is a directory; pass a TOML file as {config}", where=where)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("{where}: not valid TOML ({exc}); fix the syntax", where=where, exc=exc) from None
    except UnicodeDecodeError:
        raise ConfigError("{where}: not UTF-8 text; a config must be a UTF-8 TOML file", where=where) from None

    values: Values = {s: {} for s in SECTIONS}
    chosen = (
        {(section, key) for section, table in raw.items() if isinstance(table, dict) for key in table}
        if named
        else set()
    )
    base = path.resolve().parent
    for section, table in raw.items():
        if section not in SECTIONS:
            raise unknown(section, list(SECTIONS), "section", where)
        if not isinstance(table, dict):
            raise ConfigError("{where}: {section} must be a [{section}] table of keys", where=where, section=section)
        for key, value in table.items():
            apply(values, section, key, value, where, base)
    for text in overrides:
        section, key, value = checked_override(text)
        values[section][key] = value
        chosen.add((section, key))
    apply_given(values, given or {})
    chosen |= {(section, key) for section, keys in (given or {}).items() for key in keys}

    # plain text: it is also the header of a run's config.toml
    source = f"{where} with overrides {' '.join(overrides)}" if overrides else where
    sections = {s: SECTIONS[s](**values[s]) for s in SECTIONS}
    return Config(**sections, name=path.stem, source=source, chosen=frozenset(chosen))


def resolved(cfg: Config, where: str | Phrase | None = None) -> Config:
    """`cfg` as a run takes it: its exercise's [model] values set (exercise.py), refused by the first
    cross-check it breaks (the table in cross_checks.py), a task's tokenizer made the character one.
    A refusal names `where`: by default the config's source; the sweep names the cell."""
    cfg = with_exercise(cfg, where)
    cross_check(cfg, where)
    return _task_tokenizer(cfg)


def _task_tokenizer(cfg: Config) -> Config:
    """A task is written one character per token: its run's [tokenizer] says so (config.toml too)."""
    if cfg.train.task != "none" and cfg.tokenizer.kind == "bpe" and ("tokenizer", "kind") not in cfg.chosen:
        return replace(cfg, tokenizer=replace(cfg.tokenizer, kind="char"))
    return cfg


def updated(cfg: Config, given: Given) -> Config:
    """A copy of `cfg` with typed values set ({"sample": {"top_k": 5}}), each checked as a config
    file's would be."""
    values = {section: asdict(getattr(cfg, section)) for section in SECTIONS}
    apply_given(values, given)
    return resolved(replace(cfg, **{section: SECTIONS[section](**values[section]) for section in SECTIONS}))


def model_config_from(stored: Any, where: str) -> ModelConfig:
    """The [model] section a checkpoint stores, checked key by key like a config file, so a model
    is only ever built from what it was trained as: no key may be missing, unknown or out of range."""
    if not isinstance(stored, dict):
        raise ConfigError(
            "{where} holds no [model] section; it cannot say what model it is, so it is refused: retrain it "
            "with this version of minigpt",
            where=where,
        )
    known = [f.name for f in fields(ModelConfig)]
    stored = {**{k: getattr(ModelConfig(), k) for k in LATER_MODEL_KEYS if k not in stored}, **stored}
    missing = [k for k in known if k not in stored]
    if missing:
        raise ConfigError(
            "{where}: its [model] section lacks {join}; it cannot say what model it is, so it is refused: "
            "retrain it with this version of minigpt",
            where=where,
            join=", ".join(missing),
        )
    values: Values = {s: {} for s in SECTIONS}
    for key, value in stored.items():
        apply(values, "model", key, value, where, Path.cwd())
    model = ModelConfig(**values["model"])
    # the rest at values no cross-check refuses, so only the [model] rows can refuse it
    cross_check(Config(model, TokenizerConfig(kind="byte"), TrainConfig(), SampleConfig(), source=where))
    return model
