# Generated from chapters/ch06-extension.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch06-extension.qmd ("Stretching a trained model's context, measured")."""

import copy
import json
import math
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from longctx import ch01, ch02, ch03, support


# chapters/ch06-extension.qmd:85
class RotarySelfAttention(ch02.CausalSelfAttention):
    """Chapter 2's causal attention with RoPE on queries and keys.

    Query and key of the token at position m are turned by Chapter 3's
    rotation R(m) with the layer's bands (and scaled by its magnitude)
    before the scores are taken; values are left alone. Positions start
    at the number of tokens already in ``cache``, so they may run past any
    length.

    Args:
        d_model: Model width d.
        heads: Heads H; d_h = d / H must be even and at least 4.
        fused: Score with ``torch.nn.functional.scaled_dot_product_attention``
            instead of Chapter 1's ``scaled_dot_product_attention``.

    Raises:
        TypeError: If ``fused`` is not a bool (and as Chapter 1's layer).
        ValueError: If the head width is odd or below 4.
    """

    def __init__(self, d_model: int, heads: int, *, fused: bool = False):
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

        Raises:
            TypeError: If ``frequencies`` is not a floating-point tensor or
                ``magnitude`` is not a number.
            ValueError: If there are not d_h / 2 frequencies, or the
                magnitude is not positive.
        """
        support.check_tensor("frequencies", frequencies, dims=1, floating=True)
        if 2 * frequencies.numel() != self.head_dim:
            raise ValueError(
                f"frequencies must hold head_dim / 2 = {self.head_dim // 2} "
                f"bands (got {frequencies.numel()})")
        self.magnitude = support.check_number("magnitude", magnitude, above=0)
        self.frequencies = frequencies.to(torch.float64)

    def forward(self, x: Tensor, cache: ch02.KVCache | None = None,
                layer: int = 0) -> Tensor:
        """Return the attended tokens (B, T, d) for ``x`` (B, T, d).

        With a ``cache``, ``x`` continues the cached sequence of ``layer``:
        its positions start after the cached tokens, and its turned keys
        and its values are appended.

        Raises:
            TypeError: If ``x`` is not a floating-point tensor, ``cache``
                not a KVCache or ``layer`` not an int.
            ValueError: If ``x`` is not (B, T, d) with T >= 1, or
                ``layer`` is negative.
        """
        support.check_tensor("x", x, dims=3, floating=True, nonempty=True)
        layer = support.check_int("layer", layer, minimum=0)
        if cache is not None:
            support.check_type("cache", cache, ch02.KVCache)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have width d_model = {self.d_model} "
                             f"(got shape {tuple(x.shape)})")
        past = 0 if cache is None else cache.keys[layer].shape[2]  # t_0
        new = x.shape[1]
        positions = torch.arange(past, past + new, device=x.device)  # m

        def turn(vectors: Tensor) -> Tensor:  # R(m) of Chapter 3
            return ch03.apply_rope(vectors, positions, self.frequencies,
                                   self.magnitude)

        query = turn(ch01.split_heads(self.query(x), self.heads))  # (B,H,T,d_h)
        key = turn(ch01.split_heads(self.key(x), self.heads))  # (B,H,T,d_h)
        value = ch01.split_heads(self.value(x), self.heads)  # (B,H,T,d_h)
        if cache is not None:
            key, value = cache.append(layer, key, value)  # (B,H,t_0+T,d_h)
        # query i sits at t_0 + i and sees keys 0 .. t_0 + i
        mask = torch.ones(new, past + new, dtype=torch.bool,
                          device=x.device).tril(diagonal=past)
        if self.fused:
            mixed = F.scaled_dot_product_attention(query, key, value,
                                                   attn_mask=mask)
        else:
            mixed, _ = ch01.scaled_dot_product_attention(query, key, value,
                                                         mask)
        return self.output(ch01.merge_heads(mixed))  # (B, T, d)


# chapters/ch06-extension.qmd:192
#: Each recipe's settings beside its factor, in one place: YaRN's band
#: boundaries (its paper's values for LLaMA) and Llama 3.1's wavelength
#: thresholds (its config.json). Recipes not named here need none.
RECIPE_SETTINGS: dict[str, dict[str, float]] = {
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0},
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def recipe_bands(method: str, head_dim: int, *, factor: float,
                 base: float = 10_000.0,
                 original_context: int) -> tuple[Tensor, float]:
    """Return Chapter 3's (frequencies, magnitude) for one recipe.

    Calls ``ch03.inverse_frequencies`` with the recipe's entry of
    ``RECIPE_SETTINGS``.

    Args:
        method: One of ``ch03.ROPE_METHODS``.
        head_dim: Rotary width d_R (the whole head here).
        factor: Extension factor a = T_1 / T_0 (>= 1).
        base: RoPE base b.
        original_context: Trained length T_0.

    Raises:
        TypeError, ValueError: For an unknown method or a bad number.
    """
    method = support.check_choice("method", method, ch03.ROPE_METHODS)
    head_dim = support.check_int("head_dim", head_dim, minimum=2)
    factor = support.check_number("factor", factor, minimum=1)
    original_context = support.check_int("original_context",
                                         original_context, minimum=1)
    return ch03.inverse_frequencies(
        head_dim, method=method, base=base, factor=factor,
        original_context=original_context,
        **RECIPE_SETTINGS.get(method, {}))


class RotaryGPT(ch02.TinyGPT):
    """TinyGPT with rotary attention instead of the learned position table.

    ``config.context_length`` is the trained length T_0: the recipes read
    it, and positions past it are accepted. The model starts with plain
    RoPE bands; ``set_rope`` switches every layer to another recipe.

    Args:
        config: The sizes (Chapter 2's ``GPTConfig``).
        base: RoPE base b (> 1).
        fused: Use PyTorch's fused attention (same function, faster).

    Raises:
        TypeError: If ``config`` is not a GPTConfig, or an argument has the
            wrong type.
        ValueError: If ``base`` <= 1 or the head width is odd or below 4.
    """

    def __init__(self, config: ch02.GPTConfig, *, base: float = 10_000.0,
                 fused: bool = False):
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
            TypeError, ValueError: As ``recipe_bands``.
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

        With a ``cache`` the tokens continue the cached sequence. No
        position is refused.

        Raises:
            TypeError: If ``tokens`` is not an int64 tensor, or ``cache``
                is not a ``ch02.KVCache``.
            ValueError: If ``tokens`` is not a non-empty (B, T) tensor of
                ids below ``vocab_size``, or the cache has another batch
                size or number of layers.
        """
        support.check_tensor("tokens", tokens, dims=2, dtype=torch.long,
                             nonempty=True)
        vocab = self.config.vocab_size
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise ValueError(f"tokens must be ids in 0..{vocab - 1}")
        if cache is not None:
            if not isinstance(cache, ch02.KVCache):
                raise TypeError("cache must be a ch02.KVCache (got "
                                f"{support.describe(cache)})")
            if (cache.batch, cache.layers) != (len(tokens), len(self.blocks)):
                raise ValueError(
                    f"the cache holds batch {cache.batch} and {cache.layers} "
                    f"layers; tokens have batch {len(tokens)} and the model "
                    f"{len(self.blocks)} layers")
        x = self.embedding_dropout(self.token_embedding(tokens))  # (B, T, d)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)  # (B, T, d)
        return self.lm_head(self.final_norm(x))  # (B, T, V)


# chapters/ch06-extension.qmd:392
#: The byte that opens the key and, at the end of the window, asks for it.
KEY_MARK = "#"


def passkey_batch(data: Tensor, depths: Tensor, length: int,
                  generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Return (inputs, targets), (B, T) each: text with a planted key.

    Row i is a window of ``data`` (Chapter 2's ``sample_batch``) whose
    bytes p, p + 1 become ``KEY_MARK`` and a random digit k_i, with
    p = round(depths[i] * (T - 3)); its last input is ``KEY_MARK`` again,
    and the target there is k_i. The key sits T - 2 - p positions before
    that question.

    Args:
        data: 1-d int64 token ids (the filler text).
        depths: (B,) floats in [0, 1]: where each key goes.
        length: Window length T (>= 4).
        generator: The ``torch.Generator`` every draw comes from.

    Raises:
        TypeError, ValueError: If an argument has the wrong type, a depth
            lies outside [0, 1], or ``data`` is not longer than T + 1.
    """
    support.check_tensor("data", data, dims=1, dtype=torch.long)
    support.check_tensor("depths", depths, dims=1, floating=True,
                         nonempty=True)
    length = support.check_int("length", length, minimum=4)
    if data.numel() <= length + 1:
        raise ValueError(f"data must hold more than {length + 1} tokens "
                         f"(got {data.numel()})")
    if not bool(((depths >= 0) & (depths <= 1)).all()):
        raise ValueError("depths must lie in [0, 1] (got "
                         f"{depths.min().item()} to {depths.max().item()})")
    batch = depths.numel()
    inputs, targets = ch02.sample_batch(data, batch, length, generator)
    window = torch.cat([inputs, targets[:, -1:]], dim=1)  # (B, T + 1)
    digits = torch.randint(0, 10, (batch,), generator=generator) + ord("0")
    mark = ord(KEY_MARK)
    start = torch.round(depths.double() * (length - 3)).long()  # p, (B,)
    rows = torch.arange(batch)
    window[rows, start] = mark
    window[rows, start + 1] = digits  # the key k_i
    window[:, -2] = mark  # the question ...
    window[:, -1] = digits  # ... and its answer, the last target
    return window[:, :-1], window[:, 1:]  # (B, T) each


# chapters/ch06-extension.qmd:494
def train_with_keys(model: RotaryGPT, token_ids: Tensor, *, steps: int,
                    batch_size: int, length: int, key_share: float,
                    learning_rate: float, seed: int,
                    progress: tqdm | None = None) -> list[float]:
    """Train ``model`` in place by Equation 6.1; return each step's loss.

    Each step draws ``batch_size`` windows of ``length`` tokens, of which
    round(key_share * batch_size) carry a key (``passkey_batch``, depth
    uniform in [0, 1]). AdamW, cosine decay to a tenth of the rate and
    gradient clipping as in Chapter 2's ``train``, after a linear warm-up
    over the first tenth of the steps.

    Args:
        model: The model; left in eval mode.
        token_ids: 1-d int64 training tokens.
        steps, batch_size, length: Steps, windows per step, window length.
        key_share: Share of each batch that carries a key, in [0, 1].
        learning_rate: Peak step size.
        seed: Seed of the generator that draws every batch.
        progress: A tqdm bar to advance by one per step, or None.

    Raises:
        TypeError, ValueError: For an argument of the wrong type or range.
    """
    support.check_type("model", model, RotaryGPT)
    support.check_tensor("token_ids", token_ids, dims=1, dtype=torch.long)
    steps = support.check_int("steps", steps, minimum=1)
    batch_size = support.check_int("batch_size", batch_size, minimum=1)
    length = support.check_int("length", length, minimum=4)
    if token_ids.numel() <= length + 1:
        raise ValueError(f"token_ids must hold more than length + 1 = "
                         f"{length + 1} tokens (got {token_ids.numel()})")
    if progress is not None:
        support.check_type("progress", progress, tqdm)
    key_share = support.check_number("key_share", key_share, minimum=0,
                                     maximum=1)
    learning_rate = support.check_number("learning_rate", learning_rate,
                                         above=0)
    seed = support.check_int("seed", seed, minimum=0)
    keyed = round(key_share * batch_size)  # |K| windows per step
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate,
                                  weight_decay=0.01)
    warmup = max(1, steps // 10)

    def rate(step: int) -> float:  # a share of learning_rate
        rise = min(1.0, (step + 1) / warmup)  # linear over the first tenth
        return rise * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    losses = []
    model.train()
    for _ in range(steps):
        text_in, text_out = ch02.sample_batch(token_ids, batch_size - keyed,
                                              length, generator)
        depths = torch.rand(keyed, generator=generator, dtype=torch.float64)
        key_in, key_out = (passkey_batch(token_ids, depths, length, generator)
                           if keyed else (text_in[:0], text_out[:0]))
        inputs = torch.cat([text_in, key_in])  # (B, T)
        targets = torch.cat([text_out, key_out])  # (B, T)
        per_target = F.cross_entropy(model(inputs).transpose(1, 2), targets,
                                     reduction="none")  # (B, T)
        answers = torch.zeros_like(per_target, dtype=torch.bool)
        answers[batch_size - keyed:, -1] = True  # the set K of Eq. 6.1
        loss = per_target[~answers].mean()
        if keyed:
            loss = loss + per_target[answers].mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if progress is not None:
            progress.update(1)
    model.eval()
    return losses


# chapters/ch06-extension.qmd:591
@torch.no_grad()
def position_losses(model: RotaryGPT, token_ids: Tensor, *, length: int,
                    windows: int, span: int | None = None) -> Tensor:
    """Return the next-byte loss (windows, length) at every position.

    Window w starts at round(w * (N - span - 1) / (windows - 1)) of the N
    tokens, so windows of any length up to ``span`` are prefixes of the
    same windows.

    Args:
        model: The model, in eval mode.
        token_ids: 1-d int64 held-out tokens.
        length: Positions scored per window.
        windows: Number of windows (>= 2).
        span: The longest length to be compared (default ``length``).

    Raises:
        TypeError, ValueError: For a bad argument, or too little text.
    """
    support.check_type("model", model, RotaryGPT)
    support.check_tensor("token_ids", token_ids, dims=1, dtype=torch.long)
    length = support.check_int("length", length, minimum=1)
    windows = support.check_int("windows", windows, minimum=2)
    span = length if span is None else support.check_int(
        "span", span, minimum=length)
    if token_ids.numel() < span + windows:
        raise ValueError(f"token_ids must hold at least span + windows = "
                         f"{span + windows} tokens (got {token_ids.numel()})")
    starts = torch.linspace(0, token_ids.numel() - span - 1, windows)
    starts = starts.round().long()[:, None]  # (W, 1)
    offsets = torch.arange(length)  # (T,)
    inputs = token_ids[starts + offsets]  # (W, T)
    targets = token_ids[starts + offsets + 1]  # (W, T)
    return F.cross_entropy(model(inputs).transpose(1, 2), targets,
                           reduction="none")  # (W, T)


@torch.no_grad()
def passkey_hits(model: RotaryGPT, token_ids: Tensor, *, length: int,
                 depths: tuple[float, ...], trials: int, seed: int,
                 chunk: int = 32) -> Tensor:
    """Return a bool (len(depths), trials) grid: was the key retrieved?

    Trial j at depth d is ``passkey_batch`` row j of one generator seeded
    with ``seed``; it is a hit when the model's most likely byte after the
    final mark is the planted digit. Rows run ``chunk`` at a time.

    Raises:
        TypeError, ValueError: For a bad argument (as ``passkey_batch``).
    """
    support.check_type("model", model, RotaryGPT)
    support.check_tensor("token_ids", token_ids, dims=1, dtype=torch.long)
    length = support.check_int("length", length, minimum=4)
    if token_ids.numel() <= length + 1:
        raise ValueError(f"token_ids must hold more than length + 1 = "
                         f"{length + 1} tokens (got {token_ids.numel()})")
    support.check_type("depths", depths, (tuple, list))
    if not depths:
        raise ValueError("depths must not be empty")
    for depth in depths:
        support.check_number("each of depths", depth, minimum=0, maximum=1)
    trials = support.check_int("trials", trials, minimum=1)
    seed = support.check_int("seed", seed, minimum=0)
    chunk = support.check_int("chunk", chunk, minimum=1)
    depth_rows = torch.tensor(depths, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    inputs, targets = passkey_batch(token_ids,
                                    depth_rows.repeat_interleave(trials),
                                    length, generator)  # (D * N, T)
    guesses = torch.cat([model(part)[:, -1].argmax(-1)
                         for part in inputs.split(chunk)])  # (D * N,)
    return (guesses == targets[:, -1]).view(len(depths), trials)


# chapters/ch06-extension.qmd:679
def wilson_interval(hits: int, trials: int,
                    z: float = 1.96) -> tuple[float, float]:
    """Return the Wilson interval (low, high) of Equation 6.2.

    Raises:
        TypeError: If a count is not an int or ``z`` not a number.
        ValueError: If trials < 1, hits outside 0..trials, or z <= 0.
    """
    trials = support.check_int("trials", trials, minimum=1)
    hits = support.check_int("hits", hits, minimum=0, maximum=trials)
    z = support.check_number("z", z, above=0)
    share = hits / trials  # p hat
    centre = share + z * z / (2 * trials)
    spread = z * math.sqrt(share * (1 - share) / trials
                           + z * z / (4 * trials * trials))
    scale = 1 + z * z / trials
    # at h = 0 the low end is exactly 0, at h = n the high end exactly 1;
    # floats miss by 2e-16, so the ends are set, not computed
    low = 0.0 if hits == 0 else (centre - spread) / scale
    high = 1.0 if hits == trials else (centre + spread) / scale
    return low, high


# chapters/ch06-extension.qmd:739
@dataclass(frozen=True)
class ExtensionSettings:
    """The sizes of one run; the defaults are those of ``make experiment``.

    Attributes:
        trained_length: T_0, the window length of training.
        factors: Factors a; the model is evaluated at lengths a * T_0.
        d_model, layers, heads, base: The model (``GPTConfig``, RoPE base).
        steps, batch_size, learning_rate: Training at T_0.
        key_share: Share of each batch that carries a key.
        finetune_steps, finetune_learning_rate: Fine-tuning of each recipe
            at the largest length, with the bytes per step of training.
        windows: Held-out windows for the losses by position.
        depths, trials: Key depths, and trials per depth and length.
        seeds: One full run per seed.
        methods: Recipes, from ``ch03.ROPE_METHODS``.
        fused: Use PyTorch's fused attention.

    Raises:
        TypeError, ValueError: If a field has the wrong type or range.
    """

    trained_length: int = 64
    factors: tuple[int, ...] = (1, 2, 4, 8)
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    base: float = 10_000.0
    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 3e-3
    key_share: float = 0.25
    finetune_steps: int = 80
    finetune_learning_rate: float = 1e-3
    windows: int = 48
    depths: tuple[float, ...] = tuple(i / 8 for i in range(9))  # 0 .. 1
    trials: int = 32
    seeds: tuple[int, ...] = (0, 1)
    methods: tuple[str, ...] = ch03.ROPE_METHODS
    fused: bool = True

    def __post_init__(self) -> None:
        check = support.check_int
        for name in ("trained_length", "d_model", "layers", "heads", "steps",
                     "batch_size", "finetune_steps", "windows", "trials"):
            check(name, getattr(self, name),
                  minimum=2 if name == "windows" else 1)
        check("trained_length", self.trained_length, minimum=4)
        for name in ("factors", "depths", "seeds", "methods"):
            value = getattr(self, name)
            if not isinstance(value, tuple | list):
                raise TypeError(f"{name} must be a tuple "
                                f"(got {support.describe(value)})")
            if not value:
                raise ValueError(f"{name} must not be empty")
            object.__setattr__(self, name, tuple(value))  # a list will do
        support.check_int_sequence("factors", self.factors, minimum=1)
        if len(set(self.factors)) != len(self.factors):
            raise ValueError(f"factors must differ (got {self.factors})")
        for depth in self.depths:
            support.check_number("each of depths", depth, minimum=0,
                                 maximum=1)
        support.check_int_sequence("seeds", self.seeds, minimum=0)
        for method in self.methods:
            support.check_choice("each of methods", method, ch03.ROPE_METHODS)
        support.check_number("base", self.base, above=1)
        support.check_number("key_share", self.key_share, minimum=0,
                             maximum=1)
        for name in ("learning_rate", "finetune_learning_rate"):
            support.check_number(name, getattr(self, name), above=0)
        support.check_bool("fused", self.fused)
        ch02.GPTConfig(vocab_size=256, context_length=self.trained_length,
                       d_model=self.d_model, layers=self.layers,
                       heads=self.heads)  # its own checks
        width = self.d_model // self.heads
        if width % 2 or width < 4:
            raise ValueError("d_model / heads must be even and at least 4 "
                             f"for RoPE (got {width})")


# chapters/ch06-extension.qmd:826
def run_extension_experiment(settings: ExtensionSettings | None = None, *,
                             progress: bool = True) -> dict:
    """Train, extend and measure; return the results as plain numbers.

    For each seed: train at T_0 (``train_with_keys``), evaluate every
    recipe as-is with factor a at each length a * T_0, then fine-tune a
    copy per recipe at the largest length and evaluate it there and at
    every shorter length with the largest factor.

    Args:
        settings: The sizes (default: ``ExtensionSettings()``).
        progress: Show one tqdm bar for the whole run: redrawn in a
            terminal, and elsewhere (a notebook, a log) only its final
            line, once.

    Returns:
        A dict with ``settings``, ``lengths``, ``finetune_batch``,
        ``seconds`` and ``runs``: per seed the training losses and
        seconds, the fine-tuning losses and seconds per recipe, and
        ``evaluations``, one per (method, variant, length) with
        ``factor``, ``position_loss`` (mean over windows, per position),
        ``window_loss`` (mean over positions, per window) and ``hits``
        (per depth, out of ``trials``). Losses are rounded to 5 decimals.

    Raises:
        TypeError: If ``settings`` is not an ExtensionSettings or
            ``progress`` not a bool.
    """
    settings = ExtensionSettings() if settings is None else settings
    if not isinstance(settings, ExtensionSettings):
        raise TypeError("settings must be an ExtensionSettings "
                        f"(got {support.describe(settings)})")
    support.check_bool("progress", progress)
    s = settings
    ids = torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()))
    split = int(0.9 * ids.numel())  # Chapter 2's split
    train_ids, held_ids = ids[:split], ids[split:]
    lengths = [a * s.trained_length for a in s.factors]
    longest = max(lengths)
    tuned_batch = max(1, s.batch_size * s.trained_length // longest)
    config = ch02.GPTConfig(vocab_size=256, context_length=s.trained_length,
                            d_model=s.d_model, layers=s.layers, heads=s.heads)
    def rounded(values) -> list[float]:  # 5 decimals: a smaller JSON file
        return [round(float(v), 5) for v in values]

    per_seed = s.steps + len(s.methods) * (s.finetune_steps + 2 * len(lengths))
    total = len(s.seeds) * per_seed
    live = progress and sys.stderr.isatty()  # a terminal redraws one line
    bar = tqdm(total=total, desc="experiment", unit="step", disable=not live)
    started, runs = time.perf_counter(), []
    for seed in s.seeds:
        with torch.random.fork_rng():  # the weights' draw leaves ours alone
            torch.manual_seed(seed)
            model = RotaryGPT(config, base=s.base, fused=s.fused)
        clock = time.perf_counter()
        losses = train_with_keys(
            model, train_ids, steps=s.steps, batch_size=s.batch_size,
            length=s.trained_length, key_share=s.key_share,
            learning_rate=s.learning_rate, seed=seed, progress=bar)
        run = {"seed": seed, "train_losses": rounded(losses),
               "train_seconds": time.perf_counter() - clock,
               "finetune": {}, "evaluations": []}

        def measure(net: RotaryGPT, method: str, variant: str,
                    factor_at: dict, run: dict = run, seed: int = seed):
            for length in lengths:
                net.set_rope(method, factor_at[length])
                loss = position_losses(net, held_ids, length=length,
                                       windows=s.windows, span=longest)
                hits = passkey_hits(net, held_ids, length=length,
                                    depths=s.depths, trials=s.trials,
                                    seed=seed + 1)  # same keys for all
                run["evaluations"].append({
                    "method": method, "variant": variant, "length": length,
                    "factor": factor_at[length],
                    "position_loss": rounded(loss.mean(0)),
                    "window_loss": rounded(loss.mean(1)),
                    "hits": hits.sum(1).tolist()})
                bar.update(1)

        for method in s.methods:
            measure(model, method, "as-is",
                    {n: n / s.trained_length for n in lengths})
        for method in s.methods:
            tuned = copy.deepcopy(model)
            tuned.set_rope(method, longest / s.trained_length)
            clock = time.perf_counter()
            tuned_losses = train_with_keys(
                tuned, train_ids, steps=s.finetune_steps,
                batch_size=tuned_batch, length=longest,
                key_share=s.key_share, learning_rate=s.finetune_learning_rate,
                seed=seed + 2, progress=bar)  # same batches for all
            run["finetune"][method] = {
                "losses": rounded(tuned_losses),
                "seconds": time.perf_counter() - clock}
            measure(tuned, method, "fine-tuned",
                    {n: longest / s.trained_length for n in lengths})
        runs.append(run)
    bar.close()
    seconds = time.perf_counter() - started
    if progress and not live:  # a notebook keeps every frame: show the last
        print(tqdm.format_meter(total, total, seconds, prefix="experiment",
                                unit="step"), file=sys.stderr)
    return {"settings": asdict(s), "lengths": lengths,
            "finetune_batch": tuned_batch, "seconds": seconds, "runs": runs}


def load_extension_results(folder: pathlib.Path | None = None
                           ) -> tuple[dict, pathlib.Path]:
    """Return the newest full run of ``make experiment`` and its path.

    Reads ``folder``, by default ``experiments/results`` of the book's
    repository, found from the working directory up (the repository root,
    or its notebooks/ folder); takes the newest ``extension-*.json`` whose
    machine record says ``mode: full``, else the newest of any mode.

    Raises:
        TypeError: If ``folder`` is not a pathlib.Path.
        ValueError: If ``folder`` is not an existing folder.
        FileNotFoundError: If there is no results file, or no repository
            above the working directory when ``folder`` is None.
    """
    if folder is None:
        here = pathlib.Path.cwd().resolve()
        roots = [path for path in (here, *here.parents)
                 if (path / "_quarto.yml").is_file()]
        if not roots:
            raise FileNotFoundError(f"no book repository at or above {here}:"
                                    " pass folder=")
        folder = roots[0] / "experiments" / "results"
    else:
        support.check_type("folder", folder, pathlib.Path)
        if not folder.is_dir():
            raise ValueError(f"folder must be an existing folder "
                             f"(got {str(folder)!r})")
    runs = [(json.loads(path.read_text(encoding="utf-8")), path)
            for path in sorted(folder.glob("extension-*.json"))]
    if not runs:
        raise FileNotFoundError(f"no extension-*.json in {folder}; "
                                "run `make experiment` first")
    full = [run for run in runs if run[0]["machine"]["mode"] == "full"]
    return max(full or runs, key=lambda run: run[0]["machine"]["date"])
