"""One decode step of one Llama-3-8B-shaped attention layer against a cache of T tokens, per design.

The designs are Chapter 5's flash-decoding (`longctx.ch05.flash_decode` and its fused, compiled
tile update) on every cache of Chapters 3 and 4; the baselines are other ways to take the same
step (torch's fused SDPA kernel, a materialised repeat, Chapter 3's dense teaching code, a
latent cache rebuilt every step, a quantised cache dequantised whole every step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from longctx import ch03, ch05

from . import fast
from .common import peak_extra_bytes, time_median

QUERY_HEADS = 32
HEAD_DIM = 128
D_MODEL = QUERY_HEADS * HEAD_DIM
GQA_KV_HEADS = 8
LATENT_RANK = 512
WINDOW = 4096
FLOAT_TILE = 4096  # flash_decode on float caches: big tiles, few calls
QUANTISED_TILE = 1024  # flash_decode on quantised caches: two reused float tiles of this many positions
FUSED_TILE = 2048  # the compiled tile update: the codes of one head's tile stay in the core's L2 cache

FLASH_DESIGNS = (
    "mha", "gqa8", "mqa", "window-4k", "latent-absorbed", "int8", "int4",
    "gqa8-compiled", "int8-compiled", "int4-compiled",
)
BASELINES = (
    "gqa8-sdpa", "gqa8-sdpa-gqa", "gqa8-materialised", "gqa8-dense-teaching", "latent-expanded",
    "int8-dequantised", "int4-dequantised",
)
DESIGNS = FLASH_DESIGNS + BASELINES
FLOAT_DESIGNS = ("mha", "gqa8", "mqa", "window-4k", "latent-absorbed", "gqa8-compiled")  # held to the roofline
QUANTISED_DESIGNS = {"int8": ("int8", "int8-compiled"), "int4": ("int4", "int4-compiled")}
REFERENCE = ("gqa8", "gqa8-compiled")  # the float32 GQA-8 flash step the quantised ones are compared with
COMPILED = ("gqa8-compiled", "int8-compiled", "int4-compiled")
TARGET_TOKENS = (32768, 65536)
ROOFLINE_TARGET = 60.0  # percent of the roofline every float design should reach
RATIO_AIMS = {"int8": 0.5, "int4": 0.35}  # the aims; the target is a ratio below 1
MEMORY_TARGET_TILES = 3  # a step may add at most this many tiles beyond its cache

DESIGN_NOTES = {
    "mha": f"32 KV heads; ch05.flash_decode, tiles of {FLOAT_TILE}",
    "gqa8": f"8 KV heads, 4 query heads stacked per KV head; ch05.flash_decode, tiles of {FLOAT_TILE}",
    "mqa": f"1 KV head shared by 32 query heads; ch05.flash_decode, tiles of {FLOAT_TILE}",
    "window-4k": f"GQA-8 rolling buffer of the last {WINDOW} tokens; ch05.flash_decode, tiles of {FLOAT_TILE}",
    "latent-absorbed": (f"latent cache of rank {LATENT_RANK}, up-projections absorbed; ch05.flash_decode_latent, "
                        f"tiles of {FLOAT_TILE}"),
    "int8": (f"GQA-8 cache in int8, one float32 scale per token and head; ch05.flash_decode, each tile of "
             f"{QUANTISED_TILE} dequantised into a reused float buffer"),
    "int4": (f"GQA-8 cache in int4 (two codes a byte), per-token scales; ch05.flash_decode, each tile of "
             f"{QUANTISED_TILE} unpacked into a reused float buffer"),
    "gqa8-compiled": f"the gqa8 cache; ch05.fused_flash_decode with a compiled tile update, tiles of {FUSED_TILE}",
    "int8-compiled": (f"the int8 cache; compiled tile update, codes converted in registers and scales applied "
                      f"after the dot products, tiles of {FUSED_TILE}"),
    "int4-compiled": f"the int4 cache; compiled tile update on the nibbles as stored, tiles of {FUSED_TILE}",
    "gqa8-sdpa": "the gqa8 cache; torch's fused SDPA kernel, a group's 4 query heads stacked as rows (no repeat)",
    "gqa8-sdpa-gqa": "the gqa8 cache; torch SDPA with enable_gqa=True",
    "gqa8-materialised": "the gqa8 cache repeated to 32 heads with ch03.repeat_kv, then torch SDPA",
    "gqa8-dense-teaching": "the gqa8 cache; ch05.decode_reference (ch03.grouped_attention: every score at once)",
    "latent-expanded": f"latent cache of rank {LATENT_RANK}, all keys and values rebuilt every step, then torch SDPA",
    "int8-dequantised": "the int8 cache dequantised whole with ch02.dequantize every step, then torch SDPA",
    "int4-dequantised": "the int4 cache unpacked and dequantised whole every step, then torch SDPA",
}
RECORD_FIELDS = ("design", "kind", "tokens", "seconds", "runs", "warmup_seconds", "cache_bytes", "bytes_moved",
                 "flops", "tile", "tile_bytes", "extra_bytes", "compiled", "fallback_reason", "bytes_per_s",
                 "percent_of_floor", "roofline_seconds", "percent_of_roofline", "bound", "note")
FILL_BLOCK = 1024  # tokens of fresh random numbers; longer caches repeat them (timing does not depend on values)
SLOW_DESIGN_LIMIT = {"gqa8-dense-teaching": 32768, "latent-expanded": 32768}  # largest T the full run times
_COMPILED_UPDATES: dict[str, ch05.CompiledTileUpdate] = {}  # one per compiled design: it compiles once per run


@dataclasses.dataclass
class DecodeCase:
    """A ready-to-time decode step and what it must read, move and compute."""

    step: Callable[[], torch.Tensor]
    cache_bytes: int  # bytes the design must read at the least: its cache (and weights where it needs them)
    bytes_moved: int  # plus whole-cache copies the implementation writes and reads back
    flops: int
    tile: int | None  # positions per tile (None: not tiled)
    tile_bytes: int | None  # float32 keys and values of one tile: the unit of a step's extra memory


def check_design(design: str, tokens: int) -> None:
    """Raise ValueError for an unknown design or a token count below one."""
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")


def _randn(*shape, generator, device, dtype=torch.float32):
    """Return a random tensor; along a token dimension (-2) longer than FILL_BLOCK the first block repeats.

    Drawing gigabytes of normal numbers costs more than the step being timed, and the step's
    time does not depend on the values, so long caches tile one random block.
    """
    if len(shape) < 2 or shape[-2] <= FILL_BLOCK:
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)
    block = torch.randn(*shape[:-2], FILL_BLOCK, shape[-1], generator=generator, device=device, dtype=dtype)
    copies = -(-shape[-2] // FILL_BLOCK)
    return block.repeat(*([1] * (len(shape) - 2)), copies, 1)[..., : shape[-2], :].contiguous()


def attention_flops(query_heads: int, tokens: int, width: int) -> int:
    """Return the multiply-adds x 2 of one query row per head against `tokens` keys: QK^T and PV."""
    return 4 * query_heads * tokens * width


def compiled_update(design: str) -> ch05.CompiledTileUpdate:
    """Return the run's CompiledTileUpdate for a compiled design (made on first use, so it compiles once)."""
    return _COMPILED_UPDATES.setdefault(design, ch05.CompiledTileUpdate())


