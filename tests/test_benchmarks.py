"""Tests for benchmarks/: fast kernels equal the chapters' teaching versions, each benchmark runs and
returns every field, results files are complete, and bad inputs raise ValueError."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from longctx import ch01, ch03, ch04, support
from longctx.support import measure

from benchmarks import common, decode, fast, memory, prefill, ring, scan
from benchmarks.__main__ import QUICK, summary_table

CPU = torch.device("cpu")


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------- fast == teaching


@pytest.mark.parametrize(("query_heads", "kv_heads", "tokens"), [(4, 1, 7), (8, 2, 13), (6, 6, 5), (32, 8, 33)])
def test_grouped_decode_attention_matches_ch03_grouped_attention(query_heads, kv_heads, tokens):
    query = _randn(2, query_heads, 1, 16, seed=1)
    key, value = _randn(2, kv_heads, tokens, 16, seed=2), _randn(2, kv_heads, tokens, 16, seed=3)
    expected = ch03.grouped_attention(query, key, value)
    assert torch.allclose(fast.grouped_decode_attention(query, key, value), expected, atol=1e-12)


def test_grouped_decode_attention_matches_materialised_repeat():
    query, key, value = _randn(1, 8, 1, 16, seed=4), _randn(1, 2, 9, 16, seed=5), _randn(1, 2, 9, 16, seed=6)
    repeated = ch01.scaled_dot_product_attention(query, ch03.repeat_kv(key, 4), ch03.repeat_kv(value, 4))[0]
    assert torch.allclose(fast.grouped_decode_attention(query, key, value), repeated, atol=1e-12)


def _latent_layer(seed=7):
    torch.manual_seed(seed)
    return ch03.AbsorbedLatentAttention(32, 4, 8).double()


def test_latent_decode_expanded_matches_ch03_latent_layer_last_token():
    layer = _latent_layer()
    x = _randn(1, 11, 32, seed=8)
    with torch.no_grad():
        full, latent = layer(x)
        query = ch01.split_heads(layer.query(x[:, -1:]), 4)  # (1, 4, 1, 8)
        step = fast.latent_decode_expanded(query, latent, layer.key_up.weight, layer.value_up.weight)
        output = layer.output(ch01.merge_heads(step))
    assert torch.allclose(output, full[:, -1:], atol=1e-10)


@pytest.mark.parametrize(("tokens", "window", "block"), [(37, 8, 4), (64, 16, 16), (50, 5, 7)])
def test_banded_attention_matches_ch04_block_sparse_with_the_exact_window(tokens, window, block):
    query, key, value = (_randn(1, 2, tokens, 8, seed=s) for s in (12, 13, 14))
    block_mask = ch04.sliding_window_block_mask(tokens, window, block)
    token_mask = ch03.visibility_mask(tokens, window)
    expected = ch04.block_sparse_attention(query, key, value, block_mask, block, token_mask=token_mask)
    dense = ch01.scaled_dot_product_attention(query, key, value, token_mask)[0]
    got = fast.banded_causal_attention(query, key, value, window, block)
    assert torch.allclose(got, expected, atol=1e-12) and torch.allclose(got, dense, atol=1e-12)


def test_ssm_decode_step_matches_ch04_sequential_scan():
    channels, state_size, steps = 3, 4, 9
    decay = torch.rand(steps, 1, channels, state_size, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    input_weight = _randn(steps, 1, channels, state_size, seed=16)
    readout = _randn(steps, 1, channels, state_size, seed=17)
    x = _randn(steps, 1, channels, seed=18)
    state = torch.zeros(1, channels, state_size, dtype=torch.float64)
    outputs = []
    for t in range(steps):
        y, state = fast.ssm_decode_step(state, x[t], decay[t], input_weight[t], readout[t])
        outputs.append(y)
    # the same recurrence as a scan over time (time last): h_t = a_t h_{t-1} + B_t x_t
    a = decay.permute(1, 2, 3, 0)
    b = (input_weight * x[..., None]).permute(1, 2, 3, 0)
    states = ch04.sequential_scan(a, b)  # (1, D, N, T)
    expected = (states * readout.permute(1, 2, 3, 0)).sum(2)  # (1, D, T)
    assert torch.allclose(torch.stack(outputs, -1), expected, atol=1e-12)


# --------------------------------------------------------------------------- smoke: every record has every field


def test_cache_sizes_grow_with_the_level_and_end_at_the_last_level_cache():
    sizes = measure.cache_sizes()
    if not sizes:
        pytest.skip("this machine does not describe its caches in sysfs")
    levels = sorted(sizes)
    assert all(sizes[a] < sizes[b] for a, b in zip(levels, levels[1:], strict=False))
    assert sizes[levels[-1]] == measure.last_level_cache_bytes()


def test_the_bandwidth_buffer_outgrows_the_last_level_cache():
    cache = measure.last_level_cache_bytes()
    full = measure.buffer_megabytes(CPU, quick=False)
    assert measure.buffer_megabytes(CPU, quick=True) == 64 and 256 <= full <= 2048
    if cache:
        assert full == min(2048, max(256, 4 * cache // 2**20))


@pytest.mark.slow  # runs a benchmark
def test_floors_records_have_every_field():
    progress = common.Progress(enabled=False)
    record = measure.measure_floors(device=CPU, threads=1, quick=True, progress=progress)
    for key in ("bandwidth", "matmul", "bytes_per_s", "flop_per_s"):
        assert key in record
    bandwidth = record["bandwidth"]
    # B is the faster of the two ways to read every byte once (never the copy); F the best size tried
    assert record["bytes_per_s"] == bandwidth["read_bytes_per_s"] == pytest.approx(
        max(bandwidth["read_sum_bytes_per_s"], bandwidth["read_matvec_bytes_per_s"]), rel=1e-12)
    assert record["read_by"] in ("matrix-vector product", "sum")
    assert record["flop_per_s"] == max(record["matmul"]["sizes_tried"].values())
    small = measure.bandwidth_floor(device=CPU, threads=1, megabytes=1, min_run_time=0.01)
    assert set(small) >= {"copy_bytes_per_s", "read_bytes_per_s", "buffer_bytes"}


@pytest.mark.slow  # runs a benchmark
@pytest.mark.parametrize("design", decode.DESIGNS)
def test_each_decode_design_runs_once_with_every_field(design):
    record = decode.measure_decode(design, 40, device=CPU, threads=1, min_run_time=0.001)
    assert set(decode.RECORD_FIELDS) <= set(record)
    assert record["seconds"] > 0 and record["cache_bytes"] > 0 and record["bytes_moved"] >= record["cache_bytes"]
    assert record["kind"] == ("flash" if design in decode.FLASH_DESIGNS else "baseline")
    assert record["operations"] >= record["flops"] > 0 and record["runs"] >= 5
    decode.add_roofline(record, {"bytes_per_s": 1e10, "flop_per_s": 1e11})
    assert record["percent_of_roofline"] > 0 and record["bound"] in ("memory", "arithmetic")


def test_cold_steps_rotate_through_caches_filling_four_times_the_last_level_cache(monkeypatch):
    # an 8 MiB LLC, so that the test copies 32 MiB rather than four times this machine's LLC
    monkeypatch.setattr(measure, "last_level_cache_bytes", lambda: 8 * 2**20)
    llc = measure.last_level_cache_bytes()
    case = decode.decode_case("gqa8", 256, device=CPU)
    assert case.copies == measure.COLD_FACTOR * llc // case.cache_bytes  # 16 caches of 2 MiB
    assert case.copies * case.cache_bytes >= min(measure.COLD_FACTOR * llc, measure.MAX_COPIES * case.cache_bytes)
    assert case.copies >= 2 and decode.decode_case("gqa8", 256, device=CPU, cold=False).copies == 1
    first, second = case.step(), case.step()  # two different caches with the same values: the same output
    assert torch.equal(first, second)


@pytest.mark.slow  # runs a benchmark
def test_warm_and_cold_rows_time_the_same_step_both_ways():
    rows = decode.run_warm_cold((("gqa8", 64),), device=CPU, threads=1, progress=common.Progress(False),
                                min_run_time=0.001)
    assert rows[0]["warm_seconds"] > 0 and rows[0]["cold_seconds"] > 0 and rows[0]["cold_copies"] >= 2


ALLOCATOR_PROBE = """
import json, torch
from benchmarks import common


