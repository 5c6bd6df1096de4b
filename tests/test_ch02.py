"""Tests for Chapter 2 (chapters/ch02-tinygpt.qmd): TinyGPT, its KV cache, training, generation, quantization."""

import math
import re
from pathlib import Path

import pytest
import torch
from longctx import ch01, ch02, support

ROOT = Path(__file__).resolve().parent.parent
TINY = ch02.GPTConfig(vocab_size=256, context_length=32, d_model=16, layers=2, heads=2)


def make_model(config: ch02.GPTConfig = TINY, seed: int = 0) -> ch02.TinyGPT:
    torch.manual_seed(seed)
    return ch02.TinyGPT(config).eval()


def random_tokens(batch: int, length: int, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- tokens -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", ["", "It is a truth universally acknowledged.", "café naïve — 東京 🙂", "line\nbreak\ttab\x00nul"]
)
def test_byte_tokenizer_round_trips_any_text(text):
    tokenizer = ch02.ByteTokenizer()
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_byte_tokenizer_non_ascii_costs_several_tokens_and_broken_bytes_become_replacement():
    tokenizer = ch02.ByteTokenizer()
    assert tokenizer.vocab_size == 256
    assert len(tokenizer.encode("é")) == 2 and len(tokenizer.encode("東")) == 3
    assert tokenizer.decode(tokenizer.encode("東")[:2]) == "\ufffd"


def test_byte_tokenizer_rejects_bad_input():
    tokenizer = ch02.ByteTokenizer()
    with pytest.raises(TypeError, match=r"^text must be a str \(got bytes\)$"):
        tokenizer.encode(b"bytes")
    with pytest.raises(ValueError, match=r"^ids must hold integers <= 255 \(got 256\)$"):
        tokenizer.decode([65, 256])
    with pytest.raises(ValueError, match=r"^ids must hold integers >= 0 \(got -1\)$"):
        tokenizer.decode([-1])
    with pytest.raises(TypeError, match="ids must be a sequence of integers"):
        tokenizer.decode([65.7])  # refused, not truncated to 65
    with pytest.raises(TypeError, match="ids must be a sequence of integers"):
        tokenizer.decode(65)
    assert tokenizer.decode(torch.tensor([72, 105])) == "Hi"
    assert tokenizer.decode(range(72, 74)) == "HI"
    assert tokenizer.decode([]) == ""


def test_load_corpus_is_the_shipped_public_domain_text():
    corpus = ch02.load_corpus()
    assert corpus.startswith("PRIDE AND PREJUDICE")
    assert 250_000 < len(corpus.encode("utf-8")) <= 300_000
    assert support.data_path(ch02.CORPUS_FILE).stat().st_size <= 300 * 1024


# --- config and model shapes --------------------------------------------------------------------------------


def test_chapter3_call_gives_a_128_by_64_position_table():
    table = ch02.TinyGPT(ch02.GPTConfig(vocab_size=512)).position_embedding
    assert isinstance(table, torch.nn.Embedding)
    assert tuple(table.weight.shape) == (128, 64)
    assert table.num_embeddings == 128


def test_config_defaults_and_head_dim():
    config = ch02.GPTConfig(vocab_size=100)
    assert (config.context_length, config.d_model, config.layers, config.heads, config.dropout) == (128, 64, 2, 4, 0.0)
    assert config.head_dim == 16
    with pytest.raises(AttributeError):
        config.d_model = 32  # frozen


@pytest.mark.parametrize("vocab_size", [0, -3])
def test_config_rejects_non_positive_vocab_size(vocab_size):
    with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
        ch02.GPTConfig(vocab_size=vocab_size)


def test_config_rejects_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"^heads must divide d_model \(got heads=5 and d_model=64\)$"):
        ch02.GPTConfig(vocab_size=10, heads=5)


