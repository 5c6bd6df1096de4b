"""Chapter 6's selective-copying comparison over several seeds: python -m experiments copying.

Trains every mixing layer of ``longctx.ch04.COPYING_MIXERS`` once per seed with
``longctx.ch04.copying_trial`` (the run the chapter makes live for seed 0) and records the
accuracies, parameter counts and CPU seconds. The command line is experiments/__main__.py's,
shared by the studies; the results go to ``experiments/results/copying-<device>.json``, and
Chapter 6 reads the newest full run. Trials run ``--jobs`` at a time (default 2), each on one
torch thread; a trial's numbers do not depend on how many run beside it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from longctx import ch04, support


@dataclass(frozen=True)
class CopyingSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    Every mixer is trained for ``steps`` steps once per seed of ``seeds``.

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 800

    def __post_init__(self) -> None:
        seeds = support.check_type("seeds", self.seeds, (tuple, list))
        if not seeds:
            raise ValueError("seeds must not be empty")
        object.__setattr__(self, "seeds", tuple(seeds))
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        support.check_int("steps", self.steps, minimum=1)


#: Toy sizes for the tests and ``--size tiny``: every step of the full run, in seconds.
TINY = CopyingSettings(seeds=(0, 1), steps=2)
SIZES = {"full": CopyingSettings(), "tiny": TINY}


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


def job_count(settings: CopyingSettings) -> int:
    """The trials a run makes: one per seed and mixer."""
    return len(settings.seeds) * len(ch04.COPYING_MIXERS)


def run_experiment(settings: CopyingSettings, *, jobs: int = 2, progress: bool = True) -> dict:
    """Run every mixer once per seed of ``settings``, ``jobs`` trials at a time.

    Raises:
        TypeError, ValueError: If ``settings`` is not a CopyingSettings or ``jobs`` < 1.
    """
    support.check_type("settings", settings, CopyingSettings)
    jobs = support.check_int("jobs", jobs, minimum=1)
    support.check_bool("progress", progress)
    work = [(mixer, seed, settings.steps) for seed in settings.seeds
            for mixer in ch04.COPYING_MIXERS]
    with ProcessPoolExecutor(min(jobs, len(work))) as pool:
        trials = []
        for trial in pool.map(_trial, work):
            if progress:
                print(f"  seed {trial['seed']} {trial['mixer']:>18}: accuracy "
                      f"{trial['accuracy']:.3f} ({trial['cpu_seconds']:.1f} s CPU)",
                      file=sys.stderr, flush=True)
            trials.append(trial)
    return {"settings": dataclasses.asdict(settings), "task": ch04.COPYING_TASK,
            "steps": settings.steps, "trials": trials}
