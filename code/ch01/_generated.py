# Generated from chapters/ch01-attention.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch01-attention.qmd ("Attention from first principles")."""

import math

import torch
from torch import Tensor, nn

from longctx.support import check_bool, check_divides, check_int


# chapters/ch01-attention.qmd:210
def softmax(scores: Tensor, dim: int = -1) -> Tensor:
    """Return the softmax of float ``scores`` along ``dim``, shaped like them.

    Equation 1.1: subtract each slice's largest entry, exponentiate, divide
    by the slice's sum, so no exponential exceeds 1 and each slice sums to
    1. A ``-inf`` entry gets weight exactly 0; a slice that is all ``-inf``
    gets zeros instead of NaN.
    """
    peak = scores.amax(dim=dim, keepdim=True)  # m in Equation 1.1
    finite = torch.isfinite(peak)
    peak = torch.where(finite, peak, torch.zeros_like(peak))  # all -inf: 0
    exps = torch.exp(scores - peak)  # every exponent <= 0: values in [0, 1]
    total = exps.sum(dim=dim, keepdim=True)
    ones = torch.ones_like(total)
    return exps / torch.where(total > 0, total, ones)  # empty slice: 0 / 1


# chapters/ch01-attention.qmd:298
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Return ``(output, weights)`` of scaled dot-product attention.

    Equation 1.2: score every query against every key, multiply by
    ``scale`` (``1 / sqrt(d)`` by default), set the pairs ``mask`` forbids
    to ``-inf``, softmax each row into weights, blend the values with them.

    ``query`` is (..., T_q, d), ``key`` (..., T_k, d), ``value``
    (..., T_k, d_v); ``mask`` is a bool tensor that broadcasts to
    (..., T_q, T_k), True where a query may attend. ``output`` is
    (..., T_q, d_v) and ``weights`` (..., T_q, T_k); a query that may see
    no key gets zero weights and a zero output.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])  # 1 / sqrt(d), Equation 1.2
    # (..., T_q, d) @ (..., d, T_k) -> (..., T_q, T_k): q_i . k_j * scale
    scores = (query @ key.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # M of Equation 1.2
    weights = softmax(scores, dim=-1)  # rows sum to 1; fully masked rows to 0
    return weights @ value, weights  # (..., T_q, d_v), (..., T_q, T_k)


# chapters/ch01-attention.qmd:478
def causal_mask(
    seq_len: int, *, device: torch.device | str | None = None
) -> Tensor:
    """Return the (T, T) causal mask: True where query i may attend key j <= i.

    The lower triangle of a ``seq_len`` by ``seq_len`` bool tensor, diagonal
    included, built on ``device``.
    """
    full = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    return full.tril()  # keep j <= i


# chapters/ch01-attention.qmd:590
def split_heads(x: Tensor, heads: int) -> Tensor:
    """Return ``x`` reshaped from (B, T, H*d_h) to (B, H, T, d_h).

    Head ``h`` gets the ``h``-th slice of width ``d_h`` of each token.
    """
    batch, tokens, width = x.shape
    head_dim = width // heads
    # (B, T, H*dh) -> (B, T, H, dh) -> (B, H, T, dh)
    return x.reshape(batch, tokens, heads, head_dim).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """Return ``x`` reshaped from (B, H, T, d_h) to (B, T, H*d_h).

    It undoes ``split_heads``.
    """
    batch, heads, tokens, head_dim = x.shape
    # (B, H, T, dh) -> (B, T, H, dh) -> (B, T, H*dh); the transpose only
    # relabels strides, so the reshape copies the heads side by side
    return x.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


# chapters/ch01-attention.qmd:622
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
        """Build the four projections; the Args are the class's."""
        super().__init__()
        d_model = check_int("d_model", d_model, minimum=1)
        heads = check_int("heads", heads, minimum=1)
        check_divides("heads", heads, "d_model", d_model)
        bias = check_bool("bias", bias)
        self.d_model = d_model
        self.heads = heads
        self.head_dim = d_model // heads
        self.query = nn.Linear(d_model, d_model, bias=bias)  # W_Q
        self.key = nn.Linear(d_model, d_model, bias=bias)  # W_K
        self.value = nn.Linear(d_model, d_model, bias=bias)  # W_V
        self.output = nn.Linear(d_model, d_model, bias=bias)  # mixes heads

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Return the attended tokens (B, T, d_model) for ``x`` (B, T, d_model).

        ``mask`` is a bool tensor that broadcasts to (B, H, T, T), True where
        a query may attend; ``None`` means the causal mask.
        """
        if mask is None:  # (T, T), broadcast over batch and heads
            mask = causal_mask(x.shape[1], device=x.device)
        q = split_heads(self.query(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        k = split_heads(self.key(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        v = split_heads(self.value(x), self.heads)  # (B, T, d) -> (B, H, T, dh)
        attended, _ = scaled_dot_product_attention(q, k, v, mask)  # (B,H,T,dh)
        return self.output(merge_heads(attended))  # (B, T, d)


# chapters/ch01-attention.qmd:768
def attention_pairs(seq_len: int, *, causal: bool = True) -> int:
    """Return how many (query, key) pairs attention scores, per head and layer.

    ``T(T+1)/2`` for ``seq_len = T`` tokens under the causal mask (each token
    scores itself and every earlier token), ``T*T`` without it. A negative
    length, which would give a count that looks right, is refused.
    """
    tokens = check_int("seq_len", seq_len, minimum=0)
    causal = check_bool("causal", causal)
    return tokens * (tokens + 1) // 2 if causal else tokens * tokens


def kv_cache_scalars(seq_len: int, d_model: int, *, layers: int = 1) -> int:
    """Return how many numbers a KV cache holds: ``2 * layers * d_model * T``.

    Each of the ``seq_len = T`` tokens leaves one key and one value of width
    ``d_model`` (all heads together) in every layer, so the count grows in
    proportion to ``T``. Negative sizes are refused.
    """
    seq_len = check_int("seq_len", seq_len, minimum=0)
    d_model = check_int("d_model", d_model, minimum=0)
    layers = check_int("layers", layers, minimum=0)
    return 2 * layers * d_model * seq_len
