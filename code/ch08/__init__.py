# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Serving a long context: the code saved from chapters/ch08-serving.qmd."""

from ._generated import (
    DECODE_KERNEL_SOURCE,
    KERNEL_FLAGS,
    DecodeKernel,
    Request,
    fused_decode,
    kernel_chunk_states,
    load_kernel,
    missing_build_tools,
    request_trace,
)

__all__ = [
    "DECODE_KERNEL_SOURCE",
    "KERNEL_FLAGS",
    "DecodeKernel",
    "Request",
    "fused_decode",
    "kernel_chunk_states",
    "load_kernel",
    "missing_build_tools",
    "request_trace",
]
