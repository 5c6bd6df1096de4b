"""Tests for Chapter 6 (efficient architectures): the chapter's numbers, its invariants, its errors."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from booktools.numbering import book_numbering
from longctx import ch01, ch02, ch03, ch04
from torch.utils._python_dispatch import TorchDispatchMode

SEEDS = range(5)
F64 = torch.float64


def randn(*shape: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_sizes(seed: int, **bounds: tuple[int, int]) -> dict[str, int]:
    generator = torch.Generator().manual_seed(1000 + seed)
    return {name: int(torch.randint(low, high + 1, (1,), generator=generator)) for name, (low, high) in bounds.items()}


def scalar_ssm(a: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A one-number state: A = [[a]], B = C = [1]."""
    return torch.tensor([[a]], dtype=F64), torch.ones(1, dtype=F64), torch.ones(1, dtype=F64)


def first_sentence() -> str:
    """The corpus's first sentence, "It is a truth ... wife.", as the chapter cuts it."""
    text = ch02.load_corpus()
    text = text[text.index("It is a truth"):]
    return text[: text.index("wife.") + len("wife.")]


# The chapter's carry task: the first sentence's bytes, centred and scaled; a marker on each capital.
SENTENCE = first_sentence()
SENTENCE_CODES = torch.tensor(list(SENTENCE.encode("utf-8")), dtype=F64)
CARRY_VALUES = (SENTENCE_CODES - SENTENCE_CODES.mean()) / SENTENCE_CODES.std()
CARRY_MARKERS = torch.tensor([float(ch.isupper()) for ch in SENTENCE], dtype=F64)
FIRST_ONLY = torch.zeros(len(SENTENCE), dtype=F64).index_fill_(0, torch.tensor([0]), 1.0)
OPENING = "It is a truth universally acknowledged"  # the corpus's first sentence begins so


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


# --------------------------------------------------------------------------- the module and its docstrings


def test_public_names_are_what_an_exercise_imports():
    for leftover in ("GB", "KIB", "BILL_CONTEXTS", "RECALL_VALUES", "RECALL_MARKERS",
                     "selective_recall", "fixed_step_recall"):
        assert not hasattr(ch04, leftover), leftover
    assert {"selective_scan", "SelectiveSSMLayer", "parallel_scan", "sequential_scan",
            "RUNNING_EXAMPLE"} <= set(ch04.__all__)
    assert not hasattr(ch04, "AbsorbedLatentAttention")  # taught once, in Chapter 3


def test_docstrings_name_equations_by_their_numbers():
    numbers = {label: target.number for label, target in book_numbering().items() if label.startswith("eq-ch04-")}
    cited = {
        "cost": [ch04.context_cost], "paths": [ch04.receptive_field],
        "strided": [ch04.strided_mask], "linear": [ch04.linear_attention_recurrent, ch04.linear_attention_chunked],
        "ssm": [ch04.ssm_recurrent, ch04.ssm_kernel], "selective": [ch04.discretize, ch04.selective_ssm],
        "scan": [ch04.parallel_scan], "mamba": [ch04.selective_scan, ch04.SelectiveSSMLayer],
        "gated": [ch04.gated_linear_attention, ch04.gated_linear_attention_scan], "delta": [ch04.delta_rule],
        "hybrid": [ch04.hybrid_cache_bytes],
        "quantized": [ch04.quantized_kv_bytes_per_token],
    }
    for label, objects in cited.items():
        for obj in objects:
            doc = " ".join(obj.__doc__.split())
            assert f"Equation {numbers['eq-ch04-' + label]}" in doc, (obj.__name__, label)
    for name in ch04.__all__:
        obj = getattr(ch04, name)
        if not getattr(obj, "__module__", "").startswith("longctx.ch04"):
            continue  # RUNNING_EXAMPLE and the type aliases carry other modules' docs
        doc = obj.__doc__ or ""
        assert not re.search(r"@(eq|sec|fig|tbl)-", doc), name  # never a raw Quarto label


# --------------------------------------------------------------------------- the two bills


def test_context_cost_matches_the_worked_numbers():
    # RUNNING_EXAMPLE: Gemma 3 1B with every layer global, 26 x 1 KV head x 256
    assert ch04.context_cost(1)["kv_bytes"] == 26_624 == 2 * 26 * 1 * 256 * 2
    assert ch04.context_cost(1)["attention_flops"] == 4 * 4 * 256 * 26
    cost = ch04.context_cost(32_768)
    assert cost["keys_read"] == 26 * 32_768
    assert cost["pairs_per_head_per_layer"] == 32_768**2
    assert cost["causal_pairs_per_head_per_layer"] == 32_768 * 32_769 // 2
    assert cost["kv_bytes"] == 872_415_232 and cost["kv_bytes"] // 2**20 == 832
    assert ch04.context_cost(0)["attention_flops"] == 0
    assert ch01.attention_pairs(1000) // ch01.attention_pairs(10) == 9_100


def test_context_cost_of_the_shipped_gemma_counts_windowed_layers_at_w():
    gemma = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    assert (gemma.windowed_layers, gemma.window) == (22, 512)
    for tokens in (1, 100, 512):  # inside the window: as if every layer global
        assert ch04.context_cost(tokens, gemma) == ch04.context_cost(tokens)
    shipped = ch04.context_cost(32_768, gemma)
    assert shipped["keys_read"] == 4 * 32_768 + 22 * 512
    assert shipped["attention_flops"] == 4_096 * shipped["keys_read"]
    assert shipped["kv_bytes"] == ch03.kv_bytes(gemma, 32_768) == 145_752_064
    late = ch04.context_cost(1_001, gemma)["kv_bytes"] - ch04.context_cost(1_000, gemma)["kv_bytes"]
    assert late == 4 * 2 * 256 * 2  # past the window only the 4 global layers grow
    # the chapter's crossing: the all-global attention passes ~2.0 GFLOP of weights
    weight_flops = 2 * (26 * (2 * 1152 * 1024 + 2 * 1152 * 256 + 3 * 1152 * 6912) + 1152 * 262_144)
    crossing = math.ceil(weight_flops / ch04.context_cost(1)["attention_flops"])
    assert crossing == 18_776
    assert shipped["attention_flops"] < weight_flops / 2


def test_context_cost_of_a_latent_cache_uses_absorbed_reads():
    lite = ch03.KVConfig.from_hf_config(ch03.load_model_config("deepseek-v2-lite"))
    one = ch04.context_cost(1, lite)
    assert one["attention_flops"] == 27 * 2 * 16 * (2 * 512 + 64)
    assert one["kv_bytes"] == 27 * 576 * 2
    assert round(one["attention_flops"] / one["kv_bytes"], 1) == 30.2


def test_context_cost_uses_chapter3_kv_bytes_for_any_config():
    config = ch03.KVConfig(name="x", layers=3, query_heads=4, head_dim=16, bytes_per_scalar=4, kv_heads=2)
    for tokens in (0, 1, 7, 1000):
        assert ch04.context_cost(tokens, config)["kv_bytes"] == ch03.kv_bytes(config, tokens)
        assert ch04.context_cost(tokens, config)["attention_flops"] == 4 * 4 * 16 * 3 * tokens


def test_running_example_is_the_shipped_gemma_with_every_layer_global():
    shipped = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    every_layer_global = replace(shipped, name=ch04.RUNNING_EXAMPLE.name, window=None, windowed_layers=0)
    assert every_layer_global == ch04.RUNNING_EXAMPLE
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    assert ch03.window_reach(mistral.window, mistral.layers) == 131_040


def test_context_cost_rejects_bad_input():
    with pytest.raises(ValueError, match="tokens must be an integer >= 0"):
        ch04.context_cost(-1)
    with pytest.raises(TypeError, match="tokens must be an int"):
        ch04.context_cost(2.5)
    with pytest.raises(TypeError, match="tokens must be an int"):
        ch04.context_cost(True)


# --------------------------------------------------------------------------- sliding windows


