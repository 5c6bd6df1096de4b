"""How the book measures a machine and compares two timings: its caches, its floors, cold copies, rounds.

The floors are the two ceilings of a roofline: the read bandwidth B (bytes/s) and the square
matrix-multiply rate F (FLOP/s), measured at a run's start and end. A timed step reads a cache
that is not in the last-level cache (``cold_copies``). A comparison of two steps is timed in
interleaved rounds (``interleaved``) and given as the median of the per-round ratios with a
distribution-free interval (``ratio``, ``median_interval``). The benchmarks, the experiments and
the chapters all use these; the timer itself is ``runs.time_call``.
"""

from __future__ import annotations

import math
import pathlib
import statistics
import time
from collections.abc import Callable

import torch

from .runs import time_call

COLD_FACTOR = 4  # rotated caches fill at least this many times the LLC
MAX_COPIES = 4096  # the smallest cache (MQA, 1K tokens: 1 MiB) needs 1,920 on a 480 MiB LLC
DEFAULT_LLC = 32 * 2**20  # where the machine does not say


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


def attention_flops(query_heads: int, tokens: int, width: int) -> int:
    """Return the multiply-adds x 2 of one query row per head against `tokens` keys: QK^T and PV."""
    return 4 * query_heads * tokens * width


def device_cache_bytes(device: torch.device | None = None) -> int:
    """Return the largest cache that could hold a step's operands, in bytes.

    The CPU's LLC (sysfs), or on CUDA the device's L2 (``torch.cuda.get_device_properties``);
    DEFAULT_LLC where neither says.
    """
    if device is not None and device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_LLC
    return last_level_cache_bytes() or DEFAULT_LLC


def cold_copies(cache_bytes: int, cold: bool, device: torch.device | None = None) -> int:
    """Return how many distinct caches to rotate through to fill COLD_FACTOR x the device's cache.

    The cache is ``device_cache_bytes``: the CPU's LLC, or a GPU's L2.
    """
    if not cold:
        return 1
    return max(2, min(MAX_COPIES, math.ceil(COLD_FACTOR * device_cache_bytes(device) / cache_bytes)))


def bandwidth_floor(*, device: torch.device, threads: int, megabytes: int = 256, min_run_time: float = 0.3) -> dict:
    """Return copy and read bandwidth (bytes/s) for a float32 buffer of `megabytes` MiB.

    Copy counts the bytes read plus the bytes written (2 x buffer); read is the faster of a sum
    over the buffer and a matrix-vector product with it (1 x buffer each). The buffer should be
    several times the last-level cache so that DRAM is measured.
    """
    if megabytes < 1:
        raise ValueError(f"megabytes must be >= 1 (got {megabytes})")
    elements = megabytes * 2**20 // 4
    generator = torch.Generator(device=device).manual_seed(0)
    source = torch.rand(elements, generator=generator, device=device)
    target = torch.empty_like(source)
    rows = source.view(-1, 1024)
    weights = torch.rand(1024, generator=generator, device=device)
    copy = time_call(lambda: target.copy_(source), threads=threads, min_run_time=min_run_time)
    read_sum = time_call(lambda: source.sum(), threads=threads, min_run_time=min_run_time)
    read_gemv = time_call(lambda: rows @ weights, threads=threads, min_run_time=min_run_time)
    read = min(read_sum, read_gemv, key=lambda timing: timing["seconds"])  # two ways to read every byte once
    return {
        "buffer_bytes": source.nbytes,
        "copy_seconds": copy["seconds"],
        "copy_bytes_per_s": 2 * source.nbytes / copy["seconds"],
        "read_seconds": read["seconds"],
        "read_bytes_per_s": source.nbytes / read["seconds"],
        "read_sum_bytes_per_s": source.nbytes / read_sum["seconds"],
        "read_matvec_bytes_per_s": source.nbytes / read_gemv["seconds"],
        "runs": min(copy["runs"], read["runs"]),
    }


