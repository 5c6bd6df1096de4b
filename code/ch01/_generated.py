# Generated from chapters/ch01-attention.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch01-attention.qmd ("Attention from first principles")."""

import math

import torch
from torch import Tensor, nn

from longctx.support import (
    check_bool,
    check_device,
    check_int,
    check_number,
    check_tensor,
)


# chapters/ch01-attention.qmd:198
def softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """Return the softmax of ``scores`` along ``dim``, without overflow.

    Equation 1.1: the largest entry of each slice is subtracted before
    ``exp``, so no exponential exceeds 1. Entries equal to ``-inf`` get
    weight exactly 0; a slice that is entirely ``-inf`` gets all zeros
    instead of NaN.

    Args:
        scores: A non-empty floating-point tensor with at least one dimension.
        dim: The dimension whose entries become weights that sum to 1.

    Returns:
        A tensor shaped like ``scores``; each slice along ``dim`` sums to 1,
        or to 0 where every entry was ``-inf``.

    Raises:
        TypeError: If ``scores`` is not a floating-point tensor, or ``dim``
            is not an int.
        ValueError: If ``scores`` is empty or 0-d, or ``dim`` is not one of
            its dimensions.
    """
    check_tensor("scores", scores, min_dims=1, floating=True, nonempty=True)
    rank = scores.dim()
    dim = check_int("dim", dim, minimum=-rank, maximum=rank - 1)
    peak = scores.amax(dim=dim, keepdim=True)  # m in Equation 1.1
    finite = torch.isfinite(peak)
    peak = torch.where(finite, peak, torch.zeros_like(peak))  # all -inf: 0
    exps = torch.exp(scores - peak)  # every exponent <= 0: values in [0, 1]
    total = exps.sum(dim=dim, keepdim=True)
    ones = torch.ones_like(total)
    return exps / torch.where(total > 0, total, ones)  # empty slice: 0 / 1


