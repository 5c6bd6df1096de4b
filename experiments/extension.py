"""Chapter 11's experiment: python -m experiments extension [--size full|tiny] [--jobs N] [--seeds S ...].

For every seed, one job (``run_job``) trains a rotary TinyGPT on planted records and text, first
at ``short_length`` and then at the trained length T_0, with the matched RoPE base (the first of
``bases``), and then:

* scores the skill gate: the single-record share found at T_0 on the validation split; a seed
  whose share is below ``gate`` is reported but enters no comparison (``passed``);
* measures every recipe of Chapter 3 as-is, and YaRN's two ablations, at each length a * T_0;
* fine-tunes every recipe at the longest length once per learning rate of the sweep, scores
  each fine-tune on the validation split and measures the chosen one on the test split;
* fine-tunes a copy as long at T_0 with plain RoPE (the short control, its rate chosen the same
  way) and measures it under every recipe as-is.

For each seed of ``other_seeds`` a second job trains the same model with the last base (10,000,
Llama 2's) and measures the recipes as-is only (Chapter 3 reads it).

The held-out tenth of the novel is split: its first ``validation_share`` is the validation text
(rates and the gate are chosen on it), the rest the test text (every number the chapter reports).
Every model of a seed is scored on the same test windows: the loss at each position (windows of
every length end on the same bytes) and, for one record and for ``max_keys`` records, the byte
the model answers after each question (``key_guesses``), its class (``answer_kinds``), a hit or
a miss, and, once per seed, each trial's distance and what the name-blind baselines answer. The
windows differ from seed to seed (seed ``EVALUATION_SEED + seed``).

The command line is experiments/__main__.py's, shared by the studies; the results go to
``experiments/results/extension-<device>.json`` (``-tiny`` appended for a tiny run), and
Chapter 11 reads the newest full run. Jobs run ``--jobs`` at a time (default 2), each in a
fresh process of one torch thread; a job's numbers do not depend on what runs beside it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from longctx import ch01, ch02, ch03, ch06, support

from experiments.common import bits, texts

#: The seed of the held-out test trials is EVALUATION_SEED + the training seed: each seed its own.
EVALUATION_SEED = 1_000
#: The seed of the validation trials is VALIDATION_SEED + the training seed (validation text).
VALIDATION_SEED = 2_000
#: The tasks: the number of records planted in a window of each.
TASKS = ("single", "multi")


@dataclass(frozen=True)
class ExtensionSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    ``bases`` lists RoPE bases b: the first is the one whose spectrum matches Llama 2's
    (``ch06.matched_base``), on which every seed of ``seeds`` runs the whole design; the last
    is run as-is only, for the seeds of ``other_seeds``. Training: ``short_steps`` steps at
    ``short_length`` (batches twice as large), then ``steps`` at T_0. ``gate`` is the share of
    single records a seed must find at T_0 (validation split) to enter the comparisons.
    ``finetune_rates`` is the sweep; every recipe is fine-tuned once per rate for
    ``finetune_steps`` steps of ``finetune_batch`` windows of the longest length. Keyed windows
    hold one record or ``max_keys`` records, half each.

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    trained_length: int = 64
    factors: tuple[int, ...] = (1, 2, 4)
    d_model: int = 64
    layers: int = 3
    heads: int = 2
    bases: tuple[float, ...] = (27.0, 10_000.0)
    short_length: int = 32
    short_steps: int = 400
    steps: int = 700
    batch_size: int = 32
    learning_rate: float = 3e-3
    key_share: float = 1.0
    max_keys: int = 4
    gate: float = 0.8
    finetune_steps: int = 200
    finetune_batch: int = 4
    finetune_rates: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    windows: int = 32
    tail: int = 32
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    trials: int = 16
    validation_share: float = 0.25
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    other_seeds: tuple[int, ...] = (0, 1)
    methods: tuple[str, ...] = ch03.ROPE_METHODS
    variants: tuple[str, ...] = ch06.YARN_VARIANTS
    fused: bool = True

    def __post_init__(self) -> None:
        for name in ("factors", "bases", "finetune_rates", "depths", "seeds", "methods"):
            value = support.check_type(name, getattr(self, name), (tuple, list))
            if not value:
                raise ValueError(f"{name} must not be empty")
            object.__setattr__(self, name, tuple(value))  # a list will do
        for name in ("other_seeds", "variants"):  # may be empty
            object.__setattr__(self, name, tuple(support.check_type(name, getattr(self, name),
                                                                    (tuple, list))))
        for name in ("d_model", "layers", "heads", "steps", "batch_size", "finetune_steps",
                     "finetune_batch", "trials"):
            support.check_int(name, getattr(self, name), minimum=1)
        support.check_int("short_steps", self.short_steps, minimum=0)
        support.check_int("trained_length", self.trained_length, minimum=8)
        support.check_int("windows", self.windows, minimum=2)
        support.check_int("max_keys", self.max_keys, minimum=1, maximum=len(ch06.KEY_SYMBOLS))
        support.check_int("tail", self.tail, minimum=1, maximum=self.trained_length)
        support.check_int("short_length", self.short_length, minimum=3 * self.max_keys + 5,
                          maximum=self.trained_length)
        support.check_int_sequence("factors", self.factors, minimum=1)
        if self.factors[0] != 1 or list(self.factors) != sorted(set(self.factors)):
            raise ValueError(f"factors must rise from 1 without repeats (got {self.factors})")
        if 3 * self.max_keys + 5 > self.trained_length:
            raise ValueError(f"max_keys = {self.max_keys} records and a question do not fit "
                             f"in trained_length = {self.trained_length} (need 3 * max_keys + 5)")
        for base in self.bases:
            support.check_number("each of bases", base, above=1)
        for rate in (self.learning_rate, *self.finetune_rates):
            support.check_number("learning_rate and each of finetune_rates", rate, above=0)
        for depth in self.depths:
            support.check_number("each of depths", depth, minimum=0, maximum=1)
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        if self.other_seeds:
            support.check_int_sequence("other_seeds", self.other_seeds, minimum=0)
        for method in self.methods:
            support.check_choice("each of methods", method, ch03.ROPE_METHODS)
        for variant in self.variants:
            support.check_choice("each of variants", variant, ch06.YARN_VARIANTS)
        support.check_number("key_share", self.key_share, minimum=0, maximum=1)
        support.check_number("gate", self.gate, minimum=0, maximum=1)
        support.check_number("validation_share", self.validation_share, above=0, below=1)
        support.check_bool("fused", self.fused)
        ch02.GPTConfig(vocab_size=256, context_length=self.trained_length, d_model=self.d_model,
                       layers=self.layers, heads=self.heads)  # its own checks
        width = self.d_model // self.heads
        if width % 2 or width < 4:
            raise ValueError(f"d_model / heads must be even and at least 4 for RoPE (got {width})")

    @property
    def lengths(self) -> list[int]:
        return [a * self.trained_length for a in self.factors]


#: Toy sizes for the tests and ``--size tiny``: every step of the full run, in seconds.
TINY = ExtensionSettings(
    trained_length=16, factors=(1, 2), d_model=8, layers=1, heads=2, bases=(27.0, 10_000.0),
    short_length=13, short_steps=2, steps=3, batch_size=4, max_keys=2, finetune_steps=2,
    finetune_batch=2, finetune_rates=(1e-4, 1e-3), windows=2, tail=4, depths=(0.0, 1.0),
    trials=2, seeds=(0, 1), other_seeds=(0,), methods=("rope", "pi", "yarn"))
SIZES = {"full": ExtensionSettings(), "tiny": TINY}


def _rounded(values, digits: int = 4) -> list[float]:
    return [round(float(v), digits) for v in values]


def split_text(held_out: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out text as (validation, test): its first ``share`` and the rest, disjoint."""
    cut = int(share * held_out.numel())
    return held_out[:cut], held_out[cut:]


