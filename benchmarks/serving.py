"""Command line: python -m benchmarks.serving [--quick] [--parts ...] [--out PATH] [--threads N].

Chapter 13's measurements ("Serving a long context"): one layer's whole decode step (``step``), the
paged cache's step and gather (``paged``), and the chapter's own C++ decode kernel (``kernel``).
Each part is a module ``benchmarks/serving_<part>.py`` with ``FULL`` and ``QUICK`` settings and
``run(settings, *, threads, progress) -> dict``. Every comparison is timed as interleaved rounds
(``interleaved``): in each round every contender is timed once, in an order that rotates, so a
drift of the machine falls on all of them alike; a ratio is the median of the per-round ratios,
with the distribution-free interval for a median from the rounds' order statistics
(``median_interval``). Results go to ``benchmarks/results/serving-<device>[-quick|-partial].json``.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import time

import torch
from longctx.support import measure
from longctx.support.measure import cache_sizes, last_level_cache_bytes
from longctx.support.runs import machine_record

from .common import Progress, finish_run, set_allocator

PARTS = ("step", "paged", "kernel")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS, help="parts to run")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="results file")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            print(f"error: --threads must be >= 1 (got {args.threads})", file=sys.stderr)
            return 2
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    device = torch.device("cpu")
    mode = "partial" if set(args.parts) != set(PARTS) else "quick" if args.quick else "full"
    progress = Progress()
    started = time.monotonic()
    results = {"machine": machine_record(device, threads, mode)}
    results["machine"]["llc_bytes"] = last_level_cache_bytes()
    results["machine"]["l2_bytes"] = cache_sizes().get(2)
    progress(f"serving benchmarks on {results['machine']['device_name']}, {threads} threads, {mode} run")
    first = measure.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["machine"]["allocator"] = set_allocator(True)
    results["settings"] = {}
    for part in PARTS:
        if part in args.parts:
            module = importlib.import_module(f"benchmarks.serving_{part}")
            settings = module.QUICK if args.quick else module.FULL
            results["settings"][part] = settings
            results[part] = module.run(settings, threads=threads, progress=progress)
    last = measure.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["floors"] = measure.best_floors(first, last)
    finish_run(results, started=started, prefix="serving", mode=mode, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
