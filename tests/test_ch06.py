"""Tests for Chapter 11 (chapters/ch06-extension.qmd): the rotary TinyGPT, the planted-key task, the
measurements, the experiment and its command line, and every refusal of bad input."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from longctx import ch01, ch02, ch03, ch06, support

REPO = Path(__file__).resolve().parents[1]
FAST = settings(max_examples=15, deadline=None)
TOKENS = torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()))


def rotary(context: int = 8, d_model: int = 16, layers: int = 2, heads: int = 2, *, seed: int = 0,
           fused: bool = False) -> ch06.RotaryGPT:
    config = ch02.GPTConfig(vocab_size=256, context_length=context, d_model=d_model, layers=layers, heads=heads)
    torch.manual_seed(seed)
    return ch06.RotaryGPT(config, fused=fused).eval()


# --- the rotary model ----------------------------------------------------------------------------


@FAST
@given(heads=st.integers(1, 3), layers=st.integers(1, 3), batch=st.integers(1, 3), length=st.integers(2, 40),
       prompt=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_rotary_cached_decoding_equals_the_full_pass(heads, layers, batch, length, prompt, seed):
    prompt = min(prompt, length)
    model = rotary(context=8, d_model=4 * heads, layers=layers, heads=heads, seed=seed)
    tokens = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(batch=batch)
        pieces = [model(tokens[:, :prompt], cache)]
        pieces += [model(tokens[:, t:t + 1], cache) for t in range(prompt, length)]
    assert cache.length == length
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)


@pytest.mark.parametrize("start", [0, 7])
def test_the_rotary_layer_is_chapter_2s_with_rope_on_queries_and_keys(start):
    """Projections, Chapter 3's rotation at positions start.., Chapter 2's cache hook, the output layer."""
    torch.manual_seed(2)
    layer = ch06.RotarySelfAttention(16, 2)
    layer.set_bands(*ch06.recipe_bands("yarn", 8, factor=4, original_context=8))
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    cache = ch02.KVCache(layers=1, batch=2, heads=2, head_dim=8)
    if start:  # tokens already cached: the new ones start at position 7
        cache.append(0, *(torch.randn(2, 2, start, 8, generator=torch.Generator().manual_seed(3)),) * 2)
    past_keys, past_values = cache.keys[0], cache.values[0]
    with torch.no_grad():
        got = layer(x, cache if start else None)
        q, k, v = (ch01.split_heads(projection(x), 2) for projection in (layer.query, layer.key, layer.value))
        positions = torch.arange(start, start + 5)
        q, k = (ch03.apply_rope(t, positions, layer.frequencies, layer.magnitude) for t in (q, k))
        keys, values = torch.cat([past_keys, k], 2), torch.cat([past_values, v], 2)
        mixed, _ = ch01.scaled_dot_product_attention(
            q, keys, values, torch.ones(5, start + 5, dtype=torch.bool).tril(diagonal=start))
        expected = layer.output(ch01.merge_heads(mixed))
    assert torch.equal(got, expected)
    if start:
        assert torch.equal(cache.keys[0], keys) and cache.position(0) == start + 5


@pytest.mark.parametrize("method", ch03.ROPE_METHODS)
def test_cached_decoding_equals_full_pass_under_every_recipe_in_float64(method):
    model = rotary(context=8, d_model=16, heads=2).double()
    model.set_rope(method, factor=4)
    tokens = torch.randint(0, 256, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache(batch=2)
        cached = torch.cat([model(tokens[:, t:t + 1], cache) for t in range(30)], dim=1)
    assert (cached - full).abs().max().item() < 1e-12


def test_positions_past_the_trained_length_are_accepted_where_chapter_2_refuses():
    model = rotary(context=8)
    tokens = torch.randint(0, 256, (1, 5 * 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (1, 40, 256) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="position table"):
        ch02.TinyGPT(model.config)(tokens)
    assert not hasattr(model, "position_embedding")


def test_rotary_layer_uses_chapter_3_rotation_and_chapter_1_attention():
    """The layer equals attention written out from ch01 and ch03 by hand."""
    model = rotary(context=8, d_model=16, heads=2)
    layer = model.blocks[0].attention
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(11)
    q = ch03.apply_rope(ch01.split_heads(layer.query(x), 2), positions, layer.frequencies)
    k = ch03.apply_rope(ch01.split_heads(layer.key(x), 2), positions, layer.frequencies)
    v = ch01.split_heads(layer.value(x), 2)
    mixed, _ = ch01.scaled_dot_product_attention(q, k, v, ch01.causal_mask(11))
    expected = layer.output(ch01.merge_heads(mixed))
    assert torch.allclose(layer(x), expected, atol=1e-6)


@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0, 3.5])
@pytest.mark.parametrize("method", ch03.ROPE_METHODS)
def test_each_recipe_in_the_model_gives_chapter_3_bands(method, factor):
    model = rotary(context=16, d_model=32, heads=2)
    model.set_rope(method, factor)
    recipe = ch06.yarn_thresholds(10_000.0, 16) if method == "yarn" else ch06.RECIPE_SETTINGS.get(method, {})
    frequencies, magnitude = ch03.inverse_frequencies(16, method=method, factor=factor, original_context=16,
                                                      **recipe)
    for block in model.blocks:
        assert torch.equal(block.attention.frequencies, frequencies)
        assert block.attention.magnitude == magnitude
    assert model.rope == (method, factor)


def test_recipe_settings_match_the_shipped_llama_config_and_ch03_defaults():
    scaling = ch03.load_model_config("llama-3.1-8b")["rope_scaling"]
    assert ch06.RECIPE_SETTINGS["llama3"] == {
        "low_freq_factor": scaling["low_freq_factor"], "high_freq_factor": scaling["high_freq_factor"]}
    plain, _ = ch03.inverse_frequencies(32, method="yarn", factor=8, original_context=64)
    ours, _ = ch06.recipe_bands("yarn-paper", 32, factor=8, original_context=64)
    assert torch.equal(plain, ours)  # the paper's boundaries are ch03's defaults


def test_yarn_thresholds_give_back_the_papers_values_on_llama_2_and_keep_its_share_of_bands():
    llama2 = ch03.load_model_config("llama-2-7b")
    assert ch06.YARN_REFERENCE == {"base": llama2["rope_theta"], "length": llama2["max_position_embeddings"]}
    same = ch06.yarn_thresholds(ch06.YARN_REFERENCE["base"], ch06.YARN_REFERENCE["length"])
    assert same == pytest.approx(ch06.RECIPE_SETTINGS["yarn"])

    def kept(method, dim, base, length):  # bands left exactly as trained at factor 4
        bands, _ = ch06.recipe_bands(method, dim, factor=4, base=base, original_context=length)
        return int((bands == ch03.inverse_frequencies(dim, base=base)[0]).sum()) / (dim // 2)

    reference = kept("yarn-paper", 128, 10_000.0, 4096)  # Llama 2's own heads
    assert kept("yarn", 128, 10_000.0, 4096) == reference and 0.25 < reference < 0.4
    assert abs(kept("yarn", 32, 27.0, 64) - reference) <= 1 / 16 + 1e-9  # the matched model: about the same
    assert kept("yarn-paper", 32, 27.0, 64) < reference / 2  # the paper's values keep far fewer


def test_yarn_without_temperature_has_yarns_bands_and_magnitude_one():
    bands, magnitude = ch06.recipe_bands("yarn", 32, factor=4, base=27.0, original_context=64)
    cold, one = ch06.recipe_bands("yarn-no-temperature", 32, factor=4, base=27.0, original_context=64)
    assert torch.equal(bands, cold) and one == 1.0 and magnitude == pytest.approx(0.1 * math.log(4) + 1)
    with pytest.raises(ValueError, match="method"):
        ch06.recipe_bands("yarn-hot", 32, factor=4, original_context=64)


def test_recipes_change_the_model_only_beyond_factor_one():
    model = rotary(context=8)
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        outputs = {}
        for method in ch03.ROPE_METHODS:
            model.set_rope(method, 1.0)
            outputs[method] = model(tokens)
        model.set_rope("pi", 3.0)
        stretched = model(tokens)
    assert all(torch.equal(out, outputs["rope"]) for out in outputs.values())
    assert not torch.allclose(stretched, outputs["rope"])


def test_fused_attention_equals_the_teaching_path():
    teaching = rotary(context=8, d_model=24, heads=3, seed=5)
    fused = copy.deepcopy(teaching)
    for block in fused.blocks:
        block.attention.fused = True
    tokens = torch.randint(0, 256, (3, 50), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.allclose(fused(tokens), teaching(tokens), atol=1e-5)
        cache_a, cache_b = teaching.new_cache(3), fused.new_cache(3)
        teaching(tokens[:, :20], cache_a)
        fused(tokens[:, :20], cache_b)
        # with a cache the cache attends (Chapter 2's hook), fused or not
        assert torch.equal(fused(tokens[:, 20:], cache_b), teaching(tokens[:, 20:], cache_a))


@pytest.mark.slow  # trains a model
def test_rotary_model_trains_on_chapter_2_machinery():
    """Chapter 2's train loop runs on the rotary model unchanged, and the loss falls."""
    model = rotary(context=16, d_model=16, heads=2)
    losses = ch02.train(model, TOKENS[:5_000], steps=30, batch_size=8, learning_rate=3e-3, seed=0, progress=False)
    assert losses[-1] < losses[0] - 1.0


