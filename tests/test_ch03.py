"""Tests for Chapter 3 (chapters/ch03-long-context.qmd): KV accounting, GQA/MQA, the latent cache,
visibility masks, RoPE and its scaling constructions, and the retrieval probe."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from longctx import ch01, ch02, ch03, support
from torch.utils._python_dispatch import TorchDispatchMode

GIB = 2**30
FAST = settings(max_examples=25, deadline=None)


def mha_7b() -> ch03.KVConfig:
    return ch03.KVConfig("MHA", layers=32, query_heads=32, kv_heads=32, head_dim=128, bytes_per_scalar=2)


# --- KV accounting (@eq-ch03-kvbytes) -----------------------------------------------------------


def test_kv_bytes_golden_values_of_the_opening_example():
    config = mha_7b()
    assert kv_bytes_per_token(config) == 524_288
    assert ch03.kv_bytes(config, 4_096) == 2 * GIB
    assert ch03.kv_bytes(config, 131_072) == 64 * GIB
    assert ch03.kv_bytes(config, 131_072, batch=3) == 3 * 64 * GIB
    assert ch03.kv_bytes(config, 0) == 0


def test_kv_bytes_golden_values_of_the_symbols_table():
    """@tbl-ch03-symbols: TinyGPT, Gemma 3 1B and Mistral 7B at their accepted lengths, every layer global."""
    tiny = ch03.KVConfig("TinyGPT", layers=2, query_heads=4, kv_heads=4, head_dim=16, bytes_per_scalar=4)
    gemma = ch03.KVConfig("Gemma", layers=26, query_heads=4, kv_heads=1, head_dim=256, bytes_per_scalar=2)
    mistral = ch03.KVConfig("Mistral", layers=32, query_heads=32, kv_heads=8, head_dim=128, bytes_per_scalar=2)
    assert [ch03.kv_bytes(c, 1) for c in (tiny, gemma, mistral)] == [1_024, 26_624, 131_072]
    assert ch03.kv_bytes(tiny, 128) == 128 * 1024
    assert ch03.kv_bytes(gemma, 32_768) == 832 * 2**20
    assert ch03.kv_bytes(mistral, 32_768) == 4 * GIB
    # Chapter 2's width-d count charges Gemma's 1,152-wide model 4.5 times the bytes its 256-wide keys take.
    as_tinygpt = ch02.GPTConfig(vocab_size=262_144, d_model=1_152, layers=26, heads=4)
    assert ch02.kv_cache_bytes(as_tinygpt, 32_768, bytes_per_scalar=2) == 4.5 * ch03.kv_bytes(gemma, 32_768)


def test_kv_bytes_given_a_config_mapping_says_how_to_build_a_kvconfig():
    mapping = ch03.load_model_config("llama-3.1-8b")
    with pytest.raises(TypeError, match=r"KVConfig\.from_hf_config\(mapping\)"):
        ch03.kv_bytes(mapping, 4_096)
    with pytest.raises(TypeError, match=r"^config must be a KVConfig \(got int 3\)$"):
        ch03.kv_bytes(3, 4_096)
    config = ch03.KVConfig.from_hf_config(mapping)
    assert ch03.kv_bytes(config, 4_096) == 4_096 * 32 * 2 * 8 * 128 * 2  # T L (K and V) H_kv d_h s


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_both_float8_formats_are_one_byte_a_number(dtype):
    mapping = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": dtype}
    assert ch03.read_head_fields(mapping)["bytes_per_scalar"] == 1


def kv_bytes_per_token(config: ch03.KVConfig) -> int:
    return ch03.kv_bytes(config, 1)


@FAST
@given(layers=st.integers(1, 8), kv=st.integers(1, 4), group=st.integers(1, 4), width=st.integers(1, 16),
       s=st.sampled_from([1, 2, 4]), tokens=st.integers(0, 500), batch=st.integers(1, 4))
def test_kv_bytes_is_the_product_of_the_equation(layers, kv, group, width, s, tokens, batch):
    config = ch03.KVConfig("x", layers=layers, query_heads=kv * group, kv_heads=kv, head_dim=width,
                           bytes_per_scalar=s)
    assert ch03.kv_bytes(config, tokens, batch) == batch * tokens * layers * 2 * kv * width * s


def test_kv_bytes_agrees_with_chapter_2_for_multi_head_attention():
    tiny = ch02.GPTConfig(vocab_size=256)
    tiny_kv = ch03.KVConfig("tiny", layers=tiny.layers, query_heads=tiny.heads, kv_heads=tiny.heads,
                            head_dim=tiny.head_dim, bytes_per_scalar=4)
    big = ch02.GPTConfig(vocab_size=32_000, d_model=4_096, layers=32, heads=32)
    for tokens in (0, 1, 77, 4_096):
        assert ch03.kv_bytes(tiny_kv, tokens, batch=2) == ch02.kv_cache_bytes(tiny, tokens, batch=2)
        assert ch03.kv_bytes(mha_7b(), tokens) == ch02.kv_cache_bytes(big, tokens, bytes_per_scalar=2)


def test_latent_and_windowed_widths():
    latent = ch03.KVConfig("mla", layers=27, query_heads=16, head_dim=128, bytes_per_scalar=2,
                           latent_rank=512, rope_key_dim=64)
    assert latent.cached_scalars_per_layer_token() == 576
    mixed = ch03.KVConfig("mix", layers=32, query_heads=32, kv_heads=8, head_dim=128, bytes_per_scalar=2,
                          window=4_096, windowed_layers=24)
    assert ch03.kv_bytes(mixed, 131_072) == (8 * 131_072 + 24 * 4_096) * 4_096
    assert round(ch03.kv_bytes(mixed, 131_072) / GIB, 2) == 4.38
    assert ch03.kv_bytes(mixed, 1_000) == 32 * 1_000 * 4_096          # below the window nothing is cut


@pytest.mark.parametrize("name, per_token, at_128k", [
    ("llama-2-7b", 524_288, 64 * GIB),
    ("llama-3.1-8b", 131_072, 16 * GIB),
    ("deepseek-v2-lite", 27 * 576 * 2, 27 * 576 * 2 * 131_072),
    ("mistral-7b-v0.1", 131_072, 32 * 4_096 * 4_096),
    ("gemma-3-1b", 26 * 1_024, (4 * 131_072 + 22 * 512) * 1_024),
])
def test_each_shipped_config(name, per_token, at_128k):
    raw = ch03.load_model_config(name)
    assert raw["_source"].split("/")[0] in {"meta-llama", "deepseek-ai", "mistralai", "google"}
    assert "config.json" in raw["_source"]
    config = ch03.KVConfig.from_hf_config(raw)
    assert ch03.kv_bytes(config, 1) == per_token
    assert ch03.kv_bytes(config, 131_072) == at_128k


def test_from_hf_config_fields():
    llama31 = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"), name="L")
    assert (llama31.name, llama31.layers, llama31.query_heads, llama31.kv_heads, llama31.head_dim,
            llama31.bytes_per_scalar, llama31.window) == ("L", 32, 32, 8, 128, 2, None)
    deepseek = ch03.KVConfig.from_hf_config(ch03.load_model_config("deepseek-v2-lite"))
    assert (deepseek.kv_heads, deepseek.latent_rank, deepseek.rope_key_dim, deepseek.head_dim) == (None, 512, 64, 128)
    gemma = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    assert (gemma.window, gemma.windowed_layers, gemma.kv_heads, gemma.head_dim) == (512, 22, 1, 256)
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    assert (mistral.window, mistral.windowed_layers) == (4_096, 32)
    base = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "float32",
            "sliding_window": 8}
    assert ch03.KVConfig.from_hf_config({**base, "use_sliding_window": False}).window is None
    assert ch03.KVConfig.from_hf_config({**base, "layer_types": ["sliding_attention", "full_attention"] * 2}
                                        ).windowed_layers == 2
    assert ch03.KVConfig.from_hf_config({**base, "model_type": "gemma2"}).windowed_layers == 2
    nested = ch03.KVConfig.from_hf_config({"model_type": "x", "text_config": base})
    assert nested.kv_heads == 4 and nested.head_dim == 16 and nested.bytes_per_scalar == 4
    assert ch03.KVConfig.from_hf_config({**base, "torch_dtype": None}, bytes_per_scalar=1).bytes_per_scalar == 1


@pytest.mark.parametrize("missing", ["num_hidden_layers", "num_attention_heads", "torch_dtype", "hidden_size"])
def test_from_hf_config_names_a_missing_field(missing):
    raw = dict(ch03.load_model_config("llama-2-7b"))
    del raw[missing]
    with pytest.raises(ValueError, match=missing):
        ch03.KVConfig.from_hf_config(raw)


def test_from_hf_config_rejects_bad_input():
    with pytest.raises(TypeError, match="mapping"):
        ch03.KVConfig.from_hf_config([1, 2])
    raw = {**ch03.load_model_config("llama-2-7b"), "torch_dtype": "float7"}
    with pytest.raises(ValueError, match="torch_dtype must be one of"):
        ch03.KVConfig.from_hf_config(raw)


def test_load_model_config_lists_what_is_shipped():
    assert set(ch03.MODEL_CONFIG_NAMES) <= {p.stem for p in support.data_path("configs").glob("*.json")}
    with pytest.raises(ValueError, match="llama-2-7b"):
        ch03.load_model_config("gpt-5")
    with pytest.raises(TypeError, match="name"):
        ch03.load_model_config(7)


@pytest.mark.parametrize("tokens, batch, error, message", [
    (-1, 1, ValueError, "tokens"), (10, 0, ValueError, "batch"), (1.5, 1, TypeError, "tokens"),
    (10, True, TypeError, "batch"),
])
def test_kv_bytes_rejects_bad_counts(tokens, batch, error, message):
    with pytest.raises(error, match=message):
        ch03.kv_bytes(mha_7b(), tokens, batch)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kv_heads=5), "kv_heads must divide query_heads"),
    (dict(kv_heads=None), "exactly one of kv_heads"),
    (dict(kv_heads=8, latent_rank=16), "exactly one of kv_heads"),
    (dict(kv_heads=8, layers=0), "layers"),
    (dict(kv_heads=8, windowed_layers=3), r"^windowed_layers=3 needs window \(got window=None\)$"),
    (dict(kv_heads=8, window=16, windowed_layers=40), "windowed_layers"),
    (dict(kv_heads=8, rope_key_dim=-2), "rope_key_dim"),
])
def test_kvconfig_rejects_inconsistent_fields(kwargs, message):
    fields = dict(name="x", layers=4, query_heads=32, head_dim=8, bytes_per_scalar=2) | kwargs
    with pytest.raises(ValueError, match=message):
        ch03.KVConfig(**fields)


@pytest.mark.parametrize("field", ["layers", "head_dim", "kv_heads", "window"])
def test_kvconfig_rejects_wrong_types(field):
    fields = dict(name="x", layers=4, query_heads=32, head_dim=8, bytes_per_scalar=2, kv_heads=8,
                  window=16, windowed_layers=2)
    with pytest.raises(TypeError, match=field):
        ch03.KVConfig(**(fields | {field: 2.0}))


def test_readers_split_the_config_by_lever():
    llama31 = ch03.load_model_config("llama-3.1-8b")
    assert ch03.read_head_fields(llama31) == dict(layers=32, query_heads=32, kv_heads=8, head_dim=128,
                                                  bytes_per_scalar=2)
    assert ch03.read_latent_fields(llama31) == {} and ch03.read_window_fields(llama31, 32) == {}
    deepseek = ch03.load_model_config("deepseek-v2-lite")
    assert ch03.read_latent_fields(deepseek) == {"latent_rank": 512, "rope_key_dim": 64}
    gemma = ch03.load_model_config("gemma-3-1b")
    assert ch03.read_window_fields(gemma, 26) == {"window": 512, "windowed_layers": 22}
    assert ch03.read_window_fields({"sliding_window": 8, "sliding_window_pattern": 1}, 4) == {}
    with pytest.raises(ValueError, match="sliding_window"):
        ch03.read_window_fields({"sliding_window": 0}, 4)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ch03.read_latent_fields({"kv_lora_rank": -1})
    with pytest.raises(TypeError, match="num_hidden_layers"):
        ch03.read_head_fields({**llama31, "num_hidden_layers": "32"})


# --- GQA / MQA (@eq-ch03-gqa-ratio) -------------------------------------------------------------


def test_repeat_kv_follows_the_query_head_to_kv_head_order():
    x = torch.arange(2 * 3 * 1 * 1, dtype=torch.float32).view(2, 3, 1, 1)
    repeated = ch03.repeat_kv(x, 4)
    assert repeated.shape == (2, 12, 1, 1)
    for head in range(12):
        assert torch.equal(repeated[:, head], x[:, head // 4])
    assert ch03.repeat_kv(x, 1).shape == x.shape


@FAST
@given(kv=st.integers(1, 3), group=st.integers(1, 4), tq=st.integers(1, 5), past=st.integers(0, 4),
       seed=st.integers(0, 10_000))
def test_grouped_attention_equals_attention_over_repeated_heads(kv, group, tq, past, seed):
    gen = torch.Generator().manual_seed(seed)
    tk = tq + past
    q = torch.randn(2, kv * group, tq, 4, generator=gen)
    k, v = torch.randn(2, kv, tk, 4, generator=gen), torch.randn(2, kv, tk, 6, generator=gen)
    mask = ch01.causal_mask(tk)[past:]
    expected, _ = ch01.scaled_dot_product_attention(q, ch03.repeat_kv(k, group), ch03.repeat_kv(v, group), mask)
    assert torch.allclose(ch03.grouped_attention(q, k, v, mask), expected, atol=1e-6)
    full_mask = mask.expand(2, kv * group, tq, tk)
    assert torch.allclose(ch03.grouped_attention(q, k, v, full_mask), expected, atol=1e-6)
    assert torch.allclose(ch03.grouped_attention(q, k, v), ch01.scaled_dot_product_attention(
        q, ch03.repeat_kv(k, group), ch03.repeat_kv(v, group))[0], atol=1e-6)


@FAST
@given(kv=st.integers(1, 4), group=st.integers(1, 3), head_dim=st.integers(1, 4), length=st.integers(1, 6),
       seed=st.integers(0, 10_000))
def test_gqa_cached_decoding_matches_full_pass(kv, group, head_dim, length, seed):
    torch.manual_seed(seed)
    heads = kv * group
    layer = ch03.GroupedQueryAttention(heads * head_dim, heads, kv).eval()
    x = torch.randn(2, length, heads * head_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full, (keys, values) = layer(x)
        stepped = ch03.decode_token_by_token(layer, x)
    assert torch.allclose(stepped, full, atol=1e-5)
    assert keys.shape == values.shape == (2, kv, length, head_dim)
    config = ch03.KVConfig("t", layers=1, query_heads=heads, kv_heads=kv, head_dim=head_dim, bytes_per_scalar=4)
    assert keys.nbytes + values.nbytes == ch03.kv_bytes(config, length, batch=2)


def test_gqa_chunked_prefill_matches_full_pass():
    torch.manual_seed(1)
    layer = ch03.GroupedQueryAttention(32, 8, 2).eval()
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        full, _ = layer(x)
        first, cache = layer(x[:, :4])
        second, cache = layer(x[:, 4:], cache)
    assert torch.allclose(torch.cat((first, second), 1), full, atol=1e-5)
    assert cache[0].shape == (1, 2, 9, 4)


def test_the_shipped_head_configs_and_the_dial_over_llamas_32_heads():
    # The chapter's table: per-token bytes, the H_kv / H_q fraction and the sessions an 80 GiB device holds.
    names = ("llama-2-7b", "mistral-7b-v0.1", "llama-3.1-8b", "gemma-3-1b")
    raw = {n: ch03.load_model_config(n) for n in names}
    cfg = {n: ch03.KVConfig(n, **ch03.read_head_fields(raw[n])) for n in names}
    per_token = {n: ch03.kv_bytes(c, 1) for n, c in cfg.items()}
    assert per_token == {"llama-2-7b": 524_288, "mistral-7b-v0.1": 131_072, "llama-3.1-8b": 131_072,
                         "gemma-3-1b": 26_624}
    users = {n: 80 * 2**30 // ch03.kv_bytes(c, raw[n]["max_position_embeddings"]) for n, c in cfg.items()}
    assert users == {"llama-2-7b": 40, "mistral-7b-v0.1": 20, "llama-3.1-8b": 5, "gemma-3-1b": 98}
    assert sorted({(c.query_heads, c.kv_heads) for c in cfg.values()}) == [(4, 1), (32, 8), (32, 32)]
    # The dial: Llama's 32 query heads, 4 wide, over the 32 bytes of a corpus line.
    x = torch.randn(1, 32, 128, generator=torch.Generator().manual_seed(1813))
    numbers = {}
    for kv in (32, 16, 8, 4, 2, 1):
        _, (k, v) = ch03.GroupedQueryAttention(128, 32, kv)(x)
        numbers[kv] = k.numel() + v.numel()
    assert numbers[32] == 8_192 and numbers[1] == 256
    assert all(numbers[kv] * 32 == numbers[32] * kv for kv in numbers)       # ratio H_kv / H_q


def test_gqa_layer_names_and_errors():
    layer = ch03.GroupedQueryAttention(64, 8, 2)
    assert layer.key.out_features == layer.value.out_features == 16
    assert layer.query.out_features == layer.output.out_features == 64
    assert all(module.bias is None for module in (layer.query, layer.key, layer.value, layer.output))
    with pytest.raises(ValueError, match="kv_heads must divide query_heads"):
        ch03.GroupedQueryAttention(64, 8, 3)
    with pytest.raises(ValueError, match="query_heads must divide d_model"):
        ch03.GroupedQueryAttention(60, 8, 2)
    with pytest.raises(ValueError, match="positive integer"):
        ch03.GroupedQueryAttention(64, 0, 1)
    with pytest.raises(TypeError, match="kv_heads"):
        ch03.GroupedQueryAttention(64, 8, 2.0)
    with pytest.raises(ValueError, match="groups"):      # -1 would silently copy nothing
        ch03.repeat_kv(torch.randn(1, 2, 2, 4), -1)


def test_grouped_attention_refuses_heads_that_do_not_divide_by_failing_loudly():
    # The kernel checks nothing itself; a head count that does not divide cannot reshape.
    with pytest.raises(RuntimeError):
        ch03.grouped_attention(torch.randn(1, 3, 2, 4), torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4))


def test_gqa_a_cache_that_does_not_fit_the_layer_fails_loudly():
    # forward checks only the cache's kind: every other mismatch must still be an error, never a silent answer.
    layer = ch03.GroupedQueryAttention(64, 8, 2)
    x = torch.randn(1, 3, 64)
    _, (keys, values) = layer(x)
    for bad_x, bad_cache in ((x, (keys.repeat(1, 2, 1, 1), values)),    # four heads, not two
                             (x, (keys, values[..., :4])),             # wrong width
                             (torch.randn(2, 3, 64), (keys, values)),  # another batch
                             (x, (keys, values[:, :, :2]))):           # keys and values disagree
        with pytest.raises((RuntimeError, ValueError)):
            layer(bad_x, bad_cache)
    with pytest.raises(TypeError, match=r"cache must be a tuple \(got tensor"):  # not a pair: named
        layer(x, keys)


# --- the latent cache (@eq-ch03-latent) -----------------------------------------------------------


@FAST
@given(heads=st.integers(1, 4), head_dim=st.integers(1, 4), rank=st.integers(1, 8), rope=st.sampled_from([0, 2, 4]),
       length=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_latent_cached_decoding_matches_full_pass(heads, head_dim, rank, rope, length, seed):
    torch.manual_seed(seed)
    layer = ch03.ToyLatentKVAttention(heads * head_dim, heads, rank, rope_key_dim=rope).eval()
    x = torch.randn(2, length, heads * head_dim, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full, latent = layer(x)
        stepped = ch03.decode_token_by_token(layer, x)
    assert torch.allclose(stepped, full, atol=1e-5)
    assert latent.shape == (2, length, rank + rope) and layer.latent_width() == rank + rope
    config = ch03.KVConfig("t", layers=1, query_heads=heads, head_dim=head_dim, bytes_per_scalar=4,
                           latent_rank=rank, rope_key_dim=rope)
    assert latent.nbytes == ch03.kv_bytes(config, length, batch=2)


def test_deepseek_miniature_keeps_the_real_models_compression_and_attribute_names():
    raw = ch03.load_model_config("deepseek-v2-lite")
    as_mha = ch03.KVConfig("mha", **ch03.read_head_fields(raw))
    latent = ch03.KVConfig("mla", **(ch03.read_head_fields(raw) | {"kv_heads": None} | ch03.read_latent_fields(raw)))
    assert ch03.kv_bytes(as_mha, 1) == 221_184 and ch03.kv_bytes(latent, 1) == 31_104
    assert ch03.kv_bytes(as_mha, 163_840) == 33.75 * 2**30                  # the multi-head reading at its length
    layer = ch03.ToyLatentKVAttention(128, 16, 32, rope_key_dim=4)          # every width / 16 heads
    _, cache = layer(torch.randn(1, 35, 128))
    assert cache.shape == (1, 35, 36) and 256 / 36 == 4_096 / 576            # the same 7.1x as the real model
    plain = ch03.ToyLatentKVAttention(64, 4, 16)
    names = {name: (m.in_features, m.out_features) for name, m in plain.named_children()}
    assert names == {"query": (64, 64), "latent_down": (64, 16), "key_up": (16, 64), "value_up": (16, 64),
                     "output": (64, 64)}
    assert all(m.bias is None for m in plain.children())


def test_a_continuation_is_exact_only_at_the_caches_length():
    torch.manual_seed(1811)
    layer = ch03.ToyLatentKVAttention(128, 16, 32, rope_key_dim=4).eval()
    x = torch.randn(1, 35, 128, generator=torch.Generator().manual_seed(11))
    prefix = 11
    with torch.no_grad():
        full, _ = layer(x)
        _, cache = layer(x[:, :prefix])
        errors = {}
        for start in range(2 * prefix + 1):
            rest, after = layer(x[:, prefix:], cache, start=start)
            assert after.shape == (1, 35, 36)
            errors[start] = (rest - full[:, prefix:]).abs().max().item()
    assert errors[prefix] < 1e-5
    assert min(e for s, e in errors.items() if s != prefix) > 1_000 * errors[prefix]


def test_latent_layer_errors():
    with pytest.raises(ValueError, match="rope_key_dim"):
        ch03.ToyLatentKVAttention(64, 4, 16, rope_key_dim=3)
    with pytest.raises(ValueError, match="query_heads must divide d_model"):
        ch03.ToyLatentKVAttention(63, 4, 16)
    with pytest.raises(ValueError, match="latent_rank"):
        ch03.ToyLatentKVAttention(64, 4, 0)
    with pytest.raises(ValueError, match="rope_base"):
        ch03.ToyLatentKVAttention(64, 4, 16, rope_key_dim=4, rope_base=1.0)
    layer = ch03.ToyLatentKVAttention(64, 4, 16)
    for bad_cache in (torch.randn(1, 3, 15), torch.randn(2, 3, 16)):   # wrong width, another batch
        with pytest.raises(RuntimeError):                             # loud, never silent
            layer(torch.randn(1, 2, 64), bad_cache)


def test_latent_rotary_bands_use_the_layer_base():
    layer = ch03.ToyLatentKVAttention(32, 4, 8, rope_key_dim=6, rope_base=500.0)
    expected = torch.tensor([500.0 ** (-2 * j / 6) for j in range(3)], dtype=torch.float64)
    assert torch.allclose(layer.rotary_bands(), expected, rtol=1e-14)
    assert torch.equal(ch03.ToyLatentKVAttention(32, 4, 8, rope_key_dim=2).rotary_bands(),
                       torch.ones(1, dtype=torch.float64))


# --- the absorbed latent layer (@eq-ch03-absorbed) ---------------------------------------------------


def test_absorbed_layer_names_its_equation():
    from booktools.numbering import book_numbering
    number = book_numbering()["eq-ch03-absorbed"].number
    assert f"Equation {number}" in " ".join(ch03.AbsorbedLatentAttention.__doc__.split())


@FAST
@given(heads=st.integers(1, 4), head_dim=st.integers(1, 6), rank=st.integers(1, 9), rope=st.sampled_from([0, 4]),
       tokens=st.integers(1, 10), past=st.integers(0, 6), seed=st.integers(0, 10_000))
def test_absorbed_latent_attention_equals_expanded(heads, head_dim, rank, rope, tokens, past, seed):
    d_model = heads * head_dim
    torch.manual_seed(seed)
    layer = ch03.AbsorbedLatentAttention(d_model, heads, rank, rope_key_dim=rope).double()
    x = torch.randn(2, past + tokens, d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expanded, expanded_cache = layer(x)
        absorbed, absorbed_cache = layer.forward_absorbed(x)
        assert torch.allclose(absorbed, expanded, atol=1e-10)
        assert torch.equal(absorbed_cache, expanded_cache)
        if past:
            merged = layer.merged_weights()  # once, then reused for every step
            _, cache = layer.forward_absorbed(x[:, :past], merged=merged)
            tail, _ = layer.forward_absorbed(x[:, past:], cache=cache, merged=merged)
            assert torch.allclose(tail, expanded[:, past:], atol=1e-10)
    assert absorbed_cache.shape[-1] == layer.latent_width() == rank + rope


def test_absorbed_decoding_of_the_deepseek_miniature_matches_one_pass():
    torch.manual_seed(1815)
    layer = ch03.AbsorbedLatentAttention(128, 16, 32, rope_key_dim=4).eval()
    x = torch.randn(1, 35, 128, generator=torch.Generator().manual_seed(35))
    with torch.no_grad():
        full, latent = layer(x)
        merged, cache, steps = layer.merged_weights(), None, []
        for t in range(x.size(1)):
            out, cache = layer.forward_absorbed(x[:, t:t + 1], cache, merged=merged)
            steps.append(out)
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    assert torch.allclose(cache, latent, atol=1e-6)  # built a token at a time: rounding apart


def test_merged_weights_are_the_per_head_products():
    torch.manual_seed(2)
    layer = ch03.AbsorbedLatentAttention(12, 3, 5).double()
    to_latent, to_output = layer.merged_weights()
    assert to_latent.shape == (3, 12, 5) and to_output.shape == (3, 5, 12)
    for h in range(3):
        rows = slice(4 * h, 4 * h + 4)
        w_q, w_uk, w_uv = layer.query.weight[rows], layer.key_up.weight[rows], layer.value_up.weight[rows]
        w_o = layer.output.weight[:, rows]
        assert torch.allclose(to_latent[h], w_q.T @ w_uk, atol=1e-12)  # W_Q_h^T W_UK_h
        assert torch.allclose(to_output[h], w_uv.T @ w_o.T, atol=1e-12)  # W_UV_h^T W_O_h^T


def test_absorbed_latent_attention_fails_loudly_on_a_cache_of_the_wrong_width():
    layer = ch03.AbsorbedLatentAttention(8, 2, 3)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):  # PyTorch's own error
        layer.forward_absorbed(torch.randn(2, 3, 8), cache=torch.randn(2, 4, 5))


# --- visibility masks -----------------------------------------------------------------------------


@FAST
@given(n=st.integers(1, 20), window=st.one_of(st.none(), st.integers(1, 25)), sinks=st.integers(0, 5))
def test_visibility_mask_matches_brute_force(n, window, sinks):
    mask = ch03.visibility_mask(n, window, sinks)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    for i in range(n):
        for j in range(n):
            allowed = j <= i and (window is None or i - j < window or j < sinks)
            assert bool(mask[i, j]) == allowed


def test_visibility_mask_defaults_and_counts():
    assert torch.equal(ch03.visibility_mask(12), ch01.causal_mask(12))
    assert int(ch03.visibility_mask(12).sum()) == 78
    assert int(ch03.visibility_mask(12, window=4).sum()) == 42
    assert int(ch03.visibility_mask(12, window=4, sinks=2).sum()) == 42 + 1 + 7 * 2   # row 4 regains key 0 only
    for bad, message in (((5, 0), "window"), ((5, 2, -1), "sinks")):   # silently wrong masks
        with pytest.raises(ValueError, match=message):
            ch03.visibility_mask(*bad)
    with pytest.raises(TypeError, match="window"):
        ch03.visibility_mask(5, 2.5)


@FAST
@given(tokens=st.integers(1, 60), window=st.integers(1, 12), sinks=st.integers(0, 12))
def test_a_decode_row_reads_the_window_and_the_sinks(tokens, window, sinks):
    # Exercise 3: the newest query reads min(T, W + s) keys once window and sinks stop overlapping;
    # while they overlap it reads fewer, and never more than T.
    row = ch03.visibility_mask(tokens, window=window, sinks=sinks, query_len=1)
    expected = len(set(range(max(0, tokens - window), tokens)) | set(range(min(sinks, tokens))))
    assert int(row.sum()) == expected <= min(tokens, window + sinks)
    if tokens >= window + sinks:
        assert expected == window + sinks


@FAST
@given(n=st.integers(1, 20), rows=st.integers(1, 20), window=st.one_of(st.none(), st.integers(1, 25)),
       sinks=st.integers(0, 5))
def test_visibility_mask_rows_are_the_last_rows_of_the_grid(n, rows, window, sinks):
    rows = min(rows, n)
    full = ch03.visibility_mask(n, window, sinks)
    assert torch.equal(ch03.visibility_mask(n, window, sinks, query_len=rows), full[n - rows:])
    assert torch.equal(ch03.causal_rows(rows, n), ch01.causal_mask(n)[n - rows:])


def test_window_masks_at_tinygpts_positions():
    """@fig-ch03-masks: 128 positions, a window of one eighth, four sinks."""
    assert int(ch03.visibility_mask(128).sum()) == 8_256
    assert int(ch03.visibility_mask(128, window=16).sum()) == 113 * 16 + sum(range(16)) == 1_928
    assert int(ch03.visibility_mask(128, window=16, sinks=4).sum()) == 1_928 + 442
    row = ch03.visibility_mask(128, window=16, sinks=4, query_len=1)[0]
    assert row.nonzero().flatten().tolist() == [0, 1, 2, 3, *range(112, 128)]


@FAST
@given(tokens=st.integers(1, 40), window=st.integers(1, 9), width=st.integers(1, 8), batch=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_rolling_buffer_equals_masked_attention_and_never_exceeds_window(tokens, window, width, batch, seed):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, tokens, width, generator=generator, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, tokens, 5, generator=generator, dtype=torch.float64)
    streamed, largest = ch03.sliding_window_decode(q, k, v, window)
    masked, _ = ch01.scaled_dot_product_attention(q, k, v, ch03.visibility_mask(tokens, window=window))
    assert torch.allclose(streamed, masked, atol=1e-12)
    assert largest == min(tokens, window) <= window


def test_rolling_buffer_slots_follow_t_mod_w():
    # the section's passage: 100 bytes through a ring of 16, wrapped 4 slots past a full turn
    assert ch03.rolling_buffer_slots(100, 16) == [96, 97, 98, 99, *range(84, 96)]
    assert ch03.rolling_buffer_slots(96, 16) == list(range(80, 96))
    assert ch03.rolling_buffer_slots(2, 4) == [0, 1, -1, -1]
    assert ch03.rolling_buffer_slots(0, 3) == [-1, -1, -1]


def test_window_reach_and_hops_on_the_shipped_configs():
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    gemma = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    assert ch03.window_reach(mistral.window, mistral.layers) == 32 * 4_095 == 131_040
    assert ch03.hops_needed(32_767, mistral.window) == 9      # Mistral's whole context by layer 9
    assert ch03.hops_needed(131_040, 4_096) == 32
    assert ch03.window_reach(gemma.window, 5) == 2_555        # a run of Gemma's windowed layers
    assert ch03.window_reach(16, 2) == 30 and ch03.window_reach(1, 7) == 0 and ch03.window_reach(9, 0) == 0


@pytest.mark.parametrize("distance", [0, 1, 2, 3, 511, 512, 2_555, 32_767, 131_040, 10**15 + 7])
@pytest.mark.parametrize("window", [2, 3, 512, 4_096])
def test_hops_needed_is_the_exact_ceiling(distance, window):
    hops = ch03.hops_needed(distance, window)
    assert hops * (window - 1) >= distance > (hops - 1) * (window - 1) or distance == hops == 0


def test_window_sizes_that_would_give_silent_wrong_answers_are_refused():
    """A zero window (or a window of 1 when counting hops) is refused where it enters."""
    q = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="window must be a positive integer"):
        ch03.sliding_window_decode(q, q, q, 0)
    with pytest.raises(TypeError, match="window must be an int"):
        ch03.sliding_window_decode(q, q, q, 2.0)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        ch03.window_reach(0, 3)  # would return a negative reach
    with pytest.raises(TypeError, match="window must be an int"):
        ch03.window_reach(2.5, 3)  # the review's case: once returned 4.5
    with pytest.raises(ValueError, match="window"):
        ch03.hops_needed(5, 1)
    with pytest.raises(ValueError, match="window"):
        ch03.rolling_buffer_slots(3, 0)
    with pytest.raises(ValueError, match="tokens_seen"):
        ch03.rolling_buffer_slots(-1, 3)


def test_gemma_window_mix_never_falls_below_its_global_share():
    """@eq-ch03-window-bytes: the ratio to all-global falls towards L_global / L = 4/26."""
    gemma = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    full = ch03.KVConfig("all global", layers=26, query_heads=4, kv_heads=1, head_dim=256, bytes_per_scalar=2)
    assert ch03.kv_bytes(gemma, 32_768) == (4 * 32_768 + 22 * 512) * 2 * 256 * 2
    assert ch03.kv_bytes(gemma, 512) == ch03.kv_bytes(full, 512)
    ratios = [ch03.kv_bytes(gemma, t) / ch03.kv_bytes(full, t) for t in (512, 2_048, 32_768, 10**7)]
    assert ratios == sorted(ratios, reverse=True) and min(ratios) > 4 / 26


# --- RoPE (@eq-ch03-rope, @eq-ch03-rope-relative) ------------------------------------------------------


@FAST
@given(dim=st.sampled_from([4, 8, 16, 32]), m=st.integers(-50, 300), n=st.integers(-50, 300),
       shift=st.integers(-100, 1_000), seed=st.integers(0, 10_000))
def test_rope_depends_only_on_the_offset_and_keeps_norms(dim, m, n, shift, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(3, 1, dim, generator=gen, dtype=torch.float64), torch.randn(3, 1, dim, generator=gen,
                                                                                  dtype=torch.float64)
    bands, _ = ch03.inverse_frequencies(dim)

    def score(a, b):
        return (ch03.apply_rope(q, [a], bands) * ch03.apply_rope(k, [b], bands)).sum(-1)

    assert torch.allclose(score(m, n), score(m + shift, n + shift), atol=1e-9)
    assert torch.allclose(score(m, n), score(0, n - m), atol=1e-9)
    assert torch.allclose(ch03.apply_rope(q, [m], bands).norm(dim=-1), q.norm(dim=-1), atol=1e-12)
    assert torch.allclose(ch03.apply_rope(q, [m], bands, 1.5).norm(dim=-1), 1.5 * q.norm(dim=-1), atol=1e-12)


def test_rope_rotates_each_pair_by_its_angle():
    bands = torch.tensor([0.5, 0.25], dtype=torch.float64)
    vector = torch.tensor([[1.0, 0.0, 0.0, 2.0]], dtype=torch.float64)
    out = ch03.apply_rope(vector, [2], bands)[0]
    expected = torch.tensor([math.cos(1.0), math.sin(1.0), -2 * math.sin(0.5), 2 * math.cos(0.5)],
                            dtype=torch.float64)
    assert torch.allclose(out, expected)
    assert torch.equal(ch03.apply_rope(vector, [0], bands), vector)


@FAST
@given(dim=st.sampled_from([4, 8, 16]), length=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_interleaved_and_rotate_half_give_the_same_scores(dim, length, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(length, dim, generator=gen), torch.randn(length, dim, generator=gen)
    bands, _ = ch03.inverse_frequencies(dim)
    positions = torch.arange(length) * 7
    order = ch03.interleaved_to_half_order(dim)
    interleaved = ch03.apply_rope(q, positions, bands) @ ch03.apply_rope(k, positions, bands).T
    half = dim // 2
    angles = positions[:, None].double() * bands
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1).float(), torch.cat((angles.sin(), angles.sin()), -1).float()

    def llama_rotate(t):                      # the rotate-half formula, written independently
        return t * cos + torch.cat((-t[:, half:], t[:, :half]), -1) * sin

    assert torch.allclose(llama_rotate(q[:, order]) @ llama_rotate(k[:, order]).T, interleaved, atol=1e-4)
    assert torch.allclose(ch03.apply_rope_rotate_half(q[:, order], positions, bands), llama_rotate(q[:, order]),
                          atol=1e-5)


def test_rope_shape_mismatches_fail_loudly():
    # apply_rope checks nothing itself; a band count or position count that does not fit
    # the vectors cannot broadcast, so PyTorch refuses it.
    bands, _ = ch03.inverse_frequencies(8)
    with pytest.raises(RuntimeError):
        ch03.apply_rope(torch.randn(2, 8), [0, 1], bands[:3])
    with pytest.raises(RuntimeError):
        ch03.apply_rope(torch.randn(2, 8), [0, 1, 2], bands)


# --- PI, NTK, YaRN (@eq-ch03-ntk, @eq-ch03-yarn) --------------------------------------------------------


@FAST
@given(dim=st.sampled_from([4, 8, 16, 64, 128]), factor=st.floats(1.0, 64.0), base=st.sampled_from([1e4, 5e5]))
def test_pi_ntk_yarn_band_relations(dim, factor, base):
    rope, m_rope = ch03.inverse_frequencies(dim, base=base)
    pi, m_pi = ch03.inverse_frequencies(dim, method="pi", base=base, factor=factor)
    ntk, m_ntk = ch03.inverse_frequencies(dim, method="ntk", base=base, factor=factor)
    yarn, m_yarn = ch03.inverse_frequencies(dim, method="yarn", base=base, factor=factor, original_context=4_096)
    assert rope.dtype == torch.float64 and rope.shape == (dim // 2,)
    assert torch.allclose(rope, base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    assert torch.allclose(pi, rope / factor)
    assert ntk[0].item() == rope[0].item() == 1.0                      # the fastest band is untouched
    assert torch.isclose(ntk[-1], pi[-1])                              # the slowest band is divided by exactly a
    assert bool((ntk <= rope * (1 + 1e-12)).all() and (ntk >= pi * (1 - 1e-12)).all())
    assert bool((yarn <= rope * (1 + 1e-12)).all() and (yarn >= pi * (1 - 1e-12)).all())
    assert m_rope == m_pi == m_ntk == 1.0
    assert m_yarn == pytest.approx(0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    assert ch03.ntk_base(base, factor, dim) == pytest.approx(base * factor ** (dim / (dim - 2)))


def reference_yarn(dim, base, factor, original, beta_fast=32, beta_slow=1):
    """The correction range and ramp of the published YaRN code, written out independently (float64)."""
    def correction(turns):
        return (dim * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction(beta_fast)), 0)
    high = min(math.ceil(correction(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    inv = [base ** (-(2 * j) / dim) for j in range(dim // 2)]
    out = []
    for j, omega in enumerate(inv):
        interpolate = min(max((j - low) / (high - low), 0.0), 1.0)
        extrapolate = 1.0 - interpolate
        out.append(omega / factor * (1 - extrapolate) + omega * extrapolate)
    return torch.tensor(out, dtype=torch.float64), 0.1 * math.log(factor) + 1.0, (low, high)


@pytest.mark.parametrize("dim, base, factor, original", [
    (16, 10_000.0, 4.0, 32), (64, 10_000.0, 40.0, 4_096), (128, 10_000.0, 8.0, 4_096),
    (128, 500_000.0, 8.0, 8_192), (32, 10_000.0, 4.0, 32), (8, 10_000.0, 2.0, 16),
])
def test_yarn_agrees_with_the_reference_construction(dim, base, factor, original):
    bands, magnitude = ch03.inverse_frequencies(dim, method="yarn", base=base, factor=factor,
                                                original_context=original)
    expected, expected_magnitude, _ = reference_yarn(dim, base, factor, original)
    assert torch.allclose(bands, expected, rtol=1e-12)
    assert magnitude == pytest.approx(expected_magnitude)


def test_yarn_hand_derived_values():
    # d_R = 16, b = 1e4, T_0 = 32, a = 4: j(32) < 0 -> low 0; j(1) = 16 ln(32 / 2pi) / (2 ln 1e4) = 1.41394 -> high 2.
    assert ch03.yarn_correction_dim(1, 16, 1e4, 32) == pytest.approx(1.41394, abs=1e-5)
    bands, magnitude = ch03.inverse_frequencies(16, method="yarn", factor=4, original_context=32)
    assert bands[0].item() == 1.0
    assert bands[1].item() == pytest.approx(10 ** -0.5 * (0.5 + 0.5 / 4))
    assert torch.allclose(bands[2:], 1e4 ** -(torch.arange(4, 16, 2, dtype=torch.float64) / 16) / 4)
    assert magnitude == pytest.approx(1.1386294361)
    # DeepSeek-V2-Lite: d_R = 64, T_0 = 4096 -> j(32) = 10.47, j(1) = 22.52, so bands 0..10 kept, 23.. interpolated.
    _, _, (low, high) = reference_yarn(64, 1e4, 40.0, 4_096)
    assert (low, high) == (10, 23)
    raw = ch03.load_model_config("deepseek-v2-lite")
    ds, _ = ch03.inverse_frequencies(raw["qk_rope_head_dim"], method="yarn", base=raw["rope_theta"],
                                     factor=raw["rope_scaling"]["factor"],
                                     original_context=raw["rope_scaling"]["original_max_position_embeddings"])
    plain, _ = ch03.inverse_frequencies(64)
    assert torch.equal(ds[:11], plain[:11]) and torch.allclose(ds[23:], plain[23:] / 40)


def test_a_phrase_scores_the_same_at_both_ends_of_the_corpus():
    # The chapter's check: "Mr. Darcy" at its first and last place in the corpus, Gemma 3 1B's global bands,
    # a query on the "D" and a key on the "M"; the score depends only on the 4-byte offset.
    corpus = ch02.load_corpus()
    first, last = corpus.index("Mr. Darcy"), corpus.rindex("Mr. Darcy")
    assert (first, last) == (11_715, 298_504)
    gemma = ch03.load_model_config("gemma-3-1b")
    bands, _ = ch03.rope_from_config(gemma)
    gen = torch.Generator().manual_seed(1813)
    q, k = torch.randn(2, 1, gemma["head_dim"], generator=gen, dtype=torch.float64)

    def score(m, n):
        return (ch03.apply_rope(q, [m], bands) * ch03.apply_rope(k, [n], bands)).sum().item()

    assert score(first + 4, first) == pytest.approx(score(last + 4, last), abs=1e-9)
    assert abs(score(first + 8, first) - score(first + 4, first)) > 1.0


def test_deepseek_rotary_key_under_each_recipe():
    # The chapter's comparison: DeepSeek-V2-Lite's own width, base, T_0 and factor given to every recipe,
    # Llama 3 with Llama 3.1's edges (l = 1, h = 4). Counts of bands kept and divided by the full factor.
    raw = ch03.load_model_config("deepseek-v2-lite")
    scaling = raw["rope_scaling"]
    plain, _ = ch03.inverse_frequencies(64, base=raw["rope_theta"])
    counts = {}
    for method in ch03.ROPE_METHODS:
        bands, _ = ch03.inverse_frequencies(64, method=method, base=raw["rope_theta"], factor=scaling["factor"],
                                            original_context=scaling["original_max_position_embeddings"])
        counts[method] = (int((bands == plain).sum()), int(torch.isclose(bands, plain / 40, rtol=1e-12).sum()))
    assert counts == {"rope": (32, 0), "pi": (0, 32), "ntk": (1, 1), "yarn": (11, 9), "llama3": (18, 9)}
    shipped, magnitude = ch03.rope_from_config(raw)
    yarn, _ = ch03.inverse_frequencies(64, method="yarn", base=raw["rope_theta"], factor=40.0,
                                       original_context=4_096)
    assert torch.equal(shipped, yarn) and magnitude == 1.0


def test_inverse_frequencies_refuses_what_would_give_bands_silently():
    """A formula, not a boundary: only an odd width and an unknown method, which would not fail."""
    with pytest.raises(ValueError, match="dim must be even"):
        ch03.inverse_frequencies(7)
    with pytest.raises(ValueError, match="method must be one of"):
        ch03.inverse_frequencies(16, method="longrope")


def test_ntk_with_a_single_band_keeps_it():
    # With d_R = 2 the only band is the fastest, which NTK never moves (b'^0 = 1).
    bands, magnitude = ch03.inverse_frequencies(2, method="ntk", factor=8.0)
    assert bands.tolist() == [1.0] and magnitude == 1.0


# --- Llama 3's bands (@eq-ch03-llama3) and rope_from_config -------------------------------------------


def test_llama3_bands_at_hand_chosen_wavelengths():
    # d_R = 4: band 0 has wavelength 2 pi (kept), band 1 has wavelength 2 pi sqrt(b). Choose b so that it
    # is 4096 with T_0 = 8192, l = 1, h = 4: edges 2048 and 8192, so s = (8192/4096 - 1) / 3 = 1/3 and
    # omega' = (2/3) omega / 8 + (1/3) omega = (5/12) omega.
    base = (4096 / (2 * math.pi)) ** 2
    bands, magnitude = ch03.inverse_frequencies(4, method="llama3", base=base, factor=8.0,
                                                original_context=8192)
    assert magnitude == 1.0 and bands[0].item() == 1.0
    assert bands[1].item() == pytest.approx(5 / 12 * base ** -0.5, rel=1e-12)
    # Wavelength beyond T_0 / l: divided by the factor; below T_0 / h: kept.
    long_base = (10_000 / (2 * math.pi)) ** 2
    bands, _ = ch03.inverse_frequencies(4, method="llama3", base=long_base, factor=8.0,
                                        original_context=8192)
    assert bands[1].item() == pytest.approx(long_base ** -0.5 / 8, rel=1e-12)
    short_base = (2000 / (2 * math.pi)) ** 2
    bands, _ = ch03.inverse_frequencies(4, method="llama3", base=short_base, factor=8.0,
                                        original_context=8192)
    assert bands[1].item() == pytest.approx(short_base ** -0.5, rel=1e-12)


def test_llama31_config_band_counts_from_the_closed_form():
    # lambda_j = 2 pi b^(j/64) with b = 5e5: kept while lambda < 8192/4, i.e. j < 64 ln(2048/2pi)/ln b = 28.2;
    # divided by 8 once lambda > 8192, i.e. j > 64 ln(8192/2pi)/ln b = 34.98.
    bands, magnitude = ch03.rope_from_config(ch03.load_model_config("llama-3.1-8b"))
    plain = 5e5 ** -(torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert magnitude == 1.0 and bands.shape == (64,)
    assert torch.equal(bands[:29], plain[:29])
    assert torch.allclose(bands[35:], plain[35:] / 8, rtol=1e-14)
    middle = bands[29:35] / plain[29:35]
    assert bool(((middle > 1 / 8) & (middle < 1)).all()) and bool((middle[1:] < middle[:-1]).all())
    j = 30
    share = (8192 / (2 * math.pi * 5e5 ** (j / 64)) - 1) / 3
    assert bands[j].item() == pytest.approx(((1 - share) / 8 + share) * plain[j].item(), rel=1e-12)


@pytest.mark.parametrize("name, width, base", [
    ("llama-2-7b", 128, 1e4), ("mistral-7b-v0.1", 128, 1e4), ("gemma-3-1b", 256, 1e6),
])
def test_rope_from_config_plain_configs(name, width, base):
    bands, magnitude = ch03.rope_from_config(ch03.load_model_config(name))
    expected = torch.tensor([base ** (-2 * j / width) for j in range(width // 2)], dtype=torch.float64)
    assert magnitude == 1.0 and torch.allclose(bands, expected, rtol=1e-13)


def test_rope_from_config_deepseek_yarn_and_its_mscale():
    raw = ch03.load_model_config("deepseek-v2-lite")
    bands, magnitude = ch03.rope_from_config(raw)
    # Rotary key width 64; j(32) = 64 ln(4096/(64 pi)) / (2 ln 1e4) = 10.47, j(1) = 22.52: low 10, high 23.
    plain = torch.tensor([1e4 ** (-2 * j / 64) for j in range(32)], dtype=torch.float64)
    assert torch.equal(bands[:11], plain[:11]) and torch.allclose(bands[23:], plain[23:] / 40, rtol=1e-13)
    ramp = (14 - 10) / (23 - 10)
    assert bands[14].item() == pytest.approx((1 - ramp) * plain[14].item() + ramp * plain[14].item() / 40)
    assert magnitude == 1.0                                # mscale == mscale_all_dim: the ratio is 1
    scaling = raw["rope_scaling"]
    _, different = ch03.rope_from_config({**raw, "rope_scaling": {**scaling, "mscale": 1.0}})
    m = lambda s: 0.1 * s * math.log(40) + 1                # noqa: E731
    assert different == pytest.approx(m(1.0) / m(0.707))
    plain_yarn = {key: value for key, value in scaling.items() if not key.startswith("mscale")}
    assert ch03.rope_from_config({**raw, "rope_scaling": plain_yarn})[1] == pytest.approx(m(1.0))
    explicit = {**scaling, "attention_factor": 1.25}
    assert ch03.rope_from_config({**raw, "rope_scaling": explicit})[1] == 1.25


def test_rope_from_config_spellings_and_sources_of_t0():
    llama2 = ch03.load_model_config("llama-2-7b")
    plain, _ = ch03.rope_from_config(llama2)
    for key in ("type", "rope_type"):
        linear, magnitude = ch03.rope_from_config({**llama2, "rope_scaling": {key: "linear", "factor": 4.0}})
        assert magnitude == 1.0 and torch.allclose(linear, plain / 4, rtol=1e-14)
    assert torch.equal(ch03.rope_from_config({**llama2, "rope_scaling": {"rope_type": "default"}})[0], plain)
    # The trained length comes from original_max_position_embeddings, top level first.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    expected, _ = ch03.inverse_frequencies(128, method="yarn", factor=4.0, original_context=2048)
    assert torch.equal(ch03.rope_from_config({**llama2, "rope_scaling": yarn})[0], expected)
    top_level = {**llama2, "original_max_position_embeddings": 1024, "rope_scaling": yarn}
    at_1024, _ = ch03.inverse_frequencies(128, method="yarn", factor=4.0, original_context=1024)
    assert torch.equal(ch03.rope_from_config(top_level)[0], at_1024)
    # No factor: YaRN takes T_1 / T_0.
    implicit = {**llama2, "max_position_embeddings": 8192,
                "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 2048}}
    assert torch.equal(ch03.rope_from_config(implicit)[0], expected)
    # Newer files: rope_parameters, rope_theta inside it; nested text_config; partial rotary width.
    newer = {key: value for key, value in llama2.items() if key not in ("rope_scaling", "rope_theta")}
    newer["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0}
    assert torch.equal(ch03.rope_from_config(newer)[0], plain)
    assert torch.equal(ch03.rope_from_config({"model_type": "x", "text_config": llama2})[0], plain)
    half, _ = ch03.rope_from_config({**llama2, "partial_rotary_factor": 0.5})
    assert torch.allclose(half, torch.tensor([1e4 ** (-2 * j / 64) for j in range(32)], dtype=torch.float64))


def test_config_readers_read_a_null_field_as_unset():
    """A config.json writes null for a field left at its default; the readers take the default."""
    llama2 = ch03.load_model_config("llama-2-7b")
    plain, _ = ch03.rope_from_config(llama2)
    assert torch.equal(ch03.rope_from_config({**llama2, "partial_rotary_factor": None})[0], plain)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    expected = ch03.rope_from_config({**llama2, "rope_scaling": yarn})
    nulls = {**yarn, "beta_fast": None, "beta_slow": None, "truncate": None}
    assert torch.equal(ch03.rope_from_config({**llama2, "rope_scaling": nulls})[0], expected[0])
    deepseek = ch03.load_model_config("deepseek-v2-lite")
    assert ch03.read_latent_fields({**deepseek, "qk_rope_head_dim": None}) == {
        "latent_rank": 512, "rope_key_dim": 0}
    assert ch03.read_window_fields({"sliding_window": 8, "sliding_window_pattern": 2,
                                    "use_sliding_window": None}, 4) == {"window": 8, "windowed_layers": 2}


@pytest.mark.parametrize("scaling, error, message", [
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "rope_type must be one of"),
    ({"rope_type": "linear", "factor": 0.5}, ValueError, "factor must be >= 1"),
    ({"rope_type": "linear", "factor": "2"}, TypeError, "factor must be a real number"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "beta_fast": 0.5},
     ValueError, "beta_fast must exceed beta_slow"),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192,
      "low_freq_factor": 4.0, "high_freq_factor": 2.0}, ValueError, "high_freq_factor must exceed"),
    ({"type": "longrope", "factor": 2.0}, ValueError, "'llama3'"),
    ({"rope_type": "linear"}, ValueError, "factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "truncate": False},
     ValueError, "truncate"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
     ValueError, "high_freq_factor"),
    ("yarn", TypeError, "rope_scaling must be a Mapping"),
])
def test_rope_from_config_rejects_what_it_cannot_build(scaling, error, message):
    raw = {**ch03.load_model_config("llama-2-7b"), "rope_scaling": scaling}
    with pytest.raises(error, match=message):
        ch03.rope_from_config(raw)


def test_rope_from_config_needs_a_mapping_and_a_width():
    with pytest.raises(TypeError, match="mapping"):
        ch03.rope_from_config([("rope_theta", 1e4)])
    with pytest.raises(ValueError, match="rope_theta must be > 1"):
        ch03.rope_from_config({**ch03.load_model_config("llama-2-7b"), "rope_theta": 1.0})
    with pytest.raises(ValueError, match="num_attention_heads"):
        ch03.rope_from_config({"hidden_size": 64})


# --- the retrieval probe --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe_rows() -> dict[str, list[dict]]:
    """The chapter's five probe runs, made once (each takes a few tenths of a second); the tests only read them."""
    return {method: ch03.retrieval_probe(method) for method in ("rope", "pi", "ntk", "yarn", "llama3")}


