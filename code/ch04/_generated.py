# Generated from chapters/ch04-efficient-architectures.qmd and chapters/ch04-states.qmd and chapters/ch04-hybrids.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch04-efficient-architectures.qmd ("Efficient architectures: compressed caches, windows and sparse tiles") and chapters/ch04-states.qmd ("States Instead of Caches: Linear Attention and State Spaces") and chapters/ch04-hybrids.qmd ("Trained, Mixed and Compared: Copying, Hybrids, Every Design")."""

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longctx import ch01, ch02, ch03
from longctx.support import (
    check_bits,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_tensor,
    check_type,
)

# chapters/ch04-efficient-architectures.qmd:93
#: Gemma 3 1B's attention with all 26 layers global (the shipped model
#: windows 22 of them): 4 query heads, 1 KV head of 256, bf16.
RUNNING_EXAMPLE = ch03.KVConfig(
    name="Gemma 3 1B, every layer global", layers=26, query_heads=4,
    kv_heads=1, head_dim=256, bytes_per_scalar=2,
)


# chapters/ch04-efficient-architectures.qmd:129
def context_cost(tokens: int, config: ch03.KVConfig | None = None) -> dict:
    """Return what the token at position T costs attention (Equation 6.1).

    A dict with ``tokens``; ``keys_read``, the sum over layers of
    n(T) = T, or min(T, W) in a windowed layer; ``attention_flops`` for
    generating that token (absorbed reads for a latent cache);
    ``pairs_per_head_per_layer``, T^2, and
    ``causal_pairs_per_head_per_layer``, T(T+1)/2, for a whole prompt;
    and ``kv_bytes``, ``ch03``'s ``kv_bytes`` of ``config`` (default
    RUNNING_EXAMPLE), which refuses a negative ``tokens``.
    """
    config = RUNNING_EXAMPLE if config is None else config
    cache = ch03.kv_bytes(config, tokens)  # checks config and tokens
    windowed = config.windowed_layers
    keys_read = ((config.layers - windowed) * tokens
                 + windowed * min(tokens, config.window or tokens))
    if config.latent_rank is None:  # score d_h numbers, mix d_h numbers
        per_key = 4 * config.query_heads * config.head_dim
    else:  # score r + d_R latent numbers, mix r
        width = 2 * config.latent_rank + config.rope_key_dim
        per_key = 2 * config.query_heads * width
    return {
        "tokens": tokens,
        "keys_read": keys_read,
        "attention_flops": per_key * keys_read,
        "pairs_per_head_per_layer": tokens * tokens,
        "causal_pairs_per_head_per_layer": tokens * (tokens + 1) // 2,
        "kv_bytes": cache,
    }


