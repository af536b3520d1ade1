"""One TOML file, four sections, typed and validated.

`[model]`, `[tokenizer]`, `[train]` and `[sample]` map onto the dataclasses below. Every key is
checked for name, type and allowed range; a typo gets the closest known key suggested. The same
checks apply to `--set section.key=value` overrides, so the command line cannot smuggle in a value
the file would be refused for.

Relative paths inside a config file are resolved against the file's own folder (as pyproject and
tsconfig do), so a config works whatever directory the command runs in. Paths given with `--set`
are resolved against the current directory, like any other shell argument.
"""

from __future__ import annotations

import difflib
import json
import math
import sysconfig
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError, Phrase
from .rope_scaling import parse_rope_scaling


def _shipped_root() -> Path:
    """Where configs/ and data/ are: the checkout (an editable install, or running from source), else
    the copy a regular `pip install .` puts under <prefix>/share/minigpt (pyproject's data-files)."""
    checkout = Path(__file__).resolve().parent.parent
    installed = Path(sysconfig.get_path("data")) / "share" / "minigpt"
    if not (checkout / "configs" / "default.toml").is_file() and (installed / "configs" / "default.toml").is_file():
        return installed
    return checkout


PROJECT_ROOT = _shipped_root()
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.toml"
DEFAULT_CORPUS = PROJECT_ROOT / "data" / "tinyshakespeare.txt"


# `[model] exercise`: what each exercise's learner's module needs of [model] (minigpt/exercises/catalogue.py
# says the rest of each); the FFN ones, and the block, need an FFN in every block.
EXERCISE_MODEL: dict[str, dict[str, Any]] = {
    "rmsnorm": {"norm": "rmsnorm"},
    "layernorm": {"norm": "layernorm"},
    "ffn": {"activation": "relu"},
    "attention": {},
    "block": {"norm_position": "pre", "residual": True},
    "swiglu": {"activation": "swiglu"},
}
EXERCISES_WITH_FFN = ("ffn", "block", "swiglu")


def _spec(
    default: Any,
    help: str,
    *,
    choices: tuple = (),
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_max: bool = False,
    positive: bool = False,
    short: str = "",
):
    """A dataclass field carrying what is allowed, so validation, messages and a key's command-line
    flag come from one place. The flag of a key is `--` + its name hyphenated (a bool's is the pair
    `--name/--no-name`), with `-` + `short` as its alias where it has one; its help is `help`."""
    return field(
        default=default,
        metadata=dict(
            help=help,
            choices=choices,
            minimum=minimum,
            maximum=maximum,
            exclusive_max=exclusive_max,
            positive=positive,
            short=short,
        ),
    )