def test_probe_golden_means_and_ordering(probe_rows):
    """The chapter's five runs: TinyGPT's 128 positions stretched by DeepSeek-V2-Lite's factor of 40."""
    defaults = ch03.retrieval_probe.__kwdefaults__
    assert (defaults["original_context"], defaults["context"]) == (128, 40 * 128)
    hits = {}
    for method in ("rope", "pi", "ntk", "yarn", "llama3"):
        rows = probe_rows[method]
        assert len(rows) == 41 and [r["depth_percent"] for r in rows] == [k * 2.5 for k in range(41)]
        for row in rows:
            p = row["accuracy"]
            assert 0 <= p <= 1 and row["standard_error"] == pytest.approx(math.sqrt(p * (1 - p) / 192))
        assert rows[-1]["accuracy"] > 0.95                       # the needle beside the query
        hits[method] = round(sum(r["accuracy"] for r in rows) * 192)
    assert hits == {"rope": 235, "pi": 1_825, "ntk": 860, "yarn": 1_844, "llama3": 1_862}
    assert hits["rope"] < hits["ntk"] < min(hits["pi"], hits["yarn"], hits["llama3"])


def test_probe_reach_at_one_hit_in_two_is_the_chapters(probe_rows):
    """The chapter's effective length: how far before the query every nearer depth still wins half the draws."""
    context = ch03.retrieval_probe.__kwdefaults__["context"]

    def reach(rows):
        found = 0
        for row in reversed(rows):                               # nearest to the query first
            if row["accuracy"] < 0.5:
                break
            found = context - 1 - round(row["depth_percent"] / 100 * (context - 2))
        return found

    reaches = {method: reach(rows) for method, rows in probe_rows.items()}
    assert reaches == {"rope": 1, "pi": 257, "ntk": 1, "yarn": 1, "llama3": 1}


