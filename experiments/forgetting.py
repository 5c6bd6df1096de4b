"""Chapter 12's experiment: python -m experiments forgetting [--size full|tiny] [--jobs N] [--seeds S ...].

For every seed, one job (``run_job``) trains Chapter 11's rotary TinyGPT on key-free text with
planted records in one format (``ch06.train_with_keys``: half the keyed windows one record, half
``keys``; first at a short length, then at the measured length T), then, for every cache policy of
``ch07.POLICIES`` and every budget of ``ch07.BUDGETS`` (the quantized caches at their own size),
measures on held-out windows drawn for that seed alone:

* retrieval: every trial's predicted byte after the question (``ch07.compressed_guesses``), its hit
  and its class (``ch06.answer_kinds``), on one-record windows and on windows of ``keys`` records;
* the three name-blind baselines of ``ch06.BASELINES`` on the same windows;
* the next-byte loss of a streamed decode after a compressed prompt (``ch07.compressed_losses``),
  per window and per position after the prompt;
* the cache's bytes, as a share of the full cache's;
* the median seconds of one decode step against the compressed cache;
* for one window (asked record mid-prompt), which positions each policy keeps in each layer and head.

A seed passes the skill gate (``passes_gate``) if its full cache finds at least ``gate`` of the
lone records (the one-record task); only passing seeds enter Chapter 12's comparisons, and
every seed is saved. The command line is experiments/__main__.py's, shared by the studies; the
results go to ``experiments/results/forgetting-<device>.json`` (``-tiny`` appended for a tiny
run), and Chapter 12 reads the newest full run. Jobs run ``--jobs`` at a time (default 2), each in a
fresh process of one torch thread.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch
from longctx import ch02, ch06, ch07, support

from experiments.common import bits, run_seeds, texts

#: The held-out windows of seed s are drawn with EVALUATION_SEED + s: the same trials for every
#: policy and budget of one model, different trials for each seed.
EVALUATION_SEED = 2_000


@dataclass(frozen=True)
class ForgettingSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    Training: ``short_steps`` steps at ``short_length``, then ``steps`` steps at ``length`` (T),
    batches of ``batch_size`` windows at T (twice as many at the short length), ``key_share`` of
    them with records, half one record and half ``keys``. Measuring: ``trials`` windows per depth,
    with one record and with ``keys`` records (one asked, the others distractors); ``windows``
    held-out windows for the loss, the first ``prompt`` bytes read at once, and the full model's
    loss on the same decoded bytes with only the last ``contexts`` bytes of the prompt. A seed
    passes if its full cache finds at least ``gate`` of the lone records.

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    length: int = 128
    short_length: int = 64
    d_model: int = 64
    layers: int = 4
    heads: int = 2
    base: float = 10_000.0
    short_steps: int = 1400
    steps: int = 650
    batch_size: int = 16
    learning_rate: float = 3e-3
    key_share: float = 1.0
    keys: int = 4
    depths: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 1.0)
    trials: int = 24
    windows: int = 24
    prompt: int = 96
    timing_repeats: int = 3
    gate: float = 0.8
    contexts: tuple[int, ...] = (8, 16, 32, 64)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)

    def __post_init__(self) -> None:
        for name in ("depths", "seeds", "contexts"):
            value = support.check_type(name, getattr(self, name), (tuple, list))
            if not value:
                raise ValueError(f"{name} must not be empty")
            object.__setattr__(self, name, tuple(value))
        for name in ("d_model", "layers", "heads", "short_steps", "steps", "trials",
                     "timing_repeats"):
            support.check_int(name, getattr(self, name), minimum=1)
        support.check_int("batch_size", self.batch_size, minimum=2)
        support.check_int("keys", self.keys, minimum=1, maximum=len(ch06.KEY_SYMBOLS))
        support.check_int("short_length", self.short_length, minimum=6 * self.keys + 1)
        support.check_int("length", self.length, minimum=self.short_length)
        support.check_int("windows", self.windows, minimum=2)
        support.check_int("prompt", self.prompt, minimum=1, maximum=self.length - 1)
        support.check_number("base", self.base, above=1)
        support.check_number("learning_rate", self.learning_rate, above=0)
        support.check_number("key_share", self.key_share, minimum=0, maximum=1)
        support.check_number("gate", self.gate, minimum=0, maximum=1)
        for depth in self.depths:
            support.check_number("each of depths", depth, minimum=0, maximum=1)
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        support.check_int_sequence("contexts", self.contexts, minimum=1, maximum=self.prompt)


#: Toy sizes for the tests and ``--size tiny``: every step of the full run, in seconds.
TINY = ForgettingSettings(length=96, short_length=48, d_model=16, layers=2, heads=2, short_steps=2,
                          steps=2, batch_size=4, depths=(0.05, 1.0), trials=2, windows=2, prompt=90,
                          timing_repeats=1, contexts=(8, 45), seeds=(0, 1))
SIZES = {"full": ForgettingSettings(), "tiny": TINY}


def settings_grid(settings: ForgettingSettings) -> list[tuple[str, float | None]]:
    """Every (policy, budget) measured: the full cache once, evictions at every budget below 100 %
    (at 100 % each equals the full cache exactly: tests/test_ch07.py), quantized caches once."""
    grid = [("full", None)]
    for policy, (keep, _) in ch07.POLICIES.items():
        if policy == "full":
            continue
        if keep is None:
            grid.append((policy, None))
        else:
            grid += [(policy, b) for b in ch07.BUDGETS if b < 1]
    return grid


def decode_seconds(model, ids: torch.Tensor, policy: str, budget: float | None, *, prompt: int,
                   repeats: int) -> float:
    """Median seconds of one decode step (batch 1): each repeat reads ``prompt`` bytes of ``ids``
    (1, T), compresses, and times the decode of the rest, byte by byte."""
    times = []
    for _ in range(repeats):
        cache = ch07.make_cache(model, policy, budget, prompt_tokens=prompt)
        with torch.no_grad():
            ch07.read_with_cache(model, ids[:, :prompt], cache)
            cache.compress()
            for at in range(prompt, ids.shape[1]):
                clock = time.perf_counter()
                ch07.read_with_cache(model, ids[:, at:at + 1], cache)
                times.append(time.perf_counter() - clock)
    return statistics.median(times)


def kept_positions(model, batch: ch06.KeyBatch, policy: str, budget: float, window: int) -> list:
    """For one window of ``batch``: the positions each layer and head keeps after compression."""
    one = ch06.KeyBatch(*(part[window:window + 1] for part in batch))
    cache = ch07.make_cache(model, policy, budget, prompt_tokens=one.inputs.shape[1] - 1)
    with torch.no_grad():
        ch07.read_with_cache(model, one.inputs[:, :-1], cache)
        cache.compress()
    return [seen.positions[0].tolist() for seen in cache.seen]


def kinds_text(batch: ch06.KeyBatch, guesses: torch.Tensor) -> str:
    """Each trial's answer class (``ch06.answer_kinds``) as one string of digits 0, 1, 2."""
    return "".join(str(code) for code in ch06.answer_kinds(batch, guesses).tolist())


