"""Every command's options, each declared once: one frozen dataclass per command, whose fields are
the command's parameters (type, default, flag and help together). Typer reads each dataclass's own
constructor (cli.py), and the command module receives the filled-in dataclass, so an option reaches
the code that reads it by name, and adding one is one edit here.

A flag that sets a config key is not declared here but in minigpt/config/, as that key's field:
`config_flags` builds a command's flags from the fields of the keys it takes (type, help, spelling),
and the command's options inherit them. Each is None unless given; `Options.config_values` hands
what was given to the config, per section. Light on purpose (no torch): `minigpt --help` imports
this module.
"""

from __future__ import annotations

import typing
from dataclasses import Field, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import PATH_KEYS, PATH_LISTS, SECTIONS, ModelConfig, SampleConfig, TrainConfig
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
        help="Read past the length the model was trained at ([model] context) on purpose: a rope, alibi or none "
        "model accepts any length (a learned table has no row there and still refuses).",
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
    return Annotated[kind | None, typer.Option(*short, _long_flag(key.name, kind is bool), help=text)]


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


# The config keys `train` and `sample` take as flags, after -c (and --run).
TRAIN_FLAG_KEYS = ("data", "task", "task_length", "out", "steps", "init_from", "init_checkpoint", "exercise_file")
TrainKeys = config_flags(ModelConfig, ("exercise",), after=config_flags(TrainConfig, TRAIN_FLAG_KEYS, after=ConfigFile))
# `sweep` takes train's flags for every cell, but not its --out: a sweep's is the folder of the cells.
SweepKeys = config_flags(
    ModelConfig,
    ("exercise",),
    after=config_flags(TrainConfig, tuple(k for k in TRAIN_FLAG_KEYS if k != "out"), after=ConfigFile),
)
SampleKeys = config_flags(SampleConfig, after=ConfigAndRun)  # every [sample] key


# ---------------------------------------------------------------- the commands


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
class SampleOptions(SampleKeys):
    """Continue a prompt with a trained model. An empty prompt starts from a newline.

    A prompt longer than the model's context (the rows of its position table, or the length a
    rope, alibi or none model was trained at) is refused, never cropped, unless --extrapolate or
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
            "model's context only with --extrapolate (rope, alibi, none).",
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


# The command line: each command's name, its options, and the module in minigpt/commands/ that runs it.
# A name of two words is a subcommand ("import hf"): the first word groups them.
COMMANDS: dict[str, tuple[type[Options], str]] = {
    "train": (TrainOptions, "train"),
    "sweep": (SweepOptions, "sweep"),
    "sample": (SampleOptions, "sample"),
    "trace": (TraceOptions, "trace"),
    "patch": (PatchOptions, "patch"),
    "eval": (EvalOptions, "eval"),
    "export": (ExportOptions, "export"),
    "plot": (PlotOptions, "plot"),
    "explore": (ExploreOptions, "explore"),
    "info": (InfoOptions, "info"),
    "import hf": (ImportHfOptions, "imports"),
    "import nanogpt": (ImportNanogptOptions, "imports"),
    "exercise list": (ExerciseListOptions, "exercise"),
    "exercise start": (ExerciseStartOptions, "exercise"),
    "exercise check": (ExerciseCheckOptions, "exercise"),
}
GROUPS = {
    "import": "Bring a model from elsewhere into a run folder: a Hugging Face GPT-2 folder, or a nanoGPT checkpoint.",
    "exercise": "Implement a part of the model, get it checked, then train with it: list, start NAME, check NAME.",
}