def test_probe_is_reproducible_and_accepts_custom_bands():
    small = dict(trials=16, context=32, original_context=8, dim=8)
    assert ch03.retrieval_probe("yarn", seed=5, **small) == ch03.retrieval_probe("yarn", seed=5, **small)
    assert ch03.retrieval_probe("yarn", seed=5, **small) != ch03.retrieval_probe("yarn", seed=6, **small)
    bands = ch03.inverse_frequencies(8, method="pi", factor=4)
    assert ch03.retrieval_probe(bands, seed=5, **small) == ch03.retrieval_probe("pi", seed=5, **small)
    with pytest.raises(ValueError, match="frequencies"):
        ch03.retrieval_probe((torch.ones(3, dtype=torch.float64), 1.0), **small)
    with pytest.raises(ValueError, match="context"):
        ch03.retrieval_probe("rope", context=8, original_context=16, dim=8, trials=4)
    with pytest.raises(ValueError, match="method must be one of"):
        ch03.retrieval_probe("alibi", **small)
    with pytest.raises(ValueError, match="trials"):
        ch03.retrieval_probe("rope", trials=0)
    with pytest.raises(TypeError, match="method"):
        ch03.retrieval_probe(torch.ones(4), **small)
    with pytest.raises(TypeError, match="trials"):
        ch03.retrieval_probe("rope", trials=2.5)
    with pytest.raises(ValueError, match="dim must be even"):
        ch03.retrieval_probe("rope", dim=7)


