"""Chapter 13's paged cache: the paged decode step against the contiguous one, and prefill over a cached prefix.

Decode: one step of the GQA-8 shape Chapter 10 times (32 query heads over 8 KV heads, d = 128, float32)
against T cached tokens, in interleaved rounds: Chapter 10's split-KV step on a contiguous cache with
the page as its chunk (``contiguous``); ``ch08.paged_decode`` on the same keys and values scattered
over a pool of pages through a shuffled block table, each page read where it lies (``paged``); and
the copy of those pages, in table order, into one block (``gather``): what a step that gathered
before computing would pay on top of the contiguous one. The lengths are timed at one page size, and
one length at several. Every contender rotates through distinct copies of its cache that together
fill at least four times the last-level cache (``cold_copies``), so each call reads its cache
from memory.

Prefill: a TinyGPT (Chapter 2's model; its attention through torch's fused kernel, so that the
timings are not those of the score matrix) reads a prompt whole, or reads only the last tokens of it
over a cache that already holds the rest. The chapter fits these times and prices the prefixes a
radix cache finds on its multi-turn trace.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from longctx import ch02, ch05, ch08
from longctx.support.measure import attention_flops, cold_copies, interleaved, ratio

from . import decode

QUERY_HEADS, KV_HEADS, HEAD_DIM = decode.QUERY_HEADS, decode.GQA_KV_HEADS, decode.HEAD_DIM
PREFILL_MODEL = {"vocab_size": 256, "context_length": 4096, "d_model": 256, "layers": 4, "heads": 4}

FULL = {
    "tokens": [4096, 8192, 16384, 32768, 65536],
    "page_size": 512,  # Chapter 10's chunk: the contiguous step is then Chapter 10's own
    "sweep_tokens": 32768,
    "sweep_page_sizes": [64, 128, 256, 512, 1024, 2048],
    "rounds": 7,
    "min_run_time": 0.05,
    "prefill_model": PREFILL_MODEL,
    "prefill_whole": [256, 512, 1024, 2048, 4096],
    "prefill_new": 256,
    "prefill_cached": [768, 1792, 3840],
    "prefill_rounds": 5,
}
QUICK = {
    "tokens": [4096, 16384],
    "page_size": 512,
    "sweep_tokens": 8192,
    "sweep_page_sizes": [128, 1024],
    "rounds": 3,
    "min_run_time": 0.02,
    "prefill_model": PREFILL_MODEL | {"context_length": 1024},
    "prefill_whole": [256, 1024],
    "prefill_new": 128,
    "prefill_cached": [384, 896],
    "prefill_rounds": 3,
}


def rotating(step, caches):
    """Return a zero-argument call of ``step`` that takes the next cache of ``caches`` each time."""
    turn = itertools.cycle(caches)
    return lambda: step(*next(turn))


def decode_contenders(tokens: int, page_size: int, *, seed: int = 0) -> tuple[dict, dict]:
    """Return the timed calls at T = ``tokens`` and what they read: contiguous, paged and gather.

    Each pool holds exactly the sequence's pages, in the order of a random permutation, so that no
    two neighbouring pages of the sequence are neighbours in memory.
    """
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, QUERY_HEADS, 1, HEAD_DIM, generator=generator)
    pages = tokens // page_size  # the lengths timed are whole pages
    shape = (1, KV_HEADS, tokens, HEAD_DIM)
    cache_bytes = 2 * KV_HEADS * tokens * HEAD_DIM * 4
    copies = cold_copies(cache_bytes, True)
    contiguous = [tuple(decode._randn(*shape, generator=generator, device=torch.device("cpu")) for _ in "kv")
                  for _ in range(copies)]
    table = torch.randperm(pages, generator=generator)
    pools = []
    for key, value in contiguous:  # the same numbers, scattered: logical page i lives at table[i]
        pooled = []
        for cache in (key, value):
            pool = torch.empty(pages, KV_HEADS, page_size, HEAD_DIM)
            pool[table] = cache[0].view(KV_HEADS, pages, page_size, HEAD_DIM).transpose(0, 1)
            pooled.append(pool)
        pools.append(tuple(pooled))
    targets = [torch.empty(pages, KV_HEADS, page_size, HEAD_DIM) for _ in "kv"]  # the gather's, reused
    pages_in_order = table.tolist()

    def gather(key_pages, value_pages):
        return (torch.index_select(key_pages, 0, table, out=targets[0]),
                torch.index_select(value_pages, 0, table, out=targets[1]))

    calls = {
        "contiguous": rotating(lambda k, v: ch05.split_kv_decode(query, k, v, chunk=page_size), contiguous),
        "paged": rotating(lambda k, v: ch08.paged_decode(query, k, v, [pages_in_order], [tokens]), pools),
        "gather": rotating(gather, pools),
    }
    gap = (ch08.paged_decode(query, *pools[0], [pages_in_order], [tokens])
           - ch05.split_kv_decode(query, *contiguous[0], chunk=page_size)).abs().max().item()
    facts = {"tokens": tokens, "page_size": page_size, "pages": pages, "copies": copies,
             "cache_bytes": cache_bytes, "flops": attention_flops(QUERY_HEADS, tokens, HEAD_DIM),
             "paged_minus_contiguous": gap}
    return calls, facts


def time_decode(tokens: int, page_size: int, settings: dict, threads: int) -> dict:
    """Return one case's record: seconds per round of each contender, and the ratios the chapter reads."""
    calls, facts = decode_contenders(tokens, page_size)
    seconds = interleaved(calls, rounds=settings["rounds"], threads=threads, min_run_time=settings["min_run_time"])
    return facts | {"seconds": seconds,
                    "paged_over_contiguous": ratio(seconds, "paged", "contiguous"),
                    "gather_over_contiguous": ratio(seconds, "gather", "contiguous")}


