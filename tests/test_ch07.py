"""Tests for Chapter 12 (chapters/ch07-forgetting.qmd): the eviction policies, the quantized
caches, the decode loop, the byte budgets, and the refusals of bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from longctx import ch01, ch02, ch06, ch07

FAST = settings(max_examples=12, deadline=None)
EVICTING = ("window", "sinks", "h2o", "snapkv", "pyramidkv")  # read the prompt in full, compress once
QUANTIZED = ("int8", "int4", "kivi4", "kivi2")


def rotary(layers: int = 2, heads: int = 2, d_model: int = 16, *, seed: int = 0) -> ch06.RotaryGPT:
    config = ch02.GPTConfig(vocab_size=256, context_length=16, d_model=d_model, layers=layers, heads=heads)
    torch.manual_seed(seed)
    return ch06.RotaryGPT(config).eval()


def tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def stream(model, policy, budget, ids, prompt):
    """Logits (B, T, V): the prompt at once, compressed, then one token at a time."""
    cache = ch07.make_cache(model, policy, budget, prompt_tokens=prompt)
    parts = [ch07.read_with_cache(model, ids[:, :prompt], cache)]
    cache.compress()
    parts += [ch07.read_with_cache(model, ids[:, t:t + 1], cache) for t in range(prompt, ids.shape[1])]
    return torch.cat(parts, 1), cache


def seen_from(scores: torch.Tensor, window: int) -> ch07.Seen:
    """A Seen of random attention rows (B, H, T, T), as a full prompt would leave it."""
    weights = scores.softmax(-1)
    length = scores.shape[-1]
    positions = torch.arange(length).expand(*scores.shape[:2], length)
    return ch07.Seen(positions, weights.sum(-2), weights[..., -window:, :])


# --- the decode loop ------------------------------------------------------------------------------


@FAST
@given(layers=st.integers(1, 3), heads=st.integers(1, 2), length=st.integers(2, 30),
       prompt=st.integers(1, 30), seed=st.integers(0, 1000))
def test_the_decode_loop_reproduces_the_model(layers, heads, length, prompt, seed):
    prompt = min(prompt, length)
    model = rotary(layers, heads, d_model=8 * heads, seed=seed)
    ids = tokens(2, length, seed)
    with torch.no_grad():
        logits, _ = stream(model, "full", None, ids, prompt)
        torch.testing.assert_close(logits, model(ids), atol=1e-5, rtol=1e-5)


def keep_everything(model, kind):
    """A cache of each kind that keeps every entry in full precision (KIVI: a residual past the text)."""
    if kind.startswith("kivi"):
        return ch07.QuantizedCache(len(model.blocks), int(kind[-1]), kivi=True, group=16, residual=64)
    return ch07.make_cache(model, kind, None if kind == "full" else 1.0, prompt_tokens=20)


@pytest.mark.parametrize("kind", ["full", *EVICTING, "kivi4", "kivi2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_cache_that_keeps_everything_gives_the_full_pass(kind, seed):
    """Through the model's own forward: the prompt bit for bit, each later token to float32 rounding."""
    model = rotary(layers=1 + seed, d_model=16 * (1 + seed), seed=seed)
    ids = tokens(2, 40, seed)
    cache = keep_everything(model, kind)
    with torch.no_grad():
        prompt = ch07.read_with_cache(model, ids[:, :20], cache)
        cache.compress()
        steps = [ch07.read_with_cache(model, ids[:, t:t + 1], cache) for t in range(20, 40)]
        assert torch.equal(prompt, model(ids[:, :20]))
        full = model(ids)
    assert (torch.cat([prompt, *steps], 1) - full).abs().max().item() < 1e-6
    assert cache.length == 40 and [cache.position(layer) for layer in range(1 + seed)] == [40] * (1 + seed)


@pytest.mark.parametrize("kind", QUANTIZED)
def test_a_quantized_cache_reads_the_prompt_as_the_model_does(kind):
    model = rotary(layers=2)
    ids = tokens(2, 24, seed=13)
    with torch.no_grad():
        read = ch07.read_with_cache(model, ids, ch07.make_cache(model, kind, prompt_tokens=24))
        assert torch.equal(read, model(ids))  # full precision until it is stored


