"""Chapter 13, part ``step``: one Llama-3.1-8B-shaped layer's step, weights against cache.

``decode`` rows: at each batch B and length T, three contenders timed in interleaved rounds
(``measure.interleaved``): the weight products alone (``ch08.project_qkv`` and ``ch08.finish_layer``,
everything of the step but attention), attention alone (``ch05.split_kv_decode`` over the caches)
and the whole step (``ch08.decode_step``), in float32 and in bfloat16 (weights, activations and
cache alike). A (B, T) whose cache would pass ``max_cache_bytes`` is recorded unmeasured, with its
bytes, for the chapter to scale. ``mixed`` rows: steps that read a prompt chunk of n tokens after a
prefix of P (``ch08.prefill_chunk``) beside B decode rows over caches of T tokens
(``ch08.mixed_step``), timed one by one, for the chunked-prefill cost model.

Every timed call reads weights and caches that are cold: each is rotated through distinct copies
that together fill ``COLD_FACTOR`` times the last-level cache (``cold_copies``).
"""

from __future__ import annotations

import itertools
import statistics

import torch
from longctx import ch03, ch05, ch08
from longctx.support import time_call
from longctx.support.measure import attention_flops, cold_copies, interleaved, ratio

from . import decode

FULL = {
    "config": "llama-3.1-8b",
    "shape": None,  # None: the config's layer; else LayerShape fields (tests use a tiny one)
    "dtypes": ["float32", "bfloat16"],
    "batches": [1, 8, 64],
    "lengths": [1024, 4096, 16384, 65536],
    "max_cache_bytes": 2**31,  # per copy: 2 GiB (B T <= 256K tokens in float32, 512K in bfloat16)
    "rounds": 5,
    "min_run_time": 0.05,
    "mixed_dtype": "bfloat16",
    # (prompt chunk n, its prefix P, decode rows B, their cache length T)
    "mixed": [[256, 0, 0, 0], [512, 0, 0, 0], [256, 8192, 0, 0], [256, 16384, 0, 0],
              [256, 0, 16, 4096], [256, 4096, 64, 4096], [128, 0, 64, 1024], [128, 2048, 4, 65536]],
    "mixed_repeats": 1,
}
QUICK = {
    "config": "llama-3.1-8b",
    "shape": None,
    "dtypes": ["float32", "bfloat16"],
    "batches": [1, 16],
    "lengths": [1024, 4096],
    "max_cache_bytes": 2**28,
    "rounds": 3,
    "min_run_time": 0.02,
    "mixed_dtype": "bfloat16",
    "mixed": [[128, 0, 0, 0], [128, 1024, 4, 1024]],
    "mixed_repeats": 1,
}


def layer_of(settings: dict) -> ch08.LayerShape:
    """Return the layer the settings name: the config's, or the fields given under "shape"."""
    if settings.get("shape"):
        return ch08.LayerShape(**settings["shape"])
    return ch08.layer_shape(ch03.load_model_config(settings["config"]))


def cache_bytes(shape: ch08.LayerShape, batch: int, tokens: int, dtype: str) -> int:
    """Return the bytes of one layer's keys and values for `batch` sequences of `tokens`."""
    scalar = torch.empty((), dtype=ch08.LAYER_DTYPES[dtype]).element_size()
    return 2 * batch * shape.kv_heads * tokens * shape.head_dim * scalar


def weight_flops(weights: ch08.LayerWeights, rows: int) -> int:
    """Return the multiply-adds x 2 of the layer's seven matrices on `rows` rows."""
    return 2 * rows * sum(w.numel() for w in weights if w.dim() == 2)


def rotating(build, copies: int):
    """Return a zero-argument function giving the next of `copies` distinct results of build()."""
    return itertools.cycle([build() for _ in range(copies)]).__next__


def weight_copies(weights: ch08.LayerWeights):
    """Return a function giving the next of enough copies of the weights to be cold."""
    copies = cold_copies(weights.nbytes, True)
    return rotating(lambda: ch08.LayerWeights(*(w.clone() for w in weights)), copies), copies


def cache_copies(shape, batch, tokens, dtype, seed):
    """Return a function giving the next (keys, values) of enough distinct caches to be cold."""
    generator = torch.Generator().manual_seed(seed)
    keys, values = (decode._randn(batch, shape.kv_heads, tokens, shape.head_dim, generator=generator,
                                  device=torch.device("cpu")).to(ch08.LAYER_DTYPES[dtype]) for _ in "kv")
    copies = cold_copies(keys.nbytes + values.nbytes, True)
    made = iter([(keys, values)] + [(keys.clone(), values.clone()) for _ in range(copies - 1)])
    return rotating(lambda: next(made), copies), copies