@dataclass
class ModelConfig:
    context: int = _spec(
        32,
        "the length the model trains at: rows of the learned position table; with rope, alibi or none the "
        "longest text it accepts unless read past it on purpose (extrapolate, rope scaling)",
        minimum=1,
    )
    n_layer: int = _spec(4, "number of transformer blocks", minimum=1)
    n_head: int = _spec(4, "attention heads per block", minimum=1)
    n_embd: int = _spec(128, "model width C (a multiple of n_head, unless head_width is set)", minimum=1)
    ffn_hidden: int = _spec(512, "hidden width F of the position-wise FFN (0: no FFN, attention only)", minimum=0)
    norm_eps: float = _spec(1e-5, "epsilon added to the variance inside each norm", positive=True)
    dropout: float = _spec(
        0.0, "dropout probability (0 for exact teaching runs)", minimum=0.0, maximum=1.0, exclusive_max=True
    )
    norm: str = _spec(
        "layernorm",
        "normalisation (none: the identity where each norm stands)",
        choices=("layernorm", "rmsnorm", "none"),
    )
    norm_position: str = _spec("pre", "pre-norm (chapter 17.5) or post-norm (17.6)", choices=("pre", "post"))
    activation: str = _spec(
        "relu",
        "FFN non-linearity: relu, gelu (exact, erf), gelu_tanh (the tanh approximation GPT-2 uses) or swiglu",
        choices=("relu", "gelu", "gelu_tanh", "swiglu"),
    )
    bias: bool = _spec(True, "biases in the linear layers and in LayerNorm (RMSNorm has none)")
    qkv_bias: bool = _spec(
        False, "biases on W_Q, W_K and W_V even with bias = false (Qwen2's attention; Llama's attention_bias)"
    )
    out_bias: bool = _spec(False, "a bias on W_O even with bias = false (Llama's attention_bias)")
    ffn_bias: bool = _spec(False, "biases on the FFN's W1 and W2 even with bias = false (Llama's mlp_bias)")
    n_kv_head: int = _spec(
        0,
        "key and value heads (grouped-query attention): each is read by n_head / n_kv_head query heads; "
        "0: n_head, one key and value head per query head (multi-head attention)",
        minimum=0,
    )
    head_width: int = _spec(
        0,
        "width d of each attention head; 0: n_embd / n_head (set it where a model's heads are narrower or "
        "wider than that, as some imported ones are)",
        minimum=0,
    )
    tie_embeddings: bool = _spec(False, "share the token table with the vocabulary head")
    dtype: str = _spec("float32", "parameter dtype; float64 for exact teaching runs", choices=("float32", "float64"))
    positions: str = _spec(
        "learned",
        "learned: a position table added to the token row; none: no table, the input is the token row alone; "
        "rope: rotary positions, each query and key rotated by its position inside attention; alibi: a linear "
        "bias on the attention scores, -slope x distance, a slope per head",
        choices=("learned", "none", "rope", "alibi"),
    )
    rope_theta: float = _spec(
        10000.0,
        "rope's base: dimension pair i of a head rotates at rope_theta^(-2i/d) radians a position",
        positive=True,
    )
    rope_scaling: str = _spec(
        "",
        "the model's own rope scaling rule, always applied (an imported model's rope_scaling, e.g. "
        "llama3:32,original_context=8192); empty: none. Reading past the trained length is chosen per command instead",
    )
    rope_angles: str = _spec(
        "dtype",
        "the arithmetic of rope's angles: dtype (the model's: a float64 model's rope is exact) or float32 "
        "(transformers', so an imported model computes what transformers computes)",
        choices=("dtype", "float32"),
    )
    sliding_window: int = _spec(
        0,
        "attention reads at most this many keys back (Mistral's sliding_window); minigpt refuses texts longer "
        "than it rather than compute another attention; 0: no window",
        minimum=0,
    )
    residual: bool | str = _spec(
        True,
        "the skip connections: x + sublayer(...) (false: x = sublayer(...) alone; attention: Attention "
        "Residuals, each sublayer reads a learned softmax mix of the embedding and every earlier sublayer's output)",
        choices=(True, False, "attention"),
    )
    attention_residual_blocks: int = _spec(
        0,
        'with residual = "attention": 0 mixes every earlier sublayer output (full Attention Residuals); N mixes '
        "the embedding and N block sums (Block AttnRes: the sublayers split into N equal blocks, summed inside each)",
        minimum=0,
    )
    exercise: str = _spec(
        "none",
        "a learner's module in place of minigpt's (minigpt exercise): rmsnorm or layernorm at every norm, ffn "
        "or swiglu as each FFN, attention as each attention, block as each block; none: minigpt's own",
        choices=("none", *EXERCISE_MODEL),
    )

    @property
    def kv_heads(self) -> int:
        """Key and value heads: n_kv_head, or n_head when it is 0 (multi-head attention)."""
        return self.n_kv_head or self.n_head

    @property
    def head_size(self) -> int:
        """d, the width of one attention head: head_width, or n_embd / n_head when it is 0."""
        return self.head_width or self.n_embd // self.n_head

    def biased(self, part: str) -> bool:
        """Whether linear part `part` (qkv, out, W1, W2) has a bias: bias, or its own switch."""
        own = {"qkv": self.qkv_bias, "out": self.out_bias, "W1": self.ffn_bias, "W2": self.ffn_bias}[part]
        return self.bias or own

    @property
    def layers(self) -> int:
        """The layers Attention Residuals counts: every attention and every FFN sublayer, in order."""
        return self.n_layer * (2 if self.ffn_hidden > 0 else 1)

    @property
    def layers_per_residual_block(self) -> int:
        """Attention Residuals: the layers whose outputs one block sums (1: the full form)."""
        return self.layers // (self.attention_residual_blocks or self.layers)


# [model] keys added after checkpoints were first written: one stored without them was trained with
# their defaults, which is what every earlier model computed.
LATER_MODEL_KEYS = (
    "positions",
    "residual",
    "exercise",
    "rope_theta",
    "attention_residual_blocks",
    "qkv_bias",
    "out_bias",
    "ffn_bias",
    "n_kv_head",
    "head_width",
    "rope_scaling",
    "rope_angles",
    "sliding_window",
)
# The same for [train]: a run trained before tasks existed trained on text, task = "none".
LATER_TRAIN_KEYS = (
    "task",
    "task_length",
    "task_lengths",
    "task_held_out",
    "recompute",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_targets",
    "exercise_file",
)
LORA_TARGETS = ("qkv", "out", "W1", "W2")

TASKS = ("reverse", "sort", "copy", "add")


