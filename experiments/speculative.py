"""Chapter 13's experiment: python -m experiments speculative [--size full|tiny] [--jobs N] [--seeds S ...].

For every seed, one job (``run_job``) trains two TinyGPTs of Chapter 2 on the novel's first nine
tenths (Chapter 2's split and ``ch02.train``): a small draft and a larger target. It then measures,
on the held-out tenth:

* the skill gate, written before the run (``passes_gate``): the target's held-out loss at least
  ``gate_margin`` nats below the draft's, and the draft's at least ``gate_baseline`` below the
  unigram entropy of the training text (so both use their context, and the target better);
* alpha from the two models' distributions: the mean over held-out positions of
  ``ch08.acceptance_rate`` at the sampling temperature, on windows read whole;
* the cost of a step: one cached token of the draft, of the target, and the target reading
  ``k + 1`` tokens at once, in interleaved rounds (``longctx.support.measure.interleaved``): the cost
  ratio c and the verification cost of each k are the medians of per-round ratios, with intervals;
  in the same rounds, the loop's bookkeeping beside the forwards: a drafted token's softmax and
  draw (``sample``; ``plain_sample`` is ``ch02.generate``'s), and a round's softmax of k + 1 rows,
  ``ch08.speculative_verify`` and the two cache cuts (``check_k``);
* for each k, speculative decoding (``ch08.speculative_generate``) of ``new_tokens`` bytes after
  each of ``prompts`` held-out prompts: how many tokens each target step drafted and kept, and
  alpha along the text it wrote (both models read it again, whole);
* at temperature 0, whether speculative decoding writes the target's greedy text, for every k;
* end-to-end time: plain cached decoding of the target (``ch02.generate``) against speculative
  decoding for every k, the same prompts and seeds, in interleaved rounds; each speedup is the
  median per-round ratio with its distribution-free interval (and, over the rounds of every
  gated seed together, ``pooled_speedup``); then each decode again with the time inside the
  two models' forwards added up by hooks (``decode_parts``): what the rest of the loop costs.

One more job (``run_intensity``) times the verification step itself at a served model's shape
(GQA with ``query_heads`` query heads and ``kv_heads`` KV heads of width ``head_dim``, float32, one
sequence) against a long cache, cold (copies rotated that together fill 4x the last-level cache):
one step of k query rows (``ch03.grouped_attention`` with the causal mask of the k new tokens)
against k separate steps of one row each (``ch03.grouped_attention``, every key visible), in
interleaved rounds, with the machine's read and multiply floors measured before and after. It runs
after the seeds' jobs, alone.

The command line is experiments/__main__.py's; the results go to
``experiments/results/speculative-<device>.json`` (``-tiny`` appended for a tiny run), and Chapter 13
reads the newest full run. No weights are saved.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch
from longctx import ch02, ch03, ch08, support
from longctx.support.measure import (
    attention_flops,
    best_floors,
    cold_copies,
    interleaved,
    measure_floors,
    median_interval,
    ratio,
)

from experiments.common import run_seeds

#: The held-out windows and prompts of seed s are drawn with EVALUATION_SEED + s.
EVALUATION_SEED = 3_000


@dataclass(frozen=True)
class SpeculativeSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    Models: a draft of ``draft_layers`` blocks of width ``draft_d_model`` and a target of
    ``target_layers`` of ``target_d_model``, both with ``heads`` heads and ``context_length``
    positions, trained ``draft_steps`` and ``target_steps`` steps of ``batch_size`` windows at
    peak rates ``draft_learning_rate`` and ``target_learning_rate`` (the deeper target's lower:
    at the draft's rate a pilot's target stalled above the draft's loss).
    Decoding samples at ``temperature``: ``new_tokens`` bytes after each of ``prompts`` held-out
    prompts of ``prompt`` bytes, for each k of ``ks``; the first ``timing_prompts`` of them are
    timed, ``rounds`` interleaved rounds, the steps ``step_rounds`` rounds, and the decodes again
    ``part_repeats`` times with the models' forwards timed inside them. alpha is read on
    ``alpha_windows`` held-out windows. The verification step is timed at each cache length of
    ``intensity_tokens`` and each k of ``intensity_ks``, ``intensity_rounds`` rounds; ``floors``
    is ``"full"`` or ``"quick"`` (the floors' own sizes).

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    context_length: int = 128
    heads: int = 4
    draft_layers: int = 1
    draft_d_model: int = 64
    target_layers: int = 4
    target_d_model: int = 128
    draft_steps: int = 300
    target_steps: int = 500
    batch_size: int = 16
    draft_learning_rate: float = 3e-3
    target_learning_rate: float = 1.5e-3
    gate_margin: float = 0.1
    gate_baseline: float = 0.3
    temperature: float = 1.0
    ks: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    prompt: int = 32
    new_tokens: int = 96
    prompts: int = 8
    alpha_windows: int = 16
    timing_prompts: int = 2
    rounds: int = 9
    step_rounds: int = 7
    part_repeats: int = 3
    intensity_tokens: tuple[int, ...] = (16_384,)
    intensity_ks: tuple[int, ...] = (1, 2, 4, 8)
    intensity_rounds: int = 7
    query_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    floors: str = "full"
    seeds: tuple[int, ...] = (0, 1)

    def __post_init__(self) -> None:
        for name in ("ks", "intensity_tokens", "intensity_ks", "seeds"):
            value = support.check_type(name, getattr(self, name), (tuple, list))
            if not value:
                raise ValueError(f"{name} must not be empty")
            object.__setattr__(self, name, tuple(value))
        for name in ("heads", "draft_layers", "draft_d_model", "target_layers", "target_d_model",
                     "draft_steps", "target_steps", "batch_size", "prompts", "alpha_windows",
                     "rounds", "step_rounds", "part_repeats", "intensity_rounds", "query_heads",
                     "kv_heads",
                     "head_dim"):
            support.check_int(name, getattr(self, name), minimum=1)
        support.check_int("context_length", self.context_length, minimum=4)
        support.check_int("prompt", self.prompt, minimum=1, maximum=self.context_length - 2)
        support.check_int("new_tokens", self.new_tokens, minimum=2,
                          maximum=self.context_length - self.prompt)
        support.check_int("timing_prompts", self.timing_prompts, minimum=1, maximum=self.prompts)
        support.check_number("draft_learning_rate", self.draft_learning_rate, above=0)
        support.check_number("target_learning_rate", self.target_learning_rate, above=0)
        support.check_number("gate_margin", self.gate_margin, minimum=0)
        support.check_number("gate_baseline", self.gate_baseline, minimum=0)
        support.check_number("temperature", self.temperature, minimum=0)
        support.check_int_sequence("ks", self.ks, minimum=1, maximum=self.new_tokens - 1)
        support.check_int_sequence("intensity_tokens", self.intensity_tokens, minimum=1)
        support.check_int_sequence("intensity_ks", self.intensity_ks, minimum=1,
                                   maximum=min(self.intensity_tokens))
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        support.check_divides("kv_heads", self.kv_heads, "query_heads", self.query_heads)
        support.check_choice("floors", self.floors, ("full", "quick"))
        for layers, width in ((self.draft_layers, self.draft_d_model),
                              (self.target_layers, self.target_d_model)):
            self.config(layers, width)  # GPTConfig's own checks (heads divide the width)

    def config(self, layers: int, d_model: int) -> ch02.GPTConfig:
        return ch02.GPTConfig(vocab_size=256, context_length=self.context_length, d_model=d_model,
                              layers=layers, heads=self.heads)


#: Toy sizes for the tests and ``--size tiny``: every step of the full run, in seconds.
TINY = SpeculativeSettings(context_length=24, heads=2, draft_d_model=8, target_layers=2,
                           target_d_model=16, draft_steps=2, target_steps=2, batch_size=2,
                           gate_margin=0.0, gate_baseline=0.0, ks=(1, 3), prompt=8, new_tokens=12,
                           prompts=2, alpha_windows=2, timing_prompts=1, rounds=2, step_rounds=2, part_repeats=1,
                           intensity_tokens=(256,), intensity_ks=(1, 2), intensity_rounds=2,
                           query_heads=4, kv_heads=2, head_dim=8, floors="quick", seeds=(0,))
SIZES = {"full": SpeculativeSettings(), "tiny": TINY}


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 2's split of the novel's bytes: the first 90 % to train, the rest held out."""
    ids = torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()))
    split = int(0.9 * ids.numel())
    return ids[:split], ids[split:]


