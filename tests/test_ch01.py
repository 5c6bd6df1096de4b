"""Tests for Chapter 1's saved code (longctx.ch01): values, invariants, agreement with PyTorch, bad inputs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from longctx import ch01

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- values


def test_softmax_of_known_vector_matches_hand_computation():
    scores = torch.tensor([2.0, 1.0, 0.0])
    total = math.exp(2) + math.exp(1) + 1
    expected = torch.tensor([math.exp(2) / total, math.exp(1) / total, 1 / total])
    assert torch.allclose(ch01.softmax(scores), expected, atol=1e-7)


def test_attention_on_the_chapters_worked_example():
    query = torch.tensor([[2.0, 0.0, 2.0, 0.0]])
    key = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    value = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    output, weights = ch01.scaled_dot_product_attention(query, key, value)
    # scores q.k / sqrt(4) = (2, 0, 1)
    total = math.exp(2) + 1 + math.exp(1)
    expected_weights = torch.tensor([[math.exp(2) / total, 1 / total, math.exp(1) / total]])
    expected_output = torch.tensor([[(math.exp(2) + math.exp(1)) / total, (1 + math.exp(1)) / total]])
    assert torch.allclose(weights, expected_weights, atol=1e-6)
    assert torch.allclose(output, expected_output, atol=1e-6)
    assert output[0].tolist() == pytest.approx([0.910, 0.335], abs=1e-3)


def test_explicit_scale_replaces_the_default():
    query, key, value = torch.ones(1, 2), torch.eye(2), torch.eye(2)
    _, weights = ch01.scaled_dot_product_attention(query, key, value, scale=1.0)
    assert torch.allclose(weights, torch.full((1, 2), 0.5))
    query = torch.tensor([[3.0, 0.0]])
    _, weights = ch01.scaled_dot_product_attention(query, key, value, scale=2)
    assert torch.allclose(weights, torch.softmax(torch.tensor([[6.0, 0.0]]), dim=-1))


def test_attention_pairs_formula_values():
    assert ch01.attention_pairs(1) == 1
    assert ch01.attention_pairs(4) == 10
    assert ch01.attention_pairs(4, causal=False) == 16
    assert ch01.attention_pairs(131_072) == 131_072 * 131_073 // 2


def test_kv_cache_scalars_is_two_layers_width_tokens():
    assert ch01.kv_cache_scalars(10, 128) == 2 * 128 * 10
    assert ch01.kv_cache_scalars(4096, 4096, layers=32) == 2 * 32 * 4096 * 4096


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_softmax_rows_sum_to_one_and_match_torch(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 5, 7, generator=generator) * 10
    for dim in (0, 1, -1):
        weights = ch01.softmax(scores, dim=dim)
        assert torch.allclose(weights.sum(dim=dim), torch.ones(()), atol=1e-6)
        assert torch.allclose(weights, torch.softmax(scores, dim=dim), atol=1e-6)
        assert (weights >= 0).all()


def test_softmax_large_logits_do_not_overflow():
    large = torch.tensor([1000.0, 1001.0, 1002.0])
    naive = torch.exp(large) / torch.exp(large).sum()
    assert naive.isnan().all()  # the failure the chapter shows
    stable = ch01.softmax(large)
    assert torch.isfinite(stable).all()
    assert torch.allclose(stable, ch01.softmax(torch.tensor([0.0, 1.0, 2.0])))
    half = ch01.softmax(torch.tensor([60000.0, 60001.0], dtype=torch.float16))
    assert torch.isfinite(half).all() and half.sum().item() == pytest.approx(1.0, abs=1e-3)


def test_softmax_gives_minus_inf_entries_zero_weight():
    weights = ch01.softmax(torch.tensor([1.0, float("-inf"), 3.0]))
    assert weights[1].item() == 0.0
    assert weights.sum().item() == pytest.approx(1.0)


def test_softmax_fully_masked_row_gives_zeros_not_nan_and_finite_gradient():
    scores = torch.tensor([[float("-inf")] * 4, [0.0, 1.0, float("-inf"), 2.0]], requires_grad=True)
    weights = ch01.softmax(scores)
    assert not weights.isnan().any()
    assert weights[0].eq(0).all()
    assert weights[1].sum().item() == pytest.approx(1.0)
    (weights * torch.arange(4.0)).sum().backward()
    assert torch.isfinite(scores.grad).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_attention_weights_rows_sum_to_one_and_masked_pairs_get_zero(seed):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 3, 5, 4, generator=generator)
    key = torch.randn(2, 3, 6, 4, generator=generator)
    value = torch.randn(2, 3, 6, 2, generator=generator)
    mask = torch.rand(2, 1, 5, 6, generator=generator) < 0.5
    mask[..., 0] = True  # every query may see at least one key
    output, weights = ch01.scaled_dot_product_attention(query, key, value, mask)
    assert output.shape == (2, 3, 5, 2) and weights.shape == (2, 3, 5, 6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5), atol=1e-6)
    assert weights.masked_select(~mask.expand_as(weights)).eq(0).all()


def test_attention_fully_masked_row_gives_zero_output_without_nan():
    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(4, 3, generator=generator) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    output, weights = ch01.scaled_dot_product_attention(query, key, value, mask)
    assert not output.isnan().any() and not weights.isnan().any()
    assert output[2].eq(0).all() and weights[2].eq(0).all()


def test_attention_matches_torch_functional_with_broadcast_mask_and_scale():
    generator = torch.Generator().manual_seed(4)
    query = torch.randn(2, 3, 5, 8, generator=generator)
    key = torch.randn(2, 3, 7, 8, generator=generator)
    value = torch.randn(2, 3, 7, 6, generator=generator)
    mask = torch.rand(5, 7, generator=generator) < 0.6
    mask[:, 0] = True
    ours, _ = ch01.scaled_dot_product_attention(query, key, value, mask, scale=0.3)
    reference = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3)
    assert torch.allclose(ours, reference, atol=1e-5)


@pytest.mark.parametrize("seq_len", [1, 2, 5, 17])
def test_causal_mask_matches_brute_force(seq_len):
    mask = ch01.causal_mask(seq_len)
    assert mask.dtype == torch.bool and mask.shape == (seq_len, seq_len)
    for i in range(seq_len):
        for j in range(seq_len):
            assert bool(mask[i, j]) == (j <= i)


def test_causal_attention_output_ignores_later_tokens():
    generator = torch.Generator().manual_seed(5)
    query, key, value = (torch.randn(6, 4, generator=generator) for _ in range(3))
    before, _ = ch01.scaled_dot_product_attention(query, key, value, ch01.causal_mask(6))
    key2, value2 = key.clone(), value.clone()
    key2[4:] = torch.randn(2, 4, generator=generator) * 50
    value2[4:] = 99.0
    after, _ = ch01.scaled_dot_product_attention(query, key2, value2, ch01.causal_mask(6))
    assert torch.equal(before[:4], after[:4])


@pytest.mark.parametrize(("batch", "tokens", "heads", "head_dim"), [(1, 1, 1, 4), (2, 5, 4, 3), (3, 7, 2, 8)])
def test_split_then_merge_heads_is_identity(batch, tokens, heads, head_dim):
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(batch, tokens, heads * head_dim, generator=generator)
    split = ch01.split_heads(x, heads)
    assert split.shape == (batch, heads, tokens, head_dim)
    for h in range(heads):  # head h is the h-th slice of width head_dim
        assert torch.equal(split[:, h], x[..., h * head_dim : (h + 1) * head_dim])
    assert torch.equal(ch01.merge_heads(split), x)


def _reference_mha(module: ch01.MultiHeadAttention, x: torch.Tensor, **kwargs) -> torch.Tensor:
    """The module's output computed with torch's fused attention, written without the chapter's helpers."""
    batch, tokens, width = x.shape
    heads, head_dim = module.heads, width // module.heads

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, tokens, heads, head_dim).permute(0, 2, 1, 3)

    q, k, v = (heads_first(layer(x)) for layer in (module.query, module.key, module.value))
    attended = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return module.output(attended.permute(0, 2, 1, 3).reshape(batch, tokens, width))