def test_read_with_cache_runs_the_models_own_forward_dropout_included():
    config = ch02.GPTConfig(vocab_size=256, context_length=16, d_model=16, layers=2, heads=2, dropout=0.5)
    torch.manual_seed(0)
    model = ch06.RotaryGPT(config).train()
    ids = tokens(2, 12, seed=14)
    with torch.no_grad():
        torch.manual_seed(1)
        read = ch07.read_with_cache(model, ids, ch07.make_cache(model, "h2o", 0.5, prompt_tokens=12))
        torch.manual_seed(1)
        forward = model(ids, ch07.make_cache(model, "h2o", 0.5, prompt_tokens=12))
        evaluated = ch07.read_with_cache(model.eval(), ids, ch07.make_cache(model, "h2o", 0.5, prompt_tokens=12))
    assert torch.equal(read, forward)
    assert not torch.allclose(read, evaluated)  # the dropout of training mode was applied


def test_an_evicting_cache_places_new_tokens_at_the_tokens_read_not_the_entries_kept():
    model = rotary(layers=2)
    ids = tokens(1, 30, seed=15)
    cache = ch07.make_cache(model, "window", 0.5, prompt_tokens=20)
    with torch.no_grad():
        ch07.read_with_cache(model, ids[:, :20], cache)
        cache.compress()
        for t in range(20, 30):
            ch07.read_with_cache(model, ids[:, t:t + 1], cache)
    assert [k.shape[2] for k in cache.keys] == [20, 20]  # floor(0.5 * 20) kept, then 10 appended
    assert cache.length == 30 and [cache.position(0), cache.position(1)] == [30, 30]
    assert cache.seen[1].positions[0, 0].tolist() == list(range(10, 30))  # each entry at its true position


@pytest.mark.parametrize("policy", EVICTING)
def test_every_eviction_policy_at_full_budget_equals_the_full_cache_exactly(policy):
    model = rotary(layers=3)
    ids = tokens(3, 40, seed=1)
    with torch.no_grad():
        full, _ = stream(model, "full", None, ids, 20)
        kept, cache = stream(model, policy, 1.0, ids, 20)
    assert torch.equal(kept, full)
    assert [k.shape[2] for k in cache.keys] == [40, 40, 40]


@pytest.mark.parametrize("policy", EVICTING)
def test_a_smaller_budget_changes_the_logits(policy):
    model = rotary(layers=2)
    ids = tokens(2, 48, seed=2)
    with torch.no_grad():
        full, _ = stream(model, "full", None, ids, 24)
        kept, _ = stream(model, policy, 0.5, ids, 24)
    assert not torch.allclose(kept[:, 24:], full[:, 24:])
    assert torch.equal(kept[:, :24], full[:, :24])  # the prompt is read in full by every policy


# --- what each policy keeps -----------------------------------------------------------------------


def test_h2o_accumulated_scores_equal_a_dense_recomputation():
    model = rotary(layers=2)
    ids = tokens(2, 30, seed=3)
    with torch.no_grad():
        _, streamed = stream(model, "h2o", 1.0, ids, 12)  # nothing evicted: every column survives
        dense = ch07.make_cache(model, "h2o", 1.0, prompt_tokens=30)
        ch07.read_with_cache(model, ids, dense)  # one causal pass over all 30 tokens
    for layer in range(2):
        torch.testing.assert_close(streamed.seen[layer].accumulated, dense.seen[layer].accumulated,
                                   atol=1e-5, rtol=1e-5)
        total = dense.seen[layer].accumulated.sum(-1)  # each of the 30 queries gives weight 1
        torch.testing.assert_close(total, torch.full_like(total, 30.0))


def test_h2o_keeps_the_recent_half_and_the_heaviest_of_the_rest():
    seen = seen_from(torch.randn(2, 3, 20, 20, generator=torch.Generator().manual_seed(4)), window=1)
    chosen = ch07.keep_heavy(seen, 8, recent_share=0.5)
    for row, head in [(0, 0), (1, 2)]:
        picked = set(chosen[row, head].tolist())
        assert {16, 17, 18, 19} <= picked
        heaviest = seen.accumulated[row, head, :16].topk(4).indices.tolist()
        assert picked == {16, 17, 18, 19} | set(heaviest)


