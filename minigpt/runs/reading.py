"""Reading a run: the config a reading command uses (the run's own config.toml, or a config file
naming the run), a checkpoint and the tokenizer beside it, checked, and the model built from the
[model] section the checkpoint stores (a LoRA run's: the base it names, with its adapters merged),
each of its tensors checked against the model's before it is loaded. Reading a checkpoint runs no
code: a learner's module (an exercise) is imported only where the model is built, and only as
runs/exercise.py allows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..config import Config, ModelConfig, load_config, model_config_from
from ..device import check_dtype
from ..errors import MinigptError
from ..io import file_sha256
from ..memory import check_memory, parameter_count, reading_bytes
from ..model import lora
from ..model.gpt import MiniGPT, Parts
from ..text.tokenizer import TextTokenizer
from .checkpoints import load_checkpoint, tokenizer_size
from .exercise import recorded_parts
from .identity import check_model_matches
from .layout import BEST_FILE, CHECKPOINT_FILE, CHECKPOINTS, CONFIG_FILE, TOKENIZER_FILE


class NotARun(MinigptError):
    """A folder that is not a run to read: `folder`, and what it lacks (`lacks`: the folder itself,
    or one of a run's files). Its message is a reading command's ({run}); a caller that read the
    folder for another reason (a fine-tune's source) says it in its own words from these values."""

    def __init__(self, folder: Path, lacks: str):
        self.folder, self.lacks = Path(folder), lacks
        if lacks == "folder" and self.folder.is_file():
            template, values = _a_file(self.folder)
            super().__init__(template, **values)
        elif lacks == "folder":
            super().__init__("no run folder at {folder}; train one there first, or pass {run} DIR", folder=folder)
        elif lacks == CONFIG_FILE:
            super().__init__(
                "{run} {folder} has no {lacks}, so it does not describe itself; pass the config it was trained "
                "with as {config}",
                folder=folder,
                lacks=lacks,
            )
        else:
            super().__init__(
                "{folder} is not a run folder (it has no {lacks}); train a run there first", folder=folder, lacks=lacks
            )


def _a_file(path: Path) -> tuple[str, dict[str, Any]]:
    """The refusal of a file given where a run folder belongs: what it is, and what to pass instead."""
    path = Path(path)
    if path.parent != path and any((path.parent / name).is_file() for name in (CONFIG_FILE, CHECKPOINT_FILE)):
        return "{run} {path} is a file of the run folder {folder}, not the folder itself; pass {run} {folder}", {
            "path": path,
            "folder": path.parent,
        }
    if path.suffix == ".toml":
        return (
            "{run} {path} is a config file, not a run folder; pass it as {config} {path} (it names the run folder "
            "its training wrote), or pass {run} that folder",
            {"path": path},
        )
    template = (
        "{run} {path} is {kind}, not a run folder (what training writes: {CONFIG_FILE}, {CHECKPOINT_FILE}, "
        "{TOKENIZER_FILE}); pass {run} such a folder"
    )
    text = path.suffix in (".txt", ".jsonl")
    return template + (", or train one on it with {data} {path} {out} DIR" if text else ""), {
        "path": path,
        "kind": "a text file" if text else "a file",
        "CONFIG_FILE": CONFIG_FILE,
        "CHECKPOINT_FILE": CHECKPOINT_FILE,
        "TOKENIZER_FILE": TOKENIZER_FILE,
    }


def saved_config(run_dir: Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The resolved config a run folder saved (config.toml: the run describes itself), with any
    overrides on top."""
    saved = Path(run_dir) / CONFIG_FILE
    if not saved.is_file():
        raise NotARun(run_dir, CONFIG_FILE)
    return load_config(saved, overrides)


def reading_config(config: Path | None, run_dir: Path | None, overrides: list[str]) -> tuple[Config, Path]:
    """The config and run folder of a command that reads a run (sample, trace, ...).

    `--run DIR` alone: DIR/config.toml, the resolved config the run saved. `-c FILE` alone: that
    file and the run folder it names. Both: the file (its [sample], device and threads), checked
    against the run's checkpoint when the model is loaded. Neither: the default config's run.
    """
    if run_dir is not None and config is None:
        run_dir_given, run_dir = run_dir, Path(run_dir).resolve()
        if run_dir.is_file():
            raise NotARun(Path(run_dir_given), "folder")
        if not run_dir.is_dir():
            raise MinigptError(
                "{run} {run_dir}: no such run folder; train one there first (with {out} {run_dir})", run_dir=run_dir
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
    parts: Parts | None = None  # a learner's module the model was trained with (runs/exercise.py)


def read_weights(run_dir: Path, checkpoint: str = "last") -> RunWeights:
    """The last checkpoint of a run folder, or its best one, with the tokenizer beside it; refused
    (NotARun, or what is inconsistent) when it is not a consistent run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NotARun(run_dir, "folder")
    if checkpoint not in CHECKPOINTS:
        raise MinigptError(
            "{checkpoint} {given!r} is not one of: {join}",
            given=checkpoint,
            join=", ".join(CHECKPOINTS),
        )
    path = run_dir / CHECKPOINTS[checkpoint]
    if not (run_dir / CHECKPOINT_FILE).is_file():
        raise NotARun(run_dir, CHECKPOINT_FILE)
    if checkpoint == "best" and not path.is_file():
        raise MinigptError(
            "{run_dir} has no {BEST_FILE} yet: it is written at the run's first evaluation; use {checkpoint} "
            "last, or train until an evaluation",
            run_dir=run_dir,
            BEST_FILE=BEST_FILE,
        )
    payload = load_checkpoint(path)
    model_config = model_config_from(payload.get("model_config"), f"checkpoint {path}")
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    rows, writable = payload["vocab_size"], tokenizer_size(payload)
    if tokenizer.vocab_size != writable or writable > rows:
        of_rows = f" (of its {rows} rows)" if writable != rows else ""
        raise MinigptError(
            "{value} has {vocab_size} tokens but the checkpoint expects {writable}{of_rows}; the run folder "
            "is inconsistent, retrain it",
            value=run_dir / TOKENIZER_FILE,
            vocab_size=tokenizer.vocab_size,
            writable=writable,
            of_rows=of_rows,
        )
    return RunWeights(path, payload, model_config, tokenizer)


def model_state(weights: RunWeights) -> dict[str, Any]:
    """Every parameter of the model a checkpoint holds: its own tensors, or for a LoRA run (its
    checkpoint holds adapters) the base's with the adapters merged in."""
    if "lora" not in weights.payload:
        return weights.payload["model"]
    return lora.merged(adapted_model(weights)).state_dict()


def adapted_model(weights: RunWeights, settings: dict[str, Any] | None = None) -> MiniGPT:
    """A LoRA checkpoint's model: the base it names, read and checked, with these adapters on it."""
    settings = settings or weights.payload["lora"]
    model = MiniGPT(weights.model_config, weights.payload["vocab_size"], weights.parts)
    base = base_weights(settings["base"])
    load_checked(model, model_state(base), base.path)
    lora.attach(model, settings)
    lora.load_adapters(model, weights.payload["model"])
    return model


def base_weights(base: dict[str, Any]) -> RunWeights:
    """The checkpoint a LoRA run adapts, where its checkpoints say it is and as it was (its sha256)."""
    folder, checkpoint = Path(base["run"]), base["checkpoint"]
    try:
        found = read_weights(folder, checkpoint)
    except NotARun:
        raise MinigptError(
            "this LoRA run adapts the {checkpoint} checkpoint of the run {folder}, which is not there any more; "
            "a LoRA run stores its adapters, not the weights they adapt: put that run folder back at {folder}",
            checkpoint=checkpoint,
            folder=folder,
        ) from None
    sha = file_sha256(found.path)
    if sha != base["sha256"]:
        raise MinigptError(
            "this LoRA run adapts {path} as it was (sha256 {expected}...), and it has changed since (sha256 "
            "{sha}...: trained further, or replaced); restore that checkpoint, or train the LoRA run again",
            path=found.path,
            expected=base["sha256"][:12],
            sha=sha[:12],
        )
    return found


def load_model(
    cfg: Config,
    run_dir: Path | None = None,
    device: str = "cpu",
    checkpoint: str = "last",
    *,
    trust_exercise: bool = False,
    learner_code: bool = True,
) -> tuple[MiniGPT, TextTokenizer]:
    """The trained model (eval mode) and tokenizer of a run folder, from its last checkpoint or
    its best one. The model is built from the [model] section the checkpoint stores; a config
    whose [model] disagrees is refused, and so is a model the device has no room for, before it
    is built.

    A model of an exercise runs the learner's module, imported as runs/exercise.py allows
    (`trust_exercise`: a file that is not the learner's own too; exercise.learner_note(model.parts)
    says which file runs). With `learner_code` False none of its code runs: minigpt's own modules
    stand in its place, with the same parameters by name and shape (what a checkpoint stores),
    enough to count them (`minigpt info`) and never to compute.

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
    if learner_code:
        weights.parts = recorded_parts(weights.payload, model_config, run_dir, trust_exercise)
    else:
        model_config = replace(model_config, exercise="none")
    # Built on the CPU and overwritten: a meta-device build would skip the random init, but its first
    # use imports more of torch than the init costs at this size.
    model = MiniGPT(model_config, rows, weights.parts)
    load_checked(model, model_state(weights), weights.path)  # a LoRA run's: its base with the adapters merged in
    return model.to(device).eval(), weights.tokenizer


def load_checked(model: MiniGPT, state: dict[str, Any], checkpoint: Path) -> None:
    """`state` (a checkpoint's tensors) loaded into `model`, refused in one line naming a tensor the
    checkpoint lacks, one the model has no place for, or one of another shape than the model's."""
    expected = model.state_dict()
    problems = [
        f"{name} is missing (the model has it, {list(t.shape)})" for name, t in expected.items() if name not in state
    ]
    problems += [f"{name} is not a tensor of this model" for name in state if name not in expected]
    for name, tensor in state.items():
        if name in expected and not isinstance(tensor, torch.Tensor):
            problems.append(f"{name} is a {type(tensor).__name__}, not a tensor")
        elif name in expected and tensor.shape != expected[name].shape:
            problems.append(f"{name} is {list(tensor.shape)} where the model has {list(expected[name].shape)}")
    if problems:
        raise MinigptError(
            "checkpoint {path} does not hold the tensors of the model its [model] section describes: {first}{more}; "
            "the file was damaged or changed: read another checkpoint, or train the run again",
            path=checkpoint,
            first=problems[0],
            more=f" (and {len(problems) - 1} more)" if len(problems) > 1 else "",
        )
    model.load_state_dict(state)