def passes_gate(run: dict, settings: SpeculativeSettings) -> bool:
    """Whether a seed's two models are fit to compare: the gate Chapter 13 states before the run.

    The target's held-out loss is at least ``gate_margin`` below the draft's, and the draft's at
    least ``gate_baseline`` below the unigram entropy (so the target's is too).
    """
    losses = run["held_out_loss"]
    return (losses["target"] <= losses["draft"] - settings.gate_margin
            and losses["draft"] <= run["unigram_entropy"] - settings.gate_baseline)


def _train(settings: SpeculativeSettings, layers: int, d_model: int, steps: int, rate: float,
           seed: int, train_ids: torch.Tensor) -> tuple[ch02.TinyGPT, float]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = ch02.TinyGPT(settings.config(layers, d_model))
    clock = time.perf_counter()
    ch02.train(model, train_ids, steps=steps, batch_size=settings.batch_size,
               learning_rate=rate, seed=seed, progress=False)
    return model.eval(), time.perf_counter() - clock


@torch.no_grad()
def alpha_along(target: ch02.TinyGPT, draft: ch02.TinyGPT, ids: torch.Tensor, first: int,
                temperature: float) -> torch.Tensor:
    """alpha at each position of ``ids`` (B, T) from ``first`` on: both models read it whole."""
    target_rows = ch08.token_probabilities(target(ids)[:, first:], temperature)
    draft_rows = ch08.token_probabilities(draft(ids)[:, first:], temperature)
    return ch08.acceptance_rate(target_rows, draft_rows)  # (B, T - first)


