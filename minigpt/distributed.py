"""Data-parallel training with PyTorch's own engine (torch.distributed, started by torchrun).

    torchrun --standalone --nproc_per_node=2 -m minigpt train ...

`World` says who this process is. Under torchrun (WORLD_SIZE > 1) the process group is gloo on
the CPU and NCCL on CUDA, one device per rank (LOCAL_RANK). A plain `minigpt train` is a world of
one and touches nothing here. `[train] batch_size` is per process: rank r takes rows
r*batch_size .. (r+1)*batch_size - 1 of the global batch a single process with
batch_size x world_size would draw (data.Batches), so the ranks together compute what one process
computes with the union batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def from_environment(device: str) -> World:
    """The world torchrun describes in the environment, with the process group started; a world
    of one (nothing started) without torchrun."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return World(rank, size, local_rank)


def share(world: World, value):
    """Rank 0's `value` on every rank (an error message, a decision)."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def any_rank(world: World, flag: bool) -> bool:
    """True on every rank when it is true on any (a stop request, a diverged step)."""
    if not world.distributed:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def mean(world: World, value: float) -> float:
    """The mean of `value` over the ranks."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / world.size


def finish(world: World) -> None:
    """Every rank reaches the end before the group goes (a rank leaving early would abort the others)."""
    if world.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