def measure_batch(shape, weights, next_weights, batch, lengths, dtype, *, threads, rounds,
                  min_run_time) -> list[dict]:
    """Return the rows of one batch size, one per length in `lengths`.

    One set of interleaved rounds holds the weights alone (once: they do not depend on T) and,
    for every length, attention alone and the whole step, so each round's attention and step
    at one length, and the weights, are timed side by side.
    """
    generator = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 1, shape.d_model, generator=generator).to(ch08.LAYER_DTYPES[dtype])
    query = ch08.project_qkv(x, weights, shape)[0]  # (B, H_q, 1, d_h)

    def weights_alone():
        w = next_weights()
        return ch08.finish_layer(x, ch08.project_qkv(x, w, shape)[0], w, shape)

    functions, copies = {"weights": weights_alone}, {}
    for tokens in lengths:
        next_cache, copies[tokens] = cache_copies(shape, batch, tokens, dtype, seed=tokens + batch)
        functions[f"attention {tokens}"] = lambda c=next_cache: ch05.split_kv_decode(query, *c())
        functions[f"step {tokens}"] = lambda c=next_cache: ch08.decode_step(x, next_weights(), *c(), shape)
    seconds = interleaved(functions, rounds=rounds, threads=threads, min_run_time=min_run_time)
    rows = []
    for tokens in lengths:
        times = {"weights": seconds["weights"], "attention": seconds[f"attention {tokens}"],
                 "step": seconds[f"step {tokens}"]}
        parts = {"weights+attention": [w + a for w, a in zip(times["weights"], times["attention"], strict=True)],
                 "step": times["step"]}
        rows.append({"dtype": dtype, "batch": batch, "tokens": tokens, "measured": True,
                     **counts(shape, weights, batch, tokens, dtype), "cache_copies": copies[tokens],
                     "seconds": times, "median": {name: statistics.median(t) for name, t in times.items()},
                     "attention_share": ratio(times, "attention", "step"),
                     "parts_over_step": ratio(parts, "weights+attention", "step")})
    return rows


def counts(shape, weights, batch, tokens, dtype) -> dict:
    """Return what a (B, T) step must read (weights, cache) and the FLOPs of its two parts."""
    return {"cache_bytes": cache_bytes(shape, batch, tokens, dtype), "weights_bytes": weights.nbytes,
            "weights_flops": weight_flops(weights, batch),
            "attention_flops": attention_flops(shape.query_heads, tokens, shape.head_dim) * batch}


def measure_mixed(shape, weights, next_weights, point, dtype, *, threads, repeats) -> dict:
    """Return one mixed step's time: a chunk of n prompt tokens after P, beside B decode rows of T."""
    prompt, prefix, batch, tokens = point
    kind = ch08.LAYER_DTYPES[dtype]
    generator = torch.Generator().manual_seed(prompt + prefix + batch + tokens)
    chunk = torch.randn(1, prompt, shape.d_model, generator=generator).to(kind)
    x = torch.randn(batch, 1, shape.d_model, generator=generator).to(kind)
    next_prefix, _ = cache_copies(shape, 1, prefix + prompt, dtype, seed=prefix + prompt) if prompt else (None, 0)
    next_cache, _ = cache_copies(shape, batch, tokens, dtype, seed=tokens + batch) if batch else (None, 0)
    if prompt and batch:
        def step():
            return ch08.mixed_step(chunk, *next_prefix(), x, *next_cache(), next_weights(), shape)
    elif prompt:
        def step():
            return ch08.prefill_chunk(chunk, next_weights(), *next_prefix(), shape)
    else:
        def step():
            return ch08.decode_step(x, next_weights(), *next_cache(), shape)
    timing = time_call(step, threads=threads, min_run_time=0.05, slow_repeats=repeats, min_blocks=1)
    return {"dtype": dtype, "prompt": prompt, "prefix": prefix, "batch": batch, "tokens": tokens,
            "rows": prompt + batch, "cached": batch * tokens, "pairs": ch08.chunk_pairs(prefix, prompt),
            "seconds": timing["seconds"], "runs": timing["runs"]}


def run(settings: dict, *, threads: int, progress) -> dict:
    """Return the decode grid and the mixed steps (module docstring), with the layer they ran."""
    shape = layer_of(settings)
    rows, mixed, weight_copy_counts = [], [], {}
    for dtype in settings["dtypes"]:
        weights = ch08.layer_weights(shape, dtype=dtype, seed=0)
        next_weights, weight_copy_counts[dtype] = weight_copies(weights)
        for batch in settings["batches"]:
            fits = [t for t in settings["lengths"]
                    if cache_bytes(shape, batch, t, dtype) <= settings["max_cache_bytes"]]
            rows += [{"dtype": dtype, "batch": batch, "tokens": t, "measured": False,
                      **counts(shape, weights, batch, t, dtype)} for t in settings["lengths"] if t not in fits]
            if not fits:
                continue
            for row in measure_batch(shape, weights, next_weights, batch, fits, dtype, threads=threads,
                                     rounds=settings["rounds"], min_run_time=settings["min_run_time"]):
                rows.append(row)
                progress(f"step {dtype:8s} B={batch:3d} T={row['tokens']:6d}: weights "
                         f"{row['median']['weights'] * 1e3:7.1f} ms, attention {row['median']['attention'] * 1e3:7.1f}"
                         f" ms, step {row['median']['step'] * 1e3:7.1f} ms (share {row['attention_share']['ratio']:.2f})")
        if dtype == settings["mixed_dtype"]:
            for point in settings["mixed"]:
                record = measure_mixed(shape, weights, next_weights, point, dtype, threads=threads,
                                       repeats=settings["mixed_repeats"])
                mixed.append(record)
                progress(f"mixed {dtype} n={point[0]} P={point[1]} B={point[2]} T={point[3]}: "
                         f"{record['seconds'] * 1e3:.1f} ms")
        del weights, next_weights
    return {"shape": shape._asdict(), "config": settings["config"], "weight_copies": weight_copy_counts,
            "decode": rows, "mixed": mixed}
