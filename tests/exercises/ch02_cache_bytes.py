"""Exercise 2.1: Equation 2.2 predicts the bytes of a full-context cache; a real cache agrees."""
import torch
from longctx import ch02

config = ch02.GPTConfig(vocab_size=256, context_length=32, d_model=32, heads=4, layers=2)
model = ch02.TinyGPT(config).eval()
cache = model.new_cache(batch=3)
tokens = torch.randint(0, 256, (3, config.context_length), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(tokens, cache)
predicted = ch02.kv_cache_bytes(config, config.context_length, batch=3)
assert cache.nbytes() == predicted == 2 * 3 * 2 * 32 * 4 * 32, (cache.nbytes(), predicted)
print("ok ch02", predicted)
