"""Tests for Chapter 6 (chapters/ch06-extension.qmd): the rotary TinyGPT, the planted-key task, the
measurements, the experiment and its command line, and every refusal of bad input."""

from __future__ import annotations

import copy
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from longctx import ch01, ch02, ch03, ch06

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
    frequencies, magnitude = ch03.inverse_frequencies(16, method=method, factor=factor, original_context=16,
                                                      **ch06.RECIPE_SETTINGS.get(method, {}))
    for block in model.blocks:
        assert torch.equal(block.attention.frequencies, frequencies)
        assert block.attention.magnitude == magnitude
    assert model.rope == (method, factor)


def test_recipe_settings_match_the_shipped_llama_config_and_ch03_defaults():
    scaling = ch03.load_model_config("llama-3.1-8b")["rope_scaling"]
    assert ch06.RECIPE_SETTINGS["llama3"] == {
        "low_freq_factor": scaling["low_freq_factor"], "high_freq_factor": scaling["high_freq_factor"]}
    plain, _ = ch03.inverse_frequencies(32, method="yarn", factor=8, original_context=64)
    ours, _ = ch06.recipe_bands("yarn", 32, factor=8, original_context=64)
    assert torch.equal(plain, ours)  # the settings are the paper's defaults, which ch03 also uses


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
        assert torch.allclose(fused(tokens[:, 20:], cache_b), teaching(tokens[:, 20:], cache_a), atol=1e-5)


def test_rotary_model_trains_on_chapter_2_machinery():
    """Chapter 2's train loop runs on the rotary model unchanged, and the loss falls."""
    model = rotary(context=16, d_model=16, heads=2)
    losses = ch02.train(model, TOKENS[:5_000], steps=30, batch_size=8, learning_rate=3e-3, seed=0, progress=False)
    assert losses[-1] < losses[0] - 1.0


# --- the planted key -----------------------------------------------------------------------------


@FAST
@given(length=st.integers(4, 100), batch=st.integers(1, 6), seed=st.integers(0, 1_000))
def test_passkey_batch_plants_one_key_at_its_depth_and_asks_for_it(length, batch, seed):
    generator = torch.Generator().manual_seed(seed)
    depths = torch.rand(batch, generator=generator, dtype=torch.float64)
    inputs, targets = ch06.passkey_batch(TOKENS, depths, length, torch.Generator().manual_seed(seed))
    assert inputs.shape == targets.shape == (batch, length)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one
    mark = ord(ch06.KEY_MARK)
    for row in range(batch):
        where = round(float(depths[row]) * (length - 3))
        marks = (inputs[row] == mark).nonzero().flatten().tolist()
        assert marks == [where, length - 1]
        digit = int(targets[row, -1])
        assert chr(digit).isdigit() and int(inputs[row, where + 1]) == digit


def test_passkey_batch_depth_zero_and_one_sit_at_the_ends():
    inputs, _ = ch06.passkey_batch(TOKENS, torch.tensor([0.0, 1.0]), 10, torch.Generator().manual_seed(0))
    mark = ord(ch06.KEY_MARK)
    assert int(inputs[0, 0]) == mark and int(inputs[1, 7]) == mark and int(inputs[1, 9]) == mark


def test_the_corpus_never_uses_the_key_mark():
    assert ord(ch06.KEY_MARK) not in set(TOKENS.tolist())


def test_train_with_keys_is_reproducible_and_learns():
    losses = []
    for _ in range(2):
        model = rotary(context=16, d_model=16, heads=2)
        losses.append(ch06.train_with_keys(model, TOKENS[:20_000], steps=25, batch_size=8, length=16,
                                           key_share=0.5, learning_rate=3e-3, seed=1))
    assert losses[0] == losses[1]
    assert losses[0][-1] < losses[0][0] - 1.0
    assert not model.training