def passes_gate(score: float, gate: float) -> bool:
    """Whether a seed whose single-record share at T_0 is ``score`` enters the comparisons."""
    return score >= gate


@torch.no_grad()
def first_position_mass(model: ch06.RotaryGPT, inputs: torch.Tensor, skip: int = 8) -> list[float]:
    """The mean attention weight on position 0, per layer, of queries at positions >= ``skip``.

    Computed from the scores of the model's own queries and keys (the bands as set), for one
    full pass over ``inputs`` (B, T); a sink is a layer whose queries put much weight there.
    """
    found = []

    def attend(query, key, value):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])  # (B, H, T, T)
        mask = ch01.causal_mask(query.shape[2], device=query.device)
        weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        found.append(weights[:, :, skip:, 0].mean().item())
        return weights @ value

    for block in model.blocks:
        block.attention.attend = attend  # this pass only
    try:
        model(inputs)
    finally:
        for block in model.blocks:
            del block.attention.attend
    return _rounded(found)


def trial_sets(settings: ExtensionSettings, text: torch.Tensor, seed: int) -> dict:
    """The test trials of one seed: {(task, length): KeyBatch}."""
    s = settings
    return {(task, length): ch06.key_trials(text, length=length, depths=s.depths,
                                            trials=s.trials, seed=seed,
                                            keys=1 if task == "single" else s.max_keys)
            for task in TASKS for length in s.lengths}


