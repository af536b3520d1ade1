"""Under torchrun, the trainer `minigpt train` runs, driven through the library with nothing
replaced, recording what no command line shows: when each rank's gradients are exchanged, and
each rank's weights at the end.

    torchrun --standalone --nproc_per_node=2 tests/ddp_probe.py CONFIG RUN_DIR OUT [section.key=value ...]

It trains as `minigpt train` does (`minigpt.train`, the API the command stands on), counts the micro-batches
each rank draws (a counting wrapper in the session's `train_batches`), registers a DDP
communication hook on the session's `forward_model` that does the usual averaging all-reduce and
notes, per exchange, how many micro-batches this rank had drawn (OUT/allreduce{rank}.txt), both
attached when the session is open (`on_start`), and saves each rank's final weights (OUT/rank{rank}.pt). The hook and
the counter change no number, so RUN_DIR ends with the checkpoint `torchrun -m minigpt train`
writes for the same config (tests/test_distributed.py checks it bitwise).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import minigpt


class CountedBatches:
    """The session's training batches, counting the micro-batches drawn."""

    def __init__(self, batches):
        self.batches, self.drawn = batches, 0

    def sample(self, generator: torch.Generator):
        self.drawn += 1
        return self.batches.sample(generator)


def main(config: str, run_dir: str, out: str, *overrides: str) -> None:
    opened = []

    def attach(session) -> None:
        opened.append(session)
        batches = session.train_batches = CountedBatches(session.train_batches)
        exchanges = Path(out) / f"allreduce{session.world.rank}.txt"

        def hook(group, bucket):
            with open(exchanges, "a", encoding="utf-8") as f:
                f.write(f"{batches.drawn}\n")
            return allreduce_hook(group, bucket)

        session.forward_model.register_comm_hook(None, hook)

    minigpt.train(out=run_dir, config=config, set=list(overrides), progress=False, on_start=attach)
    session = opened[0]
    torch.save(session.model.state_dict(), Path(out) / f"rank{session.world.rank}.pt")


if __name__ == "__main__":
    assert int(os.environ.get("WORLD_SIZE", "1")) > 1, "run it under torchrun"
    main(*sys.argv[1:])
