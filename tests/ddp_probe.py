"""Under torchrun, the trainer `minigpt train` runs, driven through the library with nothing
replaced, recording what no command line shows: when each rank's gradients are exchanged, and
each rank's weights at the end; then, in the same launch, more `minigpt train` command lines.

    torchrun --standalone --nproc_per_node=2 tests/ddp_probe.py JOBS.json

JOBS.json holds `probe`: {"config", "run_dir", "out", "overrides": ["section.key=value", ...]}, and
`commands`: {name: [minigpt's arguments, ...]}; rank 0 writes `results` ({name: exit status}).

The probe trains as `minigpt train` does (`minigpt.train`, the API the command stands on), counts
the micro-batches each rank draws (a counting wrapper in the session's `train_batches`), registers a
DDP communication hook on the session's `forward_model` that does the usual averaging all-reduce and
notes, per exchange, how many micro-batches this rank had drawn (OUT/allreduce{rank}.txt), both
attached when the session is open (`on_start`), and saves each rank's final weights (OUT/rank{rank}.pt).
The hook and the counter change no number, so RUN_DIR ends with the checkpoint `torchrun -m minigpt
train` writes for the same config (tests/test_distributed.py checks it bitwise).

Each command then runs through the CLI's own `main`, as `python -m minigpt` runs it, one after
another in these two processes: a launch costs seconds (three interpreters importing torch, the
ranks meeting), a tiny run a fraction of one, and tests/test_distributed.py compares a handful of
configs' two-rank runs with one process. The one change: the process group the first run starts is
kept for the next (minigpt leaves it after each run; joining a fresh one under the same launch would
read the rendezvous keys the last one left), and left once, at the end.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import minigpt
from minigpt import cli


class CountedBatches:
    """The session's training batches, counting the micro-batches drawn."""

    def __init__(self, batches):
        self.batches, self.drawn = batches, 0

    def sample(self, generator: torch.Generator):
        self.drawn += 1
        return self.batches.sample(generator)


def probe(config: str, run_dir: str, out: str, overrides: list[str]) -> None:
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

    minigpt.train(out=run_dir, config=config, set=overrides, progress=False, on_start=attach)
    session = opened[0]
    torch.save(session.model.state_dict(), Path(out) / f"rank{session.world.rank}.pt")


def command(args: list[str]) -> int:
    """`minigpt ARGS` through the CLI's main: its exit status."""
    argv = sys.argv
    sys.argv = ["minigpt", *args]
    try:
        cli.main()
        return 0
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = argv


def main(jobs_file: str) -> None:
    jobs = json.loads(Path(jobs_file).read_text(encoding="utf-8"))
    leave = dist.destroy_process_group
    dist.destroy_process_group = lambda *args, **kwargs: None  # kept for the next run (see above)
    try:
        probe(**jobs["probe"])
        results = {name: command(args) for name, args in jobs["commands"].items()}
    finally:
        dist.destroy_process_group = leave
    if dist.get_rank() == 0:
        Path(jobs["results"]).write_text(json.dumps(results), encoding="utf-8")
    leave()


if __name__ == "__main__":
    assert int(os.environ.get("WORLD_SIZE", "1")) > 1, "run it under torchrun"
    main(sys.argv[1])
