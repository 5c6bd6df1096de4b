"""Tests for Chapter 5's saved code (longctx.ch05).

Flash-decoding equals dense attention (a float64 reference built from Chapters 1 and 3) for
every cache kind, at random shapes, with windows and sinks; the fused tile update equals it
eagerly and compiled, and falls back when compiling fails. Ring attention on gloo processes
equals full causal attention, each rank holds 1/P of the cache, and the bytes sent match the
formula. Every bad input raises TypeError or ValueError.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from longctx import ch01, ch02, ch03, ch04, ch05

FAST = settings(max_examples=30, deadline=None)


def _qkv(tokens: int, *, heads: int = 2, width: int = 4, seed: int = 0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, tokens, width, generator=generator, dtype=dtype) for _ in range(3)]


def _full(query, key, value):
    return ch01.scaled_dot_product_attention(query, key, value, ch01.causal_mask(query.shape[-2]))[0]


def _decode_case(batch, kv_heads, groups, tokens, width, seed, value_width=None):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, kv_heads * groups, 1, width, generator=generator, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, tokens, width, generator=generator, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, tokens, value_width or width, generator=generator, dtype=torch.float64)
    return query, key, value


def _dense(query, key, value, window=None, sinks=0, scale=None):
    """The reference definition: Chapter 1's attention over repeated KV heads and the last mask row."""
    groups = query.shape[1] // key.shape[1]
    tokens = key.shape[-2]
    mask = ch03.visibility_mask(tokens, window, sinks)[-1:] if window is not None else None
    out, _ = ch01.scaled_dot_product_attention(query, ch03.repeat_kv(key, groups), ch03.repeat_kv(value, groups),
                                               mask, scale=scale)
    return out


# --------------------------------------------------------------------------- the running softmax


def test_worked_example_of_the_chapter():
    scores = torch.tensor([[1.0, 3.0, 2.0, 0.0, 5.0, 1.0]], dtype=torch.float64)
    values = torch.arange(10.0, 70.0, 10.0, dtype=torch.float64)[:, None]
    state = ch05.online_softmax_start((1,), 1, scores)
    state = ch05.online_softmax_update(state, scores[:, :3], values[:3])
    assert state[0].item() == 3.0
    assert math.isclose(state[1].item(), math.exp(-2) + 1 + math.exp(-1))
    state = ch05.online_softmax_update(state, scores[:, 3:], values[3:])
    expected = (torch.softmax(scores, -1) @ values).item()
    assert math.isclose(ch05.finish_online_softmax(state).item(), expected, rel_tol=1e-12)


@given(rows=st.integers(1, 4), keys=st.integers(1, 40), cut=st.integers(1, 40), seed=st.integers(0, 99))
@FAST
def test_online_softmax_in_any_tiling_equals_one_softmax(rows, keys, cut, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, keys, generator=generator, dtype=torch.float64) * 30  # large: no overflow
    values = torch.randn(keys, 3, generator=generator, dtype=torch.float64)
    state = ch05.online_softmax_start((rows,), 3, scores)
    for start in range(0, keys, cut):
        state = ch05.online_softmax_update(state, scores[:, start:start + cut], values[start:start + cut])
    assert torch.allclose(ch05.finish_online_softmax(state), torch.softmax(scores, -1) @ values, atol=1e-12)


def test_a_tile_with_every_key_hidden_leaves_the_state_unchanged():
    scores = torch.randn(2, 5, dtype=torch.float64)
    values = torch.randn(5, 3, dtype=torch.float64)
    hidden = torch.full((2, 4), -math.inf, dtype=torch.float64)
    for state in (ch05.online_softmax_start((2,), 3, scores),
                  ch05.online_softmax_update(ch05.online_softmax_start((2,), 3, scores), scores, values)):
        after = ch05.online_softmax_update(state, hidden, torch.randn(4, 3, dtype=torch.float64))
        assert all(torch.equal(a, b) for a, b in zip(state, after, strict=True))
    assert torch.equal(ch05.finish_online_softmax(ch05.online_softmax_start((2,), 3, scores)),
                       torch.zeros(2, 3, dtype=torch.float64))