def test_probe_magnitude_moves_the_needle_weight_but_never_the_hit_rate(probe_rows):
    bands, magnitude = ch03.inverse_frequencies(32, method="yarn", factor=40, original_context=128)
    hot = probe_rows["yarn"]
    cold = ch03.retrieval_probe((bands, 1.0))
    hotter = ch03.retrieval_probe((bands, 2.0))
    assert [r["accuracy"] for r in hot] == [r["accuracy"] for r in cold] == [r["accuracy"] for r in hotter]
    weights = [sum(r["needle_weight"] for r in rows) / 41 for rows in (cold, hot, hotter)]
    assert weights[0] < weights[1] < weights[2]
    assert all(0.0 < r["needle_weight"] < 1.0 for r in hot)
    # Next to the query the needle nearly always wins, and a sharper softmax gives it more of the weight.
    assert hot[-1]["accuracy"] > 0.95 and hotter[-1]["needle_weight"] > hot[-1]["needle_weight"]


def test_probe_needle_weight_is_the_softmax_share_of_the_needle():
    """At a fixed trial the weight is exp(s_needle / sqrt d) / sum_t exp(s_t / sqrt d): check it by hand."""
    small = dict(trials=1, context=4, original_context=4, dim=2)
    rows = ch03.retrieval_probe("rope", seed=3, **small)
    gen = torch.Generator().manual_seed(3)                    # replay the draws of the probe
    draws = torch.randn(41, 1, 3 * 2 + 4, generator=gen)      # one trial: content, two noises, scores
    content, query_noise, needle_noise, noise = draws.split([2, 2, 2, 4], dim=-1)
    query, needle = content + 0.15 * query_noise, content + 0.15 * needle_noise
    for depth, row in enumerate(rows):
        at = int(torch.round(torch.linspace(0, 1, 41, dtype=torch.float64)[depth] * 2))
        q_angle, n_angle = 3.0, float(at)                     # omega_0 = 1 for d_R = 2
        q = torch.tensor([[math.cos(q_angle), -math.sin(q_angle)], [math.sin(q_angle), math.cos(q_angle)]])
        n = torch.tensor([[math.cos(n_angle), -math.sin(n_angle)], [math.sin(n_angle), math.cos(n_angle)]])
        q_rot, n_rot = q @ query[depth, 0], n @ needle[depth, 0]
        scores = q_rot.norm() * noise[depth, 0]
        scores[at] = q_rot @ n_rot
        weight = torch.softmax(scores / math.sqrt(2), 0)[at].item()
        assert row["needle_weight"] == pytest.approx(weight, rel=1e-5)
        assert row["accuracy"] == float(scores.argmax().item() == at)