# --- the planted keys ----------------------------------------------------------------------------

KEY_BYTES = {ord(c) for c in ch06.KEY_MARK + ch06.KEY_ASK + ch06.KEY_SYMBOLS}
SPLIT = int(0.9 * TOKENS.numel())
TRAIN_TEXT = ch06.key_free_text(TOKENS[:SPLIT])
HELD_OUT_TEXT = ch06.key_free_text(TOKENS[SPLIT:])


def record_positions(batch: ch06.KeyBatch, row: int) -> set[int]:
    """The input positions a planted record or the question occupies in one row."""
    length = batch.inputs.shape[1]
    planted = {int(s) + k for s in batch.starts[row] for k in range(3)}
    return planted | {length - 3, length - 2, length - 1}  # mark, name, ask


def test_key_free_text_removes_every_key_symbol_and_keeps_the_rest_in_order():
    kept = [t for t in TOKENS.tolist() if t not in KEY_BYTES]
    assert ch06.key_free_text(TOKENS).tolist() == kept
    assert any(t in KEY_BYTES for t in TOKENS.tolist())  # the novel does have digits
    assert not KEY_BYTES & set(HELD_OUT_TEXT.tolist()) and not KEY_BYTES & set(TRAIN_TEXT.tolist())


def test_no_key_symbol_appears_in_the_evaluation_text_outside_the_planted_records():
    """Every evaluation window of the saved run's design, both tasks, every length: a key symbol
    occurs only where a record or the question was planted; the loss windows hold none."""
    import experiments.extension as runner
    from experiments.common import texts

    settings = runner.ExtensionSettings()
    validation, held_out = runner.split_text(texts()[1], settings.validation_share)
    for length in settings.lengths:
        for keys in (1, settings.max_keys):
            where = torch.tensor(settings.depths, dtype=torch.float64).repeat_interleave(settings.trials)
            batch = ch06.key_batch(held_out, where, length,
                                   torch.Generator().manual_seed(runner.EVALUATION_SEED), keys=keys)
            for row in range(len(where)):
                found = {i for i, t in enumerate(batch.inputs[row].tolist()) if t in KEY_BYTES}
                assert found == record_positions(batch, row)
                assert int(batch.targets[row, -1]) in KEY_BYTES  # the answer is a planted value
        ends = torch.linspace(max(settings.lengths), held_out.numel() - 2, settings.windows).round().long()
        windows = held_out[ends[:, None] + torch.arange(-length, 1)]  # inputs and the last target
        assert not KEY_BYTES & set(windows.flatten().tolist())


