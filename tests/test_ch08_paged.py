"""Tests for Chapter 13's pages and shared prefixes (chapters/ch08-serving.qmd): the page pool's books,
the paged decode step against Chapter 10's contiguous one, copy-on-write, the radix tree of prefixes,
the serving replays and the benchmark's prefill stand-in."""

from __future__ import annotations

import collections
import itertools
import random

import pytest
import torch
from longctx import ch05, ch08


def balanced(pool: ch08.PagePool) -> bool:
    """Every page is free (listed once, counted zero) or held (counted once per table that holds it)."""
    held = collections.Counter(page for table in pool.tables.values() for page in table)
    free = collections.Counter(pool.free)
    for page in range(pool.pages):
        expected = (1, 0) if pool.references[page] == 0 else (0, pool.references[page])
        if (free[page], held[page]) != expected:
            return False
    return all(len(pool.tables[s]) == pool.pages_for(pool.lengths[s]) for s in pool.tables)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------------------------------ the pool


@pytest.mark.parametrize("seed", range(8))
def test_page_allocation_and_freeing_never_lose_or_double_a_page(seed):
    draw = random.Random(seed)
    pool = ch08.PagePool(48, draw.choice([1, 4, 16]))
    for _ in range(400):
        live = sorted(pool.tables)
        kind = draw.choice(["start", "grow", "grow", "fork", "end"] if live else ["start"])
        if kind == "start":
            pool.add(max(live, default=-1) + 1)
        elif kind == "fork":
            pool.fork(draw.choice(live), max(live) + 1)
        elif kind == "end":
            pool.remove(draw.choice(live))
        else:
            sequence, tokens = draw.choice(live), draw.randint(0, 30)
            before = (list(pool.free), {s: list(t) for s, t in pool.tables.items()}, dict(pool.lengths))
            try:
                pool.grow(sequence, tokens)
            except RuntimeError:  # refused: nothing may have changed
                assert before == (list(pool.free), pool.tables, pool.lengths)
        assert balanced(pool)
    for sequence in list(pool.tables):
        pool.remove(sequence)
    assert sorted(pool.free) == list(range(pool.pages)) and not any(pool.references)


def test_grow_hands_out_pages_in_order_and_refuses_a_full_pool():
    pool = ch08.PagePool(4, 8)
    pool.add(0)
    assert pool.grow(0, 17) == [] and pool.tables[0] == [0, 1, 2] and pool.lengths[0] == 17
    pool.add(1)
    with pytest.raises(RuntimeError, match="needs 2 pages; 1 are free"):
        pool.grow(1, 9)
    assert pool.tables[1] == [] and pool.free == [3]


def test_a_refused_grow_of_a_shared_last_page_changes_nothing():
    pool = ch08.PagePool(2, 4)
    pool.add(0)
    pool.grow(0, 6)  # pages 0 and 1, the last half full: the pool is full
    pool.fork(0, 1)
    with pytest.raises(RuntimeError):
        pool.grow(1, 1)  # would copy the shared last page
    assert pool.tables == {0: [0, 1], 1: [0, 1]} and pool.references == [2, 2]


# ------------------------------------------------------------------------------------------ the paged step


