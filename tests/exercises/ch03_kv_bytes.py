"""Chapter 3: Llama 3.1 8B's cache at 128K tokens from its shipped config, and GQA cached == full."""
import torch
from longctx import ch03

config = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
gib = ch03.kv_bytes(config, 131_072) / 2**30
assert gib == 16.0, gib  # 32 layers x 2 x 8 KV heads x 128 x 2 bytes x 128K tokens
layer = ch03.GroupedQueryAttention(64, 8, 2).eval()
x = torch.randn(1, 10, 64, generator=torch.Generator().manual_seed(3))
with torch.no_grad():
    full, _ = layer(x)
    first, cache = layer(x[:, :6])
    rest, _ = layer(x[:, 6:], cache=cache)
assert torch.allclose(torch.cat([first, rest], dim=1), full, atol=1e-6)
print("ok ch03", gib)
