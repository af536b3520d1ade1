"""Data-parallel training with PyTorch's own engine (torch.distributed, started by torchrun).

    torchrun --standalone --nproc_per_node=2 -m minigpt train ...

`World` says who this process is. Under torchrun (WORLD_SIZE > 1) the process group is gloo for
CPU tensors and NCCL for CUDA ones, one device per rank (LOCAL_RANK). A plain `minigpt train` is a
world of one and touches nothing here. `[train] batch_size` is per process: rank r takes rows
r*batch_size .. (r+1)*batch_size - 1 of the global batch a single process with
batch_size x world_size would draw (data.Batches), so the ranks together compute what one process
computes with the union batch.

The ranks move in step: every decision that could end the run on one rank (a refusal, a failed
write, a stop request) is agreed by all before any acts on it (`agree`, `any_rank`), so no rank is
left waiting on a collective the others will never join. (A non-finite loss needs no exchange of
its own: it is in the ranks' mean loss and averaged gradients on every rank.)
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from ..errors import MinigptError, Phrase

T = TypeVar("T")


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


def from_environment() -> World:
    """The world torchrun describes in the environment, with the process group started; a world
    of one (nothing started) without torchrun. Small messages (decisions, losses, refusals) go
    over gloo on the CPU; gradients of a model on a GPU go over NCCL."""
    global _patient
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        # The others wait while rank 0 fits the tokenizer, minutes per GB of text (50 s for 100 MB
        # here): a very large corpus outlasts the default 30-minute limit on one wait. `agree` and
        # `share` wait that long; training's own exchanges keep the default, so a machine that
        # stops answering mid-run is given up on as usual.
        _patient = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=4))
    return World(rank, size, local_rank)


_patient = None  # the process group of the long waits before training


def speaks() -> bool:
    """Whether this process talks to the user: under torchrun only rank 0 does (read from the
    environment, so it is known before the ranks have joined)."""
    return int(os.environ.get("RANK", "0")) == 0


class RefusedElsewhere(MinigptError):
    """Another rank refused or failed; this rank stops too, and leaves the one line to rank 0."""


class RankLost(MinigptError):
    """Another rank went away mid-exchange (its process ended, or its machine); every rank stops."""

    exit_code = 1


def agree(world: World, work: Callable[[], T]) -> T:
    """Run `work` on this rank and go on only if it succeeded on every rank. A collective: every
    rank calls it at the same point. If any rank failed, all stop at once instead of waiting on
    each other: rank 0 raises the first failing rank's refusal (naming that rank and its machine
    when it is not rank 0), so the one line is printed once; a rank whose failure was not a
    refusal re-raises its own error; every other rank raises RefusedElsewhere."""
    if not world.distributed:
        return work()
    result, failure = None, None
    try:
        result = work()
    except Exception as exc:  # noqa: BLE001 - whatever it is, the other ranks must hear of it
        failure = exc
    told = [None] * world.size
    # A refusal travels as data (its template and values), so rank 0 says it in the words of its own surface.
    said = (
        Phrase(failure.template, **failure.values)
        if isinstance(failure, MinigptError)
        else (str(failure).splitlines() or [""])[0][:300]
    )
    dist.all_gather_object(
        told,
        None if failure is None else (said, isinstance(failure, MinigptError), socket.gethostname()),
        group=_patient,
    )
    failed = [(rank, report) for rank, report in enumerate(told) if report is not None]
    if not failed:
        return result
    if failure is not None and not isinstance(failure, MinigptError):
        raise failure
    rank, (message, refused, host) = failed[0]
    if world.is_main:
        if rank == 0:
            raise failure
        if not refused:
            raise MinigptError(
                "rank {rank} (on {host}) stopped with an internal error ({message}); its own output has the details",
                rank=rank,
                host=host,
                message=message,
            )
        raise MinigptError("rank {rank} (on {host}): {message}", rank=rank, host=host, message=message)
    raise RefusedElsewhere("{message}", message=message)


def lost_contact(world: World, error: BaseException | None) -> bool:
    """Whether `error` is the process group reporting that another rank went away (its process
    ended or its machine did) in the middle of an exchange."""
    if not world.distributed or not isinstance(error, RuntimeError):
        return False
    message = str(error)
    return isinstance(error, getattr(dist, "DistError", ())) or any(
        words in message for words in ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
    )


def share(world: World, value):
    """Rank 0's `value` on every rank (the tokenizer, a starting state). Tensors travel through
    the CPU, so none lands on rank 0's GPU in another process."""
    if not world.distributed:
        return value
    box = [_on_cpu(value) if world.is_main else None]
    dist.broadcast_object_list(box, src=0, group=_patient)
    return box[0]


def _on_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def any_rank(world: World, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true on every rank when it is true on any (a stop request, a failure)."""
    if not world.distributed:
        return flags
    t = torch.tensor([1.0 if flag else 0.0 for flag in flags])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def mean(world: World, value: float) -> float:
    """The mean of `value` over the ranks."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / world.size


def finish(world: World, together: bool = True) -> None:
    """Leave the process group. `together`: every rank is ending at the same point (done, or
    stopping on an agreed refusal), so each waits for the others first (a rank leaving early would
    abort them). After a failure only this rank saw, it leaves at once: torchrun stops the rest."""
    if world.distributed and dist.is_initialized():
        if together:
            try:
                dist.barrier()
            except RuntimeError as exc:  # a rank failed on its own and has gone: it said why
                if not lost_contact(world, exc):
                    raise
                return
            dist.destroy_process_group()
