"""Benchmark-only kernels, each tested equal to the chapters' teaching versions (tests/test_benchmarks.py).

The decode designs time Chapter 10's own flash-decoding; the kernels here are the baselines it is
compared with (torch's fused SDPA for a grouped cache, a latent cache rebuilt every step) and the
prefill and state-space steps of the other benchmarks, written without Python loops or needless
copies so that their times reflect the work the design must do.
"""

from __future__ import annotations

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
