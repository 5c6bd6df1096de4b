"""Command line: python -m benchmarks.ceilings [--quick] [--out PATH] [--threads N].

What a roofline and a claimed ratio need beyond the main run's two floors and its medians, saved as
benchmarks/results/ceilings-<device>[-quick].json, one file per machine:

- the arithmetic ceilings of each kind of work a decode step does (float32 products, int8 products,
  conversions, shifts, scales), and for each quantised step which of them binds;
- the read bandwidth across buffer sizes, and the largest buffer still read from cache;
- the split-KV step's time across chunk sizes;
- the ratios the chapter states, each timed in interleaved rounds, with a distribution-free interval,
  and every target judged by its interval (met, missed, or not decided);
- the GQA-8 step's two products in other shapes, the kernel MKL runs for each, and compiled
  ``flex_attention`` beside the step, to say what holds the float step back;
- the KIVI-style steps profiled with torch.profiler, at the pass size's length;
- the allocator's settings, each timed in a fresh process, in the order ABCD DCBA.

The main run (``python -m benchmarks``) measures the same ceilings (``measure_ceilings``) and judges
its decode rows against them.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
from longctx.support import measure
from longctx.support.measure import (
    ELEMENTWISE_KINDS,
    cache_sizes,
    effective_cache_bytes,
    elementwise_floor,
    int_matmul_floor,
    interleaved,
    last_level_cache_bytes,
    median_interval,
    ratio,
    read_bandwidth_sweep,
    sweep_sizes,
)
from longctx.support.runs import machine_record, time_call

from . import decode, prefill
from .common import Progress, finish_run, peak_extra_bytes, release_memory, resolve_device, set_allocator

# the ratios the chapter states: (design, against, T)
RATIO_PAIRS = (("gqa8", "gqa8-sdpa", 32768), ("gqa8", "gqa8-sdpa", 65536),
               ("int8", "gqa8", 32768), ("int8", "gqa8", 65536), ("int4", "gqa8", 32768), ("int4", "gqa8", 65536),
               ("gqa8", "mha", 32768), ("gqa8", "mha", 65536), ("kivi4", "gqa8", 4096), ("kivi4", "gqa8", 65536))
PREFILL_PAIRS = (("flash-prefill", "full-sdpa", 4096), ("flash-prefill", "full-sdpa", 8192))
PREFILL_AIM = 2.0  # flash_prefill within twice SDPA's time
MHA_BANDWIDTH_AIM = 1.0  # GQA-8's step reads its bytes at least as fast as MHA's
QUANTISED_STEPS = ("int8", "int4", "kivi4")
KIVI_PROFILED = ("kivi4", "kivi2")
ALLOCATOR_SETTINGS = ("default", "returned", "capped", "heap")
FULL = {"int_sizes": (256, 512, 1024), "ratio_pairs": RATIO_PAIRS, "rounds": 9,
        "target_tokens": decode.TARGET_TOKENS, "prefill_pairs": PREFILL_PAIRS, "shape_tokens": 65536,
        "chunks": (128, 256, 512, 1024, 2048, 4096, 8192), "chunk_tokens": (32768, 65536),
        "allocator_pairs": (("gqa8-materialised", 16384), ("int8", 32768), ("kivi4", 65536)),
        "kivi_tokens": 65536, "kivi_passes": (8, 16, 32, 64, 128), "min_run_time": 0.05}
QUICK = {"int_sizes": (64, 128), "ratio_pairs": (("int8", "gqa8", 2048), ("gqa8", "mha", 2048)), "rounds": 5,
         "target_tokens": (2048,), "prefill_pairs": (("flash-prefill", "full-sdpa", 512),), "shape_tokens": 2048,
         "chunks": (128, 512, 2048), "chunk_tokens": (2048,), "allocator_pairs": (("int8", 1024),),
         "kivi_tokens": 2048, "kivi_passes": (4, 16), "min_run_time": 0.02}


def measure_ceilings(*, device: torch.device, threads: int, quick: bool, progress, sizes=None) -> dict:
    """Return the arithmetic ceilings beside the float32 matmul floor: the square int8 product at its
    best size (of `sizes`), and the elementwise passes on a buffer held in the L2; 'rates' holds the
    kinds ``measure.arithmetic_seconds`` reads beside 'float', which is the floors' own matmul rate."""
    sizes = sizes or (QUICK if quick else FULL)["int_sizes"]
    tries = [int_matmul_floor(device=device, threads=threads, size=size, min_run_time=0.1 if quick else 0.3)
             for size in sizes]
    best = max(tries, key=lambda record: record["op_per_s"])
    best["sizes_tried"] = {str(t["size"]): t["op_per_s"] for t in tries}
    elementwise = elementwise_floor(device=device, threads=threads,
                                    cache_bytes=cache_sizes().get(2) if device.type == "cpu" else None)
    rates = {"int": best["op_per_s"], **{kind: elementwise[f"{kind}_per_s"] for kind in ELEMENTWISE_KINDS}}
    progress(f"ceilings: int8 products {best['op_per_s'] / 1e9:.1f} Gop/s (best of n = "
             f"{', '.join(map(str, sizes))}); " + ", ".join(
                 f"{kind} {elementwise[f'{kind}_per_s'] / 1e9:.1f} G/s" for kind in ELEMENTWISE_KINDS))
    return {"int_matmul": best, "elementwise": elementwise, "rates": rates}