def test_probe_in_chunks_equals_the_probe_in_one_batch_exactly():
    small = dict(trials=7, context=19, original_context=5, dim=6)
    whole = ch03.retrieval_probe("yarn", seed=3, chunk=7, **small)
    for chunk in (1, 3, 100):
        assert ch03.retrieval_probe("yarn", seed=3, chunk=chunk, **small) == whole


def test_probe_memory_is_set_by_the_chunk_not_the_trials(monkeypatch):
    """The largest tensor of a call, the scores the softmax reads, is 41 x chunk x context at any trials."""
    seen = []
    softmax = ch01.softmax

    def spy(scores, dim=-1):
        seen.append(scores.numel())
        return softmax(scores, dim)

    monkeypatch.setattr(ch01, "softmax", spy)
    ch03.retrieval_probe("rope", trials=40, context=64, original_context=16, dim=8, chunk=4)
    assert max(seen) == 41 * 4 * 64 and len(seen) == 10
    seen.clear()
    ch03.retrieval_probe("rope", trials=9, context=64, original_context=16, dim=8, chunk=4)
    assert seen == [41 * 4 * 64, 41 * 4 * 64, 41 * 1 * 64]


def test_probe_base_sets_the_bands_and_a_pair_ignores_base_and_original_context():
    small = dict(seed=2, trials=16, context=32, original_context=8, dim=8)
    for base in (500.0, 10_000.0, 1e6):
        bands = ch03.inverse_frequencies(8, method="ntk", base=base, factor=4)
        assert ch03.retrieval_probe("ntk", base=base, **small) == ch03.retrieval_probe(bands, **small)
    assert ch03.retrieval_probe("rope", **small) == ch03.retrieval_probe("rope", base=10_000.0, **small)
    assert ch03.retrieval_probe("rope", base=500.0, **small) != ch03.retrieval_probe("rope", **small)
    pair = ch03.inverse_frequencies(8, method="pi", factor=4)
    ignored = dict(small, original_context=64)           # above context: refused for a name only
    assert ch03.retrieval_probe(pair, base=2.0, **ignored) == ch03.retrieval_probe(pair, **small)
    with pytest.raises(ValueError, match="original_context"):
        ch03.retrieval_probe("pi", **ignored)
    with pytest.raises(ValueError, match="base"):
        ch03.retrieval_probe("rope", base=1.0, **small)
    with pytest.raises(ValueError, match="chunk"):
        ch03.retrieval_probe("rope", chunk=0, **small)