def decode_case(design: str, tokens: int, *, device: torch.device, seed: int = 0, compile_updates: bool = True,
                query_heads: int = QUERY_HEADS, head_dim: int = HEAD_DIM, latent_rank: int = LATENT_RANK,
                window: int = WINDOW) -> DecodeCase:
    """Return the decode step of `design` against a cache of `tokens` tokens, with its byte and FLOP counts.

    compile_updates=False runs the compiled designs' tile update eagerly (the same arithmetic, for tests).

    Raises:
        ValueError: for an unknown design or tokens < 1.
    """
    check_design(design, tokens)
    generator = torch.Generator(device=device).manual_seed(seed)
    query = _randn(1, query_heads, 1, head_dim, generator=generator, device=device)
    if design.startswith("latent"):
        return _latent_case(design, tokens, query, generator, device, query_heads, head_dim, latent_rank)
    kv_heads = {"mha": query_heads, "mqa": 1}.get(design, GQA_KV_HEADS)
    kept = min(tokens, window) if design == "window-4k" else tokens
    flops = attention_flops(query_heads, kept, head_dim)

    def tile_bytes(tile: int) -> int:  # float32 keys and values of one tile
        return 2 * kv_heads * min(tile, kept) * head_dim * 4

    if design.startswith(("int8", "int4")):
        bits = 8 if design.startswith("int8") else 4
        key_q, value_q = (ch05.quantize_cache(_randn(1, kv_heads, kept, head_dim, generator=generator,
                                                     device=device), bits) for _ in "kv")
        stored = key_q.nbytes + value_q.nbytes
        if design in ("int8", "int4"):
            return DecodeCase(lambda: ch05.flash_decode(query, key_q, value_q, tile=QUANTISED_TILE), stored,
                              stored, flops, QUANTISED_TILE, tile_bytes(QUANTISED_TILE))
        if design in ("int8-compiled", "int4-compiled"):
            update = compiled_update(design) if compile_updates else ch05.fused_tile_update
            return DecodeCase(lambda: ch05.fused_flash_decode(query, key_q, value_q, tile=FUSED_TILE,
                                                              tile_update=update),
                              stored, stored, flops, FUSED_TILE, tile_bytes(FUSED_TILE))

        def dequantised_step():  # the whole cache back to float32, every step
            return fast.grouped_decode_attention(query, ch05.dequantize_cache(key_q),
                                                 ch05.dequantize_cache(value_q))
        return DecodeCase(dequantised_step, stored, stored + 2 * tile_bytes(kept), flops, None, None)
    key, value = (_randn(1, kv_heads, kept, head_dim, generator=generator, device=device) for _ in "kv")
    size = key.nbytes + value.nbytes
    groups = query_heads // kv_heads
    if design in ("mha", "gqa8", "mqa", "window-4k"):
        return DecodeCase(lambda: ch05.flash_decode(query, key, value, tile=FLOAT_TILE), size, size, flops,
                          FLOAT_TILE, tile_bytes(FLOAT_TILE))
    if design == "gqa8-compiled":
        update = compiled_update(design) if compile_updates else ch05.fused_tile_update
        return DecodeCase(lambda: ch05.fused_flash_decode(query, key, value, tile=FUSED_TILE, tile_update=update),
                          size, size, flops, FUSED_TILE, tile_bytes(FUSED_TILE))
    if design == "gqa8-sdpa":
        return DecodeCase(lambda: fast.grouped_decode_attention(query, key, value), size, size, flops, None, None)
    if design == "gqa8-sdpa-gqa":
        return DecodeCase(lambda: F.scaled_dot_product_attention(query, key, value, enable_gqa=True),
                          size, size, flops, None, None)
    if design == "gqa8-materialised":
        def step():
            return F.scaled_dot_product_attention(query, ch03.repeat_kv(key, groups), ch03.repeat_kv(value, groups))
        return DecodeCase(step, size, size + 2 * groups * size, flops, None, None)
    return DecodeCase(lambda: ch05.decode_reference(query, key, value), size, size, flops, None, None)


