"""One decode step of one Llama-3-8B-shaped attention layer against a cache of T tokens, per design.

The designs are Chapter 10's steps: split-KV (Flash-Decoding) on every float cache of Chapters 4
and 5, the integer dot-product route on the per-vector int8 and int4 caches, and the KIVI-style
cache's own step. The baselines take the same step another way: torch's fused SDPA kernel, the
sequential tile walk, a materialised repeat, Chapter 4's dense teaching code, a latent cache
rebuilt every step, an int8 cache dequantised tile by tile.

Every timed call reads a cache that is not in the last-level cache: each measurement builds
enough distinct copies of its cache to fill at least COLD_FACTOR times the LLC (read from the
machine) and each call takes the next copy, so the time is that of streaming the cache from DRAM.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from longctx import ch03, ch05
from longctx.support import time_call
from longctx.support.measure import arithmetic_seconds, attention_flops, cold_copies, last_level_cache_bytes

from . import fast
from .common import peak_extra_bytes, set_allocator

QUERY_HEADS = 32
HEAD_DIM = 128
D_MODEL = QUERY_HEADS * HEAD_DIM
GQA_KV_HEADS = 8
LATENT_RANK = 512
WINDOW = 4096
CHUNK = 512  # split-KV chunk: 128 chunks a head at 64K, a multiple of any thread count up to 128
TILE = 4096  # the sequential walk's tile
KIVI_GROUP, KIVI_RESIDUAL = 32, 32  # KIVI's key group G_t and full-precision residual R
KIVI_PASSES = 32  # groups a KIVI-style pass converts: KiviCache.attend's default

FLASH_DESIGNS = ("mha", "gqa8", "mqa", "window-4k", "latent-absorbed", "int8", "int4", "kivi8", "kivi4",
                 "kivi2")
BASELINES = ("gqa8-sdpa", "gqa8-tiled", "gqa8-materialised", "gqa8-dense-teaching", "latent-expanded",
             "int8-tiled")
DESIGNS = FLASH_DESIGNS + BASELINES
FLOAT_DESIGNS = ("mha", "gqa8", "mqa", "window-4k", "latent-absorbed")  # held to the roofline
QUANTISED = {"int8": "int8", "int4": "int4"}  # the caches held to a ratio of the float32 GQA-8 step
REFERENCE = "gqa8"  # the float32 GQA-8 split-KV step
TARGET_TOKENS = (32768, 65536)
ROOFLINE_TARGET = 60.0  # percent of the roofline every float design should reach
RATIO_AIMS = {"int8": 0.5, "int4": 0.35}  # a quantised step's time over the float32 GQA-8 step's
SDPA_AIM = 1.0  # split-KV GQA-8 no slower than torch SDPA on the same cache

DESIGN_NOTES = {
    "mha": f"32 KV heads; ch05.split_kv_decode, chunks of {CHUNK}",
    "gqa8": f"8 KV heads, 4 query heads stacked per KV head; ch05.split_kv_decode, chunks of {CHUNK}",
    "mqa": f"1 KV head shared by 32 query heads; ch05.split_kv_decode, chunks of {CHUNK}",
    "window-4k": f"GQA-8 rolling buffer of the last {WINDOW} tokens; ch05.split_kv_decode",
    "latent-absorbed": f"latent cache of rank {LATENT_RANK}, up-projections absorbed; ch05.latent_decode",
    "int8": "GQA-8 cache in int8, one float32 scale per vector; ch05.int8_decode (torch._int_mm, head by head, "
            "in tiles)",
    "int4": "GQA-8 cache in int4 (two codes a byte), one scale per vector; ch05.int8_decode on the packed bytes, "
            "shifted tile by tile",
    "kivi8": (f"KIVI-style int8 cache: keys per channel in groups of {KIVI_GROUP}, values per token, "
              f"last {KIVI_RESIDUAL}+ tokens in float32; ch05.KiviCache.attend"),
    "kivi4": "the same KIVI-style cache at 4 bits; ch05.KiviCache.attend",
    "kivi2": "the same KIVI-style cache at 2 bits (KIVI's own), four codes a byte; ch05.KiviCache.attend",
    "gqa8-sdpa": "the gqa8 cache; torch's fused SDPA kernel, a group's 4 query heads stacked as rows",
    "gqa8-tiled": f"the gqa8 cache; ch05.tiled_decode, one tile of {TILE} after another",
    "gqa8-materialised": "the gqa8 cache repeated to 32 heads with ch03.repeat_kv, then torch SDPA",
    "gqa8-dense-teaching": "the gqa8 cache; ch05.decode_reference (ch03.grouped_attention: every score at once)",
    "latent-expanded": f"latent cache of rank {LATENT_RANK}, all keys and values rebuilt every step, then SDPA",
    "int8-tiled": f"the int8 cache; ch05.tiled_decode, each tile of {TILE} dequantised into a reused buffer",
}
RECORD_FIELDS = ("design", "kind", "tokens", "seconds", "runs", "iqr_seconds", "warmup_seconds", "copies",
                 "rotated_bytes", "cache_bytes", "bytes_moved", "flops", "operations", "extra_bytes",
                 "bytes_per_s", "percent_of_floor", "roofline_seconds", "percent_of_roofline",
                 "roofline_range", "bound", "note")
WORK_FIELDS = ("work", "implementation_work")  # in runs that measured the ceilings (results["ceilings"])
FILL_BLOCK = 1024  # tokens of fresh random numbers; longer caches repeat them (timing does not depend on values)
SLOW_DESIGN_LIMIT = {"gqa8-dense-teaching": 32768, "latent-expanded": 8192, "gqa8-materialised": 16384}


@dataclasses.dataclass
class DecodeCase:
    """A ready-to-time decode step and what it must read, move and compute."""

    step: Callable[[], torch.Tensor]
    cache_bytes: int  # bytes the design must read at the least: its cache (and weights where it needs them)
    bytes_moved: int  # plus whole-cache copies the implementation writes and reads back
    flops: int  # multiply-adds x 2 of the dot products
    operations: int  # flops plus the unpacking, converting and scaling a quantised step does per element
    copies: int  # distinct caches the step rotates through
    work: dict  # the design's least work by kind ("float", "int", "convert", "shift", "scale")
    implementation_work: dict  # what this implementation does, by kind; operations is its sum


def check_design(design: str, tokens: int) -> None:
    """Raise ValueError for an unknown design or a token count below one."""
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")


def _randn(*shape, generator, device, dtype=torch.float32):
    """Return a random tensor; along a token dimension (-2) longer than FILL_BLOCK the first block repeats."""
    if len(shape) < 2 or shape[-2] <= FILL_BLOCK:
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)
    block = torch.randn(*shape[:-2], FILL_BLOCK, shape[-1], generator=generator, device=device, dtype=dtype)
    copies = -(-shape[-2] // FILL_BLOCK)
    return block.repeat(*([1] * (len(shape) - 2)), copies, 1)[..., : shape[-2], :].contiguous()


def _clone(thing):
    """Return a deep copy of a cache's tensors (a tensor, a QuantizedKV, a KiviCache, a tuple)."""
    if isinstance(thing, torch.Tensor):
        return thing.clone()
    if isinstance(thing, tuple):
        return tuple(_clone(part) for part in thing)
    if dataclasses.is_dataclass(thing):
        return dataclasses.replace(thing, **{f.name: _clone(getattr(thing, f.name))
                                             for f in dataclasses.fields(thing)
                                             if isinstance(getattr(thing, f.name), torch.Tensor)})
    return thing