def paged_case(lengths, page_size, kv_heads, seed=0):
    """A PagedKVCache holding sequences of ``lengths``, written in interleaved pieces, and their own K, V."""
    pool = ch08.PagePool(sum(-(-n // page_size) for n in lengths) + 3, page_size)
    cache = ch08.PagedKVCache(pool, kv_heads, 8, dtype=torch.float64)
    keys = [randn(kv_heads, n, 8, seed=seed + 2 * i) for i, n in enumerate(lengths)]
    values = [randn(kv_heads, n, 8, seed=seed + 2 * i + 1) for i, n in enumerate(lengths)]
    for number in range(len(lengths)):
        pool.add(number)
    written = [0] * len(lengths)
    draw = random.Random(seed)
    while written != list(lengths):  # random pieces, sequences in turn: their pages interleave
        number = draw.choice([i for i, n in enumerate(lengths) if written[i] < n])
        piece = slice(written[number], min(lengths[number], written[number] + draw.randint(1, 2 * page_size)))
        cache.append(number, keys[number][:, piece], values[number][:, piece])
        written[number] = piece.stop
    return cache, keys, values


@pytest.mark.parametrize(("lengths", "page_size", "kv_heads"), [
    ([1, 4, 5, 31, 32, 33], 4, 2),  # exact pages, one token past, one short
    ([7, 100, 64], 16, 1),  # MQA
    ([50, 3], 1, 4),  # pages of one token: no partial page ever
    ([200], 64, 8),
])
def test_the_paged_step_equals_the_contiguous_split_kv_step(lengths, page_size, kv_heads):
    cache, keys, values = paged_case(lengths, page_size, kv_heads, seed=len(lengths))
    query = randn(len(lengths), 8, 1, 8, seed=99)
    got = cache.decode(query, list(range(len(lengths))))
    for b, (key, value) in enumerate(zip(keys, values, strict=True)):
        want = ch05.split_kv_decode(query[b:b + 1], key[None], value[None], chunk=page_size)
        assert torch.allclose(got[b:b + 1], want, atol=1e-12, rtol=0)
        reference = ch05.decode_reference(query[b:b + 1], key[None], value[None])
        assert torch.allclose(got[b:b + 1], reference, atol=1e-12, rtol=0)


def test_the_paged_step_reads_no_slot_past_a_sequence():
    cache, keys, values = paged_case([5], 8, 2)
    query = randn(1, 4, 1, 8, seed=3)
    before = cache.decode(query, [0])
    cache.keys[cache.pool.tables[0][0], :, 5:] = float("nan")  # the unwritten slots of the last page
    cache.values[cache.pool.tables[0][0], :, 5:] = float("nan")
    assert torch.equal(cache.decode(query, [0]), before)


def test_the_page_states_of_a_sequence_are_one_per_page():
    cache, _, _ = paged_case([37], 16, 2)
    rows = ch05.stacked_rows(randn(1, 4, 1, 8, seed=4), 2, None)
    state = ch08.page_states(rows, cache.keys, cache.values, cache.pool.tables[0], 37)
    assert state.running_max.shape == (3, 2, 1, 2, 1) and state.accumulator.shape == (3, 2, 1, 2, 8)


# ------------------------------------------------------------------------------------------ copy-on-write


def test_copy_on_write_leaves_a_shared_prefix_unchanged():
    cache, keys, values = paged_case([21], 8, 2)
    pool = cache.pool
    pool.fork(0, 1)
    shared = list(pool.tables[0])
    before = cache.keys[shared].clone(), cache.values[shared].clone()
    more = randn(2, 12, 8, seed=7), randn(2, 12, 8, seed=8)
    cache.append(1, *more)
    assert torch.equal(cache.keys[shared], before[0]) and torch.equal(cache.values[shared], before[1])
    assert pool.tables[0] == shared  # the parent's table is untouched
    assert pool.tables[1][:2] == shared[:2] and pool.tables[1][2] != shared[2]  # the partial page was copied
    assert [pool.references[p] for p in shared] == [2, 2, 1]
    query = randn(2, 4, 1, 8, seed=9)
    got = cache.decode(query, [0, 1])
    for b, (key, value) in enumerate([(keys[0], values[0]),
                                      (torch.cat([keys[0], more[0]], 1), torch.cat([values[0], more[1]], 1))]):
        want = ch05.split_kv_decode(query[b:b + 1], key[None], value[None], chunk=8)
        assert torch.allclose(got[b:b + 1], want, atol=1e-12, rtol=0)
    assert balanced(pool)


def test_a_fork_at_a_page_boundary_copies_nothing():
    pool = ch08.PagePool(8, 4)
    pool.add(0)
    pool.grow(0, 8)
    pool.fork(0, 1)
    assert pool.grow(1, 3) == [] and pool.tables[1][:2] == pool.tables[0]


# ------------------------------------------------------------------------------------------ the radix tree


def served(cache: ch08.RadixCache, sequence: int, tokens: tuple) -> None:
    """Serve ``tokens`` as one sequence on whatever prefix is cached, then cache it."""
    pool = cache.pool
    pages, hit = cache.match(tokens)
    pool.add(sequence, pages, hit)
    pool.grow(sequence, len(tokens) - hit)
    cache.insert(tokens, pool.tables[sequence])
    pool.remove(sequence)


def test_the_radix_tree_matches_the_longest_cached_prefix_in_whole_pages():
    pool = ch08.PagePool(32, 4)
    cache = ch08.RadixCache(pool)
    assert cache.match(tuple(range(10))) == ([], 0)
    first = tuple(range(14))  # three whole pages and two tokens
    served(cache, 0, first)
    assert cache.cached_pages == 3 and len(pool.free) == 32 - 3
    pages, hit = cache.match(first)
    assert hit == 12 and pages == pool_pages_of(cache, first[:12])
    other = tuple(range(8)) + (90, 91, 92, 93)  # agrees with the first for two pages
    assert cache.match(other) == (pages[:2], 8)
    # the match split the edge after two pages: one node of two pages, with the third below it
    (top,) = cache.root.children.values()
    assert len(top.pages) == 2 and [len(c.pages) for c in top.children.values()] == [1]
    assert cache.match(first[:7]) == (pages[:1], 4)  # a partial page never matches; it splits again
    (top,) = cache.root.children.values()
    assert len(top.pages) == 1 and cache.cached_pages == 3


def pool_pages_of(cache: ch08.RadixCache, tokens: tuple) -> list[int]:
    node, pages = cache.walk(tokens)
    return pages


def test_insertion_keeps_cached_pages_and_adds_only_the_new_ones():
    pool = ch08.PagePool(32, 4)
    cache = ch08.RadixCache(pool)
    served(cache, 0, tuple(range(8)))
    cached = cache.match(tuple(range(8)))[0]
    served(cache, 1, tuple(range(16)))
    pages, hit = cache.match(tuple(range(16)))
    assert hit == 16 and pages[:2] == cached and cache.cached_pages == 4
    assert all(pool.references[p] == 1 for p in pages)  # only the tree holds them now
    sibling = tuple(range(8)) + (50, 51, 52, 53)
    served(cache, 2, sibling)
    assert cache.cached_pages == 5 and cache.match(sibling)[1] == 12
    assert sorted(pool.free + [p for n in cache.nodes() for p in n.pages]) == list(range(32))


def test_eviction_drops_least_recently_used_unreferenced_leaves():
    pool = ch08.PagePool(32, 4)
    cache = ch08.RadixCache(pool)
    old, middle, new = ((k,) * 8 for k in (1, 2, 3))  # three unrelated prefixes of two pages
    for number, tokens in enumerate((old, middle, new)):
        served(cache, number, tokens)
    cache.match(old)  # now the oldest use is ``middle``
    pages, hit = cache.match(new)
    pool.add(9, pages, hit)  # a running sequence holds ``new``
    assert cache.evict(1) == 2  # a whole leaf goes: ``middle``
    assert cache.match(middle)[1] == 0 and cache.match(old)[1] == 8
    assert cache.evict(10) == 2  # ``old`` goes; ``new`` is held and stays
    assert cache.match(new)[1] == 8 and cache.cached_pages == 2
    pool.remove(9)
    assert cache.evict(10) == 2 and cache.cached_pages == 0 and len(pool.free) == 32


def test_eviction_climbs_to_a_parent_left_childless():
    pool = ch08.PagePool(32, 4)
    cache = ch08.RadixCache(pool)
    served(cache, 0, (1,) * 8 + (2,) * 4)
    served(cache, 1, (1,) * 8 + (3,) * 4)  # splits after two pages: a parent with two leaves
    assert cache.evict(5) == 4 and cache.cached_pages == 0


# ------------------------------------------------------------------------------------------ the replays


def test_pages_of_one_token_waste_nothing_and_the_longest_reservation_wastes_the_rest():
    trace = ch08.request_trace(30, seed=3, max_tokens=8_192)
    unlimited = 10**9
    paged = ch08.replay_memory(trace, unlimited, ch08.reserve_pages(1))
    assert paged["empty_share"] == 0 and paged["preemptions"] == 0
    exact = ch08.replay_memory(trace, unlimited, ch08.reserve_exact)
    assert exact["steps"] == paged["steps"] and 0 < exact["empty_share"] < 1
    longest = ch08.replay_memory(trace, unlimited, ch08.reserve_longest(8_192))
    held = paged["mean_running"] * paged["steps"]  # sequence-steps, the same for every layout here
    assert longest["mean_running"] * longest["steps"] == pytest.approx(held)


def test_a_tight_budget_queues_and_preempts_but_serves_every_request():
    trace = ch08.request_trace(40, seed=1, max_tokens=4_096, rate=50.0)
    budget = 4_096
    longest = ch08.replay_memory(trace, budget, ch08.reserve_longest(4_096))
    assert longest["peak_running"] == 1
    paged = ch08.replay_memory(trace, budget, ch08.reserve_pages(64))
    assert paged["peak_running"] > 1 and paged["preemptions"] > 0 and paged["steps"] < longest["steps"]


def test_a_budget_smaller_than_a_request_is_refused():
    trace = ch08.request_trace(4, seed=0, max_tokens=4_096)
    with pytest.raises(ValueError, match="budget"):
        ch08.replay_memory(trace, 100, ch08.reserve_longest(4_096))


def test_the_conversation_trace_builds_each_turn_on_the_last():
    turns = ch08.conversation_trace(12, seed=5, system_tokens=50, max_tokens=1_500)
    assert turns == ch08.conversation_trace(12, seed=5, system_tokens=50, max_tokens=1_500)
    assert [t.arrival for t in turns] == sorted(t.arrival for t in turns)
    system = turns[0].prompt[:50]
    by_chat = collections.defaultdict(list)
    for turn in turns:
        assert turn.prompt[:50] == system and len(turn.prompt) + len(turn.reply) <= 1_500
        by_chat[turn.conversation].append(turn)
    assert any(len(chat) > 1 for chat in by_chat.values())
    for chat in by_chat.values():
        for before, after in itertools.pairwise(chat):
            history = before.prompt + before.reply
            assert after.prompt[:len(history)] == history and len(after.prompt) > len(history)


def test_a_large_pool_finds_every_earlier_page_of_a_conversation():
    turns = ch08.conversation_trace(6, seed=2, system_tokens=40, max_tokens=1_000)
    found = ch08.serve_conversations(turns, 10_000, 1)
    seen: dict[int, int] = {}
    for turn, (prompt, hit) in zip(turns, found, strict=True):
        assert prompt == len(turn.prompt)
        if turn.conversation in seen:  # the whole history is cached, token by token
            assert hit == seen[turn.conversation]
        elif seen:  # another chat left the system prompt (and at most one token of its own, by chance)
            assert hit >= 40
        else:
            assert hit == 0
        seen[turn.conversation] = len(turn.prompt) + len(turn.reply)


def test_a_small_pool_finds_less_and_a_turn_larger_than_the_pool_is_refused():
    turns = ch08.conversation_trace(30, seed=4, system_tokens=200, max_tokens=1_200)
    rates = [sum(h for _, h in ch08.serve_conversations(turns, pages, 16)) for pages in (80, 400, 4_000)]
    assert rates[0] < rates[1] < rates[2]
    with pytest.raises(ValueError, match="pages"):
        ch08.serve_conversations(turns, 10, 16)


# ------------------------------------------------------------------------------------------ the benchmark's prefill


def test_the_benchmarks_fused_cache_gives_tinygpts_own_logits():
    from benchmarks import serving_paged

    sizes = {"vocab_size": 32, "context_length": 24, "d_model": 16, "layers": 2, "heads": 2}
    model = serving_paged.prefill_model(sizes)
    tokens = torch.randint(32, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(tokens)  # Chapter 2's teaching attention, no cache
        prefix = serving_paged.cached_prefix(model, tokens[:, :17])
        over = model(tokens[:, 17:], serving_paged.fused_cache(model, prefix.keys, prefix.values))
        whole = model(tokens, serving_paged.fused_cache(model))
    assert torch.allclose(over, want[:, 17:], atol=1e-5) and torch.allclose(whole, want, atol=1e-5)
    assert prefix.length == 17  # reading over it did not grow it
