"""One convention for bad input, checked everywhere: TypeError or ValueError, naming the argument.

Every public callable of the swept modules (each name in a module's ``__all__``; for a
class, its constructor and the public methods it defines) is called once per bad
argument. One argument at a time is replaced by a value of the wrong type (a bool or a
float for a count, a string for a number, a list for a tensor, a number for a name or
an object) or a wrong value (negative, zero, NaN, infinite, an unknown name, a tensor
that is empty, has one dimension too few or too many, or has the wrong dtype). Each
call must raise TypeError or ValueError whose message names the argument: never silent
acceptance, never a raw torch or math error. A probe of the wrong type must raise TypeError and
a probe of the wrong value ValueError, so the same mistake gets the same answer everywhere.

The probes come from introspection: the kind of each argument is read off one valid
value for it, and ``VALID_CALLS`` below, the one table written by hand, gives those
values. Where a probe is in fact a valid argument (a dimension may be 0, a mask may
broadcast from fewer dimensions), ``Valid.accepts`` says so, which also documents it.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch

# ------------------------------------------------------------------------------------------
# The modules the sweep covers. A new chapter's module is added here when it merges, with an
# entry in VALID_CALLS for each public callable (the first test lists those that lack one).
SWEPT_MODULES = ("support", "ch01", "ch02", "ch03", "ch04", "ch05", "ch06")
# ------------------------------------------------------------------------------------------

INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass
class Valid:
    """A valid call of one public callable, from which the bad calls are made.

    ``arguments`` builds fresh valid arguments, by name (the instance of a method
    is passed to it, for arguments that must fit that instance); ``instance``
    builds the object whose method is called. ``accepts`` maps an argument to the
    probes it legitimately accepts; ``any_value`` lists arguments that take any
    object at all.
    """

    arguments: Callable[..., dict]
    instance: Callable[[], object] | None = None
    accepts: dict[str, set[str]] = field(default_factory=dict)
    any_value: frozenset[str] = frozenset()


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _ch(name: str):
    return importlib.import_module(f"longctx.{name}")


def _tiny_config():
    return _ch("ch02").GPTConfig(vocab_size=16, context_length=8, d_model=8, layers=2, heads=2)


def _tiny_model():
    torch.manual_seed(0)
    return _ch("ch02").TinyGPT(_tiny_config()).eval()


BROADCASTS = {"0-d", "fewer-dims", "more-dims"}  # a mask or scale that broadcasts
DATA = ("configs", "gemma-3-1b.json")

VALID_CALLS: dict[str, Valid] = {
    # ---------------------------------------------------------------- longctx.support
    "support.check_bool": Valid(lambda: dict(name="flag", value=True), accepts={"name": {"unknown-name"}}),
    "support.check_choice": Valid(
        lambda: dict(name="method", value="rope", choices=("rope", "yarn")), accepts={"name": {"unknown-name"}}
    ),
    "support.check_device": Valid(lambda: dict(name="device", value="cpu"), accepts={"name": {"unknown-name"}}),
    "support.check_int": Valid(
        lambda: dict(name="heads", value=4, minimum=1, maximum=8),
        accepts={"name": {"unknown-name"}, "minimum": {"negative", "zero"}},
    ),
    "support.check_number": Valid(
        lambda: dict(name="rate", value=0.5, minimum=0.0, above=0.0, maximum=1.0, below=1.0, finite=True),
        # A bound of any real size is well formed: out of range, it is the value that is refused.
        accepts={"name": {"unknown-name"}} | {b: {"negative", "zero", "infinite"} for b in ("minimum", "above", "maximum", "below")},
    ),
    "support.check_tensor": Valid(
        lambda: dict(name="x", value=_randn(2, 3), dims=2, min_dims=2, floating=True, dtype=torch.float32,
                     nonempty=True, sizes={-1: 3}),
        accepts={"name": {"unknown-name"}, "dims": {"zero"}, "min_dims": {"zero"}},
    ),
    "support.check_type": Valid(
        lambda: dict(name="text", value="words", expected=str),
        accepts={"name": {"unknown-name"}, "value": {"unknown-name"}},
    ),
    "support.check_int_sequence": Valid(
        lambda: dict(name="ids", value=[1, 2], minimum=0, maximum=5, nonempty=True),
        accepts={"name": {"unknown-name"}, "minimum": {"negative", "zero"}, "maximum": {"zero"}},
    ),
    "support.data_path": Valid(lambda: dict(parts=DATA)),
    "support.describe": Valid(lambda: dict(value=3), any_value=frozenset({"value"})),
    # ---------------------------------------------------------------- longctx.ch01
    "ch01.softmax": Valid(lambda: dict(scores=_randn(3), dim=-1),
                          accepts={"dim": {"zero"}, "scores": {"more-dims"}}),
    "ch01.scaled_dot_product_attention": Valid(
        lambda: dict(query=_randn(2, 4), key=_randn(3, 4, seed=1), value=_randn(3, 2, seed=2),
                     mask=torch.ones(2, 3, dtype=torch.bool), scale=0.5),
        accepts={"query": {"more-dims"}, "key": {"more-dims"},
                 "value": {"more-dims"}, "mask": {"0-d", "fewer-dims"}},
    ),
    "ch01.causal_mask": Valid(lambda: dict(seq_len=4, device="cpu")),
    "ch01.split_heads": Valid(lambda: dict(x=_randn(2, 3, 4), heads=2), accepts={"x": {"integer-dtype"}}),
    "ch01.merge_heads": Valid(lambda: dict(x=_randn(2, 2, 3, 2)), accepts={"x": {"integer-dtype"}}),
    "ch01.MultiHeadAttention": Valid(lambda: dict(d_model=8, heads=2, bias=True)),
    "ch01.MultiHeadAttention.forward": Valid(
        lambda layer: dict(x=_randn(2, 3, 8), mask=torch.ones(3, 3, dtype=torch.bool)),
        instance=lambda: _ch("ch01").MultiHeadAttention(8, 2),
        accepts={"mask": BROADCASTS},
    ),
    "ch01.attention_pairs": Valid(lambda: dict(seq_len=5, causal=True)),
    "ch01.kv_cache_scalars": Valid(lambda: dict(seq_len=5, d_model=8, layers=2)),
    # ---------------------------------------------------------------- longctx.ch02
    "ch02.ByteTokenizer.encode": Valid(lambda tokenizer: dict(text="Hi"), instance=lambda: _ch("ch02").ByteTokenizer(),
                                       accepts={"text": {"unknown-name"}}),
    "ch02.ByteTokenizer.decode": Valid(lambda tokenizer: dict(ids=[72, 105]),
                                       instance=lambda: _ch("ch02").ByteTokenizer(), accepts={"ids": {"empty"}}),
    "ch02.GPTConfig": Valid(lambda: dict(vocab_size=16, context_length=8, d_model=8, layers=1, heads=2, dropout=0.1),
                            accepts={"dropout": {"zero"}}),
    "ch02.CausalSelfAttention": Valid(lambda: dict(d_model=8, heads=2, bias=True)),
    "ch02.CausalSelfAttention.forward": Valid(
        lambda layer: dict(x=_randn(2, 3, 8), cache=_ch("ch02").KVCache(2, 2, 2, 4), layer=1),
        instance=lambda: _ch("ch02").CausalSelfAttention(8, 2),
        accepts={"layer": {"zero"}},
    ),
    "ch02.FeedForward": Valid(lambda: dict(d_model=8, dropout=0.1), accepts={"dropout": {"zero"}}),
    "ch02.FeedForward.forward": Valid(lambda mlp: dict(x=_randn(8)), instance=lambda: _ch("ch02").FeedForward(8),
                                      accepts={"x": {"more-dims"}}),
    "ch02.Block": Valid(lambda: dict(config=_tiny_config())),
    "ch02.Block.forward": Valid(
        lambda block: dict(x=_randn(2, 3, 8), cache=_ch("ch02").KVCache(2, 2, 2, 4), layer=1),
        instance=lambda: _ch("ch02").Block(_tiny_config()),
        accepts={"layer": {"zero"}},
    ),
    "ch02.TinyGPT": Valid(lambda: dict(config=_tiny_config())),
    "ch02.TinyGPT.new_cache": Valid(lambda model: dict(batch=2), instance=_tiny_model),
    "ch02.TinyGPT.forward": Valid(
        lambda model: dict(tokens=torch.tensor([[1, 2, 3], [4, 5, 6]]), cache=model.new_cache(batch=2)),
        instance=_tiny_model,
    ),
    "ch02.KVCache": Valid(lambda: dict(layers=2, batch=1, heads=2, head_dim=4, dtype=torch.float32, device="cpu")),
    "ch02.KVCache.append": Valid(
        lambda cache: dict(layer=1, key=_randn(1, 2, 3, 4), value=_randn(1, 2, 3, 4, seed=1)),
        instance=lambda: _ch("ch02").KVCache(2, 1, 2, 4),
        accepts={"layer": {"zero"}},
    ),
    "ch02.attend_with_cache": Valid(
        lambda: dict(attention=_ch("ch02").CausalSelfAttention(8, 2), x=_randn(1, 3, 8),
                     cache=_ch("ch02").KVCache(2, 1, 2, 4), layer=1),
        accepts={"layer": {"zero"}},
    ),
    "ch02.unigram_entropy": Valid(lambda: dict(token_ids=[0, 1, 1], vocab_size=4)),
    "ch02.sample_batch": Valid(
        lambda: dict(data=torch.arange(10), batch_size=2, length=3, generator=torch.Generator().manual_seed(0))
    ),
    "ch02.train": Valid(
        lambda: dict(model=_tiny_model(), token_ids=list(range(16)) * 2, steps=1, batch_size=1,
                     learning_rate=1e-3, seed=0, progress=False, sequence_length=4),
        accepts={"seed": {"zero"}},
    ),
    "ch02.evaluate_loss": Valid(
        lambda: dict(model=_tiny_model(), token_ids=list(range(16)) * 2, batches=1, batch_size=1, seed=0),
        accepts={"seed": {"zero"}},
    ),
    "ch02.next_token": Valid(
        lambda: dict(logits=_randn(5), temperature=0.5, top_k=2, generator=torch.Generator().manual_seed(0)),
        accepts={"temperature": {"zero"}},
    ),
    "ch02.generate": Valid(
        lambda: dict(model=_tiny_model(), prompt_ids=[1, 2], max_new_tokens=2, temperature=0.5, top_k=2,
                     seed=0, use_cache=True),
        accepts={"max_new_tokens": {"zero"}, "temperature": {"zero"}, "seed": {"zero"}},
    ),
    "ch02.kv_cache_bytes": Valid(lambda: dict(config=_tiny_config(), tokens=5, batch=2, bytes_per_scalar=2),
                                 accepts={"tokens": {"zero"}}),
    "ch02.quantize": Valid(lambda: dict(x=_randn(4), bits=8, dim=-1),
                           accepts={"dim": {"zero"}, "x": {"more-dims"}}),
    "ch02.dequantize": Valid(
        lambda: dict(codes=torch.tensor([3, -5, 127, 0], dtype=torch.int8), scale=torch.tensor([0.1])),
        accepts={"codes": {"more-dims"}, "scale": {"0-d"}},
    ),
}


def _kv_config():
    return _ch("ch03").KVConfig("tiny", layers=8, query_heads=4, head_dim=8, bytes_per_scalar=2, kv_heads=2)


def _latent_layer():
    return _ch("ch03").ToyLatentKVAttention(16, 4, 6, rope_key_dim=4)


def _quantized(bits: int = 8):
    """A QuantizedKV of (1, 2, 5, 4) keys at ``bits`` bits, one scale per token."""
    return _ch("ch05").quantize_cache(_randn(1, 2, 5, 4), bits)


def _decode_qkv(seed: int = 0) -> dict:
    """One decode step: a query (1, 4, 1, 8) and a cache of 2 KV heads by 5 tokens."""
    return dict(query=_randn(1, 4, 1, 8, seed=seed), key=_randn(1, 2, 5, 8, seed=seed + 1),
                value=_randn(1, 2, 5, 8, seed=seed + 2))


def _copying_model():
    torch.manual_seed(0)
    return _ch("ch04").CopyingModel(vocab=8, d_model=8, mixer=_ch("ch04").SelectiveSSMLayer(8), symbols=3)


VALID_CALLS.update({
    # ---------------------------------------------------------------- longctx.ch03
    "ch03.KVConfig": Valid(
        lambda: dict(name="tiny", layers=2, query_heads=4, head_dim=8, bytes_per_scalar=2, kv_heads=2,
                     latent_rank=None, rope_key_dim=0, window=4, windowed_layers=1),
        # An int is latent_rank's type: beside kv_heads it is refused, as a ValueError.
        accepts={"name": {"unknown-name"}, "rope_key_dim": {"zero"}, "windowed_layers": {"zero"},
                 "latent_rank": {"int"}},
    ),
    "ch03.KVConfig.from_hf_config": Valid(
        lambda config_class: dict(mapping=_ch("ch03").load_model_config("llama-2-7b"), name="llama",
                                  bytes_per_scalar=2),
        instance=lambda: _ch("ch03").KVConfig, accepts={"name": {"unknown-name"}},
    ),
    "ch03.KVConfig.cached_scalars_per_layer_token": Valid(lambda config: dict(), instance=_kv_config),
    "ch03.kv_bytes": Valid(lambda: dict(config=_kv_config(), tokens=16, batch=2), accepts={"tokens": {"zero"}}),
    "ch03.load_model_config": Valid(lambda: dict(name="llama-2-7b")),
    "ch03.repeat_kv": Valid(lambda: dict(x=_randn(1, 2, 3, 4), groups=2)),
    "ch03.grouped_attention": Valid(
        lambda: dict(query=_randn(1, 4, 3, 8), key=_randn(1, 2, 3, 8, seed=1), value=_randn(1, 2, 3, 8, seed=2),
                     mask=torch.ones(3, 3, dtype=torch.bool)),
        accepts={"mask": BROADCASTS},
    ),
    "ch03.decode_token_by_token": Valid(
        lambda: dict(layer=_ch("ch03").GroupedQueryAttention(16, 4, 2), x=_randn(1, 3, 16))
    ),
    "ch03.GroupedQueryAttention": Valid(lambda: dict(d_model=16, query_heads=4, kv_heads=2)),
    "ch03.GroupedQueryAttention.forward": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), cache=(_randn(1, 2, 2, 4), _randn(1, 2, 2, 4, seed=1))),
        instance=lambda: _ch("ch03").GroupedQueryAttention(16, 4, 2),
    ),
    "ch03.ToyLatentKVAttention": Valid(
        lambda: dict(d_model=16, query_heads=4, latent_rank=6, rope_key_dim=4, rope_base=10_000.0),
        accepts={"rope_key_dim": {"zero"}},
    ),
    # `start` may be any position >= 0 (the chapter's exercise breaks the layer with a wrong one).
    "ch03.ToyLatentKVAttention.forward": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), cache=_randn(1, 2, 10), start=2),
        instance=_latent_layer, accepts={"start": {"zero"}},
    ),
    "ch03.ToyLatentKVAttention.extend_latent": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), cache=_randn(1, 2, 10), start=2),
        instance=_latent_layer, accepts={"start": {"zero"}},
    ),
    # positions may be a list, as apply_rope's may.
    "ch03.ToyLatentKVAttention.rotary_queries": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), positions=torch.arange(2, 5)),
        instance=_latent_layer, accepts={"positions": {"list"}},
    ),
    "ch03.ToyLatentKVAttention.latent_width": Valid(
        lambda layer: dict(), instance=lambda: _ch("ch03").ToyLatentKVAttention(16, 4, 6)
    ),
    "ch03.visibility_mask": Valid(lambda: dict(seq_len=6, window=3, sinks=1, query_len=2, device="cpu"),
                                  accepts={"sinks": {"zero"}}),
    "ch03.causal_rows": Valid(lambda: dict(query_len=2, key_len=5, device="cpu")),
    "ch03.read_head_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("llama-2-7b"),
                                                bytes_per_scalar=2)),
    "ch03.read_latent_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("deepseek-v2-lite"))),
    "ch03.read_window_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("gemma-3-1b"), layers=26)),
    "ch03.rope_from_config": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("llama-3.1-8b"))),
    "ch03.apply_rope": Valid(
        lambda: dict(vectors=_randn(3, 8), positions=torch.arange(3), frequencies=torch.rand(4, dtype=torch.float64),
                     magnitude=1.0),
        accepts={"vectors": {"more-dims"}, "positions": {"list"}},
    ),
    "ch03.apply_rope_rotate_half": Valid(
        lambda: dict(vectors=_randn(3, 8), positions=torch.arange(3), frequencies=torch.rand(4, dtype=torch.float64),
                     magnitude=1.0),
        accepts={"vectors": {"more-dims"}, "positions": {"list"}},
    ),
    "ch03.interleaved_to_half_order": Valid(lambda: dict(width=8)),
    "ch03.ntk_base": Valid(lambda: dict(base=10_000.0, factor=4.0, dim=8)),
    "ch03.yarn_correction_dim": Valid(lambda: dict(turns=1.0, dim=8, base=10_000.0, original_context=64)),
    "ch03.inverse_frequencies": Valid(
        lambda: dict(dim=8, method="yarn", base=10_000.0, factor=4.0, original_context=64, beta_fast=32.0,
                     beta_slow=1.0, low_freq_factor=1.0, high_freq_factor=4.0)
    ),
    "ch03.retrieval_probe": Valid(lambda: dict(method="rope", seed=0, trials=2, context=8, original_context=4, dim=8),
                                  accepts={"seed": {"zero"}}),
    # ---------------------------------------------------------------- longctx.ch04
    "ch04.AbsorbedLatentAttention": Valid(
        lambda: dict(d_model=16, query_heads=4, latent_rank=6, rope_key_dim=4, rope_base=10_000.0),
        accepts={"rope_key_dim": {"zero"}},
    ),
    "ch04.AbsorbedLatentAttention.forward_absorbed": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), cache=_randn(1, 2, 10), merged=layer.merged_weights()),
        instance=lambda: _ch("ch04").AbsorbedLatentAttention(16, 4, 6, rope_key_dim=4),
    ),
    "ch04.CopyingModel": Valid(lambda: dict(vocab=8, d_model=8, mixer=_ch("ch04").SelectiveSSMLayer(8), symbols=3)),
    "ch04.CopyingModel.forward": Valid(lambda model: dict(tokens=torch.tensor([[0, 5, 0, 1]])),
                                       instance=_copying_model),
    "ch04.PositionalAttention": Valid(lambda: dict(d_model=8, heads=2, max_len=6)),
    "ch04.PositionalAttention.forward": Valid(lambda layer: dict(x=_randn(2, 3, 8)),
                                              instance=lambda: _ch("ch04").PositionalAttention(8, 2, 6)),
    "ch04.SelectiveSSMLayer": Valid(lambda: dict(d_model=8, state_size=4, expand=2, selective=False)),
    "ch04.SelectiveSSMLayer.forward": Valid(lambda layer: dict(x=_randn(2, 3, 8)),
                                            instance=lambda: _ch("ch04").SelectiveSSMLayer(8)),
    "ch04.selective_copying_batch": Valid(
        lambda: dict(batch_size=2, length=6, copies=2, symbols=3, generator=torch.Generator().manual_seed(0))
    ),
    "ch04.selective_scan": Valid(
        lambda: dict(u=_randn(1, 2, 5), delta=torch.full((1, 2, 5), 0.1), A=-torch.ones(2, 3),
                     B=_randn(1, 3, 5, seed=1), C=_randn(1, 3, 5, seed=2), D=torch.ones(2)),
    ),
    "ch04.train_copying": Valid(
        lambda: dict(model=_copying_model(), steps=1, length=6, copies=2, symbols=3, batch_size=2,
                     learning_rate=0.01, seed=0, test_size=2),
        accepts={"seed": {"zero"}},
    ),
    "ch04.block_sparse_attention": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2),
                     block_mask=torch.ones(2, 2, dtype=torch.bool).tril(), block_size=2,
                     token_mask=torch.ones(4, 4, dtype=torch.bool).tril()),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
    "ch04.cache_bytes_by_design": Valid(lambda: dict(tokens=16, config=_kv_config()), accepts={"tokens": {"zero"}}),
    "ch04.context_cost": Valid(lambda: dict(tokens=16, config=_kv_config()), accepts={"tokens": {"zero"}}),
    "ch04.discretize": Valid(lambda: dict(delta=torch.tensor([0.1, 0.5]), a=-1.0, b=1.0),
                             accepts={"delta": {"0-d", "more-dims"}, "a": {"negative"}, "b": {"negative", "zero"}}),
    "ch04.expand_block_mask": Valid(
        lambda: dict(block_mask=torch.ones(2, 2, dtype=torch.bool).tril(), block_size=2, seq_len=4)
    ),
    "ch04.feature_map": Valid(lambda: dict(x=_randn(3)), accepts={"x": {"0-d", "more-dims"}}),  # entrywise
    # No global tokens leaves a plain window.
    "ch04.global_local_mask": Valid(lambda: dict(seq_len=6, window=2, global_tokens=(0,), causal=True),
                                    accepts={"global_tokens": {"empty"}}),
    "ch04.hops_needed": Valid(lambda: dict(distance=10, window=4), accepts={"distance": {"zero"}}),
    "ch04.hybrid_cache_bytes": Valid(
        lambda: dict(tokens=16, config=_kv_config(), attention_layers=1, channels=8, state_size=4),
        accepts={"tokens": {"zero"}, "attention_layers": {"zero"}},
    ),
    "ch04.linear_attention_chunked": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), chunk_size=2),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
    "ch04.linear_attention_quadratic": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2)),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
    "ch04.linear_attention_recurrent": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2),
                     state=(torch.zeros(8, 8), torch.zeros(8))),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
    "ch04.linear_attention_weights": Valid(lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1)),
                                           accepts={"query": {"more-dims"}, "key": {"more-dims"}}),
    "ch04.pairs_computed": Valid(lambda: dict(mask=torch.ones(3, 3, dtype=torch.bool).tril()),
                                 accepts={"mask": {"fewer-dims", "more-dims", "0-d", "empty"}}),
    "ch04.parallel_scan": Valid(lambda: dict(a=torch.rand(5), b=_randn(5)), accepts={"a": {"more-dims"}, "b": {"more-dims"}}),
    "ch04.sequential_scan": Valid(lambda: dict(a=torch.rand(5), b=_randn(5)), accepts={"a": {"more-dims"}, "b": {"more-dims"}}),
    "ch04.quantize_kv": Valid(lambda: dict(x=_randn(3, 8), bits=4, per="token"), accepts={"x": {"more-dims"}}),
    "ch04.quantized_cache_error": Valid(
        lambda: dict(bits=4, keys_per="channel", tokens=8, dim=8, outlier_channels=1, outlier_scale=10.0, seed=0),
        accepts={"outlier_channels": {"zero"}, "seed": {"zero"}},
    ),
    "ch04.quantized_kv_bytes_per_token": Valid(lambda: dict(config=_kv_config(), bits=4, scale_bytes=2),
                                               accepts={"scale_bytes": {"zero"}}),
    "ch04.receptive_field": Valid(lambda: dict(mask=torch.ones(4, 4, dtype=torch.bool).tril(), layers=2),
                                  accepts={"layers": {"zero"}}),
    "ch04.rolling_buffer_slots": Valid(lambda: dict(tokens_seen=5, window=3), accepts={"tokens_seen": {"zero"}}),
    "ch04.scan_rounds": Valid(lambda: dict(length=8), accepts={"length": {"zero"}}),  # no steps, no rounds
    "ch04.selective_ssm": Valid(
        lambda: dict(x=_randn(5), delta=torch.full((5,), 0.5), a=-1.0, b=1.0, readout=1.0),
        accepts={"a": {"negative"}, "b": {"negative", "zero"}, "readout": {"negative", "zero"}},
    ),
    "ch04.sharpness_comparison": Valid(lambda: dict(query_scale=2.0, seed=0, tokens=6, width=4),
                                       accepts={"seed": {"zero"}}),
    "ch04.sliding_window_block_mask": Valid(lambda: dict(seq_len=8, window=3, block_size=2)),
    "ch04.sliding_window_decode": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), window=2),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
    "ch04.ssm_convolution": Valid(lambda: dict(x=_randn(6), A=torch.eye(2) * 0.5, B=torch.ones(2), C=torch.ones(2))),
    "ch04.ssm_kernel": Valid(lambda: dict(A=torch.eye(2) * 0.5, B=torch.ones(2), C=torch.ones(2), length=6)),
    "ch04.ssm_recurrent": Valid(lambda: dict(x=_randn(6), A=torch.eye(2) * 0.5, B=torch.ones(2), C=torch.ones(2))),
    "ch04.ssm_state_bytes": Valid(lambda: dict(channels=8, state_size=4, bytes_per_scalar=2)),
    "ch04.step_sizes": Valid(lambda: dict(markers=torch.tensor([0.0, 1.0, 0.0]), sharpness=10.0, bias=-5.0),
                             accepts={"markers": {"0-d", "more-dims"}, "sharpness": {"negative", "zero"},
                                      "bias": {"negative", "zero"}}),
    "ch04.strided_mask": Valid(lambda: dict(seq_len=8, stride=2)),
    "ch04.weight_sharpness": Valid(lambda: dict(weights=torch.full((4, 4), 0.25), last_rows=2)),
    "ch04.window_reach": Valid(lambda: dict(window=4, layers=2), accepts={"layers": {"zero"}}),  # no layers, no reach
    # ---------------------------------------------------------------- longctx.ch05
    "ch05.median_seconds": Valid(lambda: dict(function=lambda: None, threads=1, min_run_time=0.01)),
    # `like` lends only its dtype and device, so a tensor of any shape will do.
    "ch05.online_softmax_start": Valid(lambda: dict(rows=(2,), value_width=8, like=_randn(2, 3)),
                                       accepts={"like": {"0-d", "empty", "fewer-dims", "more-dims"}}),
    "ch05.online_softmax_update": Valid(
        lambda: dict(state=_ch("ch05").online_softmax_start((2,), 8, _randn(1)), scores=_randn(2, 3),
                     values=_randn(3, 8, seed=1)),
    ),
    "ch05.finish_online_softmax": Valid(
        lambda: dict(state=(torch.zeros(4, 1), torch.ones(4, 1), _randn(4, 8)))
    ),
    "ch05.visible_ranges": Valid(lambda: dict(tokens=10, window=4, sinks=2), accepts={"sinks": {"zero"}}),
    "ch05.tile_ranges": Valid(lambda: dict(ranges=[(0, 2), (6, 10)], tile=3)),
    "ch05.pack_int4": Valid(lambda: dict(codes=torch.tensor([[-8, 7, 0, 3]], dtype=torch.int8)),
                            accepts={"codes": {"fewer-dims", "more-dims"}}),
    "ch05.int4_halves": Valid(lambda: dict(packed=torch.tensor([[0x7F, 0x08]], dtype=torch.uint8)),
                              accepts={"packed": {"fewer-dims", "more-dims"}}),
    "ch05.unpack_int4": Valid(lambda: dict(packed=torch.tensor([[0x7F, 0x08]], dtype=torch.uint8)),
                              accepts={"packed": {"fewer-dims", "more-dims"}}),
    "ch05.QuantizedKV": Valid(
        lambda: dict(codes=torch.ones(1, 2, 5, 4, dtype=torch.int8), scale=torch.full((1, 2, 5, 1), 0.1),
                     bits=8, per="token")
    ),
    "ch05.QuantizedKV.scale_at": Valid(lambda cache: dict(start=1, stop=3), instance=_quantized,
                                       accepts={"start": {"zero"}}),
    "ch05.quantize_cache": Valid(lambda: dict(x=_randn(1, 2, 5, 4), bits=4, per="channel")),
    "ch05.dequantize_cache": Valid(lambda: dict(cache=_quantized(4))),
    "ch05.read_tile": Valid(lambda: dict(cache=_quantized(4), start=1, stop=3, buffer=torch.empty(1, 2, 3, 4)),
                            accepts={"start": {"zero"}}),
    "ch05.decode_shapes": Valid(lambda: _decode_qkv()),
    "ch05.decode_reference": Valid(lambda: dict(_decode_qkv(), window=3, sinks=1), accepts={"sinks": {"zero"}}),
    "ch05.flash_decode": Valid(lambda: dict(_decode_qkv(), tile=2, window=3, sinks=1, scale=0.35),
                               accepts={"sinks": {"zero"}}),
    "ch05.fused_flash_decode": Valid(
        lambda: dict(_decode_qkv(), tile=2, window=3, sinks=1, scale=0.35,
                     tile_update=_ch("ch05").fused_tile_update),
        accepts={"sinks": {"zero"}},
    ),
    "ch05.tile_codes": Valid(lambda: dict(tile=torch.ones(1, 2, 3, 4, dtype=torch.int8), bits=8,
                                          dtype=torch.float32)),
    "ch05.fused_tile_update": Valid(
        lambda: dict(state=_ch("ch05").online_softmax_start((1, 2, 2), 4, _randn(1)), rows=_randn(1, 2, 2, 4),
                     key_tile=torch.ones(1, 2, 3, 4, dtype=torch.int8), key_scale=torch.full((1, 2, 3, 1), 0.1),
                     value_tile=torch.ones(1, 2, 3, 4, dtype=torch.int8), value_scale=torch.full((1, 2, 3, 1), 0.2),
                     bits=8)
    ),
    "ch05.flash_decode_latent": Valid(
        lambda: dict(query=_randn(1, 4, 1, 8), latent=_randn(1, 5, 6, seed=1), key_up=_randn(32, 6, seed=2),
                     value_up=_randn(32, 6, seed=3), tile=2, window=3, sinks=1),
        accepts={"sinks": {"zero"}},
    ),
    "ch05.partition_bounds": Valid(lambda: dict(seq_len=8, parts=2)),
    "ch05.causal_block_scores": Valid(
        lambda: dict(query=_randn(2, 8), key=_randn(3, 8, seed=1), query_start=4, key_start=2, scale=0.35),
        accepts={"query_start": {"zero"}, "key_start": {"zero"}, "query": {"more-dims"}, "key": {"more-dims"}},
    ),
    "ch05.check_query_key_value": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2)),
    ),
    "ch05.blockwise_causal_attention": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), parts=2, order="ring"),
    ),
    "ch05.RingResult": Valid(
        lambda: dict(output=_randn(4, 8), parts=2, bounds=[(0, 2), (2, 4)], cache_bytes_per_rank=[128, 128],
                     bytes_sent_per_step=[[128], [128]]),
        accepts={"output": {"more-dims"}},
    ),
    # One rank of one: it meets itself on a free port in this process (threads restored by a fixture).
    "ch05.ring_attention_rank": Valid(
        lambda: dict(rank=0, parts=1, port=_ch("ch05").free_local_port(), query=_randn(4, 8),
                     key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), output=torch.zeros(4, 8),
                     bytes_sent=torch.zeros(1, 1, dtype=torch.int64), cache_bytes=torch.zeros(1, dtype=torch.int64)),
        accepts={"rank": {"zero"}},
    ),
    "ch05.ring_attention": Valid(
        lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), parts=1,
                     timeout_s=60.0),
        accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
    ),
})


def _rotary_model():
    torch.manual_seed(0)
    config = _ch("ch02").GPTConfig(vocab_size=256, context_length=8, d_model=16, layers=1, heads=2)
    return _ch("ch06").RotaryGPT(config).eval()


def _byte_text(tokens: int = 200) -> torch.Tensor:
    """Filler text as byte ids: lowercase letters, never the key mark or a digit."""
    return torch.arange(tokens) % 26 + ord("a")


def _tiny_settings():
    return _ch("ch06").ExtensionSettings(trained_length=8, factors=(1, 2), d_model=16, layers=1, heads=2,
                                         steps=1, batch_size=2, finetune_steps=1, windows=2, depths=(0.0, 1.0),
                                         trials=2, seeds=(0,), methods=("rope", "pi"))


VALID_CALLS.update({
    # ---------------------------------------------------------------- longctx.ch06
    "ch06.ExtensionSettings": Valid(
        lambda: dict(trained_length=8, factors=(1, 2), d_model=16, layers=1, heads=2, base=10000.0, steps=1,
                     batch_size=2, learning_rate=0.003, key_share=0.25, finetune_steps=1,
                     finetune_learning_rate=0.001, windows=2, depths=(0.0, 1.0), trials=2, seeds=(0,),
                     methods=("rope", "pi"), fused=True),
        accepts={"key_share": {"zero"}},  # text only, no keys: a valid (if dull) run
    ),
    "ch06.RotarySelfAttention": Valid(lambda: dict(d_model=16, heads=2, fused=False)),
    "ch06.RotarySelfAttention.set_bands": Valid(
        lambda layer: dict(frequencies=torch.ones(4, dtype=torch.float64), magnitude=1.0),
        instance=lambda: _ch("ch06").RotarySelfAttention(16, 2),
    ),
    "ch06.RotarySelfAttention.forward": Valid(
        lambda layer: dict(x=_randn(1, 3, 16), cache=None, layer=0),
        instance=lambda: _ch("ch06").RotarySelfAttention(16, 2).eval(),
        accepts={"layer": {"zero"}},
    ),
    "ch06.RotaryGPT": Valid(
        lambda: dict(config=_ch("ch02").GPTConfig(vocab_size=256, context_length=8, d_model=16, layers=1, heads=2),
                     base=10000.0, fused=False),
    ),
    "ch06.RotaryGPT.set_rope": Valid(lambda model: dict(method="pi", factor=2.0), instance=_rotary_model),
    "ch06.RotaryGPT.forward": Valid(
        lambda model: dict(tokens=torch.tensor([[1, 2, 3]]), cache=None), instance=_rotary_model,
    ),
    "ch06.recipe_bands": Valid(
        lambda: dict(method="yarn", head_dim=8, factor=2.0, base=10000.0, original_context=8),
    ),
    "ch06.passkey_batch": Valid(
        lambda: dict(data=_byte_text(), depths=torch.tensor([0.0, 1.0]), length=8,
                     generator=torch.Generator().manual_seed(0)),
    ),
    "ch06.train_with_keys": Valid(
        lambda: dict(model=_rotary_model(), token_ids=_byte_text(), steps=1, batch_size=2, length=8,
                     key_share=0.5, learning_rate=0.003, seed=0, progress=None),
        accepts={"seed": {"zero"}, "key_share": {"zero"}},  # no keyed windows: text only
    ),
    "ch06.position_losses": Valid(
        lambda: dict(model=_rotary_model(), token_ids=_byte_text(), length=8, windows=2, span=8),
    ),
    "ch06.passkey_hits": Valid(
        lambda: dict(model=_rotary_model(), token_ids=_byte_text(), length=8, depths=(0.0, 1.0), trials=2,
                     seed=0, chunk=2),
        accepts={"seed": {"zero"}},
    ),
    "ch06.wilson_interval": Valid(lambda: dict(hits=3, trials=8, z=1.96), accepts={"hits": {"zero"}}),
    "ch06.run_extension_experiment": Valid(lambda: dict(settings=_tiny_settings(), progress=False)),
    "ch06.load_extension_results": Valid(lambda: dict(folder=None)),  # run from the repository
})


# ------------------------------------------------------------------------------------------ probes

# What each probe is: a value of the wrong type (TypeError) or a wrong value of the right type (ValueError).
WRONG_TYPE = {"bool", "int", "float", "string", "None", "list", "floats", "strings", "numbers", "integer-dtype",
              "float-dtype"}
WRONG_VALUE = {"negative", "zero", "nan", "infinite", "unknown-name", "empty", "nested", "0-d", "fewer-dims",
               "more-dims"}


def _probes(value: object) -> dict[str, object]:
    """The bad values to try in place of ``value``, by the kind of argument it shows."""
    if isinstance(value, bool):
        return {"int": 1, "string": "yes", "None": None}
    if isinstance(value, int):
        return {"bool": True, "float": 2.5, "string": "2", "negative": -100, "zero": 0, "None": None}
    if isinstance(value, float):
        return {"bool": True, "string": "0.5", "nan": math.nan, "infinite": math.inf, "negative": -1.0,
                "zero": 0.0, "None": None}
    if isinstance(value, str):
        return {"int": 3, "unknown-name": "no-such-name", "None": None}
    if isinstance(value, torch.Tensor):
        return _tensor_probes(value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, int) for v in value):
        return {"int": 3, "floats": [0.5] * len(value), "nested": [list(value)], "strings": ["a"] * len(value),
                "empty": [], "None": None}
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
        return {"int": 3, "string": value[0], "empty": (), "numbers": (1, 2)}
    return {"int": 3, "string": "no-such-name", "None": None}  # an object: a config, a model, a cache


def _tensor_probes(value: torch.Tensor) -> dict[str, object]:
    probes: dict[str, object] = {"list": value.tolist(), "None": None}
    if value.dim() >= 1:
        probes["0-d"] = value.reshape(-1)[0].clone()
        probes["empty"] = value.narrow(-1, 0, 0).clone()  # the last dimension cut to 0
    if value.dim() >= 2:
        probes["fewer-dims"] = value[0].clone()
    probes["more-dims"] = value[None].clone()
    if value.is_floating_point():
        probes["integer-dtype"] = value.round().long()
    else:
        probes["float-dtype"] = value.float()
    return probes


def _public_callables(module_name: str) -> dict[str, Callable]:
    """Map ``"chNN.name"`` (and ``"chNN.Class.method"``) to each public callable of a module."""
    module = _ch(module_name)
    found = {}
    for name in module.__all__:
        obj = getattr(module, name)
        defined_here = getattr(obj, "__module__", "").startswith("longctx")
        if inspect.isclass(obj) and defined_here:
            found[f"{module_name}.{name}"] = obj
            for attribute, member in vars(obj).items():
                if attribute.startswith("_"):
                    continue
                if isinstance(member, classmethod | staticmethod):
                    found[f"{module_name}.{name}.{attribute}"] = getattr(obj, attribute)
                elif inspect.isfunction(member):
                    found[f"{module_name}.{name}.{attribute}"] = member
        elif inspect.isfunction(obj) and defined_here:
            found[f"{module_name}.{name}"] = obj
    return found


def _parameters(target: Callable) -> list[inspect.Parameter]:
    """The parameters a caller supplies (not ``self``, not ``**kwargs``)."""
    signature = inspect.signature(target)
    names = list(signature.parameters.values())
    if names and names[0].name == "self":
        names = names[1:]
    return [p for p in names if p.kind is not inspect.Parameter.VAR_KEYWORD]


def _target(key: str, valid: Valid) -> tuple[Callable, dict, list[inspect.Parameter]]:
    """Return the function to call (a bound method for a method), fresh valid arguments, and its parameters."""
    module_name, *path = key.split(".")
    obj = _ch(module_name)
    for part in path:
        obj = getattr(obj, part)
    parameters = _parameters(obj)
    if valid.instance is not None:
        instance = valid.instance()
        return getattr(instance, path[-1]), valid.arguments(instance), parameters
    return obj, valid.arguments(), parameters


def _call(function: Callable, arguments: dict, parameters: list[inspect.Parameter]):
    positional = []
    keywords = dict(arguments)
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            positional.extend(keywords.pop(parameter.name))
    return function(*positional, **keywords)


def _optional(parameter: inspect.Parameter) -> bool:
    return parameter.default is None or "None" in str(parameter.annotation)


def _cases() -> list[tuple[str, str, str]]:
    """Every (callable, argument, probe) to try. An entry that is stale or incomplete gives
    no cases here rather than breaking collection: the two table tests below report it."""
    cases = []
    for key in sorted(k for k in VALID_CALLS if k.split(".")[0] in SWEPT_MODULES):
        valid = VALID_CALLS[key]
        try:
            _, arguments, parameters = _target(key, valid)
        except Exception:  # noqa: BLE001 - reported by test_the_valid_call_succeeds_...
            continue
        for parameter in parameters:
            if parameter.name in valid.any_value or parameter.name not in arguments:
                continue
            value = arguments[parameter.name]
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                value = value[0]
            for label in _probes(value):
                if label in valid.accepts.get(parameter.name, set()):
                    continue
                if label == "None" and _optional(parameter):
                    continue
                cases.append((key, parameter.name, label))
    return cases


# ------------------------------------------------------------------------------------------ tests


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A ring rank sets torch's thread count for its process: give the test process its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("module_name", SWEPT_MODULES)
def test_every_public_callable_has_a_valid_call_in_the_table(module_name):
    """A new public function fails here until the table says how to call it, so the sweep covers it."""
    missing = [key for key, target in _public_callables(module_name).items()
               if _parameters(target) and key not in VALID_CALLS]
    assert not missing, f"add a valid call to VALID_CALLS for: {missing}"
    stale = [key for key in VALID_CALLS if key.split(".")[0] == module_name
             and key not in _public_callables(module_name)]
    assert not stale, f"VALID_CALLS names callables that are not public: {stale}"


@pytest.mark.parametrize("key", sorted(k for k in VALID_CALLS if k.split(".")[0] in SWEPT_MODULES))
def test_the_valid_call_succeeds_and_names_every_parameter(key):
    """Each bad call differs from a call that works in exactly one argument."""
    valid = VALID_CALLS[key]
    function, arguments, parameters = _target(key, valid)
    assert sorted(arguments) == sorted(p.name for p in parameters), "give a valid value for every parameter"
    _call(function, arguments, parameters)


@pytest.mark.parametrize(("key", "parameter", "probe"), _cases())
def test_a_bad_argument_raises_type_or_value_error_naming_it(key, parameter, probe):
    valid = VALID_CALLS[key]
    function, arguments, parameters = _target(key, valid)
    kind = next(p for p in parameters if p.name == parameter).kind
    if kind is inspect.Parameter.VAR_POSITIONAL:
        bad = _probes(arguments[parameter][0])[probe]
        arguments[parameter] = (bad, *arguments[parameter][1:])
    else:
        arguments[parameter] = _probes(arguments[parameter])[probe]
    expected = TypeError if probe in WRONG_TYPE else ValueError
    try:
        result = _call(function, arguments, parameters)
    except (TypeError, ValueError) as error:
        assert isinstance(error, expected), (
            f"{key}({parameter}=<{probe}>) raised {type(error).__name__}, but a "
            f"{'wrong type' if expected is TypeError else 'wrong value'} calls for {expected.__name__}: {error}"
        )
        # A check's `value` is named by the `name` it is given.
        named = arguments["name"] if parameter == "value" and "name" in arguments else parameter
        assert re.search(rf"\b{re.escape(named)}\b", str(error)), (
            f"{key}({parameter}=<{probe}>) raised {type(error).__name__} without naming {named!r}: {error}"
        )
        return
    except Exception as error:  # noqa: BLE001 - the point is to report any other kind
        pytest.fail(f"{key}({parameter}=<{probe}>) raised {type(error).__name__}, not TypeError or ValueError: {error}")
    pytest.fail(f"{key}({parameter}=<{probe}>) was accepted silently and returned {type(result).__name__}")


def test_every_probe_is_either_a_wrong_type_or_a_wrong_value():
    samples = [True, 3, 0.5, "name", torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), [1, 2], ("a", "b"), object()]
    labels = {label for sample in samples for label in _probes(sample)}
    assert labels <= WRONG_TYPE | WRONG_VALUE and not WRONG_TYPE & WRONG_VALUE, labels - WRONG_TYPE - WRONG_VALUE
