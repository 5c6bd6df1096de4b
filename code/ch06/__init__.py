# Generated from chapters/ch06-extension.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Stretching a trained model's context, measured: the code saved from chapters/ch06-extension.qmd."""

from ._generated import (
    KEY_MARK,
    RECIPE_SETTINGS,
    ExtensionSettings,
    RotaryGPT,
    RotarySelfAttention,
    load_extension_results,
    passkey_batch,
    passkey_hits,
    position_losses,
    recipe_bands,
    run_extension_experiment,
    train_with_keys,
    wilson_interval,
)

__all__ = [
    "KEY_MARK",
    "RECIPE_SETTINGS",
    "ExtensionSettings",
    "RotaryGPT",
    "RotarySelfAttention",
    "load_extension_results",
    "passkey_batch",
    "passkey_hits",
    "position_losses",
    "recipe_bands",
    "run_extension_experiment",
    "train_with_keys",
    "wilson_interval",
]
