# Generated from chapters/ch05-tiles.qmd and chapters/ch05-measured.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch05-tiles.qmd ("Reading a long cache in tiles") and chapters/ch05-measured.qmd ("What long context costs, measured")."""

import dataclasses
import importlib
import math
import os
import socket
import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch import multiprocessing as torch_multiprocessing

from longctx import ch02, ch03, ch04
from longctx.support import (
    check_attention_inputs,
    check_bits,
    check_choice,
    check_int,
    check_number,
    check_tensor,
)


# chapters/ch05-tiles.qmd:142
class OnlineState(NamedTuple):
    """The state of an online softmax over the keys read so far, (m, l, a).

    A plain tuple of the three tensors serves as well: the functions below
    unpack it. R is the number of query rows.

    Attributes:
        running_max: m, (..., R, 1): the largest score each row has seen.
        running_sum: l, (..., R, 1): the sum of e^(z_j - m) so far.
        accumulator: a, (..., R, d_v): the sum of e^(z_j - m) v_j so far.
    """

    running_max: Tensor
    running_sum: Tensor
    accumulator: Tensor


def online_softmax_start(rows: tuple[int, ...], value_width: int,
                         like: Tensor) -> OnlineState:
    """Return the state before any key: m = -inf, l = 0, a = 0 per row.

    ``rows`` is the leading shape (..., R); the state takes like's dtype.
    """
    running_max = like.new_full((*rows, 1), -math.inf)  # m
    running_sum = like.new_zeros((*rows, 1))  # l
    accumulator = like.new_zeros((*rows, value_width))  # a
    return OnlineState(running_max, running_sum, accumulator)


def online_softmax_update(state: OnlineState, scores: Tensor,
                          values) -> OnlineState:
    """Return (m', l', a') after one tile of keys (Equation 9.1).

    scores (..., R, n) are scaled, -inf where a row may not see a key;
    values are (..., n, d_v), or a function turning the weights
    (..., R, n) into their mix (..., R, d_v).
    """
    running_max, running_sum, accumulator = state
    new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
    # a row that has seen no key keeps m' = -inf: shift it by 0 instead
    shift = torch.where(new_max.isfinite(), new_max, 0.0)
    correction = torch.exp(running_max - shift)  # e^(m - m')
    weights = (scores - shift).exp_()  # e^(z_j - m'), 0 where hidden
    mixed = values(weights) if callable(values) else weights @ values
    running_sum = running_sum * correction + weights.sum(-1, keepdim=True)
    return OnlineState(new_max, running_sum, accumulator * correction + mixed)


def merge_states(state: OnlineState, dim: int) -> OnlineState:
    """Return one state from states stacked along ``dim`` (log-sum-exp).

    Each part is moved onto the largest m and the parts are added: the
    same rescaling as Equation 9.1, with a whole state as the tile.
    """
    running_max, running_sum, accumulator = state
    top = running_max.amax(dim, keepdim=True)
    shift = torch.where(top.isfinite(), top, 0.0)
    correction = torch.exp(running_max - shift)  # e^(m_c - m)
    return OnlineState(top.squeeze(dim), (running_sum * correction).sum(dim),
                       (accumulator * correction).sum(dim))


def finish_online_softmax(state: OnlineState) -> Tensor:
    """Return a / l, the attention output; a row that saw no key gets 0."""
    _, running_sum, accumulator = state
    seen = running_sum > 0
    return torch.where(seen, accumulator / torch.where(seen, running_sum, 1.0),
                       0.0)


# chapters/ch05-tiles.qmd:227
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
    tile = check_int("tile", tile, minimum=1)  # 0 or less: no tiles at all
    return [(begin, min(begin + tile, stop))
            for start, stop in ranges
            for begin in range(start, stop, tile)]


