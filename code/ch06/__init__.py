# Generated from chapters/ch06-extension.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Stretching a trained model's context, measured: the code saved from chapters/ch06-extension.qmd."""

from ._generated import (
    KEY_MARK,
    KEY_SYMBOLS,
    RECIPE_SETTINGS,
    KeyBatch,
    RotaryGPT,
    RotarySelfAttention,
    key_batch,
    key_free_text,
    key_hits,
    matched_base,
    mcnemar,
    position_losses,
    recipe_bands,
    seed_window_interval,
    student_t_quantile,
    train_with_keys,
    turning_bands,
)

__all__ = [
    "KEY_MARK",
    "KEY_SYMBOLS",
    "RECIPE_SETTINGS",
    "KeyBatch",
    "RotaryGPT",
    "RotarySelfAttention",
    "key_batch",
    "key_free_text",
    "key_hits",
    "matched_base",
    "mcnemar",
    "position_losses",
    "recipe_bands",
    "seed_window_interval",
    "student_t_quantile",
    "train_with_keys",
    "turning_bands",
]