class FusedCache(ch02.KVCache):
    """Chapter 2's cache, attending through torch's fused kernel instead of the teaching attention.

    A whole prompt uses the causal kernel; new tokens over a cached prefix pass Chapter 2's shifted
    causal mask (each new query sees every cached key and the new keys up to its own).
    """

    def attend(self, layer, query, key, value):
        key, value = self.append(layer, key, value)
        past, new = key.shape[2] - query.shape[2], query.shape[2]
        if past == 0:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True)
        mask = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask)


def prefill_model(sizes: dict) -> ch02.TinyGPT:
    torch.manual_seed(0)
    return ch02.TinyGPT(ch02.GPTConfig(**sizes)).eval()


def cached_prefix(model: ch02.TinyGPT, tokens: torch.Tensor) -> FusedCache:
    """Return a cache that holds the keys and values of ``tokens`` (1, P)."""
    cache = fused_cache(model)
    with torch.no_grad():
        model(tokens, cache)
    return cache


def fused_cache(model: ch02.TinyGPT, keys=None, values=None) -> FusedCache:
    """Return an empty FusedCache for ``model``, or one that starts from the given keys and values."""
    c = model.config
    cache = FusedCache(c.layers, 1, c.heads, c.head_dim)
    if keys is not None:
        cache.keys, cache.values = list(keys), list(values)  # append concatenates: these stay as they are
    return cache


def time_prefill(settings: dict, threads: int, progress) -> dict:
    """Return the prefill timings: whole prompts of each length, and new tokens over each cached prefix."""
    model = prefill_model(settings["prefill_model"])
    generator = torch.Generator().manual_seed(1)
    vocab, new = settings["prefill_model"]["vocab_size"], settings["prefill_new"]
    calls, points = {}, {}
    for tokens in settings["prefill_whole"]:
        prompt = torch.randint(vocab, (1, tokens), generator=generator)
        calls[f"whole {tokens}"] = lambda p=prompt: model(p, fused_cache(model))
        points[f"whole {tokens}"] = {"cached": 0, "new": tokens}
    for cached in settings["prefill_cached"]:
        prompt = torch.randint(vocab, (1, cached + new), generator=generator)
        prefix = cached_prefix(model, prompt[:, :cached])
        per_copy = prefix.nbytes()
        copies = cold_copies(per_copy, True)
        held = [([k.clone() for k in prefix.keys], [v.clone() for v in prefix.values]) for _ in range(copies)]
        turn = itertools.cycle(held)

        def over_prefix(p=prompt[:, cached:], turn=turn):
            keys, values = next(turn)
            return model(p, fused_cache(model, keys, values))

        calls[f"over {cached}"] = over_prefix
        calls[f"whole {cached + new}"] = lambda p=prompt: model(p, fused_cache(model))
        points[f"over {cached}"] = {"cached": cached, "new": new}
        points[f"whole {cached + new}"] = {"cached": 0, "new": cached + new}
    with torch.no_grad():
        seconds = interleaved(calls, rounds=settings["prefill_rounds"], threads=threads,
                              min_run_time=settings["min_run_time"])
    progress(f"paged: prefill, {len(calls)} prompts, {settings['prefill_rounds']} rounds")
    savings = [ratio(seconds, f"over {cached}", f"whole {cached + new}") for cached in settings["prefill_cached"]]
    parameters = sum(p.numel() for p in model.parameters())
    return {"model": settings["prefill_model"], "parameters": parameters, "attention": "torch SDPA (fused)",
            "points": [points[name] | {"name": name, "seconds": seconds[name]} for name in calls],
            "over_prefix_ratios": savings}


def run(settings: dict, *, threads: int, progress) -> dict:
    """Return the paged part: decode at each length and at each page size, then the prefill timings."""
    results = {"query_heads": QUERY_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "float32",
               "decode": [], "sweep": []}
    for tokens in settings["tokens"]:
        record = time_decode(tokens, settings["page_size"], settings, threads)
        results["decode"].append(record)
        progress(f"paged: T={tokens:6d} paged/contiguous {record['paged_over_contiguous']['ratio']:.2f}, "
                 f"gather/contiguous {record['gather_over_contiguous']['ratio']:.2f} ({record['copies']} copies)")
    for page_size in settings["sweep_page_sizes"]:
        record = next((r for r in results["decode"] if (r["tokens"], r["page_size"])
                       == (settings["sweep_tokens"], page_size)), None)  # timed already
        record = record or time_decode(settings["sweep_tokens"], page_size, settings, threads)
        results["sweep"].append(record)
        progress(f"paged: P={page_size:4d} at T={settings['sweep_tokens']} paged/contiguous "
                 f"{record['paged_over_contiguous']['ratio']:.2f}")
    results["prefill"] = time_prefill(settings, threads, progress)
    return results