# chapters/ch05-tiles.qmd:301
#: The bit widths the per-vector cache holds (the integer route's 4 and 8).
PACKED_BITS = (4, 8)
#: The bit widths the packer holds: 8/b codes of b bits share a byte.
SUBBYTE_BITS = (2, 4)


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Return b-bit codes packed 8/b a byte: (..., d) int8 -> (..., d b/8).

    The codes, integers in [-2^(b-1), 2^(b-1) - 1], are cut into 8/b equal
    parts along the last dimension; part i goes into bits i b to
    (i + 1) b - 1 of each byte of a uint8 tensor, in two's complement.

    Raises:
        ValueError: if bits is not 2 or 4, d is not a multiple of 8/b, or
            a code does not fit b bits.
    """
    bits = check_bits("bits", bits, SUBBYTE_BITS)
    per_byte, half = 8 // bits, 2 ** (bits - 1)
    if codes.shape[-1] % per_byte:
        raise ValueError(f"codes must have a last dimension divisible by "
                         f"{per_byte} to pack {per_byte} a byte (got "
                         f"{tuple(codes.shape)})")
    if codes.numel() and not (-half <= int(codes.min())
                              <= int(codes.max()) <= half - 1):
        raise ValueError(f"{bits}-bit codes must lie in [{-half}, {half - 1}]"
                         f" (got {int(codes.min())} to {int(codes.max())})")
    parts = (codes.to(torch.uint8) & (2**bits - 1)).chunk(per_byte, dim=-1)
    packed = torch.zeros_like(parts[0])
    for place, part in enumerate(parts):
        packed |= part << (place * bits)
    return packed


def code_parts(packed: Tensor, bits: int) -> list[Tensor]:
    """Return the signed codes of each of the 8/b parts, each (..., d b/8).

    Part i of a byte read as signed: shifting left by 8 - (i + 1) b drops
    the higher codes, and shifting right by 8 - b brings part i down with
    its sign, since the right shift of a signed byte repeats the sign bit.
    """
    signed = packed.view(torch.int8)
    return [torch.bitwise_right_shift(
                torch.bitwise_left_shift(signed, 8 - (place + 1) * bits),
                8 - bits) for place in range(8 // bits)]


def unpack_codes(packed: Tensor, bits: int) -> Tensor:
    """Return the int8 codes that pack_codes packed, (..., d)."""
    return torch.cat(code_parts(packed, bits), dim=-1)


@dataclasses.dataclass(frozen=True)
class QuantizedKV:
    """Cached keys or values as integer codes, one float32 scale a vector.

    Attributes:
        codes: (B, H, T, d) int8 when ``bits`` is 8; (B, H, T, d/2) uint8
            when ``bits`` is 4, two codes a byte (see pack_codes).
        scale: float32 (B, H, T, 1).
        bits: 8 or 4.

    Raises:
        TypeError: if codes or scale has the wrong dtype.
        ValueError: if bits is not 4 or 8, or the shapes do not fit.
    """

    codes: Tensor
    scale: Tensor
    bits: int

    def __post_init__(self) -> None:
        check_bits("bits", self.bits, PACKED_BITS)
        dtype = torch.int8 if self.bits == 8 else torch.uint8
        check_tensor("codes", self.codes, dims=4, dtype=dtype, nonempty=True)
        check_tensor("scale", self.scale, dims=4, dtype=torch.float32,
                     sizes={0: self.codes.shape[0], 1: self.codes.shape[1],
                            2: self.codes.shape[2], 3: 1})

    @property
    def shape(self) -> torch.Size:
        """Return (B, H, T, d), the shape of the float cache it stands for."""
        *lead, width = self.codes.shape
        return torch.Size((*lead, width * (2 if self.bits == 4 else 1)))

    @property
    def nbytes(self) -> int:
        """Return the bytes the codes and scales occupy."""
        return self.codes.nbytes + self.scale.nbytes


def quantize_cache(x: Tensor, bits: int = 8) -> QuantizedKV:
    """Return keys or values (B, H, T, d) as a QuantizedKV of ``bits`` bits.

    The codes and scales are ch04.quantize_kv's (absmax, one scale per
    vector); at 4 bits the codes are packed two a byte.
    """
    codes, scale = ch04.quantize_kv(x, check_bits("bits", bits, PACKED_BITS))
    return QuantizedKV(pack_codes(codes, 4) if bits == 4 else codes, scale,
                       bits)


def dequantize_cache(cache: QuantizedKV) -> Tensor:
    """Return the float32 keys or values a QuantizedKV stands for."""
    codes = (unpack_codes(cache.codes, 4) if cache.bits == 4
             else cache.codes)
    return ch02.dequantize(codes, cache.scale)


def read_tile(cache: Tensor | QuantizedKV, start: int, stop: int,
              buffer: Tensor | None = None) -> Tensor:
    """Return positions [start, stop) of a cache as floats, (B, H, n, d).

    A float cache returns a view of itself. A QuantizedKV is dequantised
    into ``buffer``, a float32 tensor (B, H, >= n, d) that the caller
    allocates once and reuses; the result is a view of it.
    """
    if isinstance(cache, Tensor):
        return cache[..., start:stop, :]
    out = buffer[..., : stop - start, :]
    codes = cache.codes[..., start:stop, :]
    if cache.bits == 8:
        out.copy_(codes)  # int8 -> float, straight into the buffer
    else:
        half = out.shape[-1] // 2
        low, high = code_parts(codes, 4)  # (B, H, n, d/2) each
        out[..., :half].copy_(low)
        out[..., half:].copy_(high)
    return out.mul_(cache.scale[..., start:stop, :])  # codes * scale


# chapters/ch05-tiles.qmd:450
def stacked_rows(query: Tensor, kv_heads: int, scale: float | None) -> Tensor:
    """Return the scaled query (B, H_q, 1, d) as rows (B, H_kv, G, d).

    Query head h reads KV head h // G, as in ch03.grouped_attention.
    """
    batch, query_heads, _, width = query.shape
    assert query_heads % kv_heads == 0, "H_kv must divide H_q"
    scale = 1 / math.sqrt(width) if scale is None else scale
    return query.reshape(batch, kv_heads, query_heads // kv_heads,
                         width) * scale


def tiled_decode(query: Tensor, key: Tensor | QuantizedKV,
                 value: Tensor | QuantizedKV, *, tile: int = 4096,
                 window: int | None = None, sinks: int = 0,
                 scale: float | None = None) -> Tensor:
    """Return one decode step, walking the cache one tile after another.

    query (B, H_q, 1, d); key (B, H_kv, T, d) and value (B, H_kv, T, d_v),
    floats or QuantizedKV. Each tile of the positions visible_ranges
    returns is folded into a running softmax (Equation 9.1). Returns
    (B, H_q, 1, d_v), equal to decode_reference up to rounding.
    """
    batch, kv_heads, tokens, _ = key.shape
    value_width = value.shape[-1]
    rows = stacked_rows(query, kv_heads, scale)  # (B, H_kv, G, d)
    spans = tile_ranges(visible_ranges(tokens, window, sinks), tile)
    longest = max(stop - start for start, stop in spans)
    key_buffer, value_buffer = (  # one reused float32 tile per quantised side
        None if isinstance(cache, Tensor)
        else query.new_empty(batch, kv_heads, longest, cache.shape[-1],
                             dtype=torch.float32)
        for cache in (key, value))
    state = online_softmax_start(rows.shape[:-1], value_width, rows)
    for start, stop in spans:
        keys = read_tile(key, start, stop, key_buffer).to(rows.dtype)
        values = read_tile(value, start, stop, value_buffer).to(rows.dtype)
        scores = rows @ keys.transpose(-2, -1)  # (B, H_kv, G, n)
        state = online_softmax_update(state, scores, values)
    out = finish_online_softmax(state)  # (B, H_kv, G, d_v)
    return out.reshape(query.shape[:-1] + (value_width,))


def decode_reference(query: Tensor, key: Tensor | QuantizedKV,
                     value: Tensor | QuantizedKV, *,
                     window: int | None = None, sinks: int = 0) -> Tensor:
    """Return the same step computed densely: every score at once.

    A quantised cache is dequantised whole (dequantize_cache); the step is
    ch03.grouped_attention with the last row of ch03.visibility_mask. It
    builds a T x T mask when a window is given: use it at test sizes.
    """
    keys, values = (dequantize_cache(cache).to(query.dtype)
                    if isinstance(cache, QuantizedKV) else cache
                    for cache in (key, value))
    mask = None
    if window is not None:
        mask = ch03.visibility_mask(keys.shape[2], window, sinks,
                                    device=query.device)[-1:]  # (1, T)
    return ch03.grouped_attention(query, keys, values, mask)


# chapters/ch05-tiles.qmd:576
def chunk_states(rows: Tensor, keys: Tensor, values: Tensor,
                 chunk: int) -> OnlineState:
    """Return the state (m, l, a) of every chunk of ``chunk`` keys at once.

    rows (B, H, G, d); keys (B, H, n, d) and values (B, H, n, d_v) with n
    a multiple of chunk. The states cover (B, H, C, G) for C = n / chunk.
    """
    batch, heads, tokens, width = keys.shape
    count = tokens // chunk
    keys = keys.reshape(batch, heads, count, chunk, width)  # a view
    values = values.reshape(batch, heads, count, chunk, values.shape[-1])
    scores = rows.unsqueeze(2) @ keys.transpose(-2, -1)  # (B, H, C, G, chunk)
    top = scores.amax(-1, keepdim=True)  # m_c
    weights = scores.sub_(top).exp_()  # in place: no second score tensor
    return top, weights.sum(-1, keepdim=True), weights @ values


def split_kv_decode(query: Tensor, key: Tensor, value: Tensor, *,
                    chunk: int = 512, window: int | None = None,
                    sinks: int = 0, scale: float | None = None) -> Tensor:
    """Return one decode step by Flash-Decoding's split-KV (Equation 9.2).

    query (B, H_q, 1, d); key (B, H_kv, T, d), value (B, H_kv, T, d_v).
    The visible positions are cut into chunks whose states are computed
    in one batched pass (a shorter last chunk of each run in one more)
    and merged by log-sum-exp. Returns (B, H_q, 1, d_v).
    """
    chunk = check_int("chunk", chunk, minimum=1)
    rows = stacked_rows(query, key.shape[1], scale)  # (B, H_kv, G, d)
    parts = []
    for start, stop in visible_ranges(key.shape[2], window, sinks):
        whole = start + (stop - start) // chunk * chunk
        for first, last, size in ((start, whole, chunk),
                                  (whole, stop, stop - whole)):
            if last > first:
                parts.append(chunk_states(rows, key[..., first:last, :],
                                          value[..., first:last, :], size))
    state = merge_states(tuple(torch.cat(piece, dim=2)
                               for piece in zip(*parts, strict=True)), dim=2)
    out = finish_online_softmax(state)  # (B, H_kv, G, d_v)
    return out.reshape(query.shape[:-1] + (value.shape[-1],))


# chapters/ch05-tiles.qmd:730
def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Return int8 codes and float32 scales of each row of x (..., n)."""
    return ch02.quantize(x.float(), 8, dim=-1)