# chapters/ch01-attention.qmd:296
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Return ``(output, weights)`` of scaled dot-product attention.

    Equation 1.2: each query is scored against every key, the scores are
    scaled, pairs the mask forbids are set to ``-inf``, a row-wise softmax
    turns scores into weights, and the output is the weighted sum of the
    values.

    Args:
        query: ``(..., T_q, d)`` floating-point tensor.
        key: ``(..., T_k, d)``; leading dimensions broadcast against
            ``query``'s.
        value: ``(..., T_k, d_v)``.
        mask: Optional bool tensor broadcastable to ``(..., T_q, T_k)``;
            True means "may attend". ``None`` lets every query see every key.
        scale: Multiplier for the scores; ``None`` means ``1 / sqrt(d)``.

    Returns:
        ``output`` of shape ``(..., T_q, d_v)`` and ``weights`` of shape
        ``(..., T_q, T_k)``. A query whose mask row is all False gets zero
        weights and a zero output.

    Raises:
        TypeError: If an input is not a floating-point tensor, the three do
            not share one dtype, the mask is not a bool tensor, or ``scale``
            is not a number.
        ValueError: If an input is empty or has fewer than 2 dimensions, the
            shapes disagree, or ``scale`` is not positive and finite.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, tensor, min_dims=2, floating=True, nonempty=True)
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(
            "query, key and value must share one dtype "
            f"(got {query.dtype}, {key.dtype} and {value.dtype})"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must have the same last dimension d (got query "
            f"{tuple(query.shape)} and key {tuple(key.shape)})"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same number of tokens (got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)})"
        )
    shapes = [tuple(t.shape) for t in (query, key, value)]
    try:
        leading = torch.broadcast_shapes(*(s[:-2] for s in shapes))
    except RuntimeError:
        raise ValueError(
            "the leading (batch, head) dimensions of query, key and value "
            f"must broadcast (got {shapes[0]}, {shapes[1]} and {shapes[2]})"
        ) from None
    score_shape = (*leading, query.shape[-2], key.shape[-2])
    if mask is not None:
        check_tensor("mask", mask, dtype=torch.bool)
        try:
            broadcast = torch.broadcast_shapes(mask.shape, score_shape)
        except RuntimeError:
            broadcast = None
        if broadcast != score_shape:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to "
                f"the scores' shape {score_shape}"
            )
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])  # 1 / sqrt(d), Equation 1.2
    else:
        scale = check_number("scale", scale, above=0)

    # (..., T_q, d) @ (..., d, T_k) -> (..., T_q, T_k): q_i . k_j * scale
    scores = (query @ key.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # M of Equation 1.2
    weights = softmax(scores, dim=-1)  # rows sum to 1; fully masked rows to 0
    return weights @ value, weights  # (..., T_q, d_v), (..., T_q, T_k)


# chapters/ch01-attention.qmd:524
def causal_mask(
    seq_len: int, *, device: torch.device | str | None = None
) -> Tensor:
    """Return the causal mask: True where query i may attend key j (j <= i).

    Args:
        seq_len: Number of positions ``T``.
        device: Where to build the mask (default: torch's default device).

    Returns:
        A lower-triangular bool ``(seq_len, seq_len)`` tensor, diagonal
        included.

    Raises:
        TypeError: If ``seq_len`` is not an int or ``device`` is not a device.
        ValueError: If ``seq_len`` is not positive or ``device`` names no
            device.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    if device is not None:
        device = check_device("device", device)
    full = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    return full.tril()  # keep j <= i


# chapters/ch01-attention.qmd:645
def split_heads(x: Tensor, heads: int) -> Tensor:
    """Return ``x`` reshaped from (B, T, H*d_h) to (B, H, T, d_h).

    Head ``h`` gets the ``h``-th slice of width ``d_h`` of each token.

    Raises:
        TypeError: If ``x`` is not a tensor or ``heads`` is not an int.
        ValueError: If ``x`` is empty or not 3-d, ``heads`` is not
            positive, or ``heads`` does not divide the width of ``x``.
    """
    check_tensor("x", x, dims=3, nonempty=True)
    heads = check_int("heads", heads, minimum=1)
    batch, tokens, width = x.shape
    if width % heads:
        raise ValueError(
            f"heads must divide the width of x (got width {width} and "
            f"heads={heads})"
        )
    head_dim = width // heads
    # (B, T, H*dh) -> (B, T, H, dh) -> (B, H, T, dh)
    return x.reshape(batch, tokens, heads, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """Return ``x`` reshaped from (B, H, T, d_h) to (B, T, H*d_h).

    It undoes ``split_heads``.

    Raises:
        TypeError: If ``x`` is not a tensor.
        ValueError: If ``x`` is empty or not 4-d.
    """
    check_tensor("x", x, dims=4, nonempty=True)
    batch, heads, tokens, head_dim = x.shape
    # (B, H, T, dh) -> (B, T, H, dh) -> (B, T, H*dh); the transpose only
    # relabels strides, so the reshape copies the heads side by side
    return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


# chapters/ch01-attention.qmd:691
class MultiHeadAttention(nn.Module):
    """Multi-head self-attention: H heads of Equation 1.2 side by side.

    An output layer mixes the heads' concatenated results.

    Args:
        d_model: Width of each token's vector.
        heads: Number of heads ``H``; must divide ``d_model``. Each head has
            width ``d_model // heads``.
        bias: Whether the four linear layers have biases.

    Raises:
        TypeError: If ``d_model`` or ``heads`` is not an int, or ``bias`` is
            not a bool.
        ValueError: If ``d_model`` or ``heads`` is not positive, or ``heads``
            does not divide ``d_model``.
    """

    def __init__(self, d_model: int, heads: int, *, bias: bool = False):
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        heads = check_int("heads", heads, minimum=1)
        bias = check_bool("bias", bias)
        if d_model % heads:
            raise ValueError(
                "d_model must be divisible by heads "
                f"(got d_model={d_model}, heads={heads})"
            )
        self.d_model = d_model
        self.heads = heads
        self.head_dim = d_model // heads
        self.query = nn.Linear(d_model, d_model, bias=bias)  # W_Q
        self.key = nn.Linear(d_model, d_model, bias=bias)  # W_K
        self.value = nn.Linear(d_model, d_model, bias=bias)  # W_V
        self.output = nn.Linear(d_model, d_model, bias=bias)  # mixes heads

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Return the attended tokens, shape (B, T, d_model).

        Args:
            x: ``(B, T, d_model)`` input.
            mask: Bool mask broadcastable to ``(B, H, T, T)``, True = may
                attend; ``None`` means the causal mask.

        Raises:
            TypeError: If ``x`` is not a floating-point tensor.
            ValueError: If ``x`` is empty or not ``(B, T, d_model)``; mask
                errors as in ``scaled_dot_product_attention``.
        """
        width = {-1: self.d_model}
        check_tensor("x", x, dims=3, floating=True, nonempty=True, sizes=width)
        if mask is None:  # (T, T), broadcast over batch and heads
            mask = causal_mask(x.shape[1], device=x.device)
        q = split_heads(self.query(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        k = split_heads(self.key(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        v = split_heads(self.value(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        attended, _ = scaled_dot_product_attention(q, k, v, mask)  # (B,H,T,dh)
        return self.output(merge_heads(attended))  # (B, T, d)


# chapters/ch01-attention.qmd:840
def attention_pairs(seq_len: int, *, causal: bool = True) -> int:
    """Return how many (query, key) pairs attention scores, per head and layer.

    ``T(T+1)/2`` for ``seq_len = T`` tokens under the causal mask (each token
    scores itself and every earlier token), ``T*T`` without it.

    Raises:
        TypeError: If ``seq_len`` is not an int or ``causal`` not a bool.
        ValueError: If ``seq_len`` is not positive.
    """
    tokens = check_int("seq_len", seq_len, minimum=1)
    causal = check_bool("causal", causal)
    return tokens * (tokens + 1) // 2 if causal else tokens * tokens


def kv_cache_scalars(seq_len: int, d_model: int, *, layers: int = 1) -> int:
    """Return how many numbers a KV cache holds: ``2 * layers * d_model * T``.

    Each of the ``seq_len = T`` tokens leaves one key and one value of width
    ``d_model`` (all heads together) in every layer, so the count grows in
    proportion to ``T``.

    Raises:
        TypeError: If an argument is not an int.
        ValueError: If an argument is not positive.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    d_model = check_int("d_model", d_model, minimum=1)
    layers = check_int("layers", layers, minimum=1)
    return 2 * layers * d_model * seq_len
