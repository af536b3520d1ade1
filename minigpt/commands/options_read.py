"""The options of the commands that read a run from outside: sample (its text), eval (its scores),
plot (its curves) and info (its counts): one frozen dataclass each, built on options.py.
Light on purpose (no torch): `minigpt --help` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from ..config import SampleConfig
from .options import (
    CheckpointOption,
    ConfigAndRun,
    ConfigOption,
    ExtrapolateOption,
    ForceOutputOption,
    Options,
    RopeScalingOption,
    RunOption,
    SetOption,
    TrustExerciseOption,
    config_flags,
)

# `sample` takes every [sample] key as a flag, after -c and --run.
SampleKeys = config_flags(SampleConfig, after=ConfigAndRun)


@dataclass(frozen=True, kw_only=True)
class SampleOptions(SampleKeys):
    """Continue a prompt with a trained model. An empty prompt starts from a newline.

    A prompt longer than the model's context (the rows of its position table, or the length a
    model with other positions was trained at) is refused, never cropped, unless --extrapolate or
    --rope-scaling lets such a model read further. Past it, generation continues with a sliding
    window of the last context tokens, or stops with --no-slide.
    """

    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", help="Read the prompt from a UTF-8 file.")] = None
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per sample instead of streaming text.")
    ] = False
    overrides: SetOption = None
    kv_cache: Annotated[
        bool,
        typer.Option(
            "--kv-cache/--no-kv-cache",
            hidden=True,
            help="Use the KV cache while the window fills (off: full recompute, for benchmarks).",
        ),
    ] = True
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False
    extrapolate: ExtrapolateOption = False
    rope_scaling: RopeScalingOption = None


@dataclass(frozen=True, kw_only=True)
class EvalOptions(Options):
    """Score every token of a text file with a trained run: nats per token, bits per byte, perplexity.
    On a task run (or with a .jsonl file of pairs): exact-match and per-position accuracy."""

    config: ConfigOption = None
    run: RunOption = None
    data: Annotated[
        Path | None,
        typer.Option("--data", help="UTF-8 text file to score, or a .jsonl file of prompt/completion pairs."),
    ] = None
    task: Annotated[
        str | None,
        typer.Option("--task", help="The run's task: accuracy on its held-out examples (the default for a task run)."),
    ] = None
    task_length: Annotated[
        str | None,
        typer.Option(
            "--task-length",
            metavar="N|A-B",
            help="A task run's task at length N (trained on or not): exact match on held-out examples of that "
            "length; A-B: a table of every length from A to B, each marked trained or not. Longer than the "
            "model's context only with --extrapolate (any positions but a learned table).",
        ),
    ] = None
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: tokens, bytes, nats_per_token, bits_per_byte, perplexity (with a task: "
            "examples, right, accuracy, per_position, wrong).",
        ),
    ] = False
    per_token: Annotated[
        Path | None,
        typer.Option("--per-token", help="Write one JSON line per scored token: position, id, token, surprisal_bits."),
    ] = None
    by_position: Annotated[
        bool,
        typer.Option(
            "--by-position",
            help="The mean loss at each position 0..N-1 of the text's non-overlapping windows of N tokens, each "
            "read from position 0, positions past the trained length marked (--json: length, trained_length, "
            "windows, positions, mean_inside, mean_past).",
        ),
    ] = False
    length: Annotated[
        int | None,
        typer.Option(
            "--length",
            metavar="N",
            help="With --by-position: tokens per window (default: the model's context; past it, --extrapolate or "
            "--rope-scaling).",
        ),
    ] = None
    windows: Annotated[
        int | None,
        typer.Option(
            "--windows",
            metavar="K",
            help="With --by-position: at most K windows, spread evenly over the text (default: all it holds).",
        ),
    ] = None
    png: Annotated[
        Path | None,
        typer.Option("--png", help="With --by-position: also draw the loss by position as a curve (needs matplotlib)."),
    ] = None
    force: ForceOutputOption = False
    overrides: SetOption = None
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False
    extrapolate: ExtrapolateOption = False
    rope_scaling: RopeScalingOption = None


@dataclass(frozen=True, kw_only=True)
class PlotOptions(Options):
    """Training loss, validation loss and validation bits/byte of one or several runs, overlaid. Given
    a sweep's folder: a metric of its cells against one grid key, a line per value of the others."""

    runs: Annotated[list[Path], typer.Argument(help="Run folders to overlay, or one sweep folder.")]
    out: Annotated[
        Path | None, typer.Option("-o", "--out", help="PNG to write (needs matplotlib); without it, a text plot.")
    ] = None
    force: ForceOutputOption = False
    x: Annotated[str, typer.Option("--x", help="step, or time (seconds of training).")] = "step"
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            help="A sweep's: final (validation loss, the default), best, diverged_at (the step) or wall (seconds).",
        ),
    ] = None
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            metavar="KEY",
            help="A sweep's grid key along x (default: the first); a line per value of the other keys, the mean "
            "over seeds with each seed a point.",
        ),
    ] = None


@dataclass(frozen=True, kw_only=True)
class InfoOptions(Options):
    """Count a run: its parameters part by part with the formula beside each, a forward pass's
    arithmetic per token and per part at T positions, training's memory (an estimate), and what
    its `auto` settings chose."""

    config: ConfigOption = None
    run: RunOption = None
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            help="T: the positions a forward pass reads, for its arithmetic (default: the model's context).",
        ),
    ] = None
    as_json: Annotated[bool, typer.Option("--json", help="Print the same numbers as one JSON object.")] = False
    overrides: SetOption = None
    checkpoint: CheckpointOption = "last"