def test_the_mix_may_be_a_function_of_the_weights():
    scores, values = torch.randn(3, 6, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    start = ch05.online_softmax_start((3,), 2, scores)
    by_tensor = ch05.online_softmax_update(start, scores, values)
    by_function = ch05.online_softmax_update(start, scores, lambda weights: weights @ values)
    assert all(torch.equal(a, b) for a, b in zip(by_tensor, by_function, strict=True))


def test_online_softmax_update_rejects_bad_input():
    scores = torch.randn(2, 5)
    state = ch05.online_softmax_start((2,), 3, scores)
    with pytest.raises(TypeError, match="state"):
        ch05.online_softmax_update(state[:2], scores, torch.randn(5, 3))
    with pytest.raises(TypeError, match="scores"):
        ch05.online_softmax_update(state, scores.long(), torch.randn(5, 3))
    with pytest.raises(ValueError, match="rows"):
        ch05.online_softmax_update(state, torch.randn(3, 5), torch.randn(5, 3))
    with pytest.raises(ValueError, match="one row per key"):
        ch05.online_softmax_update(state, scores, torch.randn(4, 3))
    with pytest.raises(TypeError, match="like"):
        ch05.online_softmax_start((2,), 3, torch.zeros(2, dtype=torch.long))


# --------------------------------------------------------------------------- which keys a step reads


@given(tokens=st.integers(1, 60), window=st.one_of(st.none(), st.integers(1, 70)), sinks=st.integers(0, 8))
@FAST
def test_visible_ranges_mark_the_last_row_of_the_visibility_mask(tokens, window, sinks):
    marked = torch.zeros(tokens, dtype=torch.bool)
    ranges = ch05.visible_ranges(tokens, window, sinks)
    for start, stop in ranges:
        assert 0 <= start < stop <= tokens
        assert not marked[start:stop].any()  # runs do not overlap
        marked[start:stop] = True
    assert torch.equal(marked, ch03.visibility_mask(tokens, window, sinks)[-1])
    assert len(ranges) <= 2


@given(start=st.integers(0, 50), length=st.integers(1, 50), tile=st.integers(1, 20))
@FAST
def test_tile_ranges_cut_every_run_into_tiles_in_order(start, length, tile):
    runs = [(start, start + length), (start + length + 3, start + 2 * length + 3)]
    tiles = ch05.tile_ranges(runs, tile)
    covered = [position for begin, stop in tiles for position in range(begin, stop)]
    assert covered == [p for begin, stop in runs for p in range(begin, stop)]
    assert all(0 < stop - begin <= tile for begin, stop in tiles)


def test_a_window_reads_the_same_keys_however_long_the_cache():
    for tokens in (5_000, 50_000, 500_000):
        ranges = ch05.visible_ranges(tokens, window=4096, sinks=4)
        assert sum(stop - start for start, stop in ranges) == 4096 + 4


@pytest.mark.parametrize(("arguments", "error"), [((0,), ValueError), ((5, 0), ValueError), ((5, 2, -1), ValueError),
                                                  ((5.0,), TypeError), ((5, True), TypeError)])
def test_visible_ranges_rejects_bad_input(arguments, error):
    with pytest.raises(error):
        ch05.visible_ranges(*arguments)


# --------------------------------------------------------------------------- flash-decoding == dense


@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 3), groups=st.integers(1, 4), tokens=st.integers(1, 70),
       width=st.integers(1, 12), tile=st.integers(1, 80), window=st.one_of(st.none(), st.integers(1, 80)),
       sinks=st.integers(0, 6), seed=st.integers(0, 999))
