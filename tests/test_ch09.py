"""Chapter 15: the saved runs read back, and the ranking on requests whose answer is decided by construction."""

from __future__ import annotations

import math

import pytest
from longctx import ch03, ch09, support

DECODE, _ = support.load_results("benchmarks")
FORGETTING, _ = support.load_results("forgetting")
LLAMA = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
GIB = 2**30


def _decode_run(seconds_at_1k: dict[str, float], shares: dict[str, float]) -> dict:
    """A made-up Chapter 10 run: each design's step grows linearly with length from 1K to 64K."""
    rows = []
    for design, seconds in seconds_at_1k.items():
        for tokens in (1_024, 4_096, 65_536):
            rows.append({"design": design, "tokens": tokens, "seconds": seconds * tokens / 1_024,
                         "cache_bytes": round(shares[design] * tokens * 64)})
    return {"decode": rows}


def _forgetting_run(found: dict[tuple[str, float | None], float], trials: int = 20) -> dict:
    """A made-up Chapter 12 run of one seed whose policies find exactly the given shares."""
    entries = [{"policy": policy, "budget": budget,
                "single": "1" * round(share * trials) + "0" * (trials - round(share * trials))}
               for (policy, budget), share in found.items()]
    return {"budgets": [0.1, 0.25, 0.5, 1.0], "runs": [{"entries": entries}]}


def test_found_shares_read_only_the_seeds_that_passed_the_gate():
    run = {"runs": [{"passed": True, "entries": [{"policy": "full", "budget": None, "single": "11"}]},
                    {"passed": False, "entries": [{"policy": "full", "budget": None, "single": "00"}]}]}
    assert ch09.found_shares(run) == {("full", None): 1.0}


EVEN = _decode_run({"gqa8": 1.0, "int8": 0.6, "int4": 0.8, "kivi2": 2.0},
                   {"gqa8": 1.0, "int8": 0.25, "int4": 0.125, "kivi2": 0.1})
EVERY = {("full", None): 0.9, ("int8", None): 0.9, ("int4", None): 0.7, ("kivi2", None): 0.6,
         **{(p, b): s for p in ("streaming", "snapkv") for b, s in ((0.1, 0.2), (0.25, 0.5), (0.5, 0.88))}}


def test_step_seconds_is_the_measured_time_at_measured_lengths_and_log_linear_between():
    rows = {r["tokens"]: r["seconds"] for r in DECODE["decode"] if r["design"] == "gqa8"}
    for tokens, seconds in rows.items():
        assert ch09.step_seconds(DECODE, "gqa8", tokens) == pytest.approx(seconds)
    low, high = sorted(rows)[2:4]
    middle = math.sqrt(low * high)
    assert ch09.step_seconds(DECODE, "gqa8", middle) == pytest.approx(math.sqrt(rows[low] * rows[high]))
    assert ch09.step_seconds(EVEN, "int8", 131_072) == pytest.approx(0.6 * 128)  # the last line continued
    assert ch09.step_seconds(EVEN, "int8", 512) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="no rows"):
        ch09.step_seconds(EVEN, "latent", 1_024)


def test_byte_shares_read_chapter_5_against_the_models_own_precision():
    measured = {r["design"]: r["cache_bytes"] for r in DECODE["decode"] if r["tokens"] == 65_536}
    float32 = ch09.byte_shares(DECODE, 4)
    assert float32["int8"] == pytest.approx(measured["int8"] / measured["gqa8"])
    assert ch09.byte_shares(DECODE, 2)["int4"] == pytest.approx(2 * measured["int4"] / measured["gqa8"])
    assert float32["full"] == float32["streaming"] == float32["snapkv"] == 1.0
    assert 0.5 < ch09.byte_shares(DECODE, 2)["int8"] < 0.53  # codes a byte, a float32 scale per 128


def test_found_shares_pool_every_seed():
    run = {"runs": [{"entries": [{"policy": "full", "budget": None, "single": "1100"}]},
                    {"entries": [{"policy": "full", "budget": None, "single": "1000"}]}]}
    assert ch09.found_shares(run) == {("full", None): 3 / 8}


def test_a_request_the_full_cache_fits_ranks_the_equally_good_by_speed_and_leaves_out_eviction():
    ranked = ch09.served_options(LLAMA, 4_096, 64 * GIB, decode=EVEN, forgetting=_forgetting_run(EVERY))
    assert [o.design for o in ranked] == ["int8", "full", "int4", "kivi2"]  # 0.9, 0.9 by step; then 0.7; 0.6
    assert all(o.fits and o.kept == 4_096 for o in ranked)
    assert ranked[1].cache_bytes == ch03.kv_bytes(LLAMA, 4_096)
    assert ranked[0].cache_bytes == math.ceil(0.25 * 4 / 2 * ch03.kv_bytes(LLAMA, 4_096))