def test_window_worked_example_on_tinygpts_positions():
    """The section's check: TinyGPT's 128 positions, a window of 16, its 2 layers."""
    tiny = ch02.GPTConfig(vocab_size=256)
    band = ch03.visibility_mask(tiny.context_length, window=16)
    assert ch04.pairs_computed(band) == 113 * 16 + 120 == 1_928
    assert ch04.pairs_computed(ch01.causal_mask(tiny.context_length)) == 8_256
    heard = ch04.receptive_field(band, tiny.layers)
    assert heard[-1].nonzero()[0].item() == 127 - 30 == 97
    assert int(heard.sum(dim=1).max()) == 31
    assert not heard[127, 96] and ch04.receptive_field(band, 3)[127, 96]


@pytest.mark.parametrize("seed", SEEDS)
def test_receptive_field_reaches_exactly_layers_times_window_minus_one(seed):
    sizes = random_sizes(seed, tokens=(5, 30), window=(1, 6), layers=(0, 5))
    n, w, layers = sizes["tokens"], sizes["window"], sizes["layers"]
    field = ch04.receptive_field(ch03.visibility_mask(n, window=w), layers)
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    expected = (distance >= 0) & (distance <= ch03.window_reach(w, layers))
    assert torch.equal(field, expected)


# --------------------------------------------------------------------------- sparse patterns


def test_sparse_pair_counts_at_thirty_six_tokens():
    assert ch04.pairs_computed(ch01.causal_mask(36)) == 666
    assert ch04.pairs_computed(ch03.visibility_mask(36, window=6)) == 201
    assert ch04.pairs_computed(ch04.global_local_mask(36, 6, (0,))) == 231
    assert ch04.pairs_computed(ch04.strided_mask(36, 6)) == 291
    assert ch04.strided_mask(36, 6)[35].nonzero().flatten().tolist() == [5, 11, 17, 23, 29, 30, 31, 32, 33, 34, 35]


def test_strided_pair_count_closed_form_and_its_growth():
    def strided_pairs(tokens, period):
        return sum(min(i + 1, period) + i // period for i in range(tokens))

    for tokens, period in ((36, 6), (50, 7), (129, 11)):
        assert strided_pairs(tokens, period) == ch04.pairs_computed(ch04.strided_mask(tokens, period))
    # the chapter's table: at 32 Ki tokens a sqrt(T) stride scores fewer pairs than Gemma's W = 512
    window_512 = sum(min(i + 1, 512) for i in range(32_768))
    assert strided_pairs(32_768, 181) == 8_864_475 < window_512 == 16_646_400


def test_causal_global_token_at_zero_is_a_sink_and_gives_no_two_hop_path():
    causal_global = ch04.global_local_mask(16, 4, (0,))
    assert torch.equal(causal_global, ch03.visibility_mask(16, window=4, sinks=1))
    assert causal_global[0].sum() == 1  # the global token reads only itself
    earlier = ch01.causal_mask(16)
    assert not ch04.receptive_field(causal_global, 2)[earlier].all()
    encoder_global = ch04.global_local_mask(16, 4, (0,), causal=False)
    assert ch04.receptive_field(encoder_global, 2).all()
    assert not ch04.receptive_field(encoder_global, 1)[15, 3]


def _hops(mask, reader, source):
    for hops in range(25):
        if ch04.receptive_field(mask, hops)[reader, source]:
            return hops
    return None


def test_causal_global_token_later_in_the_sequence_shortens_paths_across_it():
    at_8 = ch04.global_local_mask(16, 4, (8,))
    assert _hops(at_8, 15, 3) == 2  # 3 -> 8 -> 15, the review's case
    assert _hops(ch04.global_local_mask(36, 6, (18,)), 35, 2) == 2  # the chapter's case
    assert _hops(ch04.global_local_mask(36, 6, (0,)), 35, 2) == 7  # as the window alone
    assert _hops(ch04.strided_mask(36, 6), 35, 2) == 2
    assert _hops(ch04.global_local_mask(16, 4, (0,)), 15, 3) == 4  # as the window alone
    assert _hops(ch03.visibility_mask(16, window=4), 15, 3) == 4
    assert at_8[8, :9].all() and not at_8[8, 9:].any()  # it reads 0..8 and nothing later
    assert at_8[8:, 8].all() and not at_8[:8, 8].any()  # and is read from 8 on
    two_hops = ch04.receptive_field(at_8, 2)
    for before in range(8):
        for after in range(9, 16):
            assert two_hops[after, before]  # every pair across it is within two hops
    assert not two_hops[7, 0]  # tokens on one side of it gain nothing


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


def test_sparse_masks_refuse_a_zero_window_or_stride():
    with pytest.raises(ValueError, match="stride must be a positive integer"):
        ch04.strided_mask(8, 0)
    with pytest.raises(TypeError, match="stride must be an int"):
        ch04.strided_mask(4, 1.5)  # the review's case: once returned a mask
    with pytest.raises(ValueError, match="window must be a positive integer"):
        ch04.global_local_mask(8, 0)


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


def test_block_sparse_worked_numbers_count_causal_tiles_throughout():
    tiles = ch04.sliding_window_block_mask(96, 20, 16)
    assert int(tiles.sum()) == 15 and ch01.attention_pairs(6) == 21
    gemma_tiles = ch04.sliding_window_block_mask(32_768, 512, 128)
    causal_tiles = ch01.attention_pairs(gemma_tiles.shape[0])
    assert not gemma_tiles.triu(1).any()  # every marked tile is a causal tile
    assert round(100 * gemma_tiles.sum().item() / causal_tiles, 1) == 3.9  # the text
    mistral_tiles = ch04.sliding_window_block_mask(131_072, 4096, 128)
    assert round(100 * mistral_tiles.sum().item() / ch01.attention_pairs(1024), 1) == 6.3  # Exercise 8.2


@pytest.mark.parametrize("seed", SEEDS)
def test_tiles_touched_matches_a_brute_force_count(seed):
    sizes = random_sizes(seed, tokens=(1, 50), stride=(1, 9), block=(1, 9))
    n, p, b = sizes["tokens"], sizes["stride"], sizes["block"]
    mask = ch04.strided_mask(n, p)
    n_blocks = math.ceil(n / b)
    brute = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    for i, j in mask.nonzero().tolist():
        brute[i // b, j // b] = True
    assert torch.equal(ch04.tiles_touched(mask, b), brute)


def test_a_token_strided_pattern_needs_every_tile_and_a_tile_strided_one_does_not():
    causal_tiles = ch01.attention_pairs(16)
    for period in (16, 32, 64):  # p <= b: a far diagonal crosses every tile
        assert int(ch04.tiles_touched(ch04.strided_mask(1024, period), 64).sum()) == causal_tiles
    assert ch04.pairs_computed(ch04.strided_mask(1024, 32)) < 0.1 * ch01.attention_pairs(1024)
    window_tiles = ch04.tiles_touched(ch03.visibility_mask(1024, window=64), 64)
    assert torch.equal(window_tiles, ch04.sliding_window_block_mask(1024, 64, 64))
    assert int(window_tiles.sum()) == 31
    assert int(ch04.strided_mask(64, 8).sum()) < 0.4 * ch01.attention_pairs(64)  # the stride drawn on tiles
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        ch04.tiles_touched(ch01.causal_mask(4), 0)


def test_block_sparse_refuses_what_would_silently_drop_pairs():
    q = randn(8, 4, seed=0)
    good = ch04.sliding_window_block_mask(8, 2, 2)
    with pytest.raises(ZeroDivisionError):  # a kernel: a zero block fails loudly, in Python's words
        ch04.block_sparse_attention(q, q, q, good, 0)
    with pytest.raises(AssertionError, match="tile grid"):
        ch04.block_sparse_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool), 2)
    with pytest.raises(ValueError, match="outside the marked tiles"):
        ch04.block_sparse_attention(q, q, q, good, 2, token_mask=ch01.causal_mask(8))
    with pytest.raises(ValueError, match="window must be a positive integer"):
        ch04.sliding_window_block_mask(8, 0, 4)



