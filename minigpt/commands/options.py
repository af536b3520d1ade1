"""What every command's options are built from. Each command's options are declared once: one
frozen dataclass per command, whose fields are the command's parameters (type, default, flag and
help together), in options_make.py (train, sweep, import, export, exercise: the commands that
write), options_read.py (sample, eval, plot, info) or options_inspect.py (trace, patch, explore).
Typer reads each dataclass's own constructor (cli.py), and the command module receives the
filled-in dataclass, so an option reaches the code that reads it by name, and adding one is one
edit there. This module holds what they share: the base `Options`, the options several commands
take, and the flags built from config keys.

A flag that sets a config key is not declared with its command but in minigpt/config/, as that
key's field: `config_flags` builds a command's flags from the fields of the keys it takes (type,
help, spelling), and the command's options inherit them. Each is None unless given;
`Options.config_values` hands what was given to the config, per section. Light on purpose (no
torch): `minigpt --help` imports this module.
"""

from __future__ import annotations

import typing
from dataclasses import Field, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape as markup_escape

from ..config import PATH_KEYS, PATH_LISTS, SECTIONS
from ..errors import as_flag

CONFIG_HELP = (
    "TOML config shared by every command (default: configs/default.toml; with --run alone, the run's own config.toml)."
)
SET_HELP = "Override one config key, e.g. --set model.n_layer=2 (repeatable)."
RUN_HELP = "Run folder to read; alone, it supplies its own config (default: the run the config names)."
COMPARE_RUN_HELP = (
    "Another run of the same shape and tokenizer to compare with, stage by stage: its pass before, this run's "
    "after; the word origin: the run this one was fine-tuned from (a folder named origin: ./origin); a LoRA "
    "run is compared with its base unless this says none."
)

# The options several commands share.
ConfigOption = Annotated[Path | None, typer.Option("-c", "--config", help=CONFIG_HELP)]
RunOption = Annotated[Path | None, typer.Option("--run", help=RUN_HELP)]
SetOption = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)]
CompareRunOption = Annotated[str | None, typer.Option("--compare-run", metavar="DIR", help=COMPARE_RUN_HELP)]
CheckpointOption = Annotated[
    str, typer.Option("--checkpoint", help="Which weights of the run: last, or best (its lowest validation loss).")
]

ExtrapolateOption = Annotated[
    bool,
    typer.Option(
        "--extrapolate",
        help="Read past the length the model was trained at (its context) on purpose: a rope, alibi, t5, "
        "sinusoidal or none model accepts any length (a learned table has no row there and still refuses).",
    ),
]
RopeScalingOption = Annotated[
    str | None,
    typer.Option(
        "--rope-scaling",
        metavar="RULE:F",
        help="Read a rope model with its rotations stretched by F: linear:F (position interpolation), ntk:F "
        "(dynamic NTK), yarn:F or llama3:F, F from 1 to 1,000,000, optionally with transformers' settings "
        "after it (yarn:4,beta_fast=16); it then accepts F x context tokens.",
    ),
]
# An output file's (--png, --per-token, plot -o): one already there is replaced only when asked.
ForceOutputOption = Annotated[bool, typer.Option("--force", help="Replace the output file if it exists.")]

TrustExerciseOption = Annotated[
    bool,
    typer.Option(
        "--trust-exercise",
        help="Run a learner's file that is not the learner's own: one a run records by a relative path, a link or "
        "inside a run folder (or the run folder's copy), or, to train, an exercise file inside a run folder. "
        "Importing it runs its code, so read it first.",
    ),
]

_SECTION = "config section"  # the metadata of a field that is a config key's flag: which section it sets


