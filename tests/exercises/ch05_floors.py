"""Exercise 10.1: from the saved floors, which limit binds MQA's step at 32K, and how far is it?"""
from longctx import support

run, _ = support.load_results("benchmarks")
floor = run["floors"]
mqa = next(row for row in run["decode"] if row["design"] == "mqa" and row["tokens"] == 32768)
memory = mqa["cache_bytes"] / floor["bytes_per_s"]
arithmetic = mqa["operations"] / floor["flop_per_s"]
binding = "memory" if memory > arithmetic else "arithmetic"
assert binding == mqa["bound"] == "arithmetic", (binding, mqa["bound"])  # what Solution 10.1 says
assert mqa["seconds"] >= max(memory, arithmetic)  # no step beats its roofline
print("ok ch05", binding, round(mqa["seconds"] / max(memory, arithmetic), 2))
