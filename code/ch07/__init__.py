# Generated from chapters/ch07-forgetting.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""What a cache can forget: the code saved from chapters/ch07-forgetting.qmd."""

from ._generated import (
    BUDGETS,
    POLICIES,
    EvictingCache,
    QuantizedCache,
    Seen,
    TokensRead,
    compressed_hits,
    compressed_losses,
    keep_all,
    keep_heavy,
    keep_recent,
    keep_sinks,
    keep_snap,
    make_cache,
    newest,
    pyramid_budgets,
    read_with_cache,
    snap_votes,
    top_positions,
    toy_seen,
)

__all__ = [
    "BUDGETS",
    "POLICIES",
    "EvictingCache",
    "QuantizedCache",
    "Seen",
    "TokensRead",
    "compressed_hits",
    "compressed_losses",
    "keep_all",
    "keep_heavy",
    "keep_recent",
    "keep_sinks",
    "keep_snap",
    "make_cache",
    "newest",
    "pyramid_budgets",
    "read_with_cache",
    "snap_votes",
    "top_positions",
    "toy_seen",
]
