"""Benchmark-only fast kernels, each tested equal to the chapters' teaching versions (tests/test_benchmarks.py).

The teaching versions in Chapters 1-4 favour clarity; a benchmark needs the step without
Python loops or needless copies, so that the time reflects the bytes the design must read.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def grouped_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Return attention of query (B, Hq, Tq, d) over key/value (B, Hkv, Tk, d) without repeating keys.

    The Hq/Hkv query heads that share a key head are stacked as extra query rows, so each
    key/value head is read once by one fused attention call. No mask: every query sees every
    cached key, which is what a decode step needs (Tq = 1).
    """
    batch, query_heads, query_len, width = query.shape
    kv_heads = key.shape[1]
    if query_heads % kv_heads:
        raise ValueError(f"kv heads must divide query heads (got {query_heads} and {kv_heads})")
    groups = query_heads // kv_heads
    stacked = query.reshape(batch, kv_heads, groups * query_len, width)  # (B, Hkv, G*Tq, d)
    out = F.scaled_dot_product_attention(stacked, key, value)  # (B, Hkv, G*Tq, dv), no mask
    return out.reshape(batch, query_heads, query_len, value.shape[-1])


def latent_decode_expanded(query, latent, key_up_weight, value_up_weight):
    """Return one decode step of latent attention that first rebuilds every cached key and value.

    query (B, H, 1, d_h); latent (B, T, r); key_up_weight and value_up_weight (H*d_h, r) as in
    nn.Linear(r, H*d_h). Keys K = latent W_k^T and values V = latent W_v^T are materialised.
    """
    batch, heads, _, width = query.shape
    tokens = latent.shape[1]
    keys = (latent @ key_up_weight.T).view(batch, tokens, heads, width).transpose(1, 2)  # (B, H, T, d_h)
    values = (latent @ value_up_weight.T).view(batch, tokens, heads, width).transpose(1, 2)
    return F.scaled_dot_product_attention(query, keys, values)


def latent_decode_absorbed(query, latent, key_up_weight, value_up_weight):
    """Return the same step as latent_decode_expanded with the up-projections folded into query and output.

    Scores q_h . (W_k,h c_t) equal (W_k,h^T q_h) . c_t, so the query moves into latent space once and
    the cache is read as it is stored; values are combined in latent space and lifted by W_v,h at the end.
    """
    batch, heads, _, width = query.shape
    rank = latent.shape[-1]
    key_up = key_up_weight.view(heads, width, rank)  # (H, d_h, r)
    value_up = value_up_weight.view(heads, width, rank)
    latent_query = torch.einsum("bhqd,hdr->bhqr", query, key_up)  # (B, H, 1, r)
    scores = (latent_query.squeeze(2) @ latent.transpose(1, 2)) * (1.0 / math.sqrt(width))  # (B, H, T)
    weights = torch.softmax(scores, dim=-1)
    latent_out = weights @ latent  # (B, H, r)
    return torch.einsum("bhr,hdr->bhd", latent_out, value_up).unsqueeze(2)  # (B, H, 1, d_h)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Return int4 codes in [-8, 7] (an int8 tensor, last dim even) packed two per byte as uint8.

    The first half of the last dimension goes into the low nibbles and the second half into the
    high nibbles, so unpacking writes two contiguous halves instead of interleaving.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack two codes per byte (got {codes.shape[-1]})")
    half = codes.shape[-1] // 2
    low = codes[..., :half].to(torch.uint8) & 0xF  # two's-complement low nibble
    high = codes[..., half:].to(torch.uint8) & 0xF
    return low | (high << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Return the int8 codes packed by pack_int4 (last dim doubled)."""
    signed = packed.view(torch.int8)
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(signed, 4), 4)  # arithmetic shift keeps the sign
    high = torch.bitwise_right_shift(signed, 4)
    return torch.cat((low, high), dim=-1)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Return float32 values codes * scale from a packed int4 tensor and its per-row scales."""
    half = packed.shape[-1]
    out = torch.empty(*packed.shape[:-1], 2 * half, dtype=torch.float32, device=packed.device)
    signed = packed.view(torch.int8)
    torch.mul(torch.bitwise_right_shift(torch.bitwise_left_shift(signed, 4), 4), scale, out=out[..., :half])
    torch.mul(torch.bitwise_right_shift(signed, 4), scale, out=out[..., half:])
    return out


def banded_causal_attention(query, key, value, window: int, block_size: int) -> torch.Tensor:
    """Return causal sliding-window attention computed one query block at a time over only its key band.

    Query i sees key j when i - window < j <= i. Each block of `block_size` queries attends to the
    keys from (block start - window + 1) to its end, so work grows as n * (window + block_size).
    """
    if window < 1 or block_size < 1:
        raise ValueError(f"window and block_size must be >= 1 (got {window} and {block_size})")
    seq_len = query.shape[-2]
    outputs = []
    for start in range(0, seq_len, block_size):
        stop = min(start + block_size, seq_len)
        first = max(0, start - window + 1)
        query_pos = torch.arange(start, stop, device=query.device)[:, None]
        key_pos = torch.arange(first, stop, device=query.device)[None, :]
        visible = (key_pos <= query_pos) & (key_pos > query_pos - window)
        outputs.append(F.scaled_dot_product_attention(query[..., start:stop, :], key[..., first:stop, :],
                                                      value[..., first:stop, :], attn_mask=visible))
    return torch.cat(outputs, dim=-2)


def ssm_decode_step(state, x, decay, input_weight, output_weight):
    """Return (y, new_state) for one step of a diagonal state-space layer h' = a * h + B x, y = C . h.

    state (B, D, N); x (B, D); decay, input_weight, output_weight (B, D, N) (input-dependent in a
    selective SSM, so passed per step). The state never grows: its bytes do not depend on T.
    """
    new_state = decay * state + input_weight * x[..., None]
    return (new_state * output_weight).sum(-1), new_state