def test_snapkv_keeps_the_top_positions_of_its_pooled_votes():
    window, pool, keep = 4, 5, 10
    seen = seen_from(torch.randn(1, 2, 24, 24, generator=torch.Generator().manual_seed(5)) * 3, window=window)
    chosen = ch07.keep_snap(seen, keep, window=window, pool=pool)
    votes = seen.recent[..., :20].sum(-2)  # (B, H, 20): the window's votes for the entries before it
    for head in range(2):
        row = votes[0, head]
        pooled = torch.stack([row[max(0, i - 2):i + 3].mean() for i in range(20)])  # mean over <= 5
        torch.testing.assert_close(ch07.snap_votes(seen, window, pool)[0, head], pooled)
        prefix = pooled.topk(keep - window).indices.tolist()
        assert set(chosen[0, head].tolist()) == set(prefix) | {20, 21, 22, 23}


def test_snapkvs_votes_ignore_the_windows_own_columns():
    """The reference code slices the window's own keys off before pooling: a vote the window gives
    itself cannot pull a neighbour before the window into the cache."""
    seen = seen_from(torch.zeros(1, 1, 12, 12), window=3)
    recent = seen.recent.clone()
    recent[..., 9] += 100.0  # the window votes heavily for its own first entry
    loud = ch07.Seen(seen.positions, seen.accumulated, recent)
    assert torch.equal(ch07.snap_votes(loud, 3, 5), ch07.snap_votes(seen, 3, 5))
    assert ch07.snap_votes(seen, 3, 5).shape == (1, 1, 9)


def test_snapkvs_observation_window_holds_the_asked_name():
    """The prompt ends on the question's mark and the asked name: the window's queries are the question's."""
    model = rotary(layers=2)
    text = ch06.key_free_text(torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()[:5000])))
    batch = ch06.key_batch(text, torch.linspace(0.05, 1, 5, dtype=torch.float64), 40,
                           torch.Generator().manual_seed(2), keys=3)
    prompt = batch.inputs[:, :-1]
    names = batch.inputs[torch.arange(5)[:, None], batch.starts + 1]  # (B, K) each record's name byte
    assert torch.equal(prompt[:, -1], names[:, 0])  # the last prompt byte is the asked name
    assert (prompt[:, -2] == ord(ch06.KEY_MARK)).all()
    cache = ch07.make_cache(model, "snapkv", 0.25, prompt_tokens=prompt.shape[1])
    with torch.no_grad():
        ch07.read_with_cache(model, prompt, cache)
        assert all(seen.recent.shape[2] == 4 for seen in cache.seen)  # the rows of queries P-4 .. P-1
        cache.compress()
    for seen in cache.seen:
        assert (seen.positions[..., -4:] == torch.arange(prompt.shape[1] - 4, prompt.shape[1])).all()


def test_the_window_and_the_sinks_keep_what_their_names_say():
    seen = seen_from(torch.zeros(1, 1, 30, 30), window=1)
    assert ch07.keep_recent(seen, 6)[0, 0].tolist() == list(range(24, 30))
    assert ch07.keep_sinks(seen, 6, sinks=2)[0, 0].tolist() == [0, 1, 26, 27, 28, 29]


@FAST
@given(keep=st.integers(10, 60), layers=st.integers(1, 6), extra=st.integers(0, 60))
def test_pyramid_budgets_fall_with_depth_and_hold_the_total(keep, layers, extra):
    tokens_seen = keep + extra
    budgets = ch07.pyramid_budgets(keep, layers, tokens=tokens_seen, window=4)
    assert sum(budgets) == layers * keep
    assert budgets == sorted(budgets, reverse=True)
    assert max(budgets) <= tokens_seen or layers == 1
    assert min(budgets) >= 4


def test_pyramid_budgets_follow_the_reference_schedule():
    """beta = 20: the deepest layer keeps its window and a twentieth of the rest, the first as much above."""
    assert ch07.pyramid_budgets(12, 4, tokens=127, window=4, beta=20) == [20, 15, 9, 4]
    assert ch07.pyramid_budgets(44, 2, tokens=127, window=4, beta=20) == [82, 6]  # 4 + 40 // 20
    assert ch07.pyramid_budgets(50, 4, tokens=50, window=4) == [50, 50, 50, 50]  # nothing to move