def _latent_case(design, tokens, query, generator, device, query_heads, head_dim, latent_rank) -> DecodeCase:
    """The latent designs: a (1, T, r) cache and the two (H*d_h, r) up-projections."""
    latent = _randn(1, tokens, latent_rank, generator=generator, device=device)
    key_up, value_up = (torch.randn(query_heads * head_dim, latent_rank, generator=generator, device=device)
                        / latent_rank**0.5 for _ in "kv")
    size = latent.nbytes + key_up.nbytes + value_up.nbytes
    if design == "latent-expanded":
        rebuilt = 2 * tokens * query_heads * head_dim * 4
        flops = 2 * 2 * tokens * latent_rank * query_heads * head_dim + attention_flops(query_heads, tokens, head_dim)
        return DecodeCase(lambda: fast.latent_decode_expanded(query, latent, key_up, value_up),
                          size, size + latent.nbytes + 2 * rebuilt, flops, None, None)
    flops = attention_flops(query_heads, tokens, latent_rank) + 2 * 2 * query_heads * head_dim * latent_rank
    return DecodeCase(lambda: ch05.flash_decode_latent(query, latent, key_up, value_up, tile=FLOAT_TILE),
                      size, size, flops, FLOAT_TILE, min(FLOAT_TILE, tokens) * latent_rank * 4)


