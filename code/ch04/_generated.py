# Generated from chapters/ch04-efficient-architectures.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
# ruff: noqa: E402, F811, I001
"""Code saved from chapters/ch04-efficient-architectures.qmd ("Efficient architectures: windows, sums, states and compressed caches")."""


# chapters/ch04-efficient-architectures.qmd:32
import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx import ch01, ch02, ch03

RUNNING_EXAMPLE = ch03.KVConfig(
    name="Llama-3-8B shape", layers=32, query_heads=32, kv_heads=8, head_dim=128, bytes_per_scalar=2
)
"""The chapter's running example: 32 layers, 8 KV heads of width 128, 16-bit numbers."""

GB = 10**9
KIB = 1024


# chapters/ch04-efficient-architectures.qmd:292
def context_cost(tokens: int, config: ch03.KVConfig | None = None) -> dict[str, int]:
    """Return both bills of a context: score pairs and KV-cache bytes (@eq-ch04-bills).

    Args:
        tokens: context length T (>= 0).
        config: the model's cache shape; defaults to `RUNNING_EXAMPLE`.

    Returns:
        dict with `tokens`, `pairs_per_head_per_layer` (T², every query with every key),
        `causal_pairs_per_head_per_layer` (T(T+1)/2) and `kv_bytes` (Chapter 3's `kv_bytes`).

    Raises:
        TypeError: tokens is not an int. ValueError: tokens is negative.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise TypeError(f"tokens must be an int (got {type(tokens).__name__})")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0 (got {tokens})")
    config = RUNNING_EXAMPLE if config is None else config
    return {
        "tokens": tokens,
        "pairs_per_head_per_layer": tokens * tokens,
        "causal_pairs_per_head_per_layer": tokens * (tokens + 1) // 2,
        "kv_bytes": ch03.kv_bytes(config, tokens),
    }


BILL_CONTEXTS = (8_192, 131_072, 1_048_576)


# chapters/ch04-efficient-architectures.qmd:441
def pairs_computed(mask: Tensor) -> int:
    """Return how many query-key scores a Boolean mask asks for (its True entries)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (got {mask.dtype})")
    return int(mask.sum())


def receptive_field(mask: Tensor, layers: int) -> Tensor:
    """Return a bool (T, T) tensor: True where input j can reach output i after `layers` layers.

    One layer moves information along the mask's edges; `layers` layers compose
    the mask with itself that many times (a Boolean matrix power).

    Raises:
        ValueError: mask is not square, or layers < 0.
    """
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"mask must be square (T, T) (got shape {tuple(mask.shape)})")
    if layers < 0:
        raise ValueError(f"layers must be >= 0 (got {layers})")
    step = mask.to(torch.float64)
    heard = torch.eye(mask.shape[0], dtype=torch.float64)  # before any layer: only itself
    for _ in range(layers):
        heard = ((step @ heard) > 0).to(torch.float64)
    return heard.bool()


def window_reach(window: int, layers: int) -> int:
    """Return L (w - 1): how far back a stack of windowed layers can carry information (@eq-ch04-window)."""
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    if layers < 0:
        raise ValueError(f"layers must be >= 0 (got {layers})")
    return layers * (window - 1)


def hops_needed(distance: int, window: int) -> int:
    """Return the fewest windowed layers that carry a token `distance` positions forward."""
    if window < 2:
        raise ValueError(f"window must be >= 2 for information to move (got {window})")
    if distance < 0:
        raise ValueError(f"distance must be >= 0 (got {distance})")
    return math.ceil(distance / (window - 1))


