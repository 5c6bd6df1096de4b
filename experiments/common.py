"""What the studies share: the text they train and score on, and the form of a hit record."""

from __future__ import annotations

import multiprocessing
import pathlib
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import torch
from longctx import ch02, ch06

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 2's split of the novel (90 % to train), each part without key symbols."""
    ids = torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()))
    split = int(0.9 * ids.numel())
    return ch06.key_free_text(ids[:split]), ch06.key_free_text(ids[split:])


def bits(hits: torch.Tensor) -> str:
    """A grid of hits (depths, trials) as one string of 0 and 1, depth after depth."""
    return "".join("1" if h else "0" for h in hits.flatten().tolist())


def run_seeds(job: Callable, settings, *, jobs: int, progress: bool) -> list[dict]:
    """Return ``job(settings, seed)`` for every seed of ``settings``, ``jobs`` fresh processes at a time.

    Each job runs in a spawned interpreter (no threads inherited from this one) and its record,
    which holds its ``seconds``, is printed as it finishes when ``progress`` is set.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(settings.seeds)), mp_context=context) as pool:
        futures = [pool.submit(job, settings, seed) for seed in settings.seeds]
        runs = []
        for seed, future in zip(settings.seeds, futures, strict=True):
            runs.append(future.result())
            if progress:
                print(f"  seed {seed}: {runs[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
    return runs
