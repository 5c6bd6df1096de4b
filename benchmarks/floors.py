"""The machine's floors: memory bandwidth (copy and read) and matrix-multiply throughput."""

from __future__ import annotations

import torch
from longctx.support import time_call

from .common import last_level_cache_bytes


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


def buffer_megabytes(device: torch.device, quick: bool) -> int:
    """Return the bandwidth buffer's size: 64 MiB for a quick run; else 256 MiB, or four times the CPU's
    last-level cache where that is larger (capped at 2 GiB), so that main memory rather than cache is timed."""
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
