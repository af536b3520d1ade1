"""The machine a report describes: its CPU, memory, torch and threads, and its matmul peaks (the
denominator of the model FLOPs utilisation)."""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import torch


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    from minigpt.device import native_bfloat16

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "cpu_bfloat16": native_bfloat16("cpu"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 10, device: str = "cpu") -> float:
    """GFLOP/s of a square matmul, best of `repeats` (measured at the start and the end of the
    benchmark; the report keeps the higher, so a busy moment does not inflate the utilisation)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    best = math.inf
    for _ in range(repeats + 2):
        synchronize(device)
        started = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
