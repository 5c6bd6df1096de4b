# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Serving a long context: the code saved from chapters/ch08-serving.qmd."""

from ._generated import (
    Request,
    SpeculativeRun,
    acceptance_rate,
    expected_speedup,
    expected_tokens,
    request_trace,
    speculative_generate,
    speculative_verify,
    token_probabilities,
    truncate_cache,
)

__all__ = [
    "Request",
    "SpeculativeRun",
    "acceptance_rate",
    "expected_speedup",
    "expected_tokens",
    "request_trace",
    "speculative_generate",
    "speculative_verify",
    "token_probabilities",
    "truncate_cache",
]