@pytest.mark.parametrize("field, value", [("context_length", 0), ("d_model", -1), ("layers", 0), ("heads", 0)])
def test_config_rejects_other_bad_sizes(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be a positive integer"):
        ch02.GPTConfig(vocab_size=10, **{field: value})


@pytest.mark.parametrize("field, value", [("layers", 1.5), ("heads", True), ("vocab_size", "10")])
def test_config_rejects_sizes_that_are_not_ints(field, value):
    sizes = {"vocab_size": 10} | {field: value}
    with pytest.raises(TypeError, match=f"^{field} must be an int"):
        ch02.GPTConfig(**sizes)


@pytest.mark.parametrize("dropout", [1.0, -0.1, float("nan")])
def test_config_rejects_bad_dropout(dropout):
    with pytest.raises(ValueError, match="^dropout must be"):
        ch02.GPTConfig(vocab_size=10, dropout=dropout)
    with pytest.raises(TypeError, match="^dropout must be a real number"):
        ch02.GPTConfig(vocab_size=10, dropout="0.1")


def test_tinygpt_rejects_a_non_config():
    with pytest.raises(TypeError, match="GPTConfig"):
        ch02.TinyGPT({"vocab_size": 10})


@pytest.mark.parametrize("batch, length", [(1, 1), (3, 7), (2, 32)])
def test_forward_shapes(batch, length):
    model = make_model()
    logits = model(random_tokens(batch, length))
    assert logits.shape == (batch, length, TINY.vocab_size)
    assert logits.dtype == torch.float32


def test_model_parts_and_attention_reuse_chapter_1():
    model = make_model()
    assert len(model.blocks) == TINY.layers
    attention = model.blocks[0].attention
    assert isinstance(attention, ch01.MultiHeadAttention)
    assert model.lm_head.out_features == TINY.vocab_size
    assert model.final_norm.normalized_shape == (TINY.d_model,)


def test_uncached_attention_is_chapter_1_forward():
    model = make_model()
    attention = model.blocks[0].attention
    x = torch.randn(2, 5, TINY.d_model, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = attention(x)
        chapter1 = ch01.MultiHeadAttention.forward(attention, x)
    assert torch.equal(ours, chapter1)


def test_model_is_causal():
    model = make_model()
    tokens = random_tokens(1, 10)
    changed = tokens.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(tokens)[:, :6], model(changed)[:, :6], atol=1e-6)


def test_untrained_loss_is_near_log_vocab():
    model = make_model(ch02.GPTConfig(vocab_size=256))
    tokens = random_tokens(2, 64)
    with torch.no_grad():
        logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).item()
    assert abs(loss - math.log(256)) < 0.1


# --- positions and bad model input --------------------------------------------------------------------------


def test_sequence_longer_than_position_table_raises_clear_value_error():
    model = make_model()
    with pytest.raises(ValueError, match=r"run past the learned position table.*0\.\.31"):
        model(random_tokens(1, TINY.context_length + 1))
    model(random_tokens(1, TINY.context_length))  # exactly full is fine


def test_cache_plus_new_tokens_past_the_table_raises_and_leaves_the_cache_alone():
    model = make_model()
    cache = model.new_cache()
    with torch.no_grad():
        model(random_tokens(1, 30), cache)
        with pytest.raises(ValueError, match=r"positions 30\.\.32 run past the learned position table"):
            model(random_tokens(1, 3), cache)
    assert cache.length == 30
    model(random_tokens(1, 2), cache)
    assert cache.length == 32


def test_cache_from_a_different_batch_size_fails_loudly():
    model = make_model()
    cache = model.new_cache(batch=2)
    with pytest.raises(RuntimeError):  # torch.cat of a batch of 3 onto a cache of 2: PyTorch says so
        model(random_tokens(3, 4), cache)


def test_out_of_vocabulary_tokens_fail_loudly_in_the_embedding():
    with pytest.raises(IndexError):
        make_model()(torch.full((1, 3), 256))


# --- the KV cache: equality with the full pass ---------------------------------------------------------------


@pytest.mark.parametrize("prompt_length", [1, 5, 16, 31])
@pytest.mark.parametrize("batch", [1, 3])
def test_cached_logits_equal_uncached_at_every_step(prompt_length, batch):
    model = make_model(seed=prompt_length)
    tokens = random_tokens(batch, TINY.context_length, seed=prompt_length)
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(batch=batch)
        step_logits = model(tokens[:, :prompt_length], cache)
        assert torch.allclose(step_logits, full[:, :prompt_length], atol=1e-5, rtol=0)
        for position in range(prompt_length, TINY.context_length):
            step_logits = model(tokens[:, position : position + 1], cache)
            assert cache.length == position + 1
            assert (step_logits[:, 0] - full[:, position]).abs().max().item() <= 1e-5
    assert cache.length == TINY.context_length