@pytest.mark.parametrize(
    ("seed", "batch", "tokens", "d_model", "heads", "bias"),
    [(0, 1, 1, 8, 1, False), (1, 2, 7, 32, 4, False), (2, 3, 12, 24, 6, True), (3, 1, 16, 16, 16, False)],
)
def test_multihead_attention_matches_torch_sdpa(seed, batch, tokens, d_model, heads, bias):
    torch.manual_seed(seed)
    module = ch01.MultiHeadAttention(d_model, heads, bias=bias)
    generator = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(batch, tokens, d_model, generator=generator)
    with torch.no_grad():
        causal = module(x)
        assert causal.shape == (batch, tokens, d_model)
        assert torch.allclose(causal, _reference_mha(module, x, is_causal=True), atol=1e-5)

        everything = torch.ones(tokens, tokens, dtype=torch.bool)
        assert torch.allclose(module(x, everything), _reference_mha(module, x), atol=1e-5)

        mask = torch.rand(batch, 1, tokens, tokens, generator=generator) < 0.5
        mask |= torch.eye(tokens, dtype=torch.bool)
        assert torch.allclose(module(x, mask), _reference_mha(module, x, attn_mask=mask), atol=1e-5)


def test_multihead_attention_has_the_contracted_layers():
    module = ch01.MultiHeadAttention(12, 3)
    for name in ("query", "key", "value", "output"):
        layer = getattr(module, name)
        assert isinstance(layer, torch.nn.Linear)
        assert (layer.in_features, layer.out_features) == (12, 12)
        assert layer.bias is None
    assert ch01.MultiHeadAttention(12, 3, bias=True).query.bias is not None
    assert module.head_dim == 4


