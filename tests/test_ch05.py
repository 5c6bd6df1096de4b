"""Tests for Chapter 10's saved code (longctx.ch05).

The tiled walk and split-KV decoding equal dense attention (a float64 reference built from
Chapters 1 and 3) for every cache design, at random shapes, with windows and sinks; the KIVI-style
cache appends like it builds and its step equals attention over its dequantised keys and values;
the integer route stays within its rounding; flash_prefill equals SDPA. Ring attention and sharded
decoding on gloo processes equal full attention, and the bytes they hold and send match the
formulas. The boundaries raise TypeError or ValueError.
"""

from __future__ import annotations

import math

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


# --------------------------------------------------------------------------- merging states


@given(rows=st.integers(1, 3), keys=st.integers(2, 40), parts=st.integers(1, 6), seed=st.integers(0, 99))
@FAST
def test_merged_states_of_any_split_equal_one_softmax(rows, keys, parts, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, keys, generator=generator, dtype=torch.float64) * 20
    values = torch.randn(keys, 3, generator=generator, dtype=torch.float64)
    cuts = sorted({0, keys, *torch.randint(1, keys, (parts,), generator=generator).tolist()})
    states = [ch05.online_softmax_update(ch05.online_softmax_start((rows,), 3, scores), scores[:, a:b], values[a:b])
              for a, b in zip(cuts, cuts[1:], strict=False)]
    merged = ch05.merge_states(tuple(torch.stack(part) for part in zip(*states, strict=True)), dim=0)
    assert torch.allclose(ch05.finish_online_softmax(merged), torch.softmax(scores, -1) @ values, atol=1e-12)


def test_merging_an_empty_part_changes_nothing():
    scores, values = torch.randn(2, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    seen = ch05.online_softmax_update(ch05.online_softmax_start((2,), 3, scores), scores, values)
    empty = ch05.online_softmax_start((2,), 3, scores)
    merged = ch05.merge_states(tuple(torch.stack(pair) for pair in zip(seen, empty, strict=True)), dim=0)
    assert torch.allclose(ch05.finish_online_softmax(merged), ch05.finish_online_softmax(seen), atol=1e-15)


# --------------------------------------------------------------------------- tiled walk and split-KV == dense


@given(batch=st.integers(1, 2), kv_heads=st.integers(1, 3), groups=st.integers(1, 4), tokens=st.integers(1, 70),
       width=st.integers(1, 12), tile=st.integers(1, 80), window=st.one_of(st.none(), st.integers(1, 80)),
       sinks=st.integers(0, 6), seed=st.integers(0, 999))
@FAST
def test_tiled_and_split_kv_decode_equal_dense_attention_in_float64(batch, kv_heads, groups, tokens, width, tile,
                                                                    window, sinks, seed):
    query, key, value = _decode_case(batch, kv_heads, groups, tokens, width, seed, value_width=width + 1)
    dense = _dense(query, key, value, window, sinks)
    tiled = ch05.tiled_decode(query, key, value, tile=tile, window=window, sinks=sinks)
    split = ch05.split_kv_decode(query, key, value, chunk=tile, window=window, sinks=sinks)
    assert tiled.shape == split.shape == (batch, kv_heads * groups, 1, width + 1)
    assert torch.allclose(tiled, dense, atol=1e-12) and torch.allclose(split, dense, atol=1e-12)
    assert torch.allclose(ch05.decode_reference(query, key, value, window=window, sinks=sinks), dense, atol=1e-12)


@pytest.mark.parametrize(("tokens", "chunk"), [(1, 1), (1, 64), (37, 8), (64, 16), (65, 16), (100, 1000)])
def test_split_kv_at_one_token_and_ragged_last_chunks(tokens, chunk):
    query, key, value = _decode_case(1, 2, 4, tokens, 8, seed=tokens)
    assert torch.allclose(ch05.split_kv_decode(query, key, value, chunk=chunk), _dense(query, key, value),
                          atol=1e-12)


@pytest.mark.parametrize("design", ["mha", "gqa", "mqa"])
def test_split_kv_equals_dense_for_every_head_sharing(design):
    kv_heads, groups = {"mha": (8, 1), "gqa": (2, 4), "mqa": (1, 8)}[design]
    query, key, value = _decode_case(1, kv_heads, groups, 500, 16, seed=3)
    assert torch.allclose(ch05.split_kv_decode(query, key, value, chunk=64), _dense(query, key, value), atol=1e-12)


def test_split_kv_chunks_are_views_of_the_cache():
    _, key, value = _decode_case(1, 2, 1, 64, 8, seed=4)
    rows = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    state = ch05.chunk_states(rows, key, value, 16)
    assert [part.shape for part in state] == [(1, 2, 4, 3, 1), (1, 2, 4, 3, 1), (1, 2, 4, 3, 8)]
    assert key.reshape(1, 2, 4, 16, 8).data_ptr() == key.data_ptr()  # the cut copies nothing


def test_decode_scale_matches_chapter_one():
    query, key, value = _decode_case(1, 3, 1, 20, 8, seed=5)
    for step in (ch05.tiled_decode, ch05.split_kv_decode):
        assert torch.allclose(step(query, key, value, scale=0.3), _dense(query, key, value, scale=0.3), atol=1e-12)


def test_split_kv_in_float32_is_close_to_float64():
    query, key, value = _decode_case(1, 8, 4, 3000, 32, seed=6)
    got = ch05.split_kv_decode(query.float(), key.float(), value.float(), chunk=256)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), _dense(query, key, value), atol=1e-5)


