"""Bytes each cache holds after T tokens: tensor sizes, process memory growth, and the formula."""

from __future__ import annotations

import torch
from longctx import ch02, ch03, ch05

from .common import release_memory, rss_bytes
from .decode import GQA_KV_HEADS, HEAD_DIM, LATENT_RANK, QUERY_HEADS, WINDOW

DESIGNS = ("mha", "gqa8", "mqa", "latent", "window-4k", "int8", "int4")
RECORD_FIELDS = ("design", "tokens", "tensor_bytes", "rss_growth_bytes", "formula_bytes", "formula")


def _kv_config(name: str, bytes_per_scalar: int = 4, **fields):
    """Return a one-layer ch03.KVConfig of the benchmark's shape (32 query heads of width 128)."""
    return ch03.KVConfig(name, layers=1, query_heads=QUERY_HEADS, head_dim=HEAD_DIM,
                         bytes_per_scalar=bytes_per_scalar, **fields)


def formula_bytes(design: str, tokens: int) -> tuple[int, str]:
    """Return (bytes, how) the formula predicts for one layer's cache of `design` after `tokens` tokens.

    Full-precision designs use ch03.kv_bytes (float32, one layer); the window caps T at W; the latent
    cache stores r numbers per token; quantised caches store codes plus one float32 scale per token and head.
    """
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; choose one of {', '.join(DESIGNS)}")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")
    if design in ("mha", "gqa8", "mqa"):
        heads = {"mha": QUERY_HEADS, "gqa8": GQA_KV_HEADS, "mqa": 1}[design]
        return ch03.kv_bytes(_kv_config(design, kv_heads=heads), tokens), "ch03.kv_bytes"
    if design == "window-4k":
        config = _kv_config(design, kv_heads=GQA_KV_HEADS, window=WINDOW, windowed_layers=1)
        return ch03.kv_bytes(config, tokens), "ch03.kv_bytes with a window"
    if design == "latent":
        return ch03.kv_bytes(_kv_config(design, latent_rank=LATENT_RANK), tokens), "ch03.kv_bytes, latent"
    bits = 8 if design == "int8" else 4
    codes = ch03.kv_bytes(_kv_config(design, kv_heads=GQA_KV_HEADS), tokens) * bits // 32  # s = bits/8
    scales = 2 * GQA_KV_HEADS * tokens * 4  # one float32 scale per token, head, key or value
    return codes + scales, "ch03.kv_bytes at s = bits/8, plus float32 scales"


WRITE_CHUNK = 1024  # tokens written per step of the fill; bounds the temporaries


def build_cache(design: str, tokens: int, *, device, seed: int = 0) -> list[torch.Tensor]:
    """Return the tensors that make up `design`'s cache after `tokens` tokens have been written.

    Each cache is allocated at its final size and filled WRITE_CHUNK tokens at a time (a quantised
    cache quantises each chunk as it arrives), so no full-precision copy of a compressed cache exists.
    A window cache keeps the last W tokens in a rolling buffer of W slots.
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    kv_heads = {"mha": QUERY_HEADS, "mqa": 1}.get(design, GQA_KV_HEADS)
    if design == "latent":
        latent = torch.empty(1, tokens, LATENT_RANK, device=device)
        for start in range(0, tokens, WRITE_CHUNK):
            latent[:, start:start + WRITE_CHUNK].normal_(generator=generator)
        return [latent]
    slots = min(tokens, WINDOW) if design == "window-4k" else tokens
    if design in ("int8", "int4"):
        width = HEAD_DIM if design == "int8" else HEAD_DIM // 2
        dtype = torch.int8 if design == "int8" else torch.uint8
        tensors = [torch.empty(1, kv_heads, slots, width, dtype=dtype, device=device),
                   torch.empty(1, kv_heads, slots, 1, device=device)]
        tensors += [torch.empty_like(tensors[0]), torch.empty_like(tensors[1])]
    else:
        tensors = [torch.empty(1, kv_heads, slots, HEAD_DIM, device=device) for _ in "kv"]
    for start in range(0, tokens, WRITE_CHUNK):
        stop = min(start + WRITE_CHUNK, tokens)
        where = slice(start % slots, (start % slots) + (stop - start))  # rolling buffer for the window
        if design in ("int8", "int4"):
            for codes_at, scale_at in ((0, 1), (2, 3)):
                chunk = torch.randn(1, kv_heads, stop - start, HEAD_DIM, generator=generator, device=device)
                codes, scale = ch02.quantize(chunk, 8 if design == "int8" else 4)
                tensors[codes_at][:, :, where] = codes if design == "int8" else ch05.pack_codes(codes, 4)
                tensors[scale_at][:, :, where] = scale
        else:
            for tensor in tensors:
                tensor[:, :, where].normal_(generator=generator)
    return tensors


def measure_memory(design: str, tokens: int, *, device) -> dict:
    """Return tensor bytes, RSS growth (None where unreadable or on a GPU) and the formula for one cache."""
    formula, how = formula_bytes(design, tokens)
    release_memory(device)
    before = rss_bytes() if device.type == "cpu" else None
    tensors = build_cache(design, tokens, device=device)
    release_memory(device)
    after = rss_bytes() if device.type == "cpu" else None
    if device.type == "cuda":
        growth = None
    else:
        growth = None if before is None or after is None else after - before
    record = {"design": design, "tokens": tokens, "tensor_bytes": sum(t.nbytes for t in tensors),
              "rss_growth_bytes": growth, "formula_bytes": formula, "formula": how}
    del tensors
    release_memory(device)
    return record


def run_memory(token_counts, designs=DESIGNS, *, device, progress) -> list[dict]:
    """Return memory records for every design at every T."""
    records = []
    for tokens in token_counts:
        for design in designs:
            record = measure_memory(design, tokens, device=device)
            records.append(record)
            growth = record["rss_growth_bytes"]
            progress(f"memory {design:10s} T={tokens:6d}: tensors {record['tensor_bytes'] / 2**20:9.2f} MiB, "
                     f"formula {record['formula_bytes'] / 2**20:9.2f} MiB, RSS growth "
                     + ("n/a" if growth is None else f"{growth / 2**20:9.2f} MiB"))
    return records