def two_byte_rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Return (high, low, scale) with x ~ (128 high + low) * scale per row.

    x (..., n) >= 0 is rounded to 127 * 128 levels, then split into two
    int8 digits of base 128, so that two int8 products carry 14 bits.
    """
    scale = (x.amax(-1, keepdim=True) / (127 * 128)).clamp_min(1e-30)
    levels = x.div(scale).round_()  # integers 0 .. 127 * 128, as floats
    high = levels.div(128).floor_()  # exact: 128 is a power of two
    low = levels.sub_(high, alpha=128)  # in place: levels - 128 high
    return high.to(torch.int8), low.to(torch.int8), scale.float()


def code_halves(codes: Tensor, bits: int) -> list[tuple[Tensor, int]]:
    """Return a head's stored codes as int8 pieces, each with its divisor.

    An int8 cache is one piece. A packed int4 byte read as signed gives
    the high code by b >> 4 and sixteen times the low one by b << 4,
    exactly: two pieces, each half the width, with no unpacking loop.
    """
    if bits == 8:
        return [(codes, 1)]
    signed = codes.view(torch.int8)
    return [(torch.bitwise_left_shift(signed, 4), 16),  # 16 x low code
            (torch.bitwise_right_shift(signed, 4), 1)]  # high code


def int8_decode(query: Tensor, key: QuantizedKV, value: QuantizedKV, *,
                tile: int = 8192, scale: float | None = None) -> Tensor:
    """Return one decode step from integer codes (Equation 9.3).

    query (B, H_q, 1, d); key and value QuantizedKV (B, H_kv, T, .) of 8
    or 4 bits. Scores: the key codes times int8 query rows, summed in
    int32 by torch._int_mm, times the two scales. Mix: the weights
    w_j sigma_j as two int8 digits, stacked as 2G rows, times the value
    codes, the same way. Each head is read in tiles of ``tile`` positions,
    so that an int4 tile's shifted codes are still in cache when the
    product reads them. Returns (B, H_q, 1, d).
    """
    batch, kv_heads, tokens, width = key.shape
    rows = stacked_rows(query, kv_heads, scale)  # (B, H_kv, G, d)
    row_codes, row_scale = int8_rows(rows)  # (B, H_kv, G, d), (.., G, 1)
    groups = rows.shape[2]
    heads = [(b, h) for b in range(batch) for h in range(kv_heads)]
    spans = tile_ranges([(0, tokens)], tile)
    dots = query.new_empty(batch, kv_heads, tokens, groups,
                           dtype=torch.int32)  # q . c_j, (B, H_kv, T, G)
    for b, h in heads:
        columns = row_codes[b, h].T.chunk(2 if key.bits == 4 else 1)  # d'
        for start, stop in spans:  # codes (n, d') @ rows (d', G)
            pieces = code_halves(key.codes[b, h, start:stop], key.bits)
            out = dots[b, h, start:stop]  # written in place
            torch._int_mm(pieces[0][0], columns[0], out=out)
            if len(pieces) == 2:  # int4: the first product is of 16 x low,
                out.bitwise_right_shift_(4).add_(  # so >> 4 divides exactly
                    torch._int_mm(pieces[1][0], columns[1]))
    scores = query.new_empty(batch, kv_heads, groups, tokens)
    torch.mul(dots.transpose(-2, -1), key.scale.transpose(-2, -1),
              out=scores).mul_(row_scale)  # scales x (q . c_j), (.., G, T)
    weights = torch.softmax(scores, dim=-1).mul_(
        value.scale.transpose(-2, -1))  # w_j sigma_j
    high, low, weight_scale = two_byte_rows(weights)
    digits = torch.cat([high, low], dim=-2)  # (B, H_kv, 2G, T)
    mixed = query.new_zeros(batch, kv_heads, 2 * groups, width)
    for b, h in heads:  # digits (2G, n) @ codes (n, d'): one product a piece
        for start, stop in spans:
            pieces = code_halves(value.codes[b, h, start:stop], value.bits)
            mixed[b, h] += torch.cat([
                torch._int_mm(digits[b, h, :, start:stop], piece).float()
                / divisor for piece, divisor in pieces], dim=-1)
    high_sum, low_sum = mixed.chunk(2, dim=-2)  # (B, H_kv, G, d) each
    out = (128 * high_sum + low_sum) * weight_scale
    return out.reshape(query.shape).to(query.dtype)


# chapters/ch05-tiles.qmd:937
def asymmetric_codes(x: Tensor, bits: int,
                     dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """Return (codes, scale, offset) with x ~ codes * scale + offset.

    The range [min, max] along ``dim`` is cut into 2^bits - 1 steps; the
    codes are stored signed (shifted by 2^(bits-1)) so that they fit
    int8 and pack_codes, and the offset absorbs the shift.
    """
    low = x.amin(dim, keepdim=True)
    levels = 2**bits - 1
    step = ((x.amax(dim, keepdim=True) - low) / levels).clamp_min(1e-12)
    half = 2 ** (bits - 1)
    codes = torch.round((x - low) / step) - half  # in [-half, half - 1]
    return codes.to(torch.int8), step, low + half * step


#: The bit widths a KIVI-style cache holds: bytes, or codes packed in them.
KIVI_BITS = (2, 4, 8)


@dataclasses.dataclass
class KiviCache:
    """A KIVI-style cache: keys per channel in groups, values per token.

    Attributes:
        bits: 8, 4 or 2; group: G_t tokens per key group; residual: R, the
            fewest newest tokens kept in full precision.
        key_codes, value_codes: (B, H, T_q, d) int8, or packed by
            pack_codes, (B, H, T_q, d b/8) uint8 below 8 bits, for the T_q
            quantised tokens.
        key_scale, key_offset: (B, H, T_q / G_t, d) float32, per group.
        value_scale, value_offset: (B, H, T_q, 1) float32, per token.
        key_recent, value_recent: (B, H, T_r, d) float32, R <= T_r < R + G_t
            once the cache holds R tokens.
    """

    bits: int
    group: int
    residual: int
    key_codes: Tensor
    key_scale: Tensor
    key_offset: Tensor
    value_codes: Tensor
    value_scale: Tensor
    value_offset: Tensor
    key_recent: Tensor
    value_recent: Tensor

    @classmethod
    def from_keys_values(cls, key: Tensor, value: Tensor, *, bits: int = 4,
                         group: int = 32, residual: int = 32) -> "KiviCache":
        """Return the cache of keys and values (B, H, T, d), as if appended.

        Raises:
            TypeError: if an argument has the wrong type.
            ValueError: for bits other than 2, 4 or 8, group < 1,
                residual < 0, or key and value of different shapes.
        """
        check_tensor("key", key, dims=4, floating=True, nonempty=True)
        check_tensor("value", value, dims=4, floating=True,
                     sizes=dict(enumerate(key.shape)))
        bits = check_bits("bits", bits, KIVI_BITS)
        group = check_int("group", group, minimum=1)
        residual = check_int("residual", residual, minimum=0)
        empty = key[..., :0, :].float()
        no_codes = torch.zeros(empty.shape, dtype=torch.int8)
        stored = no_codes if bits == 8 else pack_codes(no_codes, bits)
        cache = cls(bits, group, residual, stored, empty, empty, stored,
                    empty[..., :1], empty[..., :1], empty, empty)
        cache.append(key, value)
        return cache

    def pack(self, codes: Tensor) -> Tensor:
        """Return int8 codes as stored: as they are, or 8/b a byte."""
        codes = codes.to(torch.int8)
        return codes if self.bits == 8 else pack_codes(codes, self.bits)

    def append(self, key: Tensor, value: Tensor) -> None:
        """Add tokens (B, H, n, d) and quantise every whole group past R."""
        self.key_recent = torch.cat([self.key_recent, key.float()], dim=2)
        self.value_recent = torch.cat([self.value_recent, value.float()],
                                      dim=2)
        ready = ((self.key_recent.shape[2] - self.residual)
                 // self.group * self.group)
        if ready <= 0:
            return
        keys, values = self.key_recent[..., :ready, :], \
            self.value_recent[..., :ready, :]
        batch, heads, _, width = keys.shape
        grouped = keys.reshape(batch, heads, -1, self.group, width)
        codes, scale, offset = asymmetric_codes(grouped, self.bits, dim=3)
        value_codes, value_scale, value_offset = asymmetric_codes(
            values, self.bits, dim=-1)
        new = {"key_codes": self.pack(codes.flatten(2, 3)),
               "key_scale": scale.squeeze(3), "key_offset": offset.squeeze(3),
               "value_codes": self.pack(value_codes),
               "value_scale": value_scale, "value_offset": value_offset}
        for name, part in new.items():
            setattr(self, name, torch.cat([getattr(self, name), part], dim=2))
        self.key_recent = self.key_recent[..., ready:, :]
        self.value_recent = self.value_recent[..., ready:, :]

    @property
    def tokens(self) -> int:
        """Return T, the tokens cached (quantised and recent)."""
        return self.value_scale.shape[2] + self.key_recent.shape[2]

    @property
    def nbytes(self) -> int:
        """Return the bytes of every tensor the cache holds."""
        return sum(part.nbytes for part in (
            self.key_codes, self.key_scale, self.key_offset,
            self.value_codes, self.value_scale, self.value_offset,
            self.key_recent, self.value_recent))

    def codes_as_floats(self, codes: Tensor) -> Tensor:
        """Return stored codes as float32 (..., n, d)."""
        return (codes if self.bits == 8
                else unpack_codes(codes, self.bits)).float()

    def dequantize(self) -> tuple[Tensor, Tensor]:
        """Return the float32 keys and values (B, H, T, d) it stands for."""
        batch, heads, quantised, _ = self.value_scale.shape
        width = self.key_recent.shape[-1]
        codes = self.codes_as_floats(self.key_codes).view(
            batch, heads, -1, self.group, width)
        keys = (codes * self.key_scale.unsqueeze(3)
                + self.key_offset.unsqueeze(3)).view(batch, heads, -1, width)
        values = (self.codes_as_floats(self.value_codes) * self.value_scale
                  + self.value_offset)
        return (torch.cat([keys, self.key_recent], dim=2),
                torch.cat([values, self.value_recent], dim=2))

    def attend(self, query: Tensor, *, groups_per_pass: int = 32,
               scale: float | None = None) -> Tensor:
        """Return one decode step over the cache, query (B, H_q, 1, d).

        Split-KV with the key group as the chunk: each pass converts the
        codes of ``groups_per_pass`` groups (never the whole cache),
        computes their states and merges them into one, so the step holds
        one small state per pass; the residual is one more chunk.
        """
        rows = stacked_rows(query.float(), self.key_recent.shape[1], scale)
        batch, heads, _, width = rows.shape
        count = self.key_scale.shape[2]
        parts = []
        for first in range(0, count, groups_per_pass):
            last = min(first + groups_per_pass, count)
            span = slice(first * self.group, last * self.group)
            keys = self.codes_as_floats(self.key_codes[..., span, :]).view(
                batch, heads, last - first, self.group, width)
            group_rows = (rows.unsqueeze(2)
                          * self.key_scale[..., first:last, None, :])
            offsets = (rows.unsqueeze(2)
                       * self.key_offset[..., first:last, None, :]).sum(-1)
            scores = (group_rows @ keys.transpose(-2, -1)
                      + offsets[..., None])  # (B, H, C, G, G_t)
            top = scores.amax(-1, keepdim=True)
            weights = torch.exp(scores - top)  # (B, H, C, G, G_t)
            value_scale = self.value_scale[..., span, :].view(
                batch, heads, last - first, 1, self.group)
            value_offset = self.value_offset[..., span, :].view(
                batch, heads, last - first, 1, self.group)
            values = self.codes_as_floats(self.value_codes[..., span, :])
            mixed = ((weights * value_scale)
                     @ values.view(batch, heads, last - first, self.group, -1)
                     + (weights * value_offset).sum(-1, keepdim=True))
            parts.append(merge_states(  # the pass's groups, (B, H, G, .)
                (top, weights.sum(-1, keepdim=True), mixed), dim=2))
        recent = self.key_recent.shape[2]
        if recent:
            parts.append(merge_states(chunk_states(
                rows, self.key_recent, self.value_recent, recent), dim=2))
        state = merge_states(tuple(torch.stack(piece, dim=2)
                                   for piece in zip(*parts, strict=True)),
                             dim=2)
        out = finish_online_softmax(state)  # (B, H, G, d)
        return out.reshape(query.shape).to(query.dtype)


# chapters/ch05-tiles.qmd:1204
def latent_decode(query: Tensor, latent: Tensor, key_up: Tensor,
                  value_up: Tensor, *, chunk: int = 512,
                  window: int | None = None, sinks: int = 0) -> Tensor:
    """Return a latent-cache layer's decode step, absorbed, by split-KV.

    ``ch04``'s absorption: q_h . (W_UK,h c_j) = (W_UK,h^T q_h) . c_j, so
    the latents (B, T, r) are the keys and the values of one KV head
    shared by every query head, and the mixed latent is lifted by W_UV,h
    once. query (B, H, 1, d_h); key_up, value_up (H * d_h, r), the
    weights of nn.Linear(r, H * d_h). Returns (B, H, 1, d_h).
    """
    heads, head_dim, rank = query.shape[1], query.shape[-1], latent.shape[-1]
    key_up = key_up.view(heads, head_dim, rank)  # W_UK,h per head
    value_up = value_up.view(heads, head_dim, rank)  # W_UV,h per head
    latent_query = query @ key_up  # (B, H, 1, r): W_UK,h^T q_h
    shared = latent.unsqueeze(1)  # (B, 1, T, r): one KV head, K = V
    mixed = split_kv_decode(latent_query, shared, shared, chunk=chunk,
                            window=window, sinks=sinks,
                            scale=1 / math.sqrt(head_dim))  # (B, H, 1, r)
    return mixed @ value_up.transpose(-2, -1)  # (B, H, 1, d_h)


# chapters/ch05-measured.qmd:781
def flash_prefill(query: Tensor, key: Tensor, value: Tensor, *,
                  query_tile: int = 256, key_tile: int = 256) -> Tensor:
    """Return causal attention (B, H, n, d_v), FlashAttention's way.

    query, key (B, H, n, d), value (B, H, n, d_v). For each tile of
    ``query_tile`` rows the key tiles up to the diagonal are folded into
    a running softmax (Equation 9.1); tiles wholly in the future are
    skipped, and no score tile is larger than query_tile x key_tile.
    """
    tokens, width = query.shape[-2:]
    out = query.new_empty(query.shape[:-1] + (value.shape[-1],))
    for q_start in range(0, tokens, query_tile):
        q_stop = min(q_start + query_tile, tokens)
        rows = query[..., q_start:q_stop, :] / math.sqrt(width)
        state = online_softmax_start(rows.shape[:-1], value.shape[-1], rows)
        for k_start in range(0, q_stop, key_tile):  # stop at the diagonal
            k_stop = min(k_start + key_tile, tokens)
            scores = rows @ key[..., k_start:k_stop, :].transpose(-2, -1)
            if k_stop > q_start + 1:  # the tile holds some future keys
                future = (torch.arange(k_start, k_stop, device=query.device)
                          > torch.arange(q_start, q_stop,
                                         device=query.device)[:, None])
                scores.masked_fill_(future, -math.inf)  # the product's own
            state = online_softmax_update(state, scores,
                                          value[..., k_start:k_stop, :])
        out[..., q_start:q_stop, :] = finish_online_softmax(state)
    return out


# chapters/ch05-measured.qmd:1218
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


# chapters/ch05-measured.qmd:1272
def causal_block_scores(query: Tensor, key: Tensor, query_start: int,
                        key_start: int, scale: float) -> Tensor:
    """Return scaled scores (..., T_q, T_k) of a query block on a key block.

    Query row i is token query_start + i and key column j is token
    key_start + j; a score is -inf where the key lies in the future.
    """
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
    check_attention_inputs(query, key, value, same_tokens=True)
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


# chapters/ch05-measured.qmd:1369
def ring_attention_rank(rank: int, parts: int, port: int, query: Tensor,
                        key: Tensor, value: Tensor, output: Tensor,
                        bytes_sent: Tensor, cache_bytes: Tensor,
                        seconds: Tensor) -> None:
    """Run rank ``rank`` of ring attention, writing into shared tensors.

    The rank keeps its own block of queries and, at step k, attends to
    the key/value block that started on rank (rank - k) mod P while it
    passes that block on to rank + 1. query, key, value and output are
    the whole (..., T, .) tensors in shared memory; bytes_sent (P, P)
    and seconds (P, P, 2) record each step's bytes, compute time and
    time spent waiting for the transfer after computing.
    """
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
            began = time.perf_counter()
            k_start = bounds[owner][0]
            if k_start < q_stop:  # else the block is wholly in the future
                scores = causal_block_scores(rows, block_key, q_start,
                                             k_start, scale)
                state = online_softmax_update(state, scores, block_value)
            computed = time.perf_counter()
            for transfer in transfers:
                transfer.wait()
            seconds[rank, step] = torch.tensor(
                [computed - began, time.perf_counter() - computed])
            if transfers:
                block_key, block_value = next_key, next_value
        output[..., q_start:q_stop, :] = finish_online_softmax(state)
    finally:
        dist.destroy_process_group()


# chapters/ch05-measured.qmd:1450
def free_local_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class RingResult:
    """A ring run: the output, token ranges, bytes held and sent, times.

    Attributes:
        output: The attention output, shaped like the query (..., T, d).
        parts: P, the ranks (processes) the ring ran on.
        bounds: Each rank's (start, stop) token range.
        cache_bytes_per_rank: Bytes of keys and values each rank held.
        bytes_sent_per_step: [rank][step], P - 1 steps, in bytes.
        compute_seconds: [rank][step], P steps, in seconds.
        wait_seconds: [rank][step]: seconds waiting for a transfer after
            compute.
    """

    output: torch.Tensor
    parts: int
    bounds: list
    cache_bytes_per_rank: list  # bytes of keys and values each rank held
    bytes_sent_per_step: list  # [rank][step], P - 1 steps
    compute_seconds: list  # [rank][step], P steps
    wait_seconds: list  # [rank][step]: waiting for a transfer after compute

    @property
    def total_cache_bytes(self) -> int:
        """Return the bytes of keys and values summed over all ranks."""
        return sum(self.cache_bytes_per_rank)

    @property
    def bytes_sent_per_rank(self) -> list:
        """Return each rank's bytes sent over the whole run."""
        return [sum(row) for row in self.bytes_sent_per_step]


