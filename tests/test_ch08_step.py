"""Chapter 13, the layer's step and chunked prefill: the layer read from its config, its decode step
against a whole pass, chunks and mixed steps against their parts, the cost model's fit, the scheduler's
bookkeeping, and the benchmark part at a tiny layer."""

from __future__ import annotations

import math

import pytest
import torch
from longctx import ch03, ch08

SMALL = ch08.LayerShape(d_model=32, query_heads=4, kv_heads=2, head_dim=8, hidden=48, eps=1e-5)


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _exact(shape=SMALL, seed=1):
    return ch08.LayerWeights(*(w.double() for w in ch08.layer_weights(shape, seed=seed)))


def _empty(batch, tokens, shape=SMALL):
    return tuple(torch.zeros(batch, shape.kv_heads, tokens, shape.head_dim, dtype=torch.float64) for _ in "kv")


# --------------------------------------------------------------------------- the layer


def test_layer_shape_reads_the_llama_3_1_8b_layer():
    shape = ch08.layer_shape(ch03.load_model_config("llama-3.1-8b"))
    assert shape == (4096, 32, 8, 128, 14336, 1e-5)


def test_layer_shape_refuses_a_latent_cache():
    with pytest.raises(ValueError, match="latent"):
        ch08.layer_shape(ch03.load_model_config("deepseek-v2-lite"))


def test_layer_weights_are_seeded_and_hold_the_layers_numbers():
    first, again = ch08.layer_weights(SMALL, seed=3), ch08.layer_weights(SMALL, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first.query, ch08.layer_weights(SMALL, seed=4).query)
    d, heads, kv = SMALL.d_model, SMALL.query_heads * SMALL.head_dim, SMALL.kv_heads * SMALL.head_dim
    numbers = 2 * d * heads + 2 * d * kv + 3 * d * SMALL.hidden + 2 * d
    assert first.nbytes == 4 * numbers
    assert ch08.layer_weights(SMALL, dtype="bfloat16").nbytes == 2 * numbers
    assert first.gate.shape == (SMALL.hidden, d) and first.output.shape == (d, heads)


def test_rms_norm_gives_unit_root_mean_square():
    x = _randn(3, 5, 16, seed=2) * 7
    normed = ch08.rms_norm(x, torch.ones(16, dtype=torch.float64), 0.0)
    assert torch.allclose(normed.pow(2).mean(-1), torch.ones(3, 5, dtype=torch.float64))


@pytest.mark.parametrize(("batch", "tokens", "seed"), [(1, 9, 0), (3, 17, 1), (2, 40, 2)])
def test_decode_token_by_token_equals_the_whole_prompt_and_its_chunks(batch, tokens, seed):
    weights, x = _exact(seed=seed), _randn(batch, tokens, SMALL.d_model, seed=seed + 10)
    whole_keys, whole_values = _empty(batch, tokens)
    whole = ch08.prefill_chunk(x, weights, whole_keys, whole_values, SMALL)
    keys, values = _empty(batch, tokens)
    steps = torch.cat([ch08.decode_step(x[:, t:t + 1], weights, keys[..., :t + 1, :], values[..., :t + 1, :],
                                        SMALL) for t in range(tokens)], dim=1)
    assert torch.allclose(steps, whole, atol=1e-12)
    assert torch.allclose(keys, whole_keys, atol=1e-12) and torch.allclose(values, whole_values, atol=1e-12)
    cuts = [0, tokens // 3, tokens // 3 + 1, tokens]
    keys, values = _empty(batch, tokens)
    chunks = torch.cat([ch08.prefill_chunk(x[:, a:b], weights, keys[..., :b, :], values[..., :b, :], SMALL)
                        for a, b in zip(cuts, cuts[1:], strict=False) if b > a], dim=1)
    assert torch.allclose(chunks, whole, atol=1e-12)


def test_decode_step_reads_the_cache_through_split_kv():
    weights, x = _exact(), _randn(2, 1, SMALL.d_model, seed=5)
    keys, values = _randn(2, SMALL.kv_heads, 33, SMALL.head_dim, seed=6), _randn(2, SMALL.kv_heads, 33, 8, seed=7)
    out = ch08.decode_step(x, weights, keys, values, SMALL)
    query, key, value = ch08.project_qkv(x, weights, SMALL)
    assert torch.equal(keys[..., -1:, :], key) and torch.equal(values[..., -1:, :], value)
    mixed = ch03.grouped_attention(query, keys, values)
    assert torch.allclose(out, ch08.finish_layer(x, mixed, weights, SMALL), atol=1e-12)


def test_mixed_step_equals_its_chunk_and_its_decode_rows_apart():
    weights = _exact(seed=2)
    chunk, rows = _randn(1, 6, SMALL.d_model, seed=8), _randn(3, 1, SMALL.d_model, seed=9)
    prefix = _randn(1, SMALL.kv_heads, 10 + 6, SMALL.head_dim, seed=10), _randn(1, 2, 16, 8, seed=11)
    cache = _randn(3, SMALL.kv_heads, 21, SMALL.head_dim, seed=12), _randn(3, 2, 21, 8, seed=13)
    copies = [tuple(t.clone() for t in pair) for pair in (prefix, cache, prefix, cache)]
    chunk_out, row_out = ch08.mixed_step(chunk, *copies[0], rows, *copies[1], weights, SMALL)
    assert torch.allclose(chunk_out, ch08.prefill_chunk(chunk, weights, *copies[2], SMALL), atol=1e-12)
    assert torch.allclose(row_out, ch08.decode_step(rows, weights, *copies[3], SMALL), atol=1e-12)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(copies[0] + copies[1], copies[2] + copies[3],
                                                                strict=True))


