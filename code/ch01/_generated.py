# Generated from chapters/ch01-attention.qmd by `python -m longctx.booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
# ruff: noqa: E402, F811, I001
"""Code saved from chapters/ch01-attention.qmd ("Attention from first principles")."""


# chapters/ch01-attention.qmd:175
import math

import torch
from torch import Tensor, nn

from longctx.support import check_int, check_number, describe


def softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """Return the softmax of ``scores`` along ``dim``, computed without overflow (@eq-ch01-softmax).

    The largest entry of each slice is subtracted before ``exp``, so no
    exponential exceeds 1. Entries equal to ``-inf`` get weight exactly 0; a
    slice that is entirely ``-inf`` gets all zeros instead of NaN.

    Args:
        scores: A floating-point tensor of any shape (at least one dimension).
        dim: The dimension whose entries become weights that sum to 1.

    Returns:
        A tensor shaped like ``scores``; each slice along ``dim`` sums to 1,
        or to 0 where every entry was ``-inf``.

    Raises:
        TypeError: If ``scores`` is not a floating-point tensor.
        ValueError: If ``dim`` is not a dimension of ``scores``.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise TypeError(f"softmax needs a floating-point tensor (got {describe(scores)})")
    if scores.dim() == 0 or not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim must be a dimension of the {scores.dim()}-d scores tensor (got {dim})")
    peak = scores.amax(dim=dim, keepdim=True)  # m in @eq-ch01-softmax
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))  # an all -inf slice: shift by 0
    exps = torch.exp(scores - peak)  # every exponent <= 0, so every value lies in [0, 1]
    total = exps.sum(dim=dim, keepdim=True)
    return exps / torch.where(total > 0, total, torch.ones_like(total))  # an empty slice: 0 / 1 = 0


# chapters/ch01-attention.qmd:276
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Return ``(output, weights)`` of scaled dot-product attention (@eq-ch01-attention).

    Each query is scored against every key, the scores are scaled, pairs the
    mask forbids are set to ``-inf``, a row-wise softmax turns scores into
    weights, and the output is the weighted sum of the values.

    Args:
        query: ``(..., T_q, d)`` floating-point tensor.
        key: ``(..., T_k, d)``; leading dimensions broadcast against ``query``'s.
        value: ``(..., T_k, d_v)``.
        mask: Optional bool tensor broadcastable to ``(..., T_q, T_k)``; True
            means "may attend". ``None`` lets every query see every key.
        scale: Multiplier for the scores; ``None`` means ``1 / sqrt(d)``.

    Returns:
        ``output`` of shape ``(..., T_q, d_v)`` and ``weights`` of shape
        ``(..., T_q, T_k)``. A query whose mask row is all False gets zero
        weights and a zero output.

    Raises:
        TypeError: If an input is not a floating-point tensor, the mask is not
            a bool tensor, or ``scale`` is not a number.
        ValueError: If the shapes disagree, or ``scale`` is not positive and finite.
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor (got {describe(tensor)})")
        if tensor.dim() < 2:
            raise ValueError(f"{name} needs at least 2 dimensions (..., tokens, width) (got {describe(tensor)})")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must share one dtype (got {query.dtype}, {key.dtype} and {value.dtype})")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must have the same last dimension d "
            f"(got query {tuple(query.shape)} and key {tuple(key.shape)})"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same number of tokens "
            f"(got key {tuple(key.shape)} and value {tuple(value.shape)})"
        )
    try:
        leading = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "the leading (batch, head) dimensions of query, key and value must broadcast "
            f"(got {tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)})"
        ) from None
    score_shape = torch.Size((*leading, query.shape[-2], key.shape[-2]))
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, True = may attend (got {describe(mask)})")
        try:
            fits = torch.broadcast_shapes(mask.shape, score_shape) == score_shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape {tuple(score_shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])  # 1 / sqrt(d) in @eq-ch01-attention
    else:
        scale = check_number("scale", scale, above=0)

    scores = (query @ key.transpose(-2, -1)) * scale  # (..., T_q, T_k): q_i . k_j / sqrt(d)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # the M of @eq-ch01-attention
    weights = softmax(scores, dim=-1)  # (..., T_q, T_k); rows sum to 1, fully masked rows to 0
    return weights @ value, weights  # (..., T_q, d_v)


# chapters/ch01-attention.qmd:479
def causal_mask(seq_len: int, *, device: torch.device | str | None = None) -> Tensor:
    """Return the causal mask: a bool (seq_len, seq_len) tensor, True where query i may attend key j (j <= i).

    Args:
        seq_len: Number of positions ``T``.
        device: Where to build the mask (default: torch's default device).

    Returns:
        A lower-triangular bool tensor, diagonal included.

    Raises:
        TypeError: If ``seq_len`` is not an int.
        ValueError: If ``seq_len`` is not positive.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


# chapters/ch01-attention.qmd:587
def split_heads(x: Tensor, heads: int) -> Tensor:
    """Return ``x`` reshaped from (B, T, H*d_h) to (B, H, T, d_h): one slice of width d_h per head.

    Raises:
        TypeError: If ``heads`` is not an int.
        ValueError: If ``heads`` is not positive, ``x`` is not 3-d, or its width is not divisible by ``heads``.
    """
    heads = check_int("heads", heads, minimum=1)
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"split_heads expects a (batch, tokens, width) tensor (got {describe(x)})")
    batch, tokens, width = x.shape
    if width % heads:
        raise ValueError(f"the width {width} must be divisible by heads (got heads={heads})")
    head_dim = width // heads
    # (B, T, H*dh) -> (B, T, H, dh) -> (B, H, T, dh)
    return x.view(batch, tokens, heads, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """Return ``x`` reshaped from (B, H, T, d_h) to (B, T, H*d_h), undoing ``split_heads``.

    Raises:
        ValueError: If ``x`` is not a 4-d tensor.
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"merge_heads expects a (batch, heads, tokens, head_dim) tensor (got {describe(x)})")
    batch, heads, tokens, head_dim = x.shape
    # (B, H, T, dh) -> (B, T, H, dh) -> (B, T, H*dh); transpose only relabels strides, so copy first
    return x.transpose(1, 2).contiguous().view(batch, tokens, heads * head_dim)


# chapters/ch01-attention.qmd:625
class MultiHeadAttention(nn.Module):
    """Multi-head self-attention: H heads of @eq-ch01-attention side by side, mixed by an output layer.

    Args:
        d_model: Width of each token's vector.
        heads: Number of heads ``H``; must divide ``d_model``. Each head has width ``d_model // heads``.
        bias: Whether the four linear layers have biases.

    Raises:
        TypeError: If ``d_model`` or ``heads`` is not an int.
        ValueError: If either is not positive, or ``heads`` does not divide ``d_model``.
    """

    def __init__(self, d_model: int, heads: int, *, bias: bool = False) -> None:
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        heads = check_int("heads", heads, minimum=1)
        if d_model % heads:
            raise ValueError(f"d_model must be divisible by heads (got d_model={d_model}, heads={heads})")
        self.d_model = d_model
        self.heads = heads
        self.head_dim = d_model // heads
        self.query = nn.Linear(d_model, d_model, bias=bias)  # W_Q
        self.key = nn.Linear(d_model, d_model, bias=bias)  # W_K
        self.value = nn.Linear(d_model, d_model, bias=bias)  # W_V
        self.output = nn.Linear(d_model, d_model, bias=bias)  # mixes the concatenated heads

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Return the attended tokens, shape (B, T, d_model).

        Args:
            x: ``(B, T, d_model)`` input.
            mask: Bool mask broadcastable to ``(B, H, T, T)``, True = may attend;
                ``None`` means the causal mask.

        Raises:
            ValueError: If ``x`` is not ``(B, T, d_model)``; mask errors as in
                ``scaled_dot_product_attention``.
        """
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, tokens, {self.d_model}) (got {describe(x)})")
        if mask is None:
            mask = causal_mask(x.shape[1], device=x.device)  # (T, T), broadcast over batch and heads
        q = split_heads(self.query(x), self.heads)  # (B, T, d_model) -> (B, H, T, dh)
        k = split_heads(self.key(x), self.heads)  # (B, T, d_model) -> (B, H, T, dh)
        v = split_heads(self.value(x), self.heads)  # (B, T, d_model) -> (B, H, T, dh)
        attended, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, dh)
        return self.output(merge_heads(attended))  # (B, H, T, dh) -> (B, T, d_model) -> (B, T, d_model)


