# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Serving a long context: the code saved from chapters/ch08-serving.qmd."""

from ._generated import (
    Request,
    request_trace,
)

__all__ = [
    "Request",
    "request_trace",
]