def step_costs(settings: SpeculativeSettings, target, draft, prompt: list[int]) -> dict:
    """One cached step of each model after ``prompt``, and the target reading k + 1 tokens."""
    caches = {"target": target.new_cache(), "draft": draft.new_cache()}
    models = {"target": target, "draft": draft}
    with torch.no_grad():
        for name, cache in caches.items():
            models[name](torch.tensor([prompt]), cache)
    start = len(prompt)
    extra = [0] * (max(settings.ks) + 1)

    def step(name: str, tokens: int):
        model, cache = models[name], caches[name]

        def call():
            with torch.no_grad():
                model(torch.tensor([extra[:tokens]]), cache)
            ch08.truncate_cache(cache, start)
        return call

    # the bookkeeping beside the forwards: a token's softmax and draw, and a round's check
    temperature, generator = settings.temperature, torch.Generator().manual_seed(0)
    with torch.no_grad():
        target_logits = target(torch.tensor([prompt]))[0]  # (T, n_vocab)
        draft_rows = ch08.token_probabilities(draft(torch.tensor([prompt]))[0], temperature)
    drafted = draft_rows.argmax(-1)  # tokens the draft gives weight, as drawn ones have

    def sample():  # what the loop does per drafted token beside the draft's forward
        rows = ch08.token_probabilities(target_logits[-1], temperature)
        return int(torch.multinomial(rows, 1, generator=generator))

    def plain_sample():  # what ch02.generate does per token beside the target's forward
        return ch02.next_token(target_logits[-1], temperature, None, generator)

    def check(k: int):  # per round: the k + 1 rows' softmax, the rule, both caches cut back
        def call():
            rows = ch08.token_probabilities(target_logits[:k + 1], temperature)
            ch08.speculative_verify(rows, draft_rows[:k], drafted[:k], generator)
            for cache in caches.values():
                ch08.truncate_cache(cache, start)
        return call

    functions = {"draft": step("draft", 1), "target": step("target", 1), "sample": sample,
                 "plain_sample": plain_sample}
    functions |= {f"target_{k + 1}": step("target", k + 1) for k in settings.ks}
    functions |= {f"check_{k}": check(k) for k in settings.ks}
    seconds = interleaved(functions, rounds=settings.step_rounds, min_run_time=0.05)
    return {"seconds": seconds, "cost": ratio(seconds, "draft", "target"),
            "verify": {str(k): ratio(seconds, f"target_{k + 1}", "target") for k in settings.ks}}


def decode_parts(functions: dict, target, draft, tokens: int, *, repeats: int) -> dict:
    """Seconds per token of each decode of ``functions``, whole and inside each model's forwards.

    Forward hooks on both models add up the time spent in their forwards; whatever else a decode
    takes is the loop's own work. Each decode runs ``repeats`` times, in a rotating order; the
    medians are kept.
    """
    spent, started = {"target": 0.0, "draft": 0.0}, {}

    def before(name: str):
        def hook(module, args):
            started[name] = time.perf_counter()
        return hook

    def after(name: str):
        def hook(module, args, output):
            spent[name] += time.perf_counter() - started[name]
        return hook

    models = (("target", target), ("draft", draft))
    handles = [model.register_forward_pre_hook(before(name)) for name, model in models]
    handles += [model.register_forward_hook(after(name)) for name, model in models]
    names, records = list(functions), {name: [] for name in functions}
    try:
        for turn in range(repeats):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                spent.update(target=0.0, draft=0.0)
                clock = time.perf_counter()
                functions[name]()
                records[name].append({"total": time.perf_counter() - clock, **spent})
    finally:
        for handle in handles:
            handle.remove()
    return {name: {part: statistics.median(r[part] for r in rows) / tokens
                   for part in ("total", "target", "draft")} for name, rows in records.items()}