@FAST
def test_flash_decode_equals_dense_attention_in_float64(batch, kv_heads, groups, tokens, width, tile, window, sinks,
                                                        seed):
    query, key, value = _decode_case(batch, kv_heads, groups, tokens, width, seed, value_width=width + 1)
    got = ch05.flash_decode(query, key, value, tile=tile, window=window, sinks=sinks)
    assert got.shape == (batch, kv_heads * groups, 1, width + 1)
    assert torch.allclose(got, _dense(query, key, value, window, sinks), atol=1e-12)
    assert torch.allclose(got, ch05.decode_reference(query, key, value, window=window, sinks=sinks), atol=1e-12)


@pytest.mark.parametrize(("tokens", "tile"), [(1, 1), (1, 64), (37, 8), (64, 16), (65, 16), (100, 1000)])
def test_flash_decode_at_one_token_and_ragged_last_tiles(tokens, tile):
    query, key, value = _decode_case(1, 2, 4, tokens, 8, seed=tokens)
    got = ch05.flash_decode(query, key, value, tile=tile)
    assert torch.allclose(got, _dense(query, key, value), atol=1e-12)


def test_flash_decode_scale_matches_chapter_one():
    query, key, value = _decode_case(1, 3, 1, 20, 8, seed=5)
    got = ch05.flash_decode(query, key, value, tile=7, scale=0.3)
    assert torch.allclose(got, _dense(query, key, value, scale=0.3), atol=1e-12)


def test_flash_decode_in_float32_is_close_to_float64():
    query, key, value = _decode_case(1, 8, 4, 3000, 32, seed=6)
    got = ch05.flash_decode(query.float(), key.float(), value.float(), tile=256)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), _dense(query, key, value), atol=1e-5)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("per", ["token", "channel"])
@given(kv_heads=st.integers(1, 2), groups=st.integers(1, 3), tokens=st.integers(1, 40), half_width=st.integers(1, 6),
       tile=st.integers(1, 50), window=st.one_of(st.none(), st.integers(1, 45)), sinks=st.integers(0, 4),
       seed=st.integers(0, 999))
@settings(max_examples=12, deadline=None)
def test_quantised_flash_decode_equals_dense_attention_on_the_dequantised_cache(
        bits, per, kv_heads, groups, tokens, half_width, tile, window, sinks, seed):
    query, key, value = _decode_case(1, kv_heads, groups, tokens, 2 * half_width, seed)
    key_q, value_q = ch05.quantize_cache(key.float(), bits, per=per), ch05.quantize_cache(value.float(), bits, per=per)
    dense = _dense(query, ch05.dequantize_cache(key_q).double(), ch05.dequantize_cache(value_q).double(),
                   window, sinks)
    eager = ch05.flash_decode(query, key_q, value_q, tile=tile, window=window, sinks=sinks)
    fused = ch05.fused_flash_decode(query, key_q, value_q, tile=tile, window=window, sinks=sinks)
    assert torch.allclose(eager, dense, atol=1e-12)
    # scales applied after the dot products (float64 here) differ by float32 rounding of codes * scale
    assert torch.allclose(fused, dense, atol=1e-6 * float(dense.abs().max()) + 1e-12)


@given(kv_heads=st.integers(1, 3), groups=st.integers(1, 4), tokens=st.integers(1, 50), width=st.integers(1, 10),
       tile=st.integers(1, 60), window=st.one_of(st.none(), st.integers(1, 55)), sinks=st.integers(0, 5),
       seed=st.integers(0, 999))
@FAST
def test_fused_flash_decode_on_float_caches_equals_dense(kv_heads, groups, tokens, width, tile, window, sinks, seed):
    query, key, value = _decode_case(2, kv_heads, groups, tokens, width, seed)
    got = ch05.fused_flash_decode(query, key, value, tile=tile, window=window, sinks=sinks)
    assert torch.allclose(got, _dense(query, key, value, window, sinks), atol=1e-12)