# --------------------------------------------------------------------------- blocks the query picks


@pytest.mark.parametrize(("tokens", "block"), [(12, 4), (13, 4), (9, 3), (5, 8)])
def test_chosen_blocks_mask_reads_its_own_block_and_the_best_earlier_ones(tokens, block):
    """Against a loop over queries: the own block causally, then the top earlier complete blocks by
    q . mean(k); every earlier block when top reaches their number, none with top 0."""
    q, k = randn(2, tokens, 6, seed=1), randn(2, tokens, 6, seed=2)
    blocks = -(-tokens // block)
    for top in (0, 1, 2, blocks):
        mask = ch04.chosen_blocks_mask(q, k, block, top)
        assert mask.shape == (2, tokens, tokens) and not mask.triu(1).any()
        for head in range(2):
            for i in range(tokens):
                own = i // block
                means = [k[head, b * block:(b + 1) * block].mean(0) for b in range(own)]
                scores = torch.tensor([float(q[head, i] @ m) for m in means])
                best = set(scores.topk(min(top, own)).indices.tolist()) if own else set()
                expected = {j for j in range(i + 1) if j // block == own or j // block in best}
                assert set(mask[head, i].nonzero().flatten().tolist()) == expected
    assert torch.equal(ch04.chosen_blocks_mask(q, k, block, blocks)[0], ch01.causal_mask(tokens))


def test_page_bounds_bound_every_score_and_quest_with_every_page_is_full_attention():
    keys, values = randn(3, 50, 8, seed=3), randn(3, 50, 5, seed=4)
    query = randn(3, 8, seed=5)
    lower, upper = ch04.page_bounds(keys, 16)  # pages of 16, 16, 16 and 2 tokens
    assert lower.shape == upper.shape == (3, 4, 8)
    assert torch.equal(lower[:, 3], keys[:, 48:].amin(1)) and torch.equal(upper[:, 0], keys[:, :16].amax(1))
    bounds = ch04.page_upper_bounds(query, lower, upper)
    scores = (keys @ query[..., None])[..., 0]  # (3, 50)
    for p in range(4):
        assert bool((bounds[:, p] >= scores[:, 16 * p:16 * (p + 1)].amax(-1) - 1e-6).all())
    full, _ = ch01.scaled_dot_product_attention(query[:, None], keys, values)
    every, pages = ch04.quest_decode(query, keys, values, 16, 4)
    assert torch.allclose(every, full[:, 0], atol=1e-6) and pages.tolist() == [[0, 1, 2, 3]] * 3


def test_quest_decode_reads_only_the_pages_with_the_largest_bounds():
    keys, values = randn(40, 4, seed=6), randn(40, 3, seed=7)
    query = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=keys.dtype)
    keys[25, 0] = 50.0  # page 3 of 5 (tokens 24..31) holds a key the query cannot miss
    output, pages = ch04.quest_decode(query, keys, values, 8, 1)
    assert pages.tolist() == [3]
    expected, _ = ch01.scaled_dot_product_attention(query[None], keys[24:32], values[24:32])
    assert torch.allclose(output, expected[0], atol=1e-6)
    with pytest.raises(ValueError, match="top"):
        ch04.quest_decode(query, keys, values, 8, 6)  # only five pages


# --------------------------------------------------------------------------- linear attention


def space_probe(scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chapter's "where were the spaces?" probe on "It is a": linear and softmax outputs and weights."""
    text = "It is a"
    keys = torch.tensor([[1.0 if c == " " else -1.0, 1.0 if c in "AEIOUaeiou" else -1.0] for c in text], dtype=F64)
    values = torch.arange(len(text), dtype=F64)[:, None]  # each byte's position
    queries = (scale * torch.tensor([2.0, -1.0], dtype=F64)).expand(len(text), 2)
    linear, _ = ch04.linear_attention_recurrent(queries, keys, values)
    soft, soft_weights = ch01.scaled_dot_product_attention(queries, keys, values, ch01.causal_mask(7), scale=1.0)
    return linear, soft, ch04.linear_attention_weights(queries, keys), soft_weights


def test_linear_attention_worked_example():
    e = math.exp(-1)
    keys = torch.tensor([[-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]], dtype=F64)  # vowel, consonant, space
    assert torch.allclose(ch04.feature_map(keys), torch.tensor([[e, 2.0], [e, e], [2.0, e]], dtype=F64))
    linear, soft, linear_weights, soft_weights = space_probe(1.0)
    raw = {"vowel": 3 * e + 2 * e, "consonant": 3 * e + e * e, "space": 6 + e * e}  # phi(q) = (3, 1/e)
    order = ["vowel", "consonant", "space", "vowel", "consonant", "space", "vowel"]  # I t _ i s _ a
    expected = sum(raw[kind] * t for t, kind in enumerate(order)) / sum(raw[kind] for kind in order)
    assert linear[-1, 0].item() == pytest.approx(expected, abs=1e-12)
    assert round(linear[-1, 0].item(), 2) == 3.24 and round(soft[-1, 0].item(), 2) == 3.48
    assert round(linear_weights[-1, [2, 5]].sum().item(), 2) == 0.61
    assert round(soft_weights[-1, [2, 5]].sum().item(), 2) == 0.98


def test_linear_attention_share_has_a_ceiling_softmax_does_not():
    ceiling = 4 / (4 + 5 * math.exp(-1))  # the keys' first features: 2 per space, 1/e for the others
    shares = [space_probe(c)[2][-1, [2, 5]].sum().item() for c in (1.0, 4.0, 64.0)]
    assert shares[0] < shares[1] < shares[2] <= ceiling and shares[2] == pytest.approx(ceiling, abs=1e-9)
    assert space_probe(8.0)[3][-1, [2, 5]].sum().item() > 0.999999


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_attention_forms_agree(seed):
    sizes = random_sizes(seed, tokens=(1, 60), d_k=(1, 6), d_v=(1, 5), chunk=(1, 17))
    t = sizes["tokens"]
    q, k = randn(2, t, sizes["d_k"], seed=seed), randn(2, t, sizes["d_k"], seed=seed + 3)
    v = randn(2, t, sizes["d_v"], seed=seed + 5)
    quadratic = ch04.linear_attention_quadratic(q, k, v)
    recurrent, (summed, total) = ch04.linear_attention_recurrent(q, k, v)
    chunked = ch04.linear_attention_chunked(q, k, v, chunk_size=sizes["chunk"])
    assert torch.allclose(recurrent, quadratic, atol=1e-10)
    assert torch.allclose(chunked, quadratic, atol=1e-10)
    assert summed.shape == (2, sizes["d_k"], sizes["d_v"]) and total.shape == (2, sizes["d_k"])
    split = max(1, t // 2)
    if split < t:
        first, state = ch04.linear_attention_recurrent(q[:, :split], k[:, :split], v[:, :split])
        rest, _ = ch04.linear_attention_recurrent(q[:, split:], k[:, split:], v[:, split:], state=state)
        assert torch.allclose(torch.cat([first, rest], dim=1), quadratic, atol=1e-10)


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
    phi_k = ch04.feature_map(k[: tokens - 100])
    state = (phi_k.T @ v[: tokens - 100], phi_k.sum(dim=0))
    recurrent, _ = ch04.linear_attention_recurrent(q[-100:], k[-100:], v[-100:], state=state)
    assert torch.allclose(chunked[-100:], recurrent, atol=1e-9)
    dense, _ = ch01.scaled_dot_product_attention(q, k, v, ch04.expand_block_mask(blocks, chunk, tokens))
    assert torch.allclose(windowed, dense, atol=1e-12)


def test_decode_paths_build_nothing_of_size_t_squared():
    """A decode step against a cache of T tokens creates no tensor of T^2 elements."""
    cache_tokens = 256
    torch.manual_seed(3)
    layer = ch03.AbsorbedLatentAttention(32, 4, 8, rope_key_dim=4).double()
    x = randn(1, cache_tokens + 1, 32, seed=4)
    with torch.no_grad():
        _, cache = layer.forward_absorbed(x[:, :-1])
        merged = layer.merged_weights()
        with LargestTensor() as absorbed_step:
            step, _ = layer.forward_absorbed(x[:, -1:], cache, merged=merged)
        full, _ = layer(x)
    assert torch.allclose(step, full[:, -1:], atol=1e-10)
    assert absorbed_step.largest < cache_tokens * cache_tokens // 4
    q, k, v = (randn(cache_tokens, 4, seed=s) for s in (5, 6, 7))
    with LargestTensor() as ring:
        ch03.sliding_window_decode(q, k, v, window=16)
    assert ring.largest < cache_tokens * cache_tokens // 16
    with LargestTensor() as recurrent:
        ch04.linear_attention_recurrent(q, k, v)
    assert recurrent.largest < cache_tokens * cache_tokens // 16


def test_linear_attention_weights_rows_sum_to_one_and_are_causal():
    weights = ch04.linear_attention_weights(randn(9, 4, seed=1), randn(9, 4, seed=2))
    assert torch.allclose(weights.sum(dim=-1), torch.ones(9, dtype=F64))
    assert (weights[~ch01.causal_mask(9)] == 0).all() and (weights[ch01.causal_mask(9)] > 0).all()


def test_sharpness_numbers_of_the_weight_figure():
    sixteen, plain = ch04.sharpness_comparison(16.0), ch04.sharpness_comparison(1.0)  # the Measure-it box
    assert round(sixteen["softmax"]["mean_of_row_max"], 2) == 0.93
    assert round(sixteen["softmax"]["max"], 2) == 1.0
    assert round(sixteen["linear"]["mean_of_row_max"], 3) == 0.063
    assert round(plain["softmax"]["mean_of_row_max"], 2) == 0.21
    assert round(plain["linear"]["mean_of_row_max"], 3) == 0.057
    for result in (sixteen, plain):
        for weights in result["weights"]:
            assert torch.allclose(weights.sum(dim=-1), torch.ones(24))
    with pytest.raises(ValueError, match="query_scale must be > 0"):
        ch04.sharpness_comparison(0.0)


def test_linear_attention_chunked_refuses_a_zero_chunk():
    q = randn(4, 3, seed=0)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        ch04.linear_attention_chunked(q, q, q, chunk_size=0)


# --------------------------------------------------------------------------- state-space models


def test_ssm_worked_example_counts_the_spaces_of_the_corpus():
    x = torch.tensor([float(ch == " ") for ch in "It is a truth"], dtype=F64)
    A, B, C = scalar_ssm(0.75)
    states = ch04.ssm_recurrent(x, A, B, C)
    assert states[-1].item() == pytest.approx(0.75**10 + 0.75**7 + 0.75**5, abs=1e-12)
    assert ch04.ssm_kernel(A, B, C, 4).tolist() == [1.0, 0.75, 0.5625, 0.421875]
    assert torch.allclose(ch04.ssm_convolution(x, A, B, C), states, atol=1e-12)
    half_life = len(SENTENCE)  # the kernel figure: A halves an input over the first sentence's bytes
    kernel = ch04.ssm_kernel(*scalar_ssm(0.5 ** (1 / half_life)), half_life + 1)
    assert half_life == 117 and kernel[-1].item() == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_ssm_convolution_equals_recurrence(seed):
    sizes = random_sizes(seed, tokens=(1, 200), state=(1, 5))
    n = sizes["state"]
    A = 0.4 * randn(n, n, seed=seed) / math.sqrt(n)
    B, C = randn(n, seed=seed + 1), randn(n, seed=seed + 2)
    x = randn(sizes["tokens"], seed=seed + 3)
    assert torch.allclose(ch04.ssm_convolution(x, A, B, C), ch04.ssm_recurrent(x, A, B, C), atol=1e-9)


def test_selective_step_sizes_and_discretization():
    marked, plain = ch04.step_sizes(torch.tensor([1.0, 0.0], dtype=F64)).tolist()
    assert round(marked, 3) == 5.007 and round(plain, 5) == 0.00091  # softplus(12 - 7), softplus(-7)
    keep, write = ch04.discretize(torch.tensor([marked, plain], dtype=F64))
    assert [round(v, 5) for v in keep.tolist()] == [0.00669, 0.99909]
    assert round(math.log(2) / plain) == 760  # the state's half-life in bytes
    assert torch.allclose(keep + write, torch.ones(2, dtype=F64))  # a = -1, b = 1
    keep_half, write_half = ch04.discretize(torch.tensor([0.3], dtype=F64), a=-2.0, b=3.0)
    assert write_half.item() == pytest.approx((math.exp(-0.6) - 1) / -2.0 * 3.0)
    small = torch.tensor([1e-4], dtype=F64)  # small steps: zero-order hold ~ delta * b
    assert ch04.discretize(small, a=-1.5, b=2.0)[1].item() == pytest.approx(1e-4 * 2.0, rel=1e-3)


def test_selective_carry_beats_every_fixed_step():
    tokens = len(SENTENCE)
    assert CARRY_MARKERS.sum() == 1 and CARRY_MARKERS[0] == 1  # one capital: the opening "I"
    delta = ch04.step_sizes(CARRY_MARKERS)
    weight = ch04.selective_ssm(FIRST_ONLY, delta)[-1].item()  # x_0's weight in the last state
    assert round(weight, 2) == 0.89
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    write_capital, keep_other = 1 - math.exp(-softplus(5.0)), math.exp(-softplus(-7.0))
    assert weight == pytest.approx(write_capital * keep_other ** (tokens - 1), abs=1e-12)
    grid = torch.logspace(-4, 1, 251, dtype=F64).tolist()
    weights = [ch04.selective_ssm(FIRST_ONLY, torch.full((tokens,), d, dtype=F64))[-1].item() for d in grid]
    best = (1 / tokens) * (1 - 1 / tokens) ** (tokens - 1)  # the best fixed keep factor, 1 - 1/T
    assert max(weights) <= best + 1e-12 and max(weights) == pytest.approx(best, abs=2e-5)
    assert round(best, 4) == 0.0032 and weight > 200 * best
    final = ch04.selective_ssm(CARRY_VALUES, delta)[-1].item()
    assert round(CARRY_VALUES[0].item(), 2) == -0.59 and round(final, 2) == -0.53


def test_discretize_refuses_a_rate_that_is_not_negative():
    with pytest.raises(ValueError, match="a must be < 0"):
        ch04.discretize(torch.ones(1), a=0.5)
    with pytest.raises(ValueError, match="a must be < 0"):
        ch04.discretize(torch.ones(1), a=0.0)  # would divide by zero


# --------------------------------------------------------------------------- scans


def test_scan_worked_example_and_rounds():
    a = torch.full((4,), 0.75, dtype=F64)
    b = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=F64)  # the bytes "s a " of the space counter
    assert ch04.parallel_scan(a, b).tolist() == [0.0, 1.0, 0.75, 1.5625]
    assert ch04.sequential_scan(a, b).tolist() == [0.0, 1.0, 0.75, 1.5625]
    assert ch04.scan_rounds(4) == 2 and ch04.scan_rounds(1024) == 10 and ch04.scan_rounds(1025) == 11
    assert ch04.scan_rounds(1) == 0 and ch04.scan_rounds(0) == 0 and ch04.scan_rounds(2**16) == 16


def test_scan_rounds_is_exact_where_floating_point_log2_is_not():
    for exponent in (1, 10, 49, 53, 60, 100):
        length = 2**exponent
        assert ch04.scan_rounds(length) == exponent
        assert ch04.scan_rounds(length + 1) == exponent + 1
    assert math.ceil(math.log2(2**53 + 1)) == 53  # the float formula's error ...
    assert ch04.scan_rounds(2**53 + 1) == 54  # ... which the integer one avoids
    for length in range(1, 300):
        shifts, span = 0, 1
        while span < length:
            span, shifts = span * 2, shifts + 1
        assert ch04.scan_rounds(length) == shifts


@pytest.mark.parametrize("seed", SEEDS)
def test_parallel_scan_equals_loop_for_random_a_b_including_zeros(seed):
    sizes = random_sizes(seed, tokens=(1, 3000), channels=(1, 4))
    shape = (sizes["channels"], sizes["tokens"])
    generator = torch.Generator().manual_seed(seed)
    a = torch.rand(*shape, generator=generator, dtype=F64) * 2 - 1  # negative decays too
    a[torch.rand(*shape, generator=generator) < 0.1] = 0.0  # full resets
    b = randn(*shape, seed=seed)
    assert torch.allclose(ch04.parallel_scan(a, b), ch04.sequential_scan(a, b), atol=1e-12)


def test_parallel_scan_all_zero_a_returns_b_and_handles_long_sequences():
    b = randn(1000, seed=3)
    assert torch.equal(ch04.parallel_scan(torch.zeros(1000, dtype=F64), b), b)
    generator = torch.Generator().manual_seed(4)
    a = torch.rand(2**12, generator=generator, dtype=F64)  # products underflow: no division
    b = randn(2**12, seed=5)
    assert torch.allclose(ch04.parallel_scan(a, b), ch04.sequential_scan(a, b), atol=1e-10)
    ones = torch.ones(2**16, dtype=F64)  # a = 1: a running sum
    assert torch.allclose(ch04.parallel_scan(ones, ones), torch.arange(1, 2**16 + 1, dtype=F64))


def test_parallel_scan_does_not_modify_its_inputs():
    a, b = randn(50, seed=1), randn(50, seed=2)
    a_copy, b_copy = a.clone(), b.clone()
    ch04.parallel_scan(a, b)
    assert torch.equal(a, a_copy) and torch.equal(b, b_copy)


@pytest.mark.parametrize("scan", [ch04.sequential_scan, ch04.parallel_scan])
@pytest.mark.parametrize("shape", [(1,), (7,), (2, 3, 9), (1, 16)])
def test_scans_pass_gradcheck_in_float64(scan, shape):
    generator = torch.Generator().manual_seed(sum(shape))
    a = (torch.rand(*shape, generator=generator, dtype=F64) * 1.8 - 0.9).requires_grad_()
    b = torch.randn(*shape, generator=generator, dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(scan, (a, b))


@pytest.mark.parametrize("seed", SEEDS)
def test_loop_and_scan_gradients_are_equal(seed):
    sizes = random_sizes(seed, tokens=(1, 70), channels=(1, 4))
    shape = (sizes["channels"], sizes["tokens"])
    generator = torch.Generator().manual_seed(seed)
    a0 = torch.rand(*shape, generator=generator, dtype=F64)
    a0[torch.rand(*shape, generator=generator) < 0.1] = 0.0
    b0 = randn(*shape, seed=seed)
    weights = randn(*shape, seed=seed + 1)
    grads = []
    for scan in (ch04.sequential_scan, ch04.parallel_scan):
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        (scan(a, b) * weights).sum().backward()
        grads.append((a.grad, b.grad))
    (loop_a, loop_b), (tree_a, tree_b) = grads
    assert torch.allclose(loop_a, tree_a, atol=1e-12) and torch.allclose(loop_b, tree_b, atol=1e-12)
    # the gradient of a linear recurrence is the same recurrence run backwards in time
    states = ch04.sequential_scan(a0, b0)
    carried = torch.zeros_like(b0)
    running = torch.zeros_like(b0[..., 0])
    for t in reversed(range(b0.shape[-1])):
        running = weights[..., t] + (a0[..., t + 1] * running if t + 1 < b0.shape[-1] else 0.0)
        carried[..., t] = running
    assert torch.allclose(loop_b, carried, atol=1e-12)
    previous = torch.cat([torch.zeros_like(states[..., :1]), states[..., :-1]], dim=-1)
    assert torch.allclose(loop_a, carried * previous, atol=1e-12)


def test_selective_ssm_through_the_parallel_scan():
    keep, write = ch04.discretize(ch04.step_sizes(CARRY_MARKERS))
    by_loop = ch04.selective_ssm(CARRY_VALUES, ch04.step_sizes(CARRY_MARKERS))
    assert torch.allclose(ch04.parallel_scan(keep, write * CARRY_VALUES), by_loop, atol=1e-12)


# --------------------------------------------------------------------------- gated tables and the delta rule


def test_retention_decays_are_retnets_rates():
    gammas = ch04.retention_decays(4)
    assert gammas.tolist() == [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256]
    assert gammas.dtype == F64


@pytest.mark.parametrize("seed", SEEDS)
def test_gated_linear_attention_scan_equals_the_loop(seed):
    sizes = random_sizes(seed, heads=(1, 4), tokens=(1, 40), d_k=(1, 9), d_v=(1, 7))
    heads, tokens, d_k, d_v = sizes["heads"], sizes["tokens"], sizes["d_k"], sizes["d_v"]
    query, key = randn(heads, tokens, d_k, seed=seed), randn(heads, tokens, d_k, seed=seed + 10)
    value = randn(heads, tokens, d_v, seed=seed + 20)
    gla = ch04.gla_gates(randn(heads, tokens, d_k, seed=seed + 30))
    retnet = ch04.retention_decays(heads)[:, None, None]
    resets = gla.clone()
    resets[..., ::5, :] = 0.0  # a gate of 0 empties the row
    for gate in (gla, retnet, resets, torch.ones(1, dtype=F64)):
        by_loop, state = ch04.gated_linear_attention(query, key, value, gate)
        assert by_loop.shape == (heads, tokens, d_v) and state.shape == (heads, d_k, d_v)
        assert torch.allclose(ch04.gated_linear_attention_scan(query, key, value, gate), by_loop, atol=1e-12)


def test_gated_linear_attention_matches_its_definition_and_linear_attention():
    query, key, value = randn(2, 11, 3, seed=1), randn(2, 11, 3, seed=2), randn(2, 11, 4, seed=3)
    gate = ch04.gla_gates(randn(2, 11, 3, seed=4))
    outputs, state = ch04.gated_linear_attention(query, key, value, gate)
    by_hand = torch.zeros(2, 3, 4, dtype=F64)
    for t in range(11):
        by_hand = gate[:, t, :, None] * by_hand + torch.einsum("hi,hj->hij", key[:, t], value[:, t])
        assert torch.allclose(outputs[:, t], torch.einsum("hi,hij->hj", query[:, t], by_hand), atol=1e-12)
    assert torch.allclose(state, by_hand, atol=1e-12)
    # with every keep factor 1 and phi applied, the table is linear attention's S
    _, ones_state = ch04.gated_linear_attention(query, ch04.feature_map(key), value, torch.ones(1, dtype=F64))
    _, (summed, _) = ch04.linear_attention_recurrent(query, key, value)
    assert torch.allclose(ones_state, summed, atol=1e-12)
    # a retention head's contribution of token s to step t is gamma^(t - s) (q_t . k_s) v_s
    gamma = ch04.retention_decays(1)[0]
    retained, _ = ch04.gated_linear_attention(query, key, value, gamma.reshape(1, 1))
    ages = torch.arange(11)[:, None] - torch.arange(11)[None, :]
    weights = torch.where(ages >= 0, gamma ** ages.clamp(min=0), torch.zeros((), dtype=F64))
    assert torch.allclose(retained, (query @ key.transpose(-2, -1) * weights) @ value, atol=1e-12)


def test_delta_rule_equals_its_definition(seed=7):
    query, value = randn(3, 13, 5, seed=seed), randn(3, 13, 2, seed=seed + 1)
    key = F.normalize(randn(3, 13, 5, seed=seed + 2), dim=-1)
    strength = torch.rand(3, 13, generator=torch.Generator().manual_seed(seed), dtype=F64)
    outputs, state = ch04.delta_rule(query, key, value, strength)
    by_hand = torch.zeros(3, 5, 2, dtype=F64)
    for t in range(13):
        k, beta = key[:, t], strength[:, t]
        update = torch.eye(5, dtype=F64) - beta[:, None, None] * k[:, :, None] * k[:, None, :]
        by_hand = update @ by_hand + beta[:, None, None] * k[:, :, None] * value[:, t, None, :]
        assert torch.allclose(outputs[:, t], torch.einsum("hi,hij->hj", query[:, t], by_hand), atol=1e-12)
    assert torch.allclose(state, by_hand, atol=1e-12)
    # beta = 0 writes nothing; with unit keys the state reads back (1 - beta) old + beta new
    assert torch.equal(ch04.delta_rule(query, key, value, torch.zeros(3, 13, dtype=F64))[1], torch.zeros(3, 5, 2, dtype=F64))


def test_delta_rule_recalls_an_overwritten_key_exactly_where_a_sum_does_not():
    keys = torch.eye(4, dtype=F64)[[0, 1, 2, 0, 3]]  # key 0 written, then written again
    values = torch.tensor([[5.0], [-1.0], [2.0], [9.0], [4.0]], dtype=F64)
    _, state = ch04.delta_rule(keys, keys, values, torch.ones(5, dtype=F64))
    assert (torch.eye(4, dtype=F64) @ state)[:, 0].tolist() == [9.0, -1.0, 2.0, 4.0]
    _, summed = ch04.gated_linear_attention(keys, keys, values, torch.ones(1, dtype=F64))
    assert summed[0, 0].item() == 14.0  # the old and new values added up
    _, faded = ch04.gated_linear_attention(keys, keys, values, torch.full((1,), 0.5, dtype=F64))
    assert faded[0, 0].item() == 5.0 * 0.5**4 + 9.0 * 0.5  # both, faded by age
    # a key rotated within the table: overwrite is exact for any unit key
    rotation = torch.linalg.qr(randn(4, 4, seed=3))[0]
    turned = keys @ rotation
    _, state = ch04.delta_rule(turned, turned, values, torch.ones(5, dtype=F64))
    assert torch.allclose(rotation @ state, torch.tensor([[9.0], [-1.0], [2.0], [4.0]], dtype=F64), atol=1e-12)


def test_the_delta_rule_is_not_an_elementwise_scan():
    key = F.normalize(randn(20, 6, seed=11), dim=-1)
    value, query = randn(20, 3, seed=12), randn(20, 6, seed=13)
    ones = torch.ones(20, dtype=F64)
    exact, _ = ch04.delta_rule(query, key, value, ones)
    diagonal = ch04.gated_linear_attention_scan(query, key, value, 1 - key**2)
    assert (exact - diagonal).abs().max() > 0.1
    # with keys that never overlap the diagonal is the whole matrix, and the two agree
    one_hot = torch.eye(6, dtype=F64)[torch.arange(20) % 6]
    exact, _ = ch04.delta_rule(query, one_hot, value, ones)
    assert torch.allclose(ch04.gated_linear_attention_scan(query, one_hot, value, 1 - one_hot**2), exact, atol=1e-12)


def test_gated_rules_reject_bad_input():
    good = randn(2, 5, 3, seed=0)
    with pytest.raises(ValueError, match="heads"):
        ch04.retention_decays(0)
    with pytest.raises(TypeError, match="heads"):
        ch04.retention_decays(2.0)
    with pytest.raises(ValueError, match="temperature"):
        ch04.gla_gates(good, temperature=0)
    with pytest.raises(TypeError, match="gate"):
        ch04.gated_linear_attention(good, good, good, 0.5)
    with pytest.raises(ValueError, match="key"):
        ch04.gated_linear_attention(good, good[0, 0], good, torch.ones(1, dtype=F64))
    with pytest.raises(ValueError, match="strength"):
        ch04.delta_rule(good, good, good, torch.ones(2, 4, dtype=F64))
    with pytest.raises(TypeError, match="value"):
        ch04.delta_rule(good, good, good.long(), torch.ones(2, 5, dtype=F64))


def test_scan_rounds_of_no_steps_is_zero():
    assert ch04.scan_rounds(0) == 0 and ch04.scan_rounds(1) == 0


# --------------------------------------------------------------------------- Mamba's selective scan


def selective_scan_reference(u, delta, A, B, C, D=None):
    """Mamba's selective_scan_ref, written out step by step: decay exp(delta A), input delta B u."""
    batch, channels, length = u.shape
    state = torch.zeros(batch, channels, A.shape[1], dtype=u.dtype)
    outputs = []
    for t in range(length):
        decay = torch.exp(torch.einsum("bd,dn->bdn", delta[:, :, t], A))
        write = torch.einsum("bd,bn,bd->bdn", delta[:, :, t], B[:, :, t], u[:, :, t])
        state = decay * state + write
        outputs.append(torch.einsum("bdn,bn->bd", state, C[:, :, t]))
    y = torch.stack(outputs, dim=2)
    return y if D is None else y + u * D[:, None]


def random_selective_inputs(batch, channels, state, length, seed):
    generator = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=generator, dtype=F64)  # noqa: E731
    return (draw(batch, channels, length), F.softplus(draw(batch, channels, length)),
            -torch.exp(draw(channels, state)), draw(batch, state, length), draw(batch, state, length),
            draw(channels))


@pytest.mark.parametrize("seed", range(8))
def test_selective_scan_equals_the_reference_loop_at_random_shapes(seed):
    sizes = random_sizes(seed, batch=(1, 3), channels=(1, 5), state=(1, 6), length=(1, 40))
    if seed == 0:
        sizes["length"] = 1  # length 1 always among them
    u, delta, A, B, C, D = random_selective_inputs(*sizes.values(), seed=seed)
    assert torch.allclose(ch04.selective_scan(u, delta, A, B, C, D),
                          selective_scan_reference(u, delta, A, B, C, D), atol=1e-12)
    assert torch.allclose(ch04.selective_scan(u, delta, A, B, C),
                          selective_scan_reference(u, delta, A, B, C), atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 2, 5), (1, 2, 3, 8)])