def start_ranks(worker: str, parts: int, args: tuple,
                timeout_s: float) -> None:
    """Run longctx.ch05's ``worker`` on P fresh processes and wait for them.

    Raises:
        TimeoutError: if the processes do not finish within timeout_s.
    """
    # fresh processes import the worker by name: use the package's copy
    function = getattr(importlib.import_module("longctx.ch05"), worker)
    methods = torch_multiprocessing.get_all_start_methods()
    method = "forkserver" if "forkserver" in methods else "spawn"
    if method == "forkserver":  # a clean server imports torch once
        torch_multiprocessing.get_context(method).set_forkserver_preload(
            ["torch", "longctx.ch05"])
    context = torch_multiprocessing.start_processes(
        function, args=(parts, free_local_port(), *args), nprocs=parts,
        join=False, start_method=method)
    started = time.monotonic()
    while not context.join(timeout=0.5):
        if time.monotonic() - started > timeout_s:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{worker} with P={parts} did not finish "
                               f"within {timeout_s} s")


def ring_attention(query: Tensor, key: Tensor, value: Tensor, parts: int, *,
                   timeout_s: float = 120.0) -> RingResult:
    """Return causal attention from P gloo processes passing blocks on.

    Args:
        query, key: (..., T, d) CPU tensors; value (..., T, d_v); T >= P.
        parts: number of processes P (>= 1); each holds a contiguous 1/P
            of the keys and values.
        timeout_s: seconds to wait for the processes before stopping them.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if P < 1, T < 1, T < P, or the shapes disagree.
        TimeoutError: if the processes do not finish within timeout_s.
    """
    parts = check_int("parts", parts, minimum=1)
    timeout_s = check_number("timeout_s", timeout_s, above=0)
    check_attention_inputs(query, key, value, same_tokens=True)
    bounds = partition_bounds(query.shape[-2], parts)
    shared = [t.detach().to("cpu").contiguous().share_memory_()
              for t in (query, key, value)]
    output = torch.zeros(value.shape, dtype=value.dtype).share_memory_()
    bytes_sent = torch.zeros(parts, parts, dtype=torch.int64).share_memory_()
    cache_bytes = torch.zeros(parts, dtype=torch.int64).share_memory_()
    seconds = torch.zeros(parts, parts, 2, dtype=torch.float64).share_memory_()
    start_ranks("ring_attention_rank", parts, (*shared, output, bytes_sent,
                                               cache_bytes, seconds),
                timeout_s)
    return RingResult(output=output.clone(), parts=parts, bounds=bounds,
                      cache_bytes_per_rank=cache_bytes.tolist(),
                      bytes_sent_per_step=bytes_sent[:, : parts - 1].tolist(),
                      compute_seconds=seconds[..., 0].tolist(),
                      wait_seconds=seconds[..., 1].tolist())


