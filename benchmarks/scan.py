"""The parallel scan against the loop (Chapter 6), and one SSM step against attention decode steps."""

from __future__ import annotations

import itertools

import torch
from longctx import ch04
from longctx.support import time_call
from longctx.support.measure import cold_copies

from . import fast

SCAN_CHANNELS = 64
SSM_INNER = 8192  # a Mamba-style layer for d_model 4096: expansion 2
SSM_STATE = 16
SCAN_RECORD_FIELDS = ("tokens", "channels", "loop_seconds", "parallel_seconds", "speedup")
SSM_RECORD_FIELDS = ("inner", "state_size", "state_bytes", "read_bytes", "copies", "seconds", "runs",
                     "warm_seconds")


def scan_inputs(tokens: int, channels: int = SCAN_CHANNELS, *, device, seed: int = 0):
    """Return (a, b), each (channels, tokens) with time last: decays in [0.5, 1) and inputs, for h_t = a_t h_{t-1} + b_t."""
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens (T) must be an integer >= 1 (got {tokens!r})")
    generator = torch.Generator(device=device).manual_seed(seed)
    decay = torch.rand(channels, tokens, generator=generator, device=device) * 0.5 + 0.5
    inputs = torch.randn(channels, tokens, generator=generator, device=device)
    return decay, inputs


def measure_scan(tokens: int, *, device, threads, min_run_time: float = 0.2) -> dict:
    """Return loop and parallel-scan times for T = `tokens` (fields: SCAN_RECORD_FIELDS)."""
    decay, inputs = scan_inputs(tokens, device=device)
    loop = time_call(lambda: ch04.sequential_scan(decay, inputs), threads=threads,
                     min_run_time=min_run_time)
    parallel = time_call(lambda: ch04.parallel_scan(decay, inputs), threads=threads,
                         min_run_time=min_run_time)
    return {"tokens": tokens, "channels": SCAN_CHANNELS, "loop_seconds": loop["seconds"],
            "parallel_seconds": parallel["seconds"], "speedup": loop["seconds"] / parallel["seconds"]}


def measure_ssm_step(*, device, threads, inner: int = SSM_INNER, state_size: int = SSM_STATE,
                     min_run_time: float = 0.2) -> dict:
    """Return the time of one diagonal SSM decode step with a (1, inner, state_size) float32 state, cold
    as the attention steps are timed (rotating through copies of the state and the per-step weights
    that fill ``cold_copies``' multiple of the cache) and warm (one copy, re-read from cache)."""
    generator = torch.Generator(device=device).manual_seed(0)

    def step_inputs():
        return tuple(torch.randn(1, inner, state_size, generator=generator, device=device) for _ in range(4))

    x = torch.randn(1, inner, generator=generator, device=device)
    first = step_inputs()  # state, decay, input_weight, output_weight
    read = sum(t.nbytes for t in first)
    copies = [first] + [step_inputs() for _ in range(cold_copies(read, True, device) - 1)]
    turn = itertools.cycle(copies)

    def cold_step():
        state, decay, input_weight, output_weight = next(turn)
        return fast.ssm_decode_step(state, x, decay, input_weight, output_weight)

    def warm_step():
        state, decay, input_weight, output_weight = first
        return fast.ssm_decode_step(state, x, decay, input_weight, output_weight)

    cold = time_call(cold_step, threads=threads, min_run_time=min_run_time)
    warm = time_call(warm_step, threads=threads, min_run_time=min_run_time)
    return {"inner": inner, "state_size": state_size, "state_bytes": first[0].nbytes, "read_bytes": read,
            "copies": len(copies), "seconds": cold["seconds"], "runs": cold["runs"],
            "warm_seconds": warm["seconds"]}


def run_scan(token_counts, *, device, threads, progress, min_run_time: float = 0.2) -> dict:
    """Return {"scan": [records], "ssm_step": record}, printing progress."""
    records = []
    for tokens in token_counts:
        record = measure_scan(tokens, device=device, threads=threads, min_run_time=min_run_time)
        records.append(record)
        progress(f"scan T={tokens:6d}: loop {record['loop_seconds'] * 1e3:8.2f} ms, "
                 f"parallel {record['parallel_seconds'] * 1e3:8.2f} ms")
    ssm = measure_ssm_step(device=device, threads=threads, min_run_time=min_run_time)
    progress(f"ssm step (state {ssm['state_bytes'] / 2**10:.0f} KiB, {ssm['read_bytes'] / 2**20:.0f} MiB read): "
             f"cold {ssm['seconds'] * 1e6:.1f} us, warm {ssm['warm_seconds'] * 1e6:.1f} us")
    return {"scan": records, "ssm_step": ssm}