def test_selective_scan_passes_gradcheck(shape):
    inputs = [t.requires_grad_() for t in random_selective_inputs(*shape, seed=sum(shape))]
    assert torch.autograd.gradcheck(ch04.selective_scan, inputs)


def test_selective_scan_with_constant_steps_is_the_convolution_of_equation_4_5():
    u, delta, A, B, C, _ = random_selective_inputs(2, 3, 4, 50, seed=30)
    delta, B, C = delta[..., :1].expand_as(delta), B[..., :1].expand_as(B), C[..., :1].expand_as(C)
    y = ch04.selective_scan(u, delta, A, B, C)
    for i in range(2):
        for d in range(3):
            step = delta[i, d, 0]
            expected = ch04.ssm_convolution(u[i, d], torch.diag(torch.exp(step * A[d])), step * B[i, :, 0], C[i, :, 0])
            assert torch.allclose(y[i, d], expected, atol=1e-10)


def test_carry_under_delta_b_weighs_4_50_not_0_89():
    one = lambda v: v.reshape(1, 1, -1)  # noqa: E731
    ones = one(torch.ones(len(SENTENCE), dtype=F64))
    y = ch04.selective_scan(one(FIRST_ONLY), one(ch04.step_sizes(CARRY_MARKERS)),
                            torch.tensor([[-1.0]], dtype=F64), ones, ones)
    assert f"{y[0, 0, -1].item():.2f}" == "4.50"