def resident_after_a_freed_block():
    before = common.rss_bytes()
    block = torch.ones(16 * 2**20 // 4)  # 16 MiB, touched
    del block
    return common.rss_bytes() - before


returned = common.set_allocator(False)
report = {"returned": returned}
if returned is not None:
    report["stays_returned"] = resident_after_a_freed_block()
    report["kept"] = common.set_allocator(True)
    report["stays_kept"] = resident_after_a_freed_block()
print(json.dumps(report))
"""


@pytest.mark.slow  # starts another Python process
def test_set_allocator_returns_or_keeps_a_freed_block():
    # a fresh process, so that no free block of an earlier test's heap serves the 16 MiB
    import subprocess

    done = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE], capture_output=True, text=True,
                          check=True, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report["returned"] is None:
        pytest.skip("malloc is not glibc's here: the allocator cannot be set")
    assert report["returned"]["mmap_threshold"] == report["returned"]["trim_threshold"] == 128 * 2**10
    assert report["stays_returned"] < 4 * 2**20  # mapped, then handed back
    assert report["kept"]["keep_freed"] and report["kept"]["mmap_threshold"] == 32 * 2**20
    assert report["stays_kept"] > 15 * 2**20  # from the heap, which stays


@pytest.mark.slow  # runs a benchmark
def test_allocator_control_times_the_same_step_with_both_settings():
    rows = decode.run_allocator_control((("int8", 64),), device=CPU, threads=1, progress=common.Progress(False),
                                        min_run_time=0.001)
    if not rows:
        pytest.skip("malloc is not glibc's here: the allocator cannot be set")
    assert rows[0]["design"] == "int8" and rows[0]["returned_seconds"] > 0 and rows[0]["kept_seconds"] > 0


def test_roofline_is_the_slower_of_reading_and_computing():
    record = {"cache_bytes": 2e9, "flops": 1e11, "operations": 3e11, "seconds": 0.5}
    decode.add_roofline(record, {"bytes_per_s": 1e10, "flop_per_s": 1e12})  # 0.2 s to read, 0.3 s to compute
    assert record["bound"] == "arithmetic" and math.isclose(record["roofline_seconds"], 0.3)
    assert math.isclose(record["percent_of_roofline"], 60.0) and math.isclose(record["percent_of_floor"], 40.0)
    record = {"cache_bytes": 4e9, "flops": 1e11, "operations": 1e11, "seconds": 0.8}
    decode.add_roofline(record, {"bytes_per_s": 1e10, "flop_per_s": 1e12})
    assert record["bound"] == "memory" and math.isclose(record["percent_of_roofline"], 50.0)


def test_roofline_range_spans_the_start_and_end_floors():
    start, end = {"bytes_per_s": 1e10, "flop_per_s": 1e12}, {"bytes_per_s": 2e10, "flop_per_s": 1e12}
    record = {"cache_bytes": 4e9, "flops": 1e9, "operations": 1e9, "seconds": 0.8}
    decode.add_roofline(record, {**start, "measured": [start, end]})
    assert record["roofline_range"] == [25.0, 50.0] and math.isclose(record["percent_of_roofline"], 50.0)


def _record(design, tokens, seconds, roof=None):
    return {"design": design, "tokens": tokens, "seconds": seconds, "percent_of_roofline": roof,
            "roofline_range": [roof, roof], "kind": "flash" if design in decode.FLASH_DESIGNS else "baseline"}


def test_target_report_judges_each_target_against_the_right_reference():
    records = [_record("gqa8", 8, 1.0, 70), _record("gqa8-sdpa", 8, 0.9, 80), _record("int8", 8, 0.4, 20),
               _record("int4", 8, 0.5, 20), _record("mqa", 8, 0.2, 45)]
    lines = {(line["target"], line["design"]): line for line in decode.target_report(records, (8,))}
    assert lines[("roofline", "gqa8")]["met"] and not lines[("roofline", "mqa")]["met"]
    assert math.isclose(lines[("roofline", "mqa")]["gap"], 60 / 45)
    sdpa = lines[("sdpa", "gqa8")]
    assert math.isclose(sdpa["value"], 1.0 / 0.9) and not sdpa["met"]
    assert lines[("ratio", "int8")]["met"] and math.isclose(lines[("ratio", "int8")]["value"], 0.4)
    assert not lines[("ratio", "int4")]["met"] and math.isclose(lines[("ratio", "int4")]["gap"], 0.5 / 0.35)
    assert ("roofline", "window-4k") not in lines  # not measured: no line, no verdict


def test_peak_extra_bytes_sees_a_temporary_allocation():
    def allocates():
        scratch = torch.ones(16 * 2**20 // 4)  # 16 MiB, touched, then freed
        return scratch.sum()

    extra = common.peak_extra_bytes(allocates)
    assert 16 * 2**20 <= extra <= 16 * 2**20 + 2**12
    assert common.peak_extra_bytes(lambda: None) == 0


@pytest.mark.slow  # runs a benchmark
def test_profile_step_lists_operators_by_time():
    profile = decode.profile_step("gqa8", 256, device=CPU, threads=1, top=3)
    assert profile["total_seconds"] > 0 and 1 <= len(profile["operators"]) <= 3
    times = [op["self_seconds"] for op in profile["operators"]]
    assert times == sorted(times, reverse=True) and all(0 <= op["share"] <= 1 for op in profile["operators"])
    assert math.isclose(sum(profile["kinds"].values()), 1.0) and profile["kinds"]["matrix products"] > 0


def test_profiler_operators_are_sorted_by_kind():
    assert decode.operator_kind("aten::bmm") == "matrix products"
    assert decode.operator_kind("aten::_int_mm") == "matrix products"
    assert decode.operator_kind("aten::exp") == "elementwise and reductions"
    assert decode.operator_kind("TorchDynamo Cache Lookup") == "overhead"


def test_decode_cache_bytes_follow_the_design():
    bytes_of = {d: decode.decode_case(d, 64, device=CPU, cold=False).cache_bytes for d in ("mha", "gqa8", "mqa", "int8", "int4")}
    assert bytes_of["mha"] == 4 * bytes_of["gqa8"] == 32 * bytes_of["mqa"]
    assert bytes_of["int8"] == bytes_of["gqa8"] // 4 + 2 * 8 * 64 * 4  # codes + float32 scales
    assert bytes_of["int4"] == bytes_of["gqa8"] // 8 + 2 * 8 * 64 * 4
    window = decode.decode_case("window-4k", decode.WINDOW + 100, device=CPU, query_heads=4, head_dim=8,
                                cold=False)
    assert window.cache_bytes == 2 * decode.GQA_KV_HEADS * decode.WINDOW * 8 * 4


def test_only_whole_cache_copies_count_extra_bytes_moved():
    # repeat_kv writes and rereads each KV head once per query head; a dequantised step writes a float copy
    moved = {d: decode.decode_case(d, 64, device=CPU, cold=False).bytes_moved
             for d in ("gqa8", "gqa8-materialised", "gqa8-dense-teaching", "int8", "int8-tiled")}
    groups = decode.QUERY_HEADS // decode.GQA_KV_HEADS
    assert moved["gqa8-dense-teaching"] == moved["gqa8"]
    assert moved["gqa8-materialised"] == (1 + 2 * groups) * moved["gqa8"]
    assert moved["int8-tiled"] == moved["int8"]  # a reused tile buffer is no whole-cache copy


def test_decode_designs_compute_the_same_attention_as_their_reference():
    def step(design, seed, tokens=50):
        return decode.decode_case(design, tokens, device=CPU, seed=seed, cold=False).step()

    gqa = [step(d, 3) for d in ("gqa8", "gqa8-sdpa", "gqa8-tiled", "gqa8-materialised", "gqa8-dense-teaching")]
    for other in gqa[1:]:
        assert torch.allclose(other, gqa[0], atol=1e-5)
    exact, integer = step("int8-tiled", 4), step("int8", 4)
    assert torch.allclose(integer, exact, atol=0.02 * float(exact.abs().max()))
    assert torch.allclose(step("latent-expanded", 5, 30), step("latent-absorbed", 5, 30), atol=1e-4)


def test_a_window_step_reads_only_its_window():
    small = decode.decode_case("window-4k", 64, device=CPU, query_heads=4, head_dim=8, window=16)
    large = decode.decode_case("window-4k", 6400, device=CPU, query_heads=4, head_dim=8, window=16)
    assert small.cache_bytes == large.cache_bytes == 2 * decode.GQA_KV_HEADS * 16 * 8 * 4
    assert small.flops == large.flops


@pytest.mark.slow  # runs a benchmark
@pytest.mark.parametrize("design", prefill.DESIGNS)
def test_each_prefill_design_runs_once_with_every_field(design):
    record = prefill.measure_prefill(design, 70, device=CPU, threads=1, min_run_time=0.001)
    assert set(prefill.RECORD_FIELDS) <= set(record) and record["seconds"] > 0 and record["flops"] > 0


def test_prefill_crossover_is_the_first_size_from_which_the_other_design_always_wins():
    rows = [("a", 1, 1.0), ("b", 1, 2.0), ("a", 2, 2.0), ("b", 2, 1.0), ("a", 4, 1.0), ("b", 4, 3.0),
            ("a", 8, 5.0), ("b", 8, 4.0), ("a", 16, 9.0), ("b", 16, 4.0)]
    records = [{"design": d, "tokens": n, "seconds": s} for d, n, s in rows]
    assert prefill.crossovers(records, "a", "b") == 8
    assert prefill.crossovers(records, "b", "a") is None


def test_scan_and_ssm_records_have_every_field():
    result = scan.run_scan([8, 33], device=CPU, threads=1, progress=common.Progress(False), min_run_time=0.001)
    for record in result["scan"]:
        assert set(scan.SCAN_RECORD_FIELDS) <= set(record)
    assert set(scan.SSM_RECORD_FIELDS) <= set(result["ssm_step"])
    ssm = result["ssm_step"]
    assert ssm["state_bytes"] == scan.SSM_INNER * scan.SSM_STATE * 4 and ssm["read_bytes"] == 4 * ssm["state_bytes"]
    # cold as the attention steps are: the copies it rotates through fill COLD_FACTOR x the cache
    assert ssm["copies"] * ssm["read_bytes"] >= measure.COLD_FACTOR * measure.device_cache_bytes(CPU)
    assert ssm["warm_seconds"] > 0 and ssm["seconds"] > 0


@pytest.mark.slow  # runs a benchmark
@pytest.mark.parametrize("design", memory.DESIGNS)
def test_each_memory_record_matches_the_formula(design):
    record = memory.measure_memory(design, 1500, device=CPU)
    assert set(memory.RECORD_FIELDS) <= set(record)
    assert record["tensor_bytes"] == record["formula_bytes"]


def test_memory_formula_uses_ch03_kv_bytes():
    config = ch03.KVConfig("gqa", layers=1, query_heads=32, head_dim=128, bytes_per_scalar=4, kv_heads=8)
    assert memory.formula_bytes("gqa8", 1000)[0] == ch03.kv_bytes(config, 1000)
    assert memory.formula_bytes("window-4k", 10_000)[0] == ch03.kv_bytes(config, decode.WINDOW)


@pytest.mark.slow  # starts gloo processes
def test_ring_benchmark_record_has_every_field():
    record = ring.measure_ring(2, 5, heads=1, head_dim=4)
    assert set(ring.RECORD_FIELDS) <= set(record)
    assert record["max_abs_diff"] < 1e-5 and record["total_cache_bytes"] == 2 * 5 * 4 * 4
    assert record["block_compute_seconds"] >= 0 and record["block_wait_seconds"] >= 0
    sharded = ring.measure_sharded(2, 12, query_heads=4, kv_heads=2, head_dim=8)
    assert set(ring.SHARDED_FIELDS) <= set(sharded) and sharded["max_abs_diff"] < 1e-5
    assert sharded["bytes_per_step"] < sharded["ring_bytes_per_step"]


@pytest.mark.slow  # runs a benchmark
def test_summary_table_names_machine_floor_and_crossovers():
    progress = common.Progress(False)
    results = {"machine": support.machine_record(CPU, 1, "quick"),
               "floors": {"bytes_per_s": 1e10, "flop_per_s": 1e11},
               "decode": [decode.add_roofline(decode.measure_decode("mha", 16, device=CPU, threads=1,
                                                                    min_run_time=0.001),
                                              {"bytes_per_s": 1e10, "flop_per_s": 1e11})],
               "prefill": prefill.run_prefill([16], ("full-sdpa", "linear-chunked"), device=CPU, threads=1,
                                              progress=progress, min_run_time=0.001)}
    table = summary_table(results)
    assert "floor: read 10.0 GB/s" in table and "mha" in table and "linear-chunked" in table


# --------------------------------------------------------------------------- results files


def test_results_files_hold_every_figure():
    files = sorted(common.RESULTS_DIR.glob("benchmarks-*.json"))  # Chapter 10's; serving-*.json are Chapter 13's
    assert files, "ship at least one results file in benchmarks/results/"
    others = common.other_machine_folders()  # the appendix's other machines, one folder each
    assert others and not list(common.OTHER_MACHINES_DIR.glob("*.json")), "a run there goes in its machine's folder"
    for folder in others:
        files += sorted(folder.glob("benchmarks-*.json"))
    for folder in (common.RESULTS_DIR, *others):
        assert {path.name.split("-")[0] for path in folder.glob("*.json")} <= {"benchmarks", "serving", "ceilings"}
    for path in files:
        results = json.loads(path.read_text())
        for key in ("device", "device_name", "threads", "torch_version", "date", "cpu_model", "mode"):
            assert key in results["machine"], (path.name, key)
        assert results["floors"]["bytes_per_s"] > 0
        assert results["machine"]["llc_bytes"] > 0 and "load_average_start" in results["machine"]
        assert len(results["floors"]["measured"]) == 2  # at the start and at the end of the run
        for part, fields in (("decode", decode.RECORD_FIELDS), ("prefill", prefill.RECORD_FIELDS),
                             ("memory", memory.RECORD_FIELDS)):
            assert results[part], (path.name, part)
            for record in results[part]:
                assert set(fields) <= set(record), (path.name, part)
        for record in results["ring"]["runs"] + results["ring"]["overlap"]:
            assert set(ring.RECORD_FIELDS) <= set(record), path.name
        assert results["ring"]["link_bytes_per_s"] > 0 and results["ring"]["sharded"], path.name
        assert {r["design"] for r in results["decode"]} == set(decode.DESIGNS)
        if "ceilings" in results:  # judged against separate ceilings: every record counts its work by kind
            assert all(set(decode.WORK_FIELDS) <= set(r) for r in results["decode"]), path.name
        assert all(r["percent_of_roofline"] > 0 and r["copies"] >= 2 for r in results["decode"]), path.name
        assert all(r["rotated_bytes"] >= measure.COLD_FACTOR * results["machine"]["llc_bytes"]
                   or r["copies"] == measure.MAX_COPIES for r in results["decode"]), path.name
        assert all(r["runs"] >= 5 for r in results["decode"]), path.name
        assert results["targets"] and results["warm_cold"], path.name
        for profile in results["profiles"]:
            assert profile["operators"] and profile["total_seconds"] > 0, path.name
            assert math.isclose(sum(profile["kinds"].values()), 1.0), path.name


def test_the_chapter_reads_the_newest_full_run_through_the_one_loader():
    """A run is saved as benchmarks-<device>[-<mode>].json; support.load_results("benchmarks") takes the
    newest full one, so a quick run or one that left parts out (--skip: "partial") never replaces it."""
    assert common.default_results_path(CPU, "full").name == f"benchmarks-{support.runs.device_slug(CPU)}.json"
    assert common.default_results_path(CPU, "partial").name.endswith("-partial.json")
    assert common.default_results_path(CPU, "full").parent == common.YOURS_DIR  # a reader's run, beside
    run, path = support.load_results("benchmarks")
    assert path.parent == common.RESULTS_DIR and run["machine"]["mode"] == "full"
    assert path in sorted(common.RESULTS_DIR.glob("benchmarks-*.json"))


def test_a_readers_run_goes_beside_the_chapters_and_never_replaces_theirs(tmp_path):
    """The chapters' sentences are asserted against the runs they were written on. A default run goes to
    results/yours/, which the loader does not read in their place, even when it is newer and full."""
    results, yours = tmp_path / "results", tmp_path / "results" / "yours"
    chapters_run = {"machine": {"mode": "full", "date": "2026-12-03T14:26:00"}}
    readers_run = {"machine": {"mode": "full", "date": "2027-01-01T09:00:00"}}
    support.write_results(chapters_run, results / "benchmarks-cpu-amd-epyc.json")
    support.write_results(readers_run, yours / "benchmarks-cpu-amd-epyc.json")  # one name, two machines
    assert support.load_results("benchmarks", folder=results)[0] == chapters_run
    assert support.load_results("benchmarks", folder=yours)[0] == readers_run
    assert common.YOURS_DIR.parent == common.RESULTS_DIR and common.YOURS_DIR not in support.results_folders()
    gitignore = (common.RESULTS_DIR.parent.parent / ".gitignore").read_text().splitlines()
    assert "benchmarks/results/yours/" in gitignore, "a reader's runs stay out of git"


def test_quick_sizes_cover_every_part():
    for key in ("decode_tokens", "prefill_tokens", "scan_tokens", "memory_tokens", "ring_parts"):
        assert QUICK[key]


# --------------------------------------------------------------------------- bad inputs


def test_unknown_device_raises_value_error():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        common.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            common.resolve_device("cuda")
    assert common.resolve_device("auto").type in ("cpu", "cuda")


def test_unknown_design_raises_value_error():
    with pytest.raises(ValueError, match="unknown design 'flash'"):
        decode.decode_case("flash", 16, device=CPU)
    with pytest.raises(ValueError, match="unknown design"):
        prefill.prefill_case("dense", 16, device=CPU)
    with pytest.raises(ValueError, match="unknown design"):
        memory.formula_bytes("paged", 16)


@pytest.mark.parametrize("tokens", [0, -3])
def test_tokens_below_one_raise_value_error(tokens):
    with pytest.raises(ValueError, match="tokens"):
        decode.decode_case("mha", tokens, device=CPU)
    with pytest.raises(ValueError, match="tokens"):
        prefill.prefill_case("full-sdpa", tokens, device=CPU)
    with pytest.raises(ValueError, match="tokens"):
        memory.formula_bytes("mha", tokens)
    with pytest.raises(ValueError, match="tokens"):
        scan.scan_inputs(tokens, device=CPU)


def test_parts_below_one_raise_value_error():
    with pytest.raises(ValueError, match="parts"):
        ring.measure_ring(0, 8)


def test_teaching_prefill_refuses_sizes_that_would_build_huge_score_matrices():
    with pytest.raises(ValueError, match="full-teaching"):
        prefill.prefill_case("full-teaching", prefill.TEACHING_FULL_LIMIT + 1, device=CPU)


def test_command_line_rejects_unknown_device():
    from benchmarks.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--device", "tpu"])
    assert math.isfinite(QUICK["min_run_time"])


def test_best_floors_keeps_the_faster_of_each_measurement():
    def record(copy, read, flops):
        return {"bandwidth": {"copy_bytes_per_s": copy, "copy_seconds": 1 / copy, "read_bytes_per_s": read,
                              "read_seconds": 1 / read, "buffer_bytes": 64},
                "matmul": {"flop_per_s": flops}}

    first, second = record(3.0, 17.0, 5.0), record(25.0, 16.0, 8.0)
    first["read_by"], second["read_by"] = "sum", "matrix-vector product"
    best = measure.best_floors(first, second)
    assert best["bandwidth"]["copy_bytes_per_s"] == 25.0 and best["bandwidth"]["read_bytes_per_s"] == 17.0
    assert best["bytes_per_s"] == 17.0 and best["flop_per_s"] == 8.0  # B is the read floor, never the copy
    assert best["read_by"] == "sum" and best["measured"] == [first, second]


@pytest.mark.slow  # runs the whole quick benchmark suite at tiny sizes (about 30 s)
def test_command_line_quick_run_writes_a_complete_results_file(tmp_path, monkeypatch, capsys):
    import benchmarks.__main__ as cli

    tiny = {"decode_tokens": [64], "prefill_tokens": [64], "scan_tokens": [16], "memory_tokens": [32],
            "ring_parts": [2], "ring_tokens": 9, "ring_overlap_tokens": 16, "sharded_tokens": 16,
            "warm_cold": (("gqa8", 64),), "allocator_control": (("int8", 64),), "min_run_time": 0.001}
    for key, value in tiny.items():
        monkeypatch.setitem(cli.QUICK, key, value)
    out = tmp_path / "tiny.json"
    threads_before = torch.get_num_threads()
    try:
        assert cli.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads_before)
    results = json.loads(out.read_text())
    assert results["machine"]["mode"] == "quick" and results["machine"]["threads"] == 1
    assert {r["design"] for r in results["decode"]} == set(decode.DESIGNS)
    assert len(results["prefill"]) == len(prefill.DESIGNS) and results["ring"]["runs"][0]["parts"] == 2
    assert results["machine"]["llc_bytes"] == measure.last_level_cache_bytes()
    assert results["machine"]["l2_bytes"] == measure.cache_sizes().get(2)
    printed = capsys.readouterr().out
    assert "decode step at T=64" in printed and f"wrote {out}" in printed
    assert results["targets"] and isinstance(results["profiles"], list)
    if results["machine"]["allocator"] is not None:  # glibc: the control ran, and the run kept freed memory
        assert results["machine"]["allocator"]["keep_freed"] is True
        assert [(r["design"], r["tokens"]) for r in results["allocator"]] == [("int8", 64)]
    assert {r["design"] for r in results["decode"] if r["percent_of_roofline"] > 0} == set(decode.DESIGNS)


def test_command_line_rejects_threads_below_one(capsys):
    import benchmarks.__main__ as cli

    assert cli.main(["--threads", "0"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err
