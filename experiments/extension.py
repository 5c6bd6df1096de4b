"""Chapter 6's experiment from the command line: python -m experiments [--size full|tiny] [--jobs N] [--threads N] [--seeds S ...] [--out PATH].

Runs ``longctx.ch06.run_extension_experiment`` and writes its results, headed by a record of
the machine, the date, the load average before and after, the threads and processes, and the
wall and CPU time (user + system, all workers), to
``experiments/results/extension-<device>.json`` (``-tiny`` appended for a tiny run).
Chapter 6 reads the newest full run.

Each seed is a complete, independent run. With ``--jobs 2`` (the default) two seeds run at
once in two processes of one torch thread each, which uses a 2-core machine fully without
the threads of one process competing for it; the numbers of a seed do not depend on how
many run beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import pathlib
import platform
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from longctx import ch06

from benchmarks.common import machine_record, write_results

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"

#: Toy sizes for the end-to-end test: every step of the full run, in seconds.
TINY = ch06.ExtensionSettings(
    trained_length=8, factors=(1, 2), d_model=8, layers=1, heads=2, steps=3, batch_size=4,
    finetune_steps=2, windows=2, depths=(0.0, 1.0), trials=2, methods=("rope", "pi"),
)
SIZES = {"full": ch06.ExtensionSettings(), "tiny": TINY}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="full",
                        help="full: the run Chapter 6 reads (under 10 minutes on 2 cores); tiny: seconds")
    parser.add_argument("--jobs", type=int, default=2, help="seeds run at once, one process each (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="training seeds (default: the size's own, 0 and 1)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="results file (default experiments/results/extension-<device>[-tiny].json)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _run_one(settings: ch06.ExtensionSettings, threads: int, progress: bool) -> tuple[dict, float]:
    """Run one seed in this process; return its results and the process's CPU seconds."""
    torch.set_num_threads(threads)
    results = ch06.run_extension_experiment(settings, progress=progress)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return results, usage.ru_utime + usage.ru_stime


def run_seeds(settings: ch06.ExtensionSettings, *, jobs: int, threads: int, progress: bool) -> tuple[dict, float]:
    """Run every seed of ``settings`` in ``jobs`` fresh processes; merge into one results dict.

    Returns the merged results (``runs`` in seed order) and the CPU seconds of all processes.
    """
    parts = [dataclasses.replace(settings, seeds=(seed,)) for seed in settings.seeds]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited torch threads
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = [pool.submit(_run_one, part, threads, progress and index == 0)
                   for index, part in enumerate(parts)]
        outcomes = [future.result() for future in futures]
    merged = outcomes[0][0]
    merged["settings"] = dataclasses.asdict(settings)
    merged["runs"] = [run for results, _ in outcomes for run in results["runs"]]
    merged["seconds"] = sum(results["seconds"] for results, _ in outcomes)
    return merged, sum(cpu for _, cpu in outcomes)


def main(argv=None) -> int:
    args = parse_args(argv)
    for name in ("jobs", "threads"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be >= 1 (got {getattr(args, name)})", file=sys.stderr)
            return 2
    settings = SIZES[args.size]
    try:
        if args.seeds is not None:
            settings = dataclasses.replace(settings, seeds=tuple(args.seeds))
    except (TypeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    jobs = min(args.jobs, len(settings.seeds))
    machine = machine_record(torch.device("cpu"), args.threads, args.size)
    machine["processes"] = jobs
    machine["host"] = platform.node()
    # The machine may be shared: the load before and after (1, 5 and 15 minutes) and the
    # CPU time of the workers say how far the wall time is from a quiet machine's.
    machine["load_average_start"] = [round(x, 2) for x in os.getloadavg()]
    out = args.out or RESULTS_DIR / f"extension-{machine['device_slug']}{'' if args.size == 'full' else '-tiny'}.json"
    wall = time.perf_counter()
    results, cpu = run_seeds(settings, jobs=jobs, threads=args.threads, progress=not args.quiet)
    machine["wall_seconds"] = time.perf_counter() - wall
    machine["cpu_seconds"] = cpu
    machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results({"machine": machine, **results}, out)
    print(f"wrote {out} ({machine['wall_seconds']:.0f} s wall, {cpu:.0f} s CPU, {jobs} process(es) "
          f"of {args.threads} thread(s))")
    return 0
