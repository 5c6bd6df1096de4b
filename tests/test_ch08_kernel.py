"""Tests for Chapter 13's decode kernel (chapters/ch08-serving.qmd, "A decode kernel of our own"): the C++
kernel equals Chapter 10's steps on every cache kind, grouped heads, ragged lengths and batches; its
states are Chapter 10's chunk states; the path without a compiler says why; the benchmark part runs."""

from __future__ import annotations

import importlib.util
import math
import shutil
import statistics

import pytest
import torch
from conftest import skip_or_fail
from longctx import ch05, ch08
from longctx.ch08 import _generated

# (batch, query heads, KV heads, tokens, chunk, width): GQA-8's group of 4, MHA, MQA, a chunk longer
# than the cache, lengths that are not a multiple of the chunk (or of the kernel's 4 rows), and one that is
SHAPES = [(1, 32, 8, 1000, 96, 128), (2, 8, 2, 1000, 96, 64), (3, 4, 4, 7, 3, 16), (2, 6, 1, 130, 512, 32),
          (1, 12, 4, 64, 16, 8), (2, 8, 2, 5, 2, 2)]
ULPS = 16  # float32 rounding, summed in another order and reassociated by -ffast-math, which moves
# with the compiler's choices for the machine (-march=native): up to 16 units in the last place of the
# output's largest entry (2.6e-6 of 2.5 measured on an AVX2 EPYC; the Xeon it was first run on stayed
# under 2e-6)


def assert_float32_close(got, want):
    """got equals want to float32 rounding at the scale of the output."""
    atol = ULPS * torch.finfo(torch.float32).eps * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=atol)


@pytest.fixture(scope="module")
def kernel():
    built = ch08.load_kernel()
    if built.module is None:
        skip_or_fail(f"the decode kernel cannot be built here: {built.reason}")
    return built.module


def step(batch, query_heads, kv_heads, tokens, width, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, query_heads, 1, width, generator=generator)
    key, value = (torch.randn(batch, kv_heads, tokens, width, generator=generator) * 2 for _ in "kv")
    return query, key, value


@pytest.mark.parametrize(("batch", "query_heads", "kv_heads", "tokens", "chunk", "width"), SHAPES)
def test_the_kernel_equals_chapter_5_split_kv_on_a_float32_cache(kernel, batch, query_heads, kv_heads,
                                                                  tokens, chunk, width):
    query, key, value = step(batch, query_heads, kv_heads, tokens, width)
    got = ch08.fused_decode(query, key, value, chunk=chunk)
    assert got.shape == query.shape and got.dtype == torch.float32
    assert_float32_close(got, ch05.split_kv_decode(query, key, value, chunk=chunk))
    assert_float32_close(got, ch05.decode_reference(query, key, value))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(("batch", "query_heads", "kv_heads", "tokens", "chunk", "width"), SHAPES)
def test_the_kernel_equals_dequantise_then_attend_on_the_codes(kernel, bits, batch, query_heads, kv_heads,
                                                              tokens, chunk, width):
    """The kernel reads the codes where they lie and is exact on them: Chapter 10's dense step on the
    dequantised cache, to float32 rounding."""
    query, key, value = step(batch, query_heads, kv_heads, tokens, width, seed=1)
    cache = [ch05.quantize_cache(t, bits) for t in (key, value)]
    got = ch08.fused_decode(query, *cache, chunk=chunk)
    assert_float32_close(got, ch05.decode_reference(query, *cache))
    floats = [ch05.dequantize_cache(part) for part in cache]
    assert_float32_close(got, ch05.split_kv_decode(query, *floats, chunk=chunk))


