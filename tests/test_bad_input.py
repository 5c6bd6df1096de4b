"""Bad input, checked where it enters: the boundary list, and the values that would pass unnoticed.

The book's rule (CONTRIBUTING.md, "Bad input: checked at the boundary") has two halves, and this file
checks each from a list written out by hand:

- ``BOUNDARIES``, one table per chapter, names every place where an argument enters
  from a person: config dataclasses, layer and model constructors, readers of files and
  configs, drivers (training, generation, experiments, benchmarks, the ring launcher).
  Each entry gives one valid call. The sweep replaces one argument at a time by a value
  of the wrong type (a bool or a float for a count, a string for a number, a list for a
  tensor, a number for a name or an object) or a wrong value (negative, zero, NaN,
  infinite, an unknown name, an empty or misshapen tensor), and the call must raise
  TypeError for the first kind and ValueError for the second, naming the argument.
  ``Valid.accepts`` lists the probes an argument legitimately accepts (a seed may be 0),
  which documents them.
- ``MISLEADING`` lists values that failed deep inside with PyTorch's words (an invalid shape,
  an index out of range) at public calls a student makes: each must be refused by name.
- ``SILENT`` lists values that would give a wrong answer without any error (a zero
  window, a zero chunk, a bit width the packer cannot hold, negative sinks, a
  negative count, a fractional length), each with the call through which it can
  enter. Every one must be refused, kernels included: a wrong value with ValueError,
  a value of the wrong type (a length of 2.5) with TypeError.

Kernels and helpers (attention, masks, RoPE, scans, tile readers) are not swept: their
shape contract is their docstring and PyTorch's own error is fine there.

When a chapter's code changes, its table changes with it: an entry that names a
callable the chapter no longer has, or whose valid call no longer works, fails with a
message that says which entry to update.

Sinks past the window are not on the silent list: the book's mask keeps its sinks beside
the window, not inside it (a row reads min(T, W + s) keys), so 3 sinks with a window of 2
are a valid pattern, and ``tests/test_ch03.py`` checks the mask it gives.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pathlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch


@dataclass
class Valid:
    """A valid call of one boundary callable, from which the bad calls are made.

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


def _kv_config():
    return _ch("ch03").KVConfig("tiny", layers=8, query_heads=4, head_dim=8, bytes_per_scalar=2, kv_heads=2)


def _copying_model():
    torch.manual_seed(0)
    return _ch("ch04").CopyingModel(vocab=8, d_model=8, mixer=_ch("ch04").SelectiveSSMLayer(8), symbols=3)


def _rotary_model():
    torch.manual_seed(0)
    config = _ch("ch02").GPTConfig(vocab_size=256, context_length=8, d_model=16, layers=1, heads=2)
    return _ch("ch06").RotaryGPT(config).eval()


def _byte_text(tokens: int = 200) -> torch.Tensor:
    """Filler text as byte ids: lowercase letters, never the key mark or a digit."""
    return torch.arange(tokens) % 26 + ord("a")


BROADCASTS = {"0-d", "fewer-dims", "more-dims"}  # a mask or scale that broadcasts
DATA = ("configs", "gemma-3-1b.json")

# ------------------------------------------------------------------------------------------ the boundary list
# One table per chapter. The lead updates a chapter's table when its code merges.