def test_a_tight_request_puts_what_fits_first_and_the_rest_by_size():
    full = ch03.kv_bytes(LLAMA, 65_536)
    memory = int(0.3 * full)  # int4 and kivi2 fit; int8 (0.5) and full do not; eviction keeps 30 %
    ranked = ch09.served_options(LLAMA, 65_536, memory, decode=EVEN, forgetting=_forgetting_run(EVERY))
    fitting = [o.design for o in ranked if o.fits]
    assert set(fitting) == {"int4", "kivi2", "streaming", "snapkv"}
    assert [o.design for o in ranked][:len(fitting)] == fitting  # no misfit above a fit
    assert [o.design for o in ranked if not o.fits] == ["int8", "full"]
    kept = ch03.tokens_that_fit(LLAMA, memory)
    evicting = {o.design: o for o in ranked if o.design in ("streaming", "snapkv")}
    assert all(o.kept == kept and o.found == 0.5 for o in evicting.values())  # the 25 % budget's evidence
    assert evicting["streaming"].step == pytest.approx(kept / 65_536)  # reads only what it keeps
    assert fitting[0] == "int4"  # 0.7 beats the evictions' 0.5 and kivi2's 0.6 (outside 0.05)


def test_eviction_below_every_measured_budget_has_no_evidence_and_follows_the_measured():
    full = ch03.kv_bytes(LLAMA, 65_536)
    ranked = ch09.served_options(LLAMA, 65_536, int(0.05 * full), decode=EVEN,
                                 forgetting=_forgetting_run(EVERY))
    assert [(o.design, o.found) for o in ranked if o.fits] == [("streaming", None), ("snapkv", None)]
    tolerant = ch09.served_options(LLAMA, 4_096, 64 * GIB, decode=EVEN, forgetting=_forgetting_run(EVERY),
                                   tolerance=0.25)
    assert [o.design for o in tolerant] == ["int8", "int4", "full", "kivi2"]  # 0.9, 0.9, 0.7 one group


def test_the_saved_runs_give_a_ranking_for_every_shipped_config():
    for name in ch03.MODEL_CONFIG_NAMES:
        config = ch03.KVConfig.from_hf_config(ch03.load_model_config(name))
        ranked = ch09.served_options(config, 32_768, 8 * GIB, decode=DECODE, forgetting=FORGETTING, batch=4)
        assert {o.design for o in ranked} <= set(ch09.SERVED_DESIGNS) and ranked
        assert [o.fits for o in ranked] == sorted((o.fits for o in ranked), reverse=True)


@pytest.mark.parametrize(("argument", "value", "error"), [
    ("tokens", 0, ValueError), ("memory", -1, ValueError), ("batch", 0, ValueError),
    ("tolerance", 1.5, ValueError), ("config", "llama", TypeError), ("task", "several", ValueError)])
def test_served_options_refuses_a_bad_request_by_name(argument, value, error):
    request = {"config": LLAMA, "tokens": 1_024, "memory": GIB, "batch": 1, "tolerance": 0.05, "task": "single"}
    request[argument] = value
    with pytest.raises(error, match=argument):
        ch09.served_options(decode=EVEN, forgetting=_forgetting_run(EVERY), **request)


def _serving_run(reference: str = "chapter5-float32") -> dict:
    """A made-up Chapter 13 kernel part: two lengths, the kernel's three steps and one other comparison."""
    lengths = [{"tokens": tokens, "ratios": [
        {"of": "kernel-float32", "to": reference, "ratio": 0.6 + tokens / 1e6},
        {"of": "kernel-int8", "to": reference, "ratio": 0.3},
        {"of": "kernel-int4", "to": reference, "ratio": 0.35},
        {"of": "kernel-int8", "to": "chapter5-int8", "ratio": 0.8}]} for tokens in (4_096, 65_536)]
    return {"kernel": {"reference": reference, "lengths": lengths}}


def test_kernel_step_shares_read_each_kernel_step_against_chapter_5s_full_step_by_the_menus_names():
    shares = ch09.kernel_step_shares(_serving_run())
    assert shares == {("full", 4_096): pytest.approx(0.604096), ("int8", 4_096): 0.3, ("int4", 4_096): 0.35,
                      ("full", 65_536): pytest.approx(0.665536), ("int8", 65_536): 0.3, ("int4", 65_536): 0.35}
    with pytest.raises(ValueError, match="not ch05's float32 split-KV step"):
        ch09.kernel_step_shares(_serving_run("chapter5-int8"))
    with pytest.raises(TypeError, match="serving"):
        ch09.kernel_step_shares([])


def test_the_saved_kernel_run_gives_every_kernel_design_at_every_timed_length():
    saved, _ = support.load_results("serving")
    shares = ch09.kernel_step_shares(saved)
    lengths = {record["tokens"] for record in saved["kernel"]["lengths"]}
    assert set(shares) == {(design, tokens) for design in ch09.KERNEL_STEPS for tokens in lengths}
    assert all(0 < share < 1 for share in shares.values())  # the kernel beats Chapter 10's float step everywhere