@FAST
@given(length=st.integers(30, 120), keys=st.integers(1, 4), batch=st.integers(1, 5), seed=st.integers(0, 1_000))
def test_key_batch_plants_distinct_records_and_asks_for_one(length, keys, batch, seed):
    depths = torch.rand(batch, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    made = ch06.key_batch(HELD_OUT_TEXT, depths, length, torch.Generator().manual_seed(seed), keys=keys)
    assert made.inputs.shape == made.targets.shape == made.answers.shape == (batch, length)
    assert torch.equal(made.inputs[:, 1:], made.targets[:, :-1])
    assert made.starts.shape == made.values.shape == (batch, keys)
    assert made.answers.sum(1).tolist() == [1] * batch and bool(made.answers[:, -1].all())
    for row in range(batch):
        starts = sorted(made.starts[row].tolist())
        assert all(b - a >= 3 for a, b in zip(starts, starts[1:], strict=False))  # no two records overlap
        assert int(made.starts[row, 0]) == round(float(depths[row]) * (length - 6))
        sequence = made.inputs[row].tolist() + [int(made.targets[row, -1])]
        names = [sequence[s + 1] for s in made.starts[row].tolist()]
        assert len(set(names)) == keys and all(chr(n) in ch06.KEY_SYMBOLS for n in names)
        assert [sequence[s + 2] for s in made.starts[row].tolist()] == made.values[row].tolist()
        question = [ord(ch06.KEY_MARK), names[0], ord(ch06.KEY_ASK), int(made.values[row, 0])]
        assert sequence[-4:] == question  # record 0 is asked, and its value is the last target
        assert int(made.distance[row]) == length - 3 - int(made.starts[row, 0])
        found = {i for i, t in enumerate(made.inputs[row].tolist()) if t in KEY_BYTES}
        assert found == record_positions(made, row)


def test_key_batch_depth_zero_and_one_sit_at_the_ends_of_the_window():
    made = ch06.key_batch(HELD_OUT_TEXT, torch.tensor([0.0, 1.0]), 20, torch.Generator().manual_seed(0))
    assert made.starts[:, 0].tolist() == [0, 14] and made.distance.tolist() == [17, 3]
    mark = ord(ch06.KEY_MARK)
    assert int(made.inputs[0, 0]) == mark and int(made.inputs[1, 14]) == mark
    assert int(made.inputs[1, 17]) == mark  # the question follows the record at depth 1


def test_key_batch_refuses_records_that_do_not_fit():
    generator = torch.Generator().manual_seed(0)
    ch06.key_batch(HELD_OUT_TEXT, torch.tensor([0.5]), 20, generator, keys=5)  # 15 bytes of records fit
    with pytest.raises(ValueError, match="do not fit"):
        ch06.key_batch(HELD_OUT_TEXT, torch.tensor([0.5]), 20, generator, keys=6)
    with pytest.raises(ValueError, match="keys"):
        ch06.key_batch(HELD_OUT_TEXT, torch.tensor([0.5]), 64, generator, keys=11)


@pytest.mark.slow  # trains a model
def test_train_with_keys_is_reproducible_and_learns():
    losses = []
    for _ in range(2):
        model = rotary(context=32, d_model=16, heads=2)
        losses.append(ch06.train_with_keys(model, TRAIN_TEXT[:20_000], steps=25, batch_size=8, length=32,
                                           key_share=0.5, learning_rate=3e-3, seed=1, max_keys=3))
    assert losses[0] == losses[1]
    assert losses[0][-1] < losses[0][0] - 1.0
    assert not model.training


def test_train_with_keys_loss_is_text_mean_plus_answer_mean():
    """Equation 11.1, recomputed from the first batch the loop draws."""
    model = rotary(context=32, d_model=16, heads=2)
    reference = copy.deepcopy(model).train()
    data = TRAIN_TEXT[:10_000]
    first = ch06.train_with_keys(model, data, steps=1, batch_size=8, length=32, key_share=0.5,
                                 learning_rate=1e-9, seed=7, max_keys=3)[0]
    generator = torch.Generator().manual_seed(7)
    text_in, text_out = ch02.sample_batch(data, 4, 32, generator)
    parts = [(text_in, text_out, torch.zeros_like(text_in, dtype=torch.bool))]
    for keys in (1, 3):
        depths = torch.rand(2, generator=generator, dtype=torch.float64)
        keyed = ch06.key_batch(data, depths, 32, generator, keys=keys)  # the evaluation's generator
        assert keyed.answers.sum(1).tolist() == [1, 1] and bool(keyed.answers[:, -1].all())  # one asked
        parts.append(keyed[:3])
    inputs, targets, answers = (torch.cat(column) for column in zip(*parts, strict=True))
    assert int(answers.sum()) == 4
    with torch.no_grad():
        per_target = torch.nn.functional.cross_entropy(reference(inputs).transpose(1, 2), targets, reduction="none")
    expected = per_target[~answers].mean() + per_target[answers].mean()
    assert math.isclose(first, expected.item(), rel_tol=1e-5)


def test_train_with_keys_without_keys_is_plain_next_byte_loss():
    model = rotary(context=12, d_model=16, heads=2)
    losses = ch06.train_with_keys(model, TRAIN_TEXT[:10_000], steps=2, batch_size=4, length=12, key_share=0.0,
                                  learning_rate=1e-3, seed=0)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)