def test_time_invariant_layer_is_a_convolution_per_channel():
    torch.manual_seed(5)
    layer = ch04.SelectiveSSMLayer(8, state_size=3, expand=2, selective=False).double()
    x = randn(2, 13, 8, seed=6)
    with torch.no_grad():
        u, gate = layer.in_proj(x).chunk(2, dim=-1)
        u = F.silu(u)
        delta, A = F.softplus(layer.dt_bias), -layer.A_log.exp()
        y = torch.zeros_like(u)
        for d in range(u.shape[-1]):
            kernel_A = torch.diag(torch.exp(delta[d] * A[d]))
            for i in range(2):
                y[i, :, d] = ch04.ssm_convolution(u[i, :, d], kernel_A, delta[d] * layer.B, layer.C) + layer.D[d] * u[i, :, d]
        expected = layer.out_proj(y * F.silu(gate))
        assert torch.allclose(layer(x), expected, atol=1e-10)


def test_selective_layer_is_not_time_invariant_and_trains_every_parameter():
    torch.manual_seed(7)
    layer = ch04.SelectiveSSMLayer(16, state_size=4, expand=1).double()
    x = randn(3, 11, 16, seed=8)
    out = layer(x)
    assert out.shape == (3, 11, 16)
    out.square().mean().backward()
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    # the same token gets a different step size in a different context: input-dependent delta
    with torch.no_grad():
        u = F.silu(layer.in_proj(x).chunk(2, dim=-1)[0])
        dt = layer.x_proj(u)[..., : layer.dt_rank]
        assert not torch.allclose(F.softplus(layer.dt_proj(dt))[0, 0], F.softplus(layer.dt_proj(dt))[0, 1])
    initial = F.softplus(ch04.SelectiveSSMLayer(16, expand=1).dt_proj.bias)
    assert initial.min().item() == pytest.approx(1e-3, rel=1e-3) and initial.max().item() == pytest.approx(0.1, rel=1e-3)


