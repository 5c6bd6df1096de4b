# Generated from chapters/ch05-measured.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
# ruff: noqa: E402, F811, I001
"""Code saved from chapters/ch05-measured.qmd ("What long context costs, measured")."""


# chapters/ch05-measured.qmd:80
from torch.utils import benchmark as torch_benchmark


def median_seconds(function, *, threads: int = 1, min_run_time: float = 0.2) -> float:
    """Return the median seconds per call of `function` after one warm-up call (torch.utils.benchmark).

    Args:
        function: a callable with no arguments.
        threads: torch threads the Timer runs with (>= 1).
        min_run_time: seconds of repeated blocks to collect (> 0).

    Raises:
        ValueError: if threads < 1 or min_run_time <= 0.
    """
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1 (got {threads!r})")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be > 0 seconds (got {min_run_time!r})")
    function()  # warm-up: page faults, kernel choice, allocator growth
    timer = torch_benchmark.Timer(stmt="function()", globals={"function": function}, num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


# chapters/ch05-measured.qmd:818
def partition_bounds(seq_len: int, parts: int) -> list[tuple[int, int]]:
    """Return the contiguous [start, stop) token range each of `parts` ranks holds.

    The first ``seq_len % parts`` ranks hold one token more than the others, so every token
    belongs to exactly one rank and block sizes differ by at most one.

    Args:
        seq_len: tokens in the whole sequence, T (>= parts).
        parts: number of ranks, P (>= 1).

    Returns:
        P pairs ``(start, stop)`` that cover ``range(seq_len)`` in order.

    Raises:
        ValueError: if P < 1, T < 1 or T < P (a rank would hold nothing).
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts (P) must be an integer >= 1 (got {parts!r})")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len (T) must be an integer >= 1 (got {seq_len!r})")
    if seq_len < parts:
        raise ValueError(f"seq_len must be at least the number of ranks so that no rank is empty "
                         f"(got T={seq_len}, P={parts})")
    base, extra = divmod(seq_len, parts)
    bounds, start = [], 0
    for rank in range(parts):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


# chapters/ch05-measured.qmd:874
import torch


def online_softmax_update(state, query, key, value, query_start: int, key_start: int, scale: float):
    """Return the running (max, sum, accumulator) after folding in one key/value block (@eq-ch05-online).

    Args:
        state: ``(running_max, running_sum, accumulator)`` shaped (..., Tq, 1), (..., Tq, 1),
            (..., Tq, dv), or None before the first block.
        query: (..., Tq, d) this rank's queries; key (..., Tk, d) and value (..., Tk, dv): one block.
        query_start, key_start: global positions of the first query and the first key.
        scale: the score scale, 1/sqrt(d) for standard attention.

    Returns:
        The updated ``(running_max, running_sum, accumulator)``.
    """
    if state is None:
        running_max = query.new_full((*query.shape[:-1], 1), float("-inf"))  # m
        running_sum = query.new_zeros((*query.shape[:-1], 1))  # l
        accumulator = query.new_zeros((*query.shape[:-1], value.shape[-1]))  # a
    else:
        running_max, running_sum, accumulator = state
    query_pos = torch.arange(query_start, query_start + query.shape[-2], device=query.device)
    key_pos = torch.arange(key_start, key_start + key.shape[-2], device=query.device)
    visible = key_pos[None, :] <= query_pos[:, None]  # (Tq, Tk), True = may attend
    if not bool(visible.any()):
        return running_max, running_sum, accumulator  # the whole block is in the future
    scores = (query @ key.transpose(-2, -1)) * scale  # s, (..., Tq, Tk)
    scores = scores.masked_fill(~visible, float("-inf"))
    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))  # m'
    safe_max = torch.where(torch.isfinite(new_max), new_max, torch.zeros_like(new_max))  # rows that saw nothing yet
    correction = torch.exp(running_max - safe_max)  # e^{m - m'}
    weights = torch.exp(scores - safe_max)  # e^{s_j - m'}; masked entries give 0
    running_sum = running_sum * correction + weights.sum(dim=-1, keepdim=True)  # l'
    accumulator = accumulator * correction + weights @ value  # a'
    return new_max, running_sum, accumulator


def finish_online_softmax(state):
    """Return the attention output a / l from an online-softmax state (rows that saw no key give zeros)."""
    _, running_sum, accumulator = state
    return torch.where(running_sum > 0, accumulator / running_sum.clamp_min(1e-30), torch.zeros_like(accumulator))


def blockwise_causal_attention(query, key, value, parts: int, *, order: str = "ring"):
    """Return causal attention computed block by block with the online softmax, in one process.

    The arithmetic every ring rank does, run one rank after another, so the update rule can be
    tested without processes. ``order="ring"`` folds blocks in the order a ring delivers them
    (own block first, then the left neighbour's, ...); ``order="reverse"`` folds them backwards.

    Raises:
        ValueError: for P < 1, T < P or an unknown order.
    """
    if order not in ("ring", "reverse"):
        raise ValueError(f"order must be 'ring' or 'reverse' (got {order!r})")
    bounds = partition_bounds(query.shape[-2], parts)
    scale = 1.0 / query.shape[-1] ** 0.5
    outputs = []
    for rank, (q_start, q_stop) in enumerate(bounds):
        owners = [(rank - step) % parts for step in range(parts)]
        state = None
        for owner in owners if order == "ring" else owners[::-1]:
            k_start, k_stop = bounds[owner]
            state = online_softmax_update(state, query[..., q_start:q_stop, :], key[..., k_start:k_stop, :],
                                          value[..., k_start:k_stop, :], q_start, k_start, scale)
        outputs.append(finish_online_softmax(state))
    return torch.cat(outputs, dim=-2)


# chapters/ch05-measured.qmd:975
import math
import os

import torch.distributed as dist


def ring_attention_rank(rank: int, parts: int, port: int, query, key, value, output, bytes_sent, cache_bytes):
    """Run rank `rank` of ring attention: write its output rows and its byte counts into shared tensors.

    The rank keeps its own contiguous block of queries and attends, one step at a time, to the
    key/value block that started on rank (rank - step) mod P, passing each block on to rank + 1
    while it computes (P - 1 transfers in all).

    Args:
        rank, parts: this rank and the number of ranks P.
        port: the TCP port on 127.0.0.1 where the ranks meet.
        query, key, value: the whole (..., T, d) tensors in shared memory; the rank copies out its block.
        output: shared (..., T, dv) tensor for the result rows.
        bytes_sent: shared int64 (P, P): bytes this rank sent in each step.
        cache_bytes: shared int64 (P,): bytes of keys and values this rank holds.
    """
    torch.set_num_threads(1)  # P processes share the cores
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on the loopback interface
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=parts)
    try:
        bounds = partition_bounds(query.shape[-2], parts)
        q_start, q_stop = bounds[rank]
        local_query = query[..., q_start:q_stop, :].clone()
        block_key = key[..., q_start:q_stop, :].clone()  # this rank's 1/P of the cache
        block_value = value[..., q_start:q_stop, :].clone()
        cache_bytes[rank] = block_key.nbytes + block_value.nbytes
        scale = 1.0 / math.sqrt(query.shape[-1])
        right, left = (rank + 1) % parts, (rank - 1) % parts
        state = None
        for step in range(parts):
            owner = (rank - step) % parts  # whose block we hold in this step
            transfers = []
            if step < parts - 1:  # pass the block on while computing with it
                start, stop = bounds[(owner - 1) % parts]  # the block that arrives next
                next_key = block_key.new_empty((*block_key.shape[:-2], stop - start, block_key.shape[-1]))
                next_value = block_value.new_empty((*block_value.shape[:-2], stop - start, block_value.shape[-1]))
                transfers = [dist.isend(block_key, right), dist.isend(block_value, right),
                             dist.irecv(next_key, left), dist.irecv(next_value, left)]
                bytes_sent[rank, step] = block_key.nbytes + block_value.nbytes
            state = online_softmax_update(state, local_query, block_key, block_value, q_start,
                                          bounds[owner][0], scale)
            for transfer in transfers:
                transfer.wait()
            if transfers:
                block_key, block_value = next_key, next_value
        output[..., q_start:q_stop, :] = finish_online_softmax(state)
    finally:
        dist.destroy_process_group()


# chapters/ch05-measured.qmd:1039
import dataclasses
import importlib
import socket
import time

from torch import multiprocessing as torch_multiprocessing


def free_local_port() -> int:
    """Return a TCP port on 127.0.0.1 that the operating system reported free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class RingResult:
    """A ring attention run: the output, the token ranges, and the bytes each rank held and sent."""

    output: torch.Tensor
    parts: int
    bounds: list
    cache_bytes_per_rank: list  # bytes of keys and values each rank held
    bytes_sent_per_step: list  # [rank][step], P - 1 steps

    @property
    def total_cache_bytes(self) -> int:
        """Return the bytes of keys and values summed over all ranks."""
        return sum(self.cache_bytes_per_rank)

    @property
    def bytes_sent_per_rank(self) -> list:
        """Return each rank's bytes sent over the whole run."""
        return [sum(row) for row in self.bytes_sent_per_step]


def ring_attention(query, key, value, parts: int, *, timeout_s: float = 120.0) -> RingResult:
    """Return causal attention computed by `parts` gloo processes passing key/value blocks around a ring.

    Args:
        query, key: (..., T, d) CPU tensors; value (..., T, dv); T >= parts.
        parts: number of processes P (>= 1); each holds a contiguous 1/P of the keys and values.
        timeout_s: seconds to wait for the processes before stopping them.

    Returns:
        A RingResult: the (..., T, dv) output, each rank's cache bytes and bytes sent per step.

    Raises:
        ValueError: if P < 1, T < 1, T < P, or the shapes disagree.
        TimeoutError: if the processes do not finish within `timeout_s`.
    """
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts (P) must be an integer >= 1 (got {parts!r})")
    if query.dim() < 2 or query.shape[-2] < 1:
        raise ValueError(f"query must be (..., T, d) with T >= 1 (got shape {tuple(query.shape)})")
    if key.shape != query.shape or value.shape[:-1] != query.shape[:-1]:
        raise ValueError("query and key must be (..., T, d) and value (..., T, dv) with the same (..., T) "
                         f"(got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)})")
    bounds = partition_bounds(query.shape[-2], parts)
    shared = [t.detach().to("cpu").contiguous().share_memory_() for t in (query, key, value)]
    output = torch.zeros(value.shape, dtype=value.dtype).share_memory_()
    bytes_sent = torch.zeros(parts, parts, dtype=torch.int64).share_memory_()
    cache_bytes = torch.zeros(parts, dtype=torch.int64).share_memory_()
    worker = importlib.import_module("longctx.ch05").ring_attention_rank  # importable by fresh processes
    method = "forkserver" if "forkserver" in torch_multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":  # a clean server that imports torch once; each rank is a fork of it
        torch_multiprocessing.get_context(method).set_forkserver_preload(["torch", "longctx.ch05"])
    context = torch_multiprocessing.start_processes(
        worker, args=(parts, free_local_port(), *shared, output, bytes_sent, cache_bytes),
        nprocs=parts, join=False, start_method=method)
    started = time.monotonic()
    while not context.join(timeout=0.5):
        if time.monotonic() - started > timeout_s:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"ring attention with P={parts} did not finish within {timeout_s} s")
    return RingResult(output=output.clone(), parts=parts, bounds=bounds,
                      cache_bytes_per_rank=cache_bytes.tolist(),
                      bytes_sent_per_step=bytes_sent[:, : parts - 1].tolist())