def explicit_key_probe(method, *, seed, trials, context, original_context, dim):
    """The probe written the slow, obvious way: real distractor keys, each rotated at its own position."""
    bands, magnitude = ch03.inverse_frequencies(dim, method=method, factor=context / original_context,
                                                original_context=original_context)
    gen = torch.Generator().manual_seed(seed)
    accuracy = []
    for depth in range(41):
        at = round(depth / 40 * (context - 2))
        content = torch.randn(trials, dim, generator=gen)
        query = content + 0.15 * torch.randn(trials, dim, generator=gen)
        keys = torch.randn(trials, context, dim, generator=gen)
        keys[:, at] = content + 0.15 * torch.randn(trials, dim, generator=gen)
        keys_rot = ch03.apply_rope(keys, torch.arange(context), bands, magnitude)
        query_rot = ch03.apply_rope(query[:, None], [context - 1], bands, magnitude)[:, 0]
        scores = (keys_rot * query_rot[:, None]).sum(-1)
        accuracy.append((scores.argmax(-1) == at).double().mean().item())
    return accuracy


def test_probe_score_shortcut_matches_explicit_rotated_keys():
    sizes = dict(trials=800, context=16, original_context=4, dim=8)
    fast = [row["accuracy"] for row in ch03.retrieval_probe("yarn", seed=11, **sizes)]
    slow = explicit_key_probe("yarn", seed=12, **sizes)
    for p_fast, p_slow in zip(fast, slow, strict=True):
        spread = math.sqrt((p_fast * (1 - p_fast) + p_slow * (1 - p_slow)) / 800) + 1e-3
        assert abs(p_fast - p_slow) < 5 * spread
    assert abs(sum(fast) - sum(slow)) / 41 < 0.02