# --- bytes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", EVICTING)
@pytest.mark.parametrize("budget", ch07.BUDGETS)
def test_the_bytes_each_eviction_policy_keeps_equal_its_budget(policy, budget):
    model = rotary(layers=3)
    ids = tokens(2, 60, seed=6)
    per_token = 2 * 2 * model.config.d_model * 4  # keys and values, batch 2, float32
    cache = ch07.make_cache(model, policy, budget, prompt_tokens=50)
    with torch.no_grad():
        ch07.read_with_cache(model, ids[:, :50], cache)
        cache.compress()
        assert cache.nbytes() == 3 * math.floor(budget * 50 + 1e-9) * per_token
        budgets = [k.shape[2] for k in cache.keys]
        assert budgets == cache.layer_budgets(50)
        for t in range(50, 60):
            ch07.read_with_cache(model, ids[:, t:t + 1], cache)
    # compressed once: each decoded token is appended, nothing more evicted
    assert [k.shape[2] for k in cache.keys] == [b + 10 for b in budgets]


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_the_streaming_cache_holds_its_size_from_the_first_token(budget):
    model = rotary(layers=2)
    ids = tokens(2, 60, seed=6)
    keep = math.floor(budget * 50 + 1e-9)
    cache = ch07.make_cache(model, "streaming", budget, prompt_tokens=50)
    with torch.no_grad():
        for t in range(60):
            ch07.read_with_cache(model, ids[:, t:t + 1], cache)
            assert all(k.shape[2] == min(t + 1, keep) for k in cache.keys)
    assert cache.seen[1].positions[0, 0].tolist() == [0, 1, 2, 3, *range(60 - keep + 4, 60)]


class MaskedPass(ch07.TokensRead):
    """One full causal pass in which token i sees only what StreamingLLM holds when it reads i:
    the sinks, the newest keep - sinks entries before it, and itself."""

    def __init__(self, layers: int, keep: int, sinks: int):
        super().__init__(layers)
        self.keep, self.sinks = keep, sinks

    def attend(self, layer, query, key, value):
        count = query.shape[2]
        self.read[layer] += count
        i, j = torch.arange(count)[:, None], torch.arange(count)[None]
        mask = (j <= i) & ((j < self.sinks) | (j >= i - self.keep + self.sinks))
        return ch01.scaled_dot_product_attention(query, key, value, mask)[0]


@pytest.mark.parametrize(("budget", "seed"), [(0.2, 0), (0.3, 1), (0.5, 2)])
def test_the_streaming_cache_never_attends_to_an_evicted_entry(budget, seed):
    """Read token by token, prompt and decode, it equals one masked pass: no query in any layer
    sees an entry that was evicted before it, so nothing leaks through the upper layers."""
    model = rotary(layers=3, seed=seed)
    ids = tokens(2, 40, seed)
    keep = math.floor(budget * 30 + 1e-9)
    with torch.no_grad():
        streamed, cache = stream(model, "streaming", budget, ids, 30)
        masked = model(ids, MaskedPass(3, keep, 4))
        read_then_compressed, _ = stream(model, "sinks", budget, ids, 30)
    torch.testing.assert_close(streamed, masked, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(streamed[:, 30:], read_then_compressed[:, 30:])  # the leak: they differ


@pytest.mark.parametrize("policy", QUANTIZED)
def test_the_quantized_caches_bytes_are_counted_with_scales_and_residual(policy):
    model = rotary(layers=2, heads=2, d_model=16)  # d_h = 8
    ids = tokens(1, 50, seed=7)
    with torch.no_grad():
        _, cache = stream(model, policy, None, ids, 30)
    vectors = 2 * 2 * 50  # layers x heads x tokens, for keys and for values each
    if policy == "int8":
        assert cache.nbytes() == 2 * vectors * (8 + 4)
    elif policy == "int4":
        assert cache.nbytes() == 2 * vectors * (4 + 4)
    else:
        stored = cache.stored[0]
        recent = stored.key_recent.shape[2]
        quantized = 50 - recent
        assert 16 <= recent < 32 and quantized % 16 == 0
        code_bytes = 8 * int(policy[-1]) // 8  # 8 channels of 4 or 2 bits
        per_head = (quantized * code_bytes + quantized // 16 * 8 * 8  # key codes; scale and offset a group x channel
                    + quantized * (code_bytes + 8)  # value codes; scale and offset a token
                    + 2 * recent * 8 * 4)  # the full-precision residual of keys and values
        assert cache.nbytes() == 2 * 2 * per_head


@pytest.mark.parametrize("bits", [8, 4])
def test_per_token_quantized_cache_error_stays_within_half_a_step(bits):
    x = torch.randn(2, 3, 40, 8, generator=torch.Generator().manual_seed(bits))
    cache = ch07.QuantizedCache(1, bits)
    cache.stored[0] = cache.store(x, x)
    keys, _ = cache.floats(0)
    step = x.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)  # absmax / q_max per vector
    assert ((keys - x).abs() <= step / 2 + 1e-6).all()
    assert (keys - x).abs().max() > 0