def test_the_quantised_cache_is_the_chapter_two_and_four_codes():
    _, key, _ = _decode_case(2, 3, 1, 9, 8, seed=7)
    key = key.float()
    for per in ("token", "channel"):
        codes, scale = ch04.quantize_kv(key, 8, per=per)
        cache = ch05.quantize_cache(key, 8, per=per)
        assert torch.equal(cache.codes, codes) and torch.equal(cache.scale, scale)
        assert torch.equal(ch05.dequantize_cache(cache), ch02.dequantize(codes, scale))
        packed = ch05.quantize_cache(key, 4, per=per)
        codes4, scale4 = ch04.quantize_kv(key, 4, per=per)
        assert torch.equal(ch05.unpack_int4(packed.codes), codes4) and packed.shape == key.shape
        assert packed.nbytes == codes4.numel() // 2 + scale4.nbytes


def test_read_tile_gives_a_view_of_a_float_cache_and_reuses_the_buffer_of_a_quantised_one():
    _, key, _ = _decode_case(1, 2, 1, 30, 8, seed=8)
    key = key.float()
    view = ch05.read_tile(key, 5, 17)
    assert view.data_ptr() == key[..., 5:, :].data_ptr() and view.shape == (1, 2, 12, 8)
    buffer = torch.empty(1, 2, 16, 8)
    for bits in (8, 4):
        cache = ch05.quantize_cache(key, bits)
        tile = ch05.read_tile(cache, 5, 17, buffer)
        assert tile.data_ptr() == buffer.data_ptr()
        assert torch.equal(tile, ch05.dequantize_cache(cache)[..., 5:17, :])


def test_pack_int4_round_trips_every_code():
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)  # (3, 32)
    packed = ch05.pack_int4(every)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 16)
    assert torch.equal(ch05.unpack_int4(packed), every)
    low, high = ch05.int4_halves(packed)
    assert torch.equal(low, every[:, :16]) and torch.equal(high, every[:, 16:])


@pytest.mark.parametrize(("codes", "error", "match"), [
    (torch.zeros(2, 3, dtype=torch.int8), ValueError, "even"),
    (torch.full((2, 4), 9, dtype=torch.int8), ValueError, r"\[-8, 7\]"),
    (torch.zeros(2, 4), TypeError, "int8"),
])
def test_pack_int4_rejects_bad_codes(codes, error, match):
    with pytest.raises(error, match=match):
        ch05.pack_int4(codes)


def test_quantized_kv_rejects_inconsistent_parts():
    codes, scale = torch.zeros(1, 2, 5, 4, dtype=torch.int8), torch.ones(1, 2, 5, 1)
    assert ch05.QuantizedKV(codes, scale, 8).shape == (1, 2, 5, 4)
    with pytest.raises(ValueError, match="bits"):
        ch05.QuantizedKV(codes, scale, 6)
    with pytest.raises(TypeError, match="uint8"):
        ch05.QuantizedKV(codes, scale, 4)
    with pytest.raises(ValueError, match="scale must have shape"):
        ch05.QuantizedKV(codes, scale, 8, per="channel")
    with pytest.raises(ValueError, match="per"):
        ch05.QuantizedKV(codes, scale, 8, per="head")
    with pytest.raises(TypeError, match="float32"):
        ch05.QuantizedKV(codes, scale.double(), 8)
    with pytest.raises(ValueError, match="bits"):
        ch05.quantize_cache(torch.randn(1, 1, 3, 4), 3)
    with pytest.raises(ValueError, match="dimensions"):
        ch05.quantize_cache(torch.randn(3, 4), 8)
    with pytest.raises(TypeError, match="QuantizedKV"):
        ch05.dequantize_cache(codes)