def test_windowed_shipped_configs_stop_growing_at_their_window():
    mistral = ch03.KVConfig.from_hf_config(ch03.load_model_config("mistral-7b-v0.1"))
    assert ch03.kv_bytes(mistral, 131_072) == ch03.kv_bytes(mistral, 4_096) == 512 * 2**20
    assert ch03.kv_bytes(mistral, 4_095) < ch03.kv_bytes(mistral, 4_096)
    gemma = ch03.KVConfig.from_hf_config(ch03.load_model_config("gemma-3-1b"))
    per_layer_token = 2 * 1 * 256 * 2                                   # 2 * H_kv * d_h * s
    assert ch03.kv_bytes(gemma, 32_768) == (4 * 32_768 + 22 * 512) * per_layer_token
    assert round(26 * 32_768 * per_layer_token / ch03.kv_bytes(gemma, 32_768), 1) == 6.0    # the chapter's ratio


def test_tokens_that_fit_golden_values_of_the_limits_table():
    device = 80 * GIB
    fits = {name: ch03.tokens_that_fit(ch03.KVConfig.from_hf_config(ch03.load_model_config(name)), device)
            for name in ch03.MODEL_CONFIG_NAMES}
    assert fits == {"llama-2-7b": 163_840, "llama-3.1-8b": 655_360, "deepseek-v2-lite": 2_761_681,
                    "mistral-7b-v0.1": None, "gemma-3-1b": 20_968_704}
    llama31 = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
    assert ch03.tokens_that_fit(llama31, device, batch=5) == 131_072       # five full conversations
    assert ch03.tokens_that_fit(llama31, device, batch=6) < 131_072


