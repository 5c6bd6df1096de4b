"""Part ``kernel`` of ``python -m benchmarks.serving``: Chapter 13's C++ decode kernel against Chapter 10's steps.

At Chapter 10's GQA-8 shape (32 query heads over 8 KV heads of width 128, batch 1, float32) and
each length, six steps are timed cold in interleaved rounds: Chapter 10's float32 split-KV step
(``ch05.split_kv_decode``, chunks of 512, the reference), the kernel (``ch08.fused_decode``) on
a float32, an int8 and an int4 cache, and Chapter 10's integer route (``ch05.int8_decode``) on the
same int8 and int4 caches. Each step rotates through distinct copies of its cache that together
fill ``COLD_FACTOR`` times the last-level cache, as Chapter 10's decode benchmark does.

Where a target is missed the part says where the kernel's time goes, cache kind by cache kind
at the longest lengths: the C++ chunk states alone (cold), Chapter 10's merge of them, and the
kernel warm, on a cache short enough to stay in the CPU's caches, whose time per token is what
the arithmetic alone costs. The read and matmul floors are the runner's (``results["floors"]``);
the chapter turns bytes and operations into shares of them.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch
from longctx import ch05, ch08
from longctx.support import time_call
from longctx.support.measure import COLD_FACTOR, attention_flops, cold_copies, interleaved, ratio

from . import decode

FULL = {"tokens": [4096, 16384, 32768, 65536], "rounds": 7, "min_run_time": 0.05, "chunk": 512,
        "breakdown_tokens": [32768, 65536], "warm_tokens": 1024, "seed": 0}
QUICK = {"tokens": [1024, 4096], "rounds": 3, "min_run_time": 0.01, "chunk": 512,
         "breakdown_tokens": [4096], "warm_tokens": 512, "seed": 0}

QUERY_HEADS, KV_HEADS, HEAD_DIM = decode.QUERY_HEADS, decode.GQA_KV_HEADS, decode.HEAD_DIM
REFERENCE = "chapter5-float32"
STEPS = ("chapter5-float32", "kernel-float32", "kernel-int8", "kernel-int4", "chapter5-int8",
         "chapter5-int4")
CACHE_OF = {"chapter5-float32": "float32", "kernel-float32": "float32", "kernel-int8": "int8",
            "kernel-int4": "int4", "chapter5-int8": "int8", "chapter5-int4": "int4"}
RATIOS = (("kernel-float32", REFERENCE), ("kernel-int8", REFERENCE), ("kernel-int4", REFERENCE),
          ("chapter5-int8", REFERENCE), ("chapter5-int4", REFERENCE),
          ("kernel-int8", "chapter5-int8"), ("kernel-int4", "chapter5-int4"))
RATIO_AIMS = {"kernel-int8": 0.5, "kernel-int4": 0.35}  # of the reference step's time
ROOFLINE_TARGET = 75.0  # percent of the read floor the kernel's float32 step should reach
TARGET_TOKENS = (32768, 65536)
CONVERSIONS = {"float32": 0, "int8": 1, "int4": 2}  # operations per cached code: convert (and shift)


def check_settings(settings: dict) -> dict:
    """Return the settings if every field is present and sensible; raise ValueError otherwise."""
    for name in ("tokens", "breakdown_tokens"):
        if not settings.get(name) or any(not isinstance(t, int) or t < 1 for t in settings[name]):
            raise ValueError(f"{name} must be a non-empty list of integers >= 1 (got {settings.get(name)!r})")
    for name in ("rounds", "chunk", "warm_tokens"):
        if not isinstance(settings.get(name), int) or settings[name] < 1:
            raise ValueError(f"{name} must be an integer >= 1 (got {settings.get(name)!r})")
    if not settings.get("min_run_time", 0) > 0:
        raise ValueError(f"min_run_time must be > 0 (got {settings.get('min_run_time')!r})")
    return settings


def caches(tokens: int, seed: int, *, cold: bool = True) -> tuple[torch.Tensor, dict[str, list]]:
    """Return the query and, per cache kind, the copies of a GQA-8 cache of ``tokens`` to rotate through.

    Every kind gets enough distinct copies to fill COLD_FACTOR x the LLC (one copy if not
    ``cold``). The int8 and int4 caches are quantised from the float32 one.
    """
    generator = torch.Generator().manual_seed(seed)
    query = decode._randn(1, QUERY_HEADS, 1, HEAD_DIM, generator=generator, device=torch.device("cpu"))
    key, value = (decode._randn(1, KV_HEADS, tokens, HEAD_DIM, generator=generator, device=torch.device("cpu"))
                  for _ in "kv")
    first = {"float32": (key, value), "int8": tuple(ch05.quantize_cache(t, 8) for t in (key, value)),
             "int4": tuple(ch05.quantize_cache(t, 4) for t in (key, value))}
    copies = {}
    for kind, cache in first.items():
        count = cold_copies(cache_bytes(cache), cold)
        copies[kind] = [cache] + [decode._clone(cache) for _ in range(count - 1)]
    return query, copies


def cache_bytes(cache: tuple) -> int:
    """Return the bytes a (key, value) cache holds: floats, or codes and scales."""
    return sum(part.nbytes for part in cache)


def steps(query: torch.Tensor, copies: dict[str, list], chunk: int) -> dict:
    """Return each step of STEPS as a zero-argument call that takes the next copy of its cache."""
    makers = {"chapter5-float32": lambda k, v: ch05.split_kv_decode(query, k, v, chunk=decode.CHUNK),
              "kernel-float32": lambda k, v: ch08.fused_decode(query, k, v, chunk=chunk),
              "kernel-int8": lambda k, v: ch08.fused_decode(query, k, v, chunk=chunk),
              "kernel-int4": lambda k, v: ch08.fused_decode(query, k, v, chunk=chunk),
              "chapter5-int8": lambda k, v: ch05.int8_decode(query, k, v),
              "chapter5-int4": lambda k, v: ch05.int8_decode(query, k, v)}
    return {name: decode._rotating(lambda pair, make=makers[name]: make(*pair), copies[CACHE_OF[name]])
            for name in STEPS}


def work(kind: str, tokens: int) -> dict:
    """Return what one step on a ``kind`` cache must read and do: bytes, FLOPs and all operations.

    FLOPs are the multiply-adds (x 2) of the scores and the mix, one per cached number per query
    row reading it; a quantised step also converts every code (and at 4 bits shifts it out of its
    byte), and multiplies each score and each weight by a scale.
    """
    elements = 2 * KV_HEADS * tokens * HEAD_DIM
    floats = 4 * elements
    size = {"float32": floats, "int8": floats // 4, "int4": floats // 8}[kind]
    size += 0 if kind == "float32" else 2 * KV_HEADS * tokens * 4  # one float32 scale a row
    flops = attention_flops(QUERY_HEADS, tokens, HEAD_DIM)
    scaling = 0 if kind == "float32" else 2 * QUERY_HEADS * tokens
    return {"bytes": size, "flops": flops, "operations": flops + CONVERSIONS[kind] * elements + scaling}


def measure_length(tokens: int, settings: dict, threads: int) -> dict:
    """Return the interleaved timings of every step at T = ``tokens``, with their ratios.

    At the lengths of ``settings["breakdown_tokens"]`` the record also holds, per cache kind,
    where the kernel's time goes (``breakdown``).
    """
    query, copies = caches(tokens, settings["seed"])
    seconds = interleaved(steps(query, copies, settings["chunk"]), rounds=settings["rounds"], threads=threads,
                          min_run_time=settings["min_run_time"])
    record = {"tokens": tokens, "steps": {}, "ratios": [ratio(seconds, top, bottom) for top, bottom in RATIOS]}
    for name in STEPS:
        kind = CACHE_OF[name]
        assert cache_bytes(copies[kind][0]) == work(kind, tokens)["bytes"]
        middle = statistics.median(seconds[name])
        record["steps"][name] = {"cache": kind, "seconds": middle, "round_seconds": seconds[name],
                                 "copies": len(copies[kind]), **work(kind, tokens),
                                 "bytes_per_s": work(kind, tokens)["bytes"] / middle}
    if tokens in settings["breakdown_tokens"]:
        record["breakdown"] = breakdown(query, copies, settings, threads)
    return record


def breakdown(query: torch.Tensor, copies: dict[str, list], settings: dict, threads: int) -> list[dict]:
    """Return, per cache kind, where the kernel's step spends its time.

    ``states_seconds``: the C++ chunk states alone, cold; ``merge_seconds``: ch05.merge_states and
    finish_online_softmax on those states. ``warm_seconds``: the chunk states re-reading a single
    cache of ``warm_tokens`` (8 MiB in float32 at 1024 tokens, a quarter of a 32 MiB LLC), which
    the CPU's caches hold, and ``arithmetic_seconds`` that time scaled to T: what the C++ costs when
    it has no memory to wait for.
    """
    chunk, tokens, warm_tokens = settings["chunk"], copies["float32"][0][0].shape[2], settings["warm_tokens"]
    warm_query, warm = caches(warm_tokens, settings["seed"], cold=False)
    rows, warm_rows = (ch05.stacked_rows(q, KV_HEADS, None) for q in (query, warm_query))
    lines = []
    for kind in ("float32", "int8", "int4"):
        done = ch08.kernel_chunk_states(rows, *copies[kind][0], chunk)
        calls = {"states": decode._rotating(lambda pair: ch08.kernel_chunk_states(rows, *pair, chunk), copies[kind]),
                 "merge": lambda done=done: ch05.finish_online_softmax(ch05.merge_states(done, dim=2)),
                 "warm": lambda cache=warm[kind][0]: ch08.kernel_chunk_states(warm_rows, *cache, chunk)}
        timed = {name: time_call(call, threads=threads, min_run_time=settings["min_run_time"])["seconds"]
                 for name, call in calls.items()}
        lines.append({"cache": kind, "tokens": tokens, "states_seconds": timed["states"],
                      "merge_seconds": timed["merge"], "warm_tokens": warm_tokens, "warm_seconds": timed["warm"],
                      "arithmetic_seconds": timed["warm"] * tokens / warm_tokens,
                      "warm_bytes": cache_bytes(warm[kind][0]), **work(kind, tokens)})
    return lines


def agreement(tokens: int = 1000, chunk: int = 96, seed: int = 1) -> dict[str, float]:
    """Return the kernel's largest difference from Chapter 10's steps at the GQA-8 shape, per cache kind.

    float32 against ch05.split_kv_decode; int8 and int4 against ch05.decode_reference on the codes
    (dequantise, then attend), and, for scale, ch05.int8_decode's own difference from that reference.
    T = 1000 is no multiple of the chunk, so the last chunk is a short one.
    """
    query, copies = caches(tokens, seed, cold=False)
    (floats,) = copies["float32"]
    gaps = {"float32": float((ch08.fused_decode(query, *floats, chunk=chunk)
                              - ch05.split_kv_decode(query, *floats, chunk=chunk)).abs().max())}
    for kind in ("int8", "int4"):
        (cache,) = copies[kind]
        exact = ch05.decode_reference(query, *cache)
        gaps[kind] = float((ch08.fused_decode(query, *cache, chunk=chunk) - exact).abs().max())
        gaps[f"chapter5-{kind}"] = float((ch05.int8_decode(query, *cache) - exact).abs().max())
    gaps["largest_output"] = float(ch05.split_kv_decode(query, *floats).abs().max())
    return gaps


def target_lines(records: list[dict]) -> list[dict]:
    """Return one line per ratio target and length: the ratio with its interval, the aim, met or not."""
    lines = []
    for record in records:
        if record["tokens"] not in TARGET_TOKENS:
            continue
        for line in record["ratios"]:
            aim = RATIO_AIMS.get(line["of"]) if line["to"] == REFERENCE else None
            if aim is not None:
                lines.append({"step": line["of"], "tokens": record["tokens"], "ratio": line["ratio"],
                              "low": line["low"], "high": line["high"], "aim": aim,
                              "met": line["ratio"] <= aim})
    return lines


def run(settings: dict, *, threads: int, progress) -> dict:
    """Return the part's results: the build, the timings per length, the targets and the breakdowns."""
    check_settings(settings)
    started = time.perf_counter()
    kernel = ch08.load_kernel()  # built here if torch's extensions folder lacks it
    load_seconds = time.perf_counter() - started
    if kernel.module is None:
        raise RuntimeError(f"the kernel part needs the C++ kernel: {kernel.reason}")
    gaps = agreement()
    progress("kernel against Chapter 10: " + ", ".join(f"{name} {gap:.1e}" for name, gap in gaps.items()))
    records = []
    for tokens in settings["tokens"]:
        records.append(measure_length(tokens, settings, threads))
        steps_text = ", ".join(f"{name} {row['seconds'] * 1e3:.2f}" for name, row in records[-1]["steps"].items())
        progress(f"kernel T={tokens}: {steps_text} ms")
        gc.collect()
    targets = target_lines(records)
    missed = [line for line in targets if not line["met"]]
    progress(f"kernel targets: {len(targets) - len(missed)} of {len(targets)} ratio targets met")
    return {"shape": {"query_heads": QUERY_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "batch": 1},
            "flags": list(ch08.KERNEL_FLAGS), "chunk": settings["chunk"], "reference": REFERENCE,
            "ratio_aims": RATIO_AIMS, "roofline_target": ROOFLINE_TARGET, "target_tokens": list(TARGET_TOKENS),
            "cold_factor": COLD_FACTOR, "lengths": records, "targets": targets, "threads": threads, "agreement": gaps,
            "load_seconds": load_seconds}