BOUNDARIES: dict[str, dict[str, Valid]] = {
    # ---------------------------------------------------------------- support: the reader of the book's data files
    "support": {
        "support.data_path": Valid(lambda: dict(parts=DATA)),
        # An unknown prefix is a name like any other: no such file is FileNotFoundError, not a bad argument.
        # A string is a folder's name, as a Path is (one that names no folder: tests/test_runs.py).
        "support.load_results": Valid(lambda: dict(prefix="extension", folder=None),
                                      accepts={"prefix": {"unknown-name"}, "folder": {"string"}}),
        # The one timer, which Chapters 2 and 5 and the benchmarks call.
        "support.time_call": Valid(lambda: dict(function=lambda: None, threads=1, min_run_time=0.01,
                                                slow_repeats=1, min_blocks=1)),
    },
    # ---------------------------------------------------------------- ch01: the attention layer's constructor and the counts
    "ch01": {
        "ch01.MultiHeadAttention": Valid(lambda: dict(d_model=8, heads=2, bias=True)),
        # The counts a reader calls with sizes: an empty context counts nothing, which is right.
        "ch01.attention_pairs": Valid(lambda: dict(seq_len=5, causal=True), accepts={"seq_len": {"zero"}}),
        "ch01.kv_cache_scalars": Valid(lambda: dict(seq_len=5, d_model=8, layers=2),
                                       accepts={name: {"zero"} for name in ("seq_len", "d_model", "layers")}),
    },
    # ---------------------------------------------------------------- ch02: the tokenizer, the config, the constructors, the drivers, the byte count
    "ch02": {
        "ch02.ByteTokenizer.encode": Valid(lambda tokenizer: dict(text="Hi"), instance=lambda: _ch("ch02").ByteTokenizer(),
                                           accepts={"text": {"unknown-name"}}),
        "ch02.ByteTokenizer.decode": Valid(lambda tokenizer: dict(ids=[72, 105]),
                                           instance=lambda: _ch("ch02").ByteTokenizer(), accepts={"ids": {"empty"}}),
        "ch02.GPTConfig": Valid(lambda: dict(vocab_size=16, context_length=8, d_model=8, layers=1, heads=2, dropout=0.1),
                                accepts={"dropout": {"zero"}}),
        "ch02.CausalSelfAttention": Valid(lambda: dict(d_model=8, heads=2, bias=True)),
        "ch02.FeedForward": Valid(lambda: dict(d_model=8, dropout=0.1), accepts={"dropout": {"zero"}}),
        "ch02.TinyGPT": Valid(lambda: dict(config=_tiny_config())),
        "ch02.train": Valid(
            lambda: dict(model=_tiny_model(), token_ids=list(range(16)) * 2, steps=1, batch_size=1,
                         learning_rate=1e-3, seed=0, progress=False, sequence_length=4),
            accepts={"seed": {"zero"}},
        ),
        "ch02.evaluate_loss": Valid(
            lambda: dict(model=_tiny_model(), token_ids=list(range(16)) * 2, batches=1, batch_size=1, seed=0),
            accepts={"seed": {"zero"}},
        ),
        "ch02.generate": Valid(
            lambda: dict(model=_tiny_model(), prompt_ids=[1, 2], max_new_tokens=2, temperature=0.5, top_k=2,
                         seed=0, use_cache=True),
            accepts={"max_new_tokens": {"zero"}, "temperature": {"zero"}, "seed": {"zero"}},
        ),
    },
    # ---------------------------------------------------------------- ch03: the config, the readers of model configs, the layers' constructors, the probe experiment
    "ch03": {
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
        "ch03.load_model_config": Valid(lambda: dict(name="llama-2-7b")),
        "ch03.read_head_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("llama-2-7b"),
                                                    bytes_per_scalar=2)),
        "ch03.read_latent_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("deepseek-v2-lite"))),
        "ch03.read_window_fields": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("gemma-3-1b"), layers=26)),
        "ch03.rope_from_config": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("llama-3.1-8b"))),
        "ch03.GroupedQueryAttention": Valid(lambda: dict(d_model=16, query_heads=4, kv_heads=2)),
        "ch03.AbsorbedLatentAttention": Valid(
            lambda: dict(d_model=16, query_heads=4, latent_rank=6, rope_key_dim=4, rope_base=10_000.0),
            accepts={"rope_key_dim": {"zero"}},
        ),
        "ch03.ToyLatentKVAttention": Valid(
            lambda: dict(d_model=16, query_heads=4, latent_rank=6, rope_key_dim=4, rope_base=10_000.0),
            accepts={"rope_key_dim": {"zero"}},
        ),
        "ch03.retrieval_probe": Valid(lambda: dict(method="rope", seed=0, trials=2, context=8, original_context=4, dim=8,
                                                   base=10_000.0, chunk=1),
                                      accepts={"seed": {"zero"}}),
    },
    # ---------------------------------------------------------------- ch04: the layers' and model's constructors, the training driver, the experiments
    "ch04": {
        "ch04.CopyingModel": Valid(lambda: dict(vocab=8, d_model=8, mixer=_ch("ch04").SelectiveSSMLayer(8), symbols=3)),
        "ch04.PositionalAttention": Valid(lambda: dict(d_model=8, heads=2, max_len=6)),
        "ch04.SelectiveSSMLayer": Valid(lambda: dict(d_model=8, state_size=4, expand=2, selective=False)),
        "ch04.train_copying": Valid(
            lambda: dict(model=_copying_model(), steps=1, length=6, copies=2, symbols=3, batch_size=2,
                         learning_rate=0.01, seed=0, test_size=2),
            accepts={"seed": {"zero"}},
        ),
        "ch04.quantized_cache_error": Valid(
            lambda: dict(bits=4, keys_per="channel", tokens=8, dim=8, outlier_channels=1, outlier_scale=10.0, seed=0),
            accepts={"outlier_channels": {"zero"}, "seed": {"zero"}},
        ),
        "ch04.sharpness_comparison": Valid(lambda: dict(query_scale=2.0, seed=0, tokens=6, width=4),
                                           accepts={"seed": {"zero"}}),
        # The state count a reader calls with sizes, as Chapter 1's kv_cache_scalars.
        "ch04.ssm_state_bytes": Valid(lambda: dict(channels=8, state_size=4, bytes_per_scalar=2)),
    },
    # ---------------------------------------------------------------- ch05: the timer, the cache builders, the launchers
    "ch05": {
        "ch05.KiviCache.from_keys_values": Valid(
            lambda: dict(key=_randn(1, 2, 6, 4), value=_randn(1, 2, 6, 4, seed=1), bits=4, group=2, residual=2),
            accepts={"residual": {"zero"}},  # no full-precision tail: every token quantised
        ),
        "ch05.ring_attention": Valid(
            lambda: dict(query=_randn(4, 8), key=_randn(4, 8, seed=1), value=_randn(4, 8, seed=2), parts=1,
                         timeout_s=60.0),
            accepts={"query": {"more-dims"}, "key": {"more-dims"}, "value": {"more-dims"}},
        ),
        # A quantised cache's constructor: codes of the wrong dtype for their bits, or a scale that broadcasts,
        # would dequantise to wrong numbers without an error, so it refuses them where they enter.
        "ch05.QuantizedKV": Valid(lambda: dict(codes=torch.zeros(1, 2, 5, 4, dtype=torch.int8),
                                               scale=torch.ones(1, 2, 5, 1), bits=8)),
        "ch05.sharded_decode": Valid(
            lambda: dict(query=_randn(1, 2, 1, 8), key=_randn(1, 2, 6, 8, seed=1), value=_randn(1, 2, 6, 8, seed=2),
                         parts=1, repeats=1, timeout_s=60.0),
        ),
    },
    # ---------------------------------------------------------------- ch06: the model, its recipe switch, the task's batches, the trainer and the results reader
    # (the experiment's settings and driver live in experiments/extension.py; tests/test_ch06.py sweeps them)
    "ch06": {
        "ch06.RotarySelfAttention": Valid(lambda: dict(d_model=16, heads=2, fused=False)),
        "ch06.RotaryGPT": Valid(
            lambda: dict(config=_ch("ch02").GPTConfig(vocab_size=256, context_length=8, d_model=16, layers=1, heads=2),
                         base=10000.0, fused=False),
        ),
        "ch06.RotaryGPT.set_rope": Valid(lambda model: dict(method="pi", factor=2.0), instance=_rotary_model),
        "ch06.train_with_keys": Valid(
            lambda: dict(model=_rotary_model(), text=_byte_text(), steps=1, batch_size=2, length=8,
                         key_share=0.5, learning_rate=0.003, seed=0, max_keys=1, progress=None),
            accepts={"seed": {"zero"}, "key_share": {"zero"}},  # no keyed windows: text only
        ),
    },
    # ---------------------------------------------------------------- ch07: the checked way to a cache, the two measurements and the results reader
    # (the experiment's settings and driver live in experiments/forgetting.py; tests/test_ch07.py runs them)
    "ch07": {
        "ch07.make_cache": Valid(lambda: dict(model=_rotary_model(), policy="h2o", budget=0.5, prompt_tokens=40)),
        "ch07.compressed_hits": Valid(lambda: dict(model=_rotary_model(), batch=_key_batch(), policy="sinks",
                                                   budget=0.5)),
        "ch07.compressed_guesses": Valid(lambda: dict(model=_rotary_model(), batch=_key_batch(),
                                                      policy="streaming", budget=0.5)),
        "ch07.compressed_losses": Valid(
            lambda: dict(model=_rotary_model(), inputs=_byte_text(40).view(2, 20),
                         targets=_byte_text(41)[1:].view(2, 20), policy="window", budget=0.5, prompt=12)),
        "ch07.read_with_cache": Valid(lambda: dict(model=_rotary_model(), tokens=_byte_text(24).view(2, 12),
                                                   cache=_ch("ch07").make_cache(_rotary_model(), "h2o", 0.5,
                                                                                prompt_tokens=12))),
        # the chapter's small case, which Exercise 12.2 builds again
        "ch07.toy_seen": Valid(lambda: dict(entries=6, window=2, seed=0), accepts={"seed": {"zero"}}),
    },
    # ---------------------------------------------------------------- ch08: serving (the layer step, the kernel, pages, drafts)
    "ch08": {
        "ch08.request_trace": Valid(lambda: dict(count=4, seed=0, rate=2.0, prompt_median=2_048,
                                                 prompt_sigma=1.0, output_median=256, output_sigma=0.8,
                                                 max_tokens=4_096),
                                    accepts={"seed": {"zero"}, "prompt_sigma": {"zero"},
                                             "output_sigma": {"zero"}}),
        # -- step
        "ch08.layer_shape": Valid(lambda: dict(mapping=_ch("ch03").load_model_config("llama-3.1-8b"))),
        "ch08.layer_weights": Valid(lambda: dict(shape=_small_layer(), dtype="bfloat16", seed=1),
                                    accepts={"seed": {"zero"}}),
        "ch08.fit_step_cost": Valid(lambda: dict(points=_step_points())),
        "ch08.serve_trace": Valid(lambda: dict(trace=_ch("ch08").request_trace(3, rate=0.1, max_tokens=512),
                                               cost=_ch("ch08").StepCost(0.01, 1e-3, 1e-7, 1e-7), chunk=64,
                                               plan=_ch("ch08").plan_chunked, layers=2, max_batch=4)),

        # -- kernel
        # the decode kernel's checked entry: float32 caches here, QuantizedKV ones in tests/test_ch08_kernel.py
        "ch08.fused_decode": Valid(lambda: dict(query=_randn(1, 4, 1, 8), key=_randn(1, 2, 5, 8, seed=1),
                                                value=_randn(1, 2, 5, 8, seed=2), chunk=2)),

        # -- paged
        # the layouts' rules, the replay that serves a trace with one, the pool and its paged tensors,
        # the radix cache, the multi-turn trace and the replay of its turns
        "ch08.reserve_longest": Valid(lambda: dict(max_tokens=4_096)),
        "ch08.reserve_pages": Valid(lambda: dict(page_size=16)),
        "ch08.replay_memory": Valid(lambda: dict(trace=_ch("ch08").request_trace(4, seed=0, max_tokens=4_096),
                                               budget=8_192, reserve=_ch("ch08").reserve_pages(16),
                                               step_seconds=0.05)),
        "ch08.PagePool": Valid(lambda: dict(pages=8, page_size=4)),
        "ch08.PagedKVCache": Valid(lambda: dict(pool=_ch("ch08").PagePool(8, 4), kv_heads=2, head_dim=4,
                                                dtype=torch.float32)),
        "ch08.RadixCache": Valid(lambda: dict(pool=_ch("ch08").PagePool(8, 4))),
        "ch08.conversation_trace": Valid(
            lambda: dict(conversations=3, seed=0, rate=1.0, system_tokens=20, turns=2.0, message_median=8,
                         message_sigma=0.5, reply_median=8, reply_sigma=0.5, think_seconds=5.0, vocab=100,
                         max_tokens=200),
            accepts={"seed": {"zero"}, "system_tokens": {"zero"}, "message_sigma": {"zero"},
                     "reply_sigma": {"zero"}}),  # no system prompt; lengths that do not vary
        "ch08.serve_conversations": Valid(
            lambda: dict(turns=_ch("ch08").conversation_trace(3, system_tokens=20, message_median=8,
                                                              reply_median=8, max_tokens=200),
                         pages=64, page_size=4)),

        # -- speculative
        "ch08.truncate_cache": Valid(lambda: dict(cache=_tiny_model().new_cache(), length=0),
                                     accepts={"length": {"zero"}}),  # an empty cache cut to nothing
        "ch08.expected_tokens": Valid(lambda: dict(alpha=0.5, k=3), accepts={"alpha": {"zero"}, "k": {"zero"}}),
        "ch08.expected_speedup": Valid(lambda: dict(alpha=0.5, k=3, cost=0.25),
                                       accepts={"alpha": {"zero"}, "k": {"zero"}, "cost": {"zero"}}),
        "ch08.speculative_generate": Valid(
            lambda: dict(target=_tiny_model(), draft=_tiny_model(), prompt_ids=[1, 2], max_new_tokens=3, k=2,
                         temperature=1.0, seed=0),
            accepts={"temperature": {"zero"}, "seed": {"zero"}},  # greedy; a seed of 0
        ),
    },
    # ---------------------------------------------------------------- ch09: the ranking of served caches, and its reader
    "ch09": {
        "ch09.served_options": Valid(
            lambda: dict(config=_ch("ch03").KVConfig("toy", layers=2, query_heads=4, head_dim=8, bytes_per_scalar=2,
                                                     kv_heads=2),
                         tokens=4_096, memory=2**20, decode=_saved("benchmarks"), forgetting=_saved("forgetting"),
                         batch=1, tolerance=0.05, task="single", menu=_ch("ch09").EVIDENCE),
            accepts={"tolerance": {"zero"}, "memory": {"zero"}}),  # exact ties only; no memory: nothing fits
        "ch09.byte_shares": Valid(lambda: dict(decode=_saved("benchmarks"), bytes_per_scalar=2,
                                               menu=_ch("ch09").EVIDENCE)),
        "ch09.kernel_step_shares": Valid(lambda: dict(serving=_saved("serving"))),
    },
}