def describe_trials(batches: dict, seed: int) -> list[dict]:
    """What every model of a seed shares: each trial's distance, answer and baselines' hits."""
    described = []
    for (task, length), batch in batches.items():
        generator = torch.Generator().manual_seed(seed)
        baselines = {rule: bits(ch06.baseline(batch, rule, generator) == batch.values[:, 0])
                     for rule in ch06.BASELINES}
        described.append({"task": task, "length": length,
                          "distance": batch.distance.tolist(),
                          "answer": batch.values[:, 0].tolist(), "baselines": baselines})
    return described


def evaluate(model: ch06.RotaryGPT, text: torch.Tensor, batches: dict,
             settings: ExtensionSettings, *, method: str, factor_at: dict[int, float],
             label: dict) -> list[dict]:
    """Score ``model`` under ``method`` at every length (factor ``factor_at[length]``)."""
    s, longest = settings, max(settings.lengths)
    found = []
    for length in s.lengths:
        model.set_rope(method, factor_at[length])
        losses = ch06.position_losses(model, text, length=length, windows=s.windows,
                                      span=longest)  # (W, T), windows ending on the same bytes
        entry = {**label, "method": method, "length": length, "factor": factor_at[length],
                 "window_loss": _rounded(losses.mean(1)),
                 "tail_loss": _rounded(losses[:, -s.tail:].mean(1)),
                 "key_guesses": {}, "answer_kinds": {}}
        if length == longest:
            entry["position_loss"] = _rounded(losses.mean(0))
            entry["first_position_mass"] = first_position_mass(
                model, batches["single", length].inputs[: s.windows])
        for task in TASKS:
            batch = batches[task, length]
            guesses = ch06.key_guesses(model, batch)
            entry[task] = bits(guesses == batch.values[:, 0])
            entry["key_guesses"][task] = guesses.tolist()
            entry["answer_kinds"][task] = "".join(map(str, ch06.answer_kinds(batch,
                                                                             guesses).tolist()))
        found.append(entry)
    return found