def passes_gate(run: dict, settings: ForgettingSettings) -> bool:
    """Whether a seed's full cache found at least ``settings.gate`` of the lone records (the
    "single" task): the skill gate Chapter 12 states before its results. Only passing seeds enter
    the comparisons."""
    full = [e for e in run["entries"] if e["policy"] == "full"]
    if len(full) != 1:
        raise ValueError("a run has exactly one full-cache entry")
    found = full[0]["single"]
    return found.count("1") >= settings.gate * len(found)


def run_job(settings: ForgettingSettings, seed: int) -> dict:
    """Train one model with ``seed``; measure every policy and budget on this seed's windows."""
    s = settings
    torch.set_num_threads(1)
    clock, cpu = time.perf_counter(), time.process_time()
    train_text, held_out = texts()
    config = ch02.GPTConfig(vocab_size=256, context_length=s.length, d_model=s.d_model,
                            layers=s.layers, heads=s.heads)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ch06.RotaryGPT(config, base=s.base, fused=True)
    losses = []
    for length, steps, batch, data_seed in ((s.short_length, s.short_steps, 2 * s.batch_size, seed),
                                            (s.length, s.steps, s.batch_size, seed + 10_000)):
        losses += ch06.train_with_keys(model, train_text, steps=steps, batch_size=batch,
                                       length=length, key_share=s.key_share,
                                       learning_rate=s.learning_rate, seed=data_seed,
                                       max_keys=s.keys)
    train_seconds = time.perf_counter() - clock
    run = {"seed": seed, "train_losses": [round(v, 4) for v in losses],
           "train_seconds": train_seconds, **measure(model, s, seed, held_out)}
    run["passed"] = passes_gate(run, s)
    run["seconds"] = time.perf_counter() - clock
    run["cpu_seconds"] = time.process_time() - cpu
    return run