def test_train_with_keys_loss_is_text_mean_plus_answer_mean():
    """Equation 6.1, recomputed from the first batch the loop draws."""
    model = rotary(context=12, d_model=16, heads=2)
    reference = copy.deepcopy(model).train()
    data = TOKENS[:10_000]
    first = ch06.train_with_keys(model, data, steps=1, batch_size=6, length=12, key_share=0.5,
                                 learning_rate=1e-9, seed=7)[0]
    generator = torch.Generator().manual_seed(7)
    text_in, text_out = ch02.sample_batch(data, 3, 12, generator)
    depths = torch.rand(3, generator=generator, dtype=torch.float64)
    key_in, key_out = ch06.passkey_batch(data, depths, 12, generator)
    with torch.no_grad():
        text_loss = torch.nn.functional.cross_entropy(reference(torch.cat([text_in, key_in[:, :]])).transpose(1, 2),
                                                      torch.cat([text_out, key_out]), reduction="none")
    answers = text_loss[3:, -1]
    text = torch.cat([text_loss[:3].flatten(), text_loss[3:, :-1].flatten()])
    assert math.isclose(first, (text.mean() + answers.mean()).item(), rel_tol=1e-5)


def test_train_with_keys_without_keys_is_plain_next_byte_loss():
    model = rotary(context=12, d_model=16, heads=2)
    losses = ch06.train_with_keys(model, TOKENS[:10_000], steps=2, batch_size=4, length=12, key_share=0.0,
                                  learning_rate=1e-3, seed=0)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)


# --- the measurements ----------------------------------------------------------------------------


def test_position_losses_match_cross_entropy_and_share_windows_across_lengths():
    model = rotary(context=8)
    data = TOKENS[:3_000]
    long = ch06.position_losses(model, data, length=40, windows=5, span=40)
    short = ch06.position_losses(model, data, length=10, windows=5, span=40)
    assert long.shape == (5, 40) and short.shape == (5, 10)
    assert torch.allclose(long[:, :10], short, atol=1e-5)  # prefixes of the same windows, causal model
    start = round((3_000 - 40 - 1) * 2 / 4)
    with torch.no_grad():
        logits = model(data[start:start + 40][None])
    expected = torch.nn.functional.cross_entropy(logits[0], data[start + 1:start + 41], reduction="none")
    assert torch.allclose(long[2], expected, atol=1e-5)


def test_passkey_hits_counts_argmax_answers():
    model = rotary(context=8)
    hits = ch06.passkey_hits(model, TOKENS, length=16, depths=(0.0, 0.5, 1.0), trials=5, seed=3, chunk=4)
    assert hits.shape == (3, 5) and hits.dtype == torch.bool
    inputs, targets = ch06.passkey_batch(TOKENS, torch.tensor([0.0, 0.5, 1.0]).repeat_interleave(5), 16,
                                         torch.Generator().manual_seed(3))
    with torch.no_grad():
        guesses = model(inputs)[:, -1].argmax(-1)
    assert torch.equal(hits.flatten(), guesses == targets[:, -1])


class _Oracle(ch06.RotaryGPT):
    """Answers every key correctly: the logit of the digit after the first mark is the largest."""

    def forward(self, tokens, cache=None):
        logits = torch.zeros(*tokens.shape, 256)
        first = (tokens == ord(ch06.KEY_MARK)).int().argmax(-1)
        digit = tokens[torch.arange(len(tokens)), first + 1]
        logits[torch.arange(len(tokens)), -1, digit] = 1.0
        return logits


def test_a_perfect_model_hits_every_key():
    config = ch02.GPTConfig(vocab_size=256, context_length=8, d_model=8, layers=1, heads=2)
    hits = ch06.passkey_hits(_Oracle(config), TOKENS, length=30, depths=(0.0, 0.3, 1.0), trials=7, seed=0)
    assert bool(hits.all())


@pytest.mark.parametrize(("hits", "trials", "low", "high"), [
    (0, 48, 0.0, 0.07410), (48, 48, 0.92590, 1.0), (24, 48, 0.36389, 0.63611), (1, 10, 0.01788, 0.40416)])
