"""Chapter 10's ring attention and sharded decode on gloo processes: agreement with full attention, bytes
held and sent, and the overlap condition (a block's compute time against its transfer time)."""

from __future__ import annotations

import statistics
import time

import torch
from longctx import ch01
from longctx.support import time_call

RECORD_FIELDS = ("parts", "tokens", "heads", "head_dim", "max_abs_diff", "cache_bytes_per_rank",
                 "total_cache_bytes", "bytes_sent_per_rank", "formula_bytes_sent_per_step", "wall_seconds",
                 "block_bytes", "block_compute_seconds", "block_wait_seconds")
SHARDED_FIELDS = ("parts", "tokens", "query_heads", "kv_heads", "head_dim", "max_abs_diff", "bytes_per_step",
                  "ring_bytes_per_step", "cache_bytes", "repeats", "step_seconds", "compute_seconds",
                  "one_process_seconds")
SHARDED_REPEATS = 20  # steps each sharded run times, after a barrier each
LATENCY_BYTES = 4  # the message that measures the link's per-message time
LATENCY_REPEATS = 50


def measure_ring(parts: int, tokens: int, *, heads: int = 4, head_dim: int = 64, seed: int = 0) -> dict:
    """Return one ring-attention run's record: max |ring - full|, bytes held and sent, block times.

    `block_compute_seconds` is the median, over the steps that post a transfer and compute a block
    (one not wholly in the rank's future), of the time the rank spent on that block;
    `block_wait_seconds` the median time it then still waited for the transfer.
    """
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
    busy = [(rank, step) for rank in range(parts) for step in range(parts - 1)
            if (rank - step) % parts <= rank]  # a transfer in flight and a block to compute
    compute = [result.compute_seconds[r][s] for r, s in busy]
    wait = [result.wait_seconds[r][s] for r, s in busy]
    return {"parts": parts, "tokens": tokens, "heads": heads, "head_dim": head_dim,
            "max_abs_diff": float((result.output - full).abs().max()),
            "cache_bytes_per_rank": result.cache_bytes_per_rank, "total_cache_bytes": result.total_cache_bytes,
            "bytes_sent_per_rank": result.bytes_sent_per_rank,
            "formula_bytes_sent_per_step": [(stop - start_) * per_token for start_, stop in result.bounds],
            "wall_seconds": wall, "block_bytes": result.cache_bytes_per_rank[0],
            "block_compute_seconds": statistics.median(compute) if compute else None,
            "block_wait_seconds": statistics.median(wait) if wait else None}


def measure_sharded(parts: int, tokens: int, *, query_heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                    seed: int = 0, repeats: int = SHARDED_REPEATS) -> dict:
    """Return one sharded decode step's record: max |sharded - dense|, bytes per step beside a ring's, and
    its times: rank 0's median step (barrier to merged output), each rank's median compute, and the same
    step in one process on one thread, as each rank runs (the whole cache as one chunk)."""
    from longctx import ch05

    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, query_heads, 1, head_dim, generator=generator)
    key, value = (torch.randn(1, kv_heads, tokens, head_dim, generator=generator) for _ in "kv")
    output, sent, seconds = ch05.sharded_decode(query, key, value, parts, repeats=repeats)
    cache = key.nbytes + value.nbytes
    alone = time_call(lambda: ch05.split_kv_decode(query, key, value, chunk=tokens), threads=1,
                      min_run_time=0.2)
    return {"parts": parts, "tokens": tokens, "query_heads": query_heads, "kv_heads": kv_heads,
            "head_dim": head_dim,
            "max_abs_diff": float((output - ch05.decode_reference(query, key, value)).abs().max()),
            "bytes_per_step": sum(sum(row) for row in sent),
            "ring_bytes_per_step": (parts - 1) * cache // parts,  # one rank, one pass: P - 1 blocks
            "cache_bytes": cache, "repeats": repeats, "step_seconds": seconds[0][0],
            "compute_seconds": [row[1] for row in seconds], "one_process_seconds": alone["seconds"]}


def run_ring(parts_list, tokens: int, *, progress, overlap_tokens: int | None = None,
             sharded_tokens: int = 8192) -> dict:
    """Return the ring records for each P, the overlap runs, the link bandwidth and the sharded steps."""
    from longctx import ch05

    records = []
    for parts in parts_list:
        record = measure_ring(parts, tokens)
        records.append(record)
        progress(f"ring P={parts} T={tokens}: max |ring - full| = {record['max_abs_diff']:.2e}, "
                 f"cache per rank {[b // 1024 for b in record['cache_bytes_per_rank']]} KiB, "
                 f"{record['wall_seconds']:.1f} s with process start-up")
    overlap = []
    for parts in [p for p in parts_list if p > 1]:
        record = measure_ring(parts, overlap_tokens or tokens)
        overlap.append(record)
        progress(f"ring overlap P={parts} T={record['tokens']}: block {record['block_bytes'] / 2**20:.1f} MiB, "
                 f"compute {record['block_compute_seconds'] * 1e3:.2f} ms, wait {record['block_wait_seconds'] * 1e3:.2f} ms")
    block = overlap[0]["block_bytes"] if overlap else 2**20
    block_seconds = ch05.link_seconds(block)
    latency = ch05.link_seconds(LATENCY_BYTES, repeats=LATENCY_REPEATS)  # a message that is all latency
    link = block / (block_seconds - latency) if block_seconds > latency else block / block_seconds
    progress(f"gloo link: {block / block_seconds / 1e9:.2f} GB/s for a {block / 2**20:.1f} MiB block; "
             f"latency {latency * 1e6:.0f} us ({LATENCY_BYTES} bytes); {link / 1e9:.2f} GB/s beyond it")
    sharded = []
    for parts in [p for p in parts_list if p > 1]:
        record = measure_sharded(parts, sharded_tokens)
        sharded.append(record)
        progress(f"sharded decode P={parts} T={sharded_tokens}: max diff {record['max_abs_diff']:.1e}, "
                 f"{record['bytes_per_step']} bytes a step against {record['ring_bytes_per_step']} for a ring; "
                 f"step {record['step_seconds'] * 1e3:.2f} ms, slowest rank's compute "
                 f"{max(record['compute_seconds']) * 1e3:.2f} ms, one process {record['one_process_seconds'] * 1e3:.2f} ms")
    return {"runs": records, "overlap": overlap, "link_bytes_per_s": link, "link_block_bytes": block,
            "link_block_seconds": block_seconds, "link_latency_seconds": latency,
            "link_latency_bytes": LATENCY_BYTES, "sharded": sharded}
