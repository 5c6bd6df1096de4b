"""Tests for Chapter 4 (efficient architectures): the chapter's numbers, its invariants, its errors."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from longctx import ch01, ch02, ch03, ch04
from torch.utils._python_dispatch import TorchDispatchMode

SEEDS = range(5)


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_sizes(seed: int, **bounds: tuple[int, int]) -> dict[str, int]:
    generator = torch.Generator().manual_seed(1000 + seed)
    return {name: int(torch.randint(low, high + 1, (1,), generator=generator)) for name, (low, high) in bounds.items()}


# --------------------------------------------------------------------------- the two bills


def test_context_cost_matches_the_worked_numbers():
    assert ch04.context_cost(1)["kv_bytes"] == 131_072 == 2 * 32 * 8 * 128 * 2
    bill = ch04.context_cost(131_072)
    assert bill["pairs_per_head_per_layer"] == 17_179_869_184
    assert bill["causal_pairs_per_head_per_layer"] == 131_072 * 131_073 // 2
    assert bill["kv_bytes"] == 17_179_869_184
    assert round(ch04.context_cost(128_000)["kv_bytes"] / 1e9, 1) == 16.8
    assert round(ch04.context_cost(1_048_576)["kv_bytes"] / 1e9, 1) == 137.4
    assert round(ch04.context_cost(8_192)["kv_bytes"] / 1e9, 1) == 1.1
    pairs = [ch04.context_cost(n)["pairs_per_head_per_layer"] for n in (8_192, 131_072, 1_048_576)]
    assert pairs[2] // pairs[1] == 64 and pairs[2] // pairs[0] == 16_384


def test_context_cost_uses_chapter3_kv_bytes_for_any_config():
    config = ch03.KVConfig(name="x", layers=3, query_heads=4, head_dim=16, bytes_per_scalar=4, kv_heads=2)
    for tokens in (0, 1, 7, 1000):
        assert ch04.context_cost(tokens, config)["kv_bytes"] == ch03.kv_bytes(config, tokens)


def test_running_example_matches_the_shipped_llama_config():
    shipped = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
    for tokens in (1, 4096, 131_072):
        assert ch03.kv_bytes(shipped, tokens) == ch03.kv_bytes(ch04.RUNNING_EXAMPLE, tokens)
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    assert ch04.window_reach(mistral.window, mistral.layers) == 131_040


def test_context_cost_rejects_bad_tokens():
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        ch04.context_cost(-1)
    with pytest.raises(TypeError, match="tokens must be an int"):
        ch04.context_cost(2.5)


# --------------------------------------------------------------------------- sliding windows


def test_window_worked_example():
    mask = ch03.visibility_mask(8, window=3)
    assert ch04.pairs_computed(mask) == 21
    assert ch04.pairs_computed(ch01.causal_mask(8)) == 36
    field = ch04.receptive_field(mask, 3)
    assert field[7, 1] and not field[7, 0]
    assert ch04.window_reach(3, 3) == 6
    assert ch04.window_reach(4096, 32) == 131_040
    assert ch04.hops_needed(131_040, 4096) == 32
    assert ch04.hops_needed(99_999, 4096) == 25


@pytest.mark.parametrize("seed", SEEDS)
def test_receptive_field_reaches_exactly_layers_times_window_minus_one(seed):
    sizes = random_sizes(seed, tokens=(5, 30), window=(1, 6), layers=(0, 5))
    n, w, layers = sizes["tokens"], sizes["window"], sizes["layers"]
    field = ch04.receptive_field(ch03.visibility_mask(n, window=w), layers)
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    expected = (distance >= 0) & (distance <= ch04.window_reach(w, layers))
    assert torch.equal(field, expected)


def test_window_band_after_three_layers_is_ten_wide():
    field = ch04.receptive_field(ch03.visibility_mask(16, window=4), 3)
    assert int(field.sum(dim=1).max()) == 10


@pytest.mark.parametrize("seed", SEEDS)
def test_rolling_buffer_equals_masked_attention_and_never_exceeds_window(seed):
    sizes = random_sizes(seed, tokens=(1, 40), window=(1, 9), width=(1, 8), batch=(1, 3))
    t, w = sizes["tokens"], sizes["window"]
    q, k = randn(sizes["batch"], t, sizes["width"], seed=seed), randn(sizes["batch"], t, sizes["width"], seed=seed + 50)
    v = randn(sizes["batch"], t, 5, seed=seed + 99)
    streamed, largest = ch04.sliding_window_decode(q, k, v, w)
    masked, _ = ch01.scaled_dot_product_attention(q, k, v, ch03.visibility_mask(t, window=w))
    assert torch.allclose(streamed, masked, atol=1e-12)
    assert largest == min(t, w) <= w


def test_rolling_buffer_slots_follow_t_mod_w():
    assert ch04.rolling_buffer_slots(10, 4) == [8, 9, 6, 7]
    assert ch04.rolling_buffer_slots(11, 4) == [8, 9, 10, 7]
    assert ch04.rolling_buffer_slots(2, 4) == [0, 1, -1, -1]


def test_window_functions_reject_bad_input():
    q = randn(5, 4, seed=0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ch04.sliding_window_decode(q, q, q, 0)
    with pytest.raises(ValueError, match="equal shapes"):
        ch04.sliding_window_decode(q, randn(6, 4, seed=1), q, 2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ch04.window_reach(0, 3)
    with pytest.raises(ValueError, match="layers must be >= 0"):
        ch04.receptive_field(ch01.causal_mask(3), -1)
    with pytest.raises(ValueError, match="square"):
        ch04.receptive_field(torch.ones(2, 3, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="window must be >= 2"):
        ch04.hops_needed(5, 1)
    with pytest.raises(ValueError, match="tokens_seen must be >= 0"):
        ch04.rolling_buffer_slots(-1, 3)
    with pytest.raises(TypeError, match="bool"):
        ch04.pairs_computed(torch.ones(2, 2))


# --------------------------------------------------------------------------- sparse patterns


def test_sparse_pair_counts_at_sixteen_tokens():
    assert ch04.pairs_computed(ch01.causal_mask(16)) == 136
    assert ch04.pairs_computed(ch03.visibility_mask(16, window=4)) == 58
    assert ch04.pairs_computed(ch04.global_local_mask(16, 4, (0,))) == 70
    assert ch04.pairs_computed(ch04.strided_mask(16, 4)) == 82
    assert ch04.strided_mask(16, 4)[13].nonzero().flatten().tolist() == [1, 5, 9, 10, 11, 12, 13]


def test_causal_global_token_is_a_sink_and_gives_no_two_hop_path():
    causal_global = ch04.global_local_mask(16, 4, (0,))
    assert torch.equal(causal_global, ch03.visibility_mask(16, window=4, sinks=1))
    assert causal_global[0].sum() == 1  # the global token reads only itself
    earlier = ch01.causal_mask(16)
    assert not ch04.receptive_field(causal_global, 2)[earlier].all()
    encoder_global = ch04.global_local_mask(16, 4, (0,), causal=False)
    assert ch04.receptive_field(encoder_global, 2).all()
    assert not ch04.receptive_field(encoder_global, 1)[15, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_strided_mask_matches_its_definition_and_reaches_everything_in_two_hops(seed):
    sizes = random_sizes(seed, tokens=(1, 40), stride=(1, 7))
    n, s = sizes["tokens"], sizes["stride"]
    mask = ch04.strided_mask(n, s)
    brute = [[i >= j and (i - j < s or (i - j) % s == 0) for j in range(n)] for i in range(n)]
    assert mask.tolist() == brute
    assert ch04.receptive_field(mask, 2)[ch01.causal_mask(n)].all()


@pytest.mark.parametrize("seed", SEEDS)
def test_sparse_masks_give_skipped_pairs_exactly_zero_weight_in_chapter1_attention(seed):
    sizes = random_sizes(seed, tokens=(2, 24), window=(1, 6), stride=(1, 6))
    n = sizes["tokens"]
    query, key, value = (randn(n, 8, seed=seed + k) for k in range(3))
    for mask in (ch04.strided_mask(n, sizes["stride"]), ch04.global_local_mask(n, sizes["window"], (0,))):
        _, weights = ch01.scaled_dot_product_attention(query, key, value, mask)
        assert (weights[~mask] == 0).all()
        assert torch.allclose(weights.sum(dim=-1), torch.ones(n, dtype=weights.dtype))


def test_sparse_masks_reject_bad_input():
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ch04.strided_mask(8, 0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ch04.global_local_mask(8, 0)
    with pytest.raises(ValueError, match="global tokens must lie in"):
        ch04.global_local_mask(8, 2, (8,))
    with pytest.raises(ValueError, match="seq_len must be >= 0"):
        ch04.strided_mask(-1, 2)


# --------------------------------------------------------------------------- block-sparse attention


@pytest.mark.parametrize("seed", SEEDS)
def test_window_block_mask_matches_the_token_mask(seed):
    sizes = random_sizes(seed, tokens=(1, 50), window=(1, 12), block=(1, 9))
    n, w, b = sizes["tokens"], sizes["window"], sizes["block"]
    blocks = ch04.sliding_window_block_mask(n, w, b)
    token_mask = ch03.visibility_mask(n, window=w)
    n_blocks = math.ceil(n / b)
    brute = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    for i, j in token_mask.nonzero().tolist():
        brute[i // b, j // b] = True
    assert torch.equal(blocks, brute)


@pytest.mark.parametrize("seed", SEEDS)
def test_block_sparse_attention_equals_dense_masked_attention(seed):
    sizes = random_sizes(seed, tokens=(1, 45), window=(1, 10), block=(1, 8), width=(1, 6))
    n, w, b = sizes["tokens"], sizes["window"], sizes["block"]
    q, k = randn(2, n, sizes["width"], seed=seed), randn(2, n, sizes["width"], seed=seed + 7)
    v = randn(2, n, 3, seed=seed + 13)
    blocks = ch04.sliding_window_block_mask(n, w, b)
    window = ch03.visibility_mask(n, window=w)
    dense, _ = ch01.scaled_dot_product_attention(q, k, v, window)
    sparse = ch04.block_sparse_attention(q, k, v, blocks, b, token_mask=window)
    assert torch.allclose(sparse, dense, atol=1e-12)
    tiles = ch04.expand_block_mask(blocks, b, n)
    dense_tiles, _ = ch01.scaled_dot_product_attention(q, k, v, tiles)
    assert torch.allclose(ch04.block_sparse_attention(q, k, v, blocks, b), dense_tiles, atol=1e-12)


def test_block_sparse_worked_numbers():
    tiles = ch04.sliding_window_block_mask(64, 8, 8)
    assert int(tiles.sum()) == 15
    long_tiles = ch04.sliding_window_block_mask(131_072, 4096, 128)
    assert round(100 * long_tiles.sum().item() / long_tiles.numel(), 1) == 3.2


def test_block_sparse_rejects_bad_input():
    q = randn(8, 4, seed=0)
    good = ch04.sliding_window_block_mask(8, 2, 2)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        ch04.block_sparse_attention(q, q, q, good, 0)
    with pytest.raises(ValueError, match=r"block_mask must be bool of shape \(4, 4\)"):
        ch04.block_sparse_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="outside the tiles"):
        ch04.block_sparse_attention(q, q, q, good, 2, token_mask=ch01.causal_mask(8))
    with pytest.raises(ValueError, match="equal shapes"):
        ch04.block_sparse_attention(q, randn(7, 4, seed=1), q, good, 2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ch04.sliding_window_block_mask(8, 0, 4)


# --------------------------------------------------------------------------- linear attention


def test_linear_attention_worked_example():
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[2.0], [4.0], [6.0]], dtype=torch.float64)
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    assert ch04.feature_map(keys).tolist() == [[2.0, 1.0], [1.0, 2.0], [2.0, 2.0]]
    out, (pot, total) = ch04.linear_attention_recurrent(queries, keys, values)
    assert pot.flatten().tolist() == [20.0, 22.0] and total.tolist() == [5.0, 5.0]
    assert out[2, 0].item() == pytest.approx(62 / 15, abs=1e-12)
    assert round(out[2, 0].item(), 2) == 4.13
    soft, _ = ch01.scaled_dot_product_attention(queries, keys, values, ch01.causal_mask(3), scale=1.0)
    assert soft[2, 0].item() == pytest.approx(4.0, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_attention_forms_agree(seed):
    sizes = random_sizes(seed, tokens=(1, 60), d_k=(1, 6), d_v=(1, 5), chunk=(1, 17))
    t = sizes["tokens"]
    q, k = randn(2, t, sizes["d_k"], seed=seed), randn(2, t, sizes["d_k"], seed=seed + 3)
    v = randn(2, t, sizes["d_v"], seed=seed + 5)
    quadratic = ch04.linear_attention_quadratic(q, k, v)
    recurrent, (pot, total) = ch04.linear_attention_recurrent(q, k, v)
    chunked = ch04.linear_attention_chunked(q, k, v, chunk_size=sizes["chunk"])
    assert torch.allclose(recurrent, quadratic, atol=1e-10)
    assert torch.allclose(chunked, quadratic, atol=1e-10)
    assert pot.shape == (2, sizes["d_k"], sizes["d_v"]) and total.shape == (2, sizes["d_k"])
    split = t // 2
    first, state = ch04.linear_attention_recurrent(q[:, :split], k[:, :split], v[:, :split])
    rest, _ = ch04.linear_attention_recurrent(q[:, split:], k[:, split:], v[:, split:], state=state)
    assert torch.allclose(torch.cat([first, rest], dim=1), quadratic, atol=1e-10)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation creates while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_long_sequence_paths_never_build_a_tokens_by_tokens_matrix():
    tokens, width, chunk = 1024, 2, 32
    q, k, v = randn(tokens, width, seed=1), randn(tokens, width, seed=2), randn(tokens, width, seed=3)
    with LargestTensor() as chunked_mode:
        chunked = ch04.linear_attention_chunked(q, k, v, chunk_size=chunk)
    blocks = ch04.sliding_window_block_mask(tokens, chunk, chunk)
    with LargestTensor() as block_mode:
        windowed = ch04.block_sparse_attention(q, k, v, blocks, chunk)
    assert chunked_mode.largest <= max(chunk * chunk, tokens * width) < tokens * tokens // 100
    assert block_mode.largest <= max(chunk * 2 * chunk, tokens * width) < tokens * tokens // 100
    recurrent, _ = ch04.linear_attention_recurrent(q[-100:], k[-100:], v[-100:], state=_state_before(q, k, v, tokens - 100))
    assert torch.allclose(chunked[-100:], recurrent, atol=1e-9)
    dense, _ = ch01.scaled_dot_product_attention(q, k, v, ch04.expand_block_mask(blocks, chunk, tokens))
    assert torch.allclose(windowed, dense, atol=1e-12)


def _state_before(q, k, v, stop):
    phi_k = ch04.feature_map(k[:stop])
    return phi_k.T @ v[:stop], phi_k.sum(dim=0)


def test_linear_attention_weights_rows_sum_to_one_and_are_causal():
    weights = ch04.linear_attention_weights(randn(9, 4, seed=1), randn(9, 4, seed=2))
    assert torch.allclose(weights.sum(dim=-1), torch.ones(9, dtype=torch.float64))
    assert (weights[~ch01.causal_mask(9)] == 0).all() and (weights[ch01.causal_mask(9)] > 0).all()


def test_sharpness_numbers_of_the_weight_figure():
    doubled, plain = ch04.sharpness_comparison(2.0), ch04.sharpness_comparison(1.0)
    assert round(doubled["softmax"]["mean_of_row_max"], 2) == 0.55
    assert round(doubled["softmax"]["max"], 2) == 0.81
    assert round(doubled["linear"]["mean_of_row_max"], 2) == 0.19
    assert round(doubled["linear"]["max"], 2) == 0.26
    assert round(plain["softmax"]["mean_of_row_max"], 2) == 0.35
    assert round(plain["linear"]["mean_of_row_max"], 2) == 0.18
    for result in (doubled, plain):
        for weights in result["weights"]:
            assert torch.allclose(weights.sum(dim=-1), torch.ones(10))
    with pytest.raises(ValueError, match="last_rows"):
        ch04.weight_sharpness(torch.eye(3), last_rows=4)


def test_linear_attention_rejects_bad_input():
    q = randn(4, 3, seed=0)
    with pytest.raises(ValueError, match="equal shapes"):
        ch04.linear_attention_quadratic(q, randn(4, 2, seed=1), q)
    with pytest.raises(ValueError, match="equal shapes"):
        ch04.linear_attention_recurrent(q, q, randn(5, 3, seed=1))
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        ch04.linear_attention_chunked(q, q, q, chunk_size=0)


# --------------------------------------------------------------------------- state-space models


def test_ssm_worked_example():
    assert ch04.ssm_recurrent([1, 0, 0, 2], 0.5, 1.0, 1.0).tolist() == [1.0, 0.5, 0.25, 2.125]
    assert ch04.ssm_kernel(0.5, 1.0, 1.0, 4).tolist() == [1.0, 0.5, 0.25, 0.125]
    assert torch.allclose(ch04.ssm_convolution([1, 0, 0, 2], 0.5, 1.0, 1.0),
                          torch.tensor([1.0, 0.5, 0.25, 2.125], dtype=torch.float64), atol=1e-12)
    assert round(ch04.ssm_kernel(0.99, 1.0, 1.0, 151)[-1].item(), 3) == 0.221


@pytest.mark.parametrize("seed", SEEDS)
def test_ssm_convolution_equals_recurrence(seed):
    sizes = random_sizes(seed, tokens=(1, 200), state=(1, 5))
    n = sizes["state"]
    A = 0.4 * randn(n, n, seed=seed) / math.sqrt(n)
    B, C = randn(n, seed=seed + 1), randn(n, seed=seed + 2)
    x = randn(sizes["tokens"], seed=seed + 3)
    assert torch.allclose(ch04.ssm_convolution(x, A, B, C), ch04.ssm_recurrent(x, A, B, C), atol=1e-9)


def test_ssm_rejects_bad_input():
    with pytest.raises(ValueError, match=r"A must be \(N, N\)"):
        ch04.ssm_recurrent([1.0, 2.0], torch.eye(2), torch.ones(3), torch.ones(3))
    with pytest.raises(ValueError, match="one channel"):
        ch04.ssm_convolution(torch.ones(2, 3), 0.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="length must be >= 0"):
        ch04.ssm_kernel(0.5, 1.0, 1.0, -1)


def test_selective_step_sizes_and_discretization():
    marked, plain = ch04.step_sizes([1, 0]).tolist()
    assert round(marked, 3) == 5.007 and round(plain, 4) == 0.0067
    keep, write = ch04.discretize(torch.tensor([marked, plain], dtype=torch.float64))
    assert [round(v, 4) for v in keep.tolist()] == [0.0067, 0.9933]
    assert torch.allclose(keep + write, torch.ones(2, dtype=torch.float64))  # a = -1, b = 1
    keep_half, write_half = ch04.discretize(torch.tensor([0.3], dtype=torch.float64), a=-2.0, b=3.0)
    assert write_half.item() == pytest.approx((math.exp(-0.6) - 1) / -2.0 * 3.0)


def test_selective_recall_beats_every_fixed_step():
    assert round(ch04.selective_recall(), 2) == 6.55
    grid = torch.logspace(-3, 1, 400, dtype=torch.float64).tolist()
    best = max(ch04.fixed_step_recall(d) for d in grid)
    assert round(best, 2) == 0.26
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    write_marked, keep_plain = 1 - math.exp(-softplus(5.0)), math.exp(-softplus(-5.0))
    assert round(write_marked * 7 * keep_plain**9, 2) == 6.55


def test_selective_rejects_bad_input():
    with pytest.raises(ValueError, match="a must be negative"):
        ch04.discretize(1.0, a=0.5)
    with pytest.raises(ValueError, match="delta must be >= 0"):
        ch04.discretize(torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="same shape"):
        ch04.selective_ssm([1.0, 2.0], [0.1])


# --------------------------------------------------------------------------- scans


def test_scan_worked_example_and_rounds():
    a = torch.full((4,), 0.5, dtype=torch.float64)
    b = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    assert ch04.parallel_scan(a, b).tolist() == [1.0, 0.5, 0.25, 2.125]
    assert ch04.sequential_scan(a, b).tolist() == [1.0, 0.5, 0.25, 2.125]
    assert ch04.scan_rounds(4) == 2 and ch04.scan_rounds(1024) == 10 and ch04.scan_rounds(1025) == 11
    assert ch04.scan_rounds(1) == 0 and ch04.scan_rounds(2**20) == 20


@pytest.mark.parametrize("seed", SEEDS)
def test_parallel_scan_equals_loop_for_random_a_b_including_zeros(seed):
    sizes = random_sizes(seed, tokens=(1, 3000), channels=(1, 4))
    shape = (sizes["channels"], sizes["tokens"])
    generator = torch.Generator().manual_seed(seed)
    a = torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1  # negative decays too
    a[torch.rand(*shape, generator=generator) < 0.1] = 0.0  # full resets
    b = randn(*shape, seed=seed)
    assert torch.allclose(ch04.parallel_scan(a, b), ch04.sequential_scan(a, b), atol=1e-12)


def test_parallel_scan_all_zero_a_returns_b_and_handles_long_sequences():
    b = randn(1000, seed=3)
    assert torch.equal(ch04.parallel_scan(torch.zeros(1000, dtype=torch.float64), b), b)
    generator = torch.Generator().manual_seed(4)
    a = torch.rand(2**15, generator=generator, dtype=torch.float64)  # products underflow: no division
    b = randn(2**15, seed=5)
    assert torch.allclose(ch04.parallel_scan(a, b), ch04.sequential_scan(a, b), atol=1e-10)
    ones = torch.ones(2**16, dtype=torch.float64)  # a = 1: a running sum
    assert torch.allclose(ch04.parallel_scan(ones, ones), torch.arange(1, 2**16 + 1, dtype=torch.float64))


def test_parallel_scan_does_not_modify_its_inputs():
    a, b = randn(50, seed=1), randn(50, seed=2)
    a_copy, b_copy = a.clone(), b.clone()
    ch04.parallel_scan(a, b)
    assert torch.equal(a, a_copy) and torch.equal(b, b_copy)


def test_selective_ssm_through_the_parallel_scan():
    keep, write = ch04.discretize(ch04.step_sizes(ch04.RECALL_MARKERS))
    values = torch.tensor(ch04.RECALL_VALUES, dtype=torch.float64)
    assert ch04.parallel_scan(keep, write * values)[-1].item() == pytest.approx(ch04.selective_recall(), abs=1e-12)


def test_scans_reject_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        ch04.parallel_scan(torch.ones(3), torch.ones(4))
    with pytest.raises(ValueError, match="same shape"):
        ch04.sequential_scan(torch.ones(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="time dimension"):
        ch04.parallel_scan(torch.tensor(1.0), torch.tensor(1.0))
    with pytest.raises(ValueError, match="length must be >= 0"):
        ch04.scan_rounds(-1)


# --------------------------------------------------------------------------- hybrids


def test_hybrid_and_ssm_state_bytes():
    assert ch04.ssm_state_bytes(4096, 16) == 131_072
    assert round(ch04.hybrid_cache_bytes(131_072) / 1e9, 2) == 2.15
    assert ch04.hybrid_cache_bytes(131_072) == 4 * 131_072 * 4096 + 28 * 4096 * 16 * 2
    assert ch04.hybrid_cache_bytes(131_072, attention_layers=0) == 32 * 131_072
    config = ch04.RUNNING_EXAMPLE
    for tokens in (0, 1, 4096, 131_072):
        assert ch04.hybrid_cache_bytes(tokens, attention_layers=32) == ch03.kv_bytes(config, tokens)
        assert ch04.hybrid_cache_bytes(tokens, attention_layers=4) == (
            ch03.kv_bytes(replace(config, layers=4), tokens) + 28 * ch04.ssm_state_bytes(4096, 16)
        )


def test_hybrid_rejects_bad_input():
    with pytest.raises(ValueError, match="attention_layers must lie in 0..32"):
        ch04.hybrid_cache_bytes(10, attention_layers=33)
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        ch04.hybrid_cache_bytes(-5)
    with pytest.raises(ValueError, match="channels must be >= 1"):
        ch04.ssm_state_bytes(0, 16)


# --------------------------------------------------------------------------- latent caches


def test_latent_worked_example_and_deepseek_ratio():
    x = torch.tensor([1.0, 0.0, 2.0, 1.0])
    down = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    key_up = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    latent = x @ down
    assert latent.tolist() == [3.0, 1.0]
    assert (latent @ key_up).tolist() == [3.0, 1.0, 3.0, 1.0]
    query = torch.tensor([1.0, 2.0])
    assert (query @ (latent @ key_up)[:2]).item() == (query @ key_up[:, :2].T) @ latent == 5.0
    full = ch03.KVConfig(name="mha", layers=1, query_heads=128, head_dim=128, bytes_per_scalar=1, kv_heads=128)
    mla = ch03.KVConfig(name="mla", layers=1, query_heads=128, head_dim=128, bytes_per_scalar=1,
                        latent_rank=512, rope_key_dim=64)
    assert ch03.kv_bytes(full, 1) == 32_768 and ch03.kv_bytes(mla, 1) == 576
    assert round(32_768 / 576, 1) == 56.9


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rope_key_dim", [0, 4])
def test_absorbed_latent_attention_equals_expanded(seed, rope_key_dim):
    sizes = random_sizes(seed, heads=(1, 4), head_dim=(1, 6), rank=(1, 9), tokens=(1, 10), past=(0, 6))
    d_model = sizes["heads"] * sizes["head_dim"]
    torch.manual_seed(seed)
    layer = ch04.AbsorbedLatentAttention(d_model, sizes["heads"], sizes["rank"], rope_key_dim=rope_key_dim).double()
    x = randn(2, sizes["past"] + sizes["tokens"], d_model, seed=seed)
    with torch.no_grad():
        expanded, expanded_cache = layer(x)
        absorbed, absorbed_cache = layer.forward_absorbed(x)
        assert torch.allclose(absorbed, expanded, atol=1e-10)
        assert torch.equal(absorbed_cache, expanded_cache)
        if sizes["past"]:
            _, cache = layer.forward_absorbed(x[:, : sizes["past"]])
            tail, _ = layer.forward_absorbed(x[:, sizes["past"] :], cache=cache)
            assert torch.allclose(tail, expanded[:, sizes["past"] :], atol=1e-10)
    assert absorbed_cache.shape[-1] == layer.latent_width() == sizes["rank"] + rope_key_dim


def test_absorbed_latent_attention_rejects_bad_input():
    layer = ch04.AbsorbedLatentAttention(8, 2, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 8\)"):
        layer.forward_absorbed(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match=r"cache must have shape \(B, T_past, 3\)"):
        layer.forward_absorbed(torch.randn(2, 3, 8), cache=torch.randn(2, 4, 5))


# --------------------------------------------------------------------------- quantized caches


def test_quantized_cache_worked_example():
    codes, scale = ch04.quantize_kv(torch.tensor([[0.7, -0.3, 0.2, 0.04]]), 4)
    assert codes.flatten().tolist() == [7, -3, 2, 0]
    assert scale.item() == pytest.approx(0.1)
    assert ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 4) == 33_792
    assert ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 8) == 66_560
    assert round(131_072 / 33_792, 1) == 3.9


def test_quantized_bytes_match_chapter3_without_scales():
    for config in (ch04.RUNNING_EXAMPLE,
                   ch03.KVConfig(name="y", layers=5, query_heads=6, head_dim=24, bytes_per_scalar=2, kv_heads=3)):
        assert ch04.quantized_kv_bytes_per_token(config, 16, scale_bytes=0) == ch03.kv_bytes(config, 1)
        assert ch04.quantized_kv_bytes_per_token(config, 8, scale_bytes=0) * 2 == ch03.kv_bytes(config, 1)


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 12])
@pytest.mark.parametrize("per", ["token", "channel"])
def test_quantize_kv_error_is_at_most_half_a_step(bits, per):
    x = randn(3, 20, 16, seed=bits, dtype=torch.float32) * 3
    codes, scale = ch04.quantize_kv(x, bits, per=per)
    restored = ch02.dequantize(codes, scale)
    assert ((restored - x).abs() <= scale / 2 + 1e-6).all()
    limit = 2 ** (bits - 1) - 1
    assert codes.abs().max() <= limit
    assert scale.shape == ((3, 20, 1) if per == "token" else (3, 1, 16))


def test_quantized_cache_error_measurements():
    error_8, error_4 = ch04.quantized_cache_error(8), ch04.quantized_cache_error(4)
    assert error_8 < 0.01 < error_4 < 0.2
    for bits in (8, 4, 3):
        per_token = ch04.quantized_cache_error(bits, keys_per="token", outlier_channels=4)
        per_channel = ch04.quantized_cache_error(bits, keys_per="channel", outlier_channels=4)
        assert per_channel < per_token


def test_quantization_rejects_bad_input():
    x = randn(4, 8, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match="per must be 'token' or 'channel'"):
        ch04.quantize_kv(x, 4, per="head")
    with pytest.raises(ValueError):
        ch04.quantize_kv(x, 1)
    with pytest.raises(ValueError):
        ch04.quantize_kv(x, 17)
    with pytest.raises(ValueError, match=r"x must be \(\.\.\., T, d\)"):
        ch04.quantize_kv(torch.ones(4), 4)
    with pytest.raises(ValueError, match="bits must lie in 1..16"):
        ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 0)
    with pytest.raises(ValueError, match="outlier_channels must lie in"):
        ch04.quantized_cache_error(4, outlier_channels=100)


# --------------------------------------------------------------------------- putting it together


def test_cache_bytes_by_design_at_one_million_tokens():
    sizes = ch04.cache_bytes_by_design(1_048_576)
    gqa = sizes["grouped-query (8 KV heads)"]
    assert gqa == ch03.kv_bytes(ch04.RUNNING_EXAMPLE, 1_048_576)
    assert sizes["multi-head (32 KV heads)"] == 4 * gqa
    assert sizes["sliding window (4,096)"] == ch03.kv_bytes(ch04.RUNNING_EXAMPLE, 4096)
    assert sizes["latent (512 + 64 per layer)"] == 1_048_576 * 32 * 576 * 2
    assert sizes["state-space (all 32 layers)"] == 32 * ch04.ssm_state_bytes(4096, 16)
    assert round(gqa / sizes["hybrid (4 attention of 32)"], 1) == 8.0
    small = ch04.cache_bytes_by_design(1000)
    assert small["sliding window (4,096)"] == small["grouped-query (8 KV heads)"]
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        ch04.cache_bytes_by_design(-1)