@pytest.mark.parametrize(("chunk", "prefix"), [(1, 0), (5, 0), (4, 11), (16, 3)])
def test_chunk_attention_equals_ch03_grouped_attention_with_causal_rows(chunk, prefix):
    query = _randn(2, 6, chunk, 8, seed=14)
    keys, values = _randn(2, 3, prefix + chunk, 8, seed=15), _randn(2, 3, prefix + chunk, 8, seed=16)
    expected = ch03.grouped_attention(query, keys, values, ch03.causal_rows(chunk, prefix + chunk))
    assert torch.allclose(ch08.chunk_attention(query, keys, values), expected, atol=1e-12)


def test_a_bfloat16_step_stays_within_two_percent_of_float32():
    shape = ch08.LayerShape(64, 8, 2, 16, 128, 1e-5)
    x, keys, values = _randn(2, 1, 64, seed=17), _randn(2, 2, 300, 16, seed=18), _randn(2, 2, 300, 16, seed=19)
    outputs = [ch08.decode_step(x.to(kind), ch08.layer_weights(shape, dtype=dtype, seed=0),
                                keys.to(kind), values.to(kind), shape).double()
               for dtype, kind in ch08.LAYER_DTYPES.items()]
    assert 0 < ((outputs[1] - outputs[0]).norm() / outputs[0].norm()).item() < 0.02


# --------------------------------------------------------------------------- the cost model