@pytest.mark.parametrize("bits", [8, 4])
def test_the_kernel_agrees_with_chapter_5_integer_route_within_its_rounding(kernel, bits):
    """ch05.int8_decode rounds the query and the weights; the kernel does not, so it lies within that
    route's own error of it (Chapter 10 measures under 2 % of the largest entry) and closer to the exact
    answer than the route does."""
    query, key, value = step(2, 32, 8, 3000, 128, seed=2)
    cache = [ch05.quantize_cache(t, bits) for t in (key, value)]
    exact = ch05.decode_reference(query, *cache)
    ours, route = ch08.fused_decode(query, *cache), ch05.int8_decode(query, *cache)
    assert (ours - route).abs().max() < 0.02 * route.abs().max()
    assert (ours - exact).abs().max() < 0.01 * (route - exact).abs().max()


@pytest.mark.parametrize("bits", [32, 8, 4])
def test_the_kernel_states_are_chapter_5_chunk_states(kernel, bits):
    """Where T is a multiple of the chunk, every chunk's (m, l, a) is the one ch05.chunk_states computes."""
    query, key, value = step(2, 8, 2, 192, 32, seed=3)
    cache = (key, value) if bits == 32 else tuple(ch05.quantize_cache(t, bits) for t in (key, value))
    floats = cache if bits == 32 else tuple(ch05.dequantize_cache(part) for part in cache)
    rows = ch05.stacked_rows(query, 2, None)
    got = ch08.kernel_chunk_states(rows, *cache, 64)
    want = ch05.chunk_states(rows, *floats, 64)
    assert got.running_max.shape == (2, 2, 3, 4, 1) and got.accumulator.shape == (2, 2, 3, 4, 32)
    for mine, theirs in zip(got, want, strict=True):  # a sums terms of both signs: scale the tolerance
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6 * float(theirs.abs().max()))


def test_the_kernel_reads_non_contiguous_caches_and_any_thread_count(kernel):
    query, key, value = step(1, 8, 2, 300, 32, seed=4)
    wide = torch.cat([key, value], dim=-1)  # (1, 2, 300, 64): key and value as views of it
    want = ch05.decode_reference(query, key, value)
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            got = ch08.fused_decode(query, wide[..., :32], wide[..., 32:], chunk=50)
            assert_float32_close(got, want)
    finally:
        torch.set_num_threads(threads)


def test_a_query_group_reads_only_its_own_kv_head(kernel):
    """Query head h reads KV head h // G: change one KV head and only its group's outputs move."""
    query, key, value = step(1, 8, 2, 40, 16, seed=5)
    before = ch08.fused_decode(query, key, value, chunk=8)
    value = value.clone()
    value[:, 1] += 1.0
    after = ch08.fused_decode(query, key, value, chunk=8)
    assert torch.equal(before[:, :4], after[:, :4])
    assert_float32_close(after[:, 4:], before[:, 4:] + 1.0)


def test_loading_the_kernel_prints_nothing_and_keeps_subnormal_floats(kernel, capfd):
    """-ffast-math is a compile flag only: the process's float mode still keeps subnormal numbers."""
    again = _generated.load_kernel.__wrapped__()  # past the cache: torch loads the built module again
    assert again.module is not None and again.reason == ""
    assert capfd.readouterr() == ("", "")
    assert (torch.tensor(1e-40) * 1.0).item() > 0
    assert ch08.KERNEL_FLAGS[:3] == ("-O3", "-march=native", "-fopenmp")


# --------------------------------------------------------------------------- without a compiler


def test_without_a_compiler_the_loader_says_so_and_builds_nothing(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    assert ch08.missing_build_tools()[0].startswith("C++ compiler")
    missing = _generated.load_kernel.__wrapped__()
    assert missing.module is None
    assert missing.reason.startswith("no C++ compiler (c++ or g++)")


def test_without_ninja_the_loader_says_so(monkeypatch):
    real_which, real_find_spec = shutil.which, importlib.util.find_spec
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "ninja" else real_which(name, *a, **k))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "ninja" else real_find_spec(name, *a, **k))
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler here either: the reason names both")
    assert ch08.missing_build_tools() == ["ninja"]
    assert _generated.load_kernel.__wrapped__() == (None, "no ninja found")


