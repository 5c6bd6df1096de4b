# Generated from chapters/ch06-extension.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch06-extension.qmd ("Stretching a trained model's context, measured")."""

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from longctx import ch01, ch02, ch03, support


# chapters/ch06-extension.qmd:93
class RotarySelfAttention(ch02.CausalSelfAttention):
    """Chapter 2's causal attention with RoPE on queries and keys.

    The query and key of the token at position m are turned by ``ch03``'s
    rotation R(m) (and scaled by the layer's magnitude) before the scores
    are taken; values are left alone. Positions start after the tokens
    already in the cache, so they may run past any length.

    Args:
        d_model: Width d of each token's vector.
        heads: Number of heads H; the head width d_h = d / H must be even
            and at least 4 (RoPE turns pairs of coordinates).
        fused: Whether a pass without a cache uses PyTorch's fused
            attention kernel instead of the teaching attention.

    Raises:
        TypeError: If ``fused`` is not a bool (and as Chapter 1's layer).
        ValueError: If the head width d / H is odd or below 4.
    """

    def __init__(self, d_model: int, heads: int, *, fused: bool = False):
        """Build the projections and RoPE bands; the Args are the class's."""
        super().__init__(d_model, heads)
        self.fused = support.check_bool("fused", fused)
        if self.head_dim % 2 or self.head_dim < 4:
            raise ValueError("the rotary head width d_model / heads must be "
                             f"even and at least 4 (got {self.head_dim})")
        frequencies, magnitude = ch03.inverse_frequencies(self.head_dim)
        self.register_buffer("frequencies", frequencies, persistent=False)
        self.magnitude = magnitude

    def set_bands(self, frequencies: Tensor, magnitude: float = 1.0) -> None:
        """Use ``frequencies`` (d_h / 2,) and ``magnitude`` from now on.

        They are the pair ``recipe_bands`` returns; ``RotaryGPT.set_rope``,
        where a recipe and its factor enter, has them checked there.
        """
        self.magnitude = magnitude
        self.frequencies = frequencies.to(torch.float64)

    def add_positions(self, query: Tensor, key: Tensor,
                      start: int) -> tuple[Tensor, Tensor]:
        """Return ``query`` and ``key`` (B, H, T, d_h) turned by R(m).

        The T tokens sit at positions m = ``start``, ``start + 1``, ...
        """
        positions = torch.arange(start, start + query.shape[2],
                                 device=query.device)  # m

        def turn(vectors: Tensor) -> Tensor:  # R(m) of ch03
            return ch03.apply_rope(vectors, positions, self.frequencies,
                                   self.magnitude)

        return turn(query), turn(key)

    def attend(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Return causal attention (B, H, T, d_h), fused if ``fused``."""
        if not self.fused:
            return super().attend(query, key, value)  # Chapter 1's
        mask = ch01.causal_mask(query.shape[2], device=query.device)
        return F.scaled_dot_product_attention(query, key, value,
                                              attn_mask=mask)


# chapters/ch06-extension.qmd:180
#: Each recipe's settings beside its factor, in one place: YaRN's band
#: boundaries (its paper's values for LLaMA) and Llama 3.1's thresholds
#: (the rope_scaling entry of its released config.json).
RECIPE_SETTINGS: dict[str, dict[str, float]] = {
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
}
#: The model YaRN's boundaries were set for: Llama 2's base and trained
#: length, from its released config.json.
YARN_REFERENCE: dict[str, float] = {"base": 10_000.0, "length": 4_096}
#: Two readings of YaRN beside the recipe, as ablations: the paper's
#: boundaries unscaled, and the rescaled bands without the temperature.
YARN_VARIANTS = ("yarn-paper", "yarn-no-temperature")


def yarn_thresholds(base: float, original_context: int) -> dict[str, float]:
    """Return YaRN's beta_fast and beta_slow rescaled to a trained length.

    A boundary of beta turns sits at the share s = ln(T_ref / (2 pi beta))
    / ln b_ref of the band index range of ``YARN_REFERENCE``; the band at
    the same share of a model with base b and trained length T_0 turns
    beta' = T_0 / (2 pi) * b^(-s) times within T_0.
    """
    rescaled = {}
    for name, beta in RECIPE_SETTINGS["yarn"].items():
        share = (math.log(YARN_REFERENCE["length"] / (2 * math.pi * beta))
                 / math.log(YARN_REFERENCE["base"]))
        rescaled[name] = original_context / (2 * math.pi) * base**-share
    return rescaled


def recipe_bands(method: str, head_dim: int, *, factor: float,
                 base: float = 10_000.0,
                 original_context: int) -> tuple[Tensor, float]:
    """Return ``ch03``'s (frequencies (d_h / 2,), magnitude) for a recipe.

    At factor a = T_1 / T_0, with the recipe's ``RECIPE_SETTINGS``; YaRN's
    boundaries rescaled to T_0 by ``yarn_thresholds``. ``yarn-paper`` keeps
    the paper's boundaries; ``yarn-no-temperature`` has magnitude 1.

    Raises:
        ValueError: If ``method`` is not in ROPE_METHODS or YARN_VARIANTS.
    """
    support.check_choice("method", method,
                         tuple(ch03.ROPE_METHODS) + YARN_VARIANTS)
    settings = RECIPE_SETTINGS.get(method, {})
    if method in ("yarn", "yarn-no-temperature"):
        settings = yarn_thresholds(base, original_context)
    if method == "yarn-paper":
        settings = RECIPE_SETTINGS["yarn"]
    frequencies, magnitude = ch03.inverse_frequencies(
        head_dim, method=method.split("-")[0], base=base, factor=factor,
        original_context=original_context, **settings)
    if method == "yarn-no-temperature":
        magnitude = 1.0
    return frequencies, magnitude


class RotaryGPT(ch02.TinyGPT):
    """TinyGPT with rotary attention instead of the learned position table.

    ``config.context_length`` is the trained length T_0: the recipes read
    it, and positions past it are accepted. The model starts with plain
    RoPE bands of base b; ``set_rope`` switches every layer to a recipe.

    Args:
        config: The sizes; ``context_length`` is the trained length T_0.
        base: The rotary base b of the plain bands (above 1).
        fused: Whether passes without a cache use PyTorch's fused kernel.

    Raises:
        TypeError: If ``config`` is not a GPTConfig, or an argument has the
            wrong type.
        ValueError: If ``base`` <= 1 or the head width is odd or below 4.
    """

    def __init__(self, config: ch02.GPTConfig, *, base: float = 10_000.0,
                 fused: bool = False):
        """Build TinyGPT's layers, rotary; the Args are the class's."""
        super().__init__(config)
        self.base = support.check_number("base", base, above=1)
        del self.position_embedding  # position enters through rotation alone
        for block in self.blocks:
            block.attention = RotarySelfAttention(config.d_model,
                                                  config.heads, fused=fused)
            block.attention.apply(self._init_weights)
        self.set_rope("rope")

    def set_rope(self, method: str = "rope", factor: float = 1.0) -> None:
        """Give every layer the bands of ``method`` at extension ``factor``.

        Raises:
            TypeError, ValueError: For an unknown method (one of
                ``ROPE_METHODS`` or ``YARN_VARIANTS``) or a factor below 1.
        """
        frequencies, magnitude = recipe_bands(
            method, self.config.head_dim, factor=factor, base=self.base,
            original_context=self.config.context_length)
        for block in self.blocks:
            block.attention.set_bands(frequencies, magnitude)
        self.rope = (method, float(factor))

    def forward(self, tokens: Tensor,
                cache: ch02.KVCache | None = None) -> Tensor:
        """Return next-token logits (B, T, V) for ``tokens`` (B, T).

        With a ``cache`` (one of ``new_cache``'s, for the same batch) the
        tokens continue the cached sequence. No position is refused; ids and
        shapes are left to PyTorch's embedding, as in Chapter 2.
        """
        x = self.embedding_dropout(self.token_embedding(tokens))  # (B, T, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)  # (B, T, d)
        return self.lm_head(self.final_norm(x))  # (B, T, V)


# chapters/ch06-extension.qmd:396
#: The byte that opens a record and, at the end of a window, the question.
KEY_MARK = "#"
#: The byte that closes the question; the answer is the byte after it.
KEY_ASK = "="
#: The bytes names and values are drawn from; the filler text has none.
KEY_SYMBOLS = "0123456789"
#: How ``answer_kinds`` classes an answer, by its code 0, 1, 2.
ANSWER_KINDS = ("asked", "distractor", "other")
#: The answers a model that reads no question could give (``baseline``).
BASELINES = ("random record", "nearest record", "most frequent")


def key_free_text(token_ids: Tensor) -> Tensor:
    """Return the byte ids (N,) without a mark, an ask or a key symbol.

    Filler in which a planted record is the only thing that looks like one
    (``KEY_MARK``, ``KEY_ASK`` and ``KEY_SYMBOLS`` all removed).
    """
    banned = torch.tensor([ord(c) for c in KEY_MARK + KEY_ASK + KEY_SYMBOLS])
    return token_ids[~torch.isin(token_ids, banned)]


class KeyBatch(NamedTuple):
    """Windows with planted records and one question, from ``key_batch``.

    Attributes:
        inputs: Byte ids (B, T) the model reads; they end on the question's
            mark, the asked name and ``KEY_ASK``.
        targets: Byte ids (B, T), the inputs shifted by one; the last is
            the asked value.
        answers: Bool (B, T), True at the last target only.
        starts: (B, K) positions where each record begins (column 0: the
            record asked).
        values: (B, K) byte ids of each record's value (column 0: the
            answer).
    """

    inputs: Tensor
    targets: Tensor
    answers: Tensor
    starts: Tensor
    values: Tensor

    @property
    def distance(self) -> Tensor:
        """(B,) bytes from the asked record's mark to the question's."""
        return self.inputs.shape[1] - 3 - self.starts[:, 0]


def key_batch(text: Tensor, depths: Tensor, length: int,
              generator: torch.Generator, *, keys: int = 1) -> KeyBatch:
    """Return windows of ``text``, ``keys`` records planted in each, one asked.

    Record 0, the one asked, starts at p = round(depths[i] * (T - 6)); the
    others at random places clear of every record, so that with a depth
    drawn at random the asked record's rank among them is random too. The
    names of a window differ; values are drawn independently. The window
    closes with the question: the mark, record 0's name and ``KEY_ASK``,
    then its value, the last target. Training and evaluation both draw
    their windows here. Every draw comes from ``generator``; ``text``
    should be key-free.

    Raises:
        ValueError: If ``keys`` is not 1 to len(KEY_SYMBOLS), or the
            records do not fit in the window.
    """
    keys = support.check_int("keys", keys, minimum=1, maximum=len(KEY_SYMBOLS))
    last = length - 6  # the latest start: a record, then the question
    if 3 * keys > last + 1:
        raise ValueError(f"{keys} records and a question do not fit in a "
                         f"window of {length} (need length >= 3 keys + 5)")
    batch = depths.numel()
    inputs, targets = ch02.sample_batch(text, batch, length, generator)
    window = torch.cat([inputs, targets[:, -1:]], dim=1)  # (B, T + 1)
    symbols = torch.tensor([ord(c) for c in KEY_SYMBOLS])
    names = torch.stack([torch.randperm(len(symbols), generator=generator)
                         for _ in range(batch)])[:, :keys]  # (B, K), distinct
    values = torch.randint(0, len(symbols), (batch, keys),
                           generator=generator)  # (B, K)
    starts = torch.empty(batch, keys, dtype=torch.long)
    for row, depth in enumerate(depths.tolist()):
        taken = [round(depth * last)]  # record 0, at its depth
        for place in torch.randperm(last + 1, generator=generator).tolist():
            if len(taken) == keys:
                break
            if all(abs(place - other) >= 3 for other in taken):
                taken.append(place)  # clear of every other record
        starts[row] = torch.tensor(taken)
    rows = torch.arange(batch)[:, None]
    window[rows, starts] = ord(KEY_MARK)
    window[rows, starts + 1] = symbols[names]
    window[rows, starts + 2] = symbols[values]
    window[:, -4] = ord(KEY_MARK)  # the question: mark, name, ask, value
    window[:, -3] = symbols[names[:, 0]]
    window[:, -2] = ord(KEY_ASK)
    window[:, -1] = symbols[values[:, 0]]  # the answer
    answers = torch.zeros(batch, length, dtype=torch.bool)
    answers[:, -1] = True
    return KeyBatch(window[:, :-1], window[:, 1:], answers, starts,
                    symbols[values])


# chapters/ch06-extension.qmd:554
def train_with_keys(model: RotaryGPT, text: Tensor, *, steps: int,
                    batch_size: int, length: int, key_share: float,
                    learning_rate: float, seed: int, max_keys: int = 1,
                    progress: tqdm | None = None) -> list[float]:
    """Train ``model`` in place by Equation 11.1; return each step's loss.

    Each step draws ``batch_size`` windows of ``length`` bytes of ``text``;
    round(key_share * batch_size) of them carry records (``key_batch``,
    depth uniform in [0, 1]): half one record, half ``max_keys``. AdamW,
    cosine decay to a tenth of the rate and clipping as in Chapter 2's
    ``train``, after a linear warm-up over the first tenth of the steps.
    The model is left in eval mode.

    Raises:
        TypeError, ValueError: For an argument of the wrong type or range,
            or a ``text`` no longer than one window.
    """
    support.check_type("model", model, RotaryGPT)
    steps = support.check_int("steps", steps, minimum=1)
    max_keys = support.check_int("max_keys", max_keys, minimum=1,
                                 maximum=len(KEY_SYMBOLS))
    batch_size = support.check_int("batch_size", batch_size, minimum=2)
    key_share = support.check_number("key_share", key_share, minimum=0,
                                     maximum=1)
    learning_rate = support.check_number("learning_rate", learning_rate,
                                         above=0)
    seed = support.check_int("seed", seed, minimum=0)
    support.check_type("progress", progress, tqdm, optional=True)
    length = support.check_int("length", length, minimum=3 * max_keys + 5)
    support.check_tensor("text", text, dims=1, dtype=torch.long)
    if text.numel() <= length + 1:
        raise ValueError(f"text must hold more than length + 1 = "
                         f"{length + 1} tokens (got {text.numel()})")
    keyed = min(round(key_share * batch_size), batch_size - 1)  # |K| rows
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate,
                                  weight_decay=0.01)
    warmup = max(1, steps // 10)

    def rate(step: int) -> float:  # a share of learning_rate
        rise = min(1.0, (step + 1) / warmup)  # linear over the first tenth
        return rise * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))

    def records(rows: int, keys: int) -> KeyBatch:  # one record asked
        depths = torch.rand(rows, generator=generator, dtype=torch.float64)
        return key_batch(text, depths, length, generator, keys=keys)

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    losses = []
    model.train()
    for _ in range(steps):
        text_in, text_out = ch02.sample_batch(text, batch_size - keyed,
                                              length, generator)
        parts = [(text_in, text_out, torch.zeros_like(text_in, dtype=bool))]
        single = keyed if max_keys == 1 else keyed // 2
        if single:
            parts.append(records(single, 1)[:3])
        if keyed > single:
            parts.append(records(keyed - single, max_keys)[:3])
        inputs, targets, answers = (torch.cat(column)  # (B, T) each
                                    for column in zip(*parts, strict=True))
        per_target = F.cross_entropy(model(inputs).transpose(1, 2), targets,
                                     reduction="none")  # (B, T)
        loss = per_target[~answers].mean()  # the text term of Eq. 6.1
        if keyed:
            loss = loss + per_target[answers].mean()  # the answers' term
        losses.append(ch02.training_step(model, optimizer, loss,
                                         schedule=schedule))
        if progress is not None:
            progress.update(1)
    model.eval()
    return losses


# chapters/ch06-extension.qmd:666
@torch.no_grad()
def position_losses(model: RotaryGPT, text: Tensor, *, length: int,
                    windows: int, span: int | None = None) -> Tensor:
    """Return the next-byte loss (windows, length) at every position.

    Window w ends at byte e_w = round(span + w (N - span - 2) / (windows -
    1)) of the N bytes of ``text`` at every length up to ``span`` (default
    ``length``): the last positions of a short window predict the same
    bytes as those of a long one.
    """
    span = length if span is None else span
    ends = torch.linspace(span, text.numel() - 2, windows).round().long()
    offsets = torch.arange(-length, 0)  # (T,): the T bytes before e_w
    inputs = text[ends[:, None] + offsets]  # (W, T)
    targets = text[ends[:, None] + offsets + 1]  # (W, T)
    return F.cross_entropy(model(inputs).transpose(1, 2), targets,
                           reduction="none")  # (W, T)


def key_trials(text: Tensor, *, length: int, depths: tuple[float, ...],
               trials: int, seed: int, keys: int = 1) -> KeyBatch:
    """Return the held-out trials: ``trials`` windows at each depth.

    Row d * trials + j is trial j at depth ``depths[d]``, drawn by
    ``key_batch`` from a generator seeded with ``seed``: one seed, the
    same windows for every model scored on them.
    """
    where = torch.tensor(depths, dtype=torch.float64).repeat_interleave(trials)
    return key_batch(text, where, length,
                     torch.Generator().manual_seed(seed), keys=keys)


@torch.no_grad()
def key_guesses(model: RotaryGPT, batch: KeyBatch, *,
                chunk: int = 32) -> Tensor:
    """Return the model's most likely byte (B,) after each question."""
    return torch.cat([model(part)[:, -1].argmax(-1)
                      for part in batch.inputs.split(chunk)])  # (B,)


def answer_kinds(batch: KeyBatch, guesses: Tensor) -> Tensor:
    """Return a code (B,) per answer, as named in ``ANSWER_KINDS``.

    0: the asked value; 1: not it, but another planted record's value;
    2: anything else.
    """
    asked = guesses == batch.values[:, 0]
    planted = (guesses[:, None] == batch.values[:, 1:]).any(-1)
    return torch.where(asked, 0, torch.where(planted, 1, 2))


def baseline(batch: KeyBatch, rule: str, generator: torch.Generator) -> Tensor:
    """Return the bytes (B,) a rule of ``BASELINES`` answers, blind to names.

    "random record": a planted record's value, drawn uniformly;
    "nearest record": the value of the record that ends nearest the
    question; "most frequent": the value asked most often in ``batch``,
    the same byte for every window.
    """
    support.check_choice("rule", rule, BASELINES)
    rows = torch.arange(batch.values.shape[0])
    if rule == "random record":
        pick = torch.randint(0, batch.values.shape[1], rows.shape,
                             generator=generator)
        return batch.values[rows, pick]
    if rule == "nearest record":
        return batch.values[rows, batch.starts.argmax(-1)]
    return batch.values[:, 0].mode().values.expand(rows.shape)


@torch.no_grad()
def key_hits(model: RotaryGPT, text: Tensor, *, length: int,
             depths: tuple[float, ...], trials: int, seed: int,
             keys: int = 1, chunk: int = 32) -> Tensor:
    """Return a bool (len(depths), trials) grid: was the asked value found?

    The trials of ``key_trials``; a hit is the model's most likely byte
    after the question (``key_guesses``) being the asked value.
    """
    batch = key_trials(text, length=length, depths=depths, trials=trials,
                       seed=seed, keys=keys)
    guesses = key_guesses(model, batch, chunk=chunk)
    return (guesses == batch.values[:, 0]).view(len(depths), trials)


# chapters/ch06-extension.qmd:792
@functools.cache
def student_t_quantile(probability: float, dof: int) -> float:
    """Return t with P(T <= t) = ``probability``, ``dof`` degrees of freedom.

    Student's density integrated by Simpson's rule, then bisection.
    """
    log_scale = (math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)
                 - 0.5 * math.log(dof * math.pi))

    def cdf(t: float, steps: int = 2_000) -> float:  # 1/2 + integral 0..t
        h = t / steps
        density = [math.exp(log_scale - (dof + 1) / 2
                            * math.log1p((i * h) ** 2 / dof))
                   for i in range(steps + 1)]
        weights = [1] + [4 if i % 2 else 2 for i in range(1, steps)] + [1]
        return 0.5 + h / 3 * sum(w * f for w, f in zip(weights, density,
                                                          strict=True))

    low, high = 0.0, 1_000.0
    for _ in range(50):
        middle = (low + high) / 2
        low, high = ((middle, high) if cdf(middle) < probability
                     else (low, middle))
    return (low + high) / 2