def test_wilson_interval_golden_values(hits, trials, low, high):
    got = ch06.wilson_interval(hits, trials)
    assert got[0] == pytest.approx(low, abs=1e-5) and got[1] == pytest.approx(high, abs=1e-5)


@FAST
@given(trials=st.integers(1, 500), data=st.data())
def test_wilson_interval_holds_the_estimate_inside_zero_one(trials, data):
    hits = data.draw(st.integers(0, trials))
    low, high = ch06.wilson_interval(hits, trials)
    assert 0.0 <= low <= hits / trials <= high <= 1.0
    assert (low == 0.0) == (hits == 0) and (high == 1.0) == (hits == trials)


# --- the experiment ------------------------------------------------------------------------------

TINY = ch06.ExtensionSettings(trained_length=8, factors=(1, 2), d_model=8, layers=1, heads=2, steps=3,
                              batch_size=4, finetune_steps=2, windows=2, depths=(0.0, 1.0), trials=3,
                              seeds=(0,))


def test_experiment_at_tiny_size_has_every_measurement_and_repeats_exactly():
    first = ch06.run_extension_experiment(TINY, progress=False)
    second = ch06.run_extension_experiment(TINY, progress=False)
    assert first["lengths"] == [8, 16] and first["finetune_batch"] == 2
    (run,) = first["runs"]
    assert len(run["train_losses"]) == 3 and set(run["finetune"]) == set(TINY.methods)
    keys = {(e["method"], e["variant"], e["length"]) for e in run["evaluations"]}
    assert keys == {(m, v, n) for m in TINY.methods for v in ("as-is", "fine-tuned") for n in (8, 16)}
    for entry in run["evaluations"]:
        assert len(entry["position_loss"]) == entry["length"] and len(entry["window_loss"]) == 2
        assert all(0 <= h <= 3 for h in entry["hits"]) and len(entry["hits"]) == 2
        expected = entry["length"] / 8 if entry["variant"] == "as-is" else 2.0
        assert entry["factor"] == expected
    strip = [[{k: v for k, v in e.items()} for e in r["evaluations"]] for r in (first["runs"][0], second["runs"][0])]
    assert strip[0] == strip[1] and first["runs"][0]["train_losses"] == second["runs"][0]["train_losses"]
    json.dumps(first)  # plain numbers only


def test_as_is_recipes_agree_at_the_trained_length():
    results = ch06.run_extension_experiment(TINY, progress=False)
    at_t0 = [e["position_loss"] for e in results["runs"][0]["evaluations"]
             if e["variant"] == "as-is" and e["length"] == 8]
    assert len(at_t0) == len(TINY.methods) and all(row == at_t0[0] for row in at_t0)