# --- the measurements ----------------------------------------------------------------------------


def test_position_losses_end_every_length_on_the_same_bytes():
    model = rotary(context=8)
    data = HELD_OUT_TEXT[:3_000]
    long = ch06.position_losses(model, data, length=40, windows=5, span=40)
    short = ch06.position_losses(model, data, length=10, windows=5, span=40)
    assert long.shape == (5, 40) and short.shape == (5, 10)
    end = round(40 + 2 * (3_000 - 40 - 2) / 4)  # window 2 ends at byte e_2 for both lengths
    with torch.no_grad():
        for losses, length in ((long, 40), (short, 10)):
            logits = model(data[end - length:end][None])
            expected = torch.nn.functional.cross_entropy(logits[0], data[end - length + 1:end + 1],
                                                         reduction="none")
            assert torch.allclose(losses[2], expected, atol=1e-5)
    assert not torch.allclose(long[:, -10:], short)  # same bytes, more context: another loss


def test_key_hits_counts_argmax_answers_on_shared_windows():
    model = rotary(context=32)
    hits = ch06.key_hits(model, HELD_OUT_TEXT, length=40, depths=(0.0, 0.5, 1.0), trials=5, seed=3, keys=3,
                         chunk=4)
    assert hits.shape == (3, 5) and hits.dtype == torch.bool
    made = ch06.key_batch(HELD_OUT_TEXT, torch.tensor([0.0, 0.5, 1.0]).repeat_interleave(5), 40,
                          torch.Generator().manual_seed(3), keys=3)
    trials = ch06.key_trials(HELD_OUT_TEXT, length=40, depths=(0.0, 0.5, 1.0), trials=5, seed=3, keys=3)
    assert all(torch.equal(a, b) for a, b in zip(made, trials, strict=True))
    with torch.no_grad():
        guesses = model(made.inputs)[:, -1].argmax(-1)
    assert torch.equal(ch06.key_guesses(model, trials, chunk=7), guesses)
    assert torch.equal(hits.flatten(), guesses == made.targets[:, -1])