@torch.no_grad()
def validation_scores(model: ch06.RotaryGPT, text: torch.Tensor, settings: ExtensionSettings,
                      seed: int, length: int) -> dict:
    """Equation 11.1 on the validation split at ``length``, with the bands as set.

    The text term over ``windows`` windows, the answers' term over the trials of both tasks,
    and the single-record share found (the gate's measure at T_0).
    """
    s = settings
    text_loss = ch06.position_losses(model, text, length=length, windows=s.windows).mean().item()
    answer_losses, single = [], 0.0
    for task in TASKS:
        batch = ch06.key_trials(text, length=length, depths=s.depths, trials=s.trials,
                                seed=VALIDATION_SEED + seed,
                                keys=1 if task == "single" else s.max_keys)
        logits = torch.cat([model(part)[:, -1] for part in batch.inputs.split(32)])  # (B, V)
        answer_losses.append(F.cross_entropy(logits, batch.targets[:, -1]).item())
        if task == "single":
            single = (logits.argmax(-1) == batch.values[:, 0]).float().mean().item()
    answer_loss = sum(answer_losses) / len(answer_losses)
    return {"text_loss": round(text_loss, 4), "answer_loss": round(answer_loss, 4),
            "loss": round(text_loss + answer_loss, 4), "single": round(single, 4)}


def _model(settings: ExtensionSettings, seed: int, base: float) -> ch06.RotaryGPT:
    s = settings
    config = ch02.GPTConfig(vocab_size=256, context_length=s.trained_length, d_model=s.d_model,
                            layers=s.layers, heads=s.heads)
    with torch.random.fork_rng():  # the weights' draw leaves every other draw alone
        torch.manual_seed(seed)
        return ch06.RotaryGPT(config, base=base, fused=s.fused)


def _train(settings, model, text, *, steps, batch, length, rate, data_seed) -> tuple[list, float]:
    clock = time.perf_counter()
    losses = ch06.train_with_keys(model, text, steps=steps, batch_size=batch, length=length,
                                  key_share=settings.key_share, learning_rate=rate,
                                  seed=data_seed, max_keys=settings.max_keys)
    return _rounded(losses), time.perf_counter() - clock


def train_base_model(settings: ExtensionSettings, seed: int, base: float,
                     text: torch.Tensor) -> tuple[ch06.RotaryGPT, dict]:
    """The curriculum: ``short_steps`` at ``short_length`` (twice the batch), then ``steps`` at T_0."""
    s = settings
    model = _model(s, seed, base)
    losses, seconds = [], 0.0
    for length, steps, batch, data_seed in ((s.short_length, s.short_steps, 2 * s.batch_size, seed),
                                            (s.trained_length, s.steps, s.batch_size, seed + 10_000)):
        if steps:
            part, took = _train(s, model, text, steps=steps, batch=batch, length=length,
                                rate=s.learning_rate, data_seed=data_seed)
            losses, seconds = losses + part, seconds + took
    return model, {"train_losses": losses, "train_seconds": seconds}