def _rotating(step: Callable, caches: list) -> Callable[[], torch.Tensor]:
    """Return a zero-argument step that takes the next cache of `caches` at each call."""
    turn = itertools.cycle(caches)
    return lambda: step(next(turn))


def decode_case(design: str, tokens: int, *, device: torch.device, seed: int = 0, cold: bool = True,
                query_heads: int = QUERY_HEADS, head_dim: int = HEAD_DIM, latent_rank: int = LATENT_RANK,
                window: int = WINDOW, chunk: int = CHUNK, kivi_passes: int = KIVI_PASSES) -> DecodeCase:
    """Return the decode step of `design` against `tokens` cached tokens, with its byte and operation counts.

    cold=True rotates through distinct copies of the cache filling COLD_FACTOR x the LLC (a GPU's L2
    on CUDA); cold=False re-reads one cache (warm: whatever of it the LLC holds is served from there).
    `chunk` is the split-KV chunk of the float designs, `kivi_passes` the groups a KIVI-style pass reads.

    Raises:
        ValueError: for an unknown design or tokens < 1.
    """
    check_design(design, tokens)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be an integer >= 1 (got {chunk!r})")
    if isinstance(kivi_passes, bool) or not isinstance(kivi_passes, int) or kivi_passes < 1:
        raise ValueError(f"kivi_passes must be an integer >= 1 (got {kivi_passes!r})")
    generator = torch.Generator(device=device).manual_seed(seed)
    query = _randn(1, query_heads, 1, head_dim, generator=generator, device=device)
    if design.startswith("latent"):
        return _latent_case(design, tokens, query, generator, device, query_heads, head_dim, latent_rank, cold,
                            chunk)
    kv_heads = {"mha": query_heads, "mqa": 1}.get(design, GQA_KV_HEADS)
    kept = min(tokens, window) if design == "window-4k" else tokens
    key, value = (_randn(1, kv_heads, kept, head_dim, generator=generator, device=device) for _ in "kv")
    flops = attention_flops(query_heads, kept, head_dim)
    elements = 2 * kv_heads * kept * head_dim  # cached numbers, keys and values
    if design.startswith(("int8", "int4")):
        bits = 8 if design.startswith("int8") else 4
        cache = tuple(ch05.quantize_cache(t, bits) for t in (key, value))
        size = cache[0].nbytes + cache[1].nbytes
        if design == "int8-tiled":  # convert, scale: two passes over every code
            work = {"float": flops, "convert": elements, "scale": elements}
            return _case(lambda c: ch05.tiled_decode(query, *c, tile=TILE), cache, size, size, flops, work, work,
                         cold, device)
        # the design: scores and mix as integer products, two scales on a score and one on a weight, and
        # at 4 bits one shift per code; this implementation mixes twice (two digits of the weights) and
        # scales each score and weight twice more
        unpack = elements if bits == 4 else 0
        work = {"int": flops, "scale": 3 * query_heads * kept, "shift": unpack}
        done = {"int": flops + flops // 2, "scale": 6 * query_heads * kept, "shift": unpack}
        return _case(lambda c: ch05.int8_decode(query, *c), cache, size, size, flops, work, done, cold, device)
    if design.startswith("kivi"):
        bits = int(design.removeprefix("kivi"))
        cache = ch05.KiviCache.from_keys_values(key, value, bits=bits, group=KIVI_GROUP,
                                                residual=KIVI_RESIDUAL)
        # every code converted (and below 8 bits unpacked), its offset added; scales folded into the
        # query rows group by group; weights scaled
        work = {"float": flops, "convert": elements, "shift": elements if bits < 8 else 0,
                "scale": elements + 2 * elements // KIVI_GROUP + 4 * query_heads * kept}
        return _case(lambda c: c.attend(query, groups_per_pass=kivi_passes), cache, cache.nbytes, cache.nbytes, flops, work, work, cold, device)
    size = key.nbytes + value.nbytes
    groups = query_heads // kv_heads
    cache = (key, value)
    work = {"float": flops}
    if design in ("mha", "gqa8", "mqa"):
        return _case(lambda c: ch05.split_kv_decode(query, *c, chunk=chunk), cache, size, size, flops, work, work,
                     cold, device)
    if design == "window-4k":  # the rolling buffer holds exactly the window: every slot is visible
        return _case(lambda c: ch05.split_kv_decode(query, *c, chunk=chunk), cache, size, size, flops, work, work,
                     cold, device)
    if design == "gqa8-sdpa":
        return _case(lambda c: fast.grouped_decode_attention(query, *c), cache, size, size, flops, work, work,
                     cold, device)
    if design == "gqa8-tiled":
        return _case(lambda c: ch05.tiled_decode(query, *c, tile=TILE), cache, size, size, flops, work, work,
                     cold, device)
    if design == "gqa8-materialised":
        def step(c):
            return F.scaled_dot_product_attention(query, ch03.repeat_kv(c[0], groups), ch03.repeat_kv(c[1], groups))
        return _case(step, cache, size, size + 2 * groups * size, flops, work, work, cold, device)
    return _case(lambda c: ch05.decode_reference(query, *c), cache, size, size, flops, work, work, cold, device)


def _case(step, cache, cache_bytes, bytes_moved, flops, work, implementation_work, cold, device) -> DecodeCase:
    """Return a DecodeCase whose step rotates through enough copies of `cache` to be cold."""
    copies = cold_copies(cache_bytes, cold, device)
    caches = [cache] + [_clone(cache) for _ in range(copies - 1)]
    work, done = ({kind: n for kind, n in counts.items() if n} for counts in (work, implementation_work))
    return DecodeCase(_rotating(step, caches), cache_bytes, bytes_moved, flops, sum(done.values()), copies,
                      work, done)


def _latent_case(design, tokens, query, generator, device, query_heads, head_dim, latent_rank, cold, chunk):
    """The latent designs: a (1, T, r) cache and the two (H*d_h, r) up-projections."""
    latent = _randn(1, tokens, latent_rank, generator=generator, device=device)
    key_up, value_up = (torch.randn(query_heads * head_dim, latent_rank, generator=generator, device=device)
                        / latent_rank**0.5 for _ in "kv")
    size = latent.nbytes + key_up.nbytes + value_up.nbytes
    cache = (latent, key_up, value_up)
    if design == "latent-expanded":
        rebuilt = 2 * tokens * query_heads * head_dim * 4
        flops = 2 * 2 * tokens * latent_rank * query_heads * head_dim + attention_flops(query_heads, tokens, head_dim)
        return _case(lambda c: fast.latent_decode_expanded(query, *c), cache, size,
                     size + latent.nbytes + 2 * rebuilt, flops, {"float": flops}, {"float": flops}, cold, device)
    flops = attention_flops(query_heads, tokens, latent_rank) + 2 * 2 * query_heads * head_dim * latent_rank
    return _case(lambda c: ch05.latent_decode(query, *c, chunk=chunk), cache, size, size, flops,
                 {"float": flops}, {"float": flops}, cold, device)


def measure_decode(design: str, tokens: int, *, device: torch.device, threads: int,
                   min_run_time: float = 0.2, cold: bool = True, memory: bool = True) -> dict:
    """Return the timed record of one decode step of `design` at T = `tokens` (fields: RECORD_FIELDS).

    The roofline fields are None here; `add_roofline` fills them once the run's floors are final.
    """
    case = decode_case(design, tokens, device=device, cold=cold)
    timing = time_call(case.step, threads=threads, min_run_time=min_run_time)
    extra = peak_extra_bytes(case.step) if device.type == "cpu" and memory else None
    return {"design": design, "kind": "flash" if design in FLASH_DESIGNS else "baseline", "tokens": tokens,
            "seconds": timing["seconds"], "runs": timing["runs"], "iqr_seconds": timing["iqr_seconds"],
            "warmup_seconds": timing["warmup_seconds"], "copies": case.copies,
            "rotated_bytes": case.copies * case.cache_bytes, "cache_bytes": case.cache_bytes,
            "bytes_moved": case.bytes_moved, "flops": case.flops, "operations": case.operations,
            "work": case.work, "implementation_work": case.implementation_work,
            "extra_bytes": extra, "bytes_per_s": None, "percent_of_floor": None, "roofline_seconds": None,
            "percent_of_roofline": None, "roofline_range": None, "bound": None, "note": DESIGN_NOTES[design]}


def roofline_seconds(record: dict, floor: dict, rates: dict | None = None) -> tuple[float, float]:
    """Return (memory time, arithmetic time): the bytes over the read floor B, and the operations over F,
    or where `rates` (``ceilings.measure_ceilings``'s) are given, the design's work kind by kind over its own ceiling."""
    if rates is None:
        return record["cache_bytes"] / floor["bytes_per_s"], record["operations"] / floor["flop_per_s"]
    rates = {**rates, "float": floor["flop_per_s"]}
    return record["cache_bytes"] / floor["bytes_per_s"], arithmetic_seconds(record["work"], rates)


def add_roofline(record: dict, floors: dict, rates: dict | None = None) -> dict:
    """Fill a record's floor and roofline fields from the run's floors (Equation 10.1).

    The roofline time is max(bytes it must read / B, operations / F) with B the read floor and F the
    matmul floor; the share is roofline time / measured time, against the faster floors of the run
    (`floors["bytes_per_s"]`, `floors["flop_per_s"]`). `roofline_range` holds the lowest and highest
    share any one of the run's floor measurements (`floors["measured"]`, start and end) gives.
    With `rates`, the arithmetic time is the design's work over the separate ceilings of each kind.
    """
    memory, arithmetic = roofline_seconds(record, floors, rates)
    record["bytes_per_s"] = record["cache_bytes"] / record["seconds"]
    record["percent_of_floor"] = 100.0 * memory / record["seconds"]
    record["roofline_seconds"] = max(memory, arithmetic)
    record["percent_of_roofline"] = 100.0 * record["roofline_seconds"] / record["seconds"]
    record["bound"] = "memory" if memory >= arithmetic else "arithmetic"
    shares = [100.0 * max(roofline_seconds(record, one, rates)) / record["seconds"]
              for one in floors.get("measured", [floors])]
    record["roofline_range"] = [min(shares), max(shares)]
    return record


def run_decode(token_counts, designs=DESIGNS, *, device, threads, progress, min_run_time: float = 0.2) -> list[dict]:
    """Return cold decode records for every design at every T (slow baselines stop at their limit)."""
    records = []
    for tokens in token_counts:
        for design in designs:
            if tokens > SLOW_DESIGN_LIMIT.get(design, tokens):
                continue  # seconds per call, and its trend is plain by then
            if device.type == "cuda" and design in INTEGER_ROUTE:
                progress(f"decode {design} T={tokens}: skipped on cuda ({INTEGER_ROUTE_ON_CUDA})")
                continue
            try:
                record = measure_decode(design, tokens, device=device, threads=threads, min_run_time=min_run_time)
            except RuntimeError as error:  # e.g. out of memory on an accelerator: keep the rest of the run
                if device.type == "cpu":
                    raise
                progress(f"decode {design} T={tokens}: skipped on {device.type} ({error})")
                continue
            records.append(record)
            progress(f"decode {design:20s} T={tokens:6d}: {record['seconds'] * 1e3:9.2f} ms "
                     f"({record['copies']} caches rotated, {record['runs']} blocks)")
    return records


INTEGER_ROUTE = ("int8", "int4")
INTEGER_ROUTE_ON_CUDA = ("torch._int_mm on CUDA needs more than 16 rows and a multiple of 8 columns; the integer "
                         "route's products have G = 4 columns (scores) and 2G = 8 rows (mix)")


def cuda_int_mm_ok(rows: int, columns: int) -> bool:
    """Return whether torch._int_mm on CUDA takes an (rows, k) @ (k, columns) product: rows > 16 and
    columns a multiple of 8 (on the CPU it takes any shape)."""
    return rows > 16 and columns % 8 == 0


WARM_COLD = (("gqa8", 1024), ("gqa8", 4096), ("gqa8", 65536), ("int8", 65536), ("int4", 65536))
ALLOCATOR_CONTROL = (("gqa8", 32768), ("int8", 32768), ("int4", 32768))


def run_warm_cold(pairs=WARM_COLD, *, device, threads, progress, min_run_time: float = 0.2) -> list[dict]:
    """Return, for each (design, T), the step re-reading one cache (warm) and rotating caches (cold).

    The two are timed in the order warm, cold, cold, warm, and each is the mean of its two medians,
    so that a drift of the machine during the pair (the first timing of a process, a neighbour's
    load) falls on both alike.
    """
    rows = []
    for design, tokens in pairs:
        runs = [measure_decode(design, tokens, device=device, threads=threads, min_run_time=min_run_time,
                               cold=flag, memory=False) for flag in (False, True, True, False)]
        warm = (runs[0]["seconds"] + runs[3]["seconds"]) / 2
        cold = (runs[1]["seconds"] + runs[2]["seconds"]) / 2
        rows.append({"design": design, "tokens": tokens, "cache_bytes": runs[0]["cache_bytes"],
                     "warm_seconds": warm, "cold_seconds": cold,
                     "cold_copies": runs[1]["copies"], "llc_bytes": last_level_cache_bytes()})
        warm, cold = {"seconds": warm}, {"seconds": cold}
        progress(f"warm/cold {design} T={tokens}: {warm['seconds'] * 1e3:.2f} / {cold['seconds'] * 1e3:.2f} ms")
    return rows


def run_allocator_control(pairs=ALLOCATOR_CONTROL, *, device, threads, progress,
                          min_run_time: float = 0.2) -> list[dict]:
    """Return, for each (design, T), the cold step with freed memory handed back and with it kept.

    The two allocator settings (common.set_allocator) alternate in the order returned, kept, kept,
    returned, and each time is the mean of its two medians, as in run_warm_cold. The allocator is
    left keeping freed memory. Returns [] where the allocator cannot be set (not glibc's malloc).
    """
    rows = []
    for design, tokens in pairs:
        times = {False: [], True: []}
        for keep in (False, True, True, False):
            if set_allocator(keep) is None:
                return []
            times[keep].append(measure_decode(design, tokens, device=device, threads=threads,
                                              min_run_time=min_run_time, memory=False)["seconds"])
        returned, kept = (sum(times[keep]) / 2 for keep in (False, True))
        rows.append({"design": design, "tokens": tokens, "returned_seconds": returned, "kept_seconds": kept})
        progress(f"allocator {design} T={tokens}: freed memory returned {returned * 1e3:.2f} ms, "
                 f"kept {kept * 1e3:.2f} ms")
    set_allocator(True)
    return rows


def time_at(records: list[dict], design: str, tokens: int) -> dict | None:
    """Return the record of `design` at T = `tokens`, or None if it was not measured."""
    return next((r for r in records if r["design"] == design and r["tokens"] == tokens), None)


def target_report(records: list[dict], token_counts=TARGET_TOKENS) -> list[dict]:
    """Return one line per target and length: what was measured, the goal, whether it was met, the gap.

    Targets: every float split-KV design at >= ROOFLINE_TARGET % of its roofline; the GQA-8 split-KV
    step no slower than torch SDPA on the same cache; the int8 and int4 steps at most RATIO_AIMS of
    the float32 GQA-8 step. All times cold. Needs records with roofline fields (add_roofline).
    """
    lines = []
    for tokens in token_counts:
        reference = time_at(records, REFERENCE, tokens)
        for design in FLOAT_DESIGNS:
            row = time_at(records, design, tokens)
            if row:
                share = row["percent_of_roofline"]
                lines.append({"target": "roofline", "design": design, "tokens": tokens, "value": share,
                              "range": row["roofline_range"], "goal": ROOFLINE_TARGET,
                              "met": share >= ROOFLINE_TARGET, "gap": ROOFLINE_TARGET / share})
        sdpa = time_at(records, "gqa8-sdpa", tokens)
        if reference and sdpa:
            ratio = reference["seconds"] / sdpa["seconds"]
            lines.append({"target": "sdpa", "design": REFERENCE, "tokens": tokens, "value": ratio,
                          "goal": SDPA_AIM, "met": ratio <= SDPA_AIM, "gap": ratio / SDPA_AIM})
        for cache, design in QUANTISED.items():
            row = time_at(records, design, tokens)
            if row and reference:
                ratio = row["seconds"] / reference["seconds"]
                lines.append({"target": "ratio", "design": design, "tokens": tokens, "value": ratio,
                              "goal": RATIO_AIMS[cache], "met": ratio <= RATIO_AIMS[cache],
                              "gap": ratio / RATIO_AIMS[cache]})
    return lines


def profile_step(design: str, tokens: int, *, device: torch.device, threads: int, top: int = 8) -> dict:
    """Return where one cold decode step's time goes: torch.profiler's operators by self CPU time.

    The step first runs once per rotated cache, so that every copy has been read once and the
    allocator holds all the memory a step asks for (a first call's page faults would otherwise land
    on whichever operator first touches new memory); then three times under the profiler, and each
    operator's self time is divided by three.
    """
    from torch.profiler import ProfilerActivity, profile

    case = decode_case(design, tokens, device=device)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(case.copies):
            case.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                case.step()
    finally:
        torch.set_num_threads(previous)
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in averages) / 3 / 1e6
    rows = [{"name": e.key, "kind": operator_kind(e.key), "self_seconds": e.self_cpu_time_total / 3 / 1e6,
             "calls": e.count // 3, "share": e.self_cpu_time_total / 3 / 1e6 / total if total else math.nan}
            for e in averages[:top]]
    kinds = {}
    for e in averages:
        kinds[operator_kind(e.key)] = kinds.get(operator_kind(e.key), 0.0) + e.self_cpu_time_total / 3 / 1e6
    return {"design": design, "tokens": tokens, "threads": threads, "total_seconds": total, "operators": rows,
            "kinds": {kind: seconds / total for kind, seconds in kinds.items()} if total else {}}


MATRIX_PRODUCTS = ("aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm", "aten::addmm", "aten::_int_mm")


def operator_kind(key: str) -> str:
    """Return which kind of work a profiler key is: matrix products, elementwise passes and reductions
    (every other aten operator), or Python-side overhead (the rest)."""
    if key in MATRIX_PRODUCTS:
        return "matrix products"
    if key.startswith("aten::"):
        return "elementwise and reductions"
    return "overhead"
