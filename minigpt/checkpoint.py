"""The run folder: its layout, atomic writes, safe loads and identity checks.

    run/config.toml      the resolved config, exactly as used
    run/tokenizer.json   loads with tokenizers.Tokenizer.from_file
    run/checkpoint.pt    model, optimizer, step, RNG states, hashes of config, tokenizer and corpus
    run/metrics.jsonl    one JSON object per logged step and per evaluation

Every file is written to a temporary name in the same folder and renamed into place, so a crash
mid-write leaves the previous version intact. Checkpoints load with `weights_only=True`: a
checkpoint can hold tensors and plain values, never code.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from .config import Config, model_section_differences
from .errors import MinigptError
from .model import MiniGPT
from .tokenizer import TextTokenizer

CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.jsonl"
FORMAT_VERSION = 1
_UMASK = os.umask(0o022)
os.umask(_UMASK)  # reading the umask means setting it; put it straight back


def atomic_write(path: Path, write: Callable[[Any], None], binary: bool = False) -> None:
    """Call write(file) on a temporary file next to `path`, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    atomic_write(path, lambda f: torch.save(payload, f), binary=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MinigptError(f"no checkpoint at {path}; train first with `minigpt train` (same config)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError):
        # torch's own message suggests weights_only=False, which would let the file run code: not shown.
        raise MinigptError(f"checkpoint {path} could not be loaded as plain tensors and values; it is "
                           f"damaged, truncated or not a minigpt checkpoint: retrain, or restore it") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise MinigptError(f"checkpoint {path} is not a minigpt checkpoint of format {FORMAT_VERSION}")
    return payload


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# Keys that do not change what a run computes; a resume may differ in them.
# `data` is the path only: the corpus itself is identified by its sha256, so a moved file resumes.
_NOT_IDENTITY = {("train", k) for k in ("data", "out", "device", "threads", "log_interval", "eval_interval",
                                         "checkpoint_interval")}


def training_identity(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections that determine a training run's numbers ([sample] never does)."""
    out = {}
    for section in ("model", "tokenizer", "train"):
        out[section] = {k: v for k, v in asdict(getattr(cfg, section)).items()
                        if (section, k) not in _NOT_IDENTITY}
    return out


def config_hash(identity: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def check_model_matches(cfg: Config, payload: dict[str, Any], run_dir: Path) -> None:
    """Refuse a checkpoint whose [model] section disagrees with the config, listing the keys."""
    differences = model_section_differences(asdict(cfg.model), payload["model_config"])
    if differences:
        raise MinigptError(f"checkpoint in {run_dir} was trained with another [model] section than "
                           f"{cfg.source} ({'; '.join(differences)} (config != checkpoint)); "
                           f"use the config it was trained with (it is saved as -c {run_dir / CONFIG_FILE}), "
                           f"or point --run at a matching run")


def load_model(cfg: Config, run_dir: Path | None = None, device: str = "cpu") -> tuple[MiniGPT, TextTokenizer]:
    """The trained model (eval mode) and tokenizer of a run folder, checked against the config."""
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir
    if not run_dir.is_dir():
        raise MinigptError(f"no run folder at {run_dir}; train one first with `minigpt train` "
                           f"(same config), or pass --run DIR")
    payload = load_checkpoint(run_dir / CHECKPOINT_FILE)
    check_model_matches(cfg, payload, run_dir)
    tokenizer = TextTokenizer.load(run_dir / TOKENIZER_FILE)
    if tokenizer.vocab_size != payload["vocab_size"]:
        raise MinigptError(f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but the checkpoint "
                           f"expects {payload['vocab_size']}; the run folder is inconsistent, retrain it")
    model = MiniGPT(cfg.model, payload["vocab_size"])
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer


def model_payload(cfg: Config, model: MiniGPT) -> dict[str, Any]:
    """What any checkpoint holds; training adds optimizer, step, RNG states and hashes."""
    return {"format": FORMAT_VERSION, "model": model.state_dict(), "model_config": asdict(cfg.model),
            "vocab_size": model.vocab_size}


def write_model_run(run_dir: Path, cfg: Config, model: MiniGPT, tokenizer: TextTokenizer) -> None:
    """A run folder that sample and trace can load, from a model made outside `minigpt train`
    (the chapter-17 teaching weights, test fixtures)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG_FILE, cfg.to_toml())
    atomic_write_text(run_dir / TOKENIZER_FILE, tokenizer.to_str())
    save_checkpoint(run_dir / CHECKPOINT_FILE, model_payload(cfg, model))