class _Oracle(ch06.RotaryGPT):
    """Answers every question: the byte after the earlier mark-and-name that the question repeats."""

    def forward(self, tokens, cache=None):
        logits = torch.zeros(*tokens.shape, 256)
        for row, sequence in enumerate(tokens.tolist()):
            name = sequence[-2]  # the question: mark, name, ask
            where = next(i for i in range(len(sequence) - 3) if sequence[i:i + 2] == [ord(ch06.KEY_MARK), name])
            logits[row, -1, sequence[where + 2]] = 1.0
        return logits


class _Nearest(ch06.RotaryGPT):
    """Answers with the value of the record nearest the question, whatever its name."""

    def forward(self, tokens, cache=None):
        logits = torch.zeros(*tokens.shape, 256)
        for row, sequence in enumerate(tokens.tolist()):
            where = max(i for i in range(len(sequence) - 3) if sequence[i] == ord(ch06.KEY_MARK))  # not the question
            logits[row, -1, sequence[where + 2]] = 1.0
        return logits


def test_a_model_that_matches_names_finds_every_key_and_one_that_copies_the_nearest_does_not():
    config = ch02.GPTConfig(vocab_size=256, context_length=8, d_model=8, layers=1, heads=2)
    depths = (0.0, 0.3, 1.0)
    for keys in (1, 4):
        assert bool(ch06.key_hits(_Oracle(config), HELD_OUT_TEXT, length=60, depths=depths, trials=7, seed=0,
                                  keys=keys).all())
    nearest = ch06.key_hits(_Nearest(config), HELD_OUT_TEXT, length=60, depths=depths, trials=20, seed=0, keys=4)
    assert bool(nearest[-1].all()) and nearest[0].float().mean() < 0.5  # distractors fool it far back


def test_answer_kinds_and_the_name_blind_baselines_on_a_constructed_batch():
    """Three windows, three records each (column 0 asked), values chosen by hand."""
    digit = [ord(c) for c in ch06.KEY_SYMBOLS]
    values = torch.tensor([[digit[1], digit[2], digit[3]], [digit[4], digit[4], digit[5]], [digit[1], digit[6], digit[7]]])
    starts = torch.tensor([[0, 10, 5], [20, 3, 9], [4, 8, 12]])  # the nearest records: 1, 0, 2
    batch = ch06.KeyBatch(torch.zeros(3, 30, dtype=torch.long), torch.zeros(3, 30, dtype=torch.long),
                          torch.zeros(3, 30, dtype=torch.bool), starts, values)
    guesses = torch.tensor([digit[1], digit[5], digit[9]])  # asked; a distractor's value; neither
    assert ch06.answer_kinds(batch, guesses).tolist() == [0, 1, 2]
    assert ch06.answer_kinds(batch, values[:, 1]).tolist() == [1, 0, 1]  # row 1: a distractor shares the answer
    assert ch06.baseline(batch, "nearest record", torch.Generator()).tolist() == [digit[2], digit[4], digit[7]]
    assert ch06.baseline(batch, "most frequent", torch.Generator()).tolist() == [digit[1]] * 3
    drawn = torch.stack([ch06.baseline(batch, "random record", torch.Generator().manual_seed(s)) for s in range(300)])
    for row in range(3):  # a planted value every time, each record about a third of the time
        assert set(drawn[:, row].tolist()) <= set(values[row].tolist())
    assert 0.25 < (drawn[:, 0] == values[0, 0]).float().mean() < 0.42


def test_random_record_baseline_scores_what_the_construction_predicts():
    """Copying a random record of k: right with probability 1/k + (1 - 1/k) / 10 (a value shared by chance)."""
    trials = ch06.key_trials(HELD_OUT_TEXT, length=64, depths=(0.0, 0.5, 1.0), trials=400, seed=5, keys=4)
    score = (ch06.baseline(trials, "random record", torch.Generator().manual_seed(0)) == trials.values[:, 0])
    expected = 1 / 4 + (3 / 4) / 10
    assert abs(score.float().mean().item() - expected) < 3 * math.sqrt(expected * (1 - expected) / 1200)


# --- the statistics ------------------------------------------------------------------------------


def test_holm_multiplies_the_sorted_p_values_and_keeps_them_in_order():
    assert ch06.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert ch06.holm([0.3, 0.9]) == pytest.approx([0.6, 0.9]) and ch06.holm([]) == []
    assert ch06.holm([0.2, 0.2, 0.2]) == pytest.approx([0.6, 0.6, 0.6])


@pytest.mark.parametrize(("dof", "expected"), [(1, 12.7062), (2, 4.3027), (10, 2.2281), (30, 2.0423)])
def test_student_t_quantile_golden_values(dof, expected):
    assert ch06.student_t_quantile(0.975, dof) == pytest.approx(expected, abs=2e-4)


