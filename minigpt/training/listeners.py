"""What a run writes while it trains, as listeners of the trainer's events (events.py): the metrics
log, the checkpoints, best.pt, and the samples of `[train] sample_every`. Rank 0 alone writes the
run folder (`run_folder_listeners`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import failpoints
from ..config import Config, SampleConfig
from ..errors import MinigptError
from ..io import atomic_write_text
from ..model.gpt import MiniGPT
from ..runs import checkpoints, layout
from ..runs.metrics import metrics_records
from ..sampling.generate import generate
from .events import CheckpointDue, Diverged, EvalDone, Listener, StepDone, logged
from .session import Session

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
        if logged(event.step, event.total, self.log_interval):
            record = {
                "step": event.step,
                "loss": event.loss,
                "lr": event.lr,
                "tokens_per_s": round(event.tokens_per_s, 1),
                "elapsed_s": round(event.elapsed_s, 3),
            }
            if event.block_grad_norms is not None:
                record["block_grad_norms"] = list(event.block_grad_norms)
            self.write(record)

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
        self.path, self.cfg, self.model = Path(run_dir) / layout.BEST_FILE, cfg, model
        self.tokenizer_size = tokenizer_size  # a padded model's writable ids (see state_payload)
        self.best = math.inf
        if self.path.is_file():
            try:
                self.best = float(checkpoints.load_checkpoint(self.path).get("val_loss", math.inf))
            except MinigptError:  # damaged: the next evaluation writes a new one
                pass

    def on_eval(self, event: EvalDone) -> None:
        if event.val_loss < self.best:
            self.best = event.val_loss
            payload = checkpoints.model_payload(self.cfg, self.model, self.tokenizer_size)
            payload.update(step=event.step, val_loss=event.val_loss, val_bpb=event.val_bpb)
            checkpoints.save_checkpoint(self.path, payload)


# ---------------------------------------------------------------- checkpoints and samples


class CheckpointSaver(Listener):
    """Writes the session's checkpoint into its run folder whenever one is due; `last_step` is the
    step of the newest checkpoint on disk (where a resume would start)."""

    def __init__(self, session: Session):
        self.session = session
        self.last_step = session.step

    def on_checkpoint(self, event: CheckpointDue) -> None:
        path = self.session.cfg.run_dir / layout.CHECKPOINT_FILE
        checkpoints.save_checkpoint(path, self.session.checkpoint(event.step))
        self.last_step = event.step


class Sampler(Listener):
    """Every `[train] sample_every` steps, a short continuation of `sample_prompt` from the model as
    it is, handed to `show(step, text)`. It draws from a generator of its own, seeded by the step,
    in eval mode and without gradients, so a run with samples computes exactly what one without
    does, and a resumed run shows the same samples."""

    def __init__(self, session: Session, show: Callable[[int, str], None]):
        self.session, self.show = session, show
        tc = session.cfg.train
        self.every = tc.sample_every
        # Drawn from the model's own distribution (temperature 1, no filter), whatever [sample] says.
        self.settings = SampleConfig(max_new_tokens=tc.sample_tokens, temperature=1.0)
        # start() checked its length; a task's default prompt is its first held-out one
        self.prompt = (
            session.corpus.tokenizer.encode(tc.sample_prompt or session.corpus.sample_start) if self.every else []
        )

    def on_step(self, event: StepDone) -> None:
        if not self.every or event.step % self.every:
            return
        s = self.session
        settings = replace(self.settings, seed=s.cfg.train.seed + event.step)
        s.model.eval()
        try:
            steps = generate(s.model, self.prompt, settings, writable=s.corpus.tokenizer.vocab_size)
            ids = [int(step.tokens[0]) for step in steps]
        finally:
            s.model.train()
        self.show(event.step, s.corpus.tokenizer.decode(ids))


def run_folder_listeners(
    session: Session, saver: CheckpointSaver, show_sample: Callable[[int, str], None] | None = None
) -> list[Listener]:
    """What a run writes while it trains (rank 0 alone writes the folder): metrics.jsonl, the
    checkpoints (through `saver`), best.pt, and the samples of `[train] sample_every` (kept in the
    metrics log, and handed to `show_sample(step, text)` when given)."""
    if not session.world.is_main:
        return []
    run_dir, tc = session.cfg.run_dir, session.cfg.train
    metrics = MetricsLog(
        run_dir / layout.METRICS_FILE, tc.log_interval, keep_through_step=session.step if session.resumed else None
    )

    curves = []
    if tc.tensorboard:
        from .tensorboard import TensorBoardLog

        curves = [TensorBoardLog(run_dir, tc.log_interval, resumed_at=session.step if session.resumed else None)]

    def sampled(step: int, text: str) -> None:
        metrics.write({"step": step, "sample": text})
        for log in curves:
            log.sample(step, text)
        if show_sample is not None:
            show_sample(step, text)

    best = BestKeeper(run_dir, session.cfg, session.model, session.corpus.tokenizer.vocab_size)
    return [metrics, *curves, saver, best, Sampler(session, sampled)]