@dataclass
class TokenizerConfig:
    kind: str = _spec(
        "bpe",
        "byte-level BPE, one id per character, or 256 byte ids, fitted to the training text; imported: the "
        "tokenizer an imported model came with (the run's tokenizer.json), never fitted again",
        choices=("bpe", "char", "byte", "imported"),
    )
    vocab_size: int = _spec(
        1024, "BPE vocabulary size (at least 257: 256 bytes plus merges); imported: the tokenizer's ids", minimum=1
    )


@dataclass
class TrainConfig:
    data: str | list[str] = _spec(
        str(DEFAULT_CORPUS),
        "UTF-8 text file to train on, a folder (every *.txt under it, in sorted order), or a list of files and "
        "folders, joined with an end-of-text token between two files (default: the shipped Tiny Shakespeare)",
    )
    out: str = _spec("", "run folder to write; empty means runs/<config name> under the current directory")
    task: str = _spec(
        "none",
        "train on a generated task instead of data: reverse, sort or copy a string of letters, or add two "
        "numbers; examples drawn from the seed, a character tokenizer, the loss on the answer only",
        choices=("none", *TASKS),
    )
    task_length: int = _spec(
        0,
        "letters of each task input (reverse, sort, copy), or digits of each number (add); 0: 8 letters, 3 digits",
        minimum=0,
    )
    task_lengths: str = _spec(
        "",
        'mixed lengths: "A-B" trains on every task_length from A to B, each example\'s drawn uniformly, '
        "task_held_out of each length held out; empty: task_length alone",
    )
    task_held_out: int = _spec(1000, "task examples held out for evaluation, never drawn for training", minimum=1)
    init_from: str = _spec(
        "",
        "a run folder to fine-tune: this run starts from its weights and keeps its model section and "
        "tokenizer (empty: fresh weights)",
    )
    init_checkpoint: str = _spec("last", "which weights of the init_from run: last, or best", choices=("last", "best"))
    exercise_file: str = _spec(
        "", "the learner's file of the model's exercise (empty: exercises/NAME.py in the current folder)"
    )
    recompute: bool = _spec(
        False,
        "keep only each block's input for the backward pass and compute the rest again there (less memory, "
        "about a third more arithmetic)",
    )
    lora_rank: int = _spec(
        0,
        "LoRA: train a rank-r update B A of each targeted matrix of the init_from run, its weights frozen "
        "(0: fine-tune every weight)",
        minimum=0,
    )
    lora_alpha: float = _spec(16.0, "LoRA's scale numerator: the update is (lora_alpha / lora_rank) B A", positive=True)
    lora_dropout: float = _spec(
        0.0, "dropout on a LoRA update's input (training only)", minimum=0.0, maximum=1.0, exclusive_max=True
    )
    lora_targets: str = _spec(
        "qkv,out,W1,W2",
        "the matrices LoRA adapts in every block, comma-separated: qkv (attention's W_Q | W_K | W_V), out "
        "(W_O), W1 and W2 (the FFN's)",
    )
    val_fraction: float = _spec(
        0.1, "contiguous tail of the text kept for validation", positive=True, maximum=1.0, exclusive_max=True
    )
    batch_size: int = _spec(64, "windows per optimizer micro-step", minimum=1)
    grad_accum: int = _spec(1, "micro-steps accumulated per optimizer step", minimum=1)
    steps: int = _spec(750, "optimizer steps", minimum=1)
    learning_rate: float = _spec(3e-3, "peak learning rate", positive=True)
    min_lr: float = _spec(1e-4, "learning rate at the end of the cosine decay", minimum=0.0)
    warmup_steps: int = _spec(100, "linear warmup steps", minimum=0)
    optimizer: str = _spec(
        "auto",
        "adamw for every parameter, muon for the blocks' weight matrices with AdamW for the tables, "
        "head, gains and biases, or auto: muon where its per-step orthogonalisation costs under half "
        "the step's own arithmetic (small batches make it dear), else adamw",
        choices=("adamw", "muon", "auto"),
    )
    muon_learning_rate: float = _spec(
        0.02, "peak learning rate of Muon (optimizer = muon), on the same schedule", positive=True
    )
    weight_decay: float = _spec(0.1, "decoupled weight decay, applied to matrices only", minimum=0.0)
    beta1: float = _spec(0.9, "AdamW beta1", minimum=0.0, maximum=1.0, exclusive_max=True)
    beta2: float = _spec(0.99, "AdamW beta2", minimum=0.0, maximum=1.0, exclusive_max=True)
    grad_clip: float = _spec(1.0, "clip the global gradient norm to this (0 disables)", minimum=0.0)
    eval_interval: int = _spec(250, "steps between validation evaluations", minimum=1)
    eval_batches: int = _spec(16, "fixed validation batches per evaluation", minimum=1)
    log_interval: int = _spec(10, "steps between training-loss records in metrics.jsonl", minimum=1)
    checkpoint_interval: int = _spec(250, "steps between checkpoints (also saved at the end)", minimum=1)
    seed: int = _spec(1337, "seed for initialisation, batches and dropout")
    device: str = _spec(
        "auto",
        "where train, sample and trace compute; auto picks cuda, then mps, else cpu",
        choices=("auto", "cpu", "cuda", "mps"),
    )
    threads: int = _spec(
        0,
        "CPU threads for torch in every command (0: one per core for training, fixed for the whole run, "
        "which a resume continues at; one for sampling a single sample and for trace)",
        minimum=0,
    )
    adaptive_threads: bool = _spec(
        False,
        "with threads = 0: time thread counts before and during training and switch to the fastest (faster "
        "when another program keeps a core busy); gives up bitwise equality between runs and across a resume",
    )
    tensorboard: bool = _spec(
        False, "also write the logged values as TensorBoard event files in the run folder (the tensorboard extra)"
    )
    sample_every: int = _spec(
        0, "steps between short samples printed during training and kept in metrics.jsonl (0 = off)", minimum=0
    )
    sample_prompt: str = _spec("", "prompt of the samples during training; empty starts from a newline")
    sample_tokens: int = _spec(48, "new tokens in each sample during training", minimum=1)
    precision: str = _spec(
        "auto",
        "matmul precision while training: auto (bfloat16 where the hardware has it, "
        "else float32), float32 or bfloat16; weights stay float32",
        choices=("auto", "float32", "bfloat16"),
    )