def _small_layer():
    """A Llama-style layer small enough to build in a test (Chapter 13's step)."""
    return _ch("ch08").LayerShape(d_model=16, query_heads=4, kv_heads=2, head_dim=4, hidden=24, eps=1e-5)


def _step_points() -> list[dict]:
    """Five measured-looking steps for Chapter 13's cost model: rows, cached tokens, pairs, seconds."""
    return [{"rows": r, "cached": c, "pairs": p, "seconds": 0.01 + 1e-3 * r + 1e-8 * c + 1e-8 * p}
            for r, c, p in ((1, 1024, 0), (64, 65536, 0), (256, 0, 32896), (300, 4096, 10**6), (16, 0, 0))]


def _saved(prefix: str) -> dict:
    """A saved run the chapters read (Chapter 15 reads three of them)."""
    from longctx import support

    return support.load_results(prefix)[0]


# ------------------------------------------------------------------------------------------ silent wrong answers


@dataclass
class Silent:
    """A value that would give a wrong answer without an error, and a call through which it enters.

    ``call`` must raise ``error`` (ValueError, or TypeError for a value of the wrong
    type) whose message matches ``names`` (the argument).
    """

    chapter: str
    what: str
    call: Callable[[], object]
    names: str
    error: type[Exception] = ValueError


