# Generated from chapters/ch05-measured.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""What long context costs, measured: the code saved from chapters/ch05-measured.qmd."""

from ._generated import (
    RingResult,
    blockwise_causal_attention,
    finish_online_softmax,
    free_local_port,
    median_seconds,
    online_softmax_update,
    partition_bounds,
    ring_attention,
    ring_attention_rank,
)

__all__ = [
    "RingResult",
    "blockwise_causal_attention",
    "finish_online_softmax",
    "free_local_port",
    "median_seconds",
    "online_softmax_update",
    "partition_bounds",
    "ring_attention",
    "ring_attention_rank",
]