# --------------------------------------------------------------------------- quantised caches


@pytest.mark.parametrize("bits", [8, 4])
@given(kv_heads=st.integers(1, 2), groups=st.integers(1, 3), tokens=st.integers(1, 40), half_width=st.integers(1, 6),
       tile=st.integers(1, 50), window=st.one_of(st.none(), st.integers(1, 45)), sinks=st.integers(0, 4),
       seed=st.integers(0, 999))
@settings(max_examples=12, deadline=None)
def test_tiled_decode_on_a_quantised_cache_equals_dense_attention_on_the_dequantised_cache(
        bits, kv_heads, groups, tokens, half_width, tile, window, sinks, seed):
    query, key, value = _decode_case(1, kv_heads, groups, tokens, 2 * half_width, seed)
    key_q, value_q = ch05.quantize_cache(key.float(), bits), ch05.quantize_cache(value.float(), bits)
    dense = _dense(query, ch05.dequantize_cache(key_q).double(), ch05.dequantize_cache(value_q).double(),
                   window, sinks)
    assert torch.allclose(ch05.tiled_decode(query, key_q, value_q, tile=tile, window=window, sinks=sinks), dense,
                          atol=1e-12)


def test_the_quantised_cache_is_the_chapter_two_and_four_codes():
    _, key, _ = _decode_case(2, 3, 1, 9, 8, seed=7)
    key = key.float()
    codes, scale = ch04.quantize_kv(key, 8)
    cache = ch05.quantize_cache(key, 8)
    assert torch.equal(cache.codes, codes) and torch.equal(cache.scale, scale)
    assert torch.equal(ch05.dequantize_cache(cache), ch02.dequantize(codes, scale))
    packed = ch05.quantize_cache(key, 4)
    codes4, scale4 = ch04.quantize_kv(key, 4)
    assert torch.equal(ch05.unpack_codes(packed.codes, 4), codes4) and packed.shape == key.shape
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


