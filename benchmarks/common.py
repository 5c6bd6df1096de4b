"""Shared pieces of the benchmarks: device choice, caches, memory, the allocator, results files.

The timer (``time_call``), the record of the machine and the writing of a results file are the
book's, in ``longctx.support``, shared with the experiments and the chapters.
"""

from __future__ import annotations

import ctypes
import gc
import pathlib
import time
from collections.abc import Callable

import torch
from longctx.support.runs import device_slug, load_average, write_results

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
#: Runs from other machines, one folder each, kept beside the chapters' own: support.load_results reads
#: only RESULTS_DIR's top level, so a run saved here (--out) is read only where a chapter names its folder.
OTHER_MACHINES_DIR = RESULTS_DIR / "other-machines"


#: Where a run goes unless --out says otherwise: a reader's own runs, beside the chapters' and never read
#: in their place. The chapters' sentences are asserted against the runs they were written on (the top
#: level of RESULTS_DIR); a run from another machine there would replace one and fail those asserts.
YOURS_DIR = RESULTS_DIR / "yours"


def other_machine_folders() -> list[pathlib.Path]:
    """Return the folders of OTHER_MACHINES_DIR, one per machine, sorted by name."""
    return sorted(path for path in OTHER_MACHINES_DIR.iterdir() if path.is_dir())
DEVICE_CHOICES = ("cpu", "cuda", "auto")


def resolve_device(name: str) -> torch.device:
    """Return the torch.device for 'cpu', 'cuda' or 'auto' (cuda when available, else cpu).

    Raises:
        ValueError: for any other name, or 'cuda' on a machine without a CUDA device.
    """
    if name not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {name!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch.cuda.is_available() is False; use 'cpu' or 'auto'")
    return torch.device(name)


def rss_bytes() -> int | None:
    """Return this process's resident set size in bytes from /proc/self/status, or None where unreadable."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _libc_malloc_trim() -> Callable[[], object] | None:
    """Return glibc's malloc_trim(0), which hands freed heap pages back to the system, or None elsewhere."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return lambda: trim(0)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameter numbers (malloc.h)
RETURNED_THRESHOLD = 128 * 2**10  # glibc's starting mmap and trim thresholds
KEPT_MMAP_THRESHOLD = 32 * 2**20  # the largest mmap threshold glibc accepts on 64-bit machines
KEPT_TRIM_THRESHOLD = 2**30
DEFAULT_MMAP_MAX = 65536  # glibc's default cap on the number of blocks mapped at once


def set_allocator(keep: bool, *, heap_only: bool = False) -> dict | None:
    """Fix how glibc's malloc treats a freed block, and return the setting (None where malloc is not glibc's).

    keep=False fixes glibc's starting thresholds (128 KiB): every block larger than that is mapped
    fresh and handed back when freed, so the next call's temporaries touch new pages, one page fault
    per 4 KiB. (Left alone, glibc raises the thresholds as it sees blocks freed, and trims the heap
    when its top is free, so which temporaries fault depends on the history of the process.)
    keep=True serves blocks up to 32 MiB from the heap and never trims it, so a step's temporaries
    reuse pages that are already mapped, as a serving process's working memory would. glibc will not
    raise the mmap threshold past 32 MiB, so a larger block is still mapped fresh every call;
    heap_only=True (with keep) also sets M_MMAP_MAX to 0, so that no block is mapped and every one,
    however large, is served from the kept heap.
    """
    if heap_only and not keep:
        raise ValueError("heap_only=True needs keep=True: a heap that is trimmed hands its blocks back anyway")
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mmap_threshold = KEPT_MMAP_THRESHOLD if keep else RETURNED_THRESHOLD
    trim_threshold = KEPT_TRIM_THRESHOLD if keep else RETURNED_THRESHOLD
    mmap_max = 0 if heap_only else DEFAULT_MMAP_MAX
    if not (mallopt(M_MMAP_THRESHOLD, mmap_threshold) and mallopt(M_TRIM_THRESHOLD, trim_threshold)
            and mallopt(M_MMAP_MAX, mmap_max)):
        return None  # mallopt returns 0 when it refuses a setting
    return {"allocator": "glibc malloc", "keep_freed": keep, "mmap_threshold": mmap_threshold,
            "trim_threshold": trim_threshold, "mmap_max": mmap_max}


def _status_bytes(*fields: str) -> dict[str, int]:
    """Return the named fields of /proc/self/status in bytes (VmRSS, VmHWM, ...)."""
    values = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        name = line.split(":", 1)[0]
        if name in fields:
            values[name] = int(line.split()[1]) * 1024
    return values


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Return the most bytes of tensors one call of `fn` holds at once beyond those it started with.

    After a warm-up call, the call runs under torch.profiler with ``profile_memory=True``, which
    records every allocation and free of a tensor's storage with its size and time; the result is
    the highest running sum of those records. It counts what the algorithm holds, whatever the
    allocator keeps or hands back, so it does not depend on the history of the process (a resident
    size does: a kept heap that has fragmented stays resident). Scratch memory a library takes for
    itself outside torch's allocator (a BLAS workspace) is not counted.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    changes = sorted((event.start_ns(), event.nbytes()) for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]")
    held = peak = 0
    for _, change in changes:
        held += change
        peak = max(peak, held)
    return peak


def release_memory(device: torch.device) -> None:
    """Drop unreferenced tensors and hand freed heap pages back, so the next measurement starts settled."""
    gc.collect()
    trim = _libc_malloc_trim()
    if trim is not None:
        trim()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def default_results_path(device: torch.device, mode: str) -> pathlib.Path:
    """Return benchmarks/results/yours/benchmarks-<device-slug>.json, with -<mode> before .json unless full.

    The chapters read the runs of RESULTS_DIR's top level (``support.load_results("benchmarks")``),
    so a default run never replaces theirs; ``load_results("benchmarks", folder=YOURS_DIR)`` reads it.
    """
    return YOURS_DIR / f"benchmarks-{device_slug(device)}{'' if mode == 'full' else '-' + mode}.json"


class Progress:
    """Print one line per finished measurement with the elapsed time, flushed at once."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.start:6.1f} s] {message}", flush=True)


def finish_run(results: dict, *, started: float, prefix: str, mode: str, out: pathlib.Path | None) -> pathlib.Path:
    """Record the run's wall time and closing load average, write it to `out` (default
    results/yours/<prefix>-<device slug>[-<mode>].json) and say where; returns the path."""
    results["machine"]["wall_seconds"] = time.monotonic() - started
    results["machine"]["load_average_end"] = load_average()
    suffix = "" if mode == "full" else f"-{mode}"
    out = out or YOURS_DIR / f"{prefix}-{results['machine']['device_slug']}{suffix}.json"
    write_results(results, out)
    print(f"wrote {out} ({results['machine']['wall_seconds']:.0f} s)", flush=True)
    return out