def _qkv(tokens: int = 4, width: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _randn(tokens, width), _randn(tokens, width, seed=1), _randn(tokens, width, seed=2)


def _key_batch():
    """Two windows of 24 bytes of filler, one planted record each (Chapter 11's task)."""
    return _ch("ch06").key_batch(_byte_text(), torch.tensor([0.0, 1.0], dtype=torch.float64), 24,
                                 torch.Generator().manual_seed(0))


def _latent_layer():
    torch.manual_seed(0)
    return _ch("ch03").ToyLatentKVAttention(16, 4, latent_rank=6, rope_key_dim=4)


def _seen():
    """What two heads saw of 12 cached entries, with the rows of the 4 newest queries (Chapter 12)."""
    weights = _randn(1, 2, 4, 12).softmax(-1)
    return _ch("ch07").Seen(torch.arange(12).expand(1, 2, 12), weights.sum(-2), weights)


def _decode_step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step: a query (1, 4, 1, 8) against a cache of 2 KV heads by 5 tokens."""
    return _randn(1, 4, 1, 8), _randn(1, 2, 5, 8, seed=1), _randn(1, 2, 5, 8, seed=2)


SILENT: list[Silent] = [
    # Chapter 1: a negative length gives a count that looks plausible (-3 tokens: 3 pairs).
    Silent("ch01", "negative length in the pair count", lambda: _ch("ch01").attention_pairs(-3), "seq_len"),
    Silent("ch01", "negative width in the cache count", lambda: _ch("ch01").kv_cache_scalars(4, -8), "d_model"),
    # Chapter 2
    Silent("ch02", "heads that do not divide the width", lambda: _ch("ch02").GPTConfig(16, d_model=10, heads=3), "heads"),
    Silent("ch02", "negative tokens in the cache's bytes", lambda: _ch("ch02").kv_cache_bytes(_tiny_config(), -1),
           "tokens"),
    Silent("ch02", "1 bit: q_max = 0, every code 0", lambda: _ch("ch02").quantize(_randn(2, 3), 1), "bits"),
    Silent("ch02", "17 bits: codes wrap around in int16", lambda: _ch("ch02").quantize(_randn(2, 3), 17), "bits"),
    Silent("ch02", "an empty text's entropy", lambda: _ch("ch02").unigram_entropy([], 4), "token_ids"),
    Silent("ch02", "positions past the learned table",
           lambda: _tiny_model()(torch.zeros(1, 9, dtype=torch.long)), "position table"),
    Silent("ch02", "sampling without a seed", lambda: _ch("ch02").generate(_tiny_model(), [1], 2, temperature=1.0),
           "seed"),
    # Chapter 3
    Silent("ch03", "a zero window", lambda: _ch("ch03").visibility_mask(6, 0), "window"),
    Silent("ch03", "a zero window in a config",
           lambda: _ch("ch03").KVConfig("t", layers=2, query_heads=4, head_dim=8, bytes_per_scalar=2, kv_heads=2,
                                        window=0, windowed_layers=1), "window"),
    Silent("ch03", "KV heads that do not divide the query heads",
           lambda: _ch("ch03").GroupedQueryAttention(16, 4, 3), "kv_heads"),
    Silent("ch03", "negative sinks", lambda: _ch("ch03").visibility_mask(6, 2, -1), "sinks"),
    # 2.5 tokens: the mask had 3 rows (torch.arange rounds the length up), a mask for no real length
    Silent("ch03", "a fractional length in a mask", lambda: _ch("ch03").visibility_mask(2.5), "seq_len", TypeError),
    Silent("ch03", "negative tokens in the cache's bytes", lambda: _ch("ch03").kv_bytes(_kv_config(), -1), "tokens"),
    # start=-1 turned the rotary keys to positions before the text, with no error
    Silent("ch03", "a negative start for the latent layer's rotary key",
           lambda: _latent_layer()(_randn(1, 2, 16), start=-1), "start"),
    Silent("ch03", "a zero window while decoding", lambda: _ch("ch03").sliding_window_decode(*_qkv(), 0), "window"),
    Silent("ch03", "a zero window in the reach", lambda: _ch("ch03").window_reach(0, 2), "window"),
    Silent("ch03", "a zero-slot ring buffer", lambda: _ch("ch03").rolling_buffer_slots(5, 0), "window"),
    # Chapter 6
    Silent("ch04", "a zero chunk", lambda: _ch("ch04").linear_attention_chunked(*_qkv(), 0), "chunk_size"),
    Silent("ch04", "a zero window in a mask", lambda: _ch("ch04").global_local_mask(6, 0), "window"),
    Silent("ch04", "a zero stride", lambda: _ch("ch04").strided_mask(8, 0), "stride"),
    Silent("ch04", "a zero block", lambda: _ch("ch04").expand_block_mask(torch.ones(2, 2, dtype=torch.bool), 0, 4),
           "block_size"),
    Silent("ch04", "1 bit through quantize_kv", lambda: _ch("ch04").quantize_kv(_randn(3, 8), 1), "bits"),
    Silent("ch04", "17 bits through quantize_kv", lambda: _ch("ch04").quantize_kv(_randn(3, 8), 17), "bits"),
    Silent("ch04", "0 bits in the cache's bytes",
           lambda: _ch("ch04").quantized_kv_bytes_per_token(_kv_config(), 0), "bits"),
    # Chapter 10
    Silent("ch05", "3 bits for the nibble/byte packer", lambda: _ch("ch05").quantize_cache(_randn(1, 2, 5, 4), 3),
           "bits"),
    Silent("ch05", "16 bits for the nibble/byte packer", lambda: _ch("ch05").quantize_cache(_randn(1, 2, 5, 4), 16),
           "bits"),
    Silent("ch05", "a zero tile", lambda: _ch("ch05").tile_ranges([(0, 4)], 0), "tile"),
    Silent("ch05", "a zero window in the visible ranges", lambda: _ch("ch05").visible_ranges(10, 0), "window"),
    Silent("ch05", "a zero window in split-KV decoding",
           lambda: _ch("ch05").split_kv_decode(*_decode_step(), chunk=2, window=0), "window"),
    Silent("ch05", "a zero tile in the tiled walk", lambda: _ch("ch05").tiled_decode(*_decode_step(), tile=0), "tile"),
    Silent("ch05", "a negative tile in the integer route (no tile read: zeros)",
           lambda: _ch("ch05").int8_decode(_decode_step()[0], *(_ch("ch05").quantize_cache(t) for t in
                                                                _decode_step()[1:]), tile=-1), "tile"),
    Silent("ch05", "a zero chunk in split-KV decoding", lambda: _ch("ch05").split_kv_decode(*_decode_step(), chunk=0),
           "chunk"),
    Silent("ch05", "a zero key group in the KIVI cache",
           lambda: _ch("ch05").KiviCache.from_keys_values(_randn(1, 2, 6, 4), _randn(1, 2, 6, 4), group=0), "group"),
    Silent("ch05", "3 bits for the KIVI cache's packer",
           lambda: _ch("ch05").KiviCache.from_keys_values(_randn(1, 2, 6, 4), _randn(1, 2, 6, 4), bits=3), "bits"),
    Silent("ch05", "zero shards", lambda: _ch("ch05").sharded_decode(*_decode_step(), 0), "parts"),
    Silent("ch05", "zero sharded repeats", lambda: _ch("ch05").sharded_decode(*_decode_step(), 2, repeats=0),
           "repeats"),
    Silent("ch05", "zero parts", lambda: _ch("ch05").partition_bounds(8, 0), "parts"),
    Silent("ch05", "more parts than tokens (an empty rank)", lambda: _ch("ch05").partition_bounds(3, 5), "seq_len"),
    Silent("ch05", "zero ring parts", lambda: _ch("ch05").ring_attention(*_qkv(), 0), "parts"),
    # Chapter 11
    Silent("ch06", "zero keys in a batch",
           lambda: _ch("ch06").key_batch(_byte_text(), torch.zeros(1, dtype=torch.float64), 16,
                                         torch.Generator().manual_seed(0), keys=0), "keys"),
    Silent("ch06", "a baseline rule that does not exist",
           lambda: _ch("ch06").baseline(_key_batch(), "first record", torch.Generator()), "rule"),
    Silent("ch06", "a zero extension factor", lambda: _rotary_model().set_rope("pi", 0.0), "factor"),
    Silent("ch06", "a NaN extension factor", lambda: _rotary_model().set_rope("yarn", math.nan), "factor"),
    Silent("ch06", "a zero rotary base", lambda: _ch("ch06").RotaryGPT(_tiny_config(), base=0.0), "base"),
    # Chapter 13
    Silent("ch08", "a trace whose prompts cannot fit the longest context",
           lambda: _ch("ch08").request_trace(4, max_tokens=1), "max_tokens"),
    # -- step
    Silent("ch08", "a zero chunk (no step would read a prompt token: the queue never empties)",
           lambda: _ch("ch08").serve_trace(_ch("ch08").request_trace(2, max_tokens=512),
                                           _ch("ch08").StepCost(0.01, 1e-3, 1e-7, 1e-7), chunk=0), "chunk"),
    Silent("ch08", "a trace out of arrival order (the scheduler would admit requests before they arrive)",
           lambda: _ch("ch08").serve_trace(_ch("ch08").request_trace(3, max_tokens=512)[::-1],
                                           _ch("ch08").StepCost(0.01, 1e-3, 1e-7, 1e-7), chunk=64), "trace"),
    Silent("ch08", "a step timed at zero seconds (the relative fit would divide by it)",
           lambda: _ch("ch08").fit_step_cost([*_step_points()[:4], {"rows": 1, "cached": 0, "pairs": 0,
                                                                       "seconds": 0.0}]), "points"),
    Silent("ch08", "a negative count of cached tokens in a step",
           lambda: _ch("ch08").fit_step_cost([*_step_points()[:4], {"rows": 1, "cached": -5, "pairs": 0,
                                                                       "seconds": 0.1}]), "points"),

    # -- kernel
    Silent("ch08", "a zero chunk for the C++ decode kernel (a division by zero in C++)",
           lambda: _ch("ch08").fused_decode(*_decode_step(), chunk=0), "chunk"),
    Silent("ch08", "int8 keys beside int4 values: the kernel would read one cache's bytes as the other's",
           lambda: _ch("ch08").fused_decode(_decode_step()[0], _ch("ch05").quantize_cache(_decode_step()[1], 8),
                                            _ch("ch05").quantize_cache(_decode_step()[2], 4)), "value"),
    Silent("ch08", "KV heads that do not divide the query heads, which the kernel would read past",
           lambda: _ch("ch08").fused_decode(_randn(1, 4, 1, 8), _randn(1, 3, 5, 8), _randn(1, 3, 5, 8)), "key heads"),

    # -- paged
    Silent("ch08", "pages of no tokens (every sequence would fit in none)",
           lambda: _ch("ch08").PagePool(8, 0), "page_size"),
    Silent("ch08", "a budget that cannot hold a request (the replay would wait for ever)",
           lambda: _ch("ch08").replay_memory(_ch("ch08").request_trace(4, seed=0, max_tokens=4_096), 64,
                                           _ch("ch08").reserve_longest(4_096)), "budget"),
    Silent("ch08", "an empty trace (no memory to count)",
           lambda: _ch("ch08").replay_memory([], 64, _ch("ch08").reserve_exact), "trace"),
    Silent("ch08", "a pool smaller than a turn (it could never be served)",
           lambda: _ch("ch08").serve_conversations(
               _ch("ch08").conversation_trace(3, system_tokens=20, message_median=8, reply_median=8,
                                              max_tokens=200), 2, 4), "pages"),
    Silent("ch08", "a history cap below the system prompt (every chat would end before it began)",
           lambda: _ch("ch08").conversation_trace(3, system_tokens=300, max_tokens=200), "max_tokens"),

    # -- speculative
    Silent("ch08", "a negative temperature (the softmax of the negated logits)",
           lambda: _ch("ch08").token_probabilities(torch.zeros(4), -1.0), "temperature"),
    Silent("ch08", "a cache cut to more tokens than it holds (a silent no-op)",
           lambda: _ch("ch08").truncate_cache(_tiny_model().new_cache(), 1), "length"),
    Silent("ch08", "an acceptance rate above 1", lambda: _ch("ch08").expected_tokens(1.5, 3), "alpha"),
    Silent("ch08", "a draft of another vocabulary (its ids mean other tokens)",
           lambda: _ch("ch08").speculative_generate(
               _tiny_model(), _ch("ch02").TinyGPT(_ch("ch02").GPTConfig(vocab_size=8, context_length=8, d_model=8,
                                                                         layers=1, heads=2)),
               [1], 2, k=1, temperature=0), "draft"),
    # Chapter 15
    Silent("ch09", "a negative memory (nothing would fit, without a word)",
           lambda: _ch("ch09").served_options(_ch("ch03").KVConfig("toy", layers=2, query_heads=4, head_dim=8,
                                                                    bytes_per_scalar=2, kv_heads=2),
                                              1_024, -1, decode=_saved("benchmarks"),
                                              forgetting=_saved("forgetting")), "memory"),
    # Chapter 12
    Silent("ch07", "a budget that keeps only the sinks",
           lambda: _ch("ch07").make_cache(_rotary_model(), "sinks", 0.1, prompt_tokens=40), "budget"),
    Silent("ch07", "a budget for a cache its bits size",
           lambda: _ch("ch07").make_cache(_rotary_model(), "int4", 0.5, prompt_tokens=40), "budget"),
    Silent("ch07", "a full cache below 100 %",
           lambda: _ch("ch07").make_cache(_rotary_model(), "full", 0.5, prompt_tokens=40), "budget"),
    Silent("ch07", "a prompt that leaves nothing to decode",
           lambda: _ch("ch07").compressed_losses(_rotary_model(), _byte_text(40).view(2, 20),
                                                 _byte_text(40).view(2, 20), "window", 0.5, prompt=20),
           "prompt"),
    # keep below the window: the top-k cut the window it promises to keep, with no error
    Silent("ch07", "a SnapKV budget below its observation window", lambda: _ch("ch07").keep_snap(_seen(), 3, 4), "keep"),
]


class Misleading(Silent):
    """A value that failed deep inside with an error naming something else, refused by name where it enters.

    Not silent: these raised before, but with PyTorch's words (a shape that is invalid, an index
    out of range, values to unpack), which send a student to the wrong line.
    """


MISLEADING: list[Misleading] = [
    # "not enough values to unpack"
    Misleading("ch03", "a tensor as the grouped layer's cache",
               lambda: _ch("ch03").GroupedQueryAttention(16, 4, 2)(_randn(1, 2, 16), _randn(1, 2, 3, 4)), "cache",
               TypeError),
    # "'tuple' object has no attribute 'size'"
    Misleading("ch03", "a grouped layer's (keys, values) cache given to the latent layer",
               lambda: _latent_layer()(_randn(1, 2, 16), (_randn(1, 2, 3, 4), _randn(1, 2, 3, 4))), "cache",
               TypeError),
    # "shape '[1, 1, 12]' is invalid for input of size 13"
    Misleading("ch07", "an even pool for SnapKV's votes", lambda: _ch("ch07").snap_votes(_seen(), 4, 4), "pool"),
    # "selected index k out of range"
    Misleading("ch07", "keep above the cached entries", lambda: _ch("ch07").keep_snap(_seen(), 13, 4), "keep"),
    Misleading("ch07", "keep above the cached entries of a window", lambda: _ch("ch07").keep_recent(_seen(), 13),
               "keep"),
]


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


def _entries() -> dict[str, Valid]:
    return {key: valid for table in BOUNDARIES.values() for key, valid in table.items()}


def _resolve(key: str) -> Callable:
    """The callable an entry names; a stale entry fails here with a message that says what to update."""
    module_name, *path = key.split(".")
    obj = _ch(module_name)
    for depth, part in enumerate(path):
        if not hasattr(obj, part):
            owner = ".".join([module_name, *path[:depth]])
            pytest.fail(f"BOUNDARIES[{module_name!r}] names {key}, but {owner} has no {part!r} any more: "
                        "update or remove the entry")
        obj = getattr(obj, part)
    return obj


def _parameters(target: Callable) -> list[inspect.Parameter]:
    """The parameters a caller supplies (not ``self``, not ``**kwargs``)."""
    names = list(inspect.signature(target).parameters.values())
    if names and names[0].name == "self":
        names = names[1:]
    return [p for p in names if p.kind is not inspect.Parameter.VAR_KEYWORD]


def _target(key: str, valid: Valid) -> tuple[Callable, dict, list[inspect.Parameter]]:
    """Return the function to call (a bound method for a method), fresh valid arguments, and its parameters."""
    obj = _resolve(key)
    parameters = _parameters(obj)
    if valid.instance is not None:
        instance = valid.instance()
        return getattr(instance, key.split(".")[-1]), valid.arguments(instance), parameters
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
    """Every (boundary, argument, probe) to try. A stale entry gives no cases here rather than
    breaking collection: test_each_boundary_entry_is_current reports it."""
    cases = []
    for key, valid in sorted(_entries().items()):
        try:
            _, arguments, parameters = _target(key, valid)
        except BaseException:  # noqa: BLE001 - pytest.fail included; reported by the entry test
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


# Names that mark a callable as a boundary by the book's own list: drivers, readers, configs.
_DRIVER = re.compile(r"^(train|generate|evaluate|run|load|read|measure|benchmark)(_|$)|_from_config$")
# Named like a driver or a reader, yet a kernel by the rule, so not on the boundary list.
NOT_BOUNDARIES = {
    "ch02.Block": "one of TinyGPT's blocks: TinyGPT builds it from its config, checked there",
    "ch05.read_tile": "a tile reader: its caller has checked the cache, and it reads one slice of it",
}


def _should_be_boundaries(module_name: str) -> list[str]:
    """Public callables of a chapter that the rule makes boundaries: every nn.Module and config
    class (its constructor), and every function or method named like a driver or a reader."""
    import dataclasses

    module = _ch(module_name)
    found = []
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if not getattr(obj, "__module__", "").startswith("longctx"):
            continue
        if inspect.isclass(obj):
            configured = dataclasses.is_dataclass(obj) and name.endswith(("Config", "Settings"))
            if (issubclass(obj, torch.nn.Module) or configured) and _parameters(obj):
                found.append(f"{module_name}.{name}")
            for attribute, member in vars(obj).items():
                if isinstance(member, classmethod | staticmethod) or inspect.isfunction(member):
                    if _DRIVER.search(attribute):
                        found.append(f"{module_name}.{name}.{attribute}")
        elif inspect.isfunction(obj) and _DRIVER.search(name) and _parameters(obj):
            found.append(f"{module_name}.{name}")
    return found


# ------------------------------------------------------------------------------------------ tests


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """A ring rank sets torch's thread count for its process: give the test process its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("chapter", sorted(BOUNDARIES))
def test_constructors_configs_readers_and_drivers_are_all_on_the_boundary_list(chapter):
    """A new model class, config, reader or driver fails here until its chapter's table holds it."""
    missing = [key for key in _should_be_boundaries(chapter)
               if key not in BOUNDARIES[chapter] and key not in NOT_BOUNDARIES]
    assert not missing, f"add a valid call to BOUNDARIES[{chapter!r}] for: {missing}"
    strays = [key for key in BOUNDARIES[chapter] if key.split(".")[0] != chapter]
    assert not strays, f"BOUNDARIES[{chapter!r}] holds entries of other chapters: {strays}"


