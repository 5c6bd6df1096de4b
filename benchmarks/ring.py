"""Ring attention (Chapter 5) on gloo processes: agreement with full attention, bytes held and sent."""

from __future__ import annotations

import time

import torch
from longctx import ch01

RECORD_FIELDS = ("parts", "tokens", "heads", "head_dim", "max_abs_diff", "cache_bytes_per_rank",
                 "total_cache_bytes", "bytes_sent_per_rank", "formula_bytes_sent_per_step", "wall_seconds")


def measure_ring(parts: int, tokens: int, *, heads: int = 4, head_dim: int = 64, seed: int = 0) -> dict:
    """Return one ring-attention run's record: max |ring - full|, cache bytes per rank and bytes sent."""
    from longctx import ch05  # the chapter's saved code; imported late so the rest runs without it

    if not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts (P) must be an integer >= 1 (got {parts!r})")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(1, heads, tokens, head_dim, generator=generator) for _ in range(3))
    full = ch01.scaled_dot_product_attention(query, key, value, ch01.causal_mask(tokens))[0]
    start = time.perf_counter()
    result = ch05.ring_attention(query, key, value, parts)
    wall = time.perf_counter() - start
    per_token = 2 * heads * head_dim * query.element_size()  # one key and one value row
    return {"parts": parts, "tokens": tokens, "heads": heads, "head_dim": head_dim,
            "max_abs_diff": float((result.output - full).abs().max()),
            "cache_bytes_per_rank": result.cache_bytes_per_rank, "total_cache_bytes": result.total_cache_bytes,
            "bytes_sent_per_rank": result.bytes_sent_per_rank,
            "formula_bytes_sent_per_step": [(stop - start_) * per_token for start_, stop in result.bounds],
            "wall_seconds": wall}


def run_ring(parts_list, tokens: int, *, progress) -> list[dict]:
    """Return ring records for each P in `parts_list`."""
    records = []
    for parts in parts_list:
        record = measure_ring(parts, tokens)
        records.append(record)
        progress(f"ring P={parts} T={tokens}: max |ring - full| = {record['max_abs_diff']:.2e}, "
                 f"cache per rank {[b // 1024 for b in record['cache_bytes_per_rank']]} KiB, "
                 f"{record['wall_seconds']:.1f} s with process start-up")
    return records