def measure_decode(design: str, tokens: int, *, device: torch.device, threads: int,
                   min_run_time: float = 0.2, compile_updates: bool = True) -> dict:
    """Return the timed record of one decode step of `design` at T = `tokens` (fields: RECORD_FIELDS).

    The roofline fields are None here; `add_roofline` fills them once the run's floors are final.
    """
    case = decode_case(design, tokens, device=device, compile_updates=compile_updates)
    timing = time_median(case.step, device=device, threads=threads, min_run_time=min_run_time)
    extra = peak_extra_bytes(case.step) if device.type == "cpu" else None
    update = _COMPILED_UPDATES.get(design) if compile_updates else None
    return {"design": design, "kind": "flash" if design in FLASH_DESIGNS else "baseline", "tokens": tokens,
            "seconds": timing["seconds"], "runs": timing["runs"], "warmup_seconds": timing["warmup_seconds"],
            "cache_bytes": case.cache_bytes, "bytes_moved": case.bytes_moved, "flops": case.flops,
            "tile": case.tile, "tile_bytes": case.tile_bytes, "extra_bytes": extra,
            "compiled": None if design not in COMPILED else bool(update and update.fallback_reason is None),
            "fallback_reason": update.fallback_reason if update else None,
            "bytes_per_s": None, "percent_of_floor": None, "roofline_seconds": None,
            "percent_of_roofline": None, "bound": None, "note": DESIGN_NOTES[design]}


def add_roofline(record: dict, floors: dict) -> dict:
    """Fill a record's floor and roofline fields from the run's floors (Equation 5.1).

    The roofline time is max(bytes it must read / B, FLOPs / F); the record's share of it is
    roofline time / measured time, so 100 % means the step ran at the machine's limit.
    """
    memory = record["cache_bytes"] / floors["bytes_per_s"]
    arithmetic = record["flops"] / floors["flop_per_s"]
    record["bytes_per_s"] = record["cache_bytes"] / record["seconds"]
    record["percent_of_floor"] = 100.0 * memory / record["seconds"]
    record["roofline_seconds"] = max(memory, arithmetic)
    record["percent_of_roofline"] = 100.0 * record["roofline_seconds"] / record["seconds"]
    record["bound"] = "memory" if memory >= arithmetic else "arithmetic"
    return record


def run_decode(token_counts, designs=DESIGNS, *, device, threads, progress, min_run_time: float = 0.2,
               compile_updates: bool = True) -> list[dict]:
    """Return decode records for every design at every T (slow baselines stop at their limit)."""
    records = []
    for tokens in token_counts:
        for design in designs:
            if tokens > SLOW_DESIGN_LIMIT.get(design, tokens):
                continue  # seconds per call, and its trend is plain by then
            try:
                record = measure_decode(design, tokens, device=device, threads=threads,
                                        min_run_time=min_run_time, compile_updates=compile_updates)
            except RuntimeError as error:  # e.g. out of memory on an accelerator: keep the rest of the run
                if device.type == "cpu":
                    raise
                progress(f"decode {design} T={tokens}: skipped on {device.type} ({error})")
                continue
            records.append(record)
            first = record["warmup_seconds"] - record["seconds"]
            progress(f"decode {design:20s} T={tokens:6d}: {record['seconds'] * 1e3:9.2f} ms"
                     + (f" (first call {first:.1f} s longer)" if design in COMPILED and first > 1 else ""))
    return records


def best_time(records: list[dict], designs, tokens: int) -> dict | None:
    """Return the fastest record among `designs` at T = `tokens`, or None if none was measured."""
    rows = [r for r in records if r["design"] in designs and r["tokens"] == tokens]
    return min(rows, key=lambda r: r["seconds"]) if rows else None


