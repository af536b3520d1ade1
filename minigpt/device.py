"""Where a command computes: `[train] device` and `[train] threads`, read the same way by every command."""

from __future__ import annotations

import os

import torch

from .errors import MinigptError
from .torch_private import cpu_flags


def pick_device(name: str) -> str:
    """`auto` -> cuda when present, then mps, else cpu; an explicit device must exist."""
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if (name == "cuda" and not cuda) or (name == "mps" and not mps):
        raise MinigptError(
            '[train] device = {name!r} but this machine has no {name}; set [train] device = "auto" (or "cpu")',
            name=name,
        )
    return name


def check_dtype(device: str, dtype: str) -> None:
    """Refuse a dtype the device cannot hold (Apple's MPS has no float64)."""
    if device == "mps" and dtype == "float64":
        raise MinigptError(
            '[model] dtype = "float64" cannot run on device = "mps" (MPS has no float64); '
            'set [train] device = "cpu" for exact float64 runs, or [model] dtype = "float32"'
        )


def available_memory(device: str) -> int | None:
    """Bytes that can still be allocated: the CUDA device's free memory, else the system's
    MemAvailable (/proc/meminfo); None where neither can be read."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


_default_threads: int | None = None  # torch's own thread count, read before minigpt first changes it


def default_threads() -> int:
    """torch's own thread count (one per core, or what OMP_NUM_THREADS says), as it was before
    minigpt first changed it."""
    global _default_threads
    if _default_threads is None:
        _default_threads = torch.get_num_threads()
    return _default_threads


def use_threads(threads: int) -> None:
    """`[train] threads`: 0 is torch's own default (default_threads()), so a process that sampled
    on one thread trains on every core again afterwards."""
    wanted = threads or default_threads()
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


# ---------------------------------------------------------------- precision


# What a CPU's bfloat16 is, when the flags should not decide: "native" or "emulated". For a machine
# whose flags mislead, and for the tests, which run both branches of every choice on every CPU.
BFLOAT16_OVERRIDE = "MINIGPT_CPU_BFLOAT16"
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bfloat16(device: str) -> bool:
    """Whether bfloat16 matmuls run natively here: CUDA's own answer, or on the CPU the AVX-512 BF16
    or AMX instructions (without them torch emulates bf16, slower than float32), unless
    $MINIGPT_CPU_BFLOAT16 says `native` or `emulated`."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device != "cpu":
        return False
    forced = os.environ.get(BFLOAT16_OVERRIDE, "")
    if forced:
        if forced not in ("native", "emulated"):
            raise MinigptError(
                "${name} = {forced!r} is not a CPU kind; set it to native or emulated, or unset it to read the "
                "CPU's flags",
                name=BFLOAT16_OVERRIDE,
                forced=forced,
            )
        return forced == "native"
    return cpu_has_native_bfloat16(cpu_flags(), _cpuinfo_words)


def cpu_has_native_bfloat16(flags: dict[str, bool] | None, cpuinfo_words) -> bool:
    """AVX-512 BF16 or AMX among the CPU's flags: torch's own reading where it gives one, else the
    words of /proc/cpuinfo (`cpuinfo_words()`, read only then)."""
    if flags is not None:
        return any(flags.get(name) for name in NATIVE_BFLOAT16_FLAGS)
    return bool(cpuinfo_words() & set(NATIVE_BFLOAT16_FLAGS))


def _cpuinfo_words() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(f.read().split())
    except OSError:
        return set()


def pick_precision(name: str, device: str, dtype: str) -> str:
    """`[train] precision`: "auto" -> bfloat16 autocast where it runs natively and the model is
    float32, else float32. Weights, gradients and optimizer state stay in the model's dtype either
    way; only the matmuls of the forward and backward pass run in bfloat16."""
    if dtype != "float32":
        if name == "bfloat16":
            raise MinigptError(
                '[train] precision = "bfloat16" needs [model] dtype = "float32" (it is {dtype!r}); use precision '
                '= "auto" or "float32"',
                dtype=dtype,
            )
        return dtype
    if name == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return name


def autocast(device: str, precision: str):
    """The context the forward pass runs in: bfloat16 autocast, or nothing."""
    from contextlib import nullcontext

    if precision != "bfloat16":
        return nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


# ---------------------------------------------------------------- memory


def keep_freed_memory() -> bool:
    """Ask glibc's allocator to serve large blocks from its heap and keep what is freed, instead of
    mapping fresh pages for every activation and handing them back after each step: the kernel
    zeroes every fresh page, which cost a training step about a sixth of its time on the CPU. The
    memory a run holds stays what its largest step needs. Linux with glibc only; elsewhere a no-op."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 30))