# chapters/ch05-measured.qmd:1680
def link_rank(rank: int, parts: int, port: int, block: Tensor,
              repeats: int, seconds: Tensor) -> None:
    """Time ``block`` sent from rank 0 to rank 1 and back, ``repeats`` times.

    Rank 0 writes the median one-way seconds into ``seconds`` (1,).
    """
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=parts)
    try:
        buffer, times = block.clone(), []
        for _ in range(repeats):
            began = time.perf_counter()
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            elif rank == 1:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
            times.append((time.perf_counter() - began) / 2)
        seconds[0] = sorted(times)[len(times) // 2]
    finally:
        dist.destroy_process_group()


def link_seconds(nbytes: int, *, repeats: int = 5,
                 timeout_s: float = 60.0) -> float:
    """Return the median seconds of a message from one gloo rank to another.

    The message holds ``nbytes`` bytes, a multiple of 4.

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if nbytes is not a positive multiple of 4 or repeats < 1.
    """
    nbytes = check_int("nbytes", nbytes, minimum=4)
    if nbytes % 4:
        raise ValueError(f"nbytes must be a multiple of 4 (got {nbytes})")
    repeats = check_int("repeats", repeats, minimum=1)
    block = torch.zeros(nbytes // 4).share_memory_()
    seconds = torch.zeros(1, dtype=torch.float64).share_memory_()
    start_ranks("link_rank", 2, (block, repeats, seconds), timeout_s)
    return seconds.item()


def link_bandwidth(megabytes: float = 8.0, *, repeats: int = 5,
                   timeout_s: float = 60.0) -> float:
    """Return the bytes per second one gloo rank sends another, measured.

    The rate is that of one message of ``megabytes`` MiB, latency included.

    Raises:
        TypeError: if an argument is not a number.
        ValueError: if megabytes <= 0 or repeats < 1.
    """
    megabytes = check_number("megabytes", megabytes, above=0)
    nbytes = max(4, int(megabytes * 2**20) // 4 * 4)
    return nbytes / link_seconds(nbytes, repeats=repeats, timeout_s=timeout_s)


# chapters/ch05-measured.qmd:1828
class ShardedStep(NamedTuple):
    """A sharded decode step: its output, its traffic and its times.

    Attributes:
        output: The step's output (B, H_q, 1, d_v).
        bytes_sent: Per rank, [bytes of query sent, bytes of state sent].
        seconds: Per rank, [median step seconds, median compute seconds].
    """

    output: Tensor
    bytes_sent: list
    seconds: list


def sharded_decode_rank(rank: int, parts: int, port: int, query: Tensor,
                        key: Tensor, value: Tensor, output: Tensor,
                        bytes_sent: Tensor, seconds: Tensor,
                        repeats: int) -> None:
    """Run rank ``rank`` of a sharded decode step, writing into shared tensors.

    The rank holds positions partition_bounds(T, P)[rank] of key and value
    (B, H_kv, T, .); rank 0 broadcasts the query (B, H_q, 1, d), every rank
    sends its state back, and rank 0 writes the merged step into output.
    The step runs ``repeats`` times, each after a barrier. bytes_sent
    (P, 2): bytes of query and of state each rank sent; seconds (P, 2):
    the median time from the barrier to the rank's last act of the step
    (rank 0's: the merged output written), and the median time it spent
    computing its state.
    """
    bounds = partition_bounds(key.shape[2], parts)
    torch.set_num_threads(1)  # P processes share the cores
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=parts)
    try:
        start, stop = bounds[rank]
        keys = key[..., start:stop, :].clone()  # this rank's slice only
        values = value[..., start:stop, :].clone()
        steps, computes = [], []
        for _ in range(repeats):
            dist.barrier()  # every rank starts the step together
            began = time.perf_counter()
            row = query.clone() if rank == 0 else torch.empty_like(query)
            dist.broadcast(row, src=0)
            computed = time.perf_counter()
            rows = stacked_rows(row, keys.shape[1], None)  # (B, H_kv, G, d)
            state = chunk_states(rows, keys, values, stop - start)  # a chunk
            packed = torch.cat(state, dim=-1)  # (B, H_kv, 1, G, 2 + d_v)
            computes.append(time.perf_counter() - computed)
            gathered = ([torch.empty_like(packed) for _ in range(parts)]
                        if rank == 0 else None)
            dist.gather(packed, gathered, dst=0)
            if rank == 0:
                stacked = torch.cat(gathered, dim=2)  # (B, H_kv, P, G, .)
                merged = merge_states((stacked[..., :1], stacked[..., 1:2],
                                       stacked[..., 2:]), dim=2)
                output.copy_(finish_online_softmax(merged).reshape(
                    output.shape))
            steps.append(time.perf_counter() - began)
        bytes_sent[rank, 0] = row.nbytes * (parts - 1) if rank == 0 else 0
        bytes_sent[rank, 1] = packed.nbytes if rank else 0
        seconds[rank, 0] = statistics.median(steps)
        seconds[rank, 1] = statistics.median(computes)
    finally:
        dist.destroy_process_group()


def sharded_decode(query: Tensor, key: Tensor, value: Tensor, parts: int, *,
                   repeats: int = 1, timeout_s: float = 120.0) -> ShardedStep:
    """Return a decode step computed by P gloo ranks, each on 1/P of the cache.

    query (B, H_q, 1, d); key (B, H_kv, T, d) and value (B, H_kv, T, d_v)
    float CPU tensors, T >= P. The step runs ``repeats`` times; returns
    its (B, H_q, 1, d_v) output and, per rank, the bytes it sent and its
    median times (see sharded_decode_rank).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if P < 1, T < P, repeats < 1, or the shapes do not form
            a step.
        TimeoutError: if the processes do not finish within timeout_s.
    """
    parts = check_int("parts", parts, minimum=1)
    repeats = check_int("repeats", repeats, minimum=1)
    timeout_s = check_number("timeout_s", timeout_s, above=0)
    check_tensor("query", query, dims=4, floating=True, nonempty=True,
                 sizes={2: 1})
    check_tensor("key", key, dims=4, dtype=query.dtype, nonempty=True,
                 sizes={0: query.shape[0], 3: query.shape[-1]})
    check_tensor("value", value, dims=4, dtype=query.dtype, nonempty=True,
                 sizes={0: key.shape[0], 1: key.shape[1], 2: key.shape[2]})
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"H_kv must divide H_q (got {query.shape[1]} query "
                         f"heads and {key.shape[1]} KV heads)")
    partition_bounds(key.shape[2], parts)  # refuses T < P
    shared = [t.detach().contiguous().share_memory_()
              for t in (query, key, value)]
    output = torch.zeros(query.shape[:-1] + (value.shape[-1],),
                         dtype=query.dtype).share_memory_()
    bytes_sent = torch.zeros(parts, 2, dtype=torch.int64).share_memory_()
    seconds = torch.zeros(parts, 2, dtype=torch.float64).share_memory_()
    start_ranks("sharded_decode_rank", parts,
                (*shared, output, bytes_sent, seconds, repeats), timeout_s)
    return ShardedStep(output.clone(), bytes_sent.tolist(), seconds.tolist())