# chapters/ch04-efficient-architectures.qmd:574
def rolling_buffer_slots(tokens_seen: int, window: int) -> list[int]:
    """Return which token sits in each of the `window` slots after `tokens_seen` tokens (-1 = empty)."""
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    if tokens_seen < 0:
        raise ValueError(f"tokens_seen must be >= 0 (got {tokens_seen})")
    slots = [-1] * window
    for token in range(max(0, tokens_seen - window), tokens_seen):
        slots[token % window] = token  # token t always lands in slot t mod w
    return slots


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Raise ValueError unless query and key are (..., T, d) alike and value is (..., T, d_v)."""
    if query.shape != key.shape or key.shape[:-1] != value.shape[:-1]:
        raise ValueError(
            "query and key must have equal shapes (..., T, d) and value (..., T, d_v) "
            f"(got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)})"
        )


def sliding_window_decode(query: Tensor, key: Tensor, value: Tensor, window: int) -> tuple[Tensor, int]:
    """Return (outputs, largest buffer length) of token-by-token decoding with a rolling KV buffer.

    The buffer has `window` slots; token t overwrites slot t mod window. The outputs equal
    masked attention with `ch03.visibility_mask(T, window=window)` (@eq-ch04-window).

    Args:
        query, key: (..., T, d). value: (..., T, d_v). window: w >= 1.

    Raises:
        ValueError: window < 1, or the shapes of query, key and value do not match.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    _check_qkv(query, key, value)
    *lead, tokens, _ = key.shape
    key_buffer = key.new_zeros(*lead, window, key.shape[-1])  # (..., w, d): all the memory there is
    value_buffer = value.new_zeros(*lead, window, value.shape[-1])
    outputs, largest = [], 0
    for t in range(tokens):
        slot = t % window
        key_buffer[..., slot, :] = key[..., t, :]
        value_buffer[..., slot, :] = value[..., t, :]
        filled = min(t + 1, window)  # slots 0 .. filled-1 hold the last `filled` tokens
        largest = max(largest, filled)
        out, _ = ch01.scaled_dot_product_attention(
            query[..., t : t + 1, :], key_buffer[..., :filled, :], value_buffer[..., :filled, :]
        )
        outputs.append(out)
    return torch.cat(outputs, dim=-2), largest


# chapters/ch04-efficient-architectures.qmd:709
def global_local_mask(
    seq_len: int, window: int, global_tokens: tuple[int, ...] = (0,), *, causal: bool = True
) -> Tensor:
    """Return a bool (T, T) mask: a window plus global tokens that everyone reads and that read everyone.

    With causal=True nothing reads the future, so a global token at position g reads
    only tokens 0..g; with causal=False (an encoder, as in Longformer and BigBird) the
    window is the band |i - j| < w and the global rows and columns are full.

    Raises:
        ValueError: seq_len < 0, window < 1, or a global token outside 0..seq_len-1.
    """
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0 (got {seq_len})")
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    if any(not 0 <= g < seq_len for g in global_tokens):
        raise ValueError(f"global tokens must lie in 0..{seq_len - 1} (got {tuple(global_tokens)})")
    distance = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]  # i - j
    mask = distance.abs() < window
    glob = list(global_tokens)
    mask[:, glob] = True  # everyone reads the global tokens
    mask[glob, :] = True  # and the global tokens read everyone
    if causal:
        mask &= distance >= 0
    return mask


def strided_mask(seq_len: int, stride: int) -> Tensor:
    """Return the causal strided mask of @eq-ch04-strided: the last `stride` keys plus every stride-th one."""
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0 (got {seq_len})")
    if stride < 1:
        raise ValueError(f"stride must be >= 1 (got {stride})")
    distance = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]
    return (distance >= 0) & ((distance < stride) | (distance % stride == 0))


# chapters/ch04-efficient-architectures.qmd:888
def sliding_window_block_mask(seq_len: int, window: int, block_size: int) -> Tensor:
    """Return a bool (n_blocks, n_blocks) mask: True where a query block and a key block share a visible pair.

    Visible means 0 <= i - j < window (the causal window of `ch03.visibility_mask`).
    The last block may be shorter when block_size does not divide seq_len.

    Raises:
        ValueError: seq_len < 0, window < 1 or block_size < 1.
    """
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0 (got {seq_len})")
    if window < 1:
        raise ValueError(f"window must be >= 1 (got {window})")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    n_blocks = math.ceil(seq_len / block_size)
    start = torch.arange(n_blocks) * block_size  # first token of each block
    end = torch.clamp(start + block_size, max=seq_len) - 1  # last token of each block
    # some i in the query block and j in the key block with 0 <= i - j < window:
    latest_query_not_before_key = end[:, None] >= start[None, :]
    earliest_query_close_enough = start[:, None] - end[None, :] < window
    return latest_query_not_before_key & earliest_query_close_enough