def test_cached_chunks_of_several_tokens_equal_full_pass():
    model = make_model(seed=3)
    tokens = random_tokens(2, 30, seed=3)
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(batch=2)
        pieces = [model(tokens[:, a:b], cache) for a, b in ((0, 4), (4, 11), (11, 12), (12, 30))]
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


def test_cache_tensors_have_documented_shapes():
    model = make_model()
    cache = model.new_cache(batch=2)
    assert cache.length == 0 and cache.batch == 2 and cache.layers == TINY.layers and cache.nbytes() == 0
    with torch.no_grad():
        model(random_tokens(2, 9), cache)
    for layer in range(TINY.layers):
        assert cache.keys[layer].shape == (2, TINY.heads, 9, TINY.head_dim)
        assert cache.values[layer].shape == (2, TINY.heads, 9, TINY.head_dim)


def test_the_layer_without_a_cache_is_chapter_1s_attention_bit_for_bit():
    torch.manual_seed(5)
    layer = ch02.CausalSelfAttention(16, 4)
    chapter_1 = ch01.MultiHeadAttention(16, 4)
    chapter_1.load_state_dict(layer.state_dict())
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(layer(x), chapter_1(x))  # its causal mask by default


def test_attend_with_cache_on_nothing_cached_is_chapter_1s_causal_attention():
    q, k, v = (torch.randn(2, 3, 7, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    output, weights = ch02.attend_with_cache(q, k, v)
    expected, expected_weights = ch01.scaled_dot_product_attention(q, k, v, ch01.causal_mask(7))
    assert torch.equal(output, expected) and torch.equal(weights, expected_weights)


@pytest.mark.parametrize("past", [1, 5, 9])
def test_kv_cache_attend_caches_then_attends_with_the_shifted_mask(past):
    """New queries after ``past`` cached tokens get the rows of the full causal attention."""
    q, k, v = (torch.randn(2, 3, 10, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    cache = ch02.KVCache(layers=2, batch=2, heads=3, head_dim=4)
    first = cache.attend(1, q[:, :, :past], k[:, :, :past], v[:, :, :past])
    assert cache.position(1) == past and cache.position(0) == 0  # only layer 1 has read
    rest = cache.attend(1, q[:, :, past:], k[:, :, past:], v[:, :, past:])
    assert cache.position(1) == 10 and torch.equal(cache.keys[1], k) and torch.equal(cache.values[1], v)
    full, _ = ch01.scaled_dot_product_attention(q, k, v, ch01.causal_mask(10))
    torch.testing.assert_close(torch.cat([first, rest], dim=2), full, atol=1e-6, rtol=0)


def test_any_object_with_position_and_attend_is_a_cache_to_the_model():
    """The model talks to a cache through two methods only: a stand-in that records them works."""

    class Recording:
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        @property
        def length(self):
            return self.inner.length

        def position(self, layer):
            return self.inner.position(layer)

        def attend(self, layer, query, key, value):
            self.calls.append((layer, query.shape[2], self.position(layer)))
            return self.inner.attend(layer, query, key, value)

    model = make_model(seed=4)
    tokens = random_tokens(2, 12, seed=4)
    with torch.no_grad():
        plain, recording = model.new_cache(batch=2), Recording(model.new_cache(batch=2))
        expected = torch.cat([model(tokens[:, :9], plain), model(tokens[:, 9:], plain)], dim=1)
        got = torch.cat([model(tokens[:, :9], recording), model(tokens[:, 9:], recording)], dim=1)
    assert torch.equal(got, expected)
    assert recording.calls == [(0, 9, 0), (1, 9, 0), (0, 3, 9), (1, 3, 9)]


# --- cache bytes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        TINY,
        ch02.GPTConfig(vocab_size=50, context_length=16, d_model=24, layers=3, heads=3),
        ch02.GPTConfig(vocab_size=50, context_length=16, d_model=8, layers=1, heads=8),
    ],
)
@pytest.mark.parametrize("batch", [1, 2, 5])
@pytest.mark.parametrize("tokens", [1, 7, 16])
def test_measured_cache_bytes_equal_formula(config, batch, tokens):
    model = make_model(config)
    cache = model.new_cache(batch=batch)
    with torch.no_grad():
        model(random_tokens(batch, tokens, vocab=config.vocab_size), cache)
    measured = cache.nbytes()
    assert measured == sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    assert measured == ch02.kv_cache_bytes(config, tokens, batch=batch)
    assert measured == 2 * batch * config.layers * config.d_model * 4 * tokens


def test_cache_bytes_grow_by_2blds_per_token_and_follow_dtype():
    model = make_model().to(torch.float64)
    cache = model.new_cache(batch=2)
    sizes = []
    with torch.no_grad():
        for _ in range(4):
            model(random_tokens(2, 1), cache)
            sizes.append(cache.nbytes())
    per_token = 2 * 2 * TINY.layers * TINY.d_model * 8
    assert [b - a for a, b in zip(sizes, sizes[1:], strict=False)] == [per_token] * 3
    assert sizes[-1] == ch02.kv_cache_bytes(TINY, 4, batch=2, bytes_per_scalar=8)


def test_kv_cache_bytes_golden_values_and_bad_input():
    config = ch02.GPTConfig(vocab_size=256)
    assert ch02.kv_cache_bytes(config, 1) == 1024
    assert ch02.kv_cache_bytes(config, 128) == 131_072
    assert ch02.kv_cache_bytes(config, 0) == 0
    large = ch02.GPTConfig(vocab_size=32_000, d_model=4096, layers=32, heads=32)
    assert ch02.kv_cache_bytes(large, 131_072, bytes_per_scalar=2) == 64 * 2**30
    with pytest.raises(ValueError, match=r"^tokens must be an integer >= 0 \(got -1\)$"):
        ch02.kv_cache_bytes(config, -1)
    with pytest.raises(ValueError, match=r"^batch must be an integer >= 0 \(got -2\)$"):
        ch02.kv_cache_bytes(config, 1, batch=-2)
    with pytest.raises(ValueError, match=r"^bytes_per_scalar must be an integer >= 0 \(got -2\)$"):
        ch02.kv_cache_bytes(config, 1, bytes_per_scalar=-2)
    # The example: a fractional token count names `tokens`, this function's own parameter.
    with pytest.raises(TypeError, match=r"^tokens must be an int \(got float 2.5\)$"):
        ch02.kv_cache_bytes(config, 2.5)


# --- training -------------------------------------------------------------------------------------------------


def _one_weight_problem(start: float):
    """A single weight w and the loss (w - 3)^2, whose gradient at w is 2 (w - 3)."""
    weight = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        weight.weight.fill_(start)
    loss = (weight.weight.squeeze() - 3.0) ** 2
    return weight, loss


def test_training_step_clips_the_gradient_then_steps_the_optimiser_and_the_schedule():
    # at w = 0 the loss is 9 and the gradient -6; clipped to norm 1 it is -1, so SGD at lr 0.5 moves w to 0.5
    model, loss = _one_weight_problem(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    assert ch02.training_step(model, optimizer, loss, schedule=schedule) == 9.0
    assert model.weight.item() == pytest.approx(0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    # without clipping the whole gradient -6 is taken: w = 0 - 0.5 * -6 = 3, and no schedule leaves lr alone
    model, loss = _one_weight_problem(0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    assert ch02.training_step(model, optimizer, loss, clip_norm=None) == 9.0
    assert model.weight.item() == pytest.approx(3.0)
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_training_step_starts_from_zero_gradients():
    model, loss = _one_weight_problem(0.0)
    model.weight.grad = torch.full_like(model.weight, 100.0)  # left over from an earlier step
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ch02.training_step(model, optimizer, loss, clip_norm=None)
    assert model.weight.item() == pytest.approx(0.6)  # 0 - 0.1 * -6, the stale 100 forgotten


@pytest.mark.slow  # trains a model
def test_training_on_a_small_slice_reduces_the_loss():
    ids = ch02.ByteTokenizer().encode(ch02.load_corpus()[:20_000])
    model = make_model(ch02.GPTConfig(vocab_size=256, context_length=16, d_model=16, layers=1, heads=2))
    before = ch02.evaluate_loss(model, ids, batches=2, batch_size=8)
    losses = ch02.train(model, ids, steps=30, batch_size=8, learning_rate=1e-2, seed=0, progress=False)
    after = ch02.evaluate_loss(model, ids, batches=2, batch_size=8)
    assert len(losses) == 30 and all(math.isfinite(v) for v in losses)
    assert after < before - 1.0
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0
    assert not model.training


def test_training_is_reproducible_with_a_seed():
    ids = list(range(200)) * 3

    def run(seed):
        model = make_model(ch02.GPTConfig(vocab_size=256, context_length=8, d_model=8, layers=1, heads=2, dropout=0.1))
        return ch02.train(model, ids, steps=3, batch_size=2, learning_rate=1e-3, seed=seed, progress=False)

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, r"^steps must be a positive integer \(got 0\)$"),
        ({"batch_size": 0}, r"^batch_size must be a positive integer \(got 0\)$"),
        ({"learning_rate": 0.0}, r"^learning_rate must be > 0 \(got 0.0\)$"),
        ({"sequence_length": 33}, r"^sequence_length must be an integer <= 32 \(got 33\)$"),
        ({"seed": -1}, r"^seed must be an integer >= 0 \(got -1\)$"),
    ],
)
def test_train_rejects_bad_arguments(kwargs, message):
    settings = {"steps": 1, "batch_size": 1, "learning_rate": 1e-3, "seed": 0, "progress": False} | kwargs
    with pytest.raises(ValueError, match=message):
        ch02.train(make_model(), list(range(100)), **settings)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"steps": 2.0}, "^steps must be an int"), ({"progress": 1}, "^progress must be True or False"),
     ({"learning_rate": "1e-3"}, "^learning_rate must be a real number")],
)
def test_train_rejects_arguments_of_the_wrong_type(kwargs, message):
    settings = {"steps": 1, "batch_size": 1, "learning_rate": 1e-3, "seed": 0, "progress": False} | kwargs
    with pytest.raises(TypeError, match=message):
        ch02.train(make_model(), list(range(100)), **settings)
    with pytest.raises(TypeError, match="^model must be a TinyGPT"):
        ch02.train(ch01.MultiHeadAttention(8, 2), list(range(100)), steps=1, batch_size=1, learning_rate=1e-3, seed=0)