def test_mcnemar_counts_discordant_pairs_and_gives_the_exact_binomial_p():
    first = torch.tensor([True] * 10 + [False] * 2 + [True] * 30 + [False] * 5)
    second = torch.tensor([False] * 10 + [True] * 2 + [True] * 30 + [False] * 5)
    only_first, only_second, p = ch06.mcnemar(first, second)
    assert (only_first, only_second) == (10, 2)
    assert p == pytest.approx(2 * (1 + 12 + 66) / 2**12)
    assert ch06.mcnemar(first, first) == (0, 0, 1.0)
    assert ch06.mcnemar(second, first)[:2] == (2, 10)


def test_seed_window_interval_adds_the_spread_between_seeds():
    generator = torch.Generator().manual_seed(0)
    windows = torch.randn(1, 40, generator=generator, dtype=torch.float64)
    mean, low, high = ch06.seed_window_interval(windows)
    half = ch06.student_t_quantile(0.975, 39) * windows.std().item() / math.sqrt(40)
    assert mean == pytest.approx(windows.mean().item()) and high - mean == pytest.approx(half)
    same = windows.repeat(3, 1)  # three seeds that agree: only the windows' luck
    shifted = same + torch.tensor([[-0.5], [0.0], [0.5]], dtype=torch.float64)  # seeds that do not
    narrow, wide = ch06.seed_window_interval(same), ch06.seed_window_interval(shifted)
    assert narrow[0] == pytest.approx(wide[0])
    assert wide[2] - wide[1] > narrow[2] - narrow[1] + 1.0