def expand_block_mask(block_mask: Tensor, block_size: int, seq_len: int) -> Tensor:
    """Return the bool (T, T) token mask that a block mask stands for (every pair in a touched tile)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    tiles = block_mask.repeat_interleave(block_size, dim=0).repeat_interleave(block_size, dim=1)
    return tiles[:seq_len, :seq_len]


def block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_mask: Tensor,
    block_size: int,
    *,
    token_mask: Tensor | None = None,
) -> Tensor:
    """Return attention outputs computed only on the tiles `block_mask` marks.

    Without `token_mask` the result equals dense attention with
    `expand_block_mask(block_mask, block_size, T)`; with it (which must lie inside the
    marked tiles) it equals dense attention with `token_mask`. Queries that see no key
    get a zero output, as in `ch01.scaled_dot_product_attention`.

    Args:
        query, key: (..., T, d); value: (..., T, d_v); block_mask: bool (n_blocks, n_blocks)
        with n_blocks = ceil(T / block_size); token_mask: optional bool (T, T).

    Raises:
        ValueError: mismatched shapes, block_size < 1, a block mask of the wrong shape,
        or a token mask that reaches outside the marked tiles.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    _check_qkv(query, key, value)
    tokens = query.shape[-2]
    n_blocks = math.ceil(tokens / block_size)
    if block_mask.dtype != torch.bool or tuple(block_mask.shape) != (n_blocks, n_blocks):
        raise ValueError(
            f"block_mask must be bool of shape ({n_blocks}, {n_blocks}) for T={tokens}, "
            f"block_size={block_size} (got {block_mask.dtype} {tuple(block_mask.shape)})"
        )
    if token_mask is not None:
        if tuple(token_mask.shape) != (tokens, tokens):
            raise ValueError(f"token_mask must have shape ({tokens}, {tokens}) (got {tuple(token_mask.shape)})")
        if (token_mask.cpu() & ~expand_block_mask(block_mask.cpu(), block_size, tokens)).any():
            raise ValueError("token_mask allows pairs outside the tiles block_mask marks")
        token_mask = token_mask.to(query.device)
    output = query.new_zeros(*query.shape[:-1], value.shape[-1])
    for q_block in range(n_blocks):
        rows = slice(q_block * block_size, min(tokens, (q_block + 1) * block_size))
        key_blocks = block_mask[q_block].nonzero().flatten().tolist()
        if not key_blocks:
            continue
        columns = torch.cat(
            [torch.arange(k * block_size, min(tokens, (k + 1) * block_size)) for k in key_blocks]
        ).to(query.device)
        mask = None if token_mask is None else token_mask[rows][:, columns]
        out, _ = ch01.scaled_dot_product_attention(
            query[..., rows, :], key[..., columns, :], value[..., columns, :], mask
        )
        output[..., rows, :] = out
    return output


# chapters/ch04-efficient-architectures.qmd:1077
def feature_map(x: Tensor) -> Tensor:
    """Return phi(x) = elu(x) + 1, element-wise: x + 1 above zero, e^x at or below; always > 0."""
    return F.elu(x) + 1.0


def linear_attention_weights(query: Tensor, key: Tensor) -> Tensor:
    """Return the (..., T, T) causal weights linear attention implies: phi(q_i).phi(k_j), rows summing to 1."""
    if query.shape != key.shape:
        raise ValueError(f"query and key must have equal shapes (got {tuple(query.shape)}, {tuple(key.shape)})")
    scores = feature_map(query) @ feature_map(key).transpose(-2, -1)  # (..., T, T), all positive
    scores = scores * ch01.causal_mask(query.shape[-2], device=query.device)  # the future adds nothing
    return scores / scores.sum(dim=-1, keepdim=True)