def test_without_the_kernel_the_step_refuses_with_the_reason(monkeypatch):
    monkeypatch.setattr(_generated, "load_kernel", lambda: ch08.DecodeKernel(None, "no ninja found"))
    query, key, value = step(1, 4, 2, 8, 8)
    with pytest.raises(RuntimeError, match="not available: no ninja found"):
        ch08.fused_decode(query, key, value)


def test_a_failed_build_is_a_reason_not_an_error(monkeypatch):
    import torch.utils.cpp_extension

    def fail(*args, **kwargs):
        raise RuntimeError("Error building extension 'longctx_decode_kernel'\nmore output")

    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", fail)
    if ch08.missing_build_tools():
        pytest.skip(f"no build is tried here: {ch08.missing_build_tools()}")
    assert _generated.load_kernel.__wrapped__() == (
        None, "the build failed: Error building extension 'longctx_decode_kernel'")


# --------------------------------------------------------------------------- refusals


def test_the_step_refuses_caches_it_would_misread():
    query, key, value = step(1, 8, 2, 10, 16)
    with pytest.raises(ValueError, match="value must have key's 8 bits"):
        ch08.fused_decode(query, ch05.quantize_cache(key, 8), ch05.quantize_cache(value, 4))
    with pytest.raises(TypeError, match="value"):
        ch08.fused_decode(query, ch05.quantize_cache(key, 8), value)
    with pytest.raises(ValueError, match="key heads must divide query heads"):
        ch08.fused_decode(query, key[:, :1].expand(1, 3, 10, 16), value[:, :1].expand(1, 3, 10, 16))
    with pytest.raises(ValueError, match="value must have key's shape"):
        ch08.fused_decode(query, key, value[..., :9, :])
    with pytest.raises(ValueError, match="chunk"):
        ch08.fused_decode(query, key, value, chunk=0)
    with pytest.raises(TypeError, match="query"):
        ch08.fused_decode(query.double(), key, value)


# --------------------------------------------------------------------------- the benchmark part


def test_the_work_counts_are_the_bytes_the_caches_hold():
    from benchmarks import serving_kernel

    query, copies = serving_kernel.caches(64, 0, cold=False)
    for kind, (cache,) in copies.items():
        assert serving_kernel.cache_bytes(cache) == serving_kernel.work(kind, 64)["bytes"]
    float32, int4 = (serving_kernel.work(kind, 64) for kind in ("float32", "int4"))
    assert float32["flops"] == int4["flops"] < int4["operations"]
    assert 7 * int4["bytes"] < float32["bytes"] < 8 * int4["bytes"]  # the scales: a little over 1/8


@pytest.mark.slow  # runs a benchmark
def test_the_benchmark_part_times_every_step_and_reports_every_field(kernel):
    from benchmarks import serving_kernel

    settings = {"tokens": [256, 600], "rounds": 2, "min_run_time": 0.001, "chunk": 128,
                "breakdown_tokens": [600], "warm_tokens": 64, "seed": 0}
    result = serving_kernel.run(settings, threads=1, progress=lambda message: None)
    assert [record["tokens"] for record in result["lengths"]] == [256, 600]
    for record in result["lengths"]:
        assert set(record["steps"]) == set(serving_kernel.STEPS)
        for row in record["steps"].values():  # the median of its two rounds, and the bytes read in it
            assert len(row["round_seconds"]) == 2 and row["seconds"] == statistics.median(row["round_seconds"])
            assert math.isclose(row["bytes_per_s"] * row["seconds"], row["bytes"])
        assert [(line["of"], line["to"]) for line in record["ratios"]] == list(serving_kernel.RATIOS)
    (longest,) = [record for record in result["lengths"] if "breakdown" in record]
    assert [line["cache"] for line in longest["breakdown"]] == ["float32", "int8", "int4"]
    assert result["targets"] == []  # no target length in so short a run
    with pytest.raises(ValueError, match="rounds"):
        serving_kernel.run({**settings, "rounds": 0}, threads=1, progress=print)
