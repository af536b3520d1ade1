"""The command line: the Typer app, its commands and their options. Nothing else: each command
dispatches to its module in minigpt/commands/, imported only when it runs, so `minigpt --help`
answers without loading torch.

A command-line mistake (unknown option, a value of the wrong type) ends, like every other user
error, in one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Train a small GPT on a text file, sample from it, and trace one position through every block.",
)

CONFIG_HELP = (
    "TOML config shared by train, sample and trace (default: configs/default.toml; with --run "
    "alone, the run's own config.toml)."
)
SET_HELP = "Override one config key, e.g. --set model.n_layer=2 (repeatable)."
RUN_HELP = "Run folder to read; alone, it supplies its own config (default: the run the config names)."

# The options every command shares, declared once.
ConfigOption = Annotated[Path | None, typer.Option("-c", "--config", help=CONFIG_HELP)]
RunOption = Annotated[Path | None, typer.Option("--run", help=RUN_HELP)]
SetOption = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)]
CheckpointOption = Annotated[
    str, typer.Option("--checkpoint", help="Which weights of the run: last, or best (its lowest validation loss).")
]


@app.callback()
def root(
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of an internal error (also MINIGPT_DEBUG=1)."
    ),
) -> None:
    """Train a small GPT on a text file, sample from it, and trace one position through every block."""


@app.command()
def train(
    config: ConfigOption = None,
    data: Path | None = typer.Option(
        None, "--data", help="UTF-8 text file to train on (default: the shipped Tiny Shakespeare)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Run folder to write (default: runs/<config name>)."),
    steps: int | None = typer.Option(None, "--steps", help="Optimizer steps (overrides train.steps)."),
    overrides: SetOption = None,
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the run folder from its checkpoint."),
    force: bool = typer.Option(False, "--force", help="Replace an existing run folder."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or summaries (for scripts)."),
) -> None:
    """Train a model on a text file; write config, tokenizer, checkpoint and metrics to a run folder."""
    from .commands import train as command

    command.main(config, data, out, steps, overrides or [], resume, force, quiet)


@app.command()
def sample(
    config: ConfigOption = None,
    run: RunOption = None,
    prompt: str | None = typer.Option(
        None, "-p", "--prompt", help="Text to continue. An empty prompt starts from a newline."
    ),
    prompt_file: Path | None = typer.Option(None, "--prompt-file", help="Read the prompt from a UTF-8 file."),
    max_new_tokens: int | None = typer.Option(None, "-n", "--max-new-tokens", help="Tokens to generate."),
    temperature: float | None = typer.Option(None, "--temperature", help="Softmax temperature (> 0)."),
    top_k: int | None = typer.Option(None, "--top-k", help="Keep the k most likely tokens (0 = off)."),
    top_p: float | None = typer.Option(None, "--top-p", help="Nucleus sampling mass in (0, 1] (1 = off)."),
    greedy: bool | None = typer.Option(None, "--greedy/--no-greedy", help="Always take the most likely token."),
    seed: int | None = typer.Option(None, "--seed", help="Sampling seed."),
    num_samples: int | None = typer.Option(None, "--num-samples", help="Independent samples, generated as one batch."),
    stop: str | None = typer.Option(None, "--stop", help="Stop a sample when this text appears in its completion."),
    slide: bool | None = typer.Option(
        None,
        "--slide/--no-slide",
        help="Past the position table, continue with a sliding window (default) or stop there.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per sample instead of streaming text."),
    overrides: SetOption = None,
    kv_cache: bool = typer.Option(
        True,
        "--kv-cache/--no-kv-cache",
        hidden=True,
        help="Use the KV cache while the window fills (off: full recompute, for benchmarks).",
    ),
    checkpoint: CheckpointOption = "last",
) -> None:
    """Continue a prompt with a trained model. An empty prompt starts from a newline.

    A prompt longer than the model's context (the rows of its position table) is refused, never cropped.
    Past the table, generation continues with a sliding window of the last context tokens, or stops
    with --no-slide.
    """
    from .commands import sample as command

    options = {
        "sample.max_new_tokens": max_new_tokens,
        "sample.temperature": temperature,
        "sample.top_k": top_k,
        "sample.top_p": top_p,
        "sample.greedy": greedy,
        "sample.seed": seed,
        "sample.num_samples": num_samples,
        "sample.slide": slide,
    }
    command.main(config, run, prompt, prompt_file, options, stop, as_json, overrides or [], kv_cache, checkpoint)


@app.command()
def trace(
    config: ConfigOption = None,
    run: RunOption = None,
    prompt: str | None = typer.Option(None, "-p", "--prompt", help="Text whose tokens are traced."),
    ids: str | None = typer.Option(None, "--ids", help="Token ids instead of a prompt, e.g. 0,1,2."),
    position: int | None = typer.Option(
        None, "--position", help="Position to follow (default: the last; negative counts from the end)."
    ),
    block: int | None = typer.Option(None, "--block", help="Show only this block (default: all)."),
    digits: int = typer.Option(4, "--digits", help="Decimals shown for each number."),
    top: int = typer.Option(5, "--top", help="Next-token candidates shown."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole trace as one JSON object with full rows."),
    overrides: SetOption = None,
    scale: list[str] | None = typer.Option(
        None,
        "--scale",
        help="Multiply a sublayer's update: B.attention=K or B.ffn=K (B: block or all; 0 removes it). Repeatable.",
    ),
    replace_residual: list[str] | None = typer.Option(
        None,
        "--replace-residual",
        help="Broken mode for block B (or all): residual1 = attention, output = ffn, instead of the sums.",
    ),
    ablate_head: list[str] | None = typer.Option(
        None, "--ablate-head", help="Zero head H's contribution in block B: B.H. Repeatable."
    ),
    set_input: str | None = typer.Option(
        None,
        "--set-input",
        help='Replace the traced position\'s block-0 input row, e.g. "2,2,2,2" (model width numbers).',
    ),
    at_position: bool = typer.Option(
        False,
        "--at-position",
        help="Apply --scale, --replace-residual and --ablate-head at the traced position only "
        "(default: every position).",
    ),
    compare_passes: bool = typer.Option(
        False,
        "--compare",
        help="Show the unmodified and the modified pass side by side, with norms, changes and the KL "
        "divergence of the next-token distributions.",
    ),
    checkpoint: CheckpointOption = "last",
    png: Path | None = typer.Option(
        None, "--png", help="Also write every head's attention weights in every block as heat maps (needs matplotlib)."
    ),
) -> None:
    """Follow one position through every block: norm1, attention, residual1, norm2, hidden, ffn, output.

    Interventions (--scale, --replace-residual, --ablate-head, --set-input) change stages of the same
    forward pass; --compare shows what follows from them.
    """
    from .commands import trace as command

    command.main(
        config,
        run,
        prompt,
        ids,
        position,
        block,
        digits,
        top,
        as_json,
        overrides or [],
        scale or [],
        replace_residual or [],
        ablate_head or [],
        set_input,
        at_position,
        compare_passes,
        checkpoint,
        png,
    )


@app.command(name="eval")
def eval_(
    config: ConfigOption = None,
    run: RunOption = None,
    data: Path = typer.Option(..., "--data", help="UTF-8 text file to score."),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object: tokens, bytes, nats_per_token, bits_per_byte, perplexity."
    ),
    per_token: Path | None = typer.Option(
        None, "--per-token", help="Write one JSON line per scored token: position, id, token, surprisal_bits."
    ),
    overrides: SetOption = None,
    checkpoint: CheckpointOption = "last",
) -> None:
    """Score every token of a text file with a trained run: nats per token, bits per byte, perplexity."""
    from .commands import eval as command

    command.main(config, run, data, as_json, per_token, overrides or [], checkpoint)


@app.command()
def export(
    config: ConfigOption = None,
    run: RunOption = None,
    format: str = typer.Option(
        ..., "--format", help="safetensors (minigpt's names + config.json) or hf (a GPT-2 folder transformers loads)."
    ),
    out: Path = typer.Option(..., "--out", help="Folder to write (new or empty)."),
    overrides: SetOption = None,
    checkpoint: CheckpointOption = "last",
) -> None:
    """Export a run's weights: safetensors, or a Hugging Face GPT-2 folder (GPT2LMHeadModel,
    PreTrainedTokenizerFast)."""
    from .commands import export as command

    command.main(config, run, format, out, overrides or [], checkpoint)


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., help="Run folders to overlay."),
    out: Path | None = typer.Option(
        None, "-o", "--out", help="PNG to write (needs matplotlib); without it, a text plot."
    ),
    x: str = typer.Option("step", "--x", help="step, or time (seconds of training)."),
) -> None:
    """Training loss, validation loss and validation bits/byte of one or several runs, overlaid."""
    from .commands import plot as command

    command.main(runs, out, x)


@app.command()
def explore(
    config: ConfigOption = None,
    run: RunOption = None,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: this machine only)."),
    port: int = typer.Option(8017, "--port", help="Port to serve on (0: any free port)."),
    overrides: SetOption = None,
    checkpoint: CheckpointOption = "last",
) -> None:
    """Serve a local page to explore a run: trace a position, move the lesson's controls (attention and
    FFN scale, replace-instead-of-add, head ablation, the input vector) and see before and after."""
    from .commands import explore as command

    command.main(config, run, host, port, overrides or [], checkpoint)


def _speaks_for_all() -> bool:
    """False on all but the first process of each machine in a torchrun job: they read the same
    command line, so a mistake in it is said once per machine (the first process of a machine
    other than rank 0's is the only one whose output that machine shows). Read from torchrun's
    environment here rather than through distributed.py: a mistake is found before any command
    module, torch included, is imported."""
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1 or os.environ.get("LOCAL_RANK", "0") == "0"


def main() -> None:
    """Run the app; a command-line mistake ends in one line on stderr and exit status 2, not Click's
    multi-line box."""
    try:  # Typer >= 0.26 ships its own copy of Click; older releases use Click itself
        from typer._click import exceptions as click_exceptions
    except ImportError:  # pragma: no cover
        from click import exceptions as click_exceptions

    try:
        code = app(standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        code = 0
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "minigpt"
        message = " ".join(exc.format_message().split()).rstrip(".")
        if _speaks_for_all():
            typer.echo(f"minigpt: error: {message}; see '{command} --help'", err=True)
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # Ctrl-C outside the training loop
        if _speaks_for_all():
            typer.echo("minigpt: interrupted", err=True)
        code = 130
    except Exception as exc:  # not a refusal: a bug, or the machine failing under us
        if "--debug" in sys.argv[1:] or os.environ.get("MINIGPT_DEBUG", "") not in ("", "0"):
            raise
        detail = " ".join(str(exc).split())[:300]
        typer.echo(
            f"minigpt: internal error: {type(exc).__name__}{': ' + detail if detail else ''} "
            f"(run with --debug for the traceback)",
            err=True,
        )
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
