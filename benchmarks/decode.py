"""One decode step of one Llama-3-8B-shaped attention layer against a cache of T tokens, per design."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from longctx import ch02, ch03

from . import fast
from .common import time_median

QUERY_HEADS = 32
HEAD_DIM = 128
D_MODEL = QUERY_HEADS * HEAD_DIM
GQA_KV_HEADS = 8
LATENT_RANK = 512
WINDOW = 4096

DESIGNS = (
    "mha", "gqa8-materialised", "gqa8-grouped", "gqa8-grouped-teaching", "gqa8-sdpa-gqa", "mqa",
    "latent-expanded", "latent-absorbed", "window-4k", "int8", "int4",
)
DESIGN_NOTES = {
    "mha": "32 KV heads; torch SDPA",
    "gqa8-materialised": "8 KV heads repeated to 32 with ch03.repeat_kv, then torch SDPA",
    "gqa8-grouped": "8 KV heads, the 4 query heads of a group stacked as rows of one SDPA call (no repeat)",
    "gqa8-grouped-teaching": ("8 KV heads, ch03.grouped_attention: each group's query heads stacked as rows over "
                              "its KV head (no copy); teaching softmax"),
    "gqa8-sdpa-gqa": "8 KV heads, torch SDPA with enable_gqa=True",
    "mqa": "1 KV head shared by 32 query heads, grouped",
    "latent-expanded": f"latent cache of rank {LATENT_RANK}, keys and values rebuilt every step",
    "latent-absorbed": f"latent cache of rank {LATENT_RANK}, up-projections folded into query and output",
    "window-4k": f"GQA-8 rolling buffer of the last {WINDOW} tokens, grouped",
    "int8": "GQA-8 cache in int8 with one float32 scale per token and head; dequantised every step",
    "int4": "GQA-8 cache in int4 (two codes a byte) with per-token scales; unpacked and dequantised every step",
}
RECORD_FIELDS = ("design", "tokens", "seconds", "runs", "cache_bytes", "bytes_moved", "flops",
                 "bytes_per_s", "percent_of_floor", "note")


@dataclasses.dataclass
class DecodeCase:
    """A ready-to-time decode step: the step, the cache bytes it must read, the bytes it moves, its FLOPs."""

    step: Callable[[], torch.Tensor]
    cache_bytes: int
    bytes_moved: int
    flops: int


def _check(design: str, tokens: int) -> None:
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")


FILL_BLOCK = 1024  # tokens of fresh random numbers; longer caches repeat them (timing does not depend on values)
SLOW_DESIGN_LIMIT = {"gqa8-grouped-teaching": 32768, "latent-expanded": 32768}  # largest T the full run times


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


def decode_case(design: str, tokens: int, *, device: torch.device, seed: int = 0,
                query_heads: int = QUERY_HEADS, head_dim: int = HEAD_DIM, latent_rank: int = LATENT_RANK,
                window: int = WINDOW) -> DecodeCase:
    """Return the decode step of `design` against a cache of `tokens` tokens, with its byte and FLOP counts.

    cache_bytes is what the design must read at the least (its cache, plus weights where the
    step needs them); bytes_moved adds the traffic the implementation creates on top (a
    materialised repeat, rebuilt keys, dequantised copies), each written once and read once.

    Raises:
        ValueError: for an unknown design or tokens < 1.
    """
    _check(design, tokens)
    generator = torch.Generator(device=device).manual_seed(seed)
    query = _randn(1, query_heads, 1, head_dim, generator=generator, device=device)
    scalar = 4  # float32
    if design == "mha":
        key, value = (_randn(1, query_heads, tokens, head_dim, generator=generator, device=device) for _ in "kv")
        size = key.nbytes + value.nbytes
        return DecodeCase(lambda: F.scaled_dot_product_attention(query, key, value), size, size,
                          attention_flops(query_heads, tokens, head_dim))
    if design in ("gqa8-materialised", "gqa8-grouped", "gqa8-grouped-teaching", "gqa8-sdpa-gqa", "mqa", "window-4k",
                  "int8", "int4"):
        kv_heads = 1 if design == "mqa" else GQA_KV_HEADS
        kept = min(tokens, window) if design == "window-4k" else tokens
        key, value = (_randn(1, kv_heads, kept, head_dim, generator=generator, device=device) for _ in "kv")
        size = key.nbytes + value.nbytes
        flops = attention_flops(query_heads, kept, head_dim)
        groups = query_heads // kv_heads
        if design == "gqa8-materialised":
            def step():
                return F.scaled_dot_product_attention(query, ch03.repeat_kv(key, groups), ch03.repeat_kv(value, groups))
            return DecodeCase(step, size, size + 2 * groups * size, flops)
        if design == "gqa8-grouped-teaching":
            # the group's query heads are stacked as rows over their KV head, so the cache is read once
            return DecodeCase(lambda: ch03.grouped_attention(query, key, value), size, size, flops)
        if design == "gqa8-sdpa-gqa":
            return DecodeCase(lambda: F.scaled_dot_product_attention(query, key, value, enable_gqa=True),
                              size, size, flops)
        if design in ("gqa8-grouped", "mqa", "window-4k"):
            return DecodeCase(lambda: fast.grouped_decode_attention(query, key, value), size, size, flops)
        if design == "int8":
            (key_codes, key_scale), (value_codes, value_scale) = ch02.quantize(key, 8), ch02.quantize(value, 8)
            stored = sum(t.nbytes for t in (key_codes, key_scale, value_codes, value_scale))

            def step():
                return fast.grouped_decode_attention(query, ch02.dequantize(key_codes, key_scale),
                                                     ch02.dequantize(value_codes, value_scale))
            return DecodeCase(step, stored, stored + 2 * size, flops)
        (key_codes, key_scale), (value_codes, value_scale) = ch02.quantize(key, 4), ch02.quantize(value, 4)
        key_packed, value_packed = fast.pack_int4(key_codes), fast.pack_int4(value_codes)
        stored = sum(t.nbytes for t in (key_packed, key_scale, value_packed, value_scale))

        def step():
            return fast.grouped_decode_attention(query, fast.dequantize_int4(key_packed, key_scale),
                                                 fast.dequantize_int4(value_packed, value_scale))
        return DecodeCase(step, stored, stored + 2 * size, flops)
    # latent designs: cache (1, T, r) and the two up-projections (H*d_h, r)
    latent = _randn(1, tokens, latent_rank, generator=generator, device=device)
    key_up, value_up = (torch.randn(query_heads * head_dim, latent_rank, generator=generator, device=device)
                        / latent_rank**0.5 for _ in "kv")
    weights = key_up.nbytes + value_up.nbytes
    size = latent.nbytes + weights
    if design == "latent-expanded":
        rebuilt = 2 * tokens * query_heads * head_dim * scalar
        flops = 2 * 2 * tokens * latent_rank * query_heads * head_dim + attention_flops(query_heads, tokens, head_dim)
        return DecodeCase(lambda: fast.latent_decode_expanded(query, latent, key_up, value_up),
                          size, size + latent.nbytes + 2 * rebuilt, flops)
    flops = attention_flops(query_heads, tokens, latent_rank) + 2 * 2 * query_heads * head_dim * latent_rank
    return DecodeCase(lambda: fast.latent_decode_absorbed(query, latent, key_up, value_up),
                      size, size + latent.nbytes, flops)


def measure_decode(design: str, tokens: int, *, device: torch.device, threads: int, floor_bytes_per_s: float,
                   min_run_time: float = 0.2) -> dict:
    """Return the timed record of one decode step of `design` at T = `tokens` (fields: RECORD_FIELDS)."""
    case = decode_case(design, tokens, device=device)
    timing = time_median(case.step, device=device, threads=threads, min_run_time=min_run_time)
    achieved = case.cache_bytes / timing["seconds"]
    return {"design": design, "tokens": tokens, "seconds": timing["seconds"], "runs": timing["runs"],
            "cache_bytes": case.cache_bytes, "bytes_moved": case.bytes_moved, "flops": case.flops,
            "bytes_per_s": achieved, "percent_of_floor": 100.0 * achieved / floor_bytes_per_s,
            "note": DESIGN_NOTES[design]}


def run_decode(token_counts, designs=DESIGNS, *, device, threads, floor_bytes_per_s, progress,
               min_run_time: float = 0.2) -> list[dict]:
    """Return decode records for every design at every T (slow teaching designs stop at their limit)."""
    records = []
    for tokens in token_counts:
        for design in designs:
            if tokens > SLOW_DESIGN_LIMIT.get(design, tokens):
                continue  # minutes per call, and its trend is plain by then
            try:
                record = measure_decode(design, tokens, device=device, threads=threads,
                                        floor_bytes_per_s=floor_bytes_per_s, min_run_time=min_run_time)
            except RuntimeError as error:  # e.g. out of memory on an accelerator: keep the rest of the run
                if device.type == "cpu":
                    raise
                progress(f"decode {design} T={tokens}: skipped on {device.type} ({error})")
                continue
            records.append(record)
            progress(f"decode {design:18s} T={tokens:6d}: {record['seconds'] * 1e3:8.2f} ms, "
                     f"{record['percent_of_floor']:5.1f}% of floor")
    return records
