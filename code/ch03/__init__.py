# Generated from chapters/ch03-long-context.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Attention, Position, and Long Context: the code saved from chapters/ch03-long-context.qmd."""

from ._generated import (
    DTYPE_BYTES,
    MODEL_CONFIG_NAMES,
    ROPE_METHODS,
    GroupedQueryAttention,
    KVConfig,
    KVPair,
    ToyLatentKVAttention,
    apply_rope,
    apply_rope_rotate_half,
    decode_token_by_token,
    grouped_attention,
    interleaved_to_half_order,
    inverse_frequencies,
    kv_bytes,
    load_model_config,
    ntk_base,
    repeat_kv,
    retrieval_probe,
    visibility_mask,
    yarn_correction_dim,
)

__all__ = [
    "DTYPE_BYTES",
    "MODEL_CONFIG_NAMES",
    "ROPE_METHODS",
    "GroupedQueryAttention",
    "KVConfig",
    "KVPair",
    "ToyLatentKVAttention",
    "apply_rope",
    "apply_rope_rotate_half",
    "decode_token_by_token",
    "grouped_attention",
    "interleaved_to_half_order",
    "inverse_frequencies",
    "kv_bytes",
    "load_model_config",
    "ntk_base",
    "repeat_kv",
    "retrieval_probe",
    "visibility_mask",
    "yarn_correction_dim",
]