def run_sweep(*, device: torch.device, threads: int, quick: bool, progress) -> dict:
    """Return the read-bandwidth sweep from 256 KiB to four times the reported LLC (256 MiB to 2 GiB;
    16 MiB in a quick run) and the largest buffer it still reads from cache."""
    reported = last_level_cache_bytes() if device.type == "cpu" else measure.device_cache_bytes(device)
    largest = 16 * 2**20 if quick else min(2**31, max(2**28, 4 * (reported or 0)))
    rows = read_bandwidth_sweep(device=device, threads=threads, sizes=sweep_sizes(largest))
    effective = effective_cache_bytes(rows)
    progress(f"sweep: {len(rows)} buffers to {largest / 2**20:.0f} MiB; read from cache up to "
             f"{effective / 2**20 if effective else 0:.1f} MiB (reported LLC {(reported or 0) / 2**20:.0f} MiB)")
    return {"rows": rows, "effective_cache_bytes": effective, "reported_llc_bytes": reported}


def _spread(values: list[float]) -> dict:
    """Median, its distribution-free interval and the interquartile range of a list of seconds."""
    middle, low, high, covered = median_interval(values)
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"seconds": middle, "low": low, "high": high, "coverage": covered,
            "iqr_seconds": quartiles[2] - quartiles[0], "rounds": values}