@pytest.mark.parametrize("bits", [4, 2])
def test_kivi_cache_error_stays_within_half_a_step(bits):
    x = torch.randn(1, 2, 48, 8, generator=torch.Generator().manual_seed(9))
    cache = ch07.QuantizedCache(1, bits, kivi=True, group=16, residual=16)
    cache.stored[0] = cache.store(x, x)
    keys, values = cache.floats(0)
    quantized = cache.stored[0].value_scale.shape[2]
    grouped = x[..., :quantized, :].reshape(1, 2, -1, 16, 8)
    key_step = (grouped.amax(3) - grouped.amin(3)) / (2**bits - 1)  # per group and channel
    key_error = (keys[..., :quantized, :] - x[..., :quantized, :]).reshape(1, 2, -1, 16, 8).abs()
    assert (key_error <= key_step[:, :, :, None] / 2 + 1e-6).all()
    value_step = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / (2**bits - 1)  # per token
    assert ((values - x).abs()[..., :quantized, :] <= value_step[..., :quantized, :] / 2 + 1e-6).all()
    assert torch.equal(keys[..., quantized:, :], x[..., quantized:, :])  # the residual is exact


def test_quantized_decoding_stays_close_to_the_full_cache():
    model = rotary(layers=2)
    ids = tokens(2, 40, seed=10)
    with torch.no_grad():
        full, _ = stream(model, "full", None, ids, 20)
        errors = {p: (stream(model, p, None, ids, 20)[0] - full).abs().max().item() for p in QUANTIZED}
    assert errors["int8"] < errors["int4"] < 0.5
    assert errors["kivi4"] < errors["kivi2"] and errors["kivi4"] < 0.5


# --- the measurements -----------------------------------------------------------------------------


def test_compressed_hits_at_full_budget_equal_the_models_own_guess():
    model = rotary(layers=2)
    text = ch06.key_free_text(torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()[:5000])))
    batch = ch06.key_batch(text, torch.linspace(0, 1, 6, dtype=torch.float64), 40,
                           torch.Generator().manual_seed(0), keys=3)
    with torch.no_grad():
        expected = model(batch.inputs)[:, -1].argmax(-1) == batch.targets[:, -1]
    for policy in ("full", *EVICTING, "streaming"):
        budget = None if policy == "full" else 1.0
        assert torch.equal(ch07.compressed_hits(model, batch, policy, budget), expected)
        guesses = ch07.compressed_guesses(model, batch, policy, budget)
        assert torch.equal(guesses == batch.values[:, 0], expected)


def test_compressed_losses_at_full_budget_equal_the_models_losses():
    model = rotary(layers=2)
    ids = tokens(2, 33, seed=11)
    losses = ch07.compressed_losses(model, ids[:, :-1], ids[:, 1:], "sinks", 1.0, prompt=20)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(ids[:, :-1]).transpose(1, 2), ids[:, 1:],
                                                     reduction="none")[:, 20:]
    torch.testing.assert_close(losses, expected, atol=1e-5, rtol=1e-5)