def test_train_rejects_too_little_data():
    with pytest.raises(ValueError, match=r"^token_ids must hold at least 33 entries \(got 32\)$"):
        ch02.train(make_model(), list(range(32)), steps=1, batch_size=1, learning_rate=1e-3, seed=0, progress=False)


def test_unigram_entropy():
    assert ch02.unigram_entropy([3, 3, 3], 10) == 0.0
    assert math.isclose(ch02.unigram_entropy([0, 1, 2, 3], 4), math.log(4))
    assert math.isclose(ch02.unigram_entropy([0, 0, 1, 1], 256), math.log(2))
    assert math.isclose(ch02.unigram_entropy(torch.tensor([0, 1]), 2), math.log(2))
    with pytest.raises(ValueError, match="^token_ids must not be empty"):
        ch02.unigram_entropy([], 4)  # an empty text would otherwise get entropy 0
    with pytest.raises(TypeError, match="^token_ids must be a sequence of integers"):
        ch02.unigram_entropy([0.5, 1.5], 4)  # refused, not truncated


# --- generation -----------------------------------------------------------------------------------------------


def test_generation_is_reproducible_with_a_seed():
    model = make_model()
    prompt = [72, 105]
    first = ch02.generate(model, prompt, 20, temperature=1.0, top_k=50, seed=4)
    again = ch02.generate(model, prompt, 20, temperature=1.0, top_k=50, seed=4)
    other = ch02.generate(model, prompt, 20, temperature=1.0, top_k=50, seed=5)
    assert first == again
    assert first != other
    assert len(first) == 20 and all(0 <= t < 256 for t in first)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "top_k": 10, "seed": 1}, {"temperature": 2.0, "seed": 2}])