def run_job(settings: SpeculativeSettings, seed: int) -> dict:
    """Train the draft and the target with ``seed``; measure alpha, the costs and the speeds."""
    s = settings
    torch.set_num_threads(1)
    clock, cpu = time.perf_counter(), time.process_time()
    train_ids, held_out = texts()
    draft, draft_seconds = _train(s, s.draft_layers, s.draft_d_model, s.draft_steps,
                                  s.draft_learning_rate, seed, train_ids)
    target, target_seconds = _train(s, s.target_layers, s.target_d_model, s.target_steps,
                                    s.target_learning_rate, seed, train_ids)
    run = {"seed": seed, "train_seconds": {"draft": draft_seconds, "target": target_seconds},
           "unigram_entropy": ch02.unigram_entropy(train_ids, 256),
           "held_out_loss": {name: ch02.evaluate_loss(model, held_out, seed=seed)
                             for name, model in (("draft", draft), ("target", target))},
           "parameters": {name: sum(p.numel() for p in model.parameters())
                          for name, model in (("draft", draft), ("target", target))}}
    generator = torch.Generator().manual_seed(EVALUATION_SEED + seed)
    length = s.context_length
    starts = torch.randint(0, held_out.numel() - length, (s.alpha_windows,), generator=generator)
    windows = held_out[starts[:, None] + torch.arange(length)]  # (windows, T)
    alpha_text = alpha_along(target, draft, windows, 0, s.temperature)
    run["alpha_text"] = [round(float(v), 5) for v in alpha_text.mean(1)]  # one per window
    starts = torch.randint(0, held_out.numel() - s.prompt, (s.prompts,), generator=generator)
    prompts = [held_out[start:start + s.prompt].tolist() for start in starts]
    run["costs"] = step_costs(s, target, draft, prompts[0])
    decoded = {}
    for k in s.ks:
        entries = []
        for number, prompt in enumerate(prompts):
            out = ch08.speculative_generate(target, draft, prompt, s.new_tokens, k=k,
                                            temperature=s.temperature, seed=number)
            ids = torch.tensor([prompt + out.tokens])
            along = alpha_along(target, draft, ids[:, :-1], s.prompt - 1, s.temperature)
            entries.append({"drafted": out.drafted, "accepted": out.accepted,
                            "alpha_generated": round(float(along.mean()), 5)})
        decoded[str(k)] = entries
    run["decoded"] = decoded
    timed = prompts[:s.timing_prompts]
    greedy = [ch02.generate(target, prompt, s.new_tokens) for prompt in timed]
    run["greedy_equal"] = {  # at temperature 0 the text must be the target's greedy text
        str(k): all(ch08.speculative_generate(target, draft, prompt, s.new_tokens, k=k,
                                              temperature=0).tokens == text
                    for prompt, text in zip(timed, greedy, strict=True))
        for k in s.ks}

    def plain():
        for number, prompt in enumerate(timed):
            ch02.generate(target, prompt, s.new_tokens, temperature=s.temperature, seed=number)

    def speculative(k: int):
        def call():
            for number, prompt in enumerate(timed):
                ch08.speculative_generate(target, draft, prompt, s.new_tokens, k=k,
                                          temperature=s.temperature, seed=number)
        return call

    functions = {"plain": plain} | {f"k{k}": speculative(k) for k in s.ks}
    seconds = interleaved(functions, rounds=s.rounds, min_run_time=0.05)
    tokens = s.new_tokens * len(timed)
    rates = {}
    for name, values in seconds.items():  # tokens per second: median and interval over rounds
        middle, low, high, covered = median_interval([tokens / v for v in values])
        rates[name] = {"median": middle, "low": low, "high": high, "coverage": covered}
    run["decode"] = {"seconds": seconds, "tokens": tokens, "tokens_per_second": rates,
                     "speedup": {str(k): ratio(seconds, "plain", f"k{k}") for k in s.ks},
                     "parts": decode_parts(functions, target, draft, tokens,
                                           repeats=s.part_repeats)}
    run["passed"] = passes_gate(run, s)
    run["seconds"] = time.perf_counter() - clock
    run["cpu_seconds"] = time.process_time() - cpu
    return run


