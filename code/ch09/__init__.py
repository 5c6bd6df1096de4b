# Generated from chapters/ch09-choosing.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Choosing a cache from a config, a length and a budget: the code saved from chapters/ch09-choosing.qmd."""

from ._generated import (
    EVIDENCE,
    KERNEL_STEPS,
    SERVED_DESIGNS,
    TIMED_FLOAT_BYTES,
    Option,
    byte_shares,
    evicts,
    found_shares,
    kernel_step_shares,
    served_options,
    step_seconds,
)

__all__ = [
    "EVIDENCE",
    "KERNEL_STEPS",
    "SERVED_DESIGNS",
    "TIMED_FLOAT_BYTES",
    "Option",
    "byte_shares",
    "evicts",
    "found_shares",
    "kernel_step_shares",
    "served_options",
    "step_seconds",
]