@FAST
@given(layers=st.integers(1, 6), windowed=st.integers(0, 6), window=st.integers(1, 40),
       kv=st.integers(1, 3), width=st.integers(1, 8), s=st.sampled_from([1, 2, 4]),
       batch=st.integers(1, 3), budget=st.integers(0, 200_000))
def test_tokens_that_fit_is_the_exact_inverse_of_kv_bytes(layers, windowed, window, kv, width, s, batch,
                                                          budget):
    windowed = min(windowed, layers)
    config = ch03.KVConfig("x", layers=layers, query_heads=kv, kv_heads=kv, head_dim=width,
                           bytes_per_scalar=s, window=window if windowed else None,
                           windowed_layers=windowed)
    fit = ch03.tokens_that_fit(config, budget, batch)
    if fit is None:                          # every layer windowed, plateau below the budget
        assert windowed == layers and ch03.kv_bytes(config, 10**9, batch) <= budget
    else:
        assert ch03.kv_bytes(config, fit, batch) <= budget < ch03.kv_bytes(config, fit + 1, batch)


def test_tokens_that_fit_of_a_latent_cache_and_its_boundary_errors():
    latent = ch03.KVConfig("lat", layers=3, query_heads=4, head_dim=8, bytes_per_scalar=2,
                           latent_rank=10, rope_key_dim=6)
    assert ch03.tokens_that_fit(latent, 3 * 16 * 2 * 7) == 7             # (r + d_R) s L bytes a token
    with pytest.raises(TypeError, match="config"):
        ch03.tokens_that_fit({"num_hidden_layers": 2}, 100)
    with pytest.raises(ValueError, match="budget"):
        ch03.tokens_that_fit(latent, -1)
    with pytest.raises(ValueError, match="batch"):
        ch03.tokens_that_fit(latent, 100, batch=0)
    with pytest.raises(TypeError, match="budget"):
        ch03.tokens_that_fit(latent, 1.5)


class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor with new storage that any operation creates.

    Views (transpose, expand, view) share their input's storage and are not counted: only memory
    that was really allocated and written is.
    """

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        shared = {a.untyped_storage().data_ptr() for a in inputs}
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in shared:
                self.largest = max(self.largest, tensor.numel())
        return out


def test_grouped_attention_never_copies_the_cached_heads():
    """A decode step reads each KV head in place: nothing as large as one copy of the keys is created."""
    batch, query_heads, kv_heads, tokens, width = 1, 32, 8, 2048, 64
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(batch, query_heads, 1, width, generator=generator)
    k, v = (torch.randn(batch, kv_heads, tokens, width, generator=generator) for _ in range(2))
    with _LargestTensor() as grouped:
        ch03.grouped_attention(q, k, v)
    with _LargestTensor() as repeated:
        ch03.repeat_kv(k, query_heads // kv_heads)
    assert repeated.largest == batch * query_heads * tokens * width
    assert grouped.largest < k.numel() // 2  # only the (B, H_q, 1, T) scores, far smaller than the keys


# --- no decode step builds a T x T tensor -------------------------------------------------------------


def _decode_step_largest(layer, tokens, d_model, make_cache):
    """Largest new tensor created by one decode step of ``layer`` against a cache of ``tokens`` tokens."""
    generator = torch.Generator().manual_seed(0)
    cache = make_cache(generator)
    x = torch.randn(1, 1, d_model, generator=generator)
    with torch.no_grad(), _LargestTensor() as seen:
        out, new_cache = layer(x, cache)
    assert out.shape == (1, 1, d_model)
    return seen.largest, new_cache


@pytest.mark.parametrize("kind", ["gqa", "mqa", "latent", "latent+rope"])
def test_a_decode_step_creates_no_tensor_of_t_squared_elements(kind):
    tokens, d_model = 1_024, 32
    torch.manual_seed(0)
    if kind in ("gqa", "mqa"):
        kv = 2 if kind == "gqa" else 1
        layer = ch03.GroupedQueryAttention(d_model, 4, kv).eval()

        def make_cache(generator):
            return tuple(torch.randn(1, kv, tokens, 8, generator=generator) for _ in range(2))
    else:
        rope = 4 if kind == "latent+rope" else 0
        layer = ch03.ToyLatentKVAttention(d_model, 4, 8, rope_key_dim=rope).eval()

        def make_cache(generator):
            return torch.randn(1, tokens, 8 + rope, generator=generator)
    largest, new_cache = _decode_step_largest(layer, tokens, d_model, make_cache)
    grown = new_cache[0] if isinstance(new_cache, tuple) else new_cache
    assert grown.size(-2) == tokens + 1
    # The largest tensors of a step are O(T): the grown cache, the (re)built keys, the scores.
    assert largest < tokens * tokens // 16
    assert largest <= (tokens + 1) * 4 * (8 + 4)       # (B, H, T_k, d_h + d_R) at most


def test_decode_masks_are_rows_not_grids():
    tokens = 4_096
    with _LargestTensor() as causal:
        row = ch03.causal_rows(1, tokens)
    with _LargestTensor() as windowed:
        window_row = ch03.visibility_mask(tokens, window=512, sinks=4, query_len=1)
    assert row.shape == window_row.shape == (1, tokens)
    assert causal.largest == windowed.largest == tokens
    assert int(window_row.sum()) == 512 + 4
    with _LargestTensor() as grid:
        ch01.causal_mask(tokens)
    assert grid.largest == tokens * tokens                   # what the rows avoid


def test_yarn_magnitude_is_m_of_s_and_gives_deepseeks_softmax_scale():
    assert ch03.yarn_magnitude(1.0) == 1.0 and ch03.yarn_magnitude(0.5, 2.0) == 1.0
    assert ch03.yarn_magnitude(40.0) == pytest.approx(0.1 * math.log(40) + 1)
    assert ch03.yarn_magnitude(40.0, 0.707) == pytest.approx(0.1 * 0.707 * math.log(40) + 1)
    assert ch03.inverse_frequencies(32, method="yarn", factor=4)[1] == ch03.yarn_magnitude(4.0)
    # DeepSeek-V2-Lite sets mscale = mscale_all_dim: the rotated vectors keep magnitude m(s) / m(s) = 1
    raw = ch03.load_model_config("deepseek-v2-lite")
    assert ch03.rope_from_config(raw)[1] == 1.0