def run_job(settings: ExtensionSettings, seed: int, base: float, full: bool = True) -> dict:
    """Train one model with ``seed`` and RoPE ``base``; measure the recipes (and, if ``full``,
    the fine-tunes and the short control)."""
    s = settings
    train_text, held_out = texts()
    validation, test = split_text(held_out, s.validation_share)
    longest, t0 = max(s.lengths), s.trained_length
    model, job = train_base_model(s, seed, base, train_text)
    model.set_rope("rope")
    gate_score = validation_scores(model, validation, s, seed, t0)["single"]
    job = {"seed": seed, "base": base, **job, "gate_score": gate_score,
           "passed": passes_gate(gate_score, s.gate), "evaluation_seed": EVALUATION_SEED + seed,
           "finetunes": [], "evaluations": []}
    batches = trial_sets(s, test, EVALUATION_SEED + seed)
    job["trials"] = describe_trials(batches, EVALUATION_SEED + seed)
    as_is = {n: n / t0 for n in s.lengths}
    for method in (*s.methods, *s.variants):
        job["evaluations"] += evaluate(model, test, batches, s, method=method, factor_at=as_is,
                                       label={"model": "as-is", "rate": None})
    if not full:
        return job
    factor = longest / t0
    arms = [("fine-tuned", method, factor, longest, s.finetune_batch) for method in s.methods]
    arms.append(("control-short", "rope", 1.0, t0, s.finetune_batch * longest // t0))  # same bytes
    for kind, method, arm_factor, length, batch in arms:
        tuned_at = {}
        for rate in s.finetune_rates:
            tuned = copy.deepcopy(model)
            tuned.set_rope(method, arm_factor)
            losses, seconds = _train(s, tuned, train_text, steps=s.finetune_steps, batch=batch,
                                     length=length, rate=rate, data_seed=seed + 20_000)
            tuned.set_rope(method, arm_factor)
            scores = validation_scores(tuned, validation, s, seed, length)
            tuned_at[rate] = tuned
            job["finetunes"].append({"model": kind, "method": method, "rate": rate,
                                     "losses": losses, "seconds": seconds,
                                     "validation": scores})
        runs = [f for f in job["finetunes"] if (f["model"], f["method"]) == (kind, method)]
        best = min(runs, key=lambda f: f["validation"]["loss"])
        for f in runs:
            f["chosen"] = f is best
        tuned = tuned_at[best["rate"]]
        label = {"model": kind, "rate": best["rate"]}
        if kind == "fine-tuned":
            job["evaluations"] += evaluate(tuned, test, batches, s, method=method,
                                           factor_at=dict.fromkeys(s.lengths, factor), label=label)
        else:  # the short control, read with every recipe as-is
            for recipe in s.methods:
                job["evaluations"] += evaluate(tuned, test, batches, s, method=recipe,
                                               factor_at=as_is, label=label)
    return job


def _run_one(settings: ExtensionSettings, seed: int, base: float, full: bool) -> dict:
    torch.set_num_threads(1)
    clock, cpu = time.perf_counter(), time.process_time()
    job = run_job(settings, seed, base, full)
    job["seconds"] = time.perf_counter() - clock
    job["cpu_seconds"] = time.process_time() - cpu  # this job's own: workers are reused
    return job


def work_list(settings: ExtensionSettings) -> list[tuple[int, float, bool]]:
    """The jobs: (seed, base, full) for every seed on the first base, then as-is on the last."""
    work = [(seed, settings.bases[0], True) for seed in settings.seeds]
    if len(settings.bases) > 1:
        work += [(seed, settings.bases[-1], False) for seed in settings.other_seeds]
    return work


def job_count(settings: ExtensionSettings) -> int:
    """The processes a run starts: one per seed, and one per seed of the last base."""
    return len(work_list(settings))


def run_experiment(settings: ExtensionSettings, *, jobs: int = 2, progress: bool = True) -> dict:
    """Run the jobs of ``work_list(settings)``, ``jobs`` at a time, each in a fresh process.

    Returns plain numbers for a JSON file: ``settings``, ``lengths``, the seeds ``passed`` by
    the gate, and ``runs`` (one per job, in the order of ``work_list``).

    Raises:
        TypeError, ValueError: If ``settings`` is not an ExtensionSettings or ``jobs`` < 1.
    """
    support.check_type("settings", settings, ExtensionSettings)
    jobs = support.check_int("jobs", jobs, minimum=1)
    support.check_bool("progress", progress)
    work = work_list(settings)
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited threads
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=context) as pool:
        futures = [pool.submit(_run_one, settings, *item) for item in work]
        runs = []
        for (seed, base, full), future in zip(work, futures, strict=True):
            runs.append(future.result())
            if progress:
                print(f"  seed {seed}, base {base:g}{'' if full else ' (as-is)'}: "
                      f"{runs[-1]['seconds']:.0f} s, gate score {runs[-1]['gate_score']:.2f}",
                      file=sys.stderr, flush=True)
    passed = [r["seed"] for r in runs if r["base"] == settings.bases[0] and r["passed"]]
    return {"settings": dataclasses.asdict(settings), "lengths": settings.lengths,
            "evaluation_seed": EVALUATION_SEED, "validation_seed": VALIDATION_SEED,
            "passed": passed, "runs": runs}