def test_selective_layer_rejects_bad_input():
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        ch04.SelectiveSSMLayer(0)
    with pytest.raises(TypeError, match="selective must be True or False"):
        ch04.SelectiveSSMLayer(8, selective="yes")
    with pytest.raises(TypeError, match="state_size must be an int"):
        ch04.SelectiveSSMLayer(8, state_size=2.0)


# --------------------------------------------------------------------------- selective copying


def test_selective_copying_batch_places_symbols_in_order_among_filler():
    inputs, targets = ch04.selective_copying_batch(50, 24, 4, 8, torch.Generator().manual_seed(3))
    assert inputs.shape == (50, 28) and targets.shape == (50, 4)
    assert inputs.dtype == targets.dtype == torch.int64
    assert (inputs[:, 24:] == torch.arange(1, 5)).all()  # the recall tokens
    body = inputs[:, :24]
    assert ((body == 0) | (body >= 5)).all() and ((body >= 5).sum(dim=1) == 4).all()
    for row, target in zip(body, targets, strict=True):
        assert (row[row > 0] - 5).tolist() == target.tolist()  # in their order
    again, _ = ch04.selective_copying_batch(50, 24, 4, 8, torch.Generator().manual_seed(3))
    assert torch.equal(inputs, again)
    assert targets.min() >= 0 and targets.max() <= 7


