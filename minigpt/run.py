"""The run folder: its layout, creating and replacing it, identity and resume checks, the metrics
log, and loading its model for reading.

    run/config.toml      the resolved config, exactly as used: a run describes itself
    run/tokenizer.json   loads with tokenizers.Tokenizer.from_file
    run/checkpoint.pt    model, [model] section, optimizer, step, RNG states, hashes of config,
                         tokenizer and corpus
    run/best.pt          the model at its best validation loss so far (no optimizer state)
    run/metrics.jsonl    one JSON object per logged step and per evaluation

Every file is written atomically (io.py). Checkpoints load with `weights_only=True`: a checkpoint
can hold tensors and plain values, never code. The model is always built from the [model] section
stored in the checkpoint, never from a config that merely names the run.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from . import failpoints
from .config import Config, ModelConfig, load_config, model_config_from, model_section_differences
from .device import check_dtype
from .errors import MinigptError, option
from .events import Diverged, EvalDone, Listener, StepDone
from .io import atomic_folder, atomic_write, atomic_write_text
from .memory import check_memory, parameter_count, reading_bytes
from .model import MiniGPT
from .sources import first_difference
from .tokenizer import TextTokenizer

CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_FILE = "checkpoint.pt"
BEST_FILE = "best.pt"  # the weights at the best validation loss so far (weights and [model] only)
CHECKPOINTS = {"last": CHECKPOINT_FILE, "best": BEST_FILE}
METRICS_FILE = "metrics.jsonl"
ORIGIN_FILE = "origin.json"  # where a run's starting weights came from (a fine-tune's source), when not fresh
FORMAT_VERSION = 1


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    # Serialised in memory first: torch.save reports a full disk as a RuntimeError about positions
    # in its archive, while a plain write says OSError "No space left on device".
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    # The failpoint lets a test kill or fail the write here: the temporary file written, not yet renamed.
    atomic_write(path, lambda f: (f.write(buffer.getbuffer()), failpoints.reach("checkpoint-write")), binary=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise MinigptError(f"no checkpoint at {path}; train first with `minigpt train` (same config)")
    try:
        # mmap: tensors are read from the file when used, so a reader that needs the model alone
        # never reads the optimizer state (twice the model's size) off the disk.
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError):
        # torch's own message suggests weights_only=False, which would let the file run code: not shown.
        raise MinigptError(
            f"checkpoint {path} could not be loaded as plain tensors and values; it is "
            f"damaged, truncated or not a minigpt checkpoint: retrain, or restore it"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_VERSION:
        raise MinigptError(f"checkpoint {path} is not a minigpt checkpoint of format {FORMAT_VERSION}")
    return payload


def model_payload(cfg: Config, model: MiniGPT, tokenizer_size: int | None = None) -> dict[str, Any]:
    """What any checkpoint holds; training adds optimizer, step, RNG states and hashes.
    `tokenizer_size`: the ids the tokenizer writes, when fewer than the model's rows (see state_payload)."""
    return state_payload(cfg, model.state_dict(), model.vocab_size, tokenizer_size)


