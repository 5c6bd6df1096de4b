"""python -m experiments {copying,extension,forgetting,speculative} [--size full|tiny] [--jobs N] [--seeds S ...]
[--out PATH] [--quiet]

Runs one study (``copying``: Chapter 6's selective copying; ``extension``: Chapter 11's context
extension; ``forgetting``: Chapter 12's cache policies; ``speculative``: Chapter 13's drafted decoding) at its ``full`` size (the run the chapter
reads) or its ``tiny`` one (seconds), ``--jobs`` jobs at a time, each a process of one torch
thread. The results, headed by a record of the machine, the date, the load average before and
after and the wall and CPU time of every process, go to
``experiments/results/<study>-<device>.json`` (``-tiny`` before ``.json`` for a tiny run).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pathlib
import sys

import torch
from longctx import support

from experiments.common import RESULTS_DIR

STUDIES = ("copying", "extension", "forgetting", "speculative")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", choices=STUDIES, help="which chapter's run")
    parser.add_argument("--size", choices=("full", "tiny"), default="full",
                        help="full: the run the chapter reads; tiny: seconds")
    parser.add_argument("--jobs", type=int, default=2,
                        help="jobs run at once, one process of one thread each (default 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="training seeds (default: the size's own)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="results file (default experiments/results/<study>-<device>[-tiny].json)")
    parser.add_argument("--quiet", action="store_true", help="no line per finished job")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    study = importlib.import_module(f"experiments.{args.study}")
    try:
        support.check_int("--jobs", args.jobs, minimum=1)
        settings = study.SIZES[args.size]
        if args.seeds is not None:
            settings = dataclasses.replace(settings, seeds=tuple(args.seeds))
    except (TypeError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    machine = support.machine_record(torch.device("cpu"), 1, args.size)
    machine["processes"] = min(args.jobs, study.job_count(settings))
    out = args.out or RESULTS_DIR / (f"{args.study}-{machine['device_slug']}"
                                     f"{'' if args.size == 'full' else '-' + args.size}.json")
    results = support.timed_run(machine, lambda: study.run_experiment(
        settings, jobs=args.jobs, progress=not args.quiet))
    support.write_results({"machine": machine, **results}, out)
    print(f"wrote {out} ({machine['wall_seconds']:.0f} s wall, "
          f"{machine['cpu_seconds']:.0f} s CPU, "
          f"{machine['processes']} process(es) of 1 thread)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