def measure(model: ch06.RotaryGPT, settings: ForgettingSettings, seed: int,
            held_out: torch.Tensor) -> dict:
    """Every policy and budget of ``settings`` on seed ``seed``'s held-out windows."""
    s = settings
    for block in model.blocks:
        block.attention.fused = False  # Chapter 1's attention, as the caches use
    drawn = EVALUATION_SEED + seed
    tasks = {task: ch06.key_trials(held_out, length=s.length, depths=s.depths, trials=s.trials,
                                   seed=drawn + offset, keys=keys)
             for offset, (task, keys) in enumerate((("single", 1), ("multi", s.keys)))}
    keyed = tasks["multi"]
    baselines = {}
    for task, batch in tasks.items():
        for rule in ch06.BASELINES:
            guesses = ch06.baseline(batch, rule, torch.Generator().manual_seed(drawn))
            baselines.setdefault(task, {})[rule] = {
                "hits": bits(guesses == batch.values[:, 0]), "kinds": kinds_text(batch, guesses)}
    # the window whose positions are drawn: the first with its asked record mid-prompt
    shown = s.depths.index(0.5) * s.trials if 0.5 in s.depths else 0
    generator = torch.Generator().manual_seed(drawn)
    ends = torch.randint(s.length, held_out.numel() - 1, (s.windows,), generator=generator)
    offsets = torch.arange(-s.length, 0)
    inputs, targets = held_out[ends[:, None] + offsets], held_out[ends[:, None] + offsets + 1]
    full_bytes = None
    entries = []
    for policy, budget in settings_grid(s):
        cache = ch07.make_cache(model, policy, budget, prompt_tokens=s.length - 1)
        with torch.no_grad():
            ch07.read_with_cache(model, keyed.inputs[:1, :-1], cache)
            cache.compress()
        size = cache.nbytes()
        full_bytes = size if policy == "full" else full_bytes
        entry = {"policy": policy, "budget": budget, "bytes": size, "fraction": size / full_bytes}
        for task, batch in tasks.items():
            guesses = ch07.compressed_guesses(model, batch, policy, budget)
            entry[task] = bits(guesses == batch.values[:, 0])
            entry[f"{task}_guesses"] = guesses.tolist()
            entry[f"{task}_kinds"] = kinds_text(batch, guesses)
        losses_here = ch07.compressed_losses(model, inputs, targets, policy, budget, prompt=s.prompt)
        entry["window_loss"] = [round(float(v), 5) for v in losses_here.mean(1)]
        entry["position_loss"] = [round(float(v), 5) for v in losses_here.mean(0)]
        entry["decode_seconds"] = decode_seconds(model, inputs[:1], policy, budget, prompt=s.prompt,
                                                 repeats=s.timing_repeats)
        if budget == 0.25 or policy == "full":
            entry["kept"] = kept_positions(model, keyed, policy, 1.0 if budget is None else budget,
                                           shown) \
                if ch07.POLICIES[policy][0] is not None else None
        entries.append(entry)
    with torch.no_grad():  # the full model, the decoded bytes, the prompt cut to its last c bytes
        context_loss = {
            f"{c}": round(float(torch.nn.functional.cross_entropy(
                model(inputs[:, s.prompt - c:]).transpose(1, 2)[..., c:], targets[:, s.prompt:])), 5)
            for c in s.contexts}
    return {"evaluation_seed": drawn, "context_loss": context_loss, "kept_window": shown, "starts": keyed.starts[shown].tolist(),
            "answer_target": int(keyed.targets[shown, -1]), "baselines": baselines,
            "loss_ends": ends.tolist(), "entries": entries}


def job_count(settings: ForgettingSettings) -> int:
    """The processes a run starts: one per seed."""
    return len(settings.seeds)


def run_experiment(settings: ForgettingSettings, *, jobs: int = 2, progress: bool = True) -> dict:
    """Run one job per seed of ``settings``, ``jobs`` at a time, each in a fresh process.

    Raises:
        TypeError, ValueError: If ``settings`` is not a ForgettingSettings or ``jobs`` < 1.
    """
    support.check_type("settings", settings, ForgettingSettings)
    jobs = support.check_int("jobs", jobs, minimum=1)
    support.check_bool("progress", progress)
    runs = run_seeds(run_job, settings, jobs=jobs, progress=progress)
    return {"settings": dataclasses.asdict(settings), "budgets": list(ch07.BUDGETS),
            "policies": {name: settings for name, (_, settings) in ch07.POLICIES.items()},
            "pyramid_beta": ch07.PYRAMID_BETA, "evaluation_seed": EVALUATION_SEED,
            "gate": {"task": "single", "share": settings.gate}, "runs": runs}