def linear_attention_quadratic(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """Return linear attention computed the quadratic way: all T x T weights, then a weighted sum of values."""
    _check_qkv(query, key, value)
    return linear_attention_weights(query, key) @ value


LinearAttentionState = tuple[Tensor, Tensor]
"""The recurrent state of linear attention: the pot S and the running key total z."""


def linear_attention_recurrent(
    query: Tensor, key: Tensor, value: Tensor, state: LinearAttentionState | None = None
) -> tuple[Tensor, LinearAttentionState]:
    """Return (outputs, (S, z)): linear attention one token at a time with a fixed-size state (@eq-ch04-linear).

    S (..., d_k, d_v) sums phi(k_j) v_j^T and z (..., d_k) sums phi(k_j). Passing the returned
    state back in continues the sequence, which is how generation uses it.
    """
    _check_qkv(query, key, value)
    *lead, tokens, d_k = key.shape
    if state is None:
        pot = key.new_zeros(*lead, d_k, value.shape[-1])
        total = key.new_zeros(*lead, d_k)
    else:
        pot, total = state
    outputs = []
    for t in range(tokens):
        phi_k = feature_map(key[..., t, :])  # (..., d_k)
        pot = pot + phi_k.unsqueeze(-1) * value[..., t, :].unsqueeze(-2)  # add phi(k) v^T
        total = total + phi_k
        phi_q = feature_map(query[..., t, :])
        numerator = (phi_q.unsqueeze(-1) * pot).sum(dim=-2)  # phi(q)^T S, shape (..., d_v)
        denominator = (phi_q * total).sum(dim=-1, keepdim=True)  # phi(q)^T z
        outputs.append(numerator / denominator)
    return torch.stack(outputs, dim=-2), (pot, total)


def linear_attention_chunked(query: Tensor, key: Tensor, value: Tensor, chunk_size: int = 64) -> Tensor:
    """Return linear attention for a whole sequence in chunks, never building a T x T matrix.

    Inside a chunk the weights are a (chunk, chunk) causal block; everything before the
    chunk arrives through the running state (S, z) of @eq-ch04-linear.
    """
    _check_qkv(query, key, value)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (got {chunk_size})")
    *lead, tokens, d_k = key.shape
    pot = key.new_zeros(*lead, d_k, value.shape[-1])
    total = key.new_zeros(*lead, d_k)
    outputs = []
    for start in range(0, tokens, chunk_size):
        phi_q = feature_map(query[..., start : start + chunk_size, :])  # (..., c, d_k)
        phi_k = feature_map(key[..., start : start + chunk_size, :])
        v = value[..., start : start + chunk_size, :]
        inside = (phi_q @ phi_k.transpose(-2, -1)) * ch01.causal_mask(phi_q.shape[-2], device=query.device)
        numerator = phi_q @ pot + inside @ v  # earlier chunks through the pot, this chunk directly
        denominator = phi_q @ total.unsqueeze(-1) + inside.sum(dim=-1, keepdim=True)
        outputs.append(numerator / denominator)
        pot = pot + phi_k.transpose(-2, -1) @ v
        total = total + phi_k.sum(dim=-2)
    return torch.cat(outputs, dim=-2)


# chapters/ch04-efficient-architectures.qmd:1239
def weight_sharpness(weights: Tensor, last_rows: int = 5) -> dict[str, float]:
    """Return how peaked the last rows of a (T, T) weight matrix are.

    `mean_of_row_max` averages each row's largest weight over the last `last_rows` rows;
    `max` is the single largest weight in those rows.
    """
    if weights.dim() != 2 or not 1 <= last_rows <= weights.shape[0]:
        raise ValueError(f"need a (T, T) matrix and 1 <= last_rows <= T (got {tuple(weights.shape)}, {last_rows})")
    tail = weights[-last_rows:]
    return {"mean_of_row_max": tail.amax(dim=-1).mean().item(), "max": tail.max().item()}


def sharpness_comparison(query_scale: float, seed: int = 11, tokens: int = 10, width: int = 8) -> dict:
    """Return softmax and linear-attention weights on one random draw, with the weight_sharpness of each.

    Keys and base queries are standard normal; the queries are multiplied by `query_scale`.
    """
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(tokens, width, generator=generator)
    queries = query_scale * torch.randn(tokens, width, generator=generator)
    _, softmax_weights = ch01.scaled_dot_product_attention(queries, keys, keys, ch01.causal_mask(tokens))
    linear_weights = linear_attention_weights(queries, keys)
    return {
        "softmax": weight_sharpness(softmax_weights), "linear": weight_sharpness(linear_weights),
        "weights": (softmax_weights, linear_weights),
    }


# chapters/ch04-efficient-architectures.qmd:1351
def _as_float(values, dtype: torch.dtype = torch.float64) -> Tensor:
    """Return `values` as a float tensor: float tensors as they are, everything else in `dtype`."""
    if isinstance(values, Tensor) and values.is_floating_point():
        return values
    return torch.as_tensor(values, dtype=dtype)


def _ssm_parameters(A, B, C) -> tuple[Tensor, Tensor, Tensor]:
    A = torch.atleast_2d(_as_float(A))
    B = torch.atleast_1d(_as_float(B)).to(A.dtype)
    C = torch.atleast_1d(_as_float(C)).to(A.dtype)
    n = B.shape[0]
    if A.shape != (n, n) or C.shape != (n,):
        raise ValueError(
            f"A must be (N, N), B and C (N,) for the same N (got {tuple(A.shape)}, {tuple(B.shape)}, {tuple(C.shape)})"
        )
    return A, B, C


def ssm_recurrent(x, A, B, C) -> Tensor:
    """Return y_t = C h_t with h_t = A h_{t-1} + B x_t, one step at a time (@eq-ch04-ssm).

    Args:
        x: a single channel, shape (T,).
        A: state matrix, (N, N); a plain number means N = 1.
        B: input vector, (N,); C: readout vector, (N,); plain numbers allowed.
    """
    A, B, C = _ssm_parameters(A, B, C)
    x = _as_float(x).to(A.dtype)
    if x.dim() != 1:
        raise ValueError(f"x must be one channel of shape (T,) (got {tuple(x.shape)})")
    state = torch.zeros_like(B)  # N numbers, whatever the length
    outputs = []
    for x_t in x:
        state = A @ state + B * x_t
        outputs.append(C @ state)
    return torch.stack(outputs) if outputs else x.new_zeros(0)


def ssm_kernel(A, B, C, length: int) -> Tensor:
    """Return the impulse response C A^k B for k = 0 .. length-1 (@eq-ch04-ssm)."""
    if length < 0:
        raise ValueError(f"length must be >= 0 (got {length})")
    A, B, C = _ssm_parameters(A, B, C)
    kernel, power_times_B = [], B.clone()
    for _ in range(length):
        kernel.append(C @ power_times_B)
        power_times_B = A @ power_times_B
    return torch.stack(kernel) if kernel else B.new_zeros(0)


def ssm_convolution(x, A, B, C) -> Tensor:
    """Return the outputs of `ssm_recurrent` as one causal convolution with the kernel (FFT, O(T log T))."""
    A, B, C = _ssm_parameters(A, B, C)
    x = _as_float(x).to(A.dtype)
    if x.dim() != 1:
        raise ValueError(f"x must be one channel of shape (T,) (got {tuple(x.shape)})")
    tokens = x.shape[0]
    kernel = ssm_kernel(A, B, C, tokens)
    size = 2 * tokens  # zero-padding so the circular FFT product is a plain (linear) convolution
    spectrum = torch.fft.rfft(x, n=size) * torch.fft.rfft(kernel, n=size)
    return torch.fft.irfft(spectrum, n=size)[:tokens]


# chapters/ch04-efficient-architectures.qmd:1516
def _check_scan(a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (..., T) (got {tuple(a.shape)} and {tuple(b.shape)})")
    if a.dim() == 0:
        raise ValueError("a and b need a time dimension (their last dimension)")


def sequential_scan(a: Tensor, b: Tensor) -> Tensor:
    """Return every h_t = a_t h_{t-1} + b_t (h before the start = 0) with a plain loop over time.

    Time is the last dimension; leading dimensions are independent channels. The loop
    runs on Python floats (double precision), the fastest plain loop Python offers.
    """
    _check_scan(a, b)
    a_rows = a.reshape(-1, a.shape[-1]).tolist()
    b_rows = b.reshape(-1, b.shape[-1]).tolist()
    states = []
    for a_row, b_row in zip(a_rows, b_rows, strict=True):
        state, row = 0.0, []
        for a_t, b_t in zip(a_row, b_row, strict=True):
            state = a_t * state + b_t
            row.append(state)
        states.append(row)
    return torch.tensor(states, dtype=b.dtype, device=b.device).reshape(b.shape)


def discretize(delta: Tensor | float, a: float = -1.0, b: float = 1.0) -> tuple[Tensor, Tensor]:
    """Return (A_bar, B_bar) = (e^(delta a), (e^(delta a) - 1) / a * b), the zero-order hold (@eq-ch04-selective).

    Raises:
        ValueError: a is not negative, or a step size is negative.
    """
    if not a < 0:
        raise ValueError(f"a must be negative so the state decays (got {a})")
    delta = _as_float(delta)
    if (delta < 0).any():
        raise ValueError("step sizes delta must be >= 0")
    keep = torch.exp(delta * a)
    return keep, (keep - 1.0) / a * b


def step_sizes(markers, sharpness: float = 10.0, bias: float = -5.0) -> Tensor:
    """Return delta_t = softplus(sharpness * marker_t + bias): large for marked tokens, tiny otherwise."""
    return F.softplus(sharpness * _as_float(markers) + bias)


def selective_ssm(x, delta, a: float = -1.0, b: float = 1.0, *, readout: float = 1.0) -> Tensor:
    """Return the outputs c h_t of a one-channel SSM whose every step has its own delta_t (@eq-ch04-selective)."""
    x, delta = _as_float(x), _as_float(delta)
    if x.shape != delta.shape:
        raise ValueError(f"x and delta must have the same shape (got {tuple(x.shape)} and {tuple(delta.shape)})")
    keep, write = discretize(delta, a, b)
    return readout * sequential_scan(keep, write * x)  # h_t = keep_t h_{t-1} + write_t x_t


RECALL_VALUES = (0.3, -0.5, 7.0, 0.8, -0.2, 0.6, -0.9, 0.4, 0.1, -0.3, 0.5, -0.6)
"""The recall task: small noise, a marked 7 at position 2, then nine more noise values."""
RECALL_MARKERS = (0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def selective_recall() -> float:
    """Return the selective SSM's final state on the recall task: how much of the 7 survives."""
    return selective_ssm(RECALL_VALUES, step_sizes(RECALL_MARKERS))[-1].item()


def fixed_step_recall(delta: float) -> float:
    """Return the final state on the recall task with one fixed delta for every token (like S4)."""
    return selective_ssm(RECALL_VALUES, torch.full((len(RECALL_VALUES),), float(delta)))[-1].item()


# chapters/ch04-efficient-architectures.qmd:1720
def scan_rounds(length: int) -> int:
    """Return the rounds a Hillis-Steele scan needs for `length` steps: ceil(log2 length)."""
    if length < 0:
        raise ValueError(f"length must be >= 0 (got {length})")
    return max(0, math.ceil(math.log2(length))) if length > 0 else 0


def parallel_scan(a: Tensor, b: Tensor) -> Tensor:
    """Return the same states as `sequential_scan` in ceil(log2 T) vectorised rounds (@eq-ch04-scan).

    After round r, position t holds the merge of steps t-2^(r+1)+1 .. t; no Python loop runs
    over time, and nothing is divided, so a = 0 and long sequences are safe.
    """
    _check_scan(a, b)
    steps = a.shape[-1]
    a, b = a.clone(), b.clone()
    next_a, next_b = torch.empty_like(a), torch.empty_like(b)
    shift = 1
    while shift < steps:
        next_a[..., :shift] = a[..., :shift]  # nothing earlier to merge with: keep as is
        next_b[..., :shift] = b[..., :shift]
        # (a_prev, b_prev) then (a, b)  ->  (a_prev * a, a * b_prev + b)
        torch.addcmul(b[..., shift:], a[..., shift:], b[..., :-shift], out=next_b[..., shift:])
        torch.mul(a[..., shift:], a[..., :-shift], out=next_a[..., shift:])
        a, next_a, b, next_b = next_a, a, next_b, b  # swap buffers for the next round
        shift *= 2
    return b


# chapters/ch04-efficient-architectures.qmd:1912
def ssm_state_bytes(channels: int, state_size: int, bytes_per_scalar: int = 2) -> int:
    """Return the bytes one SSM layer carries between tokens: channels x state_size x bytes, at any length."""
    for name, value in (("channels", channels), ("state_size", state_size), ("bytes_per_scalar", bytes_per_scalar)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (got {value})")
    return channels * state_size * bytes_per_scalar


def hybrid_cache_bytes(
    tokens: int,
    config: ch03.KVConfig | None = None,
    *,
    attention_layers: int = 4,
    channels: int = 4096,
    state_size: int = 16,
) -> int:
    """Return the cache of a hybrid stack (@eq-ch04-hybrid): attention layers grow with T, SSM layers do not.

    `config` gives the total layers and the attention layers' shape (default `RUNNING_EXAMPLE`);
    the SSM state uses the same bytes per number. With attention_layers == config.layers this
    is `ch03.kv_bytes(config, tokens)`.

    Raises:
        ValueError: tokens < 0, or attention_layers outside 0..layers.
    """
    config = RUNNING_EXAMPLE if config is None else config
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0 (got {tokens})")
    if not 0 <= attention_layers <= config.layers:
        raise ValueError(f"attention_layers must lie in 0..{config.layers} (got {attention_layers})")
    attention = ch03.kv_bytes(replace(config, layers=attention_layers), tokens) if attention_layers else 0
    ssm_layers = config.layers - attention_layers
    return attention + ssm_layers * ssm_state_bytes(channels, state_size, config.bytes_per_scalar)


# chapters/ch04-efficient-architectures.qmd:2118
LatentCache = Tensor
"""A latent cache: (B, T, r + d_R), the stored latents plus any rotary keys."""


class AbsorbedLatentAttention(ch03.ToyLatentKVAttention):
    """Chapter 3's latent-cache layer with a second forward pass that never expands keys or values.

    `forward_absorbed` gives the same output and cache as `forward` (@eq-ch04-latent): content
    scores are (q W_UK_h^T) . c_t and outputs (sum_j w_j c_j) W_UV_h^T, head by head. A decoupled
    rotary key (rope_key_dim > 0) cannot be absorbed, because its rotation depends on the
    position; it is cached as it is and scored as in `forward`, as DeepSeek-V2 does.
    """

    def forward_absorbed(self, x: Tensor, cache: LatentCache | None = None) -> tuple[Tensor, LatentCache]:
        """Return (output (B, T, d_model), cache (B, T_past + T, r + d_R)), equal to `forward`'s.

        Raises:
            ValueError: x is not (B, T, d_model) or the cache does not have the layer's width.
        """
        batch, tokens, _ = x.shape
        heads, head_dim, rank, rope = self.query_heads, self.head_dim, self.latent_rank, self.rope_key_dim
        latent, positions = self.extend_latent(x, cache)  # Chapter 3's checks, latent and rotary key
        content = latent[..., :rank].unsqueeze(1)  # (B, 1, T_k, r), shared by every head
        query = ch01.split_heads(self.query(x), heads)  # (B, H, T, d_h)
        key_up = self.key_up.weight.view(heads, head_dim, rank)  # head h's W_UK^T, (H, d_h, r)
        value_up = self.value_up.weight.view(heads, head_dim, rank)  # head h's W_UV^T, (H, d_h, r)
        query_latent = query @ key_up  # (B, H, T, r): each query moved into latent space
        scores = query_latent @ content.transpose(-2, -1)  # (B, H, T, T_k) = q . k, no key built
        if rope:
            rotary_query = self.rotary_queries(x, positions)  # (B, H, T, d_R)
            scores = scores + rotary_query @ latent[:, None, :, rank:].transpose(-2, -1)
        scores = scores / math.sqrt(head_dim + rope)  # the scale `forward` uses for its (d_h + d_R)-wide keys
        visible = ch03.causal_rows(tokens, latent.size(1), device=x.device)  # (T, T_k)
        weights = ch01.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        mixed = weights @ content  # (B, H, T, r): mix the latents first ...
        heads_out = mixed @ value_up.transpose(-2, -1)  # ... then expand once per query: (B, H, T, d_h)
        return self.output(ch01.merge_heads(heads_out)), latent


# chapters/ch04-efficient-architectures.qmd:2211
def quantize_kv(x: Tensor, bits: int, *, per: str = "token") -> tuple[Tensor, Tensor]:
    """Return (codes, scale) for cached keys or values (..., T, d), via `ch02.quantize`.

    per="token": one scale per cached vector (each token, each head), the usual choice.
    per="channel": one scale per channel across the tokens, KIVI's choice for keys.

    Raises:
        ValueError: per is not "token" or "channel", x has fewer than 2 dimensions, or
        bits is outside what `ch02.quantize` supports.
    """
    if per not in ("token", "channel"):
        raise ValueError(f"per must be 'token' or 'channel' (got {per!r})")
    if x.dim() < 2:
        raise ValueError(f"x must be (..., T, d) (got shape {tuple(x.shape)})")
    return ch02.quantize(x, bits, dim=-1 if per == "token" else -2)


def quantized_kv_bytes_per_token(config: ch03.KVConfig, bits: int, *, scale_bytes: int = 2) -> int:
    """Return cache bytes per token at `bits` per number plus one scale per stored vector (@eq-ch04-quantized).

    2 L H_kv (d_h bits / 8 + scale_bytes); codes are packed, rounded up to whole bytes.
    """
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must lie in 1..16 (got {bits})")
    if scale_bytes < 0:
        raise ValueError(f"scale_bytes must be >= 0 (got {scale_bytes})")
    vectors = 2 * config.layers * config.kv_heads  # stored vectors: K and V, every KV head, every layer
    return vectors * (math.ceil(config.head_dim * bits / 8) + scale_bytes)


def quantized_cache_error(
    bits: int,
    *,
    keys_per: str = "token",
    tokens: int = 64,
    dim: int = 64,
    outlier_channels: int = 0,
    outlier_scale: float = 10.0,
    seed: int = 0,
) -> float:
    """Return the relative change ||approx - exact|| / ||exact|| of causal attention outputs.

    Keys are stored per `keys_per` ("token" or "channel"), values per token, both at `bits`.
    `outlier_channels` key channels are multiplied by `outlier_scale`, as trained keys often have
    a few large channels. Random data, not a trained model.
    """
    if tokens < 1 or dim < 1:
        raise ValueError(f"tokens and dim must be >= 1 (got {tokens} and {dim})")
    if not 0 <= outlier_channels <= dim:
        raise ValueError(f"outlier_channels must lie in 0..{dim} (got {outlier_channels})")
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(tokens, dim, generator=generator) for _ in range(3))
    loud = torch.randperm(dim, generator=generator)[:outlier_channels]
    key[:, loud] *= outlier_scale
    mask = ch01.causal_mask(tokens)
    exact, _ = ch01.scaled_dot_product_attention(query, key, value, mask)
    key_hat = ch02.dequantize(*quantize_kv(key, bits, per=keys_per))
    value_hat = ch02.dequantize(*quantize_kv(value, bits, per="token"))
    approx, _ = ch01.scaled_dot_product_attention(query, key_hat, value_hat, mask)
    return (torch.linalg.norm(approx - exact) / torch.linalg.norm(exact)).item()


# chapters/ch04-efficient-architectures.qmd:2381
def cache_bytes_by_design(tokens: int, config: ch03.KVConfig | None = None) -> dict[str, int]:
    """Return the bytes one conversation's past costs under each design, on the running example's shape.

    Latent: DeepSeek-V2's 512 + 64 numbers per layer on this stack; window: 4,096 tokens;
    hybrid: 4 attention layers of 32; SSM: 4,096 channels x 16 state numbers per layer.
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0 (got {tokens})")
    config = RUNNING_EXAMPLE if config is None else config
    latent = ch03.KVConfig(
        name="latent 512+64", layers=config.layers, query_heads=config.query_heads,
        head_dim=config.head_dim, bytes_per_scalar=config.bytes_per_scalar, latent_rank=512, rope_key_dim=64,
    )
    return {
        "multi-head (32 KV heads)": ch03.kv_bytes(replace(config, kv_heads=config.query_heads), tokens),
        "grouped-query (8 KV heads)": ch03.kv_bytes(config, tokens),
        "latent (512 + 64 per layer)": ch03.kv_bytes(latent, tokens),
        "grouped-query, 4-bit": tokens * quantized_kv_bytes_per_token(config, 4),
        "hybrid (4 attention of 32)": hybrid_cache_bytes(tokens, config),
        "sliding window (4,096)": ch03.kv_bytes(replace(config, window=4096, windowed_layers=config.layers), tokens),
        "state-space (all 32 layers)": hybrid_cache_bytes(tokens, config, attention_layers=0),
    }