def matmul_floor(*, device: torch.device, threads: int, size: int = 2048, dtype=torch.float32,
                 min_run_time: float = 0.3) -> dict:
    """Return square matrix-multiply throughput in FLOP/s (2 n^3 per product) for n = `size`."""
    if size < 1:
        raise ValueError(f"size must be >= 1 (got {size})")
    generator = torch.Generator(device=device).manual_seed(1)
    left = torch.randn(size, size, generator=generator, device=device).to(dtype)
    right = torch.randn(size, size, generator=generator, device=device).to(dtype)
    timing = time_call(lambda: left @ right, threads=threads, min_run_time=min_run_time)
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "seconds": timing["seconds"],
            "flop_per_s": 2 * size**3 / timing["seconds"], "runs": timing["runs"]}


def int_matmul_floor(*, device: torch.device, threads: int, size: int = 2048, min_run_time: float = 0.3) -> dict:
    """Return square ``torch._int_mm`` throughput (int8 x int8 summed in int32), 2 n^3 operations per product.

    The integer route's products run on the integer vector units (VNNI or AMX where the CPU has them),
    whose rate is not the float32 matmul's; n is a multiple of 8 and above 16, as CUDA's kernel needs.
    """
    if size <= 16 or size % 8:
        raise ValueError(f"size must be a multiple of 8 above 16, as torch._int_mm needs (got {size})")
    generator = torch.Generator(device=device).manual_seed(2)
    left, right = (torch.randint(-127, 128, (size, size), generator=generator, device=device, dtype=torch.int8)
                   for _ in "ab")
    out = torch.empty(size, size, device=device, dtype=torch.int32)
    timing = time_call(lambda: torch._int_mm(left, right, out=out), threads=threads, min_run_time=min_run_time)
    return {"size": size, "seconds": timing["seconds"], "op_per_s": 2 * size**3 / timing["seconds"],
            "runs": timing["runs"]}


ELEMENTWISE_KINDS = ("convert", "shift", "scale")  # the passes a quantised step makes over its numbers


