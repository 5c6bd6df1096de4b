"""The separate ceilings, the bandwidth sweep, the chunk sweep, the interleaved ratios, the allocator's
settings in a fresh process, and the guards of the CUDA path (benchmarks/ceilings.py, support.measure)."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch
from longctx.support import measure

from benchmarks import ceilings, common, decode

CPU = torch.device("cpu")


def test_arithmetic_time_is_each_kinds_work_over_its_own_ceiling():
    rates = {"float": 100.0, "int": 400.0, "convert": 50.0, "shift": 50.0, "scale": 25.0}
    assert measure.arithmetic_seconds({"int": 800, "scale": 50}, rates) == pytest.approx(2.0 + 2.0)
    assert measure.arithmetic_seconds({}, rates) == 0
    with pytest.raises(ValueError, match="without a ceiling: \\['dequant'\\]"):
        measure.arithmetic_seconds({"dequant": 1}, rates)


def test_the_integer_floor_refuses_sizes_the_integer_product_cannot_take_and_times_one_it_can():
    for size in (16, 20):
        with pytest.raises(ValueError, match="multiple of 8 above 16"):
            measure.int_matmul_floor(device=CPU, threads=1, size=size)
    record = measure.int_matmul_floor(device=CPU, threads=1, size=64, min_run_time=0.01)
    assert record["op_per_s"] == pytest.approx(2 * 64**3 / record["seconds"])


def test_elementwise_floor_times_its_three_passes_on_a_buffer_a_quarter_of_the_cache():
    record = measure.elementwise_floor(device=CPU, threads=1, cache_bytes=2**20, min_run_time=0.01)
    assert record["elements"] == 2**18  # at least 256K numbers, however small the cache
    assert measure.elementwise_floor(device=CPU, threads=1, cache_bytes=2**24, min_run_time=0.01)[
        "elements"] == 2**24 // 16
    assert all(record[f"{kind}_per_s"] > 1e6 for kind in measure.ELEMENTWISE_KINDS)


def test_effective_cache_is_the_largest_buffer_read_well_above_the_memory_plateau():
    def sweep(rates):
        return [{"bytes": 2**20 * 2**i, "bytes_per_s": rate} for i, rate in enumerate(rates)]

    # 1, 2, 4 MiB at 60 GB/s, 8 MiB at 30, then memory's 15: the cut is sqrt(60 x 15) = 30
    assert measure.effective_cache_bytes(sweep([60e9, 60e9, 60e9, 30e9, 15e9, 15e9])) == 8 * 2**20
    assert measure.effective_cache_bytes(sweep([15e9, 15.5e9, 15e9])) is None  # no step: nothing cached
    with pytest.raises(ValueError, match="at least two"):
        measure.effective_cache_bytes(sweep([1e9]))
    assert measure.sweep_sizes(2**20) == [256 * 2**10, 384 * 2**10, 512 * 2**10, 768 * 2**10, 2**20]


def test_the_bandwidth_sweep_reads_buffers_of_the_sizes_asked_for():
    rows = measure.read_bandwidth_sweep(device=CPU, threads=1, sizes=[2**16, 2**20], min_run_time=0.01)
    assert [row["bytes"] for row in rows] == [2**16, 2**20] and all(row["bytes_per_s"] > 0 for row in rows)
    with pytest.raises(ValueError, match="at least 4096"):
        measure.read_bandwidth_sweep(device=CPU, threads=1, sizes=[1024])


def test_cold_copies_fill_a_gpus_l2_on_cuda_and_the_llc_on_a_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(
        L2_cache_size=60 * 2**20))
    cuda = torch.device("cuda")
    assert measure.device_cache_bytes(cuda) == 60 * 2**20
    assert measure.cold_copies(30 * 2**20, True, cuda) == measure.COLD_FACTOR * 2
    monkeypatch.setattr(measure, "last_level_cache_bytes", lambda: 8 * 2**20)
    assert measure.cold_copies(2**20, True, CPU) == measure.COLD_FACTOR * 8
    assert measure.cold_copies(2**20, False, cuda) == 1


def test_a_decode_case_counts_the_designs_least_work_apart_from_what_its_implementation_does():
    tokens, heads, width, kv = 256, decode.QUERY_HEADS, decode.HEAD_DIM, decode.GQA_KV_HEADS
    flops = 4 * heads * tokens * width
    int8 = decode.decode_case("int8", tokens, device=CPU, cold=False)
    assert int8.work == {"int": flops, "scale": 3 * heads * tokens}
    assert int8.implementation_work["int"] == flops * 3 // 2  # the mix twice: two digits of each weight
    assert int8.operations == sum(int8.implementation_work.values())
    int4 = decode.decode_case("int4", tokens, device=CPU, cold=False)
    assert int4.work["shift"] == 2 * kv * tokens * width  # one shift per code
    gqa = decode.decode_case("gqa8", tokens, device=CPU, cold=False, chunk=64)
    assert gqa.work == gqa.implementation_work == {"float": flops}
    with pytest.raises(ValueError, match="chunk must be an integer >= 1"):
        decode.decode_case("gqa8", tokens, device=CPU, chunk=0)


def test_a_roofline_with_separate_ceilings_can_make_an_integer_step_arithmetic_bound():
    record = {"cache_bytes": 1000, "operations": 8000, "work": {"int": 8000}, "seconds": 1.0}
    floors = {"bytes_per_s": 100.0, "flop_per_s": 1000.0}
    memory, one = decode.roofline_seconds(record, floors)
    assert (memory, one) == (10.0, 8.0)  # at the float rate: memory-bound
    _, separate = decode.roofline_seconds(record, floors, {"int": 200.0, "convert": 1, "shift": 1, "scale": 1})
    assert separate == 40.0
    decode.add_roofline(record, floors, {"int": 200.0, "convert": 1, "shift": 1, "scale": 1})
    assert record["bound"] == "arithmetic" and record["roofline_seconds"] == 40.0


def test_allocator_settings_are_checked_and_heap_only_needs_kept_memory():
    with pytest.raises(ValueError, match="setting must be one of default, returned, capped, heap"):
        ceilings.apply_setting("jemalloc")
    with pytest.raises(ValueError, match="heap_only=True needs keep=True"):
        common.set_allocator(False, heap_only=True)


HEAP_PROBE = """
import json, sys, torch
from benchmarks import common
setting = common.set_allocator(True, heap_only=sys.argv[1] == "heap")
before = common.rss_bytes()
block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched: above the 32 MiB glibc caps its threshold at
del block
print(json.dumps({"setting": setting, "stays": common.rss_bytes() - before}))
"""


@pytest.mark.slow  # starts two Python processes
def test_only_the_heap_setting_keeps_a_block_above_glibcs_32_mib_cap():
    stays = {}
    for setting in ("capped", "heap"):
        done = subprocess.run([sys.executable, "-c", HEAP_PROBE, setting], capture_output=True, text=True,
                              check=True, timeout=120)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        if report["setting"] is None:
            pytest.skip("malloc is not glibc's here: the allocator cannot be set")
        stays[setting] = report["stays"]
        assert report["setting"]["mmap_max"] == (0 if setting == "heap" else common.DEFAULT_MMAP_MAX)
    assert stays["capped"] < 4 * 2**20  # mapped afresh, and unmapped when freed
    assert stays["heap"] > 60 * 2**20  # from the heap, which is kept


@pytest.mark.slow  # runs the study, with its fresh allocator processes
def test_the_quick_study_saves_ceilings_sweeps_chunks_ratios_and_allocator_rows(tmp_path):
    out = tmp_path / "ceilings.json"
    assert ceilings.main(["--quick", "--threads", "1", "--out", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["ceilings"]["int_matmul"]["op_per_s"] > 0 and set(run["ceilings"]["rates"]) == {
        "int", "convert", "shift", "scale"}
    assert [row["bytes"] for row in run["sweep"]["rows"]] == measure.sweep_sizes(16 * 2**20)
    chunks = [row["chunk"] for row in run["chunks"]]
    assert chunks == list(ceilings.QUICK["chunks"])
    assert next(row for row in run["chunks"] if row["chunk"] == decode.CHUNK)["ratio"] == 1.0
    assert [row["groups_per_pass"] for row in run["kivi_passes"]] == list(ceilings.QUICK["kivi_passes"])
    for row in run["chunks"]:
        assert row["low"] <= row["seconds"] <= row["high"] and len(row["rounds"]) == ceilings.QUICK["rounds"]
    pairs = {(line["of"], line["to"], line["tokens"]) for line in run["ratios"]["ratios"]}
    assert pairs == set(ceilings.QUICK["ratio_pairs"])
    for line in run["ratios"]["ratios"]:
        assert line["low"] <= line["ratio"] <= line["high"]
    mha = next(line for line in run["ratios"]["ratios"] if line["to"] == "mha")
    assert mha["bytes_ratio"] == decode.GQA_KV_HEADS / decode.QUERY_HEADS
    int8 = run["ratios"]["quantised"][0]
    assert int8["design"] == "int8" and int8["implementation_seconds"] > int8["design_seconds"] > 0
    assert [p["design"] for p in run["kivi_profiles"]] == list(ceilings.KIVI_PROFILED)
    for profile in run["kivi_profiles"]:
        assert profile["tokens"] == ceilings.QUICK["kivi_tokens"] and sum(profile["kinds"].values()) == pytest.approx(1)
    timed = {(s["design"], s["tokens"]) for s in run["ratios"]["steps"]}
    assert {(d, t) for d in decode.FLOAT_DESIGNS for t in ceilings.QUICK["target_tokens"]} <= timed
    assert {(line["target"], line["design"]) for line in run["targets"]} == {
        *(("roofline", d) for d in decode.FLOAT_DESIGNS), ("mha-bandwidth", "gqa8"), ("ratio", "int8"),
        ("prefill", "flash-prefill")}
    for line in run["targets"]:
        assert line["low"] <= line["value"] <= line["high"] and line["verdict"] in ("met", "missed", "not decided")
    assert {row["form"] for row in run["shapes"]["rows"]} <= set(ceilings.SHAPE_FORMS)
    if torch.backends.mkl.is_available():
        assert set(run["shapes"]["kernels"]) == set(ceilings.SHAPE_FORMS) - {"step", "flex"}
        assert all(calls and all(c.startswith("SGEMM") for c in calls) for calls in run["shapes"]["kernels"].values())
    if run["machine"]["allocator"] is not None:
        row = run["allocator"][0]
        assert all(len(row["each"][s]) == 2 and row[f"{s}_seconds"] > 0 for s in ceilings.ALLOCATOR_SETTINGS)


def test_the_chunk_spread_is_the_slowest_ratio_over_the_fastest_at_each_length():
    rows = [{"tokens": 8, "ratio": r} for r in (1.0, 1.2, 0.8)] + [{"tokens": 16, "ratio": r} for r in (1.0, 1.1)]
    assert ceilings.chunk_spread(rows) == pytest.approx({8: 1.5, 16: 1.1})


def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_goal():
    verdict = ceilings.interval_verdict
    assert [verdict(low, high, 1.0, at_most=True) for low, high in ((0.8, 0.99), (0.9, 1.1), (1.01, 1.2))] == [
        "met", "not decided", "missed"]
    assert [verdict(low, high, 60, at_most=False) for low, high in ((61, 70), (55, 65), (40, 59))] == [
        "met", "not decided", "missed"]
    assert verdict(0.5, 1.0, 1.0, at_most=True) == "met" and verdict(60, 70, 60, at_most=False) == "met"


def test_interval_targets_turn_step_times_into_shares_and_time_ratios_into_bandwidth_ratios():
    floors = {"bytes_per_s": 1e9, "flop_per_s": 1e12}
    rates = {"int": 1e11, "convert": 1e10, "shift": 1e10, "scale": 1e10}
    gqa = {"design": "gqa8", "tokens": 64, "cache_bytes": 10**7, "work": {"float": 10**6},
           "seconds": 0.02, "low": 0.0125, "high": 0.025}  # roofline 10 ms: 50 % [40, 80]
    ratios = {"steps": [gqa], "ratios": [
        {"of": "gqa8", "to": "mha", "tokens": 64, "ratio": 0.5, "low": 0.4, "high": 0.625, "bytes_ratio": 0.25},
        {"of": "int8", "to": "gqa8", "tokens": 64, "ratio": 0.3, "low": 0.2, "high": 0.45}]}
    prefill = [{"of": "flash-prefill", "to": "full-sdpa", "tokens": 512, "ratio": 2.5, "low": 2.1, "high": 3.0}]
    lines = {line["target"]: line for line in ceilings.interval_targets(ratios, prefill, floors, rates, (64,))}
    assert set(lines) == {"roofline", "mha-bandwidth", "ratio", "prefill"}
    roof = lines["roofline"]
    assert (roof["value"], roof["low"], roof["high"]) == pytest.approx((50, 40, 80))
    assert roof["verdict"] == "not decided"
    bandwidth = lines["mha-bandwidth"]  # 0.25 of the bytes in 0.5 of the time: half MHA's rate
    assert (bandwidth["value"], bandwidth["low"], bandwidth["high"]) == pytest.approx((0.5, 0.4, 0.625))
    assert bandwidth["verdict"] == "missed"
    assert lines["ratio"]["verdict"] == "met" and lines["prefill"]["verdict"] == "missed"


def test_every_shape_form_computes_the_same_products_as_the_steps_form():
    calls, read = ceilings.shape_calls(1024, device=CPU)
    scores, one_row, left = calls["scores"](), calls["scores-one-row"](), calls["scores-left"]()
    whole, left_whole = calls["scores-whole"](), calls["scores-left-whole"]()
    # (1, H_kv, C, G, chunk) against (1, H_kv, G, T) and (1, H_kv, T, G): one layout apart
    flat = scores.permute(0, 1, 3, 2, 4).reshape(whole.shape)
    torch.testing.assert_close(flat, whole)
    torch.testing.assert_close(flat, left_whole.transpose(-2, -1))
    torch.testing.assert_close(left.transpose(-2, -1), scores)
    torch.testing.assert_close(one_row, scores[..., :1, :])
    values = calls["values"]()
    torch.testing.assert_close(calls["values-left"]().transpose(-2, -1), values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(calls["values-whole"](), values.sum(2), rtol=1e-4, atol=1e-4)
    assert read["step"] == read["scores"] + read["values"] == 2 * 8 * 1024 * 128 * 4
    with pytest.raises(ValueError, match="multiple of the chunk"):
        ceilings.shape_calls(1000, device=CPU)


def test_the_cuda_run_is_refused_with_a_message_where_there_is_no_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the end-to-end test below runs instead")
    assert ceilings.main(["--device", "cuda"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the GPU path runs only there")
def test_the_quick_benchmarks_run_end_to_end_on_cuda(tmp_path):
    from benchmarks.__main__ import main

    out = tmp_path / "cuda.json"
    assert main(["--quick", "--device", "cuda", "--skip", "ring", "--out", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["machine"]["device"] == "cuda" and run["decode"]


def test_the_integer_routes_products_are_the_shapes_cudas_integer_product_refuses():
    groups = decode.QUERY_HEADS // decode.GQA_KV_HEADS
    assert not decode.cuda_int_mm_ok(4096, groups)  # scores: a tile of codes @ G stacked rows
    assert not decode.cuda_int_mm_ok(2 * groups, decode.HEAD_DIM)  # mix: 2G digit rows @ the codes
    assert decode.cuda_int_mm_ok(32, 8) and not decode.cuda_int_mm_ok(16, 8) and not decode.cuda_int_mm_ok(32, 12)
    skipped = []
    decode.run_decode([64], ("int8", "int4"), device=torch.device("cuda"), threads=1, progress=skipped.append)
    assert len(skipped) == 2 and all("skipped on cuda" in line for line in skipped)


def test_every_saved_ceilings_run_holds_each_part_the_appendix_reads():
    files = sorted(common.RESULTS_DIR.glob("ceilings-*.json"))
    assert files, "ship the ceilings study's run in benchmarks/results/ (python -m benchmarks.ceilings)"
    for folder in common.other_machine_folders():
        (main_run,) = folder.glob("benchmarks-*.json")  # one machine's folder: its main run and its study
        (study,) = folder.glob("ceilings-*.json")
        machines = [json.loads(path.read_text())["machine"] for path in (main_run, study)]
        assert machines[0]["isa_flags"] == machines[1]["isa_flags"], folder.name  # one machine, not two
        files.append(study)
    for path in files:
        run = json.loads(path.read_text())
        assert {"isa_flags", "cpu_capability", "load_average_start", "load_average_end"} <= set(run["machine"])
        assert set(run["ceilings"]["rates"]) == {"int", *measure.ELEMENTWISE_KINDS}
        sizes = run["sizes"]
        assert {(r["of"], r["to"], r["tokens"]) for r in run["ratios"]["ratios"]} == {
            tuple(pair) for pair in sizes["ratio_pairs"]}
        for line in run["ratios"]["ratios"]:
            assert line["low"] <= line["ratio"] <= line["high"] and line["rounds"] == sizes["rounds"]
        assert {(r["tokens"], r["chunk"]) for r in run["chunks"]} == {
            (t, c) for t in sizes["chunk_tokens"] for c in sizes["chunks"]}
        assert measure.effective_cache_bytes(run["sweep"]["rows"]) == run["sweep"]["effective_cache_bytes"]
        for row in run["allocator"]:
            assert all(len(row["each"][s]) == 2 for s in ceilings.ALLOCATOR_SETTINGS), path.name
        assert len(run["targets"]) == len(decode.TARGET_TOKENS) * (len(decode.FLOAT_DESIGNS) + 4) + len(
            sizes["prefill_pairs"]), path.name
        assert {row["form"] for row in run["shapes"]["rows"]} | {"flex"} == set(ceilings.SHAPE_FORMS)
        assert [p["design"] for p in run["kivi_profiles"]] == list(ceilings.KIVI_PROFILED), path.name


def test_peak_extra_bytes_counts_the_tensors_a_call_holds_at_once_whatever_the_allocator_keeps():
    def holds_twelve_mib():
        first = torch.ones(8 * 2**20 // 4)  # 8 MiB
        second = torch.ones(4 * 2**20 // 4)  # 4 MiB while the first is alive: 12 at the peak
        del first
        third = torch.ones(2 * 2**20 // 4)  # after the first is freed: no new peak
        return second.sum() + third.sum()

    common.set_allocator(True, heap_only=True)  # a kept heap: the resident size would not say
    try:
        for _ in range(2):
            peak = common.peak_extra_bytes(holds_twelve_mib)
            assert 12 * 2**20 <= peak < 12 * 2**20 + 2**12, peak
    finally:
        common.set_allocator(True)


def test_the_kivi_pass_size_reaches_the_step_and_is_checked():
    with pytest.raises(ValueError, match="kivi_passes must be an integer >= 1"):
        decode.decode_case("kivi4", 64, device=CPU, kivi_passes=0)
    import inspect

    from longctx import ch05
    assert decode.KIVI_PASSES == inspect.signature(ch05.KiviCache.attend).parameters["groups_per_pass"].default
