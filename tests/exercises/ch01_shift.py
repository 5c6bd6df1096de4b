"""Exercise 1.1: adding one number to every score of a row leaves attention unchanged."""
import torch
from longctx import ch01

generator = torch.Generator().manual_seed(11)
query, key, value = (torch.randn(2, 5, 8, generator=generator, dtype=torch.float64) for _ in range(3))
out, weights = ch01.scaled_dot_product_attention(query, key, value)
scores = query @ key.transpose(-2, -1) / 8 ** 0.5
shifted = torch.softmax(scores + 40.0, dim=-1)
assert torch.allclose(shifted, weights, atol=1e-12)
assert torch.allclose(weights.sum(-1), torch.ones(2, 5, dtype=torch.float64))
print("ok ch01", float((shifted - weights).abs().max()))