def elementwise_floor(*, device: torch.device, threads: int, cache_bytes: int | None = None,
                      min_run_time: float = 0.2) -> dict:
    """Return elements per second of the three passes a quantised step makes, on a buffer that stays in cache.

    'convert' is int8 codes to float32, 'shift' a right shift of uint8 bytes (unpacking a packed code),
    'scale' a float32 multiply in place. The buffer holds a quarter of `cache_bytes` (the L2, or 1 MiB)
    in float32, and at least 256K numbers: held in cache, so that the rate measured is the units' and not
    the memory's, and long enough that a call's fixed cost (a few microseconds) is a small part of it.
    """
    cache_bytes = cache_bytes or 2**20
    elements = max(2**18, cache_bytes // 4 // 4)
    generator = torch.Generator(device=device).manual_seed(3)
    codes = torch.randint(-127, 128, (elements,), generator=generator, device=device, dtype=torch.int8)
    packed = codes.view(torch.uint8)
    floats, shifted = torch.empty(elements, device=device), torch.empty_like(packed)
    passes = {"convert": lambda: floats.copy_(codes), "shift": lambda: torch.bitwise_right_shift(packed, 4, out=shifted),
              "scale": lambda: floats.mul_(1.0)}
    rates = {kind: elements / time_call(run, threads=threads, min_run_time=min_run_time)["seconds"]
             for kind, run in passes.items()}
    return {"elements": elements, **{f"{kind}_per_s": rate for kind, rate in rates.items()}}


def arithmetic_seconds(work: dict[str, int], rates: dict[str, float]) -> float:
    """Return the time the counted work takes at its ceilings: the sum over kinds of count / rate.

    A sum, not a maximum: the integer products, the conversions and the float products of one step
    all issue from the same vector units, so one kind's time does not hide another's.
    """
    unknown = set(work) - set(rates)
    if unknown:
        raise ValueError(f"work has kinds without a ceiling: {sorted(unknown)}; known: {sorted(rates)}")
    return sum(count / rates[kind] for kind, count in work.items())


def read_bandwidth_sweep(*, device: torch.device, threads: int, sizes: list[int],
                         min_run_time: float = 0.05) -> list[dict]:
    """Return the read rate (bytes/s) over buffers of each size in `sizes` (bytes), re-read warm.

    Each buffer is read by a matrix-vector product, the same read the floor uses; while the buffer
    fits a cache level, re-reading it is served from there, so the rate falls in steps where the
    machine's caches end (``effective_cache_bytes``).
    """
    rows = []
    for size in sizes:
        if size < 4096:
            raise ValueError(f"every size must be at least 4096 bytes (got {size})")
        generator = torch.Generator(device=device).manual_seed(4)
        buffer = torch.rand(size // 4 // 1024, 1024, generator=generator, device=device)
        weights = torch.rand(1024, generator=generator, device=device)
        timing = time_call(lambda b=buffer, w=weights: b @ w, threads=threads, min_run_time=min_run_time)
        rows.append({"bytes": buffer.nbytes, "bytes_per_s": buffer.nbytes / timing["seconds"]})
    return rows


def effective_cache_bytes(sweep: list[dict]) -> int | None:
    """Return the largest buffer of a bandwidth sweep still read from cache, or None if none was.

    Read from cache means at least the geometric mean of the sweep's fastest rate and its largest
    buffer's rate (main memory's): halfway, on a log scale, from the memory plateau to the cache's.
    A VM's share of a host's L3 shows here, where sysfs gives the whole host's size.
    """
    if len(sweep) < 2:
        raise ValueError(f"a sweep needs at least two buffer sizes (got {len(sweep)})")
    ordered = sorted(sweep, key=lambda row: row["bytes"])
    memory = ordered[-1]["bytes_per_s"]
    cut = math.sqrt(max(row["bytes_per_s"] for row in ordered) * memory)
    cached = [row["bytes"] for row in ordered[:-1] if row["bytes_per_s"] >= cut]
    return max(cached) if cached and cut > memory * 1.1 else None


def sweep_sizes(largest: int) -> list[int]:
    """Return buffer sizes from 256 KiB to `largest` bytes, two a doubling (x1 and x1.5)."""
    sizes, size = [], 256 * 2**10
    while size <= largest:
        sizes += [size] + ([size * 3 // 2] if size * 3 // 2 <= largest else [])
        size *= 2
    return sizes


def buffer_megabytes(device: torch.device, quick: bool) -> int:
    """Return the bandwidth buffer's size in MiB: 64 for a quick run, else 256 or four times the LLC.

    Four times the CPU's last-level cache where that is larger (capped at 2 GiB), so that main memory
    rather than cache is timed.
    """
    if quick:
        return 64
    cache = last_level_cache_bytes() if device.type == "cpu" else None
    return min(2048, max(256, 4 * cache // 2**20)) if cache else 256


def measure_floors(*, device: torch.device, threads: int, quick: bool, progress) -> dict:
    """Return the floors record: bandwidth (copy, read) and matmul throughput.

    'bytes_per_s' is the read floor B, the faster of the sum and the matrix-vector product over the
    buffer (a decode step reads its cache and writes almost nothing); the copy bandwidth, which counts
    bytes read plus bytes written, is recorded beside it but is not B. 'flop_per_s' is the matmul floor F.
    """
    bandwidth = bandwidth_floor(device=device, threads=threads, megabytes=buffer_megabytes(device, quick))
    progress(f"floors: copy {bandwidth['copy_bytes_per_s'] / 1e9:.1f} GB/s, read {bandwidth['read_bytes_per_s'] / 1e9:.1f} GB/s")
    sizes = (512, 1024) if quick else (1024, 2048, 3072)
    tries = [matmul_floor(device=device, threads=threads, size=size) for size in sizes]
    matmul = max(tries, key=lambda record: record["flop_per_s"])  # the fastest rate the machine showed
    matmul["sizes_tried"] = {str(t["size"]): t["flop_per_s"] for t in tries}
    progress(f"floors: matmul {matmul['flop_per_s'] / 1e9:.1f} GFLOP/s (best of n = {', '.join(map(str, sizes))})")
    read_by = "matrix-vector product" if bandwidth["read_matvec_bytes_per_s"] >= bandwidth["read_sum_bytes_per_s"] \
        else "sum"
    return {"bandwidth": bandwidth, "matmul": matmul, "bytes_per_s": bandwidth["read_bytes_per_s"],
            "read_by": read_by, "flop_per_s": matmul["flop_per_s"]}


def best_floors(first: dict, second: dict) -> dict:
    """Return floors made of the faster copy, the faster read and the faster matmul of two measurements.

    A floor is the best the machine can do; measuring it at the start and the end of a run and
    keeping the better of each guards against a moment when other work slowed the machine. Both
    measurements stay in 'measured' (start, end), so that a share of the roofline can be given
    with the range the two floors span. 'bytes_per_s' is the faster read floor (not the copy).
    """
    bandwidth = {}
    for key in ("copy", "read"):
        best = max(first["bandwidth"], second["bandwidth"], key=lambda b, key=key: b[f"{key}_bytes_per_s"])
        bandwidth.update({name: value for name, value in best.items() if name.startswith(key)})
    bandwidth["buffer_bytes"] = first["bandwidth"]["buffer_bytes"]
    matmul = max(first["matmul"], second["matmul"], key=lambda m: m["flop_per_s"])
    read_by = max((first, second), key=lambda f: f["bandwidth"]["read_bytes_per_s"])["read_by"]
    return {"bandwidth": bandwidth, "matmul": matmul, "bytes_per_s": bandwidth["read_bytes_per_s"],
            "read_by": read_by, "flop_per_s": matmul["flop_per_s"], "measured": [first, second]}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Return (median, low, high, coverage): a distribution-free interval for the median of ``values``.

    For n sorted values x_(1) <= ... <= x_(n), [x_(k), x_(n+1-k)] holds the true median with
    probability 1 - 2 P(Binomial(n, 1/2) <= k - 1). The widest k whose coverage is still at least
    ``level`` is used; where even k = 1 (the whole range) covers less (n < 6 at 0.95), the whole
    range is returned with the coverage it has. For n = 7 the whole range covers 0.984.
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("values must not be empty")

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return statistics.median(ordered), ordered[k - 1], ordered[n - k], coverage(k)


def interleaved(functions: dict[str, Callable[[], object]], *, rounds: int = 7, threads: int = 1,
                min_run_time: float = 0.05) -> dict[str, list[float]]:
    """Return each function's seconds per call in each of ``rounds`` rounds, timed in a rotating order.

    Every function is called once first (a warm-up outside the rounds). In a round, each function
    is called once on the clock; a call that took at least ``min_run_time`` is that round's time,
    and a faster one is timed again by ``time_call`` (a median over blocks of at least
    ``min_run_time`` seconds), so that a slow step costs one call a round and a fast one is not
    lost in the clock's resolution.
    """
    names = list(functions)
    for name in names:
        functions[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(rounds):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            started = time.perf_counter()
            functions[name]()
            took = time.perf_counter() - started
            if took < min_run_time:
                took = time_call(functions[name], threads=threads, min_run_time=min_run_time,
                                 slow_repeats=1, min_blocks=1)["seconds"]
            seconds[name].append(took)
    return seconds


def ratio(seconds: dict[str, list[float]], top: str, bottom: str, level: float = 0.95) -> dict:
    """Return the median per-round ratio seconds[top] / seconds[bottom] and its interval."""
    middle, low, high, covered = median_interval(
        [a / b for a, b in zip(seconds[top], seconds[bottom], strict=True)], level)
    return {"of": top, "to": bottom, "ratio": middle, "low": low, "high": high, "coverage": covered,
            "rounds": len(seconds[top])}
