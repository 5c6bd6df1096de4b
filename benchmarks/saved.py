"""The chapter's side of the results files: find the newest complete run and load it."""

from __future__ import annotations

import json
import pathlib

from . import decode

PARTS = ("floors", "allocator", "warm_cold", "decode", "targets", "prefill", "scan", "memory", "ring")


def is_complete(run: dict) -> bool:
    """Return whether a results file holds every part the chapter reads, every decode design judged."""
    return (all(run.get(part) for part in PARTS) and "profiles" in run
            and len(run["floors"].get("measured", [])) == 2
            and {r["design"] for r in run["decode"]} == set(decode.DESIGNS)
            and all(r.get("percent_of_roofline") for r in run["decode"]))


def load_saved_results(folder: pathlib.Path) -> tuple[dict, pathlib.Path]:
    """Return the newest complete full run in `folder` and its path (the newest quick run where there is none).

    Raises:
        FileNotFoundError: if no file in `folder` is a complete run.
    """
    runs = [(json.loads(path.read_text()), path) for path in sorted(pathlib.Path(folder).glob("*.json"))]
    runs = [(run, path) for run, path in runs if is_complete(run)]
    if not runs:
        raise FileNotFoundError(f"no complete results in {folder}; run `make bench-quick` first")
    full = [run for run in runs if run[0]["machine"]["mode"] == "full"]
    return max(full or runs, key=lambda run: run[0]["machine"]["date"])