@dataclass
class SampleConfig:
    """What `minigpt sample` does; every key is also one of its flags."""

    prompt: str = _spec("", "text to continue; empty starts from a newline", short="p")
    max_new_tokens: int = _spec(200, "tokens to generate", minimum=0, short="n")
    temperature: float = _spec(0.8, "softmax temperature (> 0)", positive=True)
    top_k: int = _spec(0, "keep only the k most likely tokens (0 = off)", minimum=0)
    top_p: float = _spec(1.0, "nucleus sampling mass in (0, 1] (1.0 = off)", positive=True, maximum=1.0)
    greedy: bool = _spec(False, "always take the most likely token")
    seed: int = _spec(1337, "sampling seed")
    num_samples: int = _spec(1, "independent samples, generated as one batch", minimum=1)
    stop: str = _spec("", "stop a sample once this text appears in its completion (empty = never)")
    slide: bool = _spec(True, "past the position table, continue with a sliding window (false: stop there)")
    runtime: str = _spec(
        "torch",
        "what runs the window's forward past the position table: torch, or onnxruntime (the onnx "
        "extra: the same graph, exported by torch, with less cost per operation on the CPU)",
        choices=("torch", "onnxruntime"),
    )


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "tokenizer": TokenizerConfig,
    "train": TrainConfig,
    "sample": SampleConfig,
}
PATH_KEYS = {("train", "data"), ("train", "out"), ("train", "init_from"), ("train", "exercise_file")}
# Path keys that may also be a list of paths (a TOML array; a repeated option).
PATH_LISTS = {("train", "data")}
# Typed values for keys, by name, per section: {"train": {"steps": 500}} (flags, API arguments).
Given = Mapping[str, Mapping[str, Any]]


@dataclass
class Config:
    model: ModelConfig
    tokenizer: TokenizerConfig
    train: TrainConfig
    sample: SampleConfig
    name: str = "default"  # the config file's stem; names the default run folder
    source: str = "<defaults>"  # where it came from, for messages
    # The (section, key) pairs the user chose: in a config file they named, by an override or by an
    # option (a fine-tune checks these against the run it starts from; the rest it takes from there).
    chosen: frozenset[tuple[str, str]] = frozenset()

    @property
    def run_dir(self) -> Path:
        return Path(self.train.out) if self.train.out else Path.cwd() / "runs" / self.name

    def to_toml(self) -> str:
        """The resolved config, written so that `load_config` reads back exactly these values."""
        lines = [f"# resolved minigpt config (from {json.dumps(self.source, ensure_ascii=False)})"]
        for section in SECTIONS:
            lines.append(f"\n[{section}]")
            for key, value in asdict(getattr(self, section)).items():
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # JSON string escapes are valid TOML basic strings; TOML also forbids a raw DEL character.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _type_name(kind: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]


