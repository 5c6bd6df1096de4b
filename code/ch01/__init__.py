# Generated from chapters/ch01-attention.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Attention from first principles: the code saved from chapters/ch01-attention.qmd."""

from ._generated import (
    MultiHeadAttention,
    attention_pairs,
    causal_mask,
    kv_cache_scalars,
    merge_heads,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)

__all__ = [
    "MultiHeadAttention",
    "attention_pairs",
    "causal_mask",
    "kv_cache_scalars",
    "merge_heads",
    "scaled_dot_product_attention",
    "softmax",
    "split_heads",
]