@pytest.mark.parametrize(("prompt", "cuts"), [(10, [3, 7]), (64, [1, 2, 60]), (7, [])])
def test_chunk_pairs_of_the_chunks_sum_to_the_whole_prompts_and_count_the_mask(prompt, cuts):
    bounds = [0, *cuts, prompt]
    pieces = [ch08.chunk_pairs(a, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert sum(pieces) == ch08.chunk_pairs(0, prompt) == prompt * (prompt + 1) // 2
    for (a, b), pairs in zip(zip(bounds, bounds[1:], strict=False), pieces, strict=True):
        assert pairs == int(ch03.causal_rows(b - a, b).sum())


def test_fit_step_cost_recovers_a_known_cost_and_counts_relative_error():
    known = ch08.StepCost(0.02, 1e-3, 2e-8, 5e-8)
    generator = torch.Generator().manual_seed(0)
    points = []
    for _ in range(12):
        rows, cached, pairs = (int(torch.randint(0, top, (), generator=generator)) for top in (600, 10**6, 10**7))
        points.append({"rows": rows, "cached": cached, "pairs": pairs, "seconds": known.seconds(rows, cached, pairs)})
    fitted = ch08.fit_step_cost(points)
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(fitted, known, strict=True))
    with pytest.raises(ValueError, match="points"):
        ch08.fit_step_cost(points[:3])


# --------------------------------------------------------------------------- the scheduler

COST = ch08.StepCost(0.01, 1e-3, 1e-7, 1e-7)


def _alone_prefill(request, layers=32):
    return layers * COST.seconds(request.prompt, 0, ch08.chunk_pairs(0, request.prompt))


@pytest.mark.parametrize("chunk", [None, 16, 100, 5000])
def test_serve_trace_gives_every_request_its_tokens_after_its_prompt(chunk):
    trace = ch08.request_trace(30, seed=3, rate=0.05, prompt_median=200, output_median=20, max_tokens=4096)
    served = ch08.serve_trace(trace, COST, chunk=chunk)
    assert len(served.first_token) == len(trace)
    assert len(served.gaps) == sum(r.output - 1 for r in trace)
    assert len(served.per_token) == sum(r.output > 1 for r in trace)
    for request, first in zip(trace, served.first_token, strict=True):
        assert first >= _alone_prefill(request) * (1 - 1e-12)  # no prompt is read faster than alone
    assert 0 < served.busy <= 1 and served.steps > 0


def test_one_request_alone_is_served_alike_whole_or_in_one_big_chunk():
    trace = [ch08.Request(0.0, 500, 10)]
    whole, chunked = (ch08.serve_trace(trace, COST, chunk=c) for c in (None, 500))
    assert whole == chunked
    assert math.isclose(whole.first_token[0], _alone_prefill(trace[0]))
    assert all(math.isclose(gap, 32 * COST.seconds(1, 500 + k, 0)) for k, gap in enumerate(whole.gaps, 1))


def test_a_whole_prompt_stalls_decoding_and_chunks_bound_the_stall():
    trace = [ch08.Request(0.0, 10, 200), ch08.Request(1.0, 3000, 2)]
    stall = _alone_prefill(trace[1])
    whole = ch08.serve_trace(trace, COST, chunk=None)
    assert max(whole.gaps) >= stall  # the first request waited for the whole second prompt
    chunked = ch08.serve_trace(trace, COST, chunk=100)
    bound = 32 * COST.seconds(100 + 1, 10 + 200, ch08.chunk_pairs(2900, 100))
    assert max(chunked.gaps) <= bound < stall / 10
    assert chunked.first_token[1] > whole.first_token[1]  # the chunked prompt's first token comes later


def test_plan_chunked_keeps_to_its_budget_and_its_room():
    trace = [ch08.Request(0.0, 50, 5), ch08.Request(0.0, 30, 5), ch08.Request(0.0, 40, 5)]
    queue = ch08.Queue(waiting=[0, 1, 2], decoding=[7], prefilled=[20, 0, 0])
    assert ch08.plan_chunked(queue, trace, 45, room=3) == ([(0, 30), (1, 15)], [7])
    assert ch08.plan_chunked(queue, trace, 45, room=1) == ([(0, 30)], [7])
    assert ch08.plan_chunked(queue, trace, 45, room=0) == ([], [7])
    assert ch08.plan_whole_prompt(queue, trace, None, room=1) == ([(0, 50)], [])


def test_serve_trace_takes_a_plan_of_the_readers_own():
    trace = ch08.request_trace(10, seed=1, rate=0.05, prompt_median=300, output_median=10, max_tokens=4096)

    def one_prompt_token(queue, trace, chunk, room):
        pieces, rows = ch08.plan_chunked(queue, trace, 1, room)
        return pieces, rows

    mine = ch08.serve_trace(trace, COST, chunk=None, plan=one_prompt_token)
    assert mine == ch08.serve_trace(trace, COST, chunk=1)


# --------------------------------------------------------------------------- the benchmark part


@pytest.mark.slow  # runs a benchmark
def test_the_benchmark_part_times_every_point_that_fits_and_counts_the_rest():
    from benchmarks import serving_step

    settings = dict(serving_step.QUICK, shape=SMALL._asdict(), batches=[1, 2], lengths=[16, 64],
                    max_cache_bytes=2 * 2 * 2 * 32 * 8 * 4, rounds=1, min_run_time=0.001,
                    mixed=[[8, 0, 0, 0], [4, 8, 2, 16], [0, 0, 2, 16]])
    result = serving_step.run(settings, threads=1, progress=lambda message: None)
    assert result["shape"] == SMALL._asdict()
    rows = {(r["dtype"], r["batch"], r["tokens"]): r for r in result["decode"]}
    assert len(rows) == 2 * 2 * 2
    assert not rows["float32", 2, 64]["measured"] and rows["bfloat16", 2, 64]["measured"]
    for row in rows.values():
        assert row["cache_bytes"] == serving_step.cache_bytes(SMALL, row["batch"], row["tokens"], row["dtype"])
        if row["measured"]:
            assert set(row["seconds"]) == {"weights", "attention", "step"}
            assert row["attention_share"]["of"] == "attention" and row["cache_copies"] >= 2
    assert [(m["rows"], m["cached"], m["pairs"]) for m in result["mixed"]] == [
        (8, 0, 36), (6, 32, ch08.chunk_pairs(8, 4)), (2, 32, 0)]