def test_generation_with_and_without_cache_gives_the_same_tokens(sampling):
    model = make_model(seed=9)
    prompt = [1, 2, 3, 4]
    assert ch02.generate(model, prompt, 25, **sampling) == ch02.generate(model, prompt, 25, use_cache=False, **sampling)


def test_greedy_equals_argmax_of_full_pass_and_top_k_one():
    model = make_model(seed=2)
    prompt = [10, 20, 30]
    tokens = ch02.generate(model, prompt, 6)
    sequence = prompt + tokens
    with torch.no_grad():
        logits = model(torch.tensor([sequence[:-1]]))
    assert logits[0, len(prompt) - 1 :].argmax(-1).tolist() == tokens
    assert ch02.generate(model, prompt, 6, temperature=1.5, top_k=1, seed=0) == tokens


def test_generate_restores_training_mode():
    model = make_model()
    model.train()
    ch02.generate(model, [1], 2)
    assert model.training


def test_generate_can_fill_the_table_exactly():
    model = make_model()
    assert len(ch02.generate(model, [1, 2], TINY.context_length - 2)) == TINY.context_length - 2
    assert ch02.generate(model, [1], 0) == []


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (([], 3), {}, "^prompt_ids must not be empty"),
        (([300], 3), {}, r"^prompt_ids must hold integers <= 255 \(got 300\)"),
        (([1], -1), {}, r"^max_new_tokens must be an integer >= 0 \(got -1\)"),
        (([1], 3), {"temperature": -0.5}, "temperature must be >= 0"),
        (([1], 3), {"temperature": 1.0, "top_k": 0, "seed": 0}, "top_k"),
        (([1], 3), {"temperature": 1.0, "top_k": 257, "seed": 0}, "top_k"),
        (([1], 3), {"temperature": 1.0}, "needs a seed"),
        (([1] * 30, 3), {}, r"^max_new_tokens must be an integer <= 2 \(got 3\)"),  # 30 + 3 > 32 positions
        (([1] * 35, 0), {}, r"^prompt_ids must hold at most 32 entries \(got 35\)"),  # longer than the table
    ],
)
def test_generate_rejects_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ch02.generate(make_model(), *args, **kwargs)