@pytest.mark.parametrize(("change", "error", "match"), [
    (lambda q, k, v: (q[0], k, v), ValueError, "dimensions"),
    (lambda q, k, v: (q.expand(1, 4, 2, 8), k, v), ValueError, "one token"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "divide"),
    (lambda q, k, v: (q, k.float(), v), TypeError, "key"),
    (lambda q, k, v: (q, k[..., :4], v), ValueError, "key must be"),
    (lambda q, k, v: (q, k, v[..., :5, :]), ValueError, "value must be"),
    (lambda q, k, v: (q.long(), k, v), TypeError, "query"),
    (lambda q, k, v: (q, "keys", v), TypeError, "key"),
])
def test_flash_decode_rejects_inconsistent_shapes(change, error, match):
    query, key, value = change(*_decode_case(1, 2, 2, 6, 8, seed=9))
    with pytest.raises(error, match=match):
        ch05.flash_decode(query, key, value)
    with pytest.raises(error, match=match):
        ch05.fused_flash_decode(query, key, value)


@pytest.mark.parametrize(("settings_", "error"), [
    ({"tile": 0}, ValueError), ({"tile": 2.0}, TypeError), ({"window": 0}, ValueError),
    ({"sinks": -1}, ValueError), ({"scale": 0.0}, ValueError), ({"scale": "big"}, TypeError),
])
def test_flash_decode_rejects_bad_settings(settings_, error):
    query, key, value = _decode_case(1, 2, 2, 6, 8, seed=10)
    with pytest.raises(error):
        ch05.flash_decode(query, key, value, **settings_)


def test_fused_flash_decode_needs_both_sides_quantised_or_neither():
    query, key, value = _decode_case(1, 2, 2, 6, 8, seed=11)
    with pytest.raises(TypeError, match="both"):
        ch05.fused_flash_decode(query, ch05.quantize_cache(key.float()), value)
    with pytest.raises(ValueError, match="bits"):
        ch05.fused_tile_update(None, query, key, None, value, None, 16)


# --------------------------------------------------------------------------- the compiled tile update


def test_compiled_tile_update_equals_the_eager_step_on_an_int4_cache():
    query, key, value = _decode_case(1, 2, 4, 90, 16, seed=12)
    query = query.float()
    key_q, value_q = ch05.quantize_cache(key.float(), 4), ch05.quantize_cache(value.float(), 4)
    update = ch05.CompiledTileUpdate()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = ch05.fused_flash_decode(query, key_q, value_q, tile=32, tile_update=update)
    eager = ch05.fused_flash_decode(query, key_q, value_q, tile=32)
    if update.fallback_reason is not None:  # where compiling is unavailable, it must say so and still be right
        assert any("torch.compile failed" in str(w.message) for w in caught)
    assert torch.allclose(compiled, eager, atol=1e-5)
    assert torch.allclose(compiled, ch05.flash_decode(query, key_q, value_q, tile=32), atol=1e-5)


def test_compiled_tile_update_falls_back_to_eager_and_says_so():
    update = ch05.CompiledTileUpdate()

    def broken(*args):
        raise RuntimeError("no C++ compiler here\nsecond line")

    update.compiled = broken
    query, key, value = _decode_case(1, 1, 2, 20, 4, seed=13)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler here"):
        got = ch05.fused_flash_decode(query, key, value, tile=8, tile_update=update)
    assert update.fallback_reason == "no C++ compiler here"
    assert torch.allclose(got, _dense(query, key, value), atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, then quietly eager
        ch05.fused_flash_decode(query, key, value, tile=8, tile_update=update)


# --------------------------------------------------------------------------- the latent cache


def test_flash_decode_latent_equals_chapter_four_absorbed_attention():
    torch.manual_seed(14)
    layer = ch04.AbsorbedLatentAttention(32, 4, 8).double()
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    with torch.no_grad():
        _, cache = layer(x[:, :-1])
        expected, latent = layer.forward_absorbed(x[:, -1:], cache)
        query = ch01.split_heads(layer.query(x[:, -1:]), 4)
        for tile in (1, 5, 64):
            heads = ch05.flash_decode_latent(query, latent, layer.key_up.weight, layer.value_up.weight, tile=tile)
            assert torch.allclose(layer.output(ch01.merge_heads(heads)), expected, atol=1e-12)


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (7, 0), (7, 3)])
def test_flash_decode_latent_equals_expanded_keys_with_windows(window, sinks):
    generator = torch.Generator().manual_seed(15)
    heads, head_dim, rank, tokens = 4, 6, 5, 30
    query = torch.randn(1, heads, 1, head_dim, generator=generator, dtype=torch.float64)
    latent = torch.randn(1, tokens, rank, generator=generator, dtype=torch.float64)
    key_up, value_up = (torch.randn(heads * head_dim, rank, generator=generator, dtype=torch.float64) for _ in "kv")
    keys = ch01.split_heads(latent @ key_up.T, heads)  # (1, H, T, d_h), rebuilt
    values = ch01.split_heads(latent @ value_up.T, heads)
    got = ch05.flash_decode_latent(query, latent, key_up, value_up, tile=4, window=window, sinks=sinks)
    assert torch.allclose(got, _dense(query, keys, values, window, sinks), atol=1e-12)