def test_the_decode_step_reads_the_kept_entries_only():
    """After compression a step is attention over exactly the kept keys and its own."""
    model = rotary(layers=1)
    ids = tokens(1, 30, seed=12)
    cache = ch07.make_cache(model, "window", 0.5, prompt_tokens=29)
    with torch.no_grad():
        ch07.read_with_cache(model, ids[:, :29], cache)
        cache.compress()
        keys, values = cache.keys[0].clone(), cache.values[0].clone()
        seen = {}
        original = cache.attend

        def spy(layer, query, key, value):
            seen["args"] = (query, key, value)
            seen["out"] = original(layer, query, key, value)
            return seen["out"]

        cache.attend = spy
        ch07.read_with_cache(model, ids[:, 29:], cache)
    query, key, value = seen["args"]
    expected, _ = ch01.scaled_dot_product_attention(query, torch.cat([keys, key], 2),
                                                    torch.cat([values, value], 2))
    assert keys.shape[2] == 14  # floor(0.5 * 29)
    assert cache.keys[0].shape[2] == 15  # after the step: the 14 kept and the step's own
    torch.testing.assert_close(seen["out"], expected)


# --- refusals -------------------------------------------------------------------------------------


def test_make_cache_refuses_what_would_give_a_wrong_answer():
    model = rotary()
    with pytest.raises(ValueError, match="policy"):
        ch07.make_cache(model, "lru", 0.5, prompt_tokens=40)
    with pytest.raises(ValueError, match="budget"):
        ch07.make_cache(model, "window", 0.0, prompt_tokens=40)
    with pytest.raises(ValueError, match="budget"):
        ch07.make_cache(model, "window", 1.5, prompt_tokens=40)
    with pytest.raises(ValueError, match="budget"):
        ch07.make_cache(model, "int8", 0.5, prompt_tokens=40)  # bits set its size
    with pytest.raises(ValueError, match="budget"):
        ch07.make_cache(model, "full", 0.5, prompt_tokens=40)
    with pytest.raises(ValueError, match="budget"):
        ch07.make_cache(model, "snapkv", 0.1, prompt_tokens=40)  # 4 entries: only the 4-query window
    with pytest.raises(TypeError, match="model"):
        ch07.make_cache("model", "window", 0.5, prompt_tokens=40)


def test_the_measurements_refuse_bad_windows():
    model = rotary()
    ids = tokens(2, 30)
    with pytest.raises(ValueError, match="prompt"):
        ch07.compressed_losses(model, ids, ids, "window", 0.5, prompt=30)
    with pytest.raises(ValueError, match="targets"):
        ch07.compressed_losses(model, ids, ids[:, :-1], "window", 0.5, prompt=10)
    with pytest.raises(TypeError, match="batch"):
        ch07.compressed_hits(model, ids, "window", 0.5)


# --- the saved run's driver -----------------------------------------------------------------------


@pytest.mark.slow  # trains and reads a model through every policy: the whole study, small
def test_the_tiny_experiment_measures_every_policy_on_the_same_windows():
    from experiments import forgetting

    job = forgetting.run_job(forgetting.TINY, seed=0)
    grid = [(e["policy"], e["budget"]) for e in job["entries"]]
    assert grid == forgetting.settings_grid(forgetting.TINY)
    assert len(grid) == 1 + 6 * 3 + 4  # full; six evictions at three budgets; four quantized caches
    full = job["entries"][0]
    assert full["fraction"] == 1.0 and len(full["single"]) == len(full["multi"]) == 2 * 2
    for e in job["entries"]:
        if e["budget"] is not None:
            assert e["fraction"] <= e["budget"]  # floor(b t) entries of t
        assert len(e["window_loss"]) == forgetting.TINY.windows
        assert len(e["position_loss"]) == forgetting.TINY.length - forgetting.TINY.prompt
        for task in ("single", "multi"):  # every trial's byte, its hit and its class agree
            assert len(e[f"{task}_guesses"]) == len(e[task]) == len(e[f"{task}_kinds"])
            assert all((kind == "0") == (hit == "1") for kind, hit in zip(e[f"{task}_kinds"], e[task], strict=True))
    for task in ("single", "multi"):
        assert sorted(job["baselines"][task]) == sorted(ch06.BASELINES)
    assert set(job["baselines"]["single"]["random record"]["hits"]) == {"1"}  # one record: copying it is right
    quarter = {e["policy"]: e["kept"] for e in job["entries"] if e["budget"] == 0.25}
    assert sorted(quarter["window"][0][0]) == list(range(95 - 23, 95))  # floor(0.25 * 95) newest
    assert sorted(quarter["streaming"][1][0]) == [0, 1, 2, 3, *range(95 - 19, 95)]  # never saw the rest
    assert job["passed"] == forgetting.passes_gate(job, forgetting.TINY)
    other = forgetting.run_job(forgetting.TINY, seed=1)  # each seed its own held-out windows
    assert other["loss_ends"] != job["loss_ends"] and other["evaluation_seed"] != job["evaluation_seed"]