@pytest.mark.parametrize("bits", [4, 2])
def test_pack_codes_round_trips_every_code(bits):
    half, per_byte = 2 ** (bits - 1), 8 // bits
    every = torch.arange(-half, half, dtype=torch.int8).repeat(3, 2 * per_byte)  # (3, 2^b * 2 * 8/b)
    packed = ch05.pack_codes(every, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (3, every.shape[1] // per_byte)
    assert torch.equal(ch05.unpack_codes(packed, bits), every)
    parts = ch05.code_parts(packed, bits)
    assert len(parts) == per_byte
    assert all(torch.equal(part, want) for part, want in zip(parts, every.chunk(per_byte, -1), strict=True))


def test_pack_codes_places_part_i_in_bits_i_b_and_up():
    codes = torch.tensor([[1, -1, 0, -2]], dtype=torch.int8)  # four 2-bit codes: 01, 11, 00, 10
    assert ch05.pack_codes(codes, 2).tolist() == [[0b10_00_11_01]]
    assert ch05.pack_codes(torch.tensor([[3, -8]], dtype=torch.int8), 4).tolist() == [[0b1000_0011]]


@pytest.mark.parametrize(("codes", "bits", "match"), [(torch.zeros(2, 3, dtype=torch.int8), 4, "divisible by 2"),
                                                      (torch.zeros(2, 6, dtype=torch.int8), 2, "divisible by 4"),
                                                      (torch.full((2, 4), 9, dtype=torch.int8), 4, r"\[-8, 7\]"),
                                                      (torch.full((2, 4), 2, dtype=torch.int8), 2, r"\[-2, 1\]"),
                                                      (torch.zeros(2, 4, dtype=torch.int8), 3, "bits")])
def test_pack_codes_refuses_codes_it_cannot_hold(codes, bits, match):
    with pytest.raises(ValueError, match=match):
        ch05.pack_codes(codes, bits)


def test_quantized_kv_rejects_inconsistent_parts():
    codes, scale = torch.zeros(1, 2, 5, 4, dtype=torch.int8), torch.ones(1, 2, 5, 1)
    assert ch05.QuantizedKV(codes, scale, 8).shape == (1, 2, 5, 4)
    with pytest.raises(ValueError, match="bits"):
        ch05.QuantizedKV(codes, scale, 6)
    with pytest.raises(TypeError, match="uint8"):
        ch05.QuantizedKV(codes, scale, 4)
    with pytest.raises(ValueError, match="scale"):
        ch05.QuantizedKV(codes, torch.ones(1, 2, 1, 4), 8)
    with pytest.raises(TypeError, match="float32"):
        ch05.QuantizedKV(codes, scale.double(), 8)
    with pytest.raises(ValueError, match="bits"):
        ch05.quantize_cache(torch.randn(1, 1, 3, 4), 3)


def test_four_bit_bytes_read_as_signed_give_both_codes_by_shifts():
    every = torch.arange(-8, 8, dtype=torch.int8)
    low, high = torch.meshgrid(every, every, indexing="ij")
    packed = ch05.pack_codes(torch.stack([low.flatten(), high.flatten()], -1), 4)  # (256, 1): every byte
    (low16, sixteen), (high_code, one) = ch05.code_halves(packed, 4)
    assert sixteen == 16 and one == 1
    assert torch.equal(low16.int(), 16 * low.flatten()[:, None].int())
    assert torch.equal(high_code, high.flatten()[:, None])


@pytest.mark.parametrize("bits", [8, 4])
def test_integer_route_stays_within_its_rounding_of_dequantise_then_attend(bits):
    generator = torch.Generator().manual_seed(16 + bits)
    query = torch.randn(2, 8, 1, 32, generator=generator)
    key, value = (torch.randn(2, 2, 700, 32, generator=generator) for _ in "kv")
    key_q, value_q = ch05.quantize_cache(key, bits), ch05.quantize_cache(value, bits)
    want = ch05.decode_reference(query, key_q, value_q)
    got = ch05.int8_decode(query, key_q, value_q)
    assert got.shape == want.shape
    # the query rounded to int8 (1/254 of its largest entry per row) and the weights to 14 bits
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    assert not torch.equal(got, want)  # it is an approximation, and the test says so


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("tile", [1, 7, 64, 700])
def test_integer_route_gives_the_same_step_whatever_its_tile(bits, tile):
    generator = torch.Generator().manual_seed(20 + bits)
    query = torch.randn(2, 8, 1, 32, generator=generator)
    key, value = (torch.randn(2, 2, 300, 32, generator=generator) for _ in "kv")
    key_q, value_q = ch05.quantize_cache(key, bits), ch05.quantize_cache(value, bits)
    whole = ch05.int8_decode(query, key_q, value_q, tile=300)
    # integer sums are exact in any order; only the float sum of the tiles' mixes may round
    assert torch.allclose(ch05.int8_decode(query, key_q, value_q, tile=tile), whole, rtol=1e-6, atol=1e-7)


def test_two_byte_rows_carry_fourteen_bits_of_each_row():
    x = torch.rand(3, 1000, generator=torch.Generator().manual_seed(21))
    high, low, scale = ch05.two_byte_rows(x)
    assert high.dtype == low.dtype == torch.int8
    assert int(high.min()) >= 0 and int(high.max()) <= 127 and int(low.min()) >= 0 and int(low.max()) <= 127
    rebuilt = (128 * high.float() + low.float()) * scale
    assert ((rebuilt - x).abs() <= 0.5 * scale + 1e-6).all()  # half a level of 127 * 128, and float rounding


def test_integer_products_are_exact_for_both_code_widths():
    generator = torch.Generator().manual_seed(17)
    codes = torch.randint(-8, 8, (50, 16), generator=generator, dtype=torch.int8)
    rows = torch.randint(-127, 128, (16, 3), generator=generator, dtype=torch.int8)
    exact = codes.int() @ rows.int()
    for bits, stored in ((8, codes), (4, ch05.pack_codes(codes, 4))):
        pieces = ch05.code_halves(stored, bits)
        parts = rows.chunk(len(pieces))
        got = sum(torch._int_mm(piece, part.contiguous()) // divisor
                  for (piece, divisor), part in zip(pieces, parts, strict=True))
        assert torch.equal(got, exact)


# --------------------------------------------------------------------------- the KIVI-style cache


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize(("tokens", "group", "residual"), [(1, 4, 2), (9, 4, 0), (50, 8, 8), (131, 16, 5)])
def test_kivi_cache_appended_one_token_at_a_time_equals_one_built_at_once(bits, tokens, group, residual):
    _, key, value = _decode_case(1, 2, 1, tokens, 8, seed=tokens + bits)
    built = ch05.KiviCache.from_keys_values(key, value, bits=bits, group=group, residual=residual)
    grown = ch05.KiviCache.from_keys_values(key[..., :1, :], value[..., :1, :], bits=bits, group=group,
                                            residual=residual)
    for t in range(1, tokens):
        grown.append(key[..., t:t + 1, :], value[..., t:t + 1, :])
    for name in ("key_codes", "key_scale", "key_offset", "value_codes", "value_scale", "value_offset",
                 "key_recent", "value_recent"):
        assert torch.equal(getattr(built, name), getattr(grown, name)), name
    assert built.tokens == tokens
    recent = built.key_recent.shape[2]
    assert recent == tokens if tokens < residual + group else residual <= recent < residual + group


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_kivi_cache_quantises_keys_per_channel_and_values_per_token(bits):
    _, key, value = _decode_case(1, 2, 1, 64, 8, seed=18)
    key[..., 2] *= 50  # an outlier channel: per-channel scales keep the other channels fine
    cache = ch05.KiviCache.from_keys_values(key, value, bits=bits, group=16, residual=0)
    assert cache.key_scale.shape == (1, 2, 4, 8) and cache.value_scale.shape == (1, 2, 64, 1)
    keys, values = cache.dequantize()
    levels = 2**bits - 1
    key_range = key.float().view(1, 2, 4, 16, 8).amax(3) - key.float().view(1, 2, 4, 16, 8).amin(3)
    error = (keys - key.float()).abs().view(1, 2, 4, 16, 8).amax(3)
    assert (error <= key_range / levels / 2 * 1.001 + 1e-6).all()  # half a step of its own channel
    value_range = value.float().amax(-1, keepdim=True) - value.float().amin(-1, keepdim=True)
    assert ((values - value.float()).abs() <= value_range / levels / 2 * 1.001 + 1e-6).all()


@pytest.mark.parametrize("bits", [8, 4, 2])
@given(kv_heads=st.integers(1, 2), groups=st.integers(1, 3), tokens=st.integers(1, 90), group=st.integers(1, 20),
       residual=st.integers(0, 10), per_pass=st.integers(1, 5), seed=st.integers(0, 999))
@settings(max_examples=10, deadline=None)
def test_kivi_step_equals_attention_over_its_dequantised_cache(bits, kv_heads, groups, tokens, group, residual,
                                                               per_pass, seed):
    query, key, value = _decode_case(1, kv_heads, groups, tokens, 8, seed)  # width 8: whole bytes at 2 bits
    cache = ch05.KiviCache.from_keys_values(key, value, bits=bits, group=group, residual=residual)
    keys, values = cache.dequantize()
    want = _dense(query, keys.double(), values.double())
    got = cache.attend(query.float(), groups_per_pass=per_pass)
    assert torch.allclose(got.double(), want, atol=1e-5)


def test_kivi_cache_refuses_what_it_cannot_hold():
    _, key, value = _decode_case(1, 2, 1, 8, 8, seed=19)
    with pytest.raises(ValueError, match="bits"):
        ch05.KiviCache.from_keys_values(key, value, bits=3)
    with pytest.raises(ValueError, match="group"):
        ch05.KiviCache.from_keys_values(key, value, group=0)
    with pytest.raises(ValueError, match="residual"):
        ch05.KiviCache.from_keys_values(key, value, residual=-1)
    with pytest.raises(ValueError, match="value"):
        ch05.KiviCache.from_keys_values(key, value[..., :4, :])
    with pytest.raises(ValueError, match="divisible by 2"):
        ch05.KiviCache.from_keys_values(key[..., :7], value[..., :7], bits=4)
    with pytest.raises(ValueError, match="divisible by 4"):
        ch05.KiviCache.from_keys_values(key[..., :6], value[..., :6], bits=2)


# --------------------------------------------------------------------------- the latent cache


def test_latent_decode_equals_chapter_three_absorbed_attention():
    torch.manual_seed(14)
    layer = ch03.AbsorbedLatentAttention(32, 4, 8).double()
    x = torch.randn(2, 23, 32, dtype=torch.float64)
    with torch.no_grad():
        _, cache = layer(x[:, :-1])
        expected, latent = layer.forward_absorbed(x[:, -1:], cache)
        query = ch01.split_heads(layer.query(x[:, -1:]), 4)
        for chunk in (1, 5, 64):
            heads = ch05.latent_decode(query, latent, layer.key_up.weight, layer.value_up.weight, chunk=chunk)
            assert torch.allclose(layer.output(ch01.merge_heads(heads)), expected, atol=1e-12)


@pytest.mark.parametrize(("window", "sinks"), [(None, 0), (7, 0), (7, 3)])
def test_latent_decode_equals_expanded_keys_with_windows(window, sinks):
    generator = torch.Generator().manual_seed(15)
    heads, head_dim, rank, tokens = 4, 6, 5, 30
    query = torch.randn(1, heads, 1, head_dim, generator=generator, dtype=torch.float64)
    latent = torch.randn(1, tokens, rank, generator=generator, dtype=torch.float64)
    key_up, value_up = (torch.randn(heads * head_dim, rank, generator=generator, dtype=torch.float64) for _ in "kv")
    keys = ch01.split_heads(latent @ key_up.T, heads)  # (1, H, T, d_h), rebuilt
    values = ch01.split_heads(latent @ value_up.T, heads)
    got = ch05.latent_decode(query, latent, key_up, value_up, chunk=4, window=window, sinks=sinks)
    assert torch.allclose(got, _dense(query, keys, values, window, sinks), atol=1e-12)


# --------------------------------------------------------------------------- flash prefill


@given(batch=st.integers(1, 2), heads=st.integers(1, 3), tokens=st.integers(1, 90), width=st.integers(1, 9),
       query_tile=st.integers(1, 40), key_tile=st.integers(1, 40), seed=st.integers(0, 999))
@FAST
def test_flash_prefill_equals_torch_sdpa_causal(batch, heads, tokens, width, query_tile, key_tile, seed):
    generator = torch.Generator().manual_seed(seed)
    query, key = (torch.randn(batch, heads, tokens, width, generator=generator, dtype=torch.float64)
                  for _ in "qk")
    value = torch.randn(batch, heads, tokens, width + 2, generator=generator, dtype=torch.float64)
    got = ch05.flash_prefill(query, key, value, query_tile=query_tile, key_tile=key_tile)
    want = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(got, _full(query, key, value), atol=1e-12)


def test_flash_prefill_never_computes_a_tile_wholly_in_the_future(monkeypatch):
    seen = []
    update = ch05.online_softmax_update

    def counting(state, scores, values):
        seen.append(scores.shape[-1])
        return update(state, scores, values)

    monkeypatch.setitem(ch05.flash_prefill.__globals__, "online_softmax_update", counting)
    query, key, value = _qkv(64, dtype=torch.float64)
    ch05.flash_prefill(query, key, value, query_tile=16, key_tile=16)
    assert len(seen) == 4 + 3 + 2 + 1  # the tiles on and below the diagonal of a 4 x 4 grid


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


@pytest.mark.slow  # starts gloo processes
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
    assert len(result.compute_seconds) == parts and all(len(row) == parts for row in result.wait_seconds)
    assert all(seconds >= 0 for row in result.compute_seconds + result.wait_seconds for seconds in row)


@pytest.mark.slow  # starts gloo processes
@pytest.mark.parametrize(("parts", "tokens", "kv_heads", "groups"), [(1, 5, 2, 2), (2, 9, 1, 4), (4, 50, 2, 3)])
def test_sharded_decode_equals_dense_attention_and_moves_only_queries_and_states(parts, tokens, kv_heads, groups):
    generator = torch.Generator().manual_seed(parts + tokens)
    query = torch.randn(2, kv_heads * groups, 1, 8, generator=generator)
    key = torch.randn(2, kv_heads, tokens, 8, generator=generator)
    value = torch.randn(2, kv_heads, tokens, 5, generator=generator)
    output, sent, seconds = ch05.sharded_decode(query, key, value, parts, repeats=3)
    assert (output - _dense(query.double(), key.double(), value.double()).float()).abs().max() < 1e-5
    state_bytes = 2 * kv_heads * groups * (2 + 5) * 4  # m, l and a of every query row
    assert sent == [[query.nbytes * (parts - 1), 0]] + [[0, state_bytes]] * (parts - 1)
    assert len(seconds) == parts and all(step >= compute > 0 for step, compute in seconds)


def test_sharded_decode_refuses_what_would_not_form_a_step():
    query, key, value = _decode_case(1, 2, 2, 6, 8, seed=20)
    query, key, value = query.float(), key.float(), value.float()
    with pytest.raises(ValueError, match="no rank is empty"):
        ch05.sharded_decode(query, key, value, 7)
    with pytest.raises(ValueError, match="divide"):
        ch05.sharded_decode(query[:, :3], key, value, 2)
    with pytest.raises(ValueError, match="query"):
        ch05.sharded_decode(query.expand(1, 4, 2, 8), key, value, 2)
    with pytest.raises(TypeError, match="key"):
        ch05.sharded_decode(query, key.double(), value, 2)
    with pytest.raises(ValueError, match="repeats"):
        ch05.sharded_decode(query, key, value, 2, repeats=0)


@pytest.mark.slow  # starts gloo processes
def test_link_bandwidth_is_a_plausible_rate_between_two_local_ranks():
    # two processes on one machine: slower than memory (no 10 TB/s) and faster than a 1 Mb/s line
    assert 1e5 < ch05.link_bandwidth(0.25, repeats=2) < 1e13
    assert 0 < ch05.link_seconds(4, repeats=3) < 1.0  # one number: the latency alone
    with pytest.raises(ValueError, match="multiple of 4"):
        ch05.link_seconds(6)
    with pytest.raises(ValueError, match="megabytes"):
        ch05.link_bandwidth(0)


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
    with pytest.raises(ValueError, match="query must not be empty"):
        ch05.ring_attention(torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 4), torch.zeros(1, 1, 0, 4), 1)


def test_fewer_tokens_than_ranks_raises():
    query, key, value = _qkv(3)
    with pytest.raises(ValueError, match="no rank is empty"):
        ch05.ring_attention(query, key, value, 4)


def test_mismatched_shapes_raise():
    query, key, value = _qkv(6)
    with pytest.raises(ValueError, match=r"query and key must be \(\.\.\., T, d\) alike"):
        ch05.ring_attention(query, key[..., :5, :], value, 2)
    with pytest.raises(TypeError, match="query"):
        ch05.ring_attention(query.long(), key, value, 2)
    with pytest.raises(ValueError, match="timeout_s"):
        ch05.ring_attention(query, key, value, 2, timeout_s=0)


def test_unknown_block_order_raises():
    query, key, value = _qkv(6)
    with pytest.raises(ValueError, match="order"):
        ch05.blockwise_causal_attention(query, key, value, 2, order="random")


KIVI_MEMORY_PROBE = """
import json, torch
from longctx import ch05
from benchmarks.common import peak_extra_bytes
generator = torch.Generator().manual_seed(7)
block = torch.randn(1, 8, 4096, 128, generator=generator)
key, value = block.repeat(1, 1, 16, 1), block.flip(-1).repeat(1, 1, 16, 1)  # 64K tokens
query = torch.randn(1, 32, 1, 128, generator=generator)
report = {}
for bits in (8, 4, 2):
    cache = ch05.KiviCache.from_keys_values(key, value, bits=bits, group=32, residual=32)
    report[bits] = [peak_extra_bytes(lambda cache=cache: cache.attend(query)), cache.nbytes]
print(json.dumps(report))
"""


@pytest.mark.slow  # builds three 64K caches in a fresh process
def test_kivi_step_holds_less_extra_memory_than_its_own_cache_at_64k():
    """Each pass merges its groups' states before the next pass, so the step's temporaries are a pass's
    float tiles and one state per pass, not one state per 32-token group (once some 500 B a token,
    which at 64K tokens made the 2-bit step allocate eight times its cache)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KIVI_MEMORY_PROBE], capture_output=True, text=True,
                          check=True, timeout=300)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for bits, (extra, size) in report.items():
        assert extra <= size, (bits, extra, size)