# chapters/ch04-efficient-architectures.qmd:383
def quantized_kv_bytes_per_token(config: ch03.KVConfig, bits: int, *,
                                 scale_bytes: int = 2) -> int:
    """Return the cache bytes per token at ``bits`` per number (Equation 6.3).

    Every stored vector costs its packed codes, rounded up to whole bytes,
    plus one scale: a standard cache stores 2 L H_kv vectors of d_h numbers
    per token, a latent cache L vectors of r + d_R numbers. ``bits``
    outside 1..16 and a negative ``scale_bytes`` are refused.
    """
    bits = check_bits("bits", bits, range(1, 17))
    scale_bytes = check_int("scale_bytes", scale_bytes, minimum=0)
    if config.latent_rank is None:  # a key and a value per KV head and layer
        vectors, width = 2 * config.layers * config.kv_heads, config.head_dim
    else:  # one latent, with its rotary key, per layer
        vectors = config.layers
        width = config.latent_rank + config.rope_key_dim
    return vectors * (-(-width * bits // 8) + scale_bytes)


# chapters/ch04-efficient-architectures.qmd:463
def quantize_kv(x: Tensor, bits: int, *,
                per: str = "token") -> tuple[Tensor, Tensor]:
    """Return (codes, scale) for cached keys or values (..., T, d).

    Absmax codes, scale = max|x| / (2^(bits-1) - 1), through Chapter 2's
    ``quantize``, which refuses bits outside 2..16. ``per="token"``: one
    scale per cached vector;
    ``per="channel"``: one scale per channel across the T tokens, KIVI's
    choice for keys. Another ``per`` is refused.
    """
    per = check_choice("per", per, ("token", "channel"))
    return ch02.quantize(x, bits, dim=-1 if per == "token" else -2)


# chapters/ch04-efficient-architectures.qmd:485
def quantized_cache_error(bits: int, *, keys_per: str = "token",
                          tokens: int = 512, dim: int = 256,
                          outlier_channels: int = 0,
                          outlier_scale: float = 8.0,
                          seed: int = 1813) -> float:
    """Return the relative error of causal attention from a quantized cache.

    The error is ||approx - exact|| / ||exact|| of the outputs when keys
    (scaled ``keys_per``) and values (per token) are stored at ``bits``.

    ``outlier_channels`` key channels are multiplied by ``outlier_scale``,
    as trained keys often have a few large channels. Random data, not a
    trained model.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range.
    """
    bits = check_bits("bits", bits, ch02.QUANTIZE_BITS)
    keys_per = check_choice("keys_per", keys_per, ("token", "channel"))
    tokens = check_int("tokens", tokens, minimum=1)
    dim = check_int("dim", dim, minimum=1)
    outlier_channels = check_int("outlier_channels", outlier_channels,
                                 minimum=0)
    if outlier_channels > dim:
        raise ValueError("outlier_channels must be at most dim (got "
                         f"outlier_channels={outlier_channels} and dim={dim})")
    outlier_scale = check_number("outlier_scale", outlier_scale, above=0)
    seed = check_int("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(tokens, dim, generator=generator)
                         for _ in range(3))
    loud = torch.randperm(dim, generator=generator)[:outlier_channels]
    key[:, loud] *= outlier_scale
    mask = ch01.causal_mask(tokens)
    exact, _ = ch01.scaled_dot_product_attention(query, key, value, mask)
    key_hat = ch02.dequantize(*quantize_kv(key, bits, per=keys_per))
    value_hat = ch02.dequantize(*quantize_kv(value, bits, per="token"))
    approx, _ = ch01.scaled_dot_product_attention(query, key_hat, value_hat,
                                                  mask)
    return (torch.linalg.norm(approx - exact)
            / torch.linalg.norm(exact)).item()


# chapters/ch04-efficient-architectures.qmd:680
def pairs_computed(mask: Tensor) -> int:
    """Return how many query-key scores a bool mask asks for: its True cells."""
    return int(mask.sum())


def receptive_field(mask: Tensor, layers: int) -> Tensor:
    """Return a bool (T, T) grid: True where input j reaches output i.

    ``mask`` is one layer's bool (T, T) visibility; ``layers`` layers
    compose it with itself, a Boolean matrix power (Equation 6.4; 0
    layers: the identity).
    """
    step = mask.to(torch.float64)
    heard = torch.eye(mask.shape[0], dtype=torch.float64, device=mask.device)
    for _ in range(layers):
        heard = ((step @ heard) > 0).to(torch.float64)  # one more read
    return heard.bool()


# chapters/ch04-efficient-architectures.qmd:790
def global_local_mask(seq_len: int, window: int,
                      global_tokens: tuple[int, ...] = (0,), *,
                      causal: bool = True) -> Tensor:
    """Return a bool (T, T) mask: a window plus tokens that read and are read.

    Every token reads the global tokens and they read every token; with
    ``causal=True`` nothing reads the future, so a global token at g reads
    0..g and is read by g..T-1. ``causal=False`` is the encoder form of
    Longformer and BigBird: the band |i - j| < W, global rows and columns.
    """
    window = check_int("window", window, minimum=1)
    chosen = list(global_tokens)
    distance = torch.arange(seq_len)[:, None] - torch.arange(seq_len)  # i - j
    mask = distance.abs() < window
    mask[:, chosen] = True  # everyone reads the global tokens
    mask[chosen, :] = True  # and they read everyone
    if causal:
        mask &= distance >= 0
    return mask


def strided_mask(seq_len: int, stride: int) -> Tensor:
    """Return the causal strided mask of Equation 6.5, period p = stride.

    Query i reads the last ``stride`` keys and every stride-th key before.
    """
    stride = check_int("stride", stride, minimum=1)
    distance = torch.arange(seq_len)[:, None] - torch.arange(seq_len)  # i - j
    return (distance >= 0) & ((distance < stride) | (distance % stride == 0))


# chapters/ch04-efficient-architectures.qmd:1040
def tiles_touched(token_mask: Tensor, block_size: int) -> Tensor:
    """Return the bool (n, n) tiles of a (T, T) mask, n = ceil(T / block_size).

    Tile (q, k) is True when query block q and key block k share at least
    one allowed pair: the tiles a tile-by-tile kernel must compute.
    """
    block_size = check_int("block_size", block_size, minimum=1)
    tokens = token_mask.shape[-1]
    n_blocks = -(-tokens // block_size)
    padding = n_blocks * block_size - tokens  # the last block may be short
    grid = F.pad(token_mask, (0, padding, 0, padding))
    grid = grid.view(n_blocks, block_size, n_blocks, block_size)  # (q,i,k,j)
    return grid.permute(0, 2, 1, 3).flatten(2).any(dim=-1)  # (q, k)


def sliding_window_block_mask(seq_len: int, window: int,
                              block_size: int) -> Tensor:
    """Return the bool (n, n) tile mask of a causal window, n = ceil(T / b).

    Tile (q, k) is True when query block q and key block k share a pair
    with 0 <= i - j < window. No T x T mask is built; the last block may be
    shorter.
    """
    window = check_int("window", window, minimum=1)
    block_size = check_int("block_size", block_size, minimum=1)
    n_blocks = -(-seq_len // block_size)
    first = torch.arange(n_blocks) * block_size  # first token of each block
    last = torch.clamp(first + block_size, max=seq_len) - 1  # and its last
    # some i in the query block and j in the key block with 0 <= i - j < W:
    not_all_future = last[:, None] >= first[None, :]
    not_all_too_old = first[:, None] - last[None, :] < window
    return not_all_future & not_all_too_old


def expand_block_mask(block_mask: Tensor, block_size: int,
                      seq_len: int) -> Tensor:
    """Return the bool (T, T) token mask: every pair of a marked tile."""
    block_size = check_int("block_size", block_size, minimum=1)  # 0: empty
    tiles = block_mask.repeat_interleave(block_size, dim=0)
    tiles = tiles.repeat_interleave(block_size, dim=1)
    return tiles[:seq_len, :seq_len]


def block_sparse_attention(query: Tensor, key: Tensor, value: Tensor,
                           block_mask: Tensor, block_size: int, *,
                           token_mask: Tensor | None = None) -> Tensor:
    """Return attention outputs computed on the tiles ``block_mask`` marks.

    query, key: (..., T, d); value: (..., T, d_v); block_mask: bool (n, n),
    n = ceil(T / block_size). Without ``token_mask`` the result is dense
    attention with ``expand_block_mask(block_mask, block_size, T)``; with a
    bool (T, T) ``token_mask`` inside the marked tiles, dense attention with
    ``token_mask``. A query that sees no key gets a zero output.
    """
    tokens = query.shape[-2]
    assert block_mask.shape == (-(-tokens // block_size),) * 2, "tile grid"
    if token_mask is not None:  # pairs outside the tiles would be dropped
        allowed = expand_block_mask(block_mask.cpu(), block_size, tokens)
        if (token_mask.cpu() & ~allowed).any():
            raise ValueError("token_mask allows pairs outside the marked tiles")
        token_mask = token_mask.to(query.device)
    output = query.new_zeros(*query.shape[:-1], value.shape[-1])
    for row_block, marked in enumerate(block_mask.tolist()):
        rows = slice(row_block * block_size, (row_block + 1) * block_size)
        columns = [torch.arange(k * block_size,
                                min(tokens, (k + 1) * block_size))
                   for k, is_marked in enumerate(marked) if is_marked]
        if not columns:
            continue
        columns = torch.cat(columns).to(query.device)  # the marked tiles' keys
        mask = None if token_mask is None else token_mask[rows][:, columns]
        out, _ = ch01.scaled_dot_product_attention(
            query[..., rows, :], key[..., columns, :], value[..., columns, :],
            mask)
        output[..., rows, :] = out
    return output


# chapters/ch04-efficient-architectures.qmd:1258
def chosen_blocks_mask(query: Tensor, key: Tensor, block_size: int,
                       top: int) -> Tensor:
    """Return MoBA's choice as a bool token mask (..., T, T).

    Query i reads its own block up to itself and the ``top`` complete
    earlier blocks whose mean key it scores highest (every earlier block
    when fewer exist). query, key: (..., T, d).
    """
    block_size = check_int("block_size", block_size, minimum=1)
    top = check_int("top", top, minimum=0)
    tokens = key.shape[-2]
    blocks = -(-tokens // block_size)
    padded = F.pad(key, (0, 0, 0, blocks * block_size - tokens))
    counts = torch.full((blocks,), block_size).to(key.dtype)
    counts[-1] = tokens - (blocks - 1) * block_size  # a short last block
    means = padded.unflatten(-2, (blocks, block_size)).sum(-2) / counts[:, None]
    own = torch.arange(tokens) // block_size  # (T,): each query's block
    earlier = torch.arange(blocks) < own[:, None]  # (T, n)
    gate = (query @ means.transpose(-1, -2)).masked_fill(~earlier, -math.inf)
    best = gate.topk(min(top, blocks), dim=-1).indices  # (..., T, top)
    picked = torch.zeros_like(gate, dtype=torch.bool).scatter(-1, best, True)
    read = (picked & earlier) | (torch.arange(blocks) == own[:, None])
    mask = read.repeat_interleave(block_size, dim=-1)[..., :tokens]
    return mask & ch01.causal_mask(tokens)


def page_bounds(keys: Tensor, page: int) -> tuple[Tensor, Tensor]:
    """Return Quest's (lower, upper) key bounds (..., P, d) per page.

    Each is the smallest and the largest value of every coordinate over
    the ``page`` tokens of a page (the last page may be short); keys:
    (..., T, d), P = ceil(T / page).
    """
    page = check_int("page", page, minimum=1)
    pages = -(-keys.shape[-2] // page)
    short = pages * page - keys.shape[-2]
    lower = F.pad(keys, (0, 0, 0, short), value=math.inf)
    upper = F.pad(keys, (0, 0, 0, short), value=-math.inf)
    return (lower.unflatten(-2, (pages, page)).amin(-2),
            upper.unflatten(-2, (pages, page)).amax(-2))


def page_upper_bounds(query: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """Return each page's bound (..., P) on the query's scores in it.

    sum_i max(q_i l_i, q_i u_i) >= q . k for every key k of the page;
    query: (..., d); lower, upper: (..., P, d).
    """
    low, high = query[..., None, :] * lower, query[..., None, :] * upper
    return torch.maximum(low, high).sum(-1)


def quest_decode(query: Tensor, keys: Tensor, values: Tensor, page: int,
                 top: int) -> tuple[Tensor, Tensor]:
    """Return (output (..., d_v), pages read (..., top)) for one query.

    The query reads the ``top`` pages with the largest upper bounds and
    attends over their tokens only. query: (..., d); keys: (..., T, d);
    values: (..., T, d_v).
    """
    lower, upper = page_bounds(keys, page)
    bounds = page_upper_bounds(query, lower, upper)  # (..., P)
    top = check_int("top", top, minimum=1, maximum=bounds.shape[-1])
    chosen = bounds.topk(top, dim=-1).indices  # (..., top)
    pages = torch.zeros_like(bounds, dtype=torch.bool).scatter(-1, chosen,
                                                               True)
    mask = pages.repeat_interleave(page, dim=-1)[..., :keys.shape[-2]]
    output, _ = ch01.scaled_dot_product_attention(
        query[..., None, :], keys, values, mask[..., None, :])
    return output[..., 0, :], chosen.sort(dim=-1).values


# chapters/ch04-states.qmd:155
def feature_map(x: Tensor) -> Tensor:
    """Return phi(x) = elu(x) + 1 per entry: x + 1 above 0, e^x at or below."""
    return F.elu(x) + 1.0


def linear_attention_weights(query: Tensor, key: Tensor) -> Tensor:
    """Return the causal (..., T, T) weights linear attention implies.

    Entry (i, j) is phi(q_i) . phi(k_j) for j <= i, each row scaled to sum
    to 1 (the left side of Equation 7.1); query and key are (..., T, d).
    """
    scores = feature_map(query) @ feature_map(key).transpose(-2, -1)  # (T, T)
    causal = ch01.causal_mask(query.shape[-2], device=query.device)
    scores = scores * causal  # the future contributes nothing
    return scores / scores.sum(dim=-1, keepdim=True)


def linear_attention_quadratic(query: Tensor, key: Tensor,
                               value: Tensor) -> Tensor:
    """Return linear attention the quadratic way: T x T weights, then values."""
    return linear_attention_weights(query, key) @ value


LinearAttentionState = tuple[Tensor, Tensor]
"""Linear attention's state: S (..., d_k, d_v) and z (..., d_k)."""


def linear_attention_recurrent(
    query: Tensor, key: Tensor, value: Tensor,
    state: LinearAttentionState | None = None,
) -> tuple[Tensor, LinearAttentionState]:
    """Return (outputs, (S, z)): linear attention one token at a time.

    query, key: (..., T, d_k); value: (..., T, d_v). S sums phi(k_j) v_j^T
    and z sums phi(k_j) (Equation 7.1); passing the returned state back in
    continues the sequence, as generation does.
    """
    *lead, tokens, d_k = key.shape
    if state is None:
        summed = key.new_zeros(*lead, d_k, value.shape[-1])  # S
        total = key.new_zeros(*lead, d_k)  # z
    else:
        summed, total = state
    outputs = []
    for t in range(tokens):
        phi_k = feature_map(key[..., t, :])  # (..., d_k)
        summed = summed + phi_k[..., :, None] * value[..., t, None, :]  # S
        total = total + phi_k  # z
        phi_q = feature_map(query[..., t, :])
        numerator = (phi_q[..., :, None] * summed).sum(dim=-2)  # (..., d_v)
        denominator = (phi_q * total).sum(dim=-1, keepdim=True)  # (..., 1)
        outputs.append(numerator / denominator)
    return torch.stack(outputs, dim=-2), (summed, total)


def linear_attention_chunked(query: Tensor, key: Tensor, value: Tensor,
                             chunk_size: int = 64) -> Tensor:
    """Return linear attention in chunks, never building a T x T matrix.

    Inside a chunk the weights are a (c, c) causal block; earlier chunks
    arrive through the running state (S, z) of Equation 7.1.
    """
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    *lead, tokens, d_k = key.shape
    summed = key.new_zeros(*lead, d_k, value.shape[-1])  # S
    total = key.new_zeros(*lead, d_k)  # z
    outputs = []
    for start in range(0, tokens, chunk_size):
        chunk = slice(start, start + chunk_size)
        phi_q = feature_map(query[..., chunk, :])  # (..., c, d_k)
        phi_k = feature_map(key[..., chunk, :])
        v = value[..., chunk, :]
        causal = ch01.causal_mask(phi_q.shape[-2], device=query.device)
        inside = (phi_q @ phi_k.transpose(-2, -1)) * causal  # (..., c, c)
        numerator = phi_q @ summed + inside @ v  # earlier chunks, then this
        denominator = phi_q @ total[..., None] + inside.sum(-1, keepdim=True)
        outputs.append(numerator / denominator)
        summed = summed + phi_k.transpose(-2, -1) @ v
        total = total + phi_k.sum(dim=-2)
    return torch.cat(outputs, dim=-2)


# chapters/ch04-states.qmd:399
def weight_sharpness(weights: Tensor, last_rows: int = 5) -> dict[str, float]:
    """Return how peaked the last rows of a (T, T) weight matrix are.

    ``mean_of_row_max`` averages each row's largest weight over the last
    ``last_rows`` rows; ``max`` is the largest weight in those rows.
    """
    tail = weights[-last_rows:]
    return {"mean_of_row_max": tail.amax(dim=-1).mean().item(),
            "max": tail.max().item()}


def sharpness_comparison(query_scale: float, seed: int = 1813,
                         tokens: int = 24, width: int = 16) -> dict:
    """Return softmax and linear weights on one random draw, and how sharp.

    Keys and base queries are standard normal; queries are then multiplied
    by ``query_scale``. Returns ``softmax`` and ``linear`` (each a
    ``weight_sharpness`` dict) and ``weights``, the two (T, T) matrices.
    """
    query_scale = check_number("query_scale", query_scale, above=0)
    seed = check_int("seed", seed, minimum=0)
    tokens = check_int("tokens", tokens, minimum=5)
    width = check_int("width", width, minimum=1)
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(tokens, width, generator=generator)
    queries = query_scale * torch.randn(tokens, width, generator=generator)
    _, softmax_weights = ch01.scaled_dot_product_attention(
        queries, keys, keys, ch01.causal_mask(tokens))
    linear_weights = linear_attention_weights(queries, keys)
    return {"softmax": weight_sharpness(softmax_weights),
            "linear": weight_sharpness(linear_weights),
            "weights": (softmax_weights, linear_weights)}


# chapters/ch04-states.qmd:489
def ssm_recurrent(x: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """Return y_t = C h_t with h_t = A h_{t-1} + B x_t (Equation 7.2).

    x: one channel of inputs (T,); A: (N, N); B, C: (N,), B being the
    equation's input map E. The recurrence runs step by step, one token at
    a time, from h = 0.
    """
    state = torch.zeros_like(B)  # h before the start: N numbers, at any T
    outputs = []
    for x_t in x:
        state = A @ state + B * x_t
        outputs.append(C @ state)
    return torch.stack(outputs)


def ssm_kernel(A: Tensor, B: Tensor, C: Tensor, length: int) -> Tensor:
    """Return the kernel C A^k B for k = 0 .. length-1 (Equation 7.2).

    B is the equation's input map E.
    """
    kernel, power_times_B = [], B
    for _ in range(length):
        kernel.append(C @ power_times_B)
        power_times_B = A @ power_times_B  # A^(k+1) B
    return torch.stack(kernel)


def ssm_convolution(x: Tensor, A: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """Return ``ssm_recurrent``'s outputs as one causal convolution.

    The convolution with the kernel runs through the FFT in O(T log T).
    """
    tokens = x.shape[0]
    kernel = ssm_kernel(A, B, C, tokens)
    size = 2 * tokens  # zero padding makes the FFT's circular product linear
    spectrum = torch.fft.rfft(x, n=size) * torch.fft.rfft(kernel, n=size)
    return torch.fft.irfft(spectrum, n=size)[:tokens]


# chapters/ch04-states.qmd:688
def sequential_scan(a: Tensor, b: Tensor) -> Tensor:
    """Return every h_t = alpha_t h_{t-1} + xi_t, with h = 0 before the start.

    a, b: (..., T), time last, the steps' alpha_t and xi_t (Equation 7.4).
    The loop runs over time and updates all leading dimensions (channels,
    batch) together at each step; it is made of differentiable tensor
    operations, so gradients flow through it.
    """
    state = torch.zeros_like(b[..., 0])  # h before the first step
    states = []
    for t in range(b.shape[-1]):
        state = a[..., t] * state + b[..., t]
        states.append(state)
    return torch.stack(states, dim=-1)


def step_sizes(markers: Tensor, sharpness: float = 12.0,
               bias: float = -7.0) -> Tensor:
    """Return delta_t = softplus(sharpness * marker_t + bias) (Equation 7.3)."""
    return F.softplus(sharpness * markers + bias)


def discretize(delta: Tensor, a: float = -1.0,
               b: float = 1.0) -> tuple[Tensor, Tensor]:
    """Return (A_bar, E_bar), the zero-order hold of Equation 7.3.

    A_bar = e^(delta A) and E_bar = (e^(delta A) - 1) / A * E, for A < 0,
    with the equation's A and E given as a and b.
    """
    a = check_number("a", a, below=0)  # a = 0 would divide by zero
    keep = torch.exp(delta * a)
    return keep, (keep - 1.0) / a * b


def selective_ssm(x: Tensor, delta: Tensor, a: float = -1.0, b: float = 1.0,
                  *, readout: float = 1.0) -> Tensor:
    """Return c h_t of a one-channel SSM with a delta_t per step (Equation 7.3).

    x, delta: (..., T), time last; the recurrence runs in ``sequential_scan``.
    """
    keep, write = discretize(delta, a, b)
    return readout * sequential_scan(keep, write * x)  # keep h + write x


# chapters/ch04-states.qmd:875
def scan_rounds(length: int) -> int:
    """Return ceil(log2 T), the rounds a Hillis-Steele scan of T steps needs.

    Exact integer arithmetic: T - 1 written in binary has that many digits.
    """
    return max(length - 1, 0).bit_length()


def parallel_scan(a: Tensor, b: Tensor) -> Tensor:
    """Return ``sequential_scan``'s states in ceil(log2 T) rounds.

    a, b: (..., T), time last, the steps' alpha_t and xi_t. In round j
    every position merges (Equation 7.4) with the one 2^j places earlier,
    all at once; a position with nothing that far back keeps its step, as
    if merged with the do-nothing step (1, 0). After round j, position t
    holds the merge of steps t - 2^(j+1) + 1 .. t.
    Nothing is divided, so a = 0 and long sequences are safe, and nothing
    is written in place, so gradients flow through it.
    """
    shift = 1
    while shift < a.shape[-1]:
        # (a_earlier, b_earlier) then (a, b) -> (a_earlier a, a b_earlier + b)
        later_a, later_b = a[..., shift:], b[..., shift:]
        merged_b = torch.addcmul(later_b, later_a, b[..., :-shift])
        merged_a = later_a * a[..., :-shift]
        # the first `shift` positions have nothing that far back: kept as is
        b = torch.cat([b[..., :shift], merged_b], dim=-1)
        a = torch.cat([a[..., :shift], merged_a], dim=-1)
        shift *= 2
    return b


# chapters/ch04-states.qmd:1139
def retention_decays(heads: int) -> Tensor:
    """Return RetNet's keep factor per head, gamma_h = 1 - 2^(-5-h).

    Head h forgets 2^-(5+h) of its state per token: each later head
    forgets half as fast as the one before (float64, shape (heads,)).
    """
    heads = check_int("heads", heads, minimum=1)
    return 1.0 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))


def gla_gates(logits: Tensor, temperature: float = 16.0) -> Tensor:
    """Return GLA's keep factors sigmoid(logits)^(1/temperature).

    logits: (..., T, d_k), one per token and key entry, computed from the
    token; a larger temperature holds the factors nearer 1.
    """
    temperature = check_number("temperature", temperature, above=0)
    return torch.sigmoid(logits) ** (1.0 / temperature)


def gated_linear_attention(query: Tensor, key: Tensor, value: Tensor,
                           gate: Tensor) -> tuple[Tensor, Tensor]:
    """Return (outputs, S) of Equation 7.5, one token at a time.

    S_t = G_t * S_{t-1} + k_t v_t^T and o_t = S_t^T q_t. query, key:
    (..., T, d_k); value: (..., T, d_v); gate: keep factors that
    broadcast to key's shape, one per row of S (RetNet: (H, 1, 1); GLA:
    (..., T, d_k); all ones: Equation 7.1's S). S: (..., d_k, d_v).
    """
    query, key, value = (check_tensor(name, tensor, floating=True,
                                      min_dims=2)
                         for name, tensor in (("query", query), ("key", key),
                                              ("value", value)))
    gate = torch.broadcast_to(check_tensor("gate", gate, floating=True),
                              key.shape)  # (..., T, d_k)
    state = key.new_zeros(*key.shape[:-2], key.shape[-1], value.shape[-1])
    outputs = []
    for t in range(key.shape[-2]):
        write = key[..., t, :, None] * value[..., t, None, :]  # k_t v_t^T
        state = gate[..., t, :, None] * state + write  # G_t row by row
        outputs.append((query[..., t, :, None] * state).sum(dim=-2))
    return torch.stack(outputs, dim=-2), state


def gated_linear_attention_scan(query: Tensor, key: Tensor, value: Tensor,
                                gate: Tensor) -> Tensor:
    """Return ``gated_linear_attention``'s outputs through ``parallel_scan``.

    Entry S[i, j] follows its own h_t = alpha_t h_{t-1} + xi_t
    (Equation 7.4) with alpha_t = G_t[i] and xi_t = k_t[i] v_t[j], so one
    scan over a (..., d_k, d_v, T) stack returns every S_t of Equation 7.5
    at once.
    """
    gate = torch.broadcast_to(gate, key.shape)
    keep = gate.transpose(-2, -1)[..., :, None, :]  # (..., d_k, 1, T)
    write = (key.transpose(-2, -1)[..., :, None, :]
             * value.transpose(-2, -1)[..., None, :, :])  # (..., d_k, d_v, T)
    states = parallel_scan(keep, write)  # S_t for every t
    read = query.transpose(-2, -1)[..., :, None, :] * states  # q_t[i] S_t
    return read.sum(dim=-3).transpose(-2, -1)  # (..., T, d_v)


# chapters/ch04-states.qmd:1273
def delta_rule(query: Tensor, key: Tensor, value: Tensor,
               strength: Tensor) -> tuple[Tensor, Tensor]:
    """Return (outputs, S) of the delta rule (Equation 7.6), o_t = S_t^T q_t.

    Each step reads S_{t-1}^T k_t, what S holds under the key, and moves
    it towards v_t by eta_t. query, key: (..., T, d_k); value:
    (..., T, d_v); strength: eta, (..., T). S: (..., d_k, d_v).
    """
    query, key, value = (check_tensor(name, tensor, floating=True,
                                      min_dims=2)
                         for name, tensor in (("query", query), ("key", key),
                                              ("value", value)))
    strength = check_tensor("strength", strength, floating=True,
                            sizes={-1: key.shape[-2]})
    state = key.new_zeros(*key.shape[:-2], key.shape[-1], value.shape[-1])
    outputs = []
    for t in range(key.shape[-2]):
        k = key[..., t, :]
        held = (k[..., :, None] * state).sum(dim=-2)  # S_{t-1}^T k_t
        change = strength[..., t, None] * (value[..., t, :] - held)
        state = state + k[..., :, None] * change[..., None, :]
        outputs.append((query[..., t, :, None] * state).sum(dim=-2))
    return torch.stack(outputs, dim=-2), state


# chapters/ch04-states.qmd:1492
def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor,
                   C: Tensor, D: Tensor | None = None) -> Tensor:
    """Return y (batch, channels, length) of a selective SSM (Equation 7.7).

    Shapes and discretization follow Mamba's reference ``selective_scan_ref``:
    h_t[i, n] = exp(delta_t[i] A[i, n]) h_{t-1}[i, n] + delta_t[i] B_t[n]
    u_t[i] and y_t[i] = sum_n C_t[n] h_t[i, n] + D[i] u_t[i], B being
    Equation 7.7's E. The input weight is delta B (the reference's
    choice), not Equation 7.3's zero-order hold. The recurrence runs
    through ``parallel_scan``.

    u, delta: (b, d, l); A: (d, n), negative for a decaying state; B, C:
    (b, n, l); D: optional (d,). Time is the last dimension.
    """
    decay = torch.exp(delta[:, :, None, :] * A[None, :, :, None])  # (b,d,n,l)
    write = (delta * u)[:, :, None, :] * B[:, None, :, :]  # (b, d, n, l)
    states = parallel_scan(decay, write)  # h_t for every t: (b, d, n, l)
    y = (states * C[:, None, :, :]).sum(dim=2)  # (b, d, l)
    return y if D is None else y + D[:, None] * u


# chapters/ch04-states.qmd:1632
class SelectiveSSMLayer(nn.Module):
    """A Mamba-style mixing layer, (B, T, d_model) -> (B, T, d_model).

    ``in_proj`` widens each token to d_inner = expand * d_model numbers plus
    a gate z of the same width, and u = silu(x W_in). Each token computes
    its own step sizes delta = softplus(dt_proj(u W_dt)), one per channel,
    input weights B = u W_B and readout C = u W_C, N numbers each;
    ``selective_scan`` (Equation 7.7) runs with a skip D; the result is
    gated by silu(z) and mapped back by ``out_proj``. A = -exp(A_log)
    starts at -(1, 2, ..., N) in every channel, Mamba's S4D-real start, and
    the step sizes start spread between 0.001 and 0.1.

    With ``selective=False`` delta, B and C are learned constants: the same
    layer, time-invariant, as in S4.

    Args:
        d_model: model width.
        state_size: N.
        expand: d_inner / d_model.
        selective: compute delta, B and C from each token.

    Raises:
        TypeError: a size is not an int, or selective is not a bool.
        ValueError: a size is below 1.
    """

    def __init__(self, d_model: int, state_size: int = 4, expand: int = 2, *,
                 selective: bool = True) -> None:
        """Build the projections and the state's start; Args: the class's."""
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        state_size = check_int("state_size", state_size, minimum=1)
        expand = check_int("expand", expand, minimum=1)
        selective = check_bool("selective", selective)
        self.state_size, self.selective = state_size, selective
        inner = d_model * expand
        self.dt_rank = -(-d_model // 16)  # Mamba's ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * inner, bias=False)
        self.out_proj = nn.Linear(inner, d_model, bias=False)
        steps = torch.logspace(-3, -1, inner)  # 0.001 .. 0.1
        unsoftplus = steps + torch.log(-torch.expm1(-steps))  # softplus^-1
        if selective:
            self.x_proj = nn.Linear(inner, self.dt_rank + 2 * state_size,
                                    bias=False)
            self.dt_proj = nn.Linear(self.dt_rank, inner)
            with torch.no_grad():
                self.dt_proj.bias.copy_(unsoftplus)
        else:
            self.dt_bias = nn.Parameter(unsoftplus)
            self.B = nn.Parameter(torch.randn(state_size) / state_size**0.5)
            self.C = nn.Parameter(torch.randn(state_size) / state_size**0.5)
        rates = torch.arange(1, state_size + 1, dtype=torch.float32)
        self.A_log = nn.Parameter(rates.log().repeat(inner, 1))  # (d_in, N)
        self.D = nn.Parameter(torch.ones(inner))

    def forward(self, x: Tensor) -> Tensor:
        """Return the mixed sequence, (B, T, d_model)."""
        batch, tokens, _ = x.shape
        u, gate = self.in_proj(x).chunk(2, dim=-1)  # (B, T, d_inner) each
        u = F.silu(u)
        if self.selective:  # every token sets its own delta, B and C
            dt, B, C = self.x_proj(u).split(
                [self.dt_rank, self.state_size, self.state_size], dim=-1)
            delta = F.softplus(self.dt_proj(dt))  # (B, T, d_inner)
        else:  # the same delta, B and C at every step
            delta = F.softplus(self.dt_bias).expand(batch, tokens, -1)
            B = self.B.expand(batch, tokens, -1)  # (B, T, N)
            C = self.C.expand(batch, tokens, -1)
        u_, delta_, B_, C_ = (t.transpose(1, 2).contiguous()  # (B, ., T):
                              for t in (u, delta, B, C))  # time last
        y = selective_scan(u_, delta_, -self.A_log.exp(), B_, C_, self.D)
        return self.out_proj(y.transpose(1, 2) * F.silu(gate))


# chapters/ch04-hybrids.qmd:56
def selective_copying_batch(
    batch_size: int, length: int, copies: int, symbols: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Return (inputs (B, length + copies), targets (B, copies)), int64.

    The Mamba paper's selective-copying task, small: ``copies`` symbols
    (token ids copies + 1 .. copies + symbols) sit in order at random places
    among ``length`` filler tokens (id 0); then come ``copies`` recall
    tokens (ids 1 .. copies), and at the k-th of them the model must name
    the k-th symbol. Targets are symbol indices, 0 .. symbols - 1.
    """
    targets = torch.randint(symbols, (batch_size, copies), generator=generator)
    order = torch.rand(batch_size, length, generator=generator).argsort(dim=1)
    places = order[:, :copies].sort(dim=1).values  # (B, copies), increasing
    inputs = torch.zeros(batch_size, length + copies, dtype=torch.long)
    inputs.scatter_(1, places, targets + copies + 1)  # symbols among filler
    inputs[:, length:] = torch.arange(1, copies + 1)  # the recall tokens
    return inputs, targets


class PositionalAttention(nn.Module):
    """Chapter 1's causal multi-head attention with a learned position table.

    Attention by itself cannot tell positions apart, so the layer adds a
    learned table of positions (as TinyGPT does in Chapter 2) first.

    Args:
        d_model: Model width; the layer maps (B, T, d_model) to the same.
        heads: Attention heads; must divide ``d_model``.
        max_len: Rows of the position table, the longest T it can read.
    """

    def __init__(self, d_model: int, heads: int, max_len: int) -> None:
        """Build the attention and the position table; Args: the class's."""
        super().__init__()
        self.attention = ch01.MultiHeadAttention(d_model, heads)
        max_len = check_int("max_len", max_len, minimum=1)
        self.positions = nn.Parameter(0.02 * torch.randn(max_len, d_model))

    def forward(self, x: Tensor) -> Tensor:
        """Return the attended tokens, (B, T, d_model)."""
        return self.attention(x + self.positions[: x.shape[1]])


class CopyingModel(nn.Module):
    """Embeddings, one residual mixing layer, and a head naming a symbol.

    logits = head(norm(x + mixer(norm(x)))), x the token embeddings; only
    ``mixer`` differs between the models the chapter compares.

    Args:
        vocab: Token ids the embedding reads (the task's alphabet).
        d_model: Width of each token vector.
        mixer: The layer under test, mapping (B, T, d_model) to the same.
        symbols: Symbols the head names: logits (B, T, symbols).
    """

    def __init__(self, vocab: int, d_model: int, mixer: nn.Module,
                 symbols: int) -> None:
        """Build the embedding, norms and head; the Args are the class's."""
        super().__init__()
        vocab = check_int("vocab", vocab, minimum=1)
        d_model = check_int("d_model", d_model, minimum=1)
        mixer = check_type("mixer", mixer, nn.Module)
        symbols = check_int("symbols", symbols, minimum=1)
        self.embed = nn.Embedding(vocab, d_model)
        self.norm_in = nn.LayerNorm(d_model)
        self.mixer = mixer
        self.norm_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, symbols)

    def forward(self, tokens: Tensor) -> Tensor:
        """Return logits over the symbols at every position, (B, T, symbols)."""
        x = self.embed(tokens)  # (B, T, d_model)
        x = x + self.mixer(self.norm_in(x))
        return self.head(self.norm_out(x))


def train_copying(model: CopyingModel, *, steps: int, length: int,
                  copies: int, symbols: int, batch_size: int = 16,
                  learning_rate: float = 0.01, seed: int = 0,
                  test_size: int = 1000) -> dict:
    """Train ``model`` on fresh selective-copying batches, then test it.

    Adam with a one-cycle learning rate; the loss is the cross-entropy at
    the recall tokens only. Returns ``accuracy``, the share of recall
    positions named right on ``test_size`` sequences drawn from a separate
    generator, and ``losses``, one per step.
    """
    check_type("model", model, nn.Module)
    steps = check_int("steps", steps, minimum=1)
    length = check_int("length", length, minimum=1)
    copies = check_int("copies", copies, minimum=1)
    if copies > length:
        raise ValueError(f"copies must be at most length (got copies={copies}"
                         f" and length={length})")
    symbols = check_int("symbols", symbols, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    learning_rate = check_number("learning_rate", learning_rate, above=0)
    seed = check_int("seed", seed, minimum=0)
    test_size = check_int("test_size", test_size, minimum=1)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=learning_rate, total_steps=steps, pct_start=0.1)
    losses = []
    model.train()
    for _ in range(steps):
        inputs, targets = selective_copying_batch(
            batch_size, length, copies, symbols, generator)
        logits = model(inputs)[:, -copies:]  # (B, copies, symbols)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        losses.append(ch02.training_step(model, optimizer, loss,
                                         schedule=schedule, clip_norm=None))
    model.eval()
    test_generator = torch.Generator().manual_seed(seed + 1)
    inputs, targets = selective_copying_batch(
        test_size, length, copies, symbols, test_generator)
    with torch.no_grad():
        named = model(inputs)[:, -copies:].argmax(dim=-1)
    return {"accuracy": (named == targets).float().mean().item(),
            "losses": losses}


#: The chapter's selective-copying task: 24 places, 4 symbols of 8 to copy.
COPYING_TASK = {"length": 24, "copies": 4, "symbols": 8}
#: The mixing layers the chapter trains on ``COPYING_TASK``.
COPYING_MIXERS = ("selective SSM", "time-invariant SSM", "attention")


def copying_trial(mixer: str, seed: int, *, steps: int = 800,
                  width: int = 16) -> dict:
    """Build one of ``COPYING_MIXERS``, train it on ``COPYING_TASK``, test it.

    The seed fixes the initial weights, the training batches and the test
    set. Returns ``train_copying``'s dict plus ``parameters``. The layers'
    constructors and ``train_copying`` check the counts.
    """
    mixer = check_choice("mixer", mixer, COPYING_MIXERS)  # else: an SSM
    task = COPYING_TASK
    torch.manual_seed(seed)
    if mixer == "attention":
        layer = PositionalAttention(width, heads=2,
                                    max_len=task["length"] + task["copies"])
    else:
        layer = SelectiveSSMLayer(width, 4, expand=1,
                                  selective=mixer == "selective SSM")
    vocab = 1 + task["copies"] + task["symbols"]
    model = CopyingModel(vocab, width, layer, task["symbols"])
    result = train_copying(model, steps=steps, seed=seed, **task)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    return result


# chapters/ch04-hybrids.qmd:399
def ssm_state_bytes(channels: int, state_size: int,
                    bytes_per_scalar: int = 2) -> int:
    """Return the bytes one SSM layer carries between tokens, at any length."""
    channels = check_int("channels", channels, minimum=1)
    state_size = check_int("state_size", state_size, minimum=1)
    bytes_per_scalar = check_int("bytes_per_scalar", bytes_per_scalar,
                                 minimum=1)
    return channels * state_size * bytes_per_scalar


def hybrid_cache_bytes(tokens: int, config: ch03.KVConfig, *,
                       attention_layers: int, channels: int,
                       state_size: int = 16) -> int:
    """Return a hybrid stack's cache bytes (Equation 8.1).

    Of ``config.layers`` layers, ``attention_layers`` are attention layers
    of ``config``'s head shape and keep all T tokens; each of the others
    keeps a state of ``channels`` x ``state_size`` numbers, at the
    config's bytes per number. With ``attention_layers == config.layers``
    this is ``ch03``'s ``kv_bytes(config, tokens)``.

    Raises:
        TypeError: If ``config`` is not a KVConfig or a count not an int.
        ValueError: If ``tokens`` < 0, ``attention_layers`` is outside
            0..layers, or ``config`` has windowed layers.
    """
    config = check_type("config", config, ch03.KVConfig)
    tokens = check_int("tokens", tokens, minimum=0)
    attention_layers = check_int("attention_layers", attention_layers,
                                 minimum=0, maximum=config.layers)
    if config.windowed_layers:
        raise ValueError("config must have no windowed layers (got "
                         f"windowed_layers={config.windowed_layers})")
    state = ssm_state_bytes(channels, state_size, config.bytes_per_scalar)
    attention = 0
    if attention_layers:
        attention = ch03.kv_bytes(replace(config, layers=attention_layers),
                                  tokens)
    return attention + (config.layers - attention_layers) * state


# chapters/ch04-hybrids.qmd:570
def cache_bytes_by_design(tokens: int, config: ch03.KVConfig, *,
                          channels: int,
                          state_size: int = 16) -> dict[str, int]:
    """Return one conversation's cache bytes for ``config`` and variants.

    "as shipped" is ``kv_bytes(config, tokens)``; "every layer global"
    drops the config's window; "a state in each windowed layer" keeps the
    global layers and gives every windowed one a state of ``channels`` x
    ``state_size`` numbers (Equation 8.1; the same as shipped when the
    config has no window); "a state in every layer" keeps no attention.

    Raises:
        TypeError: If ``config`` is not a KVConfig.
        ValueError: If ``tokens`` < 0 or a state size is below 1.
    """
    config = check_type("config", config, ch03.KVConfig)
    tokens = check_int("tokens", tokens, minimum=0)
    every_global = replace(config, window=None, windowed_layers=0)
    exact_layers = config.layers - config.windowed_layers
    def with_states(attention_layers: int) -> int:
        return hybrid_cache_bytes(tokens, every_global,
                                  attention_layers=attention_layers,
                                  channels=channels, state_size=state_size)
    return {
        "as shipped": ch03.kv_bytes(config, tokens),
        "every layer global": ch03.kv_bytes(every_global, tokens),
        "a state in each windowed layer": with_states(exact_layers),
        "a state in every layer": with_states(0),
    }