def state_payload(
    cfg: Config,
    state: dict[str, torch.Tensor],
    vocab_size: int,
    tokenizer_size: int | None = None,
    origin: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A checkpoint of parameters that need not be in a model yet (an imported model's).

    `tokenizer_size`: how many ids the tokenizer writes, stored only when it is fewer than the
    model's `vocab_size` rows (a padded vocabulary: nanoGPT's 50,304 rows for GPT-2's 50,257 ids);
    the rows past it are kept exact and never sampled. `origin`: where the weights came from (also
    written beside the checkpoint as origin.json)."""
    payload = {"format": FORMAT_VERSION, "model": state, "model_config": asdict(cfg.model), "vocab_size": vocab_size}
    if tokenizer_size is not None and tokenizer_size != vocab_size:
        payload["tokenizer_size"] = tokenizer_size
    if origin is not None:
        payload["origin"] = origin
    return payload


def tokenizer_size(payload: dict[str, Any]) -> int:
    """The ids a checkpoint's tokenizer writes: all its rows unless it was stored padded."""
    return payload.get("tokenizer_size", payload["vocab_size"])


# ---------------------------------------------------------------- identity

# Keys that do not change what a run computes; a resume may differ in them.
# `data` is the path only: the corpus itself is identified by its sha256, so a moved file resumes.
_NOT_IDENTITY = {
    ("train", k)
    for k in (
        "data",
        "out",
        "device",
        "threads",
        "log_interval",
        "eval_interval",
        "checkpoint_interval",
        "sample_every",
        "sample_prompt",
        "sample_tokens",
        "tensorboard",
        # A fine-tune is identified by its weights, not by where they were read: the source's sha256
        # is in its checkpoint, and the path may change.
        "init_from",
        "init_checkpoint",
    )
}


def config_sections(cfg: Config, leaving_out: set[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """[model], [tokenizer] and [train] as plain values, without the (section, key) pairs named."""
    return {
        section: {k: v for k, v in asdict(getattr(cfg, section)).items() if (section, k) not in leaving_out}
        for section in ("model", "tokenizer", "train")
    }


def sections_differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    """`[section] key: a-value != b-value` for every key on which two `config_sections` disagree."""
    return [f"[{section}] {d}" for section in a for d in model_section_differences(a[section], b.get(section, {}))]


def training_identity(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config sections that determine a training run's numbers ([sample] never does)."""
    return config_sections(cfg, _NOT_IDENTITY)


def config_hash(identity: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def check_model_matches(cfg: Config, payload: dict[str, Any], run_dir: Path) -> None:
    """Refuse a checkpoint whose [model] section disagrees with the config, listing the keys."""
    differences = model_section_differences(asdict(cfg.model), payload["model_config"])
    if differences:
        raise MinigptError(
            f"checkpoint in {run_dir} was trained with another [model] section than "
            f"{cfg.source} ({'; '.join(differences)} (config != checkpoint)); "
            f"use the config it was trained with (it is saved as {option('config')} {run_dir / CONFIG_FILE}), "
            f"or pass {option('run')} {run_dir} alone, which reads it"
        )


class CorpusIdentity(Protocol):
    """What a resume compares of a corpus (data.Corpus has it)."""

    sha256: str  # the file's, or the digest of every file's name and sha256
    path: Path
    source: str  # the corpus in a few words
    files: list[tuple[str, str]]  # (name, sha256) of every file


def check_resume(
    payload: dict[str, Any], cfg: Config, tokenizer: TextTokenizer, corpus: CorpusIdentity, processes: int = 1
) -> None:
    """A resume must compute what the interrupted run would have: same config, text and tokenizer.
    `cfg` holds the global batch (batch_size x `processes`, the run's identity under torchrun).
    The text comes before the tokenizer: a tokenizer fitted to a changed text differs too, and
    the text is what to name."""
    stored = payload["identity"]
    now = training_identity(cfg)
    if config_hash(now) != payload["hashes"]["config"]:
        diffs = sections_differences(now, stored)
        advice = f"resume with the same config file, {option('set')} values and options"
        batch, was = now["train"]["batch_size"], stored.get("train", {}).get("batch_size")
        if was is not None and batch != was:  # the global batch: any number of processes that divides it
            if processes > 1:
                diffs = [
                    f"[train] batch_size x {processes} processes: {batch} != {was}"
                    if d.startswith("[train] batch_size:")
                    else d
                    for d in diffs
                ]
            per_process = (
                f"{option('set')} train.batch_size={was // processes}"
                if was % processes == 0
                else f"a number of processes that divides {was}"
            )
            advice += f" (the checkpoint's global batch is {was}: use {per_process})"
        if [d for d in diffs if not d.startswith("[train] steps:")] == []:
            advice = (
                "a run's schedule is fixed by its steps (the cosine reaches min_lr on the last one), so a "
                f"run cannot be lengthened or shortened; train a new run with the {option('steps')} you want "
                f"({option('force')} or another {option('out')}), or resume with the run's own"
            )
        raise MinigptError(
            f"{option('resume')} refused: the config differs from the checkpoint's "
            f"({'; '.join(diffs)} (now != checkpoint)); {advice}"
        )
    if corpus.sha256 != payload["hashes"]["corpus"]:
        then = payload.get("corpus_files")  # absent from checkpoints written before runs had several files
        if then is not None and max(len(then), len(corpus.files)) > 1:
            raise MinigptError(
                f"{option('resume')} refused: the training files ({corpus.source}) differ from the ones the "
                f"checkpoint was trained on: {first_difference(then, corpus.files)}; resume with the original files"
            )
        raise MinigptError(
            f"{option('resume')} refused: the corpus {corpus.path} differs from the one the checkpoint was "
            f"trained on (sha256 {corpus.sha256[:12]}... != {payload['hashes']['corpus'][:12]}...); "
            f"resume with the original text"
        )
    if tokenizer.fingerprint() != payload["hashes"]["tokenizer"]:
        raise MinigptError(
            f"{option('resume')} refused: the tokenizer differs from the one the checkpoint was trained "
            f"with (tokenizer.json hash changed); start a new run with {option('force')} or another {option('out')}"
        )


# ---------------------------------------------------------------- creating a run folder


def check_writable(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to overwrite or to resume nothing, and prove the folder can be written, before any
    expensive work and before anything is written."""
    try:
        _check_run_dir(run_dir, resume, force)
    except OSError as exc:  # e.g. a name too long for the file system, a folder under /proc
        raise MinigptError(
            f"run folder {run_dir} cannot be used ({exc.strerror or exc}); choose another {option('out')}"
        ) from None


# What `create` writes before the first checkpoint: a folder holding only these (and temporary
# files) is a run whose creation was cut short, not a run to protect.
UNFINISHED_RUN = {CONFIG_FILE, TOKENIZER_FILE, ORIGIN_FILE}


def _check_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    has_run = run_dir.is_dir() and any(
        p.name not in UNFINISHED_RUN for p in set(run_dir.iterdir()) - set(_temporaries(run_dir))
    )
    if resume and not (run_dir / CHECKPOINT_FILE).is_file():
        raise MinigptError(f"{option('resume')}: no checkpoint in {run_dir}; train without {option('resume')} first")
    if has_run and not resume and not force:
        raise MinigptError(
            f"run folder {run_dir} already holds a run; pass {option('resume')} to continue it, "
            f"{option('force')} to replace it, or another {option('out')}"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError(f"run folder {run_dir} is a file; choose another {option('out')}")
    probe = run_dir if run_dir.exists() else next(p for p in run_dir.parents if p.exists())
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise MinigptError(
            f"run folder {run_dir} cannot be written ({probe} is not writable); choose another {option('out')}"
        )


def restore_missing(run_dir: Path, cfg: Config, tokenizer: TextTokenizer) -> None:
    """On resume: write back the config or tokenizer file if one was deleted (the checkpoint's
    identity check has shown these are the run's), so the run folder stays self-describing."""
    for name, text in ((CONFIG_FILE, cfg.to_toml), (TOKENIZER_FILE, tokenizer.to_str)):
        if not (run_dir / name).exists():
            atomic_write_text(run_dir / name, text())


def create(run_dir: Path, force: bool, cfg: Config, tokenizer: TextTokenizer, first_checkpoint: dict[str, Any]) -> None:
    """Make (or, with `force`, replace) the run folder, write what never changes during the run,
    then the step-0 checkpoint. A failure here (a full disk) removes what it made, so no
    half-written run is left behind."""
    created = not run_dir.exists()
    try:
        if not created and not (run_dir / CHECKPOINT_FILE).exists():
            remove_stale_temporaries(run_dir)  # a creation cut short before its first checkpoint
        if force and not created:
            shutil.rmtree(run_dir)
            created = True
        run_dir.mkdir(parents=True, exist_ok=True)
        write_run_files(run_dir, cfg, tokenizer, first_checkpoint)
    except OSError as exc:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise MinigptError(
            f"run folder {run_dir} cannot be written ({exc.strerror or exc}); make room there or choose another "
            f"{option('out')}"
        ) from None


def _temporaries(run_dir: Path) -> list[Path]:
    """The run folder's temporary files (`.NAME.*.tmp`, see io.py)."""
    return sorted(Path(run_dir).glob(".*.tmp"))


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files a killed writer left in the run folder (`.NAME.*.tmp`, see io.py): never
    renamed into place, so never read; removed by the next writer, which holds the run's lock."""
    stale = _temporaries(run_dir)
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_model_run(run_dir: Path, cfg: Config, model: MiniGPT, tokenizer: TextTokenizer) -> None:
    """A run folder that sample and trace can load, from a model made outside `minigpt train`
    (the chapter-17 teaching weights, test fixtures)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_files(run_dir, cfg, tokenizer, model_payload(cfg, model))


def write_run_files(run_dir: Path, cfg: Config, tokenizer: TextTokenizer, payload: dict[str, Any]) -> None:
    """config.toml, tokenizer.json and checkpoint.pt (all that `load_model` reads), and origin.json
    when the weights came from somewhere (an import, the run a fine-tune started from)."""
    atomic_write_text(run_dir / CONFIG_FILE, cfg.to_toml())
    atomic_write_text(run_dir / TOKENIZER_FILE, tokenizer.to_str())
    if "origin" in payload:
        atomic_write_text(run_dir / ORIGIN_FILE, json.dumps(payload["origin"], indent=2) + "\n")
    save_checkpoint(run_dir / CHECKPOINT_FILE, payload)


def check_new_run(run_dir: Path, force: bool) -> None:
    """Refuse an `--out` that is a file, or a folder holding anything unless `force`: what an import
    checks before reading anything, and `create_model_run` again before writing."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise MinigptError(f"{option('out')} {run_dir} is a file; choose another {option('out')}")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not force:
        raise MinigptError(
            f"{option('out')} {run_dir} already exists and is not empty; pass {option('force')} to replace it, "
            f"or choose another {option('out')}"
        )


def create_model_run(
    run_dir: Path, force: bool, cfg: Config, tokenizer: TextTokenizer, payload: dict[str, Any]
) -> None:
    """A whole new run folder holding `payload` (an imported model), or nothing at all: it is
    written under a temporary name beside `run_dir` and renamed into place once complete, and
    with `force` the folder it replaces is removed only then. A folder that holds anything is
    refused without `force`; a train writing it (its lock is held) is refused even with it."""
    run_dir = Path(run_dir)
    check_new_run(run_dir, force)
    made = [p for p in run_dir.parents if not p.exists()][-1:]  # the outermost folder this call makes
    lock = RunLock(run_dir)
    try:
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            atomic_folder(run_dir, lambda folder: write_run_files(folder, cfg, tokenizer, payload))
        finally:
            lock.release()  # before the folders its file lies in are removed
    except BaseException as exc:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, OSError):
            reason = exc.strerror or exc
            raise MinigptError(
                f"run folder {run_dir} cannot be written ({reason}); make room there or choose another {option('out')}"
            ) from None
        raise


# ---------------------------------------------------------------- one writer at a time


class RunLock:
    """An exclusive lock on a run folder for as long as one `train` writes it: `fcntl.flock` on a
    small file beside the folder (`.NAME.lock` in its parent, so it exists before the folder does
    and survives --force removing it), holding the writer's pid. The kernel releases it when the
    process ends, however it ends, so a killed trainer never blocks the next one. Readers (sample,
    trace) take no lock: every file they read is replaced atomically."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir.parent / f".{self.run_dir.name}.lock"
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not a POSIX system: no lock, as before
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise MinigptError(
                    f"run folder {self.run_dir} cannot be used ({exc.strerror or exc}); choose another {option('out')}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise MinigptError(
                    f"run folder {self.run_dir} is being written by another minigpt train "
                    f"(pid {holder}); wait for it to finish or stop it, or choose another {option('out')}"
                ) from None
            # The holder before us removes the file as it lets go; a lock on a removed file locks nothing.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self.fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file while still holding the lock, then let go: nothing is left beside
        the run folder (a killed trainer leaves its file, which blocks no one)."""
        if self.fd is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


# ---------------------------------------------------------------- the metrics log


class MetricsLog(Listener):
    """metrics.jsonl: one JSON object per logged step and per evaluation, flushed as written, so a
    crash loses at most a line. On resume, records after the checkpoint's step are dropped: the
    resumed run logs those steps again."""

    def __init__(self, path: Path, log_interval: int, keep_through_step: int | None = None):
        failpoints.reach("metrics-open")
        self.path, self.log_interval = Path(path), log_interval
        if keep_through_step is not None and self.path.exists():
            kept = [record for record in metrics_records(self.path) if record.get("step", 0) <= keep_through_step]
            atomic_write_text(self.path, "".join(json.dumps(record) + "\n" for record in kept))
        self.file = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def on_step(self, event: StepDone) -> None:
        if event.step % self.log_interval == 0 or event.step == event.total:
            self.write(
                {
                    "step": event.step,
                    "loss": event.loss,
                    "lr": event.lr,
                    "tokens_per_s": round(event.tokens_per_s, 1),
                    "elapsed_s": round(event.elapsed_s, 3),
                }
            )

    def on_eval(self, event: EvalDone) -> None:
        self.write({"step": event.step, "eval": True, "val_loss": event.val_loss, "val_bpb": event.val_bpb})

    def on_diverged(self, event: Diverged) -> None:
        # JSON has no NaN or infinity: the values are written as text ("nan", "inf").
        self.write({"step": event.step, "diverged": True, "loss": str(event.loss), "grad_norm": str(event.grad_norm)})

    def close(self) -> None:
        self.file.close()


class BestKeeper(Listener):
    """best.pt: the model's weights whenever the validation loss improves on the best so far (the
    best survives a resume: it is read back from the file)."""

    def __init__(self, run_dir: Path, cfg: Config, model: MiniGPT, tokenizer_size: int | None = None):
        self.path, self.cfg, self.model = Path(run_dir) / BEST_FILE, cfg, model
        self.tokenizer_size = tokenizer_size  # a padded model's writable ids (see state_payload)
        self.best = math.inf
        if self.path.is_file():
            try:
                self.best = float(load_checkpoint(self.path).get("val_loss", math.inf))
            except MinigptError:  # damaged: the next evaluation writes a new one
                pass

    def on_eval(self, event: EvalDone) -> None:
        if event.val_loss < self.best:
            self.best = event.val_loss
            payload = model_payload(self.cfg, self.model, self.tokenizer_size)
            payload.update(step=event.step, val_loss=event.val_loss, val_bpb=event.val_bpb)
            save_checkpoint(self.path, payload)


# ---------------------------------------------------------------- reading a run


def metrics_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl. A last line cut short (the process was killed while writing
    it) is left out: the resumed run logs that step again. Any other line that is not a JSON
    object means the file was damaged some other way, and is refused."""
    lines = [line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if number == len(lines):
                break
            raise MinigptError(
                f"{path} line {number} is not a JSON object; the run folder is damaged: remove "
                f"that line (or the file) and try again"
            )
        records.append(record)
    return records


def read_metrics(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """A run's metrics.jsonl as training records and evaluation records."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise MinigptError(f"{run_dir} has no metrics.jsonl; plot reads run folders written by `minigpt train`")
    records = metrics_records(path)
    return {
        "train": [r for r in records if "loss" in r and not r.get("eval") and not r.get("diverged")],
        "eval": [r for r in records if r.get("eval")],
    }


def saved_config(
    run_dir: Path, given_as: str = "run", overrides: list[str] | tuple[str, ...] = (), flags: dict | None = None
) -> Config:
    """The resolved config a run folder saved (config.toml: the run describes itself), with any
    overrides and options on top."""
    saved = Path(run_dir) / CONFIG_FILE
    if not saved.is_file():
        raise MinigptError(
            f"{option(given_as)} {run_dir} has no {CONFIG_FILE}, so it does not describe itself; "
            f"pass the config it was trained with as {option('config')}"
            if given_as == "run"
            else f"{option(given_as)} {run_dir} has no {CONFIG_FILE}, so it is not a run folder minigpt can read"
        )
    return load_config(saved, overrides, flags)


def reading_config(
    config: Path | None, run_dir: Path | None, overrides: list[str], flags: dict[str, tuple[str, Any]] | None = None
) -> tuple[Config, Path]:
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
        return saved_config(run_dir, overrides=overrides, flags=flags), run_dir
    cfg = load_config(config, overrides, flags)
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
