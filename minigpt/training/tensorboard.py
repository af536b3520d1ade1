"""The metrics log's values as TensorBoard event files too (`[train] tensorboard = true`, the
`tensorboard` extra), in the run folder's tensorboard/, so a run opens where people already look
at curves: `tensorboard --logdir runs/NAME/tensorboard`.

    train/loss, train/lr, train/tokens_per_s   every logged step (as metrics.jsonl: log_interval)
    grad_norm/block_0, grad_norm/block_1, ...   every logged step: each block's gradient norm
    val/loss, val/bits_per_byte                 every evaluation
    sample                                      the text of each `[train] sample_every` sample

A resumed run purges what the interrupted one logged past its checkpoint, as metrics.jsonl does.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MinigptError
from ..runs.layout import TENSORBOARD_FOLDER
from .events import EvalDone, Listener, StepDone, logged

EXTRA = 'pip install "minigpt[tensorboard]"  (or: pip install tensorboard)'
FOLDER = TENSORBOARD_FOLDER


def require() -> None:
    """Refuse `tensorboard = true` where the package is missing, before anything is written."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise MinigptError(
            "[train] tensorboard = true needs the tensorboard package, which is not installed; {EXTRA}", EXTRA=EXTRA
        ) from None


class TensorBoardLog(Listener):
    def __init__(self, run_dir: Path, log_interval: int, resumed_at: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_interval = log_interval
        # Events at or past the first step this process trains are the interrupted run's, not this one's.
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / FOLDER), purge_step=purge)

    def on_step(self, event: StepDone) -> None:
        if logged(event.step, event.total, self.log_interval):
            self.writer.add_scalar("train/loss", event.loss, event.step)
            self.writer.add_scalar("train/lr", event.lr, event.step)
            self.writer.add_scalar("train/tokens_per_s", event.tokens_per_s, event.step)
            for i, norm in enumerate(event.block_grad_norms or ()):
                self.writer.add_scalar(f"grad_norm/block_{i}", norm, event.step)

    def on_eval(self, event: EvalDone) -> None:
        self.writer.add_scalar("val/loss", event.val_loss, event.step)
        self.writer.add_scalar("val/bits_per_byte", event.val_bpb, event.step)
        self.writer.flush()  # an evaluation is worth seeing at once

    def sample(self, step: int, text: str) -> None:
        self.writer.add_text("sample", text, step)

    def close(self) -> None:
        self.writer.close()
