# Generated from chapters/ch09-choosing.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch09-choosing.qmd ("Choosing a cache from a config, a length and a budget")."""

import bisect
import math
from dataclasses import replace
from typing import NamedTuple

from longctx import ch03, support

# chapters/ch09-choosing.qmd:88
#: Each served design's name in ch05's decode rows and in ch07's
#: policies: the menu. An evicting cache reads the float cache's step over
#: the entries it keeps.
EVIDENCE = {"full": ("gqa8", "full"), "int8": ("int8", "int8"),
            "int4": ("int4", "int4"), "kivi2": ("kivi2", "kivi2"),
            "streaming": ("gqa8", "streaming"), "snapkv": ("gqa8", "snapkv")}
#: The caches a served model can switch to without training again.
SERVED_DESIGNS = tuple(EVIDENCE)
#: Bytes a number in ch05's timed float cache (float32).
TIMED_FLOAT_BYTES = 4


def _rows(decode: dict, design: str) -> list[tuple[int, dict]]:
    """``ch05``'s decode rows of one design, by length."""
    rows = sorted((row["tokens"], row) for row in decode["decode"]
                  if row["design"] == design)
    if not rows:
        raise ValueError(f"the decode run has no rows for {design!r}")
    return rows


def evicts(menu: dict[str, tuple[str, str]], design: str) -> bool:
    """Return True for a design that drops entries, False if it keeps them.

    A dropping design reads the float cache's step over what it keeps; the
    others store every entry, some in fewer bits.
    """
    timed, policy = menu[design]
    return timed == "gqa8" and policy != "full"


def byte_shares(decode: dict, bytes_per_scalar: int,
                menu: dict[str, tuple[str, str]] | None = None
                ) -> dict[str, float]:
    """Return each design's cache bytes over a full cache's.

    ``ch05``'s saved ``decode`` rows at the longest length both were
    measured at, against a full cache of ``bytes_per_scalar`` bytes a
    number: ``ch05``'s float cache holds ``TIMED_FLOAT_BYTES``. ``menu``
    defaults to ``EVIDENCE``. An evicting design's share is set by its
    budget, not here: 1.
    """
    decode = support.check_type("decode", decode, dict)
    bytes_per_scalar = support.check_int("bytes_per_scalar",
                                         bytes_per_scalar, minimum=1)
    menu = EVIDENCE if menu is None else support.check_type("menu", menu,
                                                            dict)
    shares = {}
    for design, (timed, _) in menu.items():
        own, full = dict(_rows(decode, timed)), dict(_rows(decode, "gqa8"))
        longest = max(set(own) & set(full))
        measured = own[longest]["cache_bytes"] / full[longest]["cache_bytes"]
        shares[design] = measured * TIMED_FLOAT_BYTES / bytes_per_scalar
    return {d: 1.0 if menu[d][0] == "gqa8" else share
            for d, share in shares.items()}


def step_seconds(decode: dict, design: str, tokens: int) -> float:
    """Return one decode step's seconds for a ``ch05`` design at ``tokens``.

    Straight lines on log-log axes between the measured lengths; below the
    shortest and past the longest, the nearest segment's line continued.
    """
    rows = _rows(decode, design)
    lengths = [n for n, _ in rows]
    logs = [math.log(row["seconds"]) for _, row in rows]
    if len(rows) == 1:
        return rows[0][1]["seconds"]
    at = min(max(bisect.bisect(lengths, tokens), 1), len(rows) - 1)
    slope = (logs[at] - logs[at - 1]) / math.log(lengths[at]
                                                 / lengths[at - 1])
    return math.exp(logs[at - 1] + slope * math.log(tokens
                                                    / lengths[at - 1]))


def found_shares(forgetting: dict, task: str = "single"
                 ) -> dict[tuple[str, float | None], float]:
    """Return the share of asked records found, by (policy, budget).

    ``ch07``'s saved run, the trials of ``task`` pooled over the seeds
    that passed its skill gate (every seed, in a run without one); the
    budget is None for the full and the quantized caches.
    """
    hits: dict[tuple[str, float | None], list[int]] = {}
    for run in (r for r in forgetting["runs"] if r.get("passed", True)):
        for entry in run["entries"]:
            if task not in entry:
                raise ValueError(f"task {task!r} is not a task of the run")
            bits = [int(b) for b in entry[task]]
            hits.setdefault((entry["policy"], entry["budget"]), []).extend(
                bits)
    return {key: sum(found) / len(found) for key, found in hits.items()}


#: The served designs ch08's C++ kernel reads, by their names in its run.
KERNEL_STEPS = {"full": "kernel-float32", "int8": "kernel-int8",
                "int4": "kernel-int4"}


