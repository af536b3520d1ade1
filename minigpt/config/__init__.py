"""One TOML file, four sections, typed and validated.

`[model]`, `[tokenizer]`, `[train]` and `[sample]` map onto one dataclass each (model.py,
tokenizer.py, train.py, sample.py), held together by `Config` (sections.py). Every key is a field
that says its type, default, range and help once (fields.py); it is checked for name, type and
allowed range where it is read (keys.py), and a typo gets the closest known key suggested. The same
checks apply to `--set section.key=value` overrides, so the command line cannot smuggle in a value
the file would be refused for. What the keys ask of each other is one table of rows
(cross_checks.py), read by `load_config` and by the sweep's check of each cell (loading.py).

Relative paths inside a config file are resolved against the file's own folder (as pyproject and
tsconfig do), so a config works whatever directory the command runs in. Paths given with `--set`
are resolved against the current directory, like any other shell argument.

No torch here: the command line builds its flags from these fields before torch is imported.
"""

from ..errors import ConfigError
from .cross_checks import CONFIG_CHECKS, MODEL_CHECKS, CrossCheck, cross_check
from .exercise import with_exercise
from .fields import spec, toml_value
from .keys import checked_override, parse_override
from .loading import load_config, model_config_from, read_config, resolved, updated
from .model import (
    EXERCISE_DEFAULTS,
    EXERCISE_MODEL,
    EXERCISES_WITH_FFN,
    LATER_MODEL_KEYS,
    ModelConfig,
    Residual,
    model_section_differences,
)
from .sample import SampleConfig
from .sections import PATH_KEYS, PATH_LISTS, SECTIONS, Config, Given
from .shipped import DEFAULT_CONFIG, DEFAULT_CORPUS, PROJECT_ROOT
from .tokenizer import TokenizerConfig
from .train import LATER_TRAIN_KEYS, LORA_TARGETS, TASKS, TrainConfig, length_range, lora_targets

__all__ = [
    "CONFIG_CHECKS",
    "DEFAULT_CONFIG",
    "DEFAULT_CORPUS",
    "EXERCISES_WITH_FFN",
    "EXERCISE_DEFAULTS",
    "EXERCISE_MODEL",
    "LATER_MODEL_KEYS",
    "LATER_TRAIN_KEYS",
    "LORA_TARGETS",
    "MODEL_CHECKS",
    "PATH_KEYS",
    "PATH_LISTS",
    "PROJECT_ROOT",
    "SECTIONS",
    "TASKS",
    "Config",
    "ConfigError",
    "CrossCheck",
    "Given",
    "ModelConfig",
    "Residual",
    "SampleConfig",
    "TokenizerConfig",
    "TrainConfig",
    "checked_override",
    "cross_check",
    "length_range",
    "load_config",
    "lora_targets",
    "model_config_from",
    "model_section_differences",
    "parse_override",
    "read_config",
    "resolved",
    "spec",
    "toml_value",
    "updated",
    "with_exercise",
]