def test_the_gate_admits_a_seed_at_its_share_and_refuses_one_below():
    from experiments import forgetting

    settings = forgetting.ForgettingSettings(gate=0.8)

    def run(found: str) -> dict:
        return {"entries": [{"policy": "full", "budget": None, "single": found, "multi": "0" * len(found)},
                            {"policy": "window", "budget": 0.5, "single": "1" * len(found)}]}

    assert forgetting.passes_gate(run("11111111" + "00"), settings)  # 8 of 10
    assert not forgetting.passes_gate(run("1111111" + "000"), settings)  # 7 of 10
    assert forgetting.passes_gate(run("1" * 10), forgetting.ForgettingSettings(gate=1.0))
    with pytest.raises(ValueError, match="full"):
        forgetting.passes_gate({"entries": []}, settings)


def test_the_shallowest_record_sits_past_the_sinks_and_the_pooling():
    """Depth d places the asked record at round(d (T - 6)) (ch06.key_batch): the shallowest lies past the
    four sinks and past the reach of SnapKV's pool of 5 around them, so neither keeps it by accident."""
    from experiments import forgetting

    s = forgetting.ForgettingSettings()
    first = round(min(s.depths) * (s.length - 6))
    assert first >= ch07.POLICIES["sinks"][1]["sinks"] + ch07.POLICIES["snapkv"][1]["pool"] // 2
    assert len(s.seeds) >= 5 and 4 <= s.keys <= 8


def test_the_experiment_settings_refuse_a_prompt_past_the_window():
    from experiments import forgetting

    with pytest.raises(ValueError, match="prompt"):
        forgetting.ForgettingSettings(length=64, prompt=64)


def test_toy_seen_is_the_chapters_small_case():
    toy = ch07.toy_seen()
    scores = torch.randn(1, 1, 12, 12, generator=torch.Generator().manual_seed(7)) * 2
    weights = scores.masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf).softmax(-1)
    assert torch.equal(toy.positions, torch.arange(12).view(1, 1, 12))
    assert torch.equal(toy.accumulated, weights.sum(-2)) and torch.equal(toy.recent, weights[..., -3:, :])
    assert ch07.keep_heavy(toy, 6)[0, 0].tolist() == [0, 1, 2, 9, 10, 11]  # the chapter's H2O row
    # each query's attention sums to 1, and the first entry is seen by all twelve queries
    assert torch.allclose(toy.recent.sum(-1), torch.ones(1, 1, 3))
    assert toy.accumulated.sum().item() == pytest.approx(12.0)
    small = ch07.toy_seen(5, window=5, seed=1)
    assert small.recent.shape == (1, 1, 5, 5) and small.positions.shape == (1, 1, 5)
    with pytest.raises(ValueError, match="window"):
        ch07.toy_seen(4, window=5)


def test_snapkv_refuses_an_even_pool_a_keep_below_its_window_and_above_the_entries():
    toy = ch07.toy_seen()
    with pytest.raises(ValueError, match=r"pool must be odd \(got 4\)"):
        ch07.snap_votes(toy, 3, 4)
    with pytest.raises(ValueError, match=r"keep must be at least window=3 \(got 2\)"):
        ch07.keep_snap(toy, 2, window=3)
    with pytest.raises(ValueError, match=r"keep must be an integer <= 12 \(got 13\)"):
        ch07.keep_snap(toy, 13, window=3)
    kept = ch07.keep_snap(toy, 3, window=3)  # keep == window: the window alone
    assert kept[0, 0].tolist() == [9, 10, 11]
    assert ch07.keep_snap(toy, 12, window=3)[0, 0].tolist() == list(range(12))