def test_flash_decode_latent_rejects_weights_of_the_wrong_shape():
    query = torch.randn(1, 4, 1, 6)
    with pytest.raises(ValueError, match="key_up"):
        ch05.flash_decode_latent(query, torch.randn(1, 9, 5), torch.randn(24, 4), torch.randn(24, 5))
    with pytest.raises(TypeError, match="latent"):
        ch05.flash_decode_latent(query, torch.randn(1, 9, 5).double(), torch.randn(24, 5), torch.randn(24, 5))


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


# --------------------------------------------------------------------------- blockwise, one process


@pytest.mark.parametrize(("tokens", "parts"), [(1, 1), (9, 2), (13, 3), (10, 4), (16, 16)])
@pytest.mark.parametrize("order", ["ring", "reverse"])
def test_blockwise_online_softmax_equals_full_causal_attention(tokens, parts, order):
    query, key, value = _qkv(tokens, dtype=torch.float64, seed=tokens)
    got = ch05.blockwise_causal_attention(query, key, value, parts, order=order)
    assert torch.allclose(got, _full(query, key, value), atol=1e-12)


def test_causal_block_scores_hide_the_future_in_global_positions():
    query, key, _ = _qkv(6, dtype=torch.float64)
    scores = ch05.causal_block_scores(query[..., 2:4, :], key[..., 3:6, :], 2, 3, 0.5)
    hidden = torch.isinf(scores[0, 0])
    assert hidden.tolist() == [[True, True, True], [False, True, True]]  # token 2 sees none of 3..5


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


@pytest.mark.parametrize(("parts", "error"), [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_parts_below_one_or_not_an_integer_raise(parts, error):
    query, key, value = _qkv(4)
    with pytest.raises(error, match="parts"):
        ch05.ring_attention(query, key, value, parts)
    with pytest.raises(error, match="parts"):
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
    with pytest.raises(TypeError, match="query"):
        ch05.ring_attention(query.long(), key, value, 2)
    with pytest.raises(ValueError, match="timeout_s"):
        ch05.ring_attention(query, key, value, 2, timeout_s=0)


def test_unknown_block_order_raises():
    query, key, value = _qkv(6)
    with pytest.raises(ValueError, match="order"):
        ch05.blockwise_causal_attention(query, key, value, 2, order="random")


@pytest.mark.parametrize(("function", "threads", "run_time", "error"), [
    (lambda: None, 0, 0.1, ValueError), (lambda: None, 1, 0.0, ValueError),
    (lambda: None, 1.0, 0.1, TypeError), ("not callable", 1, 0.1, TypeError),
])
def test_median_seconds_rejects_bad_settings(function, threads, run_time, error):
    with pytest.raises(error):
        ch05.median_seconds(function, threads=threads, min_run_time=run_time)
