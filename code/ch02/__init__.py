# Generated from chapters/ch02-tinygpt.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""TinyGPT: a small language model and its KV cache: the code saved from chapters/ch02-tinygpt.qmd."""

from ._generated import (
    CORPUS_FILE,
    Block,
    ByteTokenizer,
    CausalSelfAttention,
    FeedForward,
    GPTConfig,
    KVCache,
    TinyGPT,
    attend_with_cache,
    dequantize,
    evaluate_loss,
    generate,
    kv_cache_bytes,
    load_corpus,
    next_token,
    quantize,
    sample_batch,
    train,
    unigram_entropy,
)

__all__ = [
    "CORPUS_FILE",
    "Block",
    "ByteTokenizer",
    "CausalSelfAttention",
    "FeedForward",
    "GPTConfig",
    "KVCache",
    "TinyGPT",
    "attend_with_cache",
    "dequantize",
    "evaluate_loss",
    "generate",
    "kv_cache_bytes",
    "load_corpus",
    "next_token",
    "quantize",
    "sample_batch",
    "train",
    "unigram_entropy",
]
