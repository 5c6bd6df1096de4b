"""Shared pieces of the benchmarks: device choice, timing, machine description, results files."""

from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import json
import os
import pathlib
import platform
import re
import time
from collections.abc import Callable

import torch
import torch.utils.benchmark as torch_benchmark

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
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


def cpu_model() -> str:
    """Return the CPU model name from /proc/cpuinfo (or platform.processor() where that is unreadable)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def cache_sizes() -> dict[int, int]:
    """Return {level: bytes} of CPU 0's data and unified caches (Linux sysfs); {} where unreadable."""
    sizes = {}
    try:
        for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes[level] = int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        return {}
    return sizes


def last_level_cache_bytes() -> int | None:
    """Return the size of the CPU's largest cache level in bytes (Linux sysfs), or None where unreadable."""
    sizes = cache_sizes()
    return sizes[max(sizes)] if sizes else None


def device_label(device: torch.device) -> str:
    """Return a human name for the device: the CPU model or the GPU name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def device_slug(device: torch.device) -> str:
    """Return the file-name form of the device, e.g. 'cpu-amd-epyc' or 'cuda-nvidia-h200'."""
    words = re.sub(r"\(r\)|\(tm\)|cpu|@.*$", " ", device_label(device).lower())
    slug = re.sub(r"[^a-z0-9]+", "-", words).strip("-")
    return f"{device.type}-{slug or 'unknown'}"


def synchronize(device: torch.device) -> None:
    """Wait for queued work on `device` to finish (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_median(fn: Callable[[], object], *, device: torch.device, threads: int,
                min_run_time: float = 0.2, slow_repeats: int = 5, min_blocks: int = 5) -> dict:
    """Return the median seconds per call of `fn` measured with torch.utils.benchmark after one warm-up call.

    The Timer picks how many calls make one block, repeats blocks for at least `min_run_time`
    seconds, and reports the median block time per call. A call slower than `min_run_time` on
    its own would give a single block, so it is instead timed `slow_repeats` times, one call per
    block, and the median of those is kept; a measurement of fewer than `min_blocks` blocks is
    topped up with more blocks of the same size. On CUDA the Timer synchronises.

    Returns:
        {"seconds": median, "runs": number of blocks, "iqr_seconds": interquartile range,
         "warmup_seconds": the first call (which pays for compiling, page faults, allocator growth)}
    """
    started = time.perf_counter()
    fn()  # warm-up: first-touch pages, kernel selection, allocator
    synchronize(device)
    warm_up = time.perf_counter() - started
    timer = torch_benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    if warm_up > min_run_time:
        measurement = torch_benchmark.Measurement.merge([timer.timeit(1) for _ in range(slow_repeats)])[0]
    else:
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
        if len(measurement.times) < min_blocks:
            extra = [timer.timeit(measurement.number_per_run) for _ in range(min_blocks - len(measurement.times))]
            measurement = torch_benchmark.Measurement.merge([measurement, *extra])[0]
    return {"seconds": float(measurement.median), "runs": len(measurement.times),
            "iqr_seconds": float(measurement.iqr), "warmup_seconds": warm_up}


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


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
RETURNED_THRESHOLD = 128 * 2**10  # glibc's starting mmap and trim thresholds
KEPT_MMAP_THRESHOLD = 32 * 2**20  # the largest mmap threshold glibc accepts on 64-bit machines
KEPT_TRIM_THRESHOLD = 2**30


def set_allocator(keep: bool) -> dict | None:
    """Fix how glibc's malloc treats a freed block, and return the setting (None where malloc is not glibc's).

    keep=False fixes glibc's starting thresholds (128 KiB): every block larger than that is mapped
    fresh and handed back when freed, so the next call's temporaries touch new pages, one page fault
    per 4 KiB. (Left alone, glibc raises the thresholds as it sees blocks freed, and trims the heap
    when its top is free, so which temporaries fault depends on the history of the process.)
    keep=True serves blocks up to 32 MiB from the heap and never trims it, so a step's temporaries
    reuse pages that are already mapped, as a serving process's working memory would.
    """
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mmap_threshold = KEPT_MMAP_THRESHOLD if keep else RETURNED_THRESHOLD
    trim_threshold = KEPT_TRIM_THRESHOLD if keep else RETURNED_THRESHOLD
    if not (mallopt(M_MMAP_THRESHOLD, mmap_threshold) and mallopt(M_TRIM_THRESHOLD, trim_threshold)):
        return None  # mallopt returns 0 when it refuses a setting
    return {"allocator": "glibc malloc", "keep_freed": keep, "mmap_threshold": mmap_threshold,
            "trim_threshold": trim_threshold}


def _status_bytes(*fields: str) -> dict[str, int]:
    """Return the named fields of /proc/self/status in bytes (VmRSS, VmHWM, ...)."""
    values = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        name = line.split(":", 1)[0]
        if name in fields:
            values[name] = int(line.split()[1]) * 1024
    return values


def peak_extra_bytes(fn: Callable[[], object]) -> int | None:
    """Return how far one call of `fn` raised the process's resident memory above where it started.

    After a warm-up call, freed memory is handed back to the system (malloc_trim) and the
    kernel's record of the peak resident size is reset (writing 5 to /proc/self/clear_refs);
    the call then runs, and the result is its peak (VmHWM) minus the resident size before it.
    Memory the call allocates and frees again still counts, because the peak remembers it.
    Returns None where /proc or glibc is not available (the measurement is Linux-only).
    """
    trim = _libc_malloc_trim()
    clear_refs = pathlib.Path("/proc/self/clear_refs")
    if trim is None or not clear_refs.exists():
        return None
    try:
        fn()
        gc.collect()
        trim()
        clear_refs.write_text("5")  # reset VmHWM to the current resident size
        before = _status_bytes("VmRSS")["VmRSS"]
        fn()
        return max(0, _status_bytes("VmHWM")["VmHWM"] - before)
    except (OSError, KeyError, ValueError):
        return None


def release_memory(device: torch.device) -> None:
    """Drop unreferenced tensors and hand freed heap pages back, so the next measurement starts settled."""
    gc.collect()
    trim = _libc_malloc_trim()
    if trim is not None:
        trim()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def load_average() -> float | None:
    """Return the system's one-minute load average (runnable processes), or None where unavailable."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def machine_record(device: torch.device, threads: int, mode: str) -> dict:
    """Return the description of the run that every results file begins with."""
    return {
        "device": device.type,
        "device_name": device_label(device),
        "device_slug": device_slug(device),
        "cpu_model": cpu_model(),
        "threads": threads,
        "logical_cpus": os.cpu_count(),
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": mode,
        "load_average_start": load_average(),
    }


def default_results_path(device: torch.device, quick: bool) -> pathlib.Path:
    """Return benchmarks/results/<device-slug>.json (full) or <device-slug>-quick.json (quick)."""
    return RESULTS_DIR / f"{device_slug(device)}{'-quick' if quick else ''}.json"


def write_results(results: dict, path: pathlib.Path) -> None:
    """Write `results` as indented JSON, atomically (a .tmp file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


class Progress:
    """Print one line per finished measurement with the elapsed time, flushed at once."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.start:6.1f} s] {message}", flush=True)