def test_matched_base_reproduces_the_reference_and_gives_a_small_model_its_share():
    config = ch03.load_model_config("llama-2-7b")
    dim = config["hidden_size"] // config["num_attention_heads"]
    assert ch06.matched_base(4096, reference_base=10_000.0, reference_length=4096) == pytest.approx(10_000.0)
    base = ch06.matched_base(64, reference_base=config["rope_theta"],
                             reference_length=config["max_position_embeddings"])
    assert 26 < base < 28
    llama = ch06.turning_bands(dim, config["rope_theta"], config["max_position_embeddings"]) / (dim // 2)
    ours = ch06.turning_bands(32, round(base), 64) / 16
    toy = ch06.turning_bands(32, 10_000.0, 64) / 16
    assert abs(ours - llama) < 0.05 < abs(toy - llama)
    assert ch06.turning_bands(32, 10_000.0, 64) == 5  # bands 0..4: wavelength 2 pi b^(2j/32) <= 64


# --- the experiment ------------------------------------------------------------------------------


@pytest.mark.slow  # trains a model
def test_experiment_at_tiny_size_has_every_model_and_measurement_and_repeats_exactly():
    import experiments.extension as runner

    tiny = runner.TINY
    first = runner.run_job(tiny, 0, 27.0, True)
    second = runner.run_job(tiny, 0, 27.0, True)
    assert first["train_losses"] == second["train_losses"]
    assert len(first["train_losses"]) == tiny.short_steps + tiny.steps  # the curriculum's two parts
    assert first["evaluations"] == second["evaluations"]
    assert first["passed"] == runner.passes_gate(first["gate_score"], tiny.gate)  # the gate as written
    kinds = {(e["model"], e["method"], e["length"]) for e in first["evaluations"]}
    recipes = (*tiny.methods, *tiny.variants)
    expected = {("as-is", m, n) for m in recipes for n in tiny.lengths}
    expected |= {("fine-tuned", m, n) for m in tiny.methods for n in tiny.lengths}
    expected |= {("control-short", m, n) for m in tiny.methods for n in tiny.lengths}  # each recipe as-is
    assert kinds == expected and len(first["evaluations"]) == len(expected)
    for kind, method in {(f["model"], f["method"]) for f in first["finetunes"]}:
        sweep = [f for f in first["finetunes"] if (f["model"], f["method"]) == (kind, method)]
        assert [f["rate"] for f in sweep] == list(tiny.finetune_rates)
        best = min(sweep, key=lambda f: f["validation"]["loss"])  # chosen on the validation split
        assert [f["chosen"] for f in sweep] == [f is best for f in sweep]
        used = {e["rate"] for e in first["evaluations"] if (e["model"], e["method"]) == (kind, method)}
        assert used == {best["rate"]}
    trials = tiny.trials * len(tiny.depths)
    described = {(t["task"], t["length"]): t for t in first["trials"]}
    assert set(described) == {(task, n) for task in runner.TASKS for n in tiny.lengths}
    for entry in first["evaluations"]:
        assert len(entry["window_loss"]) == len(entry["tail_loss"]) == tiny.windows
        for task in runner.TASKS:
            guesses, kinds_text = entry["key_guesses"][task], entry["answer_kinds"][task]
            assert len(entry[task]) == len(guesses) == len(kinds_text) == trials
            answers = described[task, entry["length"]]["answer"]
            assert entry[task] == "".join("1" if g == a else "0" for g, a in zip(guesses, answers, strict=True))
            assert [k == "0" for k in kinds_text] == [b == "1" for b in entry[task]]  # asked <=> hit
        assert ("position_loss" in entry) == (entry["length"] == max(tiny.lengths))
        expected_factor = (max(tiny.lengths) / tiny.trained_length if entry["model"] == "fine-tuned"
                           else entry["length"] / tiny.trained_length)
        assert entry["factor"] == expected_factor
    for record in first["trials"]:
        assert len(record["distance"]) == len(record["answer"]) == trials
        assert set(record["baselines"]) == set(ch06.BASELINES)
        assert record["distance"] == sorted(record["distance"], reverse=True) or len(tiny.depths) == 1
    at_t0 = [e["window_loss"] for e in first["evaluations"]
             if e["model"] == "as-is" and e["length"] == tiny.trained_length]
    assert all(row == at_t0[0] for row in at_t0)  # at factor 1 every recipe is plain RoPE
    as_is_only = runner.run_job(tiny, 0, 10_000.0, False)
    assert {e["model"] for e in as_is_only["evaluations"]} == {"as-is"} and not as_is_only["finetunes"]
    json.dumps(first)  # plain numbers only


def test_the_gate_admits_a_seed_at_the_threshold_and_refuses_one_below():
    import experiments.extension as runner

    gate = runner.ExtensionSettings().gate
    assert runner.passes_gate(gate, gate) and runner.passes_gate(1.0, gate)
    assert not runner.passes_gate(gate - 1e-9, gate) and not runner.passes_gate(0.0, gate)


def test_validation_and_test_text_are_disjoint_halves_of_the_held_out_text():
    import experiments.extension as runner

    held_out = torch.arange(100)
    validation, test = runner.split_text(held_out, 0.25)
    assert torch.equal(torch.cat([validation, test]), held_out) and validation.numel() == 25


def test_first_position_mass_leaves_the_pass_unchanged_and_matches_a_direct_computation():
    import experiments.extension as runner

    model = rotary(context=8, d_model=16, layers=1, heads=2, fused=True)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(tokens)
        mass = runner.first_position_mass(model, tokens, skip=4)
        assert torch.equal(model(tokens), before)  # the hook is gone
        layer = model.blocks[0].attention
        x = model.blocks[0].attention_norm(model.token_embedding(tokens))  # no position table
        positions = torch.arange(20)
        q = ch03.apply_rope(ch01.split_heads(layer.query(x), 2), positions, layer.frequencies)
        k = ch03.apply_rope(ch01.split_heads(layer.key(x), 2), positions, layer.frequencies)
        _, weights = ch01.scaled_dot_product_attention(q, k, q, ch01.causal_mask(20))
    assert len(mass) == 1 and 0 < mass[0] < 1
    assert mass[0] == pytest.approx(weights[:, :, 4:, 0].mean().item(), abs=1e-4)


@pytest.mark.slow  # trains a model
def test_experiment_command_runs_end_to_end_at_tiny_size(tmp_path):
    out = tmp_path / "extension-tiny.json"
    done = subprocess.run([sys.executable, "-m", "experiments", "extension", "--size", "tiny", "--quiet",
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    machine = results["machine"]
    assert machine["mode"] == "tiny" and machine["date"].endswith("Z")
    assert 0 < machine["cpu_seconds"] <= machine["wall_seconds"] * os.cpu_count()  # its own processes' time
    assert [(r["seed"], r["base"]) for r in results["runs"]] == [(0, 27.0), (1, 27.0), (0, 10_000.0)]
    assert results["passed"] == [r["seed"] for r in results["runs"][:2] if r["passed"]]
    first_base = {e["model"] for e in results["runs"][0]["evaluations"]}
    assert first_base == {"as-is", "fine-tuned", "control-short"}
    assert {e["model"] for e in results["runs"][2]["evaluations"]} == {"as-is"}
    assert f"wrote {out}" in done.stdout


def test_experiment_command_refuses_bad_arguments(capsys):
    from experiments.__main__ import main, parse_args

    assert main(["extension", "--jobs", "0"]) == 2
    assert main(["extension", "--seeds", "-1", "--size", "tiny"]) == 2
    assert "--jobs must be" in capsys.readouterr().err
    for argv in (["extension", "--size", "huge"], ["stretching"], []):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_saved_results_hold_everything_the_chapter_reads():
    import experiments.extension as runner

    results, path = support.load_results("extension")
    assert path.name.startswith("extension-") and results["machine"]["mode"] == "full"
    settings = results["settings"]
    defaults = json.loads(json.dumps(dataclasses.asdict(runner.ExtensionSettings())))
    assert settings == defaults  # the defaults made this run
    assert len(settings["seeds"]) >= 5 and len(settings["finetune_rates"]) >= 3
    assert max(settings["finetune_rates"]) >= 3e-3
    assert tuple(settings["methods"]) == ch03.ROPE_METHODS
    main = [run for run in results["runs"] if run["base"] == settings["bases"][0]]
    assert [run["seed"] for run in main] == settings["seeds"]
    assert results["passed"] == [run["seed"] for run in main if run["gate_score"] >= settings["gate"]]
    for run in main:
        kinds = {(e["model"], e["method"]) for e in run["evaluations"]}
        assert {("fine-tuned", m) for m in settings["methods"]} <= kinds
        assert {("control-short", m) for m in settings["methods"]} <= kinds
        assert all(len(e["key_guesses"]["single"]) == len(e["single"]) for e in run["evaluations"])
    others = [run for run in results["runs"] if run["base"] == settings["bases"][-1]]
    assert [run["seed"] for run in others] == settings["other_seeds"]
    machine = results["machine"]
    assert 0 < machine["cpu_seconds"] <= machine["wall_seconds"] * os.cpu_count()  # its own processes' time
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3


# --- bad input at the boundary -------------------------------------------------------------------


def test_rotary_model_refuses_bad_settings():
    """The constructor is the boundary; ``forward`` leaves ids and shapes to PyTorch, as TinyGPT's does."""
    config = ch02.GPTConfig(vocab_size=256, context_length=8, d_model=16, heads=2)
    with pytest.raises(ValueError, match="base"):
        ch06.RotaryGPT(config, base=1.0)
    with pytest.raises(TypeError, match="fused"):
        ch06.RotaryGPT(config, fused=1)
    with pytest.raises(ValueError, match="rotary head width d_model / heads must be even"):
        ch06.RotaryGPT(ch02.GPTConfig(vocab_size=256, d_model=12, heads=4))  # head width 3


def test_set_rope_refuses_what_would_be_silently_wrong():
    """set_rope is where a recipe enters; set_bands takes what it computes and checks nothing."""
    model = rotary(context=8)
    with pytest.raises(ValueError, match="method"):
        model.set_rope("alibi")
    with pytest.raises(ValueError, match="factor"):
        model.set_rope("pi", 0.5)


def test_training_refuses_bad_input():
    model = rotary(context=32)
    good = dict(steps=1, batch_size=4, length=32, key_share=0.5, learning_rate=1e-3, seed=0)
    for name, value, error in (("key_share", 1.5, ValueError), ("steps", 0, ValueError),
                               ("learning_rate", 0.0, ValueError), ("batch_size", 1, ValueError),
                               ("length", 6, ValueError), ("seed", -1, ValueError), ("max_keys", 11, ValueError),
                               ("steps", 1.0, TypeError)):
        with pytest.raises(error, match=name):
            ch06.train_with_keys(model, TRAIN_TEXT, **{**good, name: value})
    with pytest.raises(TypeError, match="model"):
        ch06.train_with_keys(ch02.TinyGPT(model.config), TRAIN_TEXT, **good)
    with pytest.raises(ValueError, match="text"):
        ch06.train_with_keys(model, TRAIN_TEXT[:20], **good)


@pytest.mark.parametrize(("field", "value", "error"), [
    ("trained_length", 4, ValueError), ("trained_length", 8.0, TypeError), ("factors", (), ValueError),
    ("factors", "12", TypeError), ("factors", (1, 1), ValueError), ("factors", (2, 4), ValueError),
    ("depths", (0.0, 1.5), ValueError), ("methods", ("rope", "alibi"), ValueError), ("seeds", (-1,), ValueError),
    ("key_share", 2.0, ValueError), ("learning_rate", 0.0, ValueError), ("finetune_rates", (0.0,), ValueError),
    ("fused", "yes", TypeError), ("heads", 3, ValueError), ("windows", 1, ValueError), ("bases", (1.0,), ValueError),
    ("max_keys", 11, ValueError), ("tail", 65, ValueError), ("gate", 1.5, ValueError),
    ("validation_share", 1.0, ValueError), ("short_length", 100, ValueError), ("variants", ("yarn-hot",), ValueError),
    ("other_seeds", (-2,), ValueError),
])
def test_experiment_settings_refuse_bad_fields(field, value, error):
    import experiments.extension as runner

    with pytest.raises(error, match=field if field != "learning_rate" else "learning_rate"):
        runner.ExtensionSettings(**{field: value})


def test_experiment_refuses_settings_of_the_wrong_type():
    import experiments.extension as runner

    with pytest.raises(TypeError, match="settings"):
        runner.run_experiment({"steps": 1})
    with pytest.raises(ValueError, match="jobs"):
        runner.run_experiment(runner.TINY, jobs=0)