# Their valid calls start gloo processes (seconds each): make test runs them, make test-fast does not.
LAUNCHERS = {"ch05.ring_attention", "ch05.sharded_decode"}
BUILDERS = {"ch08.fused_decode"}  # its valid call builds the C++ kernel: a compiler's processes


@pytest.mark.parametrize("key", [pytest.param(key, marks=pytest.mark.slow) if key in LAUNCHERS | BUILDERS else key
                                 for key in sorted(_entries())])
def test_each_boundary_entry_is_current(key):
    """The entry names a callable the chapter has, and its valid call names every parameter and works,
    so each bad call differs from a call that works in exactly one argument."""
    valid = _entries()[key]
    function, arguments, parameters = _target(key, valid)
    expected = sorted(p.name for p in parameters)
    assert sorted(arguments) == expected, (
        f"BOUNDARIES entry {key} gives {sorted(arguments)}, but the signature is {expected}: update the entry")
    try:
        _call(function, arguments, parameters)
    except Exception as error:  # noqa: BLE001 - reported as a stale entry
        pytest.fail(f"BOUNDARIES entry {key}: the valid call now raises {type(error).__name__}: {error}; "
                    "update the entry")


@pytest.mark.parametrize(("key", "parameter", "probe"), _cases())
def test_a_bad_argument_at_the_boundary_raises_type_or_value_error_naming_it(key, parameter, probe):
    valid = _entries()[key]
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
        assert re.search(rf"\b{re.escape(parameter)}\b", str(error)), (
            f"{key}({parameter}=<{probe}>) raised {type(error).__name__} without naming {parameter!r}: {error}"
        )
        return
    except Exception as error:  # noqa: BLE001 - the point is to report any other kind
        pytest.fail(f"{key}({parameter}=<{probe}>) raised {type(error).__name__}, not TypeError or ValueError: {error}")
    pytest.fail(f"{key}({parameter}=<{probe}>) was accepted silently and returned {type(result).__name__}")


