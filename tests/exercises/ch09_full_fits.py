"""Exercise 15.1: the memory at which Llama 3.1 8B's full cache stops fitting a 32K request."""
from longctx import ch03, ch09, support

decode, _ = support.load_results("benchmarks")
forgetting, _ = support.load_results("forgetting")
llama = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
full = ch03.kv_bytes(llama, 32_768)
just = ch09.served_options(llama, 32_768, full, decode=decode, forgetting=forgetting)
short = ch09.served_options(llama, 32_768, full - 1, decode=decode, forgetting=forgetting)
assert any(o.design == "full" and o.fits for o in just)
assert not any(o.design == "full" and o.fits for o in short)
assert {o.design for o in short if o.fits} >= {"int8", "streaming", "snapkv"}
print("ok ch09", full, [o.design for o in short if o.fits])