def test_copying_models_and_a_short_training_run():
    vocab, width = 13, 8
    torch.manual_seed(0)
    attention = ch04.CopyingModel(vocab, width, ch04.PositionalAttention(width, 2, 28), 8)
    logits = attention(ch04.selective_copying_batch(2, 24, 4, 8, torch.Generator().manual_seed(0))[0])
    assert logits.shape == (2, 28, 8)
    runs = []
    for _ in range(2):
        torch.manual_seed(1)
        model = ch04.CopyingModel(vocab, width, ch04.SelectiveSSMLayer(width, 2, expand=1), 8)
        runs.append(ch04.train_copying(model, steps=3, length=24, copies=4, symbols=8, batch_size=4, test_size=20))
    assert len(runs[0]["losses"]) == 3 and 0.0 <= runs[0]["accuracy"] <= 1.0
    assert runs[0] == runs[1]  # seeded: the same run twice


def test_copying_rejects_bad_input():
    with pytest.raises(TypeError, match=r"mixer must be a torch\.nn\.Module"):
        ch04.CopyingModel(10, 8, lambda x: x, 4)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        ch04.train_copying(ch04.CopyingModel(10, 8, torch.nn.Identity(), 4), steps=0, length=8, copies=2, symbols=4)
    with pytest.raises(ValueError, match="mixer must be one of"):
        ch04.copying_trial("transformer", 0)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        ch04.copying_trial("attention", -1)


@pytest.mark.slow  # trains a model
def test_copying_trial_is_seeded_and_trains_the_named_mixer():
    first = ch04.copying_trial("selective SSM", 3, steps=4)
    again = ch04.copying_trial("selective SSM", 3, steps=4)
    assert first["losses"] == again["losses"] and first["accuracy"] == again["accuracy"]
    assert len(first["losses"]) == 4 and 0.0 <= first["accuracy"] <= 1.0
    sizes = {name: ch04.copying_trial(name, 0, steps=1)["parameters"] for name in ch04.COPYING_MIXERS}
    assert sizes["selective SSM"] > sizes["time-invariant SSM"]  # x_proj and dt_proj
    assert ch04.COPYING_TASK == {"length": 24, "copies": 4, "symbols": 8}


def test_saved_copying_seeds_say_what_the_chapter_says():
    from longctx import support

    saved, _ = support.load_results("copying")
    by_seed = {}
    for trial in saved["trials"]:
        by_seed.setdefault(trial["seed"], {})[trial["mixer"]] = trial["accuracy"]
    assert len(by_seed) >= 3
    assert all(row["selective SSM"] > row["time-invariant SSM"] for row in by_seed.values())
    assert 0 < sum(row["selective SSM"] > row["attention"] for row in by_seed.values()) < len(by_seed)


# --------------------------------------------------------------------------- hybrids


def _gemma():
    return ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))


def test_hybrid_and_ssm_state_bytes_at_gemma_shape():
    assert ch04.ssm_state_bytes(2304, 16) == 73_728  # Gemma 3 1B's width, Mamba's expand 2
    gemma = _gemma()
    every_global = replace(gemma, window=None, windowed_layers=0)
    one_layer = replace(every_global, layers=1)
    assert ch03.kv_bytes(one_layer, 72) == ch04.ssm_state_bytes(2304, 16)  # the break-even
    at_32k = ch04.hybrid_cache_bytes(32_768, every_global, attention_layers=4, channels=2304)
    assert at_32k == 4 * 32_768 * 1024 + 22 * 73_728
    assert round(at_32k / 2**20, 1) == 129.5
    assert ch04.hybrid_cache_bytes(32_768, every_global, attention_layers=0, channels=2304) == 26 * 73_728
    for tokens in (0, 1, 512, 32_768):
        assert ch04.hybrid_cache_bytes(tokens, every_global, attention_layers=26, channels=2304) == (
            ch03.kv_bytes(every_global, tokens))
        assert ch04.hybrid_cache_bytes(tokens, every_global, attention_layers=4, channels=2304, state_size=8) == (
            ch03.kv_bytes(replace(every_global, layers=4), tokens) + 22 * ch04.ssm_state_bytes(2304, 8))


def test_hybrid_rejects_bad_input():
    every_global = replace(_gemma(), window=None, windowed_layers=0)
    with pytest.raises(ValueError, match="attention_layers must be an integer <= 26"):
        ch04.hybrid_cache_bytes(10, every_global, attention_layers=27, channels=8)
    with pytest.raises(ValueError, match="tokens must be an integer >= 0"):
        ch04.hybrid_cache_bytes(-5, every_global, attention_layers=0, channels=8)
    with pytest.raises(ValueError, match="channels must be a positive integer"):
        ch04.ssm_state_bytes(0, 16)
    with pytest.raises(ValueError, match="no windowed layers"):
        ch04.hybrid_cache_bytes(10, _gemma(), attention_layers=4, channels=8)
    with pytest.raises(TypeError, match="config must be"):
        ch04.hybrid_cache_bytes(10, {"layers": 4}, attention_layers=1, channels=8)


# --------------------------------------------------------------------------- quantized caches