@pytest.mark.parametrize("seq_len", [1, 2, 3, 10, 33])
def test_attention_pairs_matches_brute_force_count(seq_len):
    causal_count = sum(1 for i in range(seq_len) for j in range(seq_len) if j <= i)
    assert ch01.attention_pairs(seq_len) == causal_count == int(ch01.causal_mask(seq_len).sum())
    assert ch01.attention_pairs(seq_len, causal=False) == seq_len * seq_len


# --------------------------------------------------------------------------- docstrings


def _equation_numbers(chapter: str) -> dict[str, str]:
    """Map each equation label of a chapter to the number Quarto gives it (1.1, 1.2, ...)."""
    text = (ROOT / "chapters" / chapter).read_text(encoding="utf-8")
    labels = re.findall(r"\{#(eq-ch(\d\d)-[a-z0-9-]+)\}", text)
    return {label: f"{int(number)}.{i}" for i, (label, number) in enumerate(labels, start=1)}


def test_docstrings_name_equations_by_number_not_by_quarto_label():
    numbers = _equation_numbers("ch01-attention.qmd")
    assert numbers == {"eq-ch01-softmax": "1.1", "eq-ch01-attention": "1.2"}
    assert f"Equation {numbers['eq-ch01-softmax']}:" in ch01.softmax.__doc__
    assert f"Equation {numbers['eq-ch01-attention']}:" in ch01.scaled_dot_product_attention.__doc__
    assert f"Equation {numbers['eq-ch01-attention']}" in ch01.MultiHeadAttention.__doc__
    generated = (ROOT / "code" / "ch01" / "_generated.py").read_text(encoding="utf-8")
    assert not re.findall(r"@(?:eq|sec|fig|tbl)-", generated)


# --------------------------------------------------------------------------- bad inputs
# Chapter 1's boundaries are the layer's constructor and the two counts a reader calls with
# sizes; the counts also refuse the value that would pass unnoticed (a negative size). The kernels leave bad shapes to PyTorch;
# tests/test_bad_input.py sweeps the boundary and the silent cases of every chapter.


def test_multihead_attention_constructor_names_the_bad_size():
    with pytest.raises(ValueError, match=r"^heads must divide d_model \(got heads=3 and d_model=10\)$"):
        ch01.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match=r"^heads must be a positive integer \(got 0\)$"):
        ch01.MultiHeadAttention(8, 0)
    with pytest.raises(TypeError, match=r"^d_model must be an int \(got float 8.0\)$"):
        ch01.MultiHeadAttention(8.0, 2)
    with pytest.raises(TypeError, match=r"^bias must be True or False \(got str 'no'\)$"):
        ch01.MultiHeadAttention(8, 2, bias="no")


def test_counts_refuse_negative_sizes_and_count_zero_as_nothing():
    assert ch01.attention_pairs(0) == 0 and ch01.kv_cache_scalars(0, 8, layers=2) == 0
    with pytest.raises(ValueError, match=r"^seq_len must be an integer >= 0 \(got -3\)$"):
        ch01.attention_pairs(-3)  # -3 * -2 // 2 = 3 pairs: a count that looks plausible
    for arguments in ((-1, 8), (4, -8), (4, 8, -2)):
        with pytest.raises(ValueError, match=r"must be an integer >= 0"):
            ch01.kv_cache_scalars(*arguments[:2], layers=arguments[2] if len(arguments) > 2 else 1)
    with pytest.raises(TypeError, match=r"^seq_len must be an int \(got float 2.0\)$"):
        ch01.attention_pairs(2.0)
    with pytest.raises(TypeError, match=r"^causal must be True or False \(got int 0\)$"):
        ch01.attention_pairs(4, causal=0)


def test_numpy_integers_are_accepted_as_counts():
    np = pytest.importorskip("numpy")
    assert ch01.attention_pairs(np.int64(4)) == 10
    assert ch01.MultiHeadAttention(np.int64(8), np.int64(2)).head_dim == 4


def test_kernels_leave_mismatched_shapes_to_pytorch():
    """The attention's shape contract is its docstring; a width mismatch fails in the matrix product."""
    q = torch.zeros(2, 4)
    with pytest.raises(RuntimeError):
        ch01.scaled_dot_product_attention(q, torch.zeros(3, 5), torch.zeros(3, 4))
    with pytest.raises(RuntimeError):
        ch01.scaled_dot_product_attention(q, torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(RuntimeError):  # an integer mask cannot stand for "may attend"
        ch01.scaled_dot_product_attention(q, torch.zeros(3, 4), torch.zeros(3, 4), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(RuntimeError):
        ch01.split_heads(torch.zeros(1, 2, 10), 3)


def test_split_heads_accepts_a_non_contiguous_input():
    x = torch.arange(24.0).reshape(3, 2, 4).transpose(0, 1)  # (2, 3, 4), not contiguous
    assert torch.equal(ch01.merge_heads(ch01.split_heads(x, 2)), x)
