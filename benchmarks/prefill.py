"""Prefill of n tokens: full causal attention three ways (torch SDPA, Chapter 1's teaching code, Chapter 10's
flash_prefill), the block-sparse and banded windows, and chunked linear attention; the peak memory of the
three full-attention designs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from longctx import ch01, ch04, ch05
from longctx.support import time_call

from . import fast
from .common import peak_extra_bytes

HEADS = 4
HEAD_DIM = 64
WINDOW = 1024
BLOCK_SIZE = 128
CHUNK_SIZE = 64
TEACHING_FULL_LIMIT = 8192  # the teaching attention builds n x n scores; stop it here
RUN_LIMIT = {"full-teaching": TEACHING_FULL_LIMIT, "window-blocksparse": 8192}  # largest n a run times
MEMORY_DESIGNS = ("full-sdpa", "full-teaching", "flash-prefill")  # peak memory measured up to MEMORY_LIMIT
MEMORY_LIMIT = 8192
QUERY_TILE, KEY_TILE = 256, 256

DESIGNS = ("full-sdpa", "full-teaching", "flash-prefill", "window-blocksparse", "window-banded", "linear-chunked")
DESIGN_NOTES = {
    "full-sdpa": "torch SDPA, is_causal=True",
    "flash-prefill": f"ch05.flash_prefill, query tiles of {QUERY_TILE}, key tiles of {KEY_TILE}",
    "full-teaching": "ch01.scaled_dot_product_attention with ch01.causal_mask (n x n scores)",
    "window-blocksparse": f"ch04.block_sparse_attention, window {WINDOW}, blocks of {BLOCK_SIZE}",
    "window-banded": f"benchmark kernel: each block of {BLOCK_SIZE} queries over its {WINDOW}-key band via SDPA",
    "linear-chunked": f"ch04.linear_attention_chunked, chunks of {CHUNK_SIZE}",
}
RECORD_FIELDS = ("design", "tokens", "seconds", "runs", "flops", "extra_bytes", "score_bytes", "note")


def prefill_flops(design: str, tokens: int, head_dim: int = HEAD_DIM, heads: int = HEADS) -> int:
    """Return the multiply-add FLOPs (x 2) the design needs for n = `tokens`, counting visible pairs only."""
    if design.startswith(("full", "flash")):
        pairs = ch01.attention_pairs(tokens) if hasattr(ch01, "attention_pairs") else tokens * (tokens + 1) // 2
        return 4 * heads * head_dim * pairs
    if design.startswith("window"):
        pairs = sum(min(i + 1, WINDOW) for i in range(tokens))
        return 4 * heads * head_dim * pairs
    return 4 * heads * tokens * head_dim * head_dim  # state update and read-out, d x d per token


def prefill_case(design: str, tokens: int, *, device: torch.device, seed: int = 0):
    """Return a zero-argument function computing the prefill of `design` on random q, k, v of n = `tokens`.

    Raises:
        ValueError: for an unknown design, tokens < 1, or full-teaching beyond TEACHING_FULL_LIMIT.
    """
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (n) must be an integer >= 1 (got {tokens!r})")
    if design == "full-teaching" and tokens > TEACHING_FULL_LIMIT:
        raise ValueError(f"full-teaching builds n x n scores; n must be <= {TEACHING_FULL_LIMIT} (got {tokens})")
    generator = torch.Generator(device=device).manual_seed(seed)
    query, key, value = (torch.randn(1, HEADS, tokens, HEAD_DIM, generator=generator, device=device)
                         for _ in range(3))
    if design == "full-sdpa":
        return lambda: F.scaled_dot_product_attention(query, key, value, is_causal=True)
    if design == "flash-prefill":
        return lambda: ch05.flash_prefill(query, key, value, query_tile=QUERY_TILE, key_tile=KEY_TILE)
    if design == "full-teaching":
        mask = ch01.causal_mask(tokens, device=device)
        return lambda: ch01.scaled_dot_product_attention(query, key, value, mask)[0]
    if design == "window-blocksparse":
        block_mask = ch04.sliding_window_block_mask(tokens, WINDOW, BLOCK_SIZE).to(device)
        return lambda: ch04.block_sparse_attention(query, key, value, block_mask, BLOCK_SIZE)
    if design == "window-banded":
        return lambda: fast.banded_causal_attention(query, key, value, WINDOW, BLOCK_SIZE)
    return lambda: ch04.linear_attention_chunked(query, key, value, chunk_size=CHUNK_SIZE)


def measure_prefill(design: str, tokens: int, *, device, threads, min_run_time: float = 0.2) -> dict:
    """Return the timed record of one prefill of `design` at n = `tokens` (fields: RECORD_FIELDS)."""
    step = prefill_case(design, tokens, device=device)
    timing = time_call(step, threads=threads, min_run_time=min_run_time,
                       slow_repeats=3 if design == "full-teaching" else 5)
    measure_memory = design in MEMORY_DESIGNS and tokens <= MEMORY_LIMIT and device.type == "cpu"
    return {"design": design, "tokens": tokens, "seconds": timing["seconds"], "runs": timing["runs"],
            "flops": prefill_flops(design, tokens),
            "extra_bytes": peak_extra_bytes(step) if measure_memory else None,
            "score_bytes": HEADS * tokens * tokens * 4,  # the float32 n x n scores of every head
            "note": DESIGN_NOTES[design]}


def run_prefill(token_counts, designs=DESIGNS, *, device, threads, progress, min_run_time: float = 0.2) -> list[dict]:
    """Return prefill records for every design at every n (the teaching versions stop at RUN_LIMIT)."""
    records = []
    for tokens in token_counts:
        for design in designs:
            if tokens > RUN_LIMIT.get(design, tokens):
                continue
            try:
                record = measure_prefill(design, tokens, device=device, threads=threads, min_run_time=min_run_time)
            except RuntimeError as error:  # a teaching version that assumes CPU tensors, on an accelerator
                if device.type == "cpu":
                    raise
                progress(f"prefill {design} n={tokens}: skipped on {device.type} ({error})")
                continue
            records.append(record)
            progress(f"prefill {design:18s} n={tokens:6d}: {record['seconds'] * 1e3:9.2f} ms")
    return records


def crossovers(records: list[dict], slow: str, fast_design: str) -> int | None:
    """Return the smallest n from which `fast_design` is faster than `slow` at every measured n, or None."""
    times = {}
    for record in records:
        times.setdefault(record["tokens"], {})[record["design"]] = record["seconds"]
    common = sorted(n for n, row in times.items() if slow in row and fast_design in row)
    winning = [times[n][fast_design] < times[n][slow] for n in common]
    for index, n in enumerate(common):
        if all(winning[index:]):
            return n
    return None
