"""Tests for Chapter 13's drafted tokens (chapters/ch08-serving.qmd, "Drafted tokens, verified in one
step"): the accept rule on hand-made distributions, the papers' expectations, the cache rollback,
the whole loop's output distribution against the target's, and the experiment's driver."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from longctx import ch02, ch08


def chi_square_limit(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile with ``dof`` degrees of freedom at the normal quantile ``z``
    (3.09: a false alarm once in a thousand), by Wilson and Hilferty's cube-root approximation."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probabilities``, and its degrees of freedom;
    cells expected fewer than 5 times are pooled into one."""
    expected = counts.sum() * probabilities.double()
    small = expected < 5
    observed = torch.cat([counts[~small].double(), counts[small].double().sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    return statistic, int(keep.sum()) - 1


def tiny_model(layers: int, seed: int, *, vocab: int = 256, context: int = 32, d_model: int = 8,
               logit_scale: float | None = None) -> ch02.TinyGPT:
    torch.manual_seed(seed)
    model = ch02.TinyGPT(ch02.GPTConfig(vocab_size=vocab, context_length=context, d_model=d_model,
                                        layers=layers, heads=2)).eval()
    if logit_scale is not None:  # far from uniform, so that the two models' distributions differ
        with torch.no_grad():
            model.lm_head.weight.normal_(0, logit_scale, generator=torch.Generator().manual_seed(seed))
    return model


# --- the pieces: probabilities, alpha, the papers' expectations -------------------------------------


def test_token_probabilities_are_the_softmax_and_one_hot_at_temperature_zero():
    logits = torch.tensor([[1.0, 3.0, -2.0], [0.5, 0.0, 0.7]])
    assert torch.allclose(ch08.token_probabilities(logits, 0.5), torch.softmax(logits / 0.5, -1))
    assert torch.equal(ch08.token_probabilities(logits, 0), torch.tensor([[0.0, 1, 0], [0, 0, 1]]))
    with pytest.raises(ValueError, match="temperature"):
        ch08.token_probabilities(logits, -1.0)


def test_alpha_is_one_minus_the_total_variation_distance():
    generator = torch.Generator().manual_seed(1)
    target = torch.rand(5, 7, generator=generator).softmax(-1)
    draft = torch.rand(5, 7, generator=generator).softmax(-1)
    alpha = ch08.acceptance_rate(target, draft)
    assert torch.allclose(alpha, 1 - 0.5 * (target - draft).abs().sum(-1))
    assert torch.allclose(ch08.acceptance_rate(target, target), torch.ones(5))


def test_expected_tokens_and_speedup_are_the_papers_formulas():
    for alpha, k in itertools.product((0.0, 0.3, 0.75, 0.99), (0, 1, 4, 8)):
        assert ch08.expected_tokens(alpha, k) == pytest.approx(sum(alpha**i for i in range(k + 1)))
        assert ch08.expected_speedup(alpha, k, 0.25) == pytest.approx(
            (1 - alpha ** (k + 1)) / ((1 - alpha) * (0.25 * k + 1)))
    assert ch08.expected_tokens(1.0, 5) == 6.0 and ch08.expected_tokens(0.0, 5) == 1.0
    assert ch08.expected_speedup(0.8, 3, 0.0) == pytest.approx(ch08.expected_tokens(0.8, 3))
    with pytest.raises(ValueError, match="alpha"):
        ch08.expected_tokens(1.5, 2)


# --- the accept rule on hand-made distributions -----------------------------------------------------


def test_a_drafted_token_is_kept_with_chance_min_one_ratio_and_replaced_from_the_residual():
    target = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    draft = torch.tensor([[0.9, 0.1, 0.0]])
    generator = torch.Generator().manual_seed(0)
    draws = 20_000
    outcomes = [ch08.speculative_verify(target, draft, torch.tensor([0]), generator) for _ in range(draws)]
    kept = sum(accepted for accepted, _ in outcomes) / draws
    assert abs(kept - 5 / 9) < 4 * math.sqrt(5 / 9 * 4 / 9 / draws)  # min(1, 0.5 / 0.9)
    # a rejection draws from max(0, P - P_hat) = (0, 0.4, 0): always token 1
    assert {token for accepted, token in outcomes if accepted == 0} == {1}
    # once kept, the next token comes from the last row of P, uniform here
    extra = torch.bincount(torch.tensor([token for accepted, token in outcomes if accepted == 1]), minlength=3)
    statistic, dof = chi_square(extra, target[1])
    assert statistic < chi_square_limit(dof)


def test_a_token_the_target_never_writes_is_always_rejected():
    target = torch.tensor([[0.0, 0.6, 0.4], [0.2, 0.3, 0.5]])
    draft = torch.tensor([[0.7, 0.2, 0.1]])
    generator = torch.Generator().manual_seed(3)
    for _ in range(200):
        accepted, token = ch08.speculative_verify(target, draft, torch.tensor([0]), generator)
        assert accepted == 0 and token != 0


def test_equal_distributions_keep_every_drafted_token():
    rows = torch.tensor([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5], [0.0, 1.0]])
    generator = torch.Generator().manual_seed(4)
    for _ in range(200):
        accepted, token = ch08.speculative_verify(rows, rows[:3], torch.tensor([1, 0, 1]), generator)
        assert accepted == 3 and token == 1  # the last row is one-hot


def test_one_verified_token_is_distributed_as_the_target_and_kept_at_rate_alpha():
    """Draft x from P_hat, verify it: the token that comes out is distributed as P (the papers'
    theorem), and x is kept with chance alpha = sum min(P, P_hat)."""
    target = torch.tensor([0.10, 0.40, 0.05, 0.45])
    draft = torch.tensor([0.40, 0.10, 0.30, 0.20])
    generator = torch.Generator().manual_seed(11)
    draws = 30_000
    drafted = torch.multinomial(draft, draws, replacement=True, generator=generator)
    rows = torch.stack([target, target])  # the second row: the token after a kept one
    counts, kept = torch.zeros(4, dtype=torch.long), 0
    for x in drafted.tolist():
        accepted, token = ch08.speculative_verify(rows, draft[None], torch.tensor([x]), generator)
        counts[x if accepted else token] += 1
        kept += accepted
    statistic, dof = chi_square(counts, target)
    assert statistic < chi_square_limit(dof), (counts, statistic)
    alpha = ch08.acceptance_rate(target, draft).item()
    assert abs(kept / draws - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / draws)
    # the test can tell: the drafted tokens themselves are far from P
    assert chi_square(torch.bincount(drafted, minlength=4), target)[0] > chi_square_limit(dof)


def test_tokens_per_step_match_the_geometric_expectation():
    """Each drafted token kept with chance alpha (P puts alpha on the one token P_hat drafts): the
    mean tokens per step is (1 - alpha^(k+1)) / (1 - alpha)."""
    alpha, k, steps = 0.7, 4, 20_000
    target = torch.tensor([[alpha, 1 - alpha]] * (k + 1))
    draft = torch.tensor([[1.0, 0.0]] * k)
    generator = torch.Generator().manual_seed(5)
    emitted = [ch08.speculative_verify(target, draft, torch.zeros(k, dtype=torch.long), generator)[0] + 1
               for _ in range(steps)]
    mean = sum(emitted) / steps
    spread = torch.tensor(emitted, dtype=torch.float64).std().item()
    assert abs(mean - ch08.expected_tokens(alpha, k)) < 4 * spread / math.sqrt(steps)


# --- the cache rollback -----------------------------------------------------------------------------


def test_a_truncated_cache_continues_as_if_the_dropped_tokens_were_never_read():
    model = tiny_model(2, 0)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        model(ids[:, :10], cache)  # 10 read, as after drafting
        ch08.truncate_cache(cache, 6)  # 4 rejected
        assert cache.length == 6 and all(cache.position(layer) == 6 for layer in range(cache.layers))
        fresh = model.new_cache()
        model(ids[:, :6], fresh)
        for mine, theirs in zip(cache.keys + cache.values, fresh.keys + fresh.values, strict=True):
            assert torch.allclose(mine, theirs, atol=1e-6)  # the same keys, up to rounding
        again = model(ids[:, 6:], cache)  # read on from position 6
    assert torch.allclose(again, full[:, 6:], atol=1e-5)
    assert ch08.truncate_cache(cache, 12) is cache and cache.length == 12  # its own length: nothing cut
    with pytest.raises(ValueError, match="length"):
        ch08.truncate_cache(cache, 13)  # cannot grow: that would be a silent no-op


# --- the whole loop ---------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5])
def test_greedy_speculative_decoding_writes_the_targets_greedy_text(k):
    target, draft = tiny_model(2, 0, logit_scale=0.5), tiny_model(1, 1, logit_scale=0.5)
    prompt = [72, 101, 108]
    run = ch08.speculative_generate(target, draft, prompt, 25, k=k, temperature=0)
    assert run.tokens == ch02.generate(target, prompt, 25)
    assert sum(run.accepted) + len(run.accepted) == 25  # each step: its kept tokens and one more
    assert all(0 <= a <= d <= k for a, d in zip(run.accepted, run.drafted, strict=True))
    assert sum(run.accepted) < sum(run.drafted)  # these two models disagree somewhere


def test_a_draft_equal_to_the_target_has_every_token_kept():
    target = tiny_model(2, 0, logit_scale=0.5)
    run = ch08.speculative_generate(target, target, [1, 2], 20, k=3, temperature=1.0, seed=7)
    assert run.accepted == run.drafted and len(run.tokens) == 20
    assert run.drafted[:-1] == [3] * (len(run.drafted) - 1)  # (3 + 1) tokens a step, fewer at the end


def test_the_speculative_samplers_output_is_distributed_as_the_targets():
    """The statistical test with a fixed seed: three tokens over a vocabulary of three, k = 2, so
    that steps keep all (and add one), reject (and resample), and roll both caches back; the
    counts of the 27 texts against the target's exact probabilities of them."""
    target = tiny_model(1, 0, vocab=3, context=8, logit_scale=0.7)
    draft = tiny_model(1, 5, vocab=3, context=8, logit_scale=0.7)
    prompt, samples = [0], 1_500  # against the draft's own texts these score some 700 times the limit
    texts = torch.tensor(list(itertools.product(range(3), repeat=3)))  # (27, 3)
    with torch.no_grad():
        inputs = torch.cat([torch.zeros(27, 1, dtype=torch.long), texts[:, :2]], dim=1)  # (27, 3)
        rows = {name: ch08.token_probabilities(model(inputs), 1.0)  # (27, 3, 3)
                for name, model in (("target", target), ("draft", draft))}
    exact = {name: p.gather(-1, texts[..., None])[..., 0].prod(-1) for name, p in rows.items()}
    index = {tuple(text): i for i, text in enumerate(texts.tolist())}
    counts = torch.zeros(27, dtype=torch.long)
    rejected = 0
    for seed in range(samples):
        run = ch08.speculative_generate(target, draft, prompt, 3, k=2, temperature=1.0, seed=seed)
        counts[index[tuple(run.tokens)]] += 1
        rejected += sum(a < d for a, d in zip(run.accepted, run.drafted, strict=True))
    statistic, dof = chi_square(counts, exact["target"])
    assert statistic < chi_square_limit(dof), (statistic, dof)
    assert rejected > samples // 10  # rejections (and rollbacks) happened often
    # and the test has the power to tell the draft's own distribution from the target's
    draft_statistic, _ = chi_square(counts, exact["draft"])
    assert draft_statistic > 3 * chi_square_limit(dof)


def test_speculative_generate_refuses_what_it_cannot_decode():
    target, draft = tiny_model(1, 0), tiny_model(1, 1, vocab=16)
    with pytest.raises(ValueError, match="draft"):
        ch08.speculative_generate(target, draft, [1], 4, k=2, temperature=0)
    with pytest.raises(ValueError, match="seed"):
        ch08.speculative_generate(target, tiny_model(1, 1), [1], 4, k=2, temperature=1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ch08.speculative_generate(target, tiny_model(1, 1), [1] * 30, 3, k=2, temperature=0)


# --- the saved run's driver -------------------------------------------------------------------------


def test_the_gate_admits_a_better_target_and_refuses_one_that_is_not():
    from experiments import speculative

    settings = speculative.SpeculativeSettings(gate_margin=0.1, gate_baseline=0.3)

    def run(draft: float, target: float) -> dict:
        return {"held_out_loss": {"draft": draft, "target": target}, "unigram_entropy": 3.0}

    assert speculative.passes_gate(run(2.3, 2.1), settings)
    assert not speculative.passes_gate(run(2.3, 2.25), settings)  # target not better by the margin
    assert not speculative.passes_gate(run(2.8, 2.1), settings)  # draft too close to the unigram loss


def test_the_experiment_settings_refuse_a_draft_longer_than_the_text():
    from experiments import speculative

    with pytest.raises(ValueError, match="ks"):
        speculative.SpeculativeSettings(new_tokens=8, ks=(1, 8))
    with pytest.raises(ValueError, match="new_tokens"):
        speculative.SpeculativeSettings(prompt=100, new_tokens=96)


@pytest.mark.slow  # trains two models and times every k: the whole study, small
def test_the_tiny_experiment_measures_every_k_on_the_same_prompts():
    from experiments import speculative

    s = speculative.TINY
    job = speculative.run_job(s, seed=0)
    assert sorted(job["decoded"]) == sorted(str(k) for k in s.ks)
    for k in s.ks:
        entries = job["decoded"][str(k)]
        assert len(entries) == s.prompts
        for entry in entries:
            assert sum(entry["accepted"]) + len(entry["accepted"]) == s.new_tokens
            assert all(a <= d <= k for a, d in zip(entry["accepted"], entry["drafted"], strict=True))
            assert 0 <= entry["alpha_generated"] <= 1
    assert len(job["alpha_text"]) == s.alpha_windows and all(0 <= a <= 1 for a in job["alpha_text"])
    assert sorted(job["decode"]["speedup"]) == sorted(str(k) for k in s.ks)
    assert set(job["decode"]["seconds"]) == {"plain"} | {f"k{k}" for k in s.ks}
    assert all(len(v) == s.rounds for v in job["decode"]["seconds"].values())
    assert sorted(job["costs"]["verify"]) == sorted(str(k) for k in s.ks)
    assert job["costs"]["cost"]["of"] == "draft" and job["costs"]["cost"]["ratio"] > 0
    assert job["passed"] == speculative.passes_gate(job, s)
    assert job["parameters"]["target"] > job["parameters"]["draft"]
    parts = job["decode"]["parts"]  # the time inside each model's forwards, per token
    assert set(parts) == set(job["decode"]["seconds"]) and parts["plain"]["draft"] == 0
    for part in parts.values():
        assert 0 < part["target"] and part["target"] + part["draft"] <= part["total"]
    assert all(parts[f"k{k}"]["draft"] > 0 for k in s.ks)
    assert set(job["greedy_equal"]) == {str(k) for k in s.ks}
    checks = {f"check_{k}" for k in s.ks} | {"sample", "plain_sample", "draft", "target"}
    assert checks <= set(job["costs"]["seconds"])


def test_the_pooled_speedup_takes_the_rounds_of_the_gated_seeds_only():
    from experiments import speculative

    def run(seed: int, passed: bool, plain: list[float], fast: list[float]) -> dict:
        return {"seed": seed, "passed": passed, "decode": {"seconds": {"plain": plain, "k2": fast}}}

    runs = [run(0, True, [2.0, 2.0, 2.0], [1.0, 1.0, 2.0]), run(1, False, [1.0] * 3, [9.0] * 3),
            run(2, True, [3.0, 3.0, 3.0], [1.0, 1.5, 1.0])]
    pooled = speculative.pooled_speedup(runs, (2,))
    assert pooled["seeds"] == [0, 2]
    share = pooled["speedup"]["2"]
    assert share["rounds"] == 6 and share["ratio"] == 2.0  # ratios 2, 2, 1, 3, 2, 3: seed 1 left out
    assert share["low"] == 1.0 and share["high"] == 3.0
    assert speculative.pooled_speedup(runs[1:2], (2,)) == {"seeds": [], "speedup": {}}


@pytest.mark.slow
def test_the_tiny_verification_timing_counts_every_case():
    from experiments import speculative

    s = speculative.TINY
    timing = speculative.run_intensity(s)
    assert [(c["tokens"], c["k"]) for c in timing["cases"]] == list(itertools.product(s.intensity_tokens,
                                                                                      s.intensity_ks))
    for case in timing["cases"]:
        assert case["flops"] == case["k"] * 4 * s.query_heads * case["tokens"] * s.head_dim
        assert case["cache_bytes"] == 2 * s.kv_heads * case["tokens"] * s.head_dim * 4
        assert case["copies"] >= 2 and len(case["seconds"]["rows"]) == s.intensity_rounds
    assert timing["floors"]["bytes_per_s"] > 0 and timing["floors"]["flop_per_s"] > 0


def test_one_step_of_k_rows_equals_k_steps_of_one_row():
    """The verification step the experiment times: k rows against the cache under the causal mask of
    the k new tokens give what k one-row decode steps give, each against the keys up to its token."""
    from longctx import ch03

    generator = torch.Generator().manual_seed(8)
    k, tokens = 4, 40
    query = torch.randn(1, 8, k, 16, generator=generator)  # 8 query heads over 2 KV heads
    key, value = (torch.randn(1, 2, tokens, 16, generator=generator) for _ in range(2))
    mask = torch.ones(k, tokens, dtype=torch.bool).tril(diagonal=tokens - k)
    together = ch03.grouped_attention(query, key, value, mask)
    for i in range(k):
        seen = tokens - k + i + 1
        alone = ch03.grouped_attention(query[:, :, i:i + 1], key[:, :, :seen], value[:, :, :seen])
        assert torch.allclose(together[:, :, i:i + 1], alone, atol=1e-6)