def test_experiment_command_runs_end_to_end_at_tiny_size(tmp_path):
    out = tmp_path / "extension-tiny.json"
    done = subprocess.run([sys.executable, "-m", "experiments", "--size", "tiny", "--threads", "1", "--quiet",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    machine = results["machine"]
    assert machine["mode"] == "tiny" and machine["threads"] == 1 and machine["date"].endswith("Z")
    assert machine["wall_seconds"] > 0 and machine["cpu_seconds"] > 0
    assert results["settings"]["trained_length"] == 8 and results["runs"][0]["evaluations"]
    assert f"wrote {out}" in done.stdout


def test_experiment_command_refuses_bad_arguments():
    import experiments.extension as cli

    assert cli.main(["--threads", "0"]) == 2
    assert cli.main(["--seeds", "-1", "--size", "tiny"]) == 2
    with pytest.raises(SystemExit):
        cli.parse_args(["--size", "huge"])


def test_saved_results_cover_every_recipe_the_chapter_reads():
    results, path = ch06.load_extension_results()
    assert path.name.startswith("extension-") and results["machine"]["mode"] == "full"
    settings = results["settings"]
    assert settings["factors"] == [1, 2, 4, 8] and settings["trained_length"] == 64
    for run in results["runs"]:
        found = {(e["method"], e["variant"], e["length"]) for e in run["evaluations"]}
        assert found == {(m, v, 64 * a) for m in settings["methods"] for v in ("as-is", "fine-tuned")
                         for a in settings["factors"]}
    machine = results["machine"]
    assert machine["wall_seconds"] > 0 and machine["cpu_seconds"] > 0
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3
    # a recipe added to Chapter 3 joins the defaults; the saved run must then be redone
    assert tuple(settings["methods"]) == ch03.ROPE_METHODS


def test_the_experiment_runs_every_chapter_3_recipe_with_settings_it_accepts():
    assert ch06.ExtensionSettings().methods == ch03.ROPE_METHODS
    keywords = set(inspect.signature(ch03.inverse_frequencies).parameters)
    for method, extra in ch06.RECIPE_SETTINGS.items():
        assert method in ch03.ROPE_METHODS and set(extra) <= keywords


def test_load_extension_results_prefers_the_newest_full_run(tmp_path):
    def write(name, mode, date):
        (tmp_path / name).write_text(json.dumps({"machine": {"mode": mode, "date": date}, "tag": name}))

    write("extension-a.json", "full", "2026-01-01T00:00:00Z")
    write("extension-b.json", "full", "2026-02-01T00:00:00Z")
    write("extension-c-tiny.json", "tiny", "2026-03-01T00:00:00Z")
    results, path = ch06.load_extension_results(tmp_path)
    assert results["tag"] == "extension-b.json" and path.name == "extension-b.json"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="make experiment"):
        ch06.load_extension_results(tmp_path / "empty")
    with pytest.raises(ValueError, match="folder must be an existing folder"):
        ch06.load_extension_results(tmp_path / "missing")
    with pytest.raises(TypeError, match="folder"):
        ch06.load_extension_results(str(tmp_path))


# --- bad input -----------------------------------------------------------------------------------


def test_rotary_model_refuses_bad_input():
    model = rotary(context=8)
    with pytest.raises(TypeError, match="tokens"):
        model(torch.zeros(1, 4))
    with pytest.raises(TypeError, match="tokens"):
        model([[1, 2]])
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="0..255"):
        model(torch.full((1, 3), 256))
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(2, 3, dtype=torch.long), model.new_cache(batch=1))
    with pytest.raises(TypeError, match="cache"):
        model(torch.zeros(1, 3, dtype=torch.long), cache="cache")
    with pytest.raises(TypeError, match="RotaryGPT expects|GPTConfig"):
        ch06.RotaryGPT({"vocab_size": 256})
    config = ch02.GPTConfig(vocab_size=256, context_length=8, d_model=16, heads=2)
    with pytest.raises(ValueError, match="base"):
        ch06.RotaryGPT(config, base=1.0)
    with pytest.raises(TypeError, match="fused"):
        ch06.RotaryGPT(config, fused=1)
    with pytest.raises(ValueError, match="rotary head width d_model / heads must be even"):
        ch06.RotaryGPT(ch02.GPTConfig(vocab_size=256, d_model=12, heads=4))  # head width 3


def test_set_rope_and_set_bands_refuse_bad_input():
    model = rotary(context=8)
    with pytest.raises(ValueError, match="method"):
        model.set_rope("alibi")
    with pytest.raises(TypeError, match="method"):
        model.set_rope(3)
    with pytest.raises(ValueError, match="factor"):
        model.set_rope("pi", 0.5)
    with pytest.raises(TypeError, match="factor"):
        model.set_rope("pi", "8")
    layer = model.blocks[0].attention
    with pytest.raises(ValueError, match="frequencies"):
        layer.set_bands(torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="frequencies"):
        layer.set_bands(torch.ones(4, dtype=torch.long))
    with pytest.raises(ValueError, match="magnitude"):
        layer.set_bands(torch.ones(4, dtype=torch.float64), 0.0)
    with pytest.raises(ValueError, match="x"):
        layer(torch.zeros(1, 3, 7))
    with pytest.raises(TypeError, match="x"):
        layer(torch.zeros(1, 3, 16, dtype=torch.long))