def _silent_cases() -> list:
    return [pytest.param(case, id=f"{case.chapter}: {case.what}") for case in SILENT]


@pytest.mark.parametrize("case", _silent_cases())
def test_a_value_that_would_give_a_silent_wrong_answer_is_refused(case):
    with pytest.raises(case.error, match=case.names):
        case.call()


@pytest.mark.parametrize("case", [pytest.param(case, id=f"{case.chapter}: {case.what}") for case in MISLEADING])
def test_a_value_that_failed_with_a_misleading_error_is_refused_by_name(case):
    with pytest.raises(case.error, match=rf"\b{case.names}\b"):
        case.call()


def test_every_probe_is_either_a_wrong_type_or_a_wrong_value():
    samples = [True, 3, 0.5, "name", torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), [1, 2], ("a", "b"), object()]
    labels = {label for sample in samples for label in _probes(sample)}
    assert labels <= WRONG_TYPE | WRONG_VALUE and not WRONG_TYPE & WRONG_VALUE, labels - WRONG_TYPE - WRONG_VALUE


def test_the_silent_list_covers_every_chapter_and_every_kind_the_rule_names():
    chapters = {case.chapter for case in SILENT}
    code = pathlib.Path(__file__).resolve().parents[1] / "code"
    assert chapters == {path.parent.name for path in code.glob("ch*/_generated.py")}
    kinds = " ".join(case.what for case in SILENT)
    for kind in ("zero window", "zero chunk", "bits", "negative sinks", "negative", "fractional length"):
        assert kind in kinds, f"the silent list names no case of {kind!r}"
