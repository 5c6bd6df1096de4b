"""Exercise 13.1: the decode kernel's chunk. Every chunk gives Chapter 10's step; the saved run's
kernel reads an int4 cache faster than Chapter 10's float32 step."""
import torch
from longctx import ch05, ch08, support

run, _ = support.load_results("serving")
longest = max(run["kernel"]["lengths"], key=lambda record: record["tokens"])["steps"]
assert longest["kernel-int4"]["seconds"] < longest["chapter5-float32"]["seconds"], longest
kernel = ch08.load_kernel()
if kernel.module is None:
    print(f"ok ch08 the saved run only: {kernel.reason}")
else:
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 32, 1, 128, generator=generator)
    cache = [ch05.quantize_cache(torch.randn(1, 8, 1000, 128, generator=generator), 4) for _ in "kv"]
    exact = ch05.decode_reference(query, *cache)
    gaps = {chunk: float((ch08.fused_decode(query, *cache, chunk=chunk) - exact).abs().max())
            for chunk in (16, 512, 8192)}
    assert max(gaps.values()) < 1e-5, gaps
    print("ok ch08", gaps)
