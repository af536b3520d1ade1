"""`[model] exercise`: a learner's module in place of minigpt's, and what it asks of the rest of the
config: the [model] values the module needs, an FFN where it is one, and the learner's file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError, Phrase
from .fields import toml_value
from .model import EXERCISE_DEFAULTS, EXERCISE_MODEL, EXERCISES_WITH_FFN, ModelConfig
from .sections import Config


def with_exercise(cfg: Config, where: str | Phrase | None = None) -> Config:
    """[model] exercise: the [model] values its learner's module needs (set where the config leaves
    the key out, refused where it sets it otherwise; EXERCISE_DEFAULTS' are set where it is left out
    and kept where the config chooses another, refused only as the key's own default), and the
    learner's file ([train] exercise_file, by default exercises/NAME.py in the current folder, resolved
    here so the run records where). A refusal names `where` (by default the config's source)."""
    name, where = cfg.model.exercise, cfg.source if where is None else where
    if name == "none":
        if cfg.train.exercise_file:
            raise ConfigError(
                '{where}: [train] exercise_file = {file} names a learner\'s file, but [model] exercise = "none"; '
                "give {exercise} NAME as well, or leave exercise_file out",
                where=where,
                file=toml_value(cfg.train.exercise_file),
            )
        return cfg
    needs = EXERCISE_MODEL[name]
    for key, needed in needs.items():
        given = getattr(cfg.model, key)
        if given != needed and ("model", key) in cfg.chosen:
            raise ConfigError(
                '{where}: [model] exercise = "{name}" needs [model] {key} = {needed} (the learner\'s module takes '
                "that part's place), but the config sets {key} = {given}; leave {key} out (the exercise sets it) "
                "or set it to {needed}",
                where=where,
                name=name,
                key=key,
                needed=toml_value(needed),
                given=toml_value(given),
            )
    defaults = {
        key: value for key, value in EXERCISE_DEFAULTS.get(name, {}).items() if ("model", key) not in cfg.chosen
    }
    for key in EXERCISE_DEFAULTS.get(name, {}).keys() - defaults.keys():
        if getattr(cfg.model, key) == getattr(ModelConfig(), key):
            raise ConfigError(
                '{where}: [model] exercise = "{name}" with {key} = {given} is refused: that value leaves out the part '
                "the learner's module is; leave {key} out (the exercise sets {default}) or set another value",
                where=where,
                name=name,
                key=key,
                given=toml_value(getattr(cfg.model, key)),
                default=toml_value(EXERCISE_DEFAULTS[name][key]),
            )
    if name in EXERCISES_WITH_FFN and cfg.model.ffn_hidden == 0:
        raise ConfigError(
            '{where}: [model] exercise = "{name}" needs an FFN in every block, and [model] ffn_hidden = 0 builds '
            "none; set ffn_hidden above 0",
            where=where,
            name=name,
        )
    file = cfg.train.exercise_file or str(Path.cwd() / "exercises" / f"{name}.py")
    model = replace(cfg.model, **needs, **defaults)
    return replace(cfg, model=model, train=replace(cfg.train, exercise_file=file))
