# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Serving a long context: the code saved from chapters/ch08-serving.qmd."""

from ._generated import (
    PagedKVCache,
    PagePool,
    RadixCache,
    RadixNode,
    Request,
    Reservation,
    Turn,
    conversation_trace,
    page_states,
    paged_decode,
    request_trace,
    reserve_exact,
    reserve_longest,
    reserve_pages,
    serve_conversations,
    serve_trace,
)

__all__ = [
    "PagedKVCache",
    "PagePool",
    "RadixCache",
    "RadixNode",
    "Request",
    "Reservation",
    "Turn",
    "conversation_trace",
    "page_states",
    "paged_decode",
    "request_trace",
    "reserve_exact",
    "reserve_longest",
    "reserve_pages",
    "serve_conversations",
    "serve_trace",
]