def test_quantized_cache_worked_example_with_one_loud_channel():
    key = torch.randn(1, 16, generator=torch.Generator().manual_seed(1797)).round(decimals=2)
    key[0, 9] = 6.0
    quiet = torch.arange(16) != 9
    codes, scale = ch04.quantize_kv(key, 4)
    assert codes[0, 9].item() == 7 and scale.item() == pytest.approx(6.0 / 7)
    zeroed_4 = int((codes[0][quiet] == 0).sum())
    codes_3, scale_3 = ch04.quantize_kv(key, 3)
    assert codes_3[0, 9].item() == 3 and scale_3.item() == pytest.approx(2.0)
    zeroed_3 = int((codes_3[0][quiet] == 0).sum())
    assert 0 < zeroed_4 < zeroed_3 < 15
    # RUNNING_EXAMPLE (Gemma 3 1B, every layer global): 52 vectors of 256 numbers
    assert ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 4) == 52 * 130 == 6_760
    assert ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 8) == 52 * 258
    assert ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 3) == 52 * 98
    assert round(26_624 / 6_760, 2) == 3.94


def test_quantized_bytes_match_chapter3_without_scales():
    for config in (ch04.RUNNING_EXAMPLE,
                   ch03.KVConfig(name="y", layers=5, query_heads=6, head_dim=24, bytes_per_scalar=2, kv_heads=3)):
        assert ch04.quantized_kv_bytes_per_token(config, 16, scale_bytes=0) == ch03.kv_bytes(config, 1)
        assert ch04.quantized_kv_bytes_per_token(config, 8, scale_bytes=0) * 2 == ch03.kv_bytes(config, 1)


def test_quantized_bytes_of_a_latent_cache():
    lite = ch03.KVConfig.from_hf_config(ch03.load_model_config("deepseek-v2-lite"))
    assert ch04.quantized_kv_bytes_per_token(lite, 16, scale_bytes=0) == ch03.kv_bytes(lite, 1)
    assert ch04.quantized_kv_bytes_per_token(lite, 4) == 27 * ((512 + 64) * 4 // 8 + 2)  # the text's 7.6 KiB
    assert round(ch04.quantized_kv_bytes_per_token(lite, 4) / 1024, 1) == 7.6


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
    error_8, error_6, error_4 = (ch04.quantized_cache_error(bits) for bits in (8, 6, 4))
    assert error_8 < 0.01 < error_6 < error_4 < 0.25
    for bits in (6, 5, 4, 3):  # three loud channels: per-channel keys cut the error
        per_token = ch04.quantized_cache_error(bits, keys_per="token", outlier_channels=3)
        per_channel = ch04.quantized_cache_error(bits, keys_per="channel", outlier_channels=3)
        assert per_channel < (0.5 if bits >= 4 else 0.7) * per_token
        plain = ch04.quantized_cache_error(bits, keys_per="token")
        assert abs(ch04.quantized_cache_error(bits, keys_per="channel") - plain) < 0.1 * plain
    assert ch04.quantized_cache_error(2) > 0.9  # levels -1, 0, 1 only


def test_quantization_rejects_bad_input():
    x = randn(4, 8, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match="per must be one of 'token', 'channel'"):
        ch04.quantize_kv(x, 4, per="head")
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 16"):
        ch04.quantize_kv(x, 1)
    with pytest.raises(ValueError, match="bits must be an integer from 2 to 16"):
        ch04.quantize_kv(x, 17)
    with pytest.raises(TypeError, match="bits must be an int"):
        ch04.quantize_kv(x, 4.0)
    with pytest.raises(ValueError, match="bits must be an integer from 1 to 16"):
        ch04.quantized_kv_bytes_per_token(ch04.RUNNING_EXAMPLE, 0)
    with pytest.raises(ValueError, match=r"^outlier_channels must be at most dim \(got outlier_channels=300 and dim=256\)$"):
        ch04.quantized_cache_error(4, outlier_channels=300)
    with pytest.raises(ValueError, match="keys_per must be one of"):
        ch04.quantized_cache_error(4, keys_per="head")


# --------------------------------------------------------------------------- putting it together


def test_cache_bytes_by_design_on_gemma():
    gemma = _gemma()
    sizes = ch04.cache_bytes_by_design(32_768, gemma, channels=2304)
    assert list(sizes) == ["as shipped", "every layer global", "a state in each windowed layer",
                           "a state in every layer"]
    assert sizes["as shipped"] == ch03.kv_bytes(gemma, 32_768) == 139 * 2**20  # 4 x 32 MiB + 22 x 0.5 MiB
    assert sizes["every layer global"] == 26 * 32 * 2**20
    assert sizes["a state in each windowed layer"] == 4 * 32 * 2**20 + 22 * 73_728
    assert sizes["a state in every layer"] == 26 * 73_728
    assert sizes["a state in every layer"] < sizes["a state in each windowed layer"] < sizes["as shipped"]


def test_cache_bytes_by_design_without_a_window():
    llama = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
    sizes = ch04.cache_bytes_by_design(1000, llama, channels=8192, state_size=4)
    assert sizes["as shipped"] == sizes["every layer global"] == sizes["a state in each windowed layer"]
    assert sizes["a state in every layer"] == 32 * 8192 * 4 * 2
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    short, long = (ch04.cache_bytes_by_design(t, mistral, channels=8192) for t in (4096, 1_048_576))
    assert short["as shipped"] == long["as shipped"] == 512 * 2**20  # every layer windowed: a cap
    assert long["a state in each windowed layer"] == long["a state in every layer"]  # no global layer
    assert long["every layer global"] == 256 * short["every layer global"]
    lite = ch03.KVConfig.from_hf_config(ch03.load_model_config("deepseek-v2-lite"))
    assert ch04.cache_bytes_by_design(10, lite, channels=4096)["as shipped"] == 10 * 27 * 576 * 2


def test_cache_bytes_by_design_rejects_bad_input():
    with pytest.raises(ValueError, match="tokens must be an integer >= 0"):
        ch04.cache_bytes_by_design(-1, _gemma(), channels=8)
    with pytest.raises(ValueError, match="channels must be a positive integer"):
        ch04.cache_bytes_by_design(10, _gemma(), channels=0)
    with pytest.raises(TypeError, match="config must be"):
        ch04.cache_bytes_by_design(10, None, channels=8)


# --------------------------------------------------------------------------- the chapter's text

CHAPTER = __import__("pathlib").Path(__file__).resolve().parents[1] / "chapters" / "ch04-efficient-architectures.qmd"
PAGES = sorted(CHAPTER.parent.glob("ch04-*.qmd"))  # the chapter's pages: its first, then states and hybrids


def test_every_diagram_is_a_labelled_captioned_figure():
    text = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    diagrams = re.findall(r"```\{mermaid\}\n((?:%%\|.*\n)*)", text)
    assert diagrams
    for options in diagrams:
        assert re.search(r"^%%\| label: fig-ch04-[a-z0-9-]+$", options, re.M), options
        assert re.search(r'^%%\| fig-cap: ".+\?"$', options, re.M), options  # a question
        assert re.search(r'^%%\| fig-alt: ".{40,}"$', options, re.M), options


def test_no_stray_timing_output_and_papers_figures_are_exempted_in_the_opening():
    text = CHAPTER.read_text(encoding="utf-8")
    assert "chapter executed in" not in text and "CHAPTER_START" not in text
    opening = text[: text.index("## What one more token costs")]
    assert "Numbers from\npapers" in opening  # the quoted figures are the papers' own


@pytest.mark.slow  # trains a model
def test_copying_runner_writes_every_mixer_for_every_seed(tmp_path):
    import json

    from experiments import copying
    from experiments.__main__ import main
    out = tmp_path / "copying.json"
    assert main(["copying", "--size", "tiny", "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["task"] == ch04.COPYING_TASK and saved["steps"] == copying.TINY.steps == 2
    assert {(t["seed"], t["mixer"]) for t in saved["trials"]} == {
        (seed, mixer) for seed in copying.TINY.seeds for mixer in ch04.COPYING_MIXERS}
    assert saved["machine"]["mode"] == "tiny" and saved["machine"]["processes"] == 1
    assert saved["machine"]["cpu_seconds"] >= sum(t["cpu_seconds"] for t in saved["trials"])
