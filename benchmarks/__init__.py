"""Measured costs of long context: the machine's floors and each design's decode, prefill, scan and memory.

Run ``python -m benchmarks`` (full) or ``python -m benchmarks --quick`` (a smoke run); results go to
``benchmarks/results/<device-name>.json``. Chapter 5 plots the saved results and reruns a small slice.
"""