def time_verification(query: torch.Tensor, copies: list, *, rounds: int) -> dict[str, list[float]]:
    """Seconds of one step of the k rows of ``query`` (1, H_q, k, d) against a cache, and of k steps
    of one row each, in interleaved rounds; each call reads the next of the cache ``copies``.

    The one step masks the k new tokens causally (row i sees all but the last k - 1 - i keys); a
    one-row step sees every key, k - 1 - i more than its token would: at most 7 of 16K.
    """
    k, tokens = query.shape[2], copies[0][0].shape[2]
    mask = torch.ones(k, tokens, dtype=torch.bool).tril(diagonal=tokens - k)  # (k, T)
    turns = {"rows": itertools.count(), "single": itertools.count()}

    def cache(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return copies[next(turns[name]) % len(copies)]

    def rows():  # one step: the k rows read each stored head once
        key, value = cache("rows")
        return ch03.grouped_attention(query, key, value, mask)

    def single():  # k steps: every row reads the whole cache again
        key, value = cache("single")
        return [ch03.grouped_attention(query[:, :, i:i + 1], key, value) for i in range(k)]

    return interleaved({"rows": rows, "single": single}, rounds=rounds, min_run_time=0.05)


def run_intensity(settings: SpeculativeSettings) -> dict:
    """k query rows against one long cache in one step, against k one-row steps, cold."""
    s = settings
    torch.set_num_threads(1)
    clock = time.perf_counter()
    quick = s.floors == "quick"
    device = torch.device("cpu")
    first = measure_floors(device=device, threads=1, quick=quick, progress=lambda _: None)
    generator = torch.Generator().manual_seed(0)
    cases = []
    for tokens in s.intensity_tokens:
        shape = (1, s.kv_heads, tokens, s.head_dim)
        cache_bytes = 2 * s.kv_heads * tokens * s.head_dim * 4  # keys and values, float32
        copies = [(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
                  for _ in range(cold_copies(cache_bytes, cold=True))]
        for k in s.intensity_ks:
            query = torch.randn(1, s.query_heads, k, s.head_dim, generator=generator)
            seconds = time_verification(query, copies, rounds=s.intensity_rounds)
            cases.append({"tokens": tokens, "k": k, "cache_bytes": cache_bytes,
                          "copies": len(copies),
                          "flops": k * attention_flops(s.query_heads, tokens, s.head_dim),
                          "seconds": seconds, "ratio": ratio(seconds, "rows", "single")})
        del copies
    last = measure_floors(device=device, threads=1, quick=quick, progress=lambda _: None)
    return {"cases": cases, "floors": best_floors(first, last),
            "seconds": time.perf_counter() - clock}


def pooled_speedup(runs: list[dict], ks: tuple[int, ...]) -> dict:
    """The speedup at each k over the interleaved rounds of every gated seed together: the median
    of all their per-round ratios, with its distribution-free interval (none if no seed passed)."""
    gated = [run for run in runs if run["passed"]]
    speedup = {str(k): ratio({name: [v for run in gated for v in run["decode"]["seconds"][name]]
                              for name in ("plain", f"k{k}")}, "plain", f"k{k}")
               for k in ks} if gated else {}
    return {"seeds": [run["seed"] for run in gated], "speedup": speedup}


def job_count(settings: SpeculativeSettings) -> int:
    """The processes a run starts: one per seed, and the verification timing."""
    return len(settings.seeds) + 1


def run_experiment(settings: SpeculativeSettings, *, jobs: int = 2, progress: bool = True) -> dict:
    """Run one job per seed, ``jobs`` at a time, then the verification timing alone.

    Raises:
        TypeError, ValueError: If ``settings`` is not a SpeculativeSettings or ``jobs`` < 1.
    """
    support.check_type("settings", settings, SpeculativeSettings)
    jobs = support.check_int("jobs", jobs, minimum=1)
    support.check_bool("progress", progress)
    runs = run_seeds(run_job, settings, jobs=jobs, progress=progress)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:  # alone on the machine
        intensity = pool.submit(run_intensity, settings).result()
    if progress:
        print(f"  verification timing: {intensity['seconds']:.0f} s", file=sys.stderr, flush=True)
    return {"settings": dataclasses.asdict(settings), "evaluation_seed": EVALUATION_SEED,
            "gate": {"margin": settings.gate_margin, "baseline": settings.gate_baseline},
            "runs": runs, "pooled_speedup": pooled_speedup(runs, settings.ks),
            "intensity": intensity}
