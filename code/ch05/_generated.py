# Generated from chapters/ch05-measured.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch05-measured.qmd ("What long context costs, measured")."""

import dataclasses
import importlib
import math
import os
import socket
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor
from torch import multiprocessing as torch_multiprocessing
from torch.utils import benchmark as torch_benchmark

from longctx import ch02, ch03, ch04
from longctx.support import (
    check_choice,
    check_int,
    check_int_sequence,
    check_number,
    check_tensor,
    check_type,
    describe,
)


# chapters/ch05-measured.qmd:118
def median_seconds(function, *, threads: int = 1,
                   min_run_time: float = 0.2) -> float:
    """Return the median seconds per call of ``function`` after a warm-up.

    The calls are timed by torch.utils.benchmark's Timer.

    Args:
        function: a callable with no arguments.
        threads: torch threads the Timer runs with (>= 1).
        min_run_time: seconds of repeated blocks to collect (> 0).

    Raises:
        TypeError: if function is not callable or a setting not a number.
        ValueError: if threads < 1 or min_run_time <= 0.
    """
    if not callable(function):
        raise TypeError(f"function must be callable (got {describe(function)})")
    threads = check_int("threads", threads, minimum=1)
    min_run_time = check_number("min_run_time", min_run_time, above=0)
    function()  # warm-up: page faults, kernel choice, allocator growth
    timer = torch_benchmark.Timer(stmt="function()",
                                  globals={"function": function},
                                  num_threads=threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


# chapters/ch05-measured.qmd:334
#: The state of an online softmax: (m, l, a), shaped (..., R, 1),
#: (..., R, 1) and (..., R, d_v) for R query rows.
OnlineState = tuple[Tensor, Tensor, Tensor]


def online_softmax_start(rows: tuple[int, ...], value_width: int,
                         like: Tensor) -> OnlineState:
    """Return the state before any key: m = -inf, l = 0, a = 0 per row.

    Args:
        rows: the leading shape (..., R) of the query rows.
        value_width: d_v, the width of the values to be mixed.
        like: a tensor whose dtype and device the state takes.
    """
    rows = tuple(check_int_sequence("rows", rows, minimum=0,
                                    nonempty=True).tolist())
    value_width = check_int("value_width", value_width, minimum=1)
    check_tensor("like", like, floating=True)
    running_max = like.new_full((*rows, 1), -math.inf)  # m
    running_sum = like.new_zeros((*rows, 1))  # l
    accumulator = like.new_zeros((*rows, value_width))  # a
    return running_max, running_sum, accumulator


def online_softmax_update(state: OnlineState, scores: Tensor,
                          values) -> OnlineState:
    """Return (m', l', a') after one tile of keys (Equation 5.2).

    Args:
        state: (m, l, a) from online_softmax_start or an earlier update.
        scores: (..., R, n) scaled scores of the tile's n keys, -inf
            where a row may not see a key.
        values: the tile's values (..., n, d_v), or a function that
            turns the weights (..., R, n) into their mix (..., R, d_v).

    Raises:
        TypeError: if state is not three tensors or scores not a float
            tensor.
        ValueError: if the shapes of state, scores and values disagree.
    """
    if not (isinstance(state, tuple) and len(state) == 3):
        raise TypeError(f"state must be the tuple (m, l, a) "
                        f"(got {describe(state)})")
    running_max, running_sum, accumulator = state
    check_tensor("scores", scores, min_dims=2, floating=True)
    if scores.shape[:-1] != running_max.shape[:-1]:
        raise ValueError(f"scores (..., R, n) must have the state's rows "
                         f"{tuple(running_max.shape[:-1])} "
                         f"(got {tuple(scores.shape)})")
    if not callable(values):
        check_tensor("values", values, min_dims=2, floating=True)
        wanted = (*scores.shape[:-2], scores.shape[-1], accumulator.shape[-1])
        if tuple(values.shape) != wanted:
            raise ValueError(f"values must have one row per key of scores "
                             f"and the state's d_v: {wanted} "
                             f"(got {tuple(values.shape)})")
    new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
    # a row that has seen no key keeps m' = -inf: shift it by 0 instead
    shift = torch.where(new_max.isfinite(), new_max, 0.0)
    correction = torch.exp(running_max - shift)  # e^(m - m')
    weights = torch.exp(scores - shift)  # e^(s_j - m'), 0 where hidden
    mixed = values(weights) if callable(values) else weights @ values
    running_sum = running_sum * correction + weights.sum(-1, keepdim=True)
    return new_max, running_sum, accumulator * correction + mixed


def finish_online_softmax(state: OnlineState) -> Tensor:
    """Return a / l, the attention output; a row that saw no key gets 0."""
    if not (isinstance(state, tuple) and len(state) == 3):
        raise TypeError(f"state must be the tuple (m, l, a) "
                        f"(got {describe(state)})")
    _, running_sum, accumulator = state
    seen = running_sum > 0
    return torch.where(seen, accumulator / torch.where(seen, running_sum, 1.0),
                       0.0)


# chapters/ch05-measured.qmd:426
def visible_ranges(tokens: int, window: int | None = None,
                   sinks: int = 0) -> list[tuple[int, int]]:
    """Return the [start, stop) position runs the newest query may read.

    The query is token T - 1. As in the last row of ch03.visibility_mask,
    a window W keeps the keys j >= T - W and ``sinks`` S keeps j < S as
    well; without a window the query reads all T keys.

    Raises:
        TypeError: if an argument is not an integer.
        ValueError: if tokens < 1, window < 1 or sinks < 0.
    """
    tokens = check_int("tokens", tokens, minimum=1)
    if window is not None:
        window = check_int("window", window, minimum=1)
    sinks = check_int("sinks", sinks, minimum=0)
    if window is None or window >= tokens:
        return [(0, tokens)]
    first = tokens - window  # the oldest key inside the window
    if sinks >= first:  # the sinks reach the window: one run
        return [(0, tokens)]
    return ([(0, sinks)] if sinks else []) + [(first, tokens)]


def tile_ranges(ranges: list[tuple[int, int]],
                tile: int) -> list[tuple[int, int]]:
    """Return the runs cut into [start, stop) tiles of at most ``tile``."""
    check_type("ranges", ranges, (list, tuple))
    tile = check_int("tile", tile, minimum=1)
    return [(begin, min(begin + tile, stop))
            for start, stop in ranges
            for begin in range(start, stop, tile)]


# chapters/ch05-measured.qmd:500
def pack_int4(codes: Tensor) -> Tensor:
    """Return 4-bit codes packed two a byte: (..., d) int8 -> (..., d/2).

    The codes, integers in [-8, 7], of the first half of the last
    dimension go into the low nibbles and those of the second half into
    the high nibbles of a uint8 tensor.

    Raises:
        TypeError: if codes is not an int8 tensor.
        ValueError: if d is odd or a code lies outside [-8, 7].
    """
    check_tensor("codes", codes, min_dims=1, dtype=torch.int8, nonempty=True)
    if codes.shape[-1] % 2:
        raise ValueError(f"codes must have an even last dimension to pack "
                         f"two a byte (got {tuple(codes.shape)})")
    if codes.numel() and not -8 <= int(codes.min()) <= int(codes.max()) <= 7:
        raise ValueError("4-bit codes must lie in [-8, 7] (got "
                         f"{int(codes.min())} to {int(codes.max())})")
    half = codes.shape[-1] // 2
    low = codes[..., :half].to(torch.uint8) & 0xF  # two's complement nibble
    high = codes[..., half:].to(torch.uint8) & 0xF
    return low | (high << 4)


def int4_halves(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Return the signed codes in the low and high nibbles, each (..., d/2).

    The low nibbles are the first half of the head width, the high
    nibbles the second (pack_int4's layout).
    """
    check_tensor("packed", packed, min_dims=1, dtype=torch.uint8,
                 nonempty=True)
    signed = packed.view(torch.int8)
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(signed, 4), 4)
    return low, torch.bitwise_right_shift(signed, 4)  # shifts keep the sign


def unpack_int4(packed: Tensor) -> Tensor:
    """Return the int8 codes that pack_int4 packed, (..., d)."""
    return torch.cat(int4_halves(packed), dim=-1)


@dataclasses.dataclass(frozen=True)
class QuantizedKV:
    """Cached keys or values as integer codes and float32 scales.

    Attributes:
        codes: (B, H, T, d) int8 when ``bits`` is 8; (B, H, T, d/2) uint8
            when ``bits`` is 4, two codes a byte (see pack_int4).
        scale: float32 (B, H, T, 1) when ``per`` is "token", one scale per
            cached vector, or (B, H, 1, d) when ``per`` is "channel".
        bits: 8 or 4.
        per: "token" or "channel".

    Raises:
        TypeError: if codes or scale has the wrong dtype.
        ValueError: if bits is not 4 or 8, or a shape does not fit.
    """

    codes: Tensor
    scale: Tensor
    bits: int
    per: str = "token"

    def __post_init__(self) -> None:
        check_int("bits", self.bits)
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8 (got {self.bits})")
        check_choice("per", self.per, ("token", "channel"))
        dtype = torch.int8 if self.bits == 8 else torch.uint8
        check_tensor("codes", self.codes, dims=4, dtype=dtype, nonempty=True)
        check_tensor("scale", self.scale, dims=4, dtype=torch.float32)
        batch, heads, tokens, width = self.shape
        wanted = ((batch, heads, tokens, 1) if self.per == "token"
                  else (batch, heads, 1, width))
        if tuple(self.scale.shape) != wanted or tokens < 1:
            raise ValueError(f"scale must have shape {wanted} for per="
                             f"{self.per!r} (got {tuple(self.scale.shape)})")

    @property
    def shape(self) -> torch.Size:
        """Return (B, H, T, d), the shape of the float cache it stands for."""
        *lead, width = self.codes.shape
        return torch.Size((*lead, width * (2 if self.bits == 4 else 1)))

    @property
    def nbytes(self) -> int:
        """Return the bytes the codes and scales occupy."""
        return self.codes.nbytes + self.scale.nbytes

    def scale_at(self, start: int, stop: int) -> Tensor:
        """Return the scales that positions [start, stop) use."""
        tokens = self.shape[2]
        start = check_int("start", start, minimum=0, maximum=tokens - 1)
        stop = check_int("stop", stop, minimum=start + 1, maximum=tokens)
        return self.scale[..., start:stop, :] if self.per == "token" \
            else self.scale


def quantize_cache(x: Tensor, bits: int = 8, *,
                   per: str = "token") -> QuantizedKV:
    """Return keys or values (B, H, T, d) as a QuantizedKV of ``bits`` bits.

    The codes and scales are ch04.quantize_kv's (absmax, Chapter 2); at
    4 bits the codes are packed two a byte.

    Raises:
        TypeError: if x is not a floating-point tensor.
        ValueError: if x is not 4-D, bits is not 4 or 8, or per is not
            "token" or "channel".
    """
    check_tensor("x", x, dims=4, floating=True, nonempty=True)
    check_int("bits", bits)
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8 (got {bits})")
    codes, scale = ch04.quantize_kv(x, bits, per=per)
    return QuantizedKV(pack_int4(codes) if bits == 4 else codes, scale,
                       bits, per)


def dequantize_cache(cache: QuantizedKV) -> Tensor:
    """Return the float32 keys or values a QuantizedKV stands for."""
    if not isinstance(cache, QuantizedKV):
        raise TypeError(f"cache must be a QuantizedKV "
                        f"(got {describe(cache)})")
    codes = unpack_int4(cache.codes) if cache.bits == 4 else cache.codes
    return ch02.dequantize(codes, cache.scale)


def read_tile(cache: Tensor | QuantizedKV, start: int, stop: int,
              buffer: Tensor | None = None) -> Tensor:
    """Return positions [start, stop) of a cache as floats, (B, H, n, d).

    A float cache returns a view of itself. A QuantizedKV is dequantised
    into ``buffer``, a float32 tensor (B, H, >= n, d) that the caller
    allocates once and reuses for every tile; the result, a view of it,
    equals ch02.dequantize's for those positions.
    """
    check_type("cache", cache, (Tensor, QuantizedKV))
    batch, heads, tokens, width = cache.shape
    start = check_int("start", start, minimum=0, maximum=tokens - 1)
    stop = check_int("stop", stop, minimum=start + 1, maximum=tokens)
    if isinstance(cache, Tensor):
        return cache[..., start:stop, :]
    check_tensor("buffer", buffer, dims=4, dtype=torch.float32)
    if (buffer.shape[:2] != (batch, heads) or buffer.shape[-1] != width
            or buffer.shape[2] < stop - start):
        raise ValueError(f"buffer must be ({batch}, {heads}, >= "
                         f"{stop - start}, {width}) "
                         f"(got {tuple(buffer.shape)})")
    out = buffer[..., : stop - start, :]
    codes = cache.codes[..., start:stop, :]
    if cache.bits == 8:
        out.copy_(codes)  # int8 -> float, straight into the buffer
    else:
        half = out.shape[-1] // 2
        low, high = int4_halves(codes)  # (B, H, n, d/2) each
        out[..., :half].copy_(low)
        out[..., half:].copy_(high)
    out.mul_(cache.scale_at(start, stop))  # codes * scale, in place
    return out


# chapters/ch05-measured.qmd:681
def decode_shapes(query: Tensor, key: Tensor | QuantizedKV,
                  value: Tensor | QuantizedKV) -> tuple[int, int, int, int]:
    """Return (H_kv, G, T, d_v) of a decode step, checking the arguments.

    Raises:
        TypeError: if query is not a float tensor, or key or value is
            neither a float tensor of query's dtype nor a QuantizedKV.
        ValueError: if the shapes do not form one decode step.
    """
    check_tensor("query", query, dims=4, floating=True, nonempty=True)
    for name, cache in (("key", key), ("value", value)):
        if not isinstance(cache, QuantizedKV):
            check_tensor(name, cache, dims=4, dtype=query.dtype, nonempty=True)
    batch, query_heads, query_len, width = query.shape
    kv_heads, tokens = key.shape[1], key.shape[2]
    if query_len != 1:
        raise ValueError(f"query must be one token, (B, H_q, 1, d) "
                         f"(got {tuple(query.shape)})")
    if tuple(key.shape) != (batch, kv_heads, tokens, width) or tokens < 1:
        raise ValueError(f"key must be (B, H_kv, T, d) = ({batch}, H_kv, "
                         f"T, {width}) with T >= 1 (got {tuple(key.shape)})")
    if tuple(value.shape[:3]) != (batch, kv_heads, tokens):
        raise ValueError(f"value must be (B, H_kv, T, d_v) with key's B, "
                         f"H_kv and T (got {tuple(value.shape)})")
    if query_heads % kv_heads:
        raise ValueError(f"H_kv must divide H_q (got {query_heads} query "
                         f"heads and {kv_heads} KV heads)")
    return kv_heads, query_heads // kv_heads, tokens, value.shape[-1]


def flash_decode(query: Tensor, key: Tensor | QuantizedKV,
                 value: Tensor | QuantizedKV, *, tile: int = 4096,
                 window: int | None = None, sinks: int = 0,
                 scale: float | None = None) -> Tensor:
    """Return one decode step of attention, reading the cache tile by tile.

    Flash-decoding: the cached keys and values are walked in tiles of
    ``tile`` positions, each tile folded into a running softmax
    (Equation 5.2), so no score vector longer than a tile ever exists.
    Query head h reads KV head h // G, as in ch03.grouped_attention, and
    only the positions visible_ranges returns are read.

    Args:
        query: (B, H_q, 1, d), the newest token's queries.
        key: (B, H_kv, T, d) floats of query's dtype, or a QuantizedKV.
        value: (B, H_kv, T, d_v) floats, or a QuantizedKV.
        tile: positions per tile (>= 1).
        window, sinks: as in ch03.visibility_mask (None: every key).
        scale: the score scale; None means 1 / sqrt(d).

    Returns:
        (B, H_q, 1, d_v), equal to decode_reference up to rounding.
    """
    kv_heads, groups, tokens, value_width = decode_shapes(query, key, value)
    batch, query_heads, _, width = query.shape
    scale = (1 / math.sqrt(width) if scale is None
             else check_number("scale", scale, above=0))
    spans = tile_ranges(visible_ranges(tokens, window, sinks), tile)
    longest = max(stop - start for start, stop in spans)
    key_buffer, value_buffer = (  # one reused float32 tile per quantised side
        None if isinstance(cache, Tensor)
        else query.new_empty(batch, kv_heads, longest, cache.shape[-1],
                             dtype=torch.float32)
        for cache in (key, value))
    rows = query.reshape(batch, kv_heads, groups, width) * scale  # (B,Hkv,G,d)
    state = online_softmax_start(rows.shape[:-1], value_width, rows)
    for start, stop in spans:
        keys = read_tile(key, start, stop, key_buffer)  # (B, H_kv, n, d)
        values = read_tile(value, start, stop, value_buffer)  # (.., n, d_v)
        keys, values = keys.to(rows.dtype), values.to(rows.dtype)  # (no-op)
        scores = rows @ keys.transpose(-2, -1)  # (B, H_kv, G, n)
        state = online_softmax_update(state, scores, values)
    out = finish_online_softmax(state)  # (B, H_kv, G, d_v)
    return out.reshape(batch, query_heads, 1, value_width)


def decode_reference(query: Tensor, key: Tensor | QuantizedKV,
                     value: Tensor | QuantizedKV, *,
                     window: int | None = None, sinks: int = 0) -> Tensor:
    """Return the step flash_decode takes, computed densely: its reference.

    A quantised cache is dequantised whole (dequantize_cache); the step is
    ch03.grouped_attention with the last row of ch03.visibility_mask,
    every score at once. It builds a T x T mask when a window is given,
    so use it at test sizes.
    """
    _, _, tokens, _ = decode_shapes(query, key, value)
    keys, values = (dequantize_cache(cache).to(query.dtype)
                    if isinstance(cache, QuantizedKV) else cache
                    for cache in (key, value))
    mask = None
    if window is not None:
        mask = ch03.visibility_mask(tokens, window, sinks,
                                    device=query.device)[-1:]  # (1, T)
    return ch03.grouped_attention(query, keys, values, mask)


# chapters/ch05-measured.qmd:851
def tile_codes(tile: Tensor, bits: int,
               dtype: torch.dtype) -> list[tuple[Tensor, slice]]:
    """Return a tile as float pieces, each with the head-width slice it covers.

    One piece for a float or int8 tile; for a packed int4 tile, the low
    nibbles (the first half of the width) and the high ones (the second).
    """
    bits = check_int("bits", bits)
    if bits not in (4, 8, 32):
        raise ValueError(f"bits must be 4, 8 or 32 (got {bits})")
    check_type("dtype", dtype, torch.dtype)
    stored = {4: torch.uint8, 8: torch.int8}.get(bits)  # None: float tiles
    check_tensor("tile", tile, dims=4, floating=stored is None, dtype=stored,
                 nonempty=True)
    if bits == 4:
        low, high = int4_halves(tile)
        half = tile.shape[-1]
        return [(low.to(dtype), slice(0, half)),
                (high.to(dtype), slice(half, 2 * half))]
    return [(tile.to(dtype), slice(0, tile.shape[-1]))]


def fused_tile_update(state: OnlineState, rows: Tensor, key_tile: Tensor,
                      key_scale: Tensor | None, value_tile: Tensor,
                      value_scale: Tensor | None, bits: int) -> OnlineState:
    """Return the state after one tile, from the codes as stored (Equation 5.3).

    Written for torch.compile: codes become floats inside the kernel, the
    per-token scales multiply scores and weights after the dot products,
    and each of a group's G rows has its own sum so that one read of a
    code serves all G.

    Args:
        state: (m, l, a) over the rows (B, H_kv, G).
        rows: (B, H_kv, G, d) scaled query rows, any per-channel key scale
            already folded in.
        key_tile, value_tile: (B, H_kv, n, .) floats, int8 codes or packed
            int4 codes.
        key_scale, value_scale: (B, H_kv, n, 1) per-token scales, or None.
        bits: 32 for float tiles, 8 or 4.
    """
    bits = check_int("bits", bits)
    if bits not in (4, 8, 32):
        raise ValueError(f"bits must be 4, 8 or 32 (got {bits!r})")
    check_tensor("rows", rows, dims=4, floating=True, nonempty=True)
    stored = {4: torch.uint8, 8: torch.int8}.get(bits)  # None: float tiles
    for name, tile, scale in (("key", key_tile, key_scale),
                              ("value", value_tile, value_scale)):
        check_tensor(f"{name}_tile", tile, dims=4, floating=stored is None,
                     dtype=stored, nonempty=True)
        if scale is not None:
            check_tensor(f"{name}_scale", scale, dims=4, floating=True,
                         sizes={-1: 1})
    groups = rows.shape[-2]
    keys = tile_codes(key_tile, bits, rows.dtype)
    values = tile_codes(value_tile, bits, rows.dtype)
    scores = torch.stack(  # (B, H_kv, G, n): one sum per row of the group
        [sum((rows[..., g, None, part] * piece).sum(-1) for piece, part in keys)
         for g in range(groups)], dim=-2)
    if key_scale is not None:
        scores = scores * key_scale.transpose(-2, -1)  # sigma_j (q . c_j)

    def mix(weights: Tensor) -> Tensor:  # (B, H_kv, G, n) -> (.., G, d_v)
        if value_scale is not None:
            weights = weights * value_scale.transpose(-2, -1)  # w_j sigma_j
        return torch.stack(
            [torch.cat([(weights[..., g, :, None] * piece).sum(-2)
                        for piece, _ in values], dim=-1)
             for g in range(groups)], dim=-2)

    return online_softmax_update(state, scores, mix)


class CompiledTileUpdate:
    """fused_tile_update compiled by torch.compile, eager where that fails.

    The first call compiles; inductor's CPU backend needs a C++ compiler.
    If compiling raises, the reason is kept in ``fallback_reason``, one
    warning says so, and every later call runs fused_tile_update eagerly:
    the same result, more slowly.
    """

    def __init__(self) -> None:
        self.compiled = torch.compile(
            fused_tile_update, dynamic=True,  # one kernel for every T
            options={"cpp.enable_floating_point_contract_flag": "fast"})
        self.fallback_reason: str | None = None

    def __call__(self, *args) -> OnlineState:
        if self.fallback_reason is None:
            try:
                return self.compiled(*args)
            except Exception as error:  # no compiler, unsupported platform
                self.fallback_reason = str(error).strip().split("\n")[0][:300]
                warnings.warn("torch.compile failed, running the tile update "
                              f"eagerly: {self.fallback_reason}", stacklevel=2)
        return fused_tile_update(*args)


def fused_flash_decode(query: Tensor, key: Tensor | QuantizedKV,
                       value: Tensor | QuantizedKV, *, tile: int = 2048,
                       window: int | None = None, sinks: int = 0,
                       scale: float | None = None,
                       tile_update=fused_tile_update) -> Tensor:
    """Return flash_decode's step with the tiles handed over as stored.

    ``tile_update`` is fused_tile_update (eager, for checking) or a
    CompiledTileUpdate (the fast path). Arguments and result are
    flash_decode's; key and value must be both float or both quantised.
    """
    check_type("tile_update", tile_update, Callable)
    kv_heads, groups, tokens, value_width = decode_shapes(query, key, value)
    batch, query_heads, _, width = query.shape
    quantized = isinstance(key, QuantizedKV)
    if quantized != isinstance(value, QuantizedKV):
        raise TypeError("key and value must be both float tensors or both "
                        "QuantizedKV")
    scale = (1 / math.sqrt(width) if scale is None
             else check_number("scale", scale, above=0))
    spans = tile_ranges(visible_ranges(tokens, window, sinks), tile)
    rows = query.reshape(batch, kv_heads, groups, width) * scale  # (B,Hkv,G,d)
    if quantized and key.per == "channel":
        rows = rows * key.scale  # (q * sigma) . c_j, Equation 5.3
    bits = key.bits if quantized else 32
    state = online_softmax_start(rows.shape[:-1], value_width, rows)
    for start, stop in spans:
        if quantized:
            key_scale = (key.scale_at(start, stop) if key.per == "token"
                         else None)
            value_scale = (value.scale_at(start, stop) if value.per == "token"
                           else None)
            state = tile_update(state, rows, key.codes[..., start:stop, :],
                                key_scale, value.codes[..., start:stop, :],
                                value_scale, bits)
        else:
            state = tile_update(state, rows, key[..., start:stop, :], None,
                                value[..., start:stop, :], None, bits)
    out = finish_online_softmax(state)  # (B, H_kv, G, d_v)
    if quantized and value.per == "channel":
        out = out * value.scale  # sigma * sum_j w_j c_j
    return out.reshape(batch, query_heads, 1, value_width)


# chapters/ch05-measured.qmd:1037
def flash_decode_latent(query: Tensor, latent: Tensor, key_up: Tensor,
                        value_up: Tensor, *, tile: int = 4096,
                        window: int | None = None, sinks: int = 0) -> Tensor:
    """Return a latent-cache layer's decode step, absorbed, tile by tile.

    Chapter 4's absorption: q_h . (W_UK,h c_j) = (W_UK,h^T q_h) . c_j, so
    the cached latents are the keys and the values of one KV head shared
    by every query head, and the mixed latent is lifted by W_UV,h once.

    Args:
        query: (B, H, 1, d_h), the newest token's queries.
        latent: (B, T, r), the cache (no decoupled rotary part).
        key_up, value_up: (H * d_h, r), the weights of the layer's
            nn.Linear(r, H * d_h) up-projections.

    Returns:
        (B, H, 1, d_h), the heads' outputs before the output projection.
    """
    check_tensor("query", query, dims=4, floating=True, nonempty=True)
    check_tensor("latent", latent, dims=3, dtype=query.dtype, nonempty=True)
    heads, head_dim, rank = query.shape[1], query.shape[-1], latent.shape[-1]
    for name, weight in (("key_up", key_up), ("value_up", value_up)):
        check_tensor(name, weight, dims=2, dtype=query.dtype)
        if tuple(weight.shape) != (heads * head_dim, rank):
            raise ValueError(f"{name} must be (H * d_h, r) = "
                             f"({heads * head_dim}, {rank}) "
                             f"(got {tuple(weight.shape)})")
    key_up = key_up.view(heads, head_dim, rank)  # W_UK,h per head
    value_up = value_up.view(heads, head_dim, rank)  # W_UV,h per head
    latent_query = query @ key_up  # (B, H, 1, r): W_UK,h^T q_h
    shared = latent.unsqueeze(1)  # (B, 1, T, r): one KV head, K = V
    mixed = flash_decode(latent_query, shared, shared, tile=tile,
                         window=window, sinks=sinks,
                         scale=1 / math.sqrt(head_dim))  # (B, H, 1, r)
    return mixed @ value_up.transpose(-2, -1)  # (B, H, 1, d_h)


# chapters/ch05-measured.qmd:2053
def partition_bounds(seq_len: int, parts: int) -> list[tuple[int, int]]:
    """Return the contiguous [start, stop) token range each of P ranks holds.

    The first ``seq_len % parts`` ranks hold one token more than the
    others, so every token belongs to exactly one rank and block sizes
    differ by at most one.

    Args:
        seq_len: tokens in the whole sequence, T (>= parts).
        parts: number of ranks, P (>= 1).

    Returns:
        P pairs ``(start, stop)`` that cover ``range(seq_len)`` in order.

    Raises:
        TypeError: if an argument is not an integer.
        ValueError: if P < 1, T < 1 or T < P (a rank would hold nothing).
    """
    parts = check_int("parts", parts, minimum=1)
    seq_len = check_int("seq_len", seq_len, minimum=1)
    if seq_len < parts:
        raise ValueError(f"seq_len must be at least parts so that no rank "
                         f"is empty (got T={seq_len}, P={parts})")
    base, extra = divmod(seq_len, parts)
    bounds, start = [], 0
    for rank in range(parts):
        stop = start + base + (1 if rank < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


# chapters/ch05-measured.qmd:2107
def check_query_key_value(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Raise unless query and key are (..., T, d) and value (..., T, d_v).

    All three are float tensors with the same leading shape (..., T), and
    T, d and d_v are at least 1: the sequence that blockwise and ring
    attention split into blocks.

    Raises:
        TypeError: if an argument is not a floating-point tensor.
        ValueError: if a tensor has fewer than 2 dimensions, T, d or d_v
            is 0, or the shapes disagree.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, tensor, min_dims=2, floating=True)
    if query.shape[-2] < 1 or query.shape[-1] < 1:
        raise ValueError(f"query must be (..., T, d) with T >= 1 and d >= 1 "
                         f"(got shape {tuple(query.shape)})")
    if (key.shape != query.shape or value.shape[:-1] != query.shape[:-1]
            or value.shape[-1] < 1):
        raise ValueError("query and key must be (..., T, d) and value "
                         "(..., T, d_v >= 1) with the same (..., T) (got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)})")


def causal_block_scores(query: Tensor, key: Tensor, query_start: int,
                        key_start: int, scale: float) -> Tensor:
    """Return scaled scores (..., T_q, T_k) of a query block on a key block.

    A score is -inf where the key lies in the query's future.

    Query row i is token query_start + i and key column j is token
    key_start + j; the query may see the key when j <= i.
    """
    check_tensor("query", query, min_dims=2, floating=True, nonempty=True)
    check_tensor("key", key, min_dims=2, dtype=query.dtype, nonempty=True,
                 sizes={-1: query.shape[-1]})
    query_start = check_int("query_start", query_start, minimum=0)
    key_start = check_int("key_start", key_start, minimum=0)
    scale = check_number("scale", scale, above=0)
    query_pos = torch.arange(query_start, query_start + query.shape[-2],
                             device=query.device)
    key_pos = torch.arange(key_start, key_start + key.shape[-2],
                           device=query.device)
    visible = key_pos[None, :] <= query_pos[:, None]  # (T_q, T_k)
    scores = (query @ key.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    return scores.masked_fill(~visible, -math.inf)


def blockwise_causal_attention(query: Tensor, key: Tensor, value: Tensor,
                               parts: int, *, order: str = "ring") -> Tensor:
    """Return causal attention computed block by block, in one process.

    The arithmetic every ring rank does, run one rank after another, so
    the update can be tested without processes. ``order="ring"`` folds
    the blocks in the order a ring delivers them (own block first, then
    the left neighbour's, ...); ``order="reverse"`` folds them backwards.

    Raises:
        TypeError: if parts is not an integer or order not a string.
        ValueError: for P < 1, T < P, an unknown order or shapes that
            disagree.
    """
    check_query_key_value(query, key, value)
    check_choice("order", order, ("ring", "reverse"))
    bounds = partition_bounds(query.shape[-2], parts)
    scale = 1.0 / math.sqrt(query.shape[-1])
    outputs = []
    for rank, (q_start, q_stop) in enumerate(bounds):
        rows = query[..., q_start:q_stop, :]
        owners = [(rank - step) % parts for step in range(parts)]
        state = online_softmax_start(rows.shape[:-1], value.shape[-1], rows)
        for owner in owners if order == "ring" else owners[::-1]:
            k_start, k_stop = bounds[owner]
            if k_start >= q_stop:
                continue  # the whole block lies in these queries' future
            scores = causal_block_scores(rows, key[..., k_start:k_stop, :],
                                         q_start, k_start, scale)
            state = online_softmax_update(state, scores,
                                          value[..., k_start:k_stop, :])
        outputs.append(finish_online_softmax(state))
    return torch.cat(outputs, dim=-2)


# chapters/ch05-measured.qmd:2238
def ring_attention_rank(rank: int, parts: int, port: int, query: Tensor,
                        key: Tensor, value: Tensor, output: Tensor,
                        bytes_sent: Tensor, cache_bytes: Tensor) -> None:
    """Run rank ``rank`` of ring attention, writing into shared tensors.

    The rank keeps its own contiguous block of queries and attends, one
    step at a time, to the key/value block that started on rank
    (rank - step) mod P, passing each block on to rank + 1 while it
    computes (P - 1 transfers in all).

    Args:
        rank, parts: this rank and the number of ranks P.
        port: the TCP port on 127.0.0.1 where the ranks meet.
        query, key, value: the whole (..., T, d) tensors in shared
            memory; the rank copies out its own block.
        output: shared (..., T, d_v) tensor for the result rows.
        bytes_sent: shared int64 (P, P), bytes this rank sent each step.
        cache_bytes: shared int64 (P,), bytes of keys and values held.
    """
    parts = check_int("parts", parts, minimum=1)
    rank = check_int("rank", rank, minimum=0, maximum=parts - 1)
    port = check_int("port", port, minimum=1, maximum=65_535)
    check_query_key_value(query, key, value)
    check_tensor("output", output, dtype=value.dtype, sizes=dict(
        enumerate(value.shape)), dims=value.dim())
    check_tensor("bytes_sent", bytes_sent, dims=2, dtype=torch.int64,
                 sizes={0: parts, 1: parts})
    check_tensor("cache_bytes", cache_bytes, dims=1, dtype=torch.int64,
                 sizes={0: parts})
    bounds = partition_bounds(query.shape[-2], parts)
    torch.set_num_threads(1)  # P processes share the cores
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=parts)
    try:
        q_start, q_stop = bounds[rank]
        rows = query[..., q_start:q_stop, :].clone()
        block_key = key[..., q_start:q_stop, :].clone()  # 1/P of the cache
        block_value = value[..., q_start:q_stop, :].clone()
        cache_bytes[rank] = block_key.nbytes + block_value.nbytes
        scale = 1.0 / math.sqrt(query.shape[-1])
        right, left = (rank + 1) % parts, (rank - 1) % parts
        state = online_softmax_start(rows.shape[:-1], value.shape[-1], rows)
        for step in range(parts):
            owner = (rank - step) % parts  # whose block we hold now
            transfers = []
            if step < parts - 1:  # pass the block on while computing
                start, stop = bounds[(owner - 1) % parts]  # arrives next
                lead = block_key.shape[:-2]
                next_key = block_key.new_empty(
                    (*lead, stop - start, block_key.shape[-1]))
                next_value = block_value.new_empty(
                    (*lead, stop - start, block_value.shape[-1]))
                transfers = [dist.isend(block_key, right),
                             dist.isend(block_value, right),
                             dist.irecv(next_key, left),
                             dist.irecv(next_value, left)]
                bytes_sent[rank, step] = block_key.nbytes + block_value.nbytes
            k_start = bounds[owner][0]
            if k_start < q_stop:  # else the block is wholly in the future
                scores = causal_block_scores(rows, block_key, q_start,
                                             k_start, scale)
                state = online_softmax_update(state, scores, block_value)
            for transfer in transfers:
                transfer.wait()
            if transfers:
                block_key, block_value = next_key, next_value
        output[..., q_start:q_stop, :] = finish_online_softmax(state)
    finally:
        dist.destroy_process_group()


# chapters/ch05-measured.qmd:2332
def free_local_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class RingResult:
    """A ring run: the output, token ranges, bytes held and bytes sent."""

    output: torch.Tensor
    parts: int
    bounds: list
    cache_bytes_per_rank: list  # bytes of keys and values each rank held
    bytes_sent_per_step: list  # [rank][step], P - 1 steps

    def __post_init__(self) -> None:
        check_tensor("output", self.output, min_dims=2, floating=True,
                     nonempty=True)
        parts = check_int("parts", self.parts, minimum=1)
        check_type("bounds", self.bounds, list)
        tokens = self.output.shape[-2]
        if [tuple(pair) for pair in self.bounds] != partition_bounds(
                tokens, parts):
            raise ValueError(f"bounds must be partition_bounds({tokens}, "
                             f"{parts}) (got {self.bounds})")
        held = check_int_sequence("cache_bytes_per_rank",
                                  self.cache_bytes_per_rank, minimum=0)
        if len(held) != parts:
            raise ValueError(f"cache_bytes_per_rank must hold {parts} "
                             f"counts (got {len(held)})")
        check_type("bytes_sent_per_step", self.bytes_sent_per_step, list)
        sent = [check_int_sequence("bytes_sent_per_step", row, minimum=0)
                for row in self.bytes_sent_per_step]
        if len(sent) != parts or any(len(row) != parts - 1 for row in sent):
            raise ValueError(f"bytes_sent_per_step must hold {parts} rows "
                             f"of {parts - 1} counts (got {len(sent)} rows)")

    @property
    def total_cache_bytes(self) -> int:
        """Return the bytes of keys and values summed over all ranks."""
        return sum(self.cache_bytes_per_rank)

    @property
    def bytes_sent_per_rank(self) -> list:
        """Return each rank's bytes sent over the whole run."""
        return [sum(row) for row in self.bytes_sent_per_step]


def ring_attention(query: Tensor, key: Tensor, value: Tensor, parts: int, *,
                   timeout_s: float = 120.0) -> RingResult:
    """Return causal attention from P gloo processes passing blocks on.

    Args:
        query, key: (..., T, d) CPU tensors; value (..., T, d_v); T >= P.
        parts: number of processes P (>= 1); each holds a contiguous 1/P
            of the keys and values.
        timeout_s: seconds to wait for the processes before stopping them.

    Returns:
        A RingResult: the (..., T, d_v) output, each rank's cache bytes
        and the bytes it sent in each step.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if P < 1, T < 1, T < P, or the shapes disagree.
        TimeoutError: if the processes do not finish within timeout_s.
    """
    parts = check_int("parts", parts, minimum=1)
    timeout_s = check_number("timeout_s", timeout_s, above=0)
    check_query_key_value(query, key, value)
    bounds = partition_bounds(query.shape[-2], parts)
    shared = [t.detach().to("cpu").contiguous().share_memory_()
              for t in (query, key, value)]
    output = torch.zeros(value.shape, dtype=value.dtype).share_memory_()
    bytes_sent = torch.zeros(parts, parts, dtype=torch.int64).share_memory_()
    cache_bytes = torch.zeros(parts, dtype=torch.int64).share_memory_()
    # fresh processes import the worker by name: use the package's copy
    worker = importlib.import_module("longctx.ch05").ring_attention_rank
    methods = torch_multiprocessing.get_all_start_methods()
    method = "forkserver" if "forkserver" in methods else "spawn"
    if method == "forkserver":  # a clean server imports torch once
        torch_multiprocessing.get_context(method).set_forkserver_preload(
            ["torch", "longctx.ch05"])
    context = torch_multiprocessing.start_processes(
        worker, args=(parts, free_local_port(), *shared, output, bytes_sent,
                      cache_bytes),
        nprocs=parts, join=False, start_method=method)
    started = time.monotonic()
    while not context.join(timeout=0.5):
        if time.monotonic() - started > timeout_s:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"ring attention with P={parts} did not "
                               f"finish within {timeout_s} s")
    return RingResult(output=output.clone(), parts=parts, bounds=bounds,
                      cache_bytes_per_rank=cache_bytes.tolist(),
                      bytes_sent_per_step=bytes_sent[:, : parts - 1].tolist())
