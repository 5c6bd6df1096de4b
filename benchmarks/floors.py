"""The machine's floors: memory bandwidth (copy and read) and matrix-multiply throughput."""

from __future__ import annotations

import torch

from .common import time_median


def bandwidth_floor(*, device: torch.device, threads: int, megabytes: int = 256, min_run_time: float = 0.3) -> dict:
    """Return copy and read bandwidth (bytes/s) for a float32 buffer of `megabytes` MiB.

    Copy counts the bytes read plus the bytes written (2 x buffer); read is a sum over the buffer
    (1 x buffer). The buffer should be several times the last-level cache so that DRAM is measured.
    """
    if megabytes < 1:
        raise ValueError(f"megabytes must be >= 1 (got {megabytes})")
    elements = megabytes * 2**20 // 4
    generator = torch.Generator(device=device).manual_seed(0)
    source = torch.rand(elements, generator=generator, device=device)
    target = torch.empty_like(source)
    copy = time_median(lambda: target.copy_(source), device=device, threads=threads, min_run_time=min_run_time)
    read = time_median(lambda: source.sum(), device=device, threads=threads, min_run_time=min_run_time)
    return {
        "buffer_bytes": source.nbytes,
        "copy_seconds": copy["seconds"],
        "copy_bytes_per_s": 2 * source.nbytes / copy["seconds"],
        "read_seconds": read["seconds"],
        "read_bytes_per_s": source.nbytes / read["seconds"],
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
    timing = time_median(lambda: left @ right, device=device, threads=threads, min_run_time=min_run_time)
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "seconds": timing["seconds"],
            "flop_per_s": 2 * size**3 / timing["seconds"], "runs": timing["runs"]}


def measure_floors(*, device: torch.device, threads: int, quick: bool, progress) -> dict:
    """Return the floors record: bandwidth (copy, read) and matmul throughput; 'bytes_per_s' is the read floor."""
    bandwidth = bandwidth_floor(device=device, threads=threads, megabytes=64 if quick else 256)
    progress(f"floors: copy {bandwidth['copy_bytes_per_s'] / 1e9:.1f} GB/s, read {bandwidth['read_bytes_per_s'] / 1e9:.1f} GB/s")
    matmul = matmul_floor(device=device, threads=threads, size=1024 if quick else 2048)
    progress(f"floors: matmul {matmul['flop_per_s'] / 1e9:.1f} GFLOP/s (n={matmul['size']})")
    return {"bandwidth": bandwidth, "matmul": matmul,
            "bytes_per_s": max(bandwidth["read_bytes_per_s"], bandwidth["copy_bytes_per_s"]),
            "flop_per_s": matmul["flop_per_s"]}