def kernel_step_shares(serving: dict) -> dict[tuple[str, int], float]:
    """Return ``ch08``'s kernel steps over the full cache's, by design, length.

    The median of the interleaved rounds' ratios in the saved run's kernel
    part, each kernel step against ``ch05``'s float32 GQA-8 split-KV step
    on the same cache, the step this chapter's ``gqa8`` rows time.
    """
    serving = support.check_type("serving", serving, dict)
    kernel = serving["kernel"]
    if kernel["reference"] != "chapter5-float32":
        raise ValueError(f"the kernel run compares with "
                         f"{kernel['reference']!r}, not ch05's float32 "
                         "split-KV step (chapter5-float32)")
    wanted = {name: design for design, name in KERNEL_STEPS.items()}
    return {(wanted[line["of"]], record["tokens"]): line["ratio"]
            for record in kernel["lengths"] for line in record["ratios"]
            if line["of"] in wanted and line["to"] == kernel["reference"]}


# chapters/ch09-choosing.qmd:319
class Option(NamedTuple):
    """One served cache for one request, as ``served_options`` ranks them.

    Attributes:
        design: A name of the menu (``SERVED_DESIGNS`` by default).
        cache_bytes: Its bytes for the request, batch included.
        fits: True when ``cache_bytes`` is within the memory given.
        kept: Entries it keeps per sequence (every token, unless it evicts).
        step: Its decode step over the full cache's (``ch05``'s steps).
        found: ``ch07``'s share of asked records found with it, at the
            largest measured budget it keeps (None: it keeps less than
            any budget measured).
    """

    design: str
    cache_bytes: int
    fits: bool
    kept: int
    step: float
    found: float | None


def served_options(config: ch03.KVConfig, tokens: int, memory: int, *,
                   decode: dict, forgetting: dict, batch: int = 1,
                   tolerance: float = 0.05, task: str = "single",
                   menu: dict[str, tuple[str, str]] | None = None
                   ) -> list[Option]:
    """Return the designs of ``menu`` for one request, best first.

    The procedure of Section 15.2: each design's bytes for ``tokens`` per
    sequence and ``batch`` sequences of ``config``; those within ``memory``
    bytes first, in groups whose records-found share is within
    ``tolerance`` of the group's best, each group by its step; those
    without evidence next; those that do not fit last, smallest first.
    ``decode`` and ``forgetting`` are the benchmark and ch07 saved runs;
    ``task`` is the ``ch07`` task whose records found rank the designs;
    ``menu`` maps each design to its names in the two runs (default
    ``EVIDENCE``). An evicting design that would keep every entry is the
    full cache and is left out; a windowed config's steps are read at the
    entries a layer holds on average.

    Raises:
        TypeError, ValueError: For a config that is not a KVConfig, runs
            that are not dicts, a count below 1, a negative memory or a
            tolerance outside 0..1.
    """
    config = support.check_type("config", config, ch03.KVConfig)
    decode = support.check_type("decode", decode, dict)
    forgetting = support.check_type("forgetting", forgetting, dict)
    tokens = support.check_int("tokens", tokens, minimum=1)
    memory = support.check_int("memory", memory, minimum=0)
    batch = support.check_int("batch", batch, minimum=1)
    tolerance = support.check_number("tolerance", tolerance, minimum=0,
                                     maximum=1)
    menu = EVIDENCE if menu is None else support.check_type("menu", menu,
                                                            dict)
    task = support.check_type("task", task, str)
    full_bytes = ch03.kv_bytes(config, tokens, batch)
    per_token = ch03.kv_bytes(replace(config, window=None,
                                      windowed_layers=0), 1)

    def read(kept: int) -> float:  # entries a layer reads, on average
        return ch03.kv_bytes(config, kept) / per_token

    shares = byte_shares(decode, config.bytes_per_scalar, menu)
    found = found_shares(forgetting, task)
    budgets = sorted(b for b in forgetting["budgets"] if b < 1)
    fit = ch03.tokens_that_fit(config, memory, batch)
    options = []
    for design, (timed, policy) in menu.items():
        if evicts(menu, design):  # as many entries as fit
            kept = tokens if fit is None else max(1, min(tokens, fit))
            if kept == tokens:
                continue  # it would keep every entry: the full cache
            size = ch03.kv_bytes(config, kept, batch)
            measured = [b for b in budgets if b <= kept / tokens]
            hit = found[(policy, measured[-1])] if measured else None
        else:  # every entry, in the design's own bytes
            kept, size = tokens, math.ceil(shares[design] * full_bytes)
            hit = found[(policy, None)]
        step = (step_seconds(decode, timed, read(kept))
                / step_seconds(decode, "gqa8", read(tokens)))
        options.append(Option(design, size, size <= memory, kept, step, hit))
    ranked, left = [], [o for o in options if o.fits and o.found is not None]
    while left:  # the best group first, each group fastest first
        best = max(o.found for o in left)
        group = [o for o in left if o.found >= best - tolerance]
        ranked += sorted(group, key=lambda o: o.step)
        left = [o for o in left if o not in group]
    ranked += sorted((o for o in options if o.fits and o.found is None),
                     key=lambda o: o.step)
    return ranked + sorted((o for o in options if not o.fits),
                           key=lambda o: o.cache_bytes)