def _check_paths(section: str, key: str, value: Any, where: str | Phrase) -> str | list[str]:
    """A path or a non-empty list of paths; a list of one is that path (so `--data a.txt` and
    `data = ["a.txt"]` are the run `data = "a.txt"` is, and its config.toml says so)."""
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return value[0] if len(value) == 1 else list(value)
    if isinstance(value, str):
        return value
    literal = _toml_value(value) if isinstance(value, (bool, int, float, list)) else repr(value)
    raise ConfigError(
        '{where}: [{section}] {key} = {literal} is not a path or a list of paths; expected e.g. "my.txt" '
        'or ["a/", "b.txt"] (a file, a folder of *.txt files, or a list of them)',
        where=where,
        section=section,
        key=key,
        literal=literal,
    )


def _check_value(section: str, key: str, value: Any, where: str | Phrase) -> Any:
    if (section, key) in PATH_LISTS:
        return _check_paths(section, key, value, where)
    cls = SECTIONS[section]
    spec = {f.name: f for f in fields(cls)}[key]
    meta = spec.metadata
    literal = _toml_value(value) if isinstance(value, (bool, int, float, str)) else repr(value)
    shown = f"[{section}] {key} = {literal}"
    if spec.type == "bool | str":  # a switch with a third, named setting: residual = true | false | "attention"
        if not isinstance(value, (bool, str)) or value not in meta["choices"]:
            allowed = ", ".join(_toml_value(choice) for choice in meta["choices"])
            raise ConfigError(
                "{where}: {shown} is not allowed; choose one of: {allowed}", where=where, shown=shown, allowed=allowed
            )
        return value
    kind = {"int": int, "float": float, "bool": bool, "str": str}[spec.type]
    ok = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, int) and not isinstance(value, bool)
        if kind is int
        else isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is float
        else isinstance(value, str)
    )
    if not ok:
        raise ConfigError(
            "{where}: {shown} is not {type_name}; expected {type_name} ({help})",
            where=where,
            shown=shown,
            type_name=_type_name(kind),
            help=meta["help"],
        )
    if kind is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError("{where}: {shown} is not finite; expected a finite number", where=where, shown=shown)
    if meta["choices"] and value not in meta["choices"]:
        allowed = ", ".join(meta["choices"])
        close = difflib.get_close_matches(str(value), meta["choices"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            "{where}: {shown} is not allowed; choose one of: {allowed}{hint}",
            where=where,
            shown=shown,
            allowed=allowed,
            hint=hint,
        )
    if meta["positive"] and value <= 0:
        raise ConfigError("{where}: {shown} must be greater than 0", where=where, shown=shown)
    if meta["minimum"] is not None and value < meta["minimum"]:
        raise ConfigError(
            "{where}: {shown} must be at least {minimum}", where=where, shown=shown, minimum=meta["minimum"]
        )
    if meta["maximum"] is not None:
        too_big = value >= meta["maximum"] if meta["exclusive_max"] else value > meta["maximum"]
        if too_big:
            word = "below" if meta["exclusive_max"] else "at most"
            raise ConfigError(
                "{where}: {shown} must be {word} {maximum}",
                where=where,
                shown=shown,
                word=word,
                maximum=meta["maximum"],
            )
    if (section, key) == ("model", "rope_scaling") and value:  # a rule rope can compute, or refused here
        parse_rope_scaling(value, where)
    return value


def _unknown(name: str, known: list[str], what: str, where: str | Phrase) -> ConfigError:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(
        "{where}: unknown {what} {name!r}; {hint}allowed: {join}",
        where=where,
        what=what,
        name=name,
        hint=hint,
        join=", ".join(known),
    )


def _resolve_path(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def _apply(
    values: dict[str, dict[str, Any]], section: str, key: str, value: Any, where: str | Phrase, base: Path
) -> None:
    if section not in SECTIONS:
        raise _unknown(section, list(SECTIONS), "section", where)
    known = [f.name for f in fields(SECTIONS[section])]
    if key not in known:
        raise _unknown(key, known, f"key in [{section}]:", where)
    value = _check_value(section, key, value, where)
    if (section, key) in PATH_KEYS and value:
        value = [_resolve_path(v, base) for v in value] if isinstance(value, list) else _resolve_path(value, base)
    values[section][key] = value


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value). The value is read as TOML, else as a bare string."""
    where = Phrase("{set} {text}", text=text)
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError("{where}: expected section.key=value, e.g. {set} model.n_layer=2", where=where)
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words such as tokenizer.kind=char
    return section, key.strip(), value


def checked_override(text: str, where: str | Phrase | None = None) -> tuple[str, str, Any]:
    """One `section.key=value` override checked on its own, as load_config checks each (the key, its
    type and range; not yet against the rest of a config): (section, key, the value as the config
    takes it). A refusal names it as `where` says (by default `--set TEXT`)."""
    section, key, value = parse_override(text)
    listed = isinstance(value, list) and (section, key) in PATH_LISTS  # train.data=["a/", "b.txt"]
    if _is_text_key(section, key) and not isinstance(value, str) and not listed:
        value = text.partition("=")[2].strip()  # sample.prompt=1 means the text "1"
    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    _apply(values, section, key, value, where or Phrase("{set} {text}", text=text), Path.cwd())
    return section, key, values[section][key]


def _is_text_key(section: str, key: str) -> bool:
    cls = SECTIONS.get(section)
    return cls is not None and any(f.name == key and f.type in ("str", "str | list[str]") for f in fields(cls))


def _cross_checks(cfg: Config) -> None:
    where = cfg.source
    m, t, tr = cfg.model, cfg.tokenizer, cfg.train
    if m.n_embd % m.n_head and not m.head_width:
        raise ConfigError(
            "{where}: [model] n_embd = {n_embd} is not divisible by n_head = {n_head}; choose n_embd a "
            "multiple of n_head (e.g. {value})",
            where=where,
            n_embd=m.n_embd,
            n_head=m.n_head,
            value=m.n_head * max(1, m.n_embd // m.n_head),
        )
    if m.rope_scaling and m.positions != "rope":
        raise ConfigError(
            '{where}: [model] rope_scaling = "{given}" is given with positions = "{positions}"; it scales rotary '
            'positions, so use it with positions = "rope" or leave it empty',
            where=where,
            given=m.rope_scaling,
            positions=m.positions,
        )
    if m.n_head % m.kv_heads:
        raise ConfigError(
            "{where}: [model] n_kv_head = {given} does not divide n_head = {n_head}; each key and value head is "
            "shared by an equal group of query heads, so choose n_kv_head a divisor of n_head (e.g. 1 or {n_head})",
            where=where,
            given=m.n_kv_head,
            n_head=m.n_head,
        )
    if m.positions == "rope" and m.head_size % 2:
        raise ConfigError(
            '{where}: [model] positions = "rope" with heads of width {value} (head_width, or n_embd / n_head) is '
            "refused: rope rotates a head's coordinates in pairs, so a head's width must be even; choose n_embd "
            "and n_head so that n_embd / n_head is even, or an even head_width",
            where=where,
            value=m.head_size,
        )
    if (m.n_kv_head or m.head_width) and m.exercise in ("attention", "block"):
        raise ConfigError(
            '{where}: [model] exercise = "{exercise}" with n_kv_head or head_width set is refused: the exercise\'s '
            "attention has one key and value head per query head, each n_embd / n_head wide; leave both at 0 with it",
            where=where,
            exercise=m.exercise,
        )
    if m.exercise == "attention" and m.biased("qkv") != m.biased("out"):
        raise ConfigError(
            '{where}: [model] exercise = "attention" with qkv_bias = {qkv} and out_bias = {out} (bias = false) is '
            "refused: the exercise's attention takes one bias switch for W_Q, W_K, W_V and W_O together; set "
            "qkv_bias and out_bias alike with it",
            where=where,
            qkv=str(m.qkv_bias).lower(),
            out=str(m.out_bias).lower(),
        )
    if m.positions in ("rope", "alibi") and m.exercise in ("attention", "block"):
        raise ConfigError(
            '{where}: [model] exercise = "{exercise}" with positions = "{positions}" is refused: the exercise\'s '
            'attention knows no {positions} positions (they live inside attention); use positions = "learned" or '
            '"none" with it',
            where=where,
            exercise=m.exercise,
            positions=m.positions,
        )
    if m.residual == "attention" and m.norm_position == "post":
        raise ConfigError(
            '{where}: [model] residual = "attention" with norm_position = "post" is refused: Attention Residuals '
            "mixes the sublayers' outputs before each sublayer's own norm (pre-norm), and a post-norm block has no "
            'such place; use norm_position = "pre" with it',
            where=where,
        )
    if m.attention_residual_blocks and m.residual != "attention":
        raise ConfigError(
            "{where}: [model] attention_residual_blocks = {value} is given with residual = {residual}; it splits "
            'Attention Residuals into blocks, so set residual = "attention" with it, or leave it at 0',
            where=where,
            value=m.attention_residual_blocks,
            residual=_toml_value(m.residual),
        )
    layers = m.layers  # every attention and every FFN is one layer
    if m.attention_residual_blocks and layers % m.attention_residual_blocks:
        raise ConfigError(
            "{where}: [model] attention_residual_blocks = {value} does not divide the model's {layers} layers "
            "(n_layer = {n_layer} blocks, each an attention{ffn}); choose a divisor of {layers}, or 0 for one "
            "block per layer (full Attention Residuals)",
            where=where,
            value=m.attention_residual_blocks,
            layers=layers,
            n_layer=m.n_layer,
            ffn=" and an FFN" if m.ffn_hidden > 0 else "",
        )
    if m.norm == "none" and m.norm_position == "post":
        raise ConfigError(
            '{where}: [model] norm = "none" with norm_position = "post" is refused: without norms there is '
            "nothing to position, and the model would be the pre-norm one without norms; use norm_position = "
            '"pre" with norm = "none"',
            where=where,
        )
    if tr.task != "none" and ("tokenizer", "kind") in cfg.chosen and t.kind not in ("char", "imported"):
        raise ConfigError(
            '{where}: [train] task = "{task}" with [tokenizer] kind = "{kind}" is refused: a task is written one '
            'character per token; leave [tokenizer] kind out (a task run uses "char") or set it to "char"',
            where=where,
            task=tr.task,
            kind=t.kind,
        )
    if tr.task != "none" and ("train", "data") in cfg.chosen and tr.data != str(DEFAULT_CORPUS):
        raise ConfigError(
            '{where}: [train] task = "{task}" and [train] data = {data} are both given; a task run trains on the '
            "examples it generates and reads no data: give one of them",
            where=where,
            task=tr.task,
            data=_toml_value(tr.data),
        )
    if tr.task_lengths and length_range(tr.task_lengths) is None:
        raise ConfigError(
            '{where}: [train] task_lengths = {given} is not a range of lengths; write "A-B" with 1 <= A <= B '
            '(e.g. "1-8": every length from 1 to 8), or "" to train at task_length alone',
            where=where,
            given=_toml_value(tr.task_lengths),
        )
    if tr.task_lengths and tr.task_length:
        raise ConfigError(
            "{where}: [train] task_length = {length} and task_lengths = {given} are both given; give task_lengths "
            "for mixed lengths, or task_length for one",
            where=where,
            length=tr.task_length,
            given=_toml_value(tr.task_lengths),
        )
    if tr.adaptive_threads and tr.threads:
        raise ConfigError(
            "{where}: [train] adaptive_threads = true with threads = {threads} is refused: adaptive_threads times "
            "the thread count and switches it, threads = {threads} fixes it; set threads = 0 with it, or "
            "adaptive_threads = false",
            where=where,
            threads=tr.threads,
        )
    if tr.lora_rank:
        _check_lora(cfg)
    if t.kind == "bpe" and t.vocab_size < 257:
        raise ConfigError(
            '{where}: [tokenizer] vocab_size = {vocab_size} is too small for kind = "bpe"; byte-level BPE '
            "needs at least 257 (256 bytes plus merges)",
            where=where,
            vocab_size=t.vocab_size,
        )
    if tr.min_lr > tr.learning_rate:
        raise ConfigError(
            "{where}: [train] min_lr = {min_lr} is above learning_rate = {learning_rate}; set min_lr at most "
            "learning_rate",
            where=where,
            min_lr=tr.min_lr,
            learning_rate=tr.learning_rate,
        )


def length_range(text: str) -> range | None:
    """`[train] task_lengths` (and eval's `--task-length`) as the lengths it names: "N" or "A-B" with
    1 <= A <= B; None when the text is neither."""
    low, dash, high = text.strip().partition("-")
    if not low.strip().isdecimal() or (dash and not high.strip().isdecimal()):
        return None
    first, last = int(low), int(high) if dash else int(low)
    return range(first, last + 1) if 1 <= first <= last else None


def lora_targets(text: str) -> list[str]:
    """`[train] lora_targets` as names, in the order given."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _check_lora(cfg: Config) -> None:
    where, tr = cfg.source, cfg.train
    targets = lora_targets(tr.lora_targets)
    unknown = [name for name in targets if name not in LORA_TARGETS]
    if unknown or not targets or len(set(targets)) < len(targets):
        raise ConfigError(
            "{where}: [train] lora_targets = {given} is not a list of distinct matrices; choose from {join}, "
            'comma-separated (e.g. "qkv,out")',
            where=where,
            given=_toml_value(tr.lora_targets),
            join=", ".join(LORA_TARGETS),
        )
    if not tr.init_from:
        raise ConfigError(
            "{where}: [train] lora_rank = {rank} adapts a trained model, and init_from names none: there is "
            "nothing to adapt; give {init_from} RUN (a trained or imported run), or set lora_rank = 0",
            where=where,
            rank=tr.lora_rank,
        )
    if tr.optimizer == "muon":
        raise ConfigError(
            '{where}: [train] optimizer = "muon" with lora_rank = {rank} is refused: Muon orthogonalises full '
            'matrices, and LoRA trains rank-{rank} factors; use optimizer = "adamw" (or "auto", which takes it)',
            where=where,
            rank=tr.lora_rank,
        )


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    given: Given | None = None,
) -> Config:
    """Read a config file (the shipped default when None), apply `section.key=value` overrides, then
    the values given for keys by name, per section ({"train": {"steps": 500}}: already typed; a
    message names each by its key, which the command line shows as its flag), and validate."""
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

    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    chosen = (
        {(section, key) for section, table in raw.items() if isinstance(table, dict) for key in table}
        if named
        else set()
    )
    base = path.resolve().parent
    for section, table in raw.items():
        if section not in SECTIONS:
            raise _unknown(section, list(SECTIONS), "section", where)
        if not isinstance(table, dict):
            raise ConfigError("{where}: {section} must be a [{section}] table of keys", where=where, section=section)
        for key, value in table.items():
            _apply(values, section, key, value, where, base)
    for text in overrides:
        section, key, value = checked_override(text)
        values[section][key] = value
        chosen.add((section, key))
    _apply_given(values, given or {})
    chosen |= {(section, key) for section, keys in (given or {}).items() for key in keys}

    cfg = Config(
        **{s: SECTIONS[s](**values[s]) for s in SECTIONS}, name=path.stem, source=where, chosen=frozenset(chosen)
    )
    if overrides:  # plain text: it is also the header of a run's config.toml
        cfg.source = f"{where} with overrides {' '.join(overrides)}"
    cfg = _exercise(cfg)
    _cross_checks(cfg)
    return _task_tokenizer(cfg)


def _task_tokenizer(cfg: Config) -> Config:
    """A task is written one character per token: its run's [tokenizer] says so (config.toml too)."""
    if cfg.train.task != "none" and cfg.tokenizer.kind == "bpe" and ("tokenizer", "kind") not in cfg.chosen:
        return replace(cfg, tokenizer=replace(cfg.tokenizer, kind="char"))
    return cfg


def _exercise(cfg: Config) -> Config:
    """[model] exercise: the [model] values its learner's module needs (set where the config leaves
    the key out, refused where it sets it otherwise), and the learner's file ([train] exercise_file,
    by default exercises/NAME.py in the current folder, resolved here so the run records where)."""
    name, where = cfg.model.exercise, cfg.source
    if name == "none":
        if cfg.train.exercise_file:
            raise ConfigError(
                '{where}: [train] exercise_file = {file} names a learner\'s file, but [model] exercise = "none"; '
                "give {exercise} NAME as well, or leave exercise_file out",
                where=where,
                file=_toml_value(cfg.train.exercise_file),
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
                needed=_toml_value(needed),
                given=_toml_value(given),
            )
    if name in EXERCISES_WITH_FFN and cfg.model.ffn_hidden == 0:
        raise ConfigError(
            '{where}: [model] exercise = "{name}" needs an FFN in every block, and [model] ffn_hidden = 0 builds '
            "none; set ffn_hidden above 0",
            where=where,
            name=name,
        )
    file = cfg.train.exercise_file or str(Path.cwd() / "exercises" / f"{name}.py")
    return replace(cfg, model=replace(cfg.model, **needs), train=replace(cfg.train, exercise_file=file))


def _apply_given(values: dict[str, dict[str, Any]], given: Given) -> None:
    """Typed values for config keys, each named in messages as the parameter that gave it (a
    flag's name, an API argument's, an explore request's field: each is the key's own name)."""
    for section, keys in given.items():
        for key, value in keys.items():
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            _apply(values, section, key, value, Phrase("{" + key + "} {shown}", shown=shown), Path.cwd())


def updated(cfg: Config, given: Given) -> Config:
    """A copy of `cfg` with typed values set ({"sample": {"top_k": 5}}), each checked as a config
    file's would be."""
    values = {section: asdict(getattr(cfg, section)) for section in SECTIONS}
    _apply_given(values, given)
    new = _exercise(replace(cfg, **{section: SECTIONS[section](**values[section]) for section in SECTIONS}))
    _cross_checks(new)
    return _task_tokenizer(new)


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
    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, value in stored.items():
        _apply(values, "model", key, value, where, Path.cwd())
    model = ModelConfig(**values["model"])
    _cross_checks(Config(model, TokenizerConfig(kind="byte"), TrainConfig(), SampleConfig(), source=where))
    return model


def model_section_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`key: a-value != b-value` for every [model] key on which two model sections disagree."""
    later = {k: getattr(ModelConfig(), k) for k in LATER_MODEL_KEYS}  # absent from older checkpoints
    a, b = {**later, **a}, {**later, **b}
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
