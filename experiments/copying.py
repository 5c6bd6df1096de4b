"""Chapter 4's selective-copying comparison over several seeds: python -m experiments.copying.

Trains every mixing layer of ``longctx.ch04.COPYING_MIXERS`` once per seed with
``longctx.ch04.copying_trial`` (the run the chapter makes live for seed 0) and writes the
accuracies, parameter counts and CPU seconds, headed by a record of the machine, to
``experiments/results/copying-<device>.json``. Chapter 4 reads the newest file. Two
processes of one torch thread each run at once (``--jobs``); a trial's numbers do not
depend on how many run beside it.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from longctx import ch04

from benchmarks.common import load_average, machine_record, write_results

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def _trial(job: tuple[str, int, int]) -> dict:
    """Run one (mixer, seed, steps) trial on one thread; return its record."""
    mixer, seed, steps = job
    torch.set_num_threads(1)
    started = time.process_time()
    result = ch04.copying_trial(mixer, seed, steps=steps)
    return {"mixer": mixer, "seed": seed, "accuracy": result["accuracy"],
            "parameters": result["parameters"],
            "final_loss": sum(result["losses"][-50:]) / len(result["losses"][-50:]),
            "cpu_seconds": time.process_time() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.copying", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 per mixer (default 5)")
    parser.add_argument("--steps", type=int, default=800, help="training steps (default 800)")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at once (default 2)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="results file (default experiments/results/copying-<device>.json)")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.steps < 1 or args.jobs < 1:
        parser.error("--seeds, --steps and --jobs must be at least 1")
    record = machine_record(torch.device("cpu"), threads=1, mode="full")
    record["processes"] = args.jobs
    out = args.out or RESULTS_DIR / f"copying-{record['device_slug']}.json"
    jobs = [(mixer, seed, args.steps) for seed in range(args.seeds)
            for mixer in ch04.COPYING_MIXERS]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        trials = []
        for trial in pool.map(_trial, jobs):
            print(f"seed {trial['seed']} {trial['mixer']:>18}: accuracy "
                  f"{trial['accuracy']:.3f} ({trial['cpu_seconds']:.1f} s CPU)", flush=True)
            trials.append(trial)
    record["wall_seconds"] = time.perf_counter() - started
    record["load_average_end"] = load_average()
    write_results({"machine": record, "task": ch04.COPYING_TASK, "steps": args.steps,
                   "trials": trials}, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
