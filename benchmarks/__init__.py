"""Measured costs of long context: the machine's floors and each design's decode, prefill, scan and memory.

Run ``python -m benchmarks`` (full) or ``python -m benchmarks --quick`` (a smoke run); results go to
``benchmarks/results/benchmarks-<device-name>[-quick].json``. Chapter 10 reads the newest full run with
``longctx.support.load_results("benchmarks")``, plots it and reruns a small slice.
"""
