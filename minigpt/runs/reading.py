"""Reading a run: the config a reading command uses (the run's own config.toml, or a config file
naming the run), a checkpoint and the tokenizer beside it, checked, and the model built from the
[model] section the checkpoint stores.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Config, ModelConfig, load_config, model_config_from
from ..device import check_dtype
from ..errors import MinigptError, option
from ..memory import check_memory, parameter_count, reading_bytes
from ..model.gpt import MiniGPT
from ..text.tokenizer import TextTokenizer
from .checkpoints import load_checkpoint, tokenizer_size
from .identity import check_model_matches
from .layout import BEST_FILE, CHECKPOINT_FILE, CHECKPOINTS, CONFIG_FILE, TOKENIZER_FILE


def saved_config(run_dir: Path, given_as: str = "run", overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The resolved config a run folder saved (config.toml: the run describes itself), with any
    overrides on top."""
    saved = Path(run_dir) / CONFIG_FILE
    if not saved.is_file():
        raise MinigptError(
            f"{option(given_as)} {run_dir} has no {CONFIG_FILE}, so it does not describe itself; "
            f"pass the config it was trained with as {option('config')}"
            if given_as == "run"
            else f"{option(given_as)} {run_dir} has no {CONFIG_FILE}, so it is not a run folder minigpt can read"
        )
    return load_config(saved, overrides)


def reading_config(config: Path | None, run_dir: Path | None, overrides: list[str]) -> tuple[Config, Path]:
    """The config and run folder of a command that reads a run (sample, trace, ...).

    `--run DIR` alone: DIR/config.toml, the resolved config the run saved. `-c FILE` alone: that
    file and the run folder it names. Both: the file (its [sample], device and threads), checked
    against the run's checkpoint when the model is loaded. Neither: the default config's run.
    """
    if run_dir is not None and config is None:
        run_dir = Path(run_dir).resolve()
        if not run_dir.is_dir():
            raise MinigptError(
                f"{option('run')} {run_dir}: no such run folder; train one there first (`minigpt train` with "
                f"{option('out')} {run_dir})"
            )
        return saved_config(run_dir, overrides=overrides), run_dir
    cfg = load_config(config, overrides)
    return cfg, Path(run_dir) if run_dir is not None else cfg.run_dir


@dataclass
class RunWeights:
    """One checkpoint of a run folder, read and checked: its [model] section, and the run's tokenizer."""

    path: Path  # the checkpoint file
    payload: dict[str, Any]
    model_config: ModelConfig
    tokenizer: TextTokenizer


def read_weights(run_dir: Path, checkpoint: str = "last", given_as: str = "run") -> RunWeights:
    """The last checkpoint of a run folder, or its best one, with the tokenizer beside it; refused
    (naming the folder as the option `given_as` that gave it) when it is not a consistent run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MinigptError(
            f"no run folder at {run_dir}; train one first with `minigpt train` (same config), or pass "
            f"{option(given_as)} DIR"
            if given_as == "run"
            else f"{option(given_as)} {run_dir}: no such run folder; give a folder `minigpt train` wrote"
        )
    if checkpoint not in CHECKPOINTS:
        raise MinigptError(f"{option('checkpoint')} {checkpoint!r} is not one of: {', '.join(CHECKPOINTS)}")
    path = run_dir / CHECKPOINTS[checkpoint]
    if given_as != "run" and not (run_dir / CHECKPOINT_FILE).is_file():
        raise MinigptError(
            f"{option(given_as)} {run_dir} is not a run folder (it has no {CHECKPOINT_FILE}); give a folder "
            f"`minigpt train` wrote"
        )
    if checkpoint == "best" and not path.is_file():
        raise MinigptError(
            f"{run_dir} has no {BEST_FILE} yet: it is written at the run's first evaluation; "
            f"use {option('checkpoint')} last, or train until an evaluation"
        )
    payload = load_checkpoint(path)
    model_config = model_config_from(payload.get("model_config"), f"checkpoint {path}")
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    rows, writable = payload["vocab_size"], tokenizer_size(payload)
    if tokenizer.vocab_size != writable or writable > rows:
        of_rows = f" (of its {rows} rows)" if writable != rows else ""
        raise MinigptError(
            f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but the checkpoint "
            f"expects {writable}{of_rows}; the run folder is inconsistent, retrain it"
        )
    return RunWeights(path, payload, model_config, tokenizer)


def load_model(
    cfg: Config, run_dir: Path | None = None, device: str = "cpu", checkpoint: str = "last"
) -> tuple[MiniGPT, TextTokenizer]:
    """The trained model (eval mode) and tokenizer of a run folder, from its last checkpoint or
    its best one. The model is built from the [model] section the checkpoint stores; a config
    whose [model] disagrees is refused, and so is a model the device has no room for, before it
    is built.

    The tokenizer writes ids 0 .. tokenizer.vocab_size - 1; an imported model may have more rows
    than that (model.vocab_size, nanoGPT's padding), rows kept exact that no text encodes to, so
    whatever draws ids from the logits must leave ids from tokenizer.vocab_size on out."""
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir
    weights = read_weights(run_dir, checkpoint)
    model_config, rows = weights.model_config, weights.payload["vocab_size"]
    check_dtype(device, model_config.dtype)
    check_model_matches(cfg, weights.payload, run_dir)
    check_memory(
        reading_bytes(model_config, rows),
        device,
        f"loading this model ({parameter_count(model_config, rows):,} parameters, {model_config.dtype}) "
        "and sampling from it",
        "free memory or use a machine with more",
    )
    # Built on the CPU and overwritten: a meta-device build would skip the random init, but its first
    # use imports a second of torch machinery, more than the init costs at this size.
    model = MiniGPT(model_config, rows)
    model.load_state_dict(weights.payload["model"])
    return model.to(device).eval(), weights.tokenizer