def target_report(records: list[dict], token_counts=TARGET_TOKENS) -> list[dict]:
    """Return one line per target and length: what was measured, the target, and whether it was met.

    Targets (the issue's): every float flash design at >= ROOFLINE_TARGET % of its roofline; the
    int8 and int4 caches (the faster of eager and compiled) faster than the float32 GQA-8 flash
    step (the faster of eager and compiled); a step's extra memory at most MEMORY_TARGET_TILES tiles.
    Needs records with roofline fields (add_roofline).
    """
    lines = []
    for tokens in token_counts:
        reference = best_time(records, REFERENCE, tokens)
        for design in FLOAT_DESIGNS:
            row = best_time(records, (design,), tokens)
            if row:
                share = row["percent_of_roofline"]
                lines.append({"target": "roofline", "design": design, "tokens": tokens, "value": share,
                              "goal": ROOFLINE_TARGET, "met": share >= ROOFLINE_TARGET,
                              "gap": ROOFLINE_TARGET / share})
        for cache, designs in QUANTISED_DESIGNS.items():
            row = best_time(records, designs, tokens)
            if row and reference:
                ratio = row["seconds"] / reference["seconds"]
                lines.append({"target": "ratio", "design": row["design"], "tokens": tokens, "value": ratio,
                              "goal": 1.0, "aim": RATIO_AIMS[cache], "met": ratio < 1.0,
                              "aim_met": ratio <= RATIO_AIMS[cache], "gap": ratio / RATIO_AIMS[cache],
                              "reference": reference["design"]})
        for row in records:
            if row["tokens"] == tokens and row["kind"] == "flash" and row["extra_bytes"] is not None:
                tiles = row["extra_bytes"] / row["tile_bytes"]
                lines.append({"target": "memory", "design": row["design"], "tokens": tokens, "value": tiles,
                              "goal": MEMORY_TARGET_TILES, "met": tiles <= MEMORY_TARGET_TILES,
                              "gap": tiles / MEMORY_TARGET_TILES})
    return lines


def profile_step(design: str, tokens: int, *, device: torch.device, threads: int, top: int = 8) -> dict:
    """Return where one decode step's time goes: torch.profiler's operators by self CPU time.

    The step runs once to warm up (and compile), then three times under the profiler; each
    operator's self time is divided by three. Compiled kernels show as one compiled region.
    """
    from torch.profiler import ProfilerActivity, profile

    case = decode_case(design, tokens, device=device)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                case.step()
    finally:
        torch.set_num_threads(previous)
    averages = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in averages) / 3 / 1e6
    rows = [{"name": operator_name(e.key), "kind": operator_kind(e.key),
             "self_seconds": e.self_cpu_time_total / 3 / 1e6, "calls": e.count // 3,
             "share": e.self_cpu_time_total / 3 / 1e6 / total if total else math.nan} for e in averages[:top]]
    kinds = {}
    for e in averages:
        kinds[operator_kind(e.key)] = kinds.get(operator_kind(e.key), 0.0) + e.self_cpu_time_total / 3 / 1e6
    return {"design": design, "tokens": tokens, "threads": threads, "total_seconds": total, "operators": rows,
            "kinds": {kind: seconds / total for kind, seconds in kinds.items()} if total else {}}


MATRIX_PRODUCTS = ("aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm", "aten::addmm")


def operator_name(key: str) -> str:
    """Return a profiler key as a reader should see it (an inductor graph's hash becomes a phrase)."""
    return "compiled tile update (inductor C++ kernel)" if "CompiledFxGraph" in key else key


def operator_kind(key: str) -> str:
    """Return which kind of work a profiler key is: matrix products, the compiled kernel, elementwise
    passes and reductions (every other aten operator), or Python-side overhead (the rest)."""
    if "CompiledFxGraph" in key:
        return "compiled kernel"
    if key in MATRIX_PRODUCTS:
        return "matrix products"
    if key.startswith("aten::"):
        return "elementwise and reductions"
    return "overhead"
