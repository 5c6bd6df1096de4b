"""Command line: python -m benchmarks.serving [--quick] [--parts ...] [--out PATH] [--threads N].

Chapter 8's measurements ("Serving a long context"): one layer's whole decode step (``step``), the
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
import math
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import torch
from longctx.support import time_call
from longctx.support.runs import load_average, machine_record, write_results

from . import floors
from .common import RESULTS_DIR, Progress, cache_sizes, last_level_cache_bytes, set_allocator

PARTS = ("step", "paged", "kernel")


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
    first = floors.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["machine"]["allocator"] = set_allocator(True)
    results["settings"] = {}
    for part in PARTS:
        if part in args.parts:
            module = importlib.import_module(f"benchmarks.serving_{part}")
            settings = module.QUICK if args.quick else module.FULL
            results["settings"][part] = settings
            results[part] = module.run(settings, threads=threads, progress=progress)
    last = floors.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["floors"] = floors.best_floors(first, last)
    results["machine"]["wall_seconds"] = time.monotonic() - started
    results["machine"]["load_average_end"] = load_average()
    suffix = "" if mode == "full" else f"-{mode}"
    out = args.out or RESULTS_DIR / f"serving-{results['machine']['device_slug']}{suffix}.json"
    write_results(results, out)
    print(f"wrote {out} ({results['machine']['wall_seconds']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
