"""The options of the commands that look inside a run's forward pass: trace (one position through
every block), patch (activation patching) and explore (a local page that traces as its controls
move): one frozen dataclass each, built on options.py.
Light on purpose (no torch): `minigpt --help` imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from .options import (
    CheckpointOption,
    CompareRunOption,
    ConfigOption,
    ExtrapolateOption,
    ForceOutputOption,
    Options,
    RopeScalingOption,
    RunOption,
    SetOption,
    TrustExerciseOption,
)


@dataclass(frozen=True, kw_only=True)
class TraceOptions(Options):
    """Follow one position through every block: norm1, attention, residual1, norm2, hidden, ffn, output.

    Interventions (--scale, --replace-residual, --ablate-head, --set-input, --broadcast-update) change
    stages of the same forward pass, --set-row and --norm-over a copy of the model; --compare shows
    what follows from them. --compare-run shows what another run of the same shape computes
    differently (what fine-tuning changed: --compare-run origin; a post-norm copy beside a pre-norm
    run), --compare-ids what other tokens change. --feed runs one part on your own numbers.
    """

    config: ConfigOption = None
    run: RunOption = None
    prompt: Annotated[str | None, typer.Option("-p", "--prompt", help="Text whose tokens are traced.")] = None
    ids: Annotated[str | None, typer.Option("--ids", help="Token ids instead of a prompt, e.g. 0,1,2.")] = None
    position: Annotated[
        int | None,
        typer.Option("--position", help="Position to follow (default: the last; negative counts from the end)."),
    ] = None
    block: Annotated[int | None, typer.Option("--block", help="Show only this block (default: all).")] = None
    digits: Annotated[int, typer.Option("--digits", help="Decimals shown for each number.")] = 4
    top: Annotated[int, typer.Option("--top", help="Next-token candidates shown.")] = 5
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole trace as one JSON object with full rows.")
    ] = False
    overrides: SetOption = None
    scale: Annotated[
        list[str] | None,
        typer.Option(
            "--scale",
            help="Multiply a sublayer's update: B.attention=K or B.ffn=K (B: block or all; 0 removes it). Repeatable.",
        ),
    ] = None
    replace_residual: Annotated[
        list[str] | None,
        typer.Option(
            "--replace-residual",
            help="Broken mode for block B (or all): residual1 = attention, output = ffn, instead of the sums.",
        ),
    ] = None
    ablate_head: Annotated[
        list[str] | None,
        typer.Option("--ablate-head", help="Zero head H's contribution in block B: B.H. Repeatable."),
    ] = None
    set_input: Annotated[
        str | None,
        typer.Option(
            "--set-input",
            help='Replace the traced position\'s block-0 input row, e.g. "2,2,2,2" (model width numbers).',
        ),
    ] = None
    set_row: Annotated[
        list[str] | None,
        typer.Option(
            "--set-row",
            help="Set a table row in a copy of the weights: token_table.TOKEN=NUMBERS (TOKEN: its text or #ID) or "
            "position_table.P=NUMBERS, e.g. token_table.a=2,1. Repeatable.",
        ),
    ] = None
    norm_over: Annotated[
        str | None,
        typer.Option(
            "--norm-over",
            help="positions: every block's norms take their statistics over the positions, the wrong axis "
            "(chapter 17.3), in a copy of the model, for watching a later token change an earlier row.",
        ),
    ] = None
    broadcast_update: Annotated[
        list[str] | None,
        typer.Option(
            "--broadcast-update",
            help="Hand block B's residual add the update of position 0 alone, [1, 1, C], for every position: "
            "B.attention or B.ffn. The model refuses it (chapter 17.2).",
        ),
    ] = None
    at_position: Annotated[
        bool,
        typer.Option(
            "--at-position",
            help="Apply --scale, --replace-residual and --ablate-head at the traced position only "
            "(default: every position).",
        ),
    ] = False
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Show the unmodified and the modified pass side by side, with norms, changes and the KL "
            "divergence of the next-token distributions.",
        ),
    ] = False
    compare_run: CompareRunOption = None
    compare_ids: Annotated[
        str | None,
        typer.Option(
            "--compare-ids",
            help="Trace these ids (as many as the prompt's) beside the prompt, with the same interventions: what "
            "the other tokens change at the traced position.",
        ),
    ] = None
    all_positions: Annotated[
        bool,
        typer.Option(
            "--all-positions",
            help="Every position's row of every stage (the whole matrix), not only the traced position's.",
        ),
    ] = False
    feed: Annotated[
        list[str] | None,
        typer.Option(
            "--feed",
            help="Run one part on your own row, every step shown, no prompt: B.ffn=NUMBERS, B.norm1=..., B.norm2=... "
            "or final_norm=..., e.g. 0.ffn=1,-1. Repeatable.",
        ),
    ] = None
    attribute: Annotated[
        str | None,
        typer.Option(
            "--attribute",
            help="Split the traced position's logit for TOKEN (its text, one token of the run's tokenizer, or #ID) "
            "into what each part wrote: token and position rows, every head, every FFN.",
        ),
    ] = None
    versus: Annotated[
        str | None,
        typer.Option("--versus", help="With --attribute: split the logit difference TOKEN minus this token."),
    ] = None
    grad: Annotated[
        bool,
        typer.Option(
            "--grad",
            help="Also the gradient of the next token's loss with respect to every stage's row, its norm "
            "beside each stage (at the last position: of the model's top prediction).",
        ),
    ] = False
    target: Annotated[
        str | None,
        typer.Option("--target", help="With --grad: the loss of this token instead (its text, one token, or #ID)."),
    ] = None
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False
    extrapolate: ExtrapolateOption = False
    rope_scaling: RopeScalingOption = None
    png: Annotated[
        Path | None,
        typer.Option(
            "--png",
            help="Also write every head's attention weights in every block as heat maps, or with --attribute "
            "the parts as bars (needs matplotlib).",
        ),
    ] = None
    force: ForceOutputOption = False


@dataclass(frozen=True, kw_only=True)
class PatchOptions(Options):
    """Activation patching: run the corrupt prompt, put back one activation of the clean prompt at a
    time, and show how much of the clean logit difference (answer minus versus) each restores.

    0 is the corrupt run's difference, 1 the clean run's. The prompts must have the same number of
    tokens; the difference is read at the last position.
    """

    config: ConfigOption = None
    run: RunOption = None
    clean: Annotated[str | None, typer.Option("--clean", help="The prompt whose activations are put back.")] = None
    corrupt: Annotated[
        str | None, typer.Option("--corrupt", help="The prompt that is run, with one clean activation at a time.")
    ] = None
    answer: Annotated[
        str | None,
        typer.Option("--answer", help="The token the clean prompt should predict: its text (one token) or #ID."),
    ] = None
    versus: Annotated[
        str | None, typer.Option("--versus", help="The token it is compared with: the metric is answer minus versus.")
    ] = None
    by: Annotated[
        str,
        typer.Option(
            "--by",
            help="stage: every block's input, attention, residual1, ffn and output at each position (residual "
            "= attention: the embedding, each block's read1, attention, read2 and ffn, and final_read); "
            "head: every head, at all positions and at each.",
        ),
    ] = "stage"
    digits: Annotated[int, typer.Option("--digits", help="Decimals shown for each effect.")] = 2
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the clean and corrupt runs and every effect as JSON.")
    ] = False
    png: Annotated[
        Path | None, typer.Option("--png", help="Also draw the effects as heat maps (needs matplotlib).")
    ] = None
    force: ForceOutputOption = False
    overrides: SetOption = None
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False
    extrapolate: ExtrapolateOption = False
    rope_scaling: RopeScalingOption = None


@dataclass(frozen=True, kw_only=True)
class ExploreOptions(Options):
    """Serve a local page to explore a run: trace a position, move the lesson's controls (attention and
    FFN scale, replace-instead-of-add, head ablation, the input vector) and see before and after;
    with --compare-run, another run's pass before and this run's after."""

    config: ConfigOption = None
    run: RunOption = None
    host: Annotated[str, typer.Option("--host", help="Address to bind (default: this machine only).")] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", help="Port to serve on (0: any free port).")] = 8017
    overrides: SetOption = None
    checkpoint: CheckpointOption = "last"
    trust_exercise: TrustExerciseOption = False
    extrapolate: ExtrapolateOption = False
    rope_scaling: RopeScalingOption = None
    compare_run: CompareRunOption = None