def test_task_and_measurements_refuse_bad_input():
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="depths"):
        ch06.passkey_batch(TOKENS, torch.tensor([1.5]), 10, generator)
    with pytest.raises(TypeError, match="depths"):
        ch06.passkey_batch(TOKENS, [0.5], 10, generator)
    with pytest.raises(ValueError, match="length"):
        ch06.passkey_batch(TOKENS, torch.tensor([0.5]), 3, generator)
    with pytest.raises(ValueError, match="data"):
        ch06.passkey_batch(TOKENS[:8], torch.tensor([0.5]), 10, generator)
    with pytest.raises(TypeError, match="data"):
        ch06.passkey_batch(TOKENS.float(), torch.tensor([0.5]), 10, generator)
    model = rotary(context=8)
    with pytest.raises(ValueError, match="key_share"):
        ch06.train_with_keys(model, TOKENS, steps=1, batch_size=2, length=8, key_share=1.5,
                             learning_rate=1e-3, seed=0)
    with pytest.raises(ValueError, match="steps"):
        ch06.train_with_keys(model, TOKENS, steps=0, batch_size=2, length=8, key_share=0.5,
                             learning_rate=1e-3, seed=0)
    with pytest.raises(ValueError, match="learning_rate"):
        ch06.train_with_keys(model, TOKENS, steps=1, batch_size=2, length=8, key_share=0.5,
                             learning_rate=0.0, seed=0)
    with pytest.raises(ValueError, match="windows"):
        ch06.position_losses(model, TOKENS, length=8, windows=1)
    with pytest.raises(ValueError, match="span"):
        ch06.position_losses(model, TOKENS, length=8, windows=2, span=4)
    with pytest.raises(ValueError, match="token_ids"):
        ch06.position_losses(model, TOKENS[:10], length=8, windows=4)
    with pytest.raises(ValueError, match="trials"):
        ch06.passkey_hits(model, TOKENS, length=8, depths=(0.5,), trials=0, seed=0)
    with pytest.raises(ValueError, match="depths"):
        ch06.passkey_hits(model, TOKENS, length=8, depths=(), trials=2, seed=0)
    with pytest.raises(ValueError, match="hits"):
        ch06.wilson_interval(5, 4)
    with pytest.raises(ValueError, match="trials"):
        ch06.wilson_interval(0, 0)
    with pytest.raises(TypeError, match="hits"):
        ch06.wilson_interval(0.5, 4)
    with pytest.raises(ValueError, match="z"):
        ch06.wilson_interval(1, 4, z=0)


@pytest.mark.parametrize(("field", "value", "error"), [
    ("trained_length", 2, ValueError), ("trained_length", 8.0, TypeError), ("factors", (), ValueError),
    ("factors", "12", TypeError), ("factors", (1, 1), ValueError), ("factors", (0, 2), ValueError),
    ("depths", (0.0, 1.5), ValueError), ("methods", ("rope", "alibi"), ValueError), ("seeds", (-1,), ValueError),
    ("key_share", 2.0, ValueError), ("learning_rate", 0.0, ValueError), ("fused", "yes", TypeError),
    ("heads", 3, ValueError), ("windows", 1, ValueError), ("base", 1.0, ValueError),
])
def test_experiment_settings_refuse_bad_fields(field, value, error):
    with pytest.raises(error, match=field):
        ch06.ExtensionSettings(**{field: value})


def test_experiment_refuses_settings_of_the_wrong_type():
    with pytest.raises(TypeError, match="settings"):
        ch06.run_extension_experiment({"steps": 1})
    with pytest.raises(TypeError, match="progress"):
        ch06.run_extension_experiment(TINY, progress="yes")