# chapters/ch01-attention.qmd:749
def attention_pairs(seq_len: int, *, causal: bool = True) -> int:
    """Return how many (query, key) pairs attention scores over ``seq_len`` tokens, per head per layer.

    ``T(T+1)/2`` with the causal mask (each token scores itself and every
    earlier token), ``T*T`` without it.

    Raises:
        TypeError: If ``seq_len`` is not an int.
        ValueError: If ``seq_len`` is not positive.
    """
    tokens = check_int("seq_len", seq_len, minimum=1)
    return tokens * (tokens + 1) // 2 if causal else tokens * tokens


def kv_cache_scalars(seq_len: int, d_model: int, *, layers: int = 1) -> int:
    """Return how many numbers a multi-head attention KV cache holds for ``seq_len`` tokens: ``2 * layers * d_model * seq_len``.

    Each token leaves one key and one value of width ``d_model`` (all heads
    together) in every layer, so the count grows in proportion to ``seq_len``.

    Raises:
        TypeError: If an argument is not an int.
        ValueError: If an argument is not positive.
    """
    seq_len = check_int("seq_len", seq_len, minimum=1)
    d_model = check_int("d_model", d_model, minimum=1)
    layers = check_int("layers", layers, minimum=1)
    return 2 * layers * d_model * seq_len