def seed_window_interval(values: Tensor) -> tuple[float, float, float]:
    """Return (mean, low, high): Equation 11.2's 95% interval.

    ``values`` is (seeds S, windows W); with one seed, only the windows'
    part counts, on W - 1 degrees of freedom.
    """
    seeds, windows = values.shape
    values = values.double()
    variance = values.mean(0).var().item() / windows  # the windows' luck
    if seeds > 1:
        variance += values.mean(1).var().item() / seeds  # the seeds' luck
    dof = seeds - 1 if seeds > 1 else windows - 1
    half = student_t_quantile(0.975, dof) * math.sqrt(variance)
    mean = values.mean().item()
    return mean, mean - half, mean + half


def mcnemar(first: Tensor, second: Tensor) -> tuple[int, int, float]:
    """Return (n_1, n_2, p-value): McNemar's exact test of paired hits.

    ``first`` and ``second`` are bool tensors of hits on the same trials;
    n_1 counts those only the first got right, n_2 those only the second
    did, and the p-value is the exact two-sided binomial tail. Hits of
    several seeds, each on its own windows, may be passed flattened: with
    every pair its own stratum this is the exact form of the
    Cochran-Mantel-Haenszel test, and the seeds' pairs are independent.
    """
    only_first = int((first & ~second).sum())
    only_second = int((second & ~first).sum())
    split = only_first + only_second
    smaller = min(only_first, only_second)
    tail = sum(math.comb(split, k) for k in range(smaller + 1)) / 2**split
    return only_first, only_second, min(1.0, 2 * tail)


def holm(p_values: list[float]) -> list[float]:
    """Return Holm's adjusted p-values, in the order given.

    The i-th smallest of m is multiplied by m - i + 1 (i from 1), and no
    adjusted value is below one before it: rejecting those under 0.05
    keeps the chance of any false rejection in the family under 0.05.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# chapters/ch06-extension.qmd:910
def turning_bands(head_dim: int, base: float, length: int) -> int:
    """Return how many of the d_h / 2 bands turn fully within ``length``.

    Band j of base b does when its wavelength 2 pi b^(2j/d_h) <= length.
    """
    frequencies, _ = ch03.inverse_frequencies(head_dim, base=base)
    return int((2 * math.pi / frequencies <= length).sum())


def matched_base(length: int, *, reference_base: float,
                 reference_length: int) -> float:
    """Return the base b of Equation 11.3 for a trained length ``length``.

    With it the same fraction of the band index range turns within
    ``length`` as the reference's does within ``reference_length``.
    """
    share = math.log(length / (2 * math.pi)) / math.log(
        reference_length / (2 * math.pi))
    return reference_base**share