@dataclass(frozen=True, kw_only=True)
class Options:
    """What every command's options share: list options given no value are empty tuples."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) is None and _is_list(self, f.name):
                object.__setattr__(self, f.name, ())

    def config_values(self) -> dict[str, dict[str, Any]]:
        """The config keys given as flags, per section ({"train": {"steps": 500}}), as the flags
        typed them; every section these options take a key of is there. A key not given is left
        out: the config decides it."""
        given: dict[str, dict[str, Any]] = {f.metadata[_SECTION]: {} for f in fields(self) if _SECTION in f.metadata}
        for key, value in self._keys_given():
            given[key.metadata[_SECTION]][key.name] = value
        return given

    def config_flag_words(self) -> list[str]:
        """The config keys given, as the command-line words that give them again
        (`--steps 500`, `--data a.txt --data b/`, `--no-slide`)."""
        words: list[str] = []
        for key, value in self._keys_given():
            on, _, off = _long_flag(key.name, isinstance(value, bool)).partition("/")
            if isinstance(value, bool):
                words.append(on if value else off)
            else:
                for each in value if isinstance(value, (list, tuple)) else [value]:
                    words += [on, str(each)]
        return words

    def _keys_given(self) -> list[tuple[Field, Any]]:
        """Each config key given as a flag (a repeatable one at least once), with its value."""
        flags = [(f, getattr(self, f.name)) for f in fields(self) if _SECTION in f.metadata]
        return [(f, value) for f, value in flags if value not in (None, (), [])]


def _is_list(options: Options, name: str) -> bool:
    hint = typing.get_type_hints(type(options))[name]
    return any(typing.get_origin(arg) is list for arg in typing.get_args(hint))


# ---------------------------------------------------------------- flags built from config keys


def config_flags(section: type, keys: tuple[str, ...] | None = None, *, after: type[Options] = Options) -> type:
    """Options with one flag per key of the config section `section` (every key, or those named in
    `keys`, in that order), each built from the key's field in minigpt/config/; they follow the options
    of `after`."""
    name = next(n for n, cls in SECTIONS.items() if cls is section)
    specs = {f.name: f for f in fields(section)}
    unknown = set(keys or ()) - set(specs)
    if unknown:
        raise ValueError(f"[{name}] has no keys {', '.join(sorted(unknown))}")
    return make_dataclass(
        f"{section.__name__.removesuffix('Config')}Flags",
        [
            (key, _key_option(name, specs[key]), field(default=None, metadata={_SECTION: name}))
            for key in (keys or specs)
        ],
        bases=(after,),
        frozen=True,
        kw_only=True,
        namespace={"__module__": __name__},
    )


def _key_option(section: str, key: Field) -> Any:
    """A config key's flag: `--name` (a bool's `--name/--no-name`) with its short alias, typed as the
    key is (a path key as a path, a list of paths as a repeatable flag), with the key's help."""
    if (section, key.name) in PATH_LISTS:
        kind: Any = list[Path]
    elif (section, key.name) in PATH_KEYS:
        kind = Path
    else:
        kind = {"int": int, "float": float, "bool": bool, "str": str}[key.type]
    short = ("-" + key.metadata["short"],) if key.metadata["short"] else ()
    text = key.metadata["help"]
    text = text[0].upper() + text[1:] + "." + (" Repeatable." if kind == list[Path] else "")
    # typer writes help through rich's markup, where a key's "[model] init" is a tag and vanishes
    return Annotated[kind | None, typer.Option(*short, _long_flag(key.name, kind is bool), help=markup_escape(text))]


def _long_flag(name: str, is_bool: bool) -> str:
    """`--top-k`; for a bool the pair that sets it either way, `--greedy/--no-greedy`."""
    flag = as_flag(name)
    return f"{flag}/--no-{flag.removeprefix('--')}" if is_bool else flag


@dataclass(frozen=True, kw_only=True)
class ConfigFile(Options):
    """`-c FILE`, first among a command's flags."""

    config: ConfigOption = None


@dataclass(frozen=True, kw_only=True)
class ConfigAndRun(ConfigFile):
    """`-c FILE` and `--run DIR`, first among a reading command's flags."""

    run: RunOption = None