# --- quantization ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [2, 3, 4, 8, 9, 16])
@pytest.mark.parametrize("dim", [-1, 0, -2])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_error_is_at_most_half_a_step(bits, dim, seed):
    x = torch.randn(17, 23, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scale = ch02.quantize(x, bits, dim=dim)
    q_max = 2 ** (bits - 1) - 1
    assert codes.dtype == (torch.int8 if bits <= 8 else torch.int16)
    assert scale.dtype == torch.float32
    assert codes.shape == x.shape
    expected_scale_shape = (17, 1) if dim == -1 else (1, 23)
    assert scale.shape == expected_scale_shape
    assert codes.abs().max().item() == q_max  # the absmax of each group lands on the top code
    error = (ch02.dequantize(codes, scale) - x).abs()
    assert (error <= scale / 2 * (1 + 1e-5)).all()
    assert torch.allclose(scale.squeeze(), x.abs().amax(dim=dim) / q_max)


@pytest.mark.parametrize("bits", [2, 4, 8, 12, 16])
@pytest.mark.parametrize("dim", [-1, 0])
def test_representable_values_round_trip_exactly(bits, dim):
    q_max = 2 ** (bits - 1) - 1
    generator = torch.Generator().manual_seed(bits)
    codes = torch.randint(-q_max, q_max + 1, (6, 5), generator=generator)
    if dim == -1:
        codes[:, 0] = q_max  # every row reaches the top code, so its scale is exactly recovered
        step = 2.0 ** torch.arange(-3, 3).float()[:, None]  # (6, 1) power-of-two steps: exact in float32
    else:
        codes[0, :] = -q_max
        step = 2.0 ** torch.arange(-2, 3).float()[None, :]  # (1, 5)
    x = codes.float() * step
    got_codes, got_scale = ch02.quantize(x, bits, dim=dim)
    assert torch.equal(got_codes.long(), codes)
    assert torch.equal(got_scale, step)
    assert torch.equal(ch02.dequantize(got_codes, got_scale), x)


def test_quantize_zero_rows_and_3d_tensors():
    x = torch.zeros(3, 4)
    x[1] = torch.tensor([1.0, -2.0, 0.5, 0.0])
    codes, scale = ch02.quantize(x, 8)
    assert torch.equal(codes[0], torch.zeros(4, dtype=torch.int8))
    assert scale[0].item() == 1.0
    assert torch.equal(ch02.dequantize(codes, scale)[0], torch.zeros(4))
    cube = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    codes, scale = ch02.quantize(cube, 6, dim=1)
    assert scale.shape == (2, 1, 8)
    assert ((ch02.dequantize(codes, scale) - cube).abs() <= scale / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("bits", [1, 0, 17, -4])
def test_quantize_refuses_bits_its_codes_cannot_hold(bits):
    """One bit leaves q_max = 0 and 17 wraps around in int16: both would give wrong codes silently."""
    with pytest.raises(ValueError, match=rf"^bits must be an integer from 2 to 16, a width the packer can hold \(got {bits}\)$"):
        ch02.quantize(torch.ones(2, 2), bits)
    assert ch02.QUANTIZE_BITS == range(2, 17)


@pytest.mark.parametrize("bits", [8.0, True, "8"])
def test_quantize_rejects_bits_that_are_not_ints(bits):
    with pytest.raises(TypeError, match="^bits must be an int"):
        ch02.quantize(torch.ones(2, 2), bits)


def test_config_accepts_numpy_integers():
    import numpy as np

    config = ch02.GPTConfig(vocab_size=np.int64(40), d_model=np.int32(8), heads=np.int64(2))
    assert ch02.TinyGPT(config).position_embedding.weight.shape == (128, 8)


# --- bad input to the cache, the layers and sampling -----------------------------------------------------------


def test_kv_cache_appends_to_one_layer_only():
    cache = ch02.KVCache(2, 1, 2, 4)
    new = torch.zeros(1, 2, 3, 4)
    cache.append(1, new, new)
    assert cache.keys[1].shape == (1, 2, 3, 4) and cache.keys[0].shape == (1, 2, 0, 4)


def test_layer_constructors_check_their_sizes():
    with pytest.raises(ValueError, match="^dropout must be < 1"):
        ch02.FeedForward(8, dropout=1.0)
    assert ch02.FeedForward(8)(torch.zeros(5, 8)).shape == (5, 8)  # any leading shape


def test_sampling_needs_a_generator_and_top_k_keeps_the_best():
    logits = torch.tensor([0.0, 2.0, 1.0])
    assert ch02.next_token(logits) == 1
    with pytest.raises(AssertionError, match="torch.Generator"):
        ch02.next_token(logits, 1.0)  # never a draw from torch's global generator
    draws = {ch02.next_token(logits, 5.0, 2, torch.Generator().manual_seed(s)) for s in range(40)}
    assert draws == {1, 2}  # a hot temperature reaches both survivors of top-2, never token 0


def test_sample_batch_windows_and_evaluate_loss_checks_its_arguments():
    data = torch.arange(10)
    generator = torch.Generator().manual_seed(0)
    inputs, targets = ch02.sample_batch(data, 4, 9, generator)
    assert torch.equal(targets, inputs + 1) and inputs.shape == (4, 9)
    with pytest.raises(ValueError, match="^batches must be a positive integer"):
        ch02.evaluate_loss(make_model(), list(range(100)), batches=0)
    with pytest.raises(ValueError, match=r"^token_ids must hold at least 33 entries \(got 32\)$"):
        ch02.evaluate_loss(make_model(), list(range(32)))


def test_docstrings_name_equations_by_number_not_by_quarto_label():
    text = (ROOT / "chapters" / "ch02-tinygpt.qmd").read_text(encoding="utf-8")
    labels = re.findall(r"\{#(eq-ch02-[a-z0-9-]+)\}", text)
    assert labels == ["eq-ch02-loss", "eq-ch02-kvbytes", "eq-ch02-absmax"]  # Equations 2.1, 2.2, 2.3
    assert "Equation 2.1" in ch02.train.__doc__ and "Equation 2.1" in ch02.evaluate_loss.__doc__
    assert "Equation 2.2:" in ch02.kv_cache_bytes.__doc__
    assert "Equation 2.3:" in ch02.quantize.__doc__ and "Equation 2.3" in ch02.dequantize.__doc__
    generated = (ROOT / "code" / "ch02" / "_generated.py").read_text(encoding="utf-8")
    assert not re.findall(r"@(?:eq|sec|fig|tbl)-", generated)