def run_chunks(token_counts, chunks, *, device, threads, rounds, min_run_time, progress) -> list[dict]:
    """Return the cold GQA-8 split-KV step at each chunk size, the sizes timed in interleaved rounds,
    with each one's time over the default chunk's (``decode.CHUNK``) per round."""
    rows = []
    for tokens in token_counts:
        steps = {chunk: decode.decode_case("gqa8", tokens, device=device, chunk=chunk).step for chunk in chunks}
        seconds = interleaved({str(c): s for c, s in steps.items()}, rounds=rounds, threads=threads,
                              min_run_time=min_run_time)
        base = str(decode.CHUNK) if decode.CHUNK in chunks else str(chunks[0])
        for chunk in chunks:
            against = ratio(seconds, str(chunk), base)
            rows.append({"tokens": tokens, "chunk": chunk, "chunks_per_head": -(-tokens // chunk),
                         "chunk_bytes": 2 * chunk * decode.HEAD_DIM * 4, **_spread(seconds[str(chunk)]),
                         "ratio_to": int(base), "ratio": against["ratio"], "ratio_low": against["low"],
                         "ratio_high": against["high"]})
        best = min((r for r in rows if r["tokens"] == tokens), key=lambda r: r["seconds"])
        progress(f"chunks T={tokens}: fastest {best['chunk']} ({best['ratio']:.2f} x chunk {base})")
        del steps
        release_memory(device)
    return rows


def chunk_spread(rows: list[dict]) -> dict[int, float]:
    """Return, for each T of a chunk sweep (``run_chunks``' rows), the slowest chunk's median per-round
    ratio to the default chunk over the fastest's."""
    lengths = sorted({row["tokens"] for row in rows})
    return {t: max(r["ratio"] for r in rows if r["tokens"] == t) / min(r["ratio"] for r in rows if r["tokens"] == t)
            for t in lengths}


def quantised_roofline(case: decode.DecodeCase, seconds: float, floors: dict, rates: dict) -> dict:
    """Return a quantised step's memory time and its arithmetic time three ways (every operation at the
    float matmul's rate; the design's least work at each kind's ceiling; this implementation's work at
    them), and which of memory or arithmetic binds at the separate ceilings."""
    rates = {**rates, "float": floors["flop_per_s"]}
    memory = case.cache_bytes / floors["bytes_per_s"]
    design = measure.arithmetic_seconds(case.work, rates)
    done = measure.arithmetic_seconds(case.implementation_work, rates)
    return {"memory_seconds": memory, "one_ceiling_seconds": case.operations / floors["flop_per_s"],
            "design_seconds": design, "implementation_seconds": done,
            "bound": "memory" if memory >= design else "arithmetic", "work": case.work,
            "implementation_work": case.implementation_work,
            "percent_of_roofline": 100 * max(memory, design) / seconds}


def run_ratios(pairs, *, device, threads, rounds, min_run_time, floors, rates, progress, also=()) -> dict:
    """Return every ratio of `pairs` from interleaved rounds of the designs at its length, each design's
    time with its interval and IQR, and for the quantised steps the roofline at the separate ceilings.
    `also` holds (design, T) steps timed in the same rounds for their own share of the roofline."""
    out = {"ratios": [], "steps": [], "quantised": []}
    for tokens in sorted({t for _, _, t in pairs} | {t for _, t in also}):
        designs = sorted({d for a, b, t in pairs if t == tokens for d in (a, b)}
                         | {d for d, t in also if t == tokens})
        cases = {d: decode.decode_case(d, tokens, device=device) for d in designs}
        seconds = interleaved({d: c.step for d, c in cases.items()}, rounds=rounds, threads=threads,
                              min_run_time=min_run_time)
        for design, case in cases.items():
            out["steps"].append({"design": design, "tokens": tokens, "cache_bytes": case.cache_bytes,
                                 "work": case.work, **_spread(seconds[design])})
            if design in QUANTISED_STEPS:
                out["quantised"].append({"design": design, "tokens": tokens, **quantised_roofline(
                    case, statistics.median(seconds[design]), floors, rates)})
        for top, bottom, t in pairs:
            if t == tokens:
                line = ratio(seconds, top, bottom)
                line.update(tokens=tokens, bytes_ratio=cases[top].cache_bytes / cases[bottom].cache_bytes)
                out["ratios"].append(line)
                progress(f"ratio {top}/{bottom} T={tokens}: {line['ratio']:.2f} "
                         f"[{line['low']:.2f}, {line['high']:.2f}]")
        del cases
        release_memory(device)
    return out


def run_prefill_ratios(pairs, *, device, threads, rounds, min_run_time, progress) -> list[dict]:
    """Return each prefill ratio of `pairs` ((design, against, n)) from interleaved rounds, warm, as the
    main run times prefill (its inputs are a few MiB)."""
    lines = []
    for tokens in sorted({t for _, _, t in pairs}):
        designs = sorted({d for a, b, t in pairs if t == tokens for d in (a, b)})
        seconds = interleaved({d: prefill.prefill_case(d, tokens, device=device) for d in designs},
                              rounds=rounds, threads=threads, min_run_time=min_run_time)
        for top, bottom, t in pairs:
            if t == tokens:
                line = {**ratio(seconds, top, bottom), "tokens": tokens}
                lines.append(line)
                progress(f"prefill {top}/{bottom} n={tokens}: {line['ratio']:.2f} "
                         f"[{line['low']:.2f}, {line['high']:.2f}]")
    return lines


def interval_verdict(low: float, high: float, goal: float, *, at_most: bool) -> str:
    """Return 'met' when the whole interval [low, high] is on the goal's side, 'missed' when the whole
    of it is on the other, and 'not decided' when it holds the goal."""
    inside, outside = (high <= goal, low > goal) if at_most else (low >= goal, high < goal)
    return "met" if inside else "missed" if outside else "not decided"


def interval_targets(ratios: dict, prefill_lines: list[dict], floors: dict, rates: dict,
                     token_counts=decode.TARGET_TOKENS) -> list[dict]:
    """Return one line per target and length, each value with its interval and its verdict.

    The targets of ``decode.target_report``, from interleaved rounds: every float design at
    ROOFLINE_TARGET % of its roofline or more (the share's interval is the roofline time over the
    step time's interval); GQA-8 no slower than SDPA; GQA-8 reading its bytes at least as fast as MHA
    (the bytes ratio over the time ratio); int8 and int4 within RATIO_AIMS of GQA-8; and
    ``flash_prefill`` within PREFILL_AIM of SDPA's prefill.
    """
    steps = {(s["design"], s["tokens"]): s for s in ratios["steps"]}
    pairs = {(r["of"], r["to"], r["tokens"]): r for r in ratios["ratios"]}
    lines = []

    def add(target, design, tokens, value, low, high, goal, at_most):
        lines.append({"target": target, "design": design, "tokens": tokens, "value": value, "low": low,
                      "high": high, "goal": goal, "at_most": at_most,
                      "verdict": interval_verdict(low, high, goal, at_most=at_most)})

    for tokens in token_counts:
        for design in decode.FLOAT_DESIGNS:
            step = steps.get((design, tokens))
            if step:
                roof = max(decode.roofline_seconds(step, floors, rates))
                add("roofline", design, tokens, 100 * roof / step["seconds"], 100 * roof / step["high"],
                    100 * roof / step["low"], decode.ROOFLINE_TARGET, False)
        line = pairs.get((decode.REFERENCE, "gqa8-sdpa", tokens))
        if line:
            add("sdpa", decode.REFERENCE, tokens, line["ratio"], line["low"], line["high"], decode.SDPA_AIM, True)
        line = pairs.get((decode.REFERENCE, "mha", tokens))
        if line:  # bandwidth ratio = bytes ratio / time ratio
            share = line["bytes_ratio"]
            add("mha-bandwidth", decode.REFERENCE, tokens, share / line["ratio"], share / line["high"],
                share / line["low"], MHA_BANDWIDTH_AIM, False)
        for cache, design in decode.QUANTISED.items():
            line = pairs.get((design, decode.REFERENCE, tokens))
            if line:
                add("ratio", design, tokens, line["ratio"], line["low"], line["high"], decode.RATIO_AIMS[cache],
                    True)
    for line in prefill_lines:
        add("prefill", line["of"], line["tokens"], line["ratio"], line["low"], line["high"], PREFILL_AIM, True)
    return lines


def run_kivi_passes(tokens: int, passes, *, device, threads, rounds, min_run_time, progress) -> list[dict]:
    """Return the cold KIVI-style 4-bit step at each groups_per_pass of `passes` (interleaved rounds),
    with the extra memory one step holds and each pass's float tiles (keys and values, every KV head)."""
    cases = {groups: decode.decode_case("kivi4", tokens, device=device, kivi_passes=groups) for groups in passes}
    seconds = interleaved({str(g): c.step for g, c in cases.items()}, rounds=rounds, threads=threads,
                          min_run_time=min_run_time)
    rows = [{"tokens": tokens, "groups_per_pass": groups, "cache_bytes": case.cache_bytes,
             "tile_bytes": 2 * decode.GQA_KV_HEADS * groups * decode.KIVI_GROUP * decode.HEAD_DIM * 4,
             "extra_bytes": peak_extra_bytes(case.step) if device.type == "cpu" else None,
             **_spread(seconds[str(groups)])} for groups, case in cases.items()]
    del cases
    release_memory(device)
    best = min(rows, key=lambda row: row["seconds"])
    progress(f"kivi4 passes T={tokens}: fastest {best['groups_per_pass']} groups a pass")
    return rows


SHAPE_FORMS = {  # the GQA-8 step's two products, each in the step's form and in others, on one cold cache
    "scores": "the step's scores: G rows @ keys^T, chunk by chunk",
    "scores-one-row": "one row @ keys^T, chunk by chunk (MHA's shape on the same bytes)",
    "scores-left": "keys @ rows^T, chunk by chunk (the cache as the left operand)",
    "scores-whole": "G rows @ keys^T over all T in one product a head",
    "scores-left-whole": "keys @ rows^T over all T in one product a head",
    "values": "the step's values: weights @ values, chunk by chunk",
    "values-left": "values^T @ weights^T, chunk by chunk (the cache as the left operand)",
    "values-whole": "weights @ values over all T in one product a head",
    "step": "the whole split-KV step (ch05.split_kv_decode)",
    "flex": "torch's flex_attention with enable_gqa, compiled by torch.compile",
}
SHAPE_BASES = {"scores-one-row": "scores", "scores-left": "scores", "scores-whole": "scores", "scores-left-whole": "scores",
               "values-left": "values", "values-whole": "values", "flex": "step"}


def shape_calls(tokens: int, *, device: torch.device, seed: int = 0) -> tuple[dict, dict]:
    """Return the zero-argument call of every SHAPE_FORMS form but 'flex' on cold copies of one GQA-8
    cache of `tokens` tokens, and the bytes each form must read (the operand from the cache)."""
    from longctx import ch05

    heads, width, chunk = decode.GQA_KV_HEADS, decode.HEAD_DIM, decode.CHUNK
    if tokens % chunk:
        raise ValueError(f"tokens (T) must be a multiple of the chunk {chunk} (got {tokens})")
    count = tokens // chunk
    generator = torch.Generator(device=device).manual_seed(seed)
    query = decode._randn(1, decode.QUERY_HEADS, 1, width, generator=generator, device=device)
    rows = ch05.stacked_rows(query, heads, None)  # (1, H_kv, G, d)
    group = rows.shape[2]
    weights = torch.rand(1, heads, count, group, chunk, generator=generator, device=device)
    whole = weights.transpose(2, 3).reshape(1, heads, group, count * chunk)  # (1, H_kv, G, T)
    key, value = (decode._randn(1, heads, count * chunk, width, generator=generator, device=device) for _ in "kv")
    caches = [(key, value)] + [(key.clone(), value.clone())
                               for _ in range(measure.cold_copies(key.nbytes + value.nbytes, True, device) - 1)]

    def chunked(t):
        return t.view(1, heads, count, chunk, width)

    forms = {
        "scores": lambda c: rows.unsqueeze(2) @ chunked(c[0]).transpose(-2, -1),
        "scores-one-row": lambda c: rows[:, :, :1].unsqueeze(2) @ chunked(c[0]).transpose(-2, -1),
        "scores-left": lambda c: chunked(c[0]) @ rows.unsqueeze(2).transpose(-2, -1),
        "scores-whole": lambda c: rows @ c[0].transpose(-2, -1),
        "scores-left-whole": lambda c: c[0] @ rows.transpose(-2, -1),
        "values": lambda c: weights @ chunked(c[1]),
        "values-left": lambda c: chunked(c[1]).transpose(-2, -1) @ weights.transpose(-2, -1),
        "values-whole": lambda c: whole @ c[1],
        "step": lambda c: ch05.split_kv_decode(query, *c, chunk=chunk),
    }
    calls = {name: decode._rotating(form, caches) for name, form in forms.items()}
    read = {name: key.nbytes if name.startswith("scores") else value.nbytes for name in forms}
    read["step"] = read["flex"] = key.nbytes + value.nbytes
    compiled, turn = [], itertools.cycle(caches)

    def flex() -> torch.Tensor:  # compiled at its first call
        if not compiled:
            from torch.nn.attention.flex_attention import flex_attention

            compiled.append(torch.compile(flex_attention, dynamic=False))
        return compiled[0](query, *next(turn), enable_gqa=True)

    calls["flex"] = flex
    return calls, read


def mkl_kernels(tokens: int, threads: int) -> dict:
    """Return, for each product form, the BLAS functions MKL reports running it (MKL_VERBOSE=1, in a fresh
    process, which is when MKL reads the variable); {} where torch's BLAS is not MKL."""
    if not torch.backends.mkl.is_available():
        return {}
    done = subprocess.run([sys.executable, "-m", "benchmarks.ceilings", "--kernels", str(tokens),
                           "--threads", str(threads)], capture_output=True, text=True, check=True,
                          cwd=pathlib.Path(__file__).resolve().parent.parent,
                          env={**os.environ, "MKL_VERBOSE": "1"})
    kernels, form = {}, None
    for line in done.stdout.splitlines():
        if line.startswith("== "):
            form = line[3:].strip()
            kernels[form] = []
        elif form and line.startswith("MKL_VERBOSE ") and "(" in line.split()[1]:
            function, arguments = line.split()[1].split("(", 1)
            call = f"{function}({','.join(arguments.split(',')[:2])})"  # the name and its two transposes
            if call not in kernels[form]:
                kernels[form].append(call)
    return kernels


def print_kernels(tokens: int) -> None:
    """Run every product form once, each after a marker line (for ``mkl_kernels``' MKL_VERBOSE capture)."""
    calls, _ = shape_calls(tokens, device=torch.device("cpu"))
    for name in SHAPE_FORMS:
        if name not in ("step", "flex"):
            print(f"== {name}", flush=True)
            calls[name]()
            sys.stdout.flush()


def run_shapes(tokens: int, *, device, threads, rounds, min_run_time, progress) -> dict:
    """Return every SHAPE_FORMS form timed cold in interleaved rounds at `tokens`, each with the rate it
    reads its operand at and its ratio to its base form; flex_attention's compile time and its
    difference from the step (or why it did not run); and on CPU the kernel MKL runs for each product."""
    calls, read = shape_calls(tokens, device=device)
    flex = {}
    try:
        began = time.perf_counter()
        flex_out = calls["flex"]()
        flex["compile_seconds"] = time.perf_counter() - began
        flex["max_abs_diff"] = float((flex_out - calls["step"]()).abs().max())  # same cache turn
    except Exception as error:  # an inductor without a compiler, or a torch without flex_attention
        flex["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        del calls["flex"]
    seconds = interleaved(calls, rounds=rounds, threads=threads, min_run_time=min_run_time)
    rows = []
    for name, values in seconds.items():
        row = {"form": name, "description": SHAPE_FORMS[name], "read_bytes": read[name], **_spread(values)}
        row["bytes_per_s"] = read[name] / row["seconds"]
        if name in SHAPE_BASES:
            line = ratio(seconds, name, SHAPE_BASES[name])
            row.update(ratio_to=SHAPE_BASES[name], ratio=line["ratio"], ratio_low=line["low"],
                       ratio_high=line["high"])
        rows.append(row)
        progress(f"shape {name} T={tokens}: {row['seconds'] * 1e3:.2f} ms, {row['bytes_per_s'] / 1e9:.1f} GB/s")
    del calls
    release_memory(device)
    kernels = mkl_kernels(tokens, threads) if device.type == "cpu" else {}
    return {"tokens": tokens, "rows": rows, "flex": flex, "kernels": kernels}


def apply_setting(setting: str) -> dict | None:
    """Set glibc's malloc as `setting` names: 'default' (untouched), 'returned' (128 KiB thresholds),
    'capped' (blocks up to 32 MiB kept), 'heap' (every block from a kept heap: M_MMAP_MAX = 0)."""
    if setting not in ALLOCATOR_SETTINGS:
        raise ValueError(f"setting must be one of {', '.join(ALLOCATOR_SETTINGS)} (got {setting!r})")
    if setting == "default":
        return {"allocator": "glibc malloc", "setting": "default"}
    record = set_allocator(setting != "returned", heap_only=setting == "heap")
    return record and {**record, "setting": setting}


def probe(setting: str, design: str, tokens: int, threads: int, min_run_time: float) -> dict:
    """Time one cold step with the allocator set before anything is allocated (run in a fresh process)."""
    allocator = apply_setting(setting)
    torch.set_num_threads(threads)
    case = decode.decode_case(design, tokens, device=torch.device("cpu"))
    timing = time_call(case.step, threads=threads, min_run_time=min_run_time)
    return {"setting": setting, "allocator": allocator, "seconds": timing["seconds"],
            "iqr_seconds": timing["iqr_seconds"]}


def run_allocator(pairs, *, threads, min_run_time, progress) -> list[dict]:
    """Return, for each (design, T), the cold step under every allocator setting, each timing made in
    its own fresh process (so that no setting inherits another's heap), in the order ABCD DCBA, and
    each setting's time the mean of its two. [] where malloc is not glibc's."""
    if set_allocator(True) is None:
        return []
    rows = []
    for design, tokens in pairs:
        times = {setting: [] for setting in ALLOCATOR_SETTINGS}
        for setting in ALLOCATOR_SETTINGS + ALLOCATOR_SETTINGS[::-1]:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.ceilings", "--probe", setting, design, str(tokens),
                 "--threads", str(threads), "--min-run-time", str(min_run_time)],
                capture_output=True, text=True, check=True, cwd=pathlib.Path(__file__).resolve().parent.parent)
            times[setting].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
        row = {"design": design, "tokens": tokens,
               **{f"{s}_seconds": sum(times[s]) / 2 for s in ALLOCATOR_SETTINGS},
               "each": times}
        rows.append(row)
        progress(f"allocator {design} T={tokens}: " + ", ".join(
            f"{s} {row[f'{s}_seconds'] * 1e3:.2f} ms" for s in ALLOCATOR_SETTINGS))
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ceilings", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"), help="where to run")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="results file")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--probe", nargs=3, metavar=("SETTING", "DESIGN", "T"), default=None,
                        help=argparse.SUPPRESS)  # one allocator timing, for run_allocator's fresh process
    parser.add_argument("--kernels", type=int, default=None, metavar="T",
                        help=argparse.SUPPRESS)  # the product forms once each, for mkl_kernels' capture
    parser.add_argument("--min-run-time", type=float, default=0.05, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None and args.threads < 1:
        print(f"error: --threads must be >= 1 (got {args.threads})", file=sys.stderr)
        return 2
    threads = args.threads or torch.get_num_threads()
    if args.probe:
        setting, design, tokens = args.probe
        print(json.dumps(probe(setting, design, int(tokens), threads, args.min_run_time)), flush=True)
        return 0
    if args.kernels:
        torch.set_num_threads(threads)
        print_kernels(args.kernels)
        return 0
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(threads)
    sizes = QUICK if args.quick else FULL
    progress, started = Progress(), time.monotonic()
    mode = "quick" if args.quick else "full"
    results = {"machine": machine_record(device, threads, mode), "sizes": sizes}
    results["machine"]["allocator"] = set_allocator(True, heap_only=True)
    floors = measure.measure_floors(device=device, threads=threads, quick=args.quick, progress=progress)
    results["ceilings"] = measure_ceilings(device=device, threads=threads, quick=args.quick, progress=progress)
    results["sweep"] = run_sweep(device=device, threads=threads, quick=args.quick, progress=progress)
    timing = {"device": device, "threads": threads, "rounds": sizes["rounds"], "min_run_time": sizes["min_run_time"],
              "progress": progress}
    also = [(design, tokens) for design in decode.FLOAT_DESIGNS for tokens in sizes["target_tokens"]]
    results["ratios"] = run_ratios(sizes["ratio_pairs"], floors=floors, rates=results["ceilings"]["rates"],
                                   also=also, **timing)
    results["prefill_ratios"] = run_prefill_ratios(sizes["prefill_pairs"], **timing)
    results["shapes"] = run_shapes(sizes["shape_tokens"], **timing)
    results["chunks"] = run_chunks(sizes["chunk_tokens"], sizes["chunks"], **timing)
    results["kivi_passes"] = run_kivi_passes(sizes["kivi_tokens"], sizes["kivi_passes"], **timing)
    results["kivi_profiles"] = [decode.profile_step(design, sizes["kivi_tokens"], device=device, threads=threads)
                                for design in KIVI_PROFILED]  # where a KIVI-style step's time goes
    progress(f"profiled {', '.join(KIVI_PROFILED)} at T={sizes['kivi_tokens']}")
    gc.collect()
    results["allocator"] = (run_allocator(sizes["allocator_pairs"], threads=threads,
                                          min_run_time=sizes["min_run_time"], progress=progress)
                            if device.type == "cpu" else [])
    results["floors"] = measure.best_floors(floors, measure.measure_floors(
        device=device, threads=threads, quick=args.quick, progress=progress))
    results["targets"] = interval_targets(results["ratios"], results["prefill_ratios"], results["floors"],
                                          results["ceilings"]["rates"], sizes["target_tokens"])
    finish_run(results, started=started, prefix="ceilings", mode=mode, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
