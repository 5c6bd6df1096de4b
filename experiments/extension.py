"""Chapter 6's experiment: python -m experiments extension [--size full|tiny] [--jobs N] [--seeds S ...].

For every seed and every RoPE base of the settings, one job (``run_job``) trains a rotary
TinyGPT at the trained length T_0 on key-free text and planted keys, then measures:

* every recipe of Chapter 3 as-is, at each length a * T_0 with factor a;
* every recipe fine-tuned at the longest length, once per learning rate of the sweep;
* on the first base, two controls: the trained model fine-tuned as long at T_0 (``short``),
  and a model of the same size trained at the longest length from the start (``long``).

Each model is scored at every length on the same held-out windows: the loss at each position
(windows of every length end on the same bytes, so their last ``tail`` positions score the
same bytes with more or less context) and, for the single key and for several keys with
distractors, a hit or a miss on the same planted windows at each depth.

The command line is experiments/__main__.py's, shared by the studies; the results go to
``experiments/results/extension-<device>.json`` (``-tiny`` appended for a tiny run), and
Chapter 6 reads the newest full run. Jobs run ``--jobs`` at a time (default 2), each in a
fresh process of one torch thread; a job's numbers do not depend on what runs beside it.
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from longctx import ch02, ch03, ch06, support

from experiments.common import bits, texts

#: The seed of every held-out key window: the same trials for every model and seed.
EVALUATION_SEED = 1_000


@dataclass(frozen=True)
class ExtensionSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    ``bases`` lists RoPE bases b; the first is the one whose spectrum matches Llama 2's
    (``ch06.matched_base``) and the only one with the controls. ``finetune_rates`` is the
    sweep; every recipe is fine-tuned once per rate for ``finetune_steps`` steps of
    ``finetune_batch`` windows of the longest length. Keyed windows hold one key or
    ``max_keys`` keys, half each.

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    trained_length: int = 64
    factors: tuple[int, ...] = (1, 2, 4)
    d_model: int = 64
    layers: int = 3
    heads: int = 2
    bases: tuple[float, ...] = (27.0, 10_000.0)
    steps: int = 700
    batch_size: int = 32
    learning_rate: float = 3e-3
    key_share: float = 0.5
    max_keys: int = 4
    finetune_steps: int = 80
    finetune_batch: int = 4
    finetune_rates: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    windows: int = 32
    tail: int = 32
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    trials: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = ch03.ROPE_METHODS
    fused: bool = True

    def __post_init__(self) -> None:
        for name in ("factors", "bases", "finetune_rates", "depths", "seeds", "methods"):
            value = support.check_type(name, getattr(self, name), (tuple, list))
            if not value:
                raise ValueError(f"{name} must not be empty")
            object.__setattr__(self, name, tuple(value))  # a list will do
        for name in ("d_model", "layers", "heads", "steps", "batch_size", "finetune_steps",
                     "finetune_batch", "trials"):
            support.check_int(name, getattr(self, name), minimum=1)
        support.check_int("trained_length", self.trained_length, minimum=8)
        support.check_int("windows", self.windows, minimum=2)
        support.check_int("max_keys", self.max_keys, minimum=1, maximum=len(ch06.KEY_SYMBOLS))
        support.check_int("tail", self.tail, minimum=1, maximum=self.trained_length)
        support.check_int_sequence("factors", self.factors, minimum=1)
        if self.factors[0] != 1 or list(self.factors) != sorted(set(self.factors)):
            raise ValueError(f"factors must rise from 1 without repeats (got {self.factors})")
        if 6 * self.max_keys + 1 > self.trained_length:
            raise ValueError(f"max_keys = {self.max_keys} records and their questions do not fit "
                             f"in trained_length = {self.trained_length} (need 6 * max_keys + 1)")
        for base in self.bases:
            support.check_number("each of bases", base, above=1)
        for rate in (self.learning_rate, *self.finetune_rates):
            support.check_number("learning_rate and each of finetune_rates", rate, above=0)
        for depth in self.depths:
            support.check_number("each of depths", depth, minimum=0, maximum=1)
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        for method in self.methods:
            support.check_choice("each of methods", method, ch03.ROPE_METHODS)
        support.check_number("key_share", self.key_share, minimum=0, maximum=1)
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
    steps=3, batch_size=4, max_keys=2, finetune_steps=2, finetune_batch=2,
    finetune_rates=(1e-4, 1e-3), windows=2, tail=4, depths=(0.0, 1.0), trials=2, seeds=(0, 1),
    methods=("rope", "pi"))
SIZES = {"full": ExtensionSettings(), "tiny": TINY}


def _rounded(values, digits: int = 4) -> list[float]:
    return [round(float(v), digits) for v in values]


def evaluate(model: ch06.RotaryGPT, held_out: torch.Tensor, settings: ExtensionSettings, *,
             method: str, factor_at: dict[int, float], label: dict) -> list[dict]:
    """Score ``model`` under ``method`` at every length (factor ``factor_at[length]``)."""
    s, longest = settings, max(settings.lengths)
    found = []
    for length in s.lengths:
        model.set_rope(method, factor_at[length])
        losses = ch06.position_losses(model, held_out, length=length, windows=s.windows,
                                      span=longest)  # (W, T), windows ending on the same bytes
        entry = {**label, "method": method, "length": length, "factor": factor_at[length],
                 "window_loss": _rounded(losses.mean(1)),
                 "tail_loss": _rounded(losses[:, -s.tail:].mean(1))}
        if length == longest:
            entry["position_loss"] = _rounded(losses.mean(0))
        for task, keys in (("single", 1), ("multi", s.max_keys)):
            entry[task] = bits(ch06.key_hits(model, held_out, length=length, depths=s.depths,
                                              trials=s.trials, seed=EVALUATION_SEED, keys=keys))
        found.append(entry)
    return found


def run_job(settings: ExtensionSettings, seed: int, base: float, controls: bool) -> dict:
    """Train one model at T_0 with ``seed`` and RoPE ``base``; measure recipes and controls."""
    s = settings
    train_text, held_out = texts()
    longest, t0 = max(s.lengths), s.trained_length
    config = ch02.GPTConfig(vocab_size=256, context_length=t0, d_model=s.d_model,
                            layers=s.layers, heads=s.heads)

    def fresh(config: ch02.GPTConfig) -> ch06.RotaryGPT:
        with torch.random.fork_rng():  # the weights' draw leaves every other draw alone
            torch.manual_seed(seed)
            return ch06.RotaryGPT(config, base=base, fused=s.fused)

    def train(model, *, steps, batch, length, rate, data_seed) -> tuple[list[float], float]:
        clock = time.perf_counter()
        losses = ch06.train_with_keys(model, train_text, steps=steps, batch_size=batch,
                                      length=length, key_share=s.key_share, learning_rate=rate,
                                      seed=data_seed, max_keys=s.max_keys)
        return _rounded(losses), time.perf_counter() - clock

    model = fresh(config)
    train_losses, train_seconds = train(model, steps=s.steps, batch=s.batch_size, length=t0,
                                        rate=s.learning_rate, data_seed=seed)
    job = {"seed": seed, "base": base, "train_losses": train_losses,
           "train_seconds": train_seconds, "finetunes": [], "evaluations": []}
    for method in s.methods:
        job["evaluations"] += evaluate(model, held_out, s, method=method,
                                       factor_at={n: n / t0 for n in s.lengths},
                                       label={"model": "as-is", "rate": None})
    factor = longest / t0
    for method in s.methods:
        for rate in s.finetune_rates:
            tuned = copy.deepcopy(model)
            tuned.set_rope(method, factor)
            losses, seconds = train(tuned, steps=s.finetune_steps, batch=s.finetune_batch,
                                    length=longest, rate=rate, data_seed=seed + 10_000)
            job["finetunes"].append({"model": "fine-tuned", "method": method, "rate": rate,
                                     "losses": losses, "seconds": seconds})
            job["evaluations"] += evaluate(tuned, held_out, s, method=method,
                                           factor_at=dict.fromkeys(s.lengths, factor),
                                           label={"model": "fine-tuned", "rate": rate})
    if controls:
        # as many steps and bytes as a fine-tune, but at the trained length
        short_batch = s.finetune_batch * longest // t0
        for rate in s.finetune_rates:
            tuned = copy.deepcopy(model)
            losses, seconds = train(tuned, steps=s.finetune_steps, batch=short_batch, length=t0,
                                    rate=rate, data_seed=seed + 10_000)
            job["finetunes"].append({"model": "control-short", "method": "rope", "rate": rate,
                                     "losses": losses, "seconds": seconds})
            job["evaluations"] += evaluate(tuned, held_out, s, method="rope",
                                           factor_at=dict.fromkeys(s.lengths, 1.0),
                                           label={"model": "control-short", "rate": rate})
    return job


def run_long_control(settings: ExtensionSettings, seed: int, base: float) -> dict:
    """Train a model of the same size at the longest length from the start and measure it.

    It trains for the steps of training and fine-tuning together, with the bytes per step
    of training, under plain RoPE (the factor is 1: it has seen every position).
    """
    s = settings
    train_text, held_out = texts()
    longest, t0 = max(s.lengths), s.trained_length
    config = ch02.GPTConfig(vocab_size=256, context_length=longest, d_model=s.d_model,
                            layers=s.layers, heads=s.heads)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ch06.RotaryGPT(config, base=base, fused=s.fused)
    clock = time.perf_counter()
    losses = ch06.train_with_keys(model, train_text, steps=s.steps + s.finetune_steps,
                                  batch_size=max(2, s.batch_size * t0 // longest), length=longest,
                                  key_share=s.key_share, learning_rate=s.learning_rate, seed=seed,
                                  max_keys=s.max_keys)
    finetune = {"model": "control-long", "method": "rope", "rate": s.learning_rate,
                "losses": _rounded(losses), "seconds": time.perf_counter() - clock}
    evaluations = evaluate(model, held_out, s, method="rope",
                           factor_at=dict.fromkeys(s.lengths, 1.0),
                           label={"model": "control-long", "rate": s.learning_rate})
    return {"seed": seed, "base": base, "finetunes": [finetune], "evaluations": evaluations}


def _run_one(settings: ExtensionSettings, kind: str, seed: int, base: float,
             controls: bool) -> dict:
    torch.set_num_threads(1)
    clock = time.perf_counter()
    if kind == "long":
        job = run_long_control(settings, seed, base)
    else:
        job = run_job(settings, seed, base, controls)
    job["seconds"] = time.perf_counter() - clock
    return job


def job_count(settings: ExtensionSettings) -> int:
    """The processes a run starts: one per seed and base, and one long control per seed."""
    return len(settings.seeds) * (len(settings.bases) + 1)


def run_experiment(settings: ExtensionSettings, *, jobs: int = 2, progress: bool = True) -> dict:
    """Run one job per (seed, base) of ``settings``, ``jobs`` at a time, each in a fresh process.

    Returns plain numbers for a JSON file: ``settings``, ``lengths`` and ``runs`` (one per
    job, in seed order within base order).

    Raises:
        TypeError, ValueError: If ``settings`` is not an ExtensionSettings or ``jobs`` < 1.
    """
    support.check_type("settings", settings, ExtensionSettings)
    jobs = support.check_int("jobs", jobs, minimum=1)
    support.check_bool("progress", progress)
    main_base = settings.bases[0]
    work = [("main", seed, base, index == 0) for index, base in enumerate(settings.bases)
            for seed in settings.seeds]
    work += [("long", seed, main_base, True) for seed in settings.seeds]
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no inherited threads
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=context) as pool:
        futures = [pool.submit(_run_one, settings, *item) for item in work]
        done = []
        for (kind, seed, base, _), future in zip(work, futures, strict=True):
            done.append((kind, future.result()))
            if progress:
                print(f"  {kind} job, seed {seed}, base {base:g}: {done[-1][1]['seconds']:.0f} s",
                      file=sys.stderr, flush=True)
    runs = [job for kind, job in done if kind == "main"]
    for kind, job in done:  # the long controls join their seed's run on the first base
        if kind == "long":
            run = next(r for r in runs if (r["seed"], r["base"]) == (job["seed"], job["base"]))
            run["finetunes"] += job["finetunes"]
            run["evaluations"] += job["evaluations"]
            run["long_control_seconds"] = job["seconds"]
    return {"settings": dataclasses.asdict(settings), "lengths": settings.lengths,
            "evaluation_seed": EVALUATION_SEED, "runs": runs}
