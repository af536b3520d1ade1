"""The options of the commands that write: train and sweep (run folders trained), import (a run
folder from another tool's files), export (a run's weights as another tool's files) and exercise
(a learner's exercise files, started and checked): one frozen dataclass each, built on options.py.
Light on purpose (no torch): `minigpt --help` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from ..config import ModelConfig, TrainConfig
from .options import (
    CheckpointOption,
    ConfigFile,
    ConfigOption,
    Options,
    RunOption,
    SetOption,
    TrustExerciseOption,
    config_flags,
)

# The config keys `train` takes as flags, after -c.
TRAIN_FLAG_KEYS = ("data", "task", "task_length", "out", "steps", "init_from", "init_checkpoint", "exercise_file")
TrainKeys = config_flags(ModelConfig, ("exercise",), after=config_flags(TrainConfig, TRAIN_FLAG_KEYS, after=ConfigFile))
# `sweep` takes train's flags for every cell, but not its --out: a sweep's is the folder of the cells.
SweepKeys = config_flags(
    ModelConfig,
    ("exercise",),
    after=config_flags(TrainConfig, tuple(k for k in TRAIN_FLAG_KEYS if k != "out"), after=ConfigFile),
)


@dataclass(frozen=True, kw_only=True)
class TrainOptions(TrainKeys):
    """Train a model on a text file; write config, tokenizer, checkpoint and metrics to a run folder."""

    overrides: SetOption = None
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in the run folder from its checkpoint.")
    ] = False
    force: Annotated[bool, typer.Option("--force", help="Replace an existing run folder.")] = False
    trust_exercise: TrustExerciseOption = False
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summaries (for scripts).")] = False


@dataclass(frozen=True, kw_only=True)
class SweepOptions(SweepKeys):
    """Train a grid of runs, one after another, each an ordinary run folder under --out named from its
    values (n_layer=8,norm_position=post), then print a table: final and best validation loss, where
    a cell diverged, wall time, the optimizer auto chose. Every cell takes train's flags.

    A cell diverges when a step's loss or gradient is not finite (train's guard), or when a step's
    training loss explodes: above 2 x ln V (V: the tokenizer's vocabulary), twice the loss of a
    uniform guess, where training starts. It stops there, its run folder intact.

    Rerunning the same command continues: finished cells are skipped, an interrupted one resumes;
    with nothing left to train it prints the table. Ctrl-C stops inside a cell as train does.
    """

    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            metavar="KEY=V1,V2,...",
            help="A config key and the values the cells take, e.g. model.n_layer=2,4,8 (a value with commas in "
            'double quotes: model.rope_scaling="yarn:4,beta_fast=16",linear:2; or a TOML array after =). '
            "Repeatable: the cells are every combination.",
        ),
    ] = None
    seeds: Annotated[
        int | None,
        typer.Option(
            "--seeds",
            metavar="K",
            help="Also train each cell with K seeds: train.seed, train.seed + 1, ..., as a last grid key.",
        ),
    ] = None
    out: Annotated[
        Path,
        typer.Option("--out", help="The sweep's folder: a run folder per cell, sweep.toml, base.toml and sweep.jsonl."),
    ]
    overrides: SetOption = None
    trust_exercise: TrustExerciseOption = False
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress bars or lines per cell; the table alone.")
    ] = False


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """Export a run's weights: safetensors, or a Hugging Face folder (GPT2LMHeadModel, or the Llama
    family's for a rope/RMSNorm/SwiGLU model; PreTrainedTokenizerFast)."""

    config: ConfigOption = None
    run: RunOption = None
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="safetensors (minigpt's names + config.json), hf (a GPT-2 or Llama-family folder transformers "
            "loads; a LoRA run merged) or peft (a LoRA run's adapters, as PEFT saves them).",
        ),
    ]
    out: Annotated[Path, typer.Option("--out", help="Folder to write (new or empty).")]
    overrides: SetOption = None
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False


@dataclass(frozen=True, kw_only=True)
class ImportHfOptions(Options):
    """Import a Hugging Face GPT-2 folder (config.json, model.safetensors or pytorch_model.bin, and
    tokenizer.json or vocab.json + merges.txt) as a run folder every command reads."""

    folder: Annotated[Path, typer.Argument(help="The GPT-2 folder (as save_pretrained writes it).")]
    out: Annotated[Path, typer.Option("--out", help="Run folder to write.")]
    context: Annotated[
        int | None,
        typer.Option("--context", help="Keep the position table's first N rows (default: all of them)."),
    ] = None
    force: Annotated[bool, typer.Option("--force", help="Replace an existing run folder.")] = False
    adapter: Annotated[
        Path | None,
        typer.Option("--adapter", help="A PEFT LoRA adapter for this GPT-2 folder: imported merged into its weights."),
    ] = None


@dataclass(frozen=True, kw_only=True)
class ImportNanogptOptions(Options):
    """Import a nanoGPT checkpoint (ckpt.pt) with its tokenizer as a run folder every command reads."""

    path: Annotated[Path, typer.Argument(help="nanoGPT's ckpt.pt, or the out folder holding it.")]
    out: Annotated[Path, typer.Option("--out", help="Run folder to write.")]
    meta: Annotated[
        Path | None, typer.Option("--meta", help="The char-level dataset's meta.pkl (data/DATASET/meta.pkl).")
    ] = None
    tokenizer: Annotated[
        Path | None, typer.Option("--tokenizer", help="A GPT-2 tokenizer folder, for nanoGPT's BPE checkpoints.")
    ] = None
    context: Annotated[
        int | None,
        typer.Option("--context", help="Keep the position table's first N rows (default: all of them)."),
    ] = None
    force: Annotated[bool, typer.Option("--force", help="Replace an existing run folder.")] = False


ExerciseName = Annotated[
    str, typer.Argument(metavar="NAME", help="The exercise: rmsnorm, layernorm, ffn, attention, block or swiglu.")
]
ExerciseDir = Annotated[
    Path, typer.Option("--dir", help="The folder of your exercise files, NAME.py each (default: exercises/ here).")
]


@dataclass(frozen=True, kw_only=True)
class ExerciseListOptions(Options):
    """Every exercise: where the texts define it, what it replaces in a model trained with it, and
    where yours stands (not started, failing, passing)."""

    dir: ExerciseDir = Path("exercises")


@dataclass(frozen=True, kw_only=True)
class ExerciseStartOptions(Options):
    """Write the starter file of an exercise, DIR/NAME.py: a docstring saying what to implement (names,
    signatures, the text's section) and code that runs but is wrong, or raises where it is yours to write."""

    name: ExerciseName
    dir: ExerciseDir = Path("exercises")
    force: Annotated[bool, typer.Option("--force", help="Replace the file if it exists (your work in it is lost).")] = (
        False
    )


@dataclass(frozen=True, kw_only=True)
class ExerciseCheckOptions(Options):
    """Check your DIR/NAME.py against minigpt's own modules: one line per check, each failing one naming
    the mistake and the input that shows it. Exits 0 when every check passes, 1 when one fails; then
    `minigpt train --exercise NAME` trains a model with your module in it."""

    name: ExerciseName
    dir: ExerciseDir = Path("exercises")
