"""Tests for Chapter 5's saved code (longctx.ch05): ring attention on gloo processes equals full causal
attention, each rank holds 1/P of the cache, the bytes sent match the formula, and bad inputs raise."""

from __future__ import annotations

import pytest
import torch
from longctx import ch01, ch05


def _qkv(tokens: int, *, heads: int = 2, width: int = 4, seed: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, tokens, width, generator=generator, dtype=dtype) for _ in range(3)]


def _full(query, key, value):
    return ch01.scaled_dot_product_attention(query, key, value, ch01.causal_mask(query.shape[-2]))[0]


# --------------------------------------------------------------------------- partition


@pytest.mark.parametrize(("tokens", "parts"), [(10, 4), (7, 2), (8, 4), (5, 1), (3, 3), (101, 7)])
def test_partition_bounds_cover_the_sequence_in_near_equal_blocks(tokens, parts):
    bounds = ch05.partition_bounds(tokens, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == tokens
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_partition_bounds_of_ten_over_four():
    assert ch05.partition_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


# --------------------------------------------------------------------------- online softmax, one process


@pytest.mark.parametrize(("tokens", "parts"), [(1, 1), (9, 2), (13, 3), (10, 4), (16, 16)])
@pytest.mark.parametrize("order", ["ring", "reverse"])
def test_blockwise_online_softmax_equals_full_causal_attention(tokens, parts, order):
    query, key, value = _qkv(tokens, dtype=torch.float64, seed=tokens)
    got = ch05.blockwise_causal_attention(query, key, value, parts, order=order)
    assert torch.allclose(got, _full(query, key, value), atol=1e-12)


def test_online_update_skips_a_block_wholly_in_the_future():
    query, key, value = _qkv(4, dtype=torch.float64)
    state = ch05.online_softmax_update(None, query[..., :2, :], key[..., :2, :], value[..., :2, :], 0, 0, 0.5)
    after = ch05.online_softmax_update(state, query[..., :2, :], key[..., 2:, :], value[..., 2:, :], 0, 2, 0.5)
    assert all(torch.equal(a, b) for a, b in zip(state, after, strict=True))


def test_online_softmax_matches_torch_on_large_scores_without_overflow():
    query, key, value = _qkv(12, dtype=torch.float32, seed=3)
    query = query * 200  # scores in the thousands: a naive exp would overflow
    got = ch05.blockwise_causal_attention(query, key, value, 3)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.isfinite(got).all() and torch.allclose(got, expected, atol=1e-4)


# --------------------------------------------------------------------------- ring attention on gloo processes


@pytest.mark.parametrize(("parts", "tokens"), [(1, 5), (2, 7), (4, 10)])
def test_ring_attention_equals_full_causal_attention(parts, tokens):
    generator = torch.Generator().manual_seed(parts)
    query, key = (torch.randn(2, 2, tokens, 4, generator=generator) for _ in range(2))
    value = torch.randn(2, 2, tokens, 3, generator=generator)  # batch 2, value width differs from key width
    result = ch05.ring_attention(query, key, value, parts)
    assert result.output.shape == value.shape
    assert (result.output - _full(query, key, value)).abs().max().item() < 1e-5
    whole = key.nbytes + value.nbytes
    per_token = whole // tokens
    # each rank holds exactly its block's keys and values: 1/P of the cache, up to one token
    assert result.cache_bytes_per_rank == [(stop - start) * per_token for start, stop in result.bounds]
    assert result.total_cache_bytes == whole
    assert max(result.cache_bytes_per_rank) - min(result.cache_bytes_per_rank) <= per_token
    # in step s rank r forwards the block that started on rank (r - s) mod P
    for rank, sent in enumerate(result.bytes_sent_per_step):
        owners = [(rank - step) % parts for step in range(parts - 1)]
        assert sent == [result.cache_bytes_per_rank[owner] for owner in owners]
    assert sum(result.bytes_sent_per_rank) == (parts - 1) * whole


# --------------------------------------------------------------------------- timing helper


def test_median_seconds_returns_a_positive_time():
    assert ch05.median_seconds(lambda: torch.ones(8).sum(), threads=1, min_run_time=0.01) > 0


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("parts", [0, -1, 1.5, True])
def test_parts_below_one_or_not_an_integer_raise(parts):
    query, key, value = _qkv(4)
    with pytest.raises(ValueError, match="parts"):
        ch05.ring_attention(query, key, value, parts)
    with pytest.raises(ValueError, match="parts"):
        ch05.partition_bounds(4, parts)


@pytest.mark.parametrize("tokens", [0, -2])
def test_tokens_below_one_raise(tokens):
    with pytest.raises(ValueError, match="seq_len"):
        ch05.partition_bounds(tokens, 1)
    with pytest.raises(ValueError, match="T >= 1"):
        ch05.ring_attention(torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 4), 1)


def test_fewer_tokens_than_ranks_raises():
    query, key, value = _qkv(3)
    with pytest.raises(ValueError, match="no rank is empty"):
        ch05.ring_attention(query, key, value, 4)


def test_mismatched_shapes_raise():
    query, key, value = _qkv(6)
    with pytest.raises(ValueError, match="same"):
        ch05.ring_attention(query, key[..., :5, :], value, 2)


def test_unknown_block_order_raises():
    query, key, value = _qkv(6)
    with pytest.raises(ValueError, match="order"):
        ch05.blockwise_causal_attention(query, key, value, 2, order="random")


@pytest.mark.parametrize(("threads", "run_time"), [(0, 0.1), (1, 0.0)])
def test_median_seconds_rejects_bad_settings(threads, run_time):
    with pytest.raises(ValueError):
        ch05.median_seconds(lambda: None, threads=threads, min_run_time=run_time)
