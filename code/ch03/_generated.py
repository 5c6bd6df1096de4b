# Generated from chapters/ch03-long-context.qmd and chapters/ch03-caches.qmd and chapters/ch03-windows.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch03-long-context.qmd ("Positions That Stretch") and chapters/ch03-caches.qmd ("Caches That Shrink: Shared Heads and a Short Latent") and chapters/ch03-windows.qmd ("Windows, Real Configs and Long-Context Claims")."""

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from longctx import ch01, support
from longctx.support import (
    check_bool,
    check_choice,
    check_divides,
    check_int,
    check_number,
    check_tensor,
    check_type,
    config_value,
)


# chapters/ch03-long-context.qmd:209
def apply_rope(vectors: Tensor, positions: Tensor | list[int],
               frequencies: Tensor, magnitude: float = 1.0) -> Tensor:
    """Return ``vectors`` (..., T, d_R) rotated by RoPE (Equation 3.1).

    Pair (2j, 2j+1) of row t turns by ``positions[t] * frequencies[j]``:
    ``positions`` has T entries and ``frequencies`` d_R / 2. Lengths are
    kept (times ``magnitude``, YaRN's factor), and the dot product of a
    query turned at m with a key turned at n depends only on n - m
    (Equation 3.2). Angles are computed in float64.
    """
    positions = torch.as_tensor(positions)
    angles = (positions.to(frequencies.device, torch.float64)[:, None]
              * frequencies.to(torch.float64))                  # m * omega_j
    cos = angles.cos().to(vectors.device, vectors.dtype)         # (T, d_R/2)
    sin = angles.sin().to(vectors.device, vectors.dtype)
    x_even, x_odd = vectors[..., 0::2], vectors[..., 1::2]      # x_2j, x_2j+1
    new_even = x_even * cos - x_odd * sin                  # first row of R_j
    new_odd = x_even * sin + x_odd * cos                   # second row of R_j
    turned = torch.stack([new_even, new_odd], dim=-1)      # (..., T, d_R/2, 2)
    return turned.flatten(-2) * magnitude                  # (..., T, d_R)


# chapters/ch03-long-context.qmd:352
def interleaved_to_half_order(width: int) -> Tensor:
    """Return the order (0, 2, ..., 1, 3, ...) from interleaved to half."""
    return torch.cat((torch.arange(0, width, 2), torch.arange(1, width, 2)))


def apply_rope_rotate_half(vectors: Tensor, positions: Tensor | list[int],
                           frequencies: Tensor,
                           magnitude: float = 1.0) -> Tensor:
    """Return ``vectors`` rotated in the rotate-half layout (j pairs j + d_R/2).

    The layout of Hugging Face's Llama code; it equals ``apply_rope`` on
    coordinates reordered by ``interleaved_to_half_order``.
    """
    order = interleaved_to_half_order(vectors.size(-1))
    inverse = torch.argsort(order)
    # Back to the interleaved order, rotate there, and reorder again.
    turned = apply_rope(vectors[..., inverse], positions, frequencies,
                        magnitude)
    return turned[..., order]


# chapters/ch03-long-context.qmd:492
#: The config excerpts shipped in data/configs/, in the chapter's order.
MODEL_CONFIG_NAMES = ("llama-2-7b", "llama-3.1-8b", "deepseek-v2-lite",
                      "mistral-7b-v0.1", "gemma-3-1b")


def load_model_config(name: str) -> dict[str, Any]:
    """Return the shipped excerpt ``data/configs/<name>.json`` as a dict.

    Raises:
        TypeError: If ``name`` is not a string.
        ValueError: If no excerpt of that name is shipped (the message
            lists those that are).
    """
    folder = support.data_path("configs")
    shipped = sorted(path.stem for path in folder.glob("*.json"))
    support.check_choice("name", name, shipped)
    with (folder / f"{name}.json").open(encoding="utf-8") as handle:
        return json.load(handle)


def merge_text_config(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Return a config's fields, those of a nested ``text_config`` on top.

    A multimodal config (Gemma 3's) keeps its language model's fields
    there; the readers below read the merged dict.

    Raises:
        TypeError: If ``mapping`` is not a mapping.
    """
    support.check_type("mapping", mapping, Mapping)
    nested = mapping.get("text_config")
    return {**mapping, **nested} if isinstance(nested, Mapping) else {**mapping}


# chapters/ch03-long-context.qmd:668
#: The RoPE constructions ``inverse_frequencies`` understands.
ROPE_METHODS = ("rope", "pi", "ntk", "yarn", "llama3")


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK's larger base b' = b * a^(d_R / (d_R - 2)) (Equation 3.5)."""
    return base * factor ** (dim / (dim - 2))


def yarn_correction_dim(turns: float, dim: int, base: float,
                        original_context: int) -> float:
    """Return the fractional band index j(beta) (Equation 3.4).

    The band that makes ``turns`` turns over ``original_context``
    positions: d_R ln(T_0 / (2 pi beta)) / (2 ln b).
    """
    ratio = original_context / (turns * 2 * math.pi)
    return dim * math.log(ratio) / (2 * math.log(base))


def yarn_magnitude(factor: float, mscale: float = 1.0) -> float:
    """Return m(s) = 0.1 s ln(a) + 1 at factor a, s = ``mscale``; 1 if a <= 1.

    YaRN's magnitude is m(1); DeepSeek's configs set it to m(``mscale``) /
    m(``mscale_all_dim``) (``rope_from_config``).
    """
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def inverse_frequencies(dim: int,                      # d_R, even
                        *,
                        method: str = "rope",          # one of ROPE_METHODS
                        base: float = 10_000.0,        # b
                        factor: float = 1.0,           # a = T_1 / T_0
                        original_context: int = 2_048,  # T_0 (YaRN, Llama 3)
                        beta_fast: float = 32.0,       # YaRN: keep above
                        beta_slow: float = 1.0,        # YaRN: divide below
                        low_freq_factor: float = 1.0,   # Llama 3: l
                        high_freq_factor: float = 4.0,  # Llama 3: h
                        ) -> tuple[Tensor, float]:
    """Return (band frequencies (dim/2,) float64, magnitude) for one method.

    ``rope``: omega_j = base^(-2j/dim) (Equation 3.1). ``pi``: every band
    divided by ``factor``. ``ntk``: the bands of ``ntk_base``
    (Equation 3.5). ``yarn``: the ramp of Equation 3.4, with magnitude
    0.1 ln(factor) + 1. ``llama3``: the wavelength bands of Equation 3.3.
    Checked against Hugging Face transformers 5.23.0
    (``modeling_rope_utils``): the same bands for the same width, base,
    factor and trained length. Every method but YaRN returns magnitude 1.
    An odd ``dim``, an unknown ``method`` or a ``factor`` below 1 is
    refused: each would give bands without an error.
    """
    dim = check_int("dim", dim)                # each would give bands silently
    if dim % 2:                                # odd: a coordinate left unturned
        raise ValueError(f"dim must be even (got {dim})")
    method = check_choice("method", method, ROPE_METHODS)
    factor = check_number("factor", factor, minimum=1)  # 0 or NaN: no bands
    low, high = low_freq_factor, high_freq_factor                  # l, h
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2j/d_R
    plain = base ** -exponents                                       # omega_j
    if method == "rope":
        return plain, 1.0
    if method == "pi":
        return plain / factor, 1.0
    if method == "ntk":            # one band (d_R = 2) is the fastest: kept
        return (ntk_base(base, factor, dim) ** -exponents if dim > 2
                else plain), 1.0
    if method == "yarn":
        ramp = _yarn_ramp(dim, base, original_context, beta_fast, beta_slow)
        bands = (1 - ramp) * plain + ramp * plain / factor    # Equation 3.4
        return bands, yarn_magnitude(factor)
    wavelength = 2 * math.pi / plain                               # lambda_j
    share = (original_context / wavelength - low) / (high - low)   # kappa_j
    blended = (1 - share) * plain / factor + share * plain    # Equation 3.3
    bands = torch.where(wavelength > original_context / low,   # long: / a
                        plain / factor, blended)
    bands = torch.where(wavelength < original_context / high,  # short: keep
                        plain, bands)
    return bands, 1.0


def _yarn_ramp(dim: int, base: float, original_context: int,
               beta_fast: float, beta_slow: float) -> Tensor:
    """Return YaRN's ramp gamma_j, (dim/2,) float64 (Equation 3.4)."""
    low = math.floor(yarn_correction_dim(beta_fast, dim, base,
                                         original_context))
    high = math.ceil(yarn_correction_dim(beta_slow, dim, base,
                                         original_context))
    # capped at d_R - 1 as the reference caps it, not at the last band
    # d_R/2 - 1: the clip hides it unless j(beta_slow) lies past that band
    low, high = max(low, 0), min(high, dim - 1)        # j_low, j_high
    if low == high:
        high += 0.001                    # as the reference does, to avoid 0/0
    band = torch.arange(dim // 2, dtype=torch.float64)             # j
    return torch.clamp((band - low) / (high - low), 0.0, 1.0)      # gamma_j


# chapters/ch03-long-context.qmd:863
#: The ``rope_scaling`` types ``rope_from_config`` understands.
ROPE_SCALING_TYPES = ("default", "linear", "yarn", "llama3")


def rope_from_config(mapping: Mapping[str, Any]) -> tuple[Tensor, float]:
    """Return (frequencies, magnitude) of the RoPE a config.json describes.

    Reads ``rope_theta``; the rotary width from ``qk_rope_head_dim``
    (DeepSeek's rotary key), else ``head_dim``, else ``hidden_size //
    num_attention_heads``, times ``partial_rotary_factor``; and
    ``rope_scaling`` (or ``rope_parameters``), typed by ``rope_type`` or
    ``type``: none or ``default`` gives plain bands, ``linear`` is PI,
    ``yarn`` and ``llama3`` as ``inverse_frequencies`` builds them. T_0 is
    ``original_max_position_embeddings`` (top level first, then in the
    scaling), else ``max_position_embeddings``. YaRN's magnitude is
    ``attention_factor`` if given, else m(mscale) / m(mscale_all_dim) when
    both are set, else m(1), where m(s) = 0.1 s ln(a) + 1. A nested
    ``text_config`` is read in place of the outer mapping; Gemma's local
    base (``rope_local_base_freq``) is not read.

    Raises:
        TypeError: If ``mapping`` or its scaling is not a mapping, or a
            field is of the wrong type.
        ValueError: If the scaling type is unknown, or a field needed is
            missing or out of range.
    """
    mapping = merge_text_config(mapping)
    get = mapping.get
    scaling = (check_type("rope_scaling", get("rope_scaling"), Mapping,
                          optional=True)
               or check_type("rope_parameters", get("rope_parameters"),
                             Mapping, optional=True) or {})
    base = (check_number("rope_theta", get("rope_theta"), above=1,
                         optional=True)
            or check_number("rope_theta", scaling.get("rope_theta"), above=1,
                            optional=True) or 10_000.0)
    dim = check_int("qk_rope_head_dim", get("qk_rope_head_dim"), minimum=1,
                    optional=True)
    if dim is None:
        dim = check_int("head_dim", get("head_dim"), minimum=1, optional=True)
        if dim is None:
            width = config_value(mapping, "hidden_size")
            heads = config_value(mapping, "num_attention_heads")
            dim = (check_int("hidden_size", width, minimum=1)
                   // check_int("num_attention_heads", heads, minimum=1))
        share = config_value(mapping, "partial_rotary_factor", 1.0)
        share = check_number("partial_rotary_factor", share, above=0,
                             maximum=1)
        dim = int(dim * share)
    kind = (check_choice("rope_type", scaling.get("rope_type"),
                         ROPE_SCALING_TYPES, optional=True)
            or check_choice("type", scaling.get("type"), ROPE_SCALING_TYPES,
                            optional=True) or "default")
    if kind == "default":
        return inverse_frequencies(dim, base=base)
    longest = check_int("max_position_embeddings",
                        get("max_position_embeddings"), minimum=1,
                        optional=True)
    # T_0 is the trained length: an extended config's max_position_embeddings
    # already states the extended one
    key = "original_max_position_embeddings"         # top level, else scaling
    original = (check_int(key, get(key), minimum=1, optional=True)
                or check_int(key, scaling.get(key), minimum=1, optional=True)
                or longest)
    factor = check_number("factor", scaling.get("factor"), minimum=1,
                          optional=True)
    if factor is None and kind == "yarn" and original and longest:
        factor = longest / original                       # a = T_1 / T_0
    if factor is None:
        raise ValueError(f"rope_scaling of type {kind!r} needs a 'factor'")
    if kind == "linear":
        return inverse_frequencies(dim, method="pi", base=base, factor=factor)
    if original is None:
        raise ValueError("config is missing required field "
                         "'original_max_position_embeddings'")
    if kind == "llama3":           # h > l: else Equation 3.3 runs backwards
        low = check_number("low_freq_factor", config_value(
            scaling, "low_freq_factor", 1.0), above=0)
        high = check_number("high_freq_factor", config_value(
            scaling, "high_freq_factor", 4.0), above=0)
        if high <= low:
            raise ValueError("high_freq_factor must exceed low_freq_factor "
                             f"(got high_freq_factor={high} and "
                             f"low_freq_factor={low})")
        return inverse_frequencies(
            dim, method="llama3", base=base, factor=factor,
            original_context=original, low_freq_factor=low,
            high_freq_factor=high)
    if not check_bool("truncate", config_value(scaling, "truncate", True)):
        raise ValueError("rope_scaling 'truncate: false' is not supported")
    # beta_fast > beta_slow: else Equation 3.4's ramp runs backwards
    slow = check_number("beta_slow",
                        config_value(scaling, "beta_slow", 1.0), above=0)
    fast = check_number("beta_fast",
                        config_value(scaling, "beta_fast", 32.0), above=0)
    if fast <= slow:
        raise ValueError(f"beta_fast must exceed beta_slow (got beta_fast="
                         f"{fast} and beta_slow={slow})")
    bands, magnitude = inverse_frequencies(
        dim, method="yarn", base=base, factor=factor,
        original_context=original, beta_fast=fast, beta_slow=slow)
    mscale, mscale_all, attention = (
        check_number(name, scaling.get(name), above=0, optional=True)
        for name in ("mscale", "mscale_all_dim", "attention_factor"))
    if attention is not None:
        magnitude = attention
    elif mscale and mscale_all:                     # DeepSeek's two fields
        magnitude = (yarn_magnitude(factor, mscale)
                     / yarn_magnitude(factor, mscale_all))
    return bands, magnitude


# chapters/ch03-long-context.qmd:1150
def retrieval_probe(method: str | tuple[Tensor, float], *,
                    seed: int = 1_813,            # one generator, all draws
                    trials: int = 192,            # per depth
                    context: int = 5_120,         # T_1 = 40 T_0
                    original_context: int = 128,  # T_0, TinyGPT's length
                    dim: int = 32,                # rotary width
                    base: float = 10_000.0,       # b of the bands
                    chunk: int = 16,              # trials scored together
                    ) -> list[dict[str, float]]:
    """Return needle retrieval by depth under one RoPE construction, 41 rows.

    At each depth (0%, 2.5%, ..., 100% of ``context - 2``), ``trials`` trials
    draw a content vector c, a query c + 0.15 noise at the last position, a
    needle c + 0.15 noise at the depth, and standard-normal distractor keys
    everywhere else (drawn as their scores, which have the same
    distribution). Query and needle are rotated with the bands of
    ``method`` at factor ``context / original_context``. No weights are
    learned: the curve isolates rotary phase; it is no language-model test.

    Trials are drawn one after another from one generator and scored
    ``chunk`` at a time, so the result does not depend on ``chunk``, and
    memory does not grow with ``trials``: a call holds about
    5 x 41 x chunk x (context + 3 dim) float32 numbers, 4 bytes each
    (16 trials at 32,768 tokens: about 0.4 GiB), beside 41 x trials
    results.

    Args:
        method: A name in ``ROPE_METHODS``, or a (frequencies, magnitude)
            pair such as ``inverse_frequencies`` returns. A pair is used as
            it is: ``base`` and ``original_context`` are then ignored and
            not checked (the pair already holds its bands).
        seed: Seed of the one generator all draws come from.
        trials: Trials per depth.
        context: Sequence length T_1 (>= 2).
        original_context: Trained length T_0 (1..context), for a name.
        dim: Rotary width of the probe vectors (even).
        base: Base b of a named method's bands (> 1).
        chunk: Trials scored at once (>= 1); it sets the memory only.

    Returns:
        41 dicts with ``depth_percent``; ``accuracy``, the share of trials
        whose top score is the needle's; ``standard_error``, the binomial
        sqrt(p(1 - p) / trials); and ``needle_weight``, the mean softmax
        weight (scores / sqrt(dim)) on the needle. A magnitude scales every
        score alike: it can move ``needle_weight`` but never ``accuracy``.

    Raises:
        TypeError: If an argument is of the wrong kind.
        ValueError: If a size is out of range, or the method is unknown or
            its bands do not fit ``dim``.
    """
    check_type("method", method, (str, tuple, list))
    seed = check_int("seed", seed, minimum=0)
    trials = check_int("trials", trials, minimum=1)
    context = check_int("context", context, minimum=2)
    dim = check_int("dim", dim, minimum=2)  # an odd one: inverse_frequencies
    chunk = check_int("chunk", chunk, minimum=1)
    if isinstance(method, str):
        base = check_number("base", base, above=1)
        original_context = check_int("original_context", original_context,
                                     minimum=1)
        if original_context > context:
            raise ValueError("original_context must be at most context (got "
                             f"original_context={original_context} and "
                             f"context={context})")
        frequencies, magnitude = inverse_frequencies(
            dim, method=method, base=base, factor=context / original_context,
            original_context=original_context)
    else:                                  # custom (frequencies, magnitude)
        frequencies, magnitude = method
        check_tensor("method's frequencies", frequencies, dims=1,
                     floating=True, sizes={0: dim // 2})
        magnitude = check_number("method's magnitude", magnitude, above=0)
    depths = torch.linspace(0, 1, 41, dtype=torch.float64)      # 2.5% apart
    needle_at = torch.round(depths * (context - 2)).long()      # (D,)
    gen = torch.Generator().manual_seed(seed)
    hits, weights = [], []
    for first in range(0, trials, chunk):
        draws = torch.stack([                # one (D, 3 dim + T) per trial
            torch.randn(depths.numel(), 3 * dim + context, generator=gen)
            for _ in range(first, min(first + chunk, trials))], dim=1)
        hit, weight = _probe_trials(draws, needle_at, frequencies, magnitude)
        hits.append(hit)
        weights.append(weight)
    accuracy = torch.cat(hits, dim=1).double().mean(-1)           # (D,)
    needle_weight = torch.cat(weights, dim=1).mean(-1)            # (D,)
    rows = zip(depths.tolist(), accuracy.tolist(), needle_weight.tolist(),
               strict=True)
    return [{"depth_percent": round(100 * depth, 1), "accuracy": p,
             "standard_error": math.sqrt(p * (1 - p) / trials),
             "needle_weight": weight}
            for depth, p, weight in rows]


def _probe_trials(draws: Tensor, needle_at: Tensor, frequencies: Tensor,
                 magnitude: float) -> tuple[Tensor, Tensor]:
    """Return (hit (D, n) bool, needle weight (D, n) float64) of n trials.

    ``draws`` (D, n, 3 dim + T) are standard normal: per depth and trial
    the content vector, the query's and the needle's noise (dim each) and
    the T distractor scores; ``needle_at`` (D,) is the needle's position.
    """
    dim = 2 * frequencies.numel()                                 # d_R
    context = draws.shape[-1] - 3 * dim                           # T
    content, query_noise, needle_noise, noise = draws.split(
        [dim, dim, dim, context], dim=-1)                         # (D, n, .)
    query = content + 0.15 * query_noise
    needle = content + 0.15 * needle_noise
    query_rot = apply_rope(query[:, :, None], [context - 1], frequencies,
                           magnitude)[:, :, 0]                   # (D, n, dim)
    needle_rot = apply_rope(needle.transpose(0, 1), needle_at, frequencies,
                            magnitude).transpose(0, 1)           # (D, n, dim)
    # A distractor is magnitude * (standard normal vector) in any rotation,
    # so its score is normal with sd magnitude * |query_rot|: draw scores.
    spread = magnitude * query_rot.norm(dim=-1, keepdim=True)    # (D, n, 1)
    scores = spread * noise                                      # (D, n, T)
    at = needle_at[:, None, None].expand(-1, draws.shape[1], 1)  # (D, n, 1)
    needle_score = (needle_rot * query_rot).sum(-1, keepdim=True)
    scores.scatter_(2, at, needle_score)
    hit = scores.argmax(-1) == needle_at[:, None]                # (D, n)
    weights = ch01.softmax(scores / math.sqrt(dim), dim=-1)      # (D, n, T)
    return hit, weights.gather(2, at)[..., 0].double()


# chapters/ch03-caches.qmd:175
@dataclass(frozen=True)
class KVConfig:
    """The architectural numbers that fix a KV cache's size (Equation 4.1).

    A standard layer caches ``2 * kv_heads * head_dim`` numbers per token.
    A latent (MLA) cache gives ``latent_rank`` instead of ``kv_heads`` and
    caches ``latent_rank + rope_key_dim`` numbers per token. A window makes
    ``windowed_layers`` of the ``layers`` keep only their last ``window``
    tokens.

    Args:
        name: Label for tables and plots.
        layers: Attention layers, L.
        query_heads: Query heads, H_q (they set no bytes; kept for H_kv/H_q).
        head_dim: Width of one head, d_h.
        bytes_per_scalar: Bytes per stored number, s.
        kv_heads: Key-value heads H_kv of a standard cache, else None.
        latent_rank: Width r of a latent cache, else None.
        rope_key_dim: Width d_R of a rotary key cached beside the latent.
        window: Width W of the windowed layers, or None.
        windowed_layers: How many layers use that window (0 for none).

    Raises:
        TypeError: If a count is not an int.
        ValueError: If a count is out of range, both or neither of
            ``kv_heads`` and ``latent_rank`` are given, ``kv_heads`` does
            not divide ``query_heads``, or the window fields disagree.
    """

    name: str
    layers: int                      # L
    query_heads: int                 # H_q
    head_dim: int                    # d_h
    bytes_per_scalar: int            # s
    kv_heads: int | None = None      # H_kv (standard cache)
    latent_rank: int | None = None   # r (latent cache)
    rope_key_dim: int = 0            # d_R (latent cache)
    window: int | None = None        # W
    windowed_layers: int = 0         # layers that keep only W tokens

    def __post_init__(self) -> None:
        store = partial(object.__setattr__, self)  # frozen: plain ints back
        check_type("name", self.name, str)
        store("layers", check_int("layers", self.layers, minimum=1))
        store("query_heads",
              check_int("query_heads", self.query_heads, minimum=1))
        store("head_dim", check_int("head_dim", self.head_dim, minimum=1))
        store("bytes_per_scalar",
              check_int("bytes_per_scalar", self.bytes_per_scalar, minimum=1))
        store("kv_heads",
              check_int("kv_heads", self.kv_heads, minimum=1, optional=True))
        store("latent_rank", check_int("latent_rank", self.latent_rank,
                                       minimum=1, optional=True))
        store("rope_key_dim",
              check_int("rope_key_dim", self.rope_key_dim, minimum=0))
        store("window",
              check_int("window", self.window, minimum=1, optional=True))
        store("windowed_layers",
              check_int("windowed_layers", self.windowed_layers, minimum=0))
        if self.kv_heads is not None:
            check_divides("kv_heads", self.kv_heads,
                          "query_heads", self.query_heads)
        if self.windowed_layers > self.layers:
            raise ValueError("windowed_layers must be at most layers (got "
                             f"windowed_layers={self.windowed_layers} and "
                             f"layers={self.layers})")
        if self.windowed_layers and self.window is None:  # windows, no width
            raise ValueError(f"windowed_layers={self.windowed_layers} needs "
                             "window (got window=None)")
        if (self.kv_heads is None) == (self.latent_rank is None):
            raise ValueError("give exactly one of kv_heads (standard cache) "
                             "and latent_rank (latent cache)")

    def cached_scalars_per_layer_token(self) -> int:
        """Return the numbers a layer stores per token: 2*H_kv*d_h or r+d_R."""
        if self.latent_rank is None:
            return 2 * self.kv_heads * self.head_dim    # a key and a value
        return self.latent_rank + self.rope_key_dim

    @classmethod
    def from_hf_config(cls, mapping: Mapping[str, Any], *,
                       name: str | None = None,
                       bytes_per_scalar: int | None = None) -> "KVConfig":
        """Return the KVConfig that a Hugging Face ``config.json`` describes.

        The fields are read by ``read_head_fields`` (layers, heads, widths,
        dtype), ``read_latent_fields`` (a latent cache) and
        ``read_window_fields`` (sliding windows). A nested ``text_config``
        is read in place of the outer mapping.

        Args:
            mapping: The parsed config.json.
            name: Label; defaults to the ``_source`` field or ``model_type``.
            bytes_per_scalar: Cache width s; defaults to torch_dtype's.

        Raises:
            TypeError: If ``mapping`` is not a mapping.
            ValueError: If a required field is missing or unusable.
        """
        mapping = merge_text_config(mapping)  # KVConfig checks the label
        fields = read_head_fields(mapping, bytes_per_scalar)
        latent = read_latent_fields(mapping)
        if latent:                       # a latent cache has no KV heads
            fields["kv_heads"] = None
        fields |= latent | read_window_fields(mapping, fields["layers"])
        label = (name or mapping.get("_source") or mapping.get("model_type")
                 or "unnamed")
        return cls(name=label, **fields)


def kv_bytes(config: KVConfig, tokens: int, batch: int = 1) -> int:
    """Payload bytes of an append-only, unquantized KV cache (Equation 4.1).

    Global layers keep all ``tokens``; windowed layers keep
    ``min(tokens, window)``. Tensor payload only: allocator padding,
    attention workspaces and tensor-parallel copies come on top.

    Args:
        config: The cache architecture.
        tokens: Tokens kept per sequence, T (>= 0; a negative count, which
            would give a negative size, is refused).
        batch: Sequences cached at once, B (>= 1).

    Raises:
        TypeError: If ``config`` is not a KVConfig (a config.json mapping
            becomes one through ``KVConfig.from_hf_config``).
    """
    if isinstance(config, Mapping):
        raise TypeError("config must be a KVConfig (got a mapping: build one "
                        "with KVConfig.from_hf_config(mapping))")
    config = check_type("config", config, KVConfig)
    tokens = check_int("tokens", tokens, minimum=0)
    batch = check_int("batch", batch, minimum=1)
    global_layers = config.layers - config.windowed_layers
    kept = global_layers * tokens                             # T per layer
    if config.windowed_layers:                                # min(T, W)
        kept += config.windowed_layers * min(tokens, config.window)
    width = config.cached_scalars_per_layer_token()           # 2*H_kv*d_h
    return batch * kept * width * config.bytes_per_scalar


# chapters/ch03-caches.qmd:384
#: Bytes per number for the ``torch_dtype`` strings of config.json files.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}

def read_head_fields(mapping: Mapping[str, Any],
                     bytes_per_scalar: int | None = None) -> dict[str, Any]:
    """Return layers, query_heads, kv_heads, head_dim and bytes_per_scalar.

    Reads ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads`` (absent means one per query head, as in
    transformers), ``head_dim`` (else ``hidden_size // num_attention_heads``)
    and ``torch_dtype`` (or ``dtype``), unless ``bytes_per_scalar`` is given.

    Raises:
        TypeError: If ``mapping`` is not a mapping, a field or
            ``bytes_per_scalar`` of the wrong type.
        ValueError: If a field is missing or unusable.
    """
    check_type("mapping", mapping, Mapping)
    layers = check_int("num_hidden_layers",
                       config_value(mapping, "num_hidden_layers"), minimum=1)
    query_heads = check_int("num_attention_heads",
                            config_value(mapping, "num_attention_heads"),
                            minimum=1)
    kv_heads = check_int("num_key_value_heads",
                         mapping.get("num_key_value_heads"), minimum=1,
                         optional=True)
    head_dim = check_int("head_dim", mapping.get("head_dim"), minimum=1,
                         optional=True)
    torch_dtype = check_choice("torch_dtype", mapping.get("torch_dtype"),
                               DTYPE_BYTES, optional=True)
    dtype = check_choice("dtype", mapping.get("dtype"), DTYPE_BYTES,
                         optional=True)
    bytes_per_scalar = check_int("bytes_per_scalar", bytes_per_scalar,
                                 minimum=1, optional=True)
    if head_dim is None:
        width = config_value(mapping, "hidden_size")
        head_dim = check_int("hidden_size", width, minimum=1) // query_heads
    dtype = torch_dtype or dtype
    if bytes_per_scalar is None and dtype is None:
        raise ValueError("config is missing required field 'torch_dtype' "
                         "(or pass bytes_per_scalar)")
    return dict(layers=layers, query_heads=query_heads,
                kv_heads=kv_heads or query_heads, head_dim=head_dim,
                bytes_per_scalar=bytes_per_scalar or DTYPE_BYTES[dtype])


# chapters/ch03-caches.qmd:521
def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Return (B, H_kv*groups, T, d_h): each KV head copied for its group.

    Query head ``h`` reads KV head ``h // groups`` (Equation 4.2). The
    copies are materialized; ``grouped_attention`` avoids them.
    """
    groups = check_int("groups", groups, minimum=1)   # -1 would copy nothing
    batch, kv_heads, length, width = x.shape
    copies = x[:, :, None].expand(batch, kv_heads, groups, length, width)
    return copies.reshape(batch, kv_heads * groups, length, width)


def grouped_attention(query: Tensor, key: Tensor, value: Tensor,
                      mask: Tensor | None = None) -> Tensor:
    """Return grouped-query attention, (B, H_q, T_q, d_v), copying no head.

    ``query`` is (B, H_q, T_q, d_h); ``key`` and ``value`` are
    (B, H_kv, T_k, d_h) and (B, H_kv, T_k, d_v) with H_kv dividing H_q;
    ``mask`` is a bool (T_q, T_k) grid or broadcasts to (B, H_q, T_q, T_k).
    """
    batch, query_heads, query_len, width = query.shape
    kv_heads, key_len = key.size(1), key.size(2)
    groups = query_heads // kv_heads
    # Head h = kv * g + j, so a group's g heads are adjacent: a view.
    q = query.reshape(batch, kv_heads, groups * query_len, width)
    # q: (B, H_kv, g*T_q, d_h)
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        if mask.size(1) == 1:    # shared by all heads: once per group row
            mask = mask.repeat(1, 1, groups, 1)       # (B|1, 1, g*T_q, T_k)
        else:                    # one mask per query head: same view as q
            mask = mask.reshape(mask.size(0), kv_heads, groups * query_len,
                                key_len)              # (B|1, H_kv, g*T_q, T_k)
    out, _ = ch01.scaled_dot_product_attention(q, key, value, mask)
    # out: (B, H_kv, g*T_q, d_v), each stored head read once
    return out.reshape(batch, query_heads, query_len, value.size(-1))


# chapters/ch03-caches.qmd:592
#: A layer's cache: (keys, values), each (B, H_kv, T, d_h).
KVPair = tuple[Tensor, Tensor]


def causal_rows(query_len: int, key_len: int, *,
                device: torch.device | str | None = None) -> Tensor:
    """Return the causal-mask rows that the last ``query_len`` queries need.

    A bool (query_len, key_len) tensor, True where query i (at position
    key_len - query_len + i) may read key j. A decode step (query_len 1)
    builds one row of T entries, never the T x T mask.
    """
    first = key_len - query_len
    query_at = torch.arange(first, key_len, device=device)[:, None]  # (T_q, 1)
    keys = torch.arange(key_len, device=device)[None, :]             # (1, T_k)
    return keys <= query_at                                         # (T_q, T_k)


def decode_token_by_token(layer: nn.Module, x: Tensor) -> Tensor:
    """Return ``layer``'s outputs (B, T, d) for ``x`` fed one token at a time.

    ``layer(x, cache) -> (output, cache)`` is the protocol of this chapter's
    attention layers; comparing the result with ``layer(x)[0]`` checks that
    cached decoding computes the same function as one full pass.
    """
    outputs, state = [], None
    for position in range(x.size(1)):
        out, state = layer(x[:, position:position + 1], state)
        outputs.append(out)
    return torch.cat(outputs, dim=1)


class GroupedQueryAttention(nn.Module):
    """Causal self-attention whose ``kv_heads`` dial spans MHA, GQA and MQA.

    ``query_heads`` query heads share ``kv_heads`` key-value heads, and only
    those are cached, so the cache shrinks by ``kv_heads / query_heads``
    (Equation 4.2) while the output shape stays the same. Call it as
    ``layer(x, cache)`` with ``x`` (B, T, d_model) and the cache the last
    call returned (None at first); it returns (output, cache).

    Args:
        d_model: Model width, in numbers per token.
        query_heads: Query heads H_q; must divide ``d_model``, and each head
            is ``d_model / query_heads`` wide (d_h).
        kv_heads: Key-value heads H_kv, the ones cached; must divide
            ``query_heads`` (equal: MHA; 1: MQA).

    Raises:
        TypeError: If a count is not an int.
        ValueError: If a count is not positive or does not divide.
    """

    def __init__(self, d_model: int, query_heads: int, kv_heads: int):
        """Build the four projections; the Args are the class's."""
        d_model = check_int("d_model", d_model, minimum=1)
        query_heads = check_int("query_heads", query_heads, minimum=1)
        kv_heads = check_int("kv_heads", kv_heads, minimum=1)
        check_divides("query_heads", query_heads, "d_model", d_model)
        check_divides("kv_heads", kv_heads, "query_heads", query_heads)
        super().__init__()
        self.d_model, self.query_heads = d_model, query_heads
        self.kv_heads, self.head_dim = kv_heads, d_model // query_heads
        kv_width = kv_heads * self.head_dim      # H_kv * d_h: what is cached
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model, bias=False)
        self.key = nn.Linear(d_model, kv_width, bias=False)
        self.value = nn.Linear(d_model, kv_width, bias=False)

    def forward(self, x: Tensor,
                cache: KVPair | None = None) -> tuple[Tensor, KVPair]:
        """Return (output (B, T, d_model), cache) for new tokens ``x``.

        ``cache`` is the (keys, values) pair the previous call returned,
        each (B, kv_heads, T_past, d_h); the new tokens are appended.
        """
        check_type("cache", cache, tuple, optional=True)  # (keys, values)
        q = ch01.split_heads(self.query(x), self.query_heads)  # (B,H_q,T,d_h)
        k = ch01.split_heads(self.key(x), self.kv_heads)       # (B,H_kv,T,d_h)
        v = ch01.split_heads(self.value(x), self.kv_heads)     # (B,H_kv,T,d_h)
        if cache is not None:                  # append to the stored tokens
            past_keys, past_values = cache
            k = torch.cat([past_keys, k], dim=2)     # (B, H_kv, T_past+T, d_h)
            v = torch.cat([past_values, v], dim=2)
        visible = causal_rows(x.size(1), k.size(2), device=x.device)
        out = grouped_attention(q, k, v, visible)
        return self.output(ch01.merge_heads(out)), (k, v)


# chapters/ch03-caches.qmd:900
def read_latent_fields(mapping: Mapping[str, Any]) -> dict[str, int]:
    """Return latent_rank and rope_key_dim of a latent (MLA) cache, or {}.

    Reads ``kv_lora_rank`` (the latent width r) and ``qk_rope_head_dim``
    (the rotary key width d_R, 0 if absent); a config without
    ``kv_lora_rank`` has a standard cache and gives an empty dict.

    Raises:
        TypeError: If ``mapping`` is not a mapping.
        ValueError: If a field is present but not a usable integer.
    """
    check_type("mapping", mapping, Mapping)
    rank = check_int("kv_lora_rank", mapping.get("kv_lora_rank"),      # r
                     minimum=1, optional=True)
    rope_key_dim = check_int("qk_rope_head_dim",                        # d_R
                             config_value(mapping, "qk_rope_head_dim", 0),
                             minimum=0)
    if rank is None:
        return {}
    return {"latent_rank": rank, "rope_key_dim": rope_key_dim}


# chapters/ch03-caches.qmd:1025
class ToyLatentKVAttention(nn.Module):
    """Causal attention that caches one low-rank latent per token (MLA).

    ``latent_down`` maps each token to a rank-``latent_rank`` latent, the
    only thing cached (Equation 4.3); ``key_up`` and ``value_up`` rebuild
    per-head keys and values from it at read time. With ``rope_key_dim > 0``
    a decoupled rotary key (``rope_key``, shared by all heads) is rotated by
    ``apply_rope`` with bands of base ``rope_base`` and cached beside the
    latent, and each head gets a rotary query part (``rope_query``). The
    up-projections are not absorbed; ``AbsorbedLatentAttention`` does that.

    Args:
        d_model: Model width.
        query_heads: Heads; must divide ``d_model``.
        latent_rank: Cached latent width r.
        rope_key_dim: Width d_R of the decoupled rotary key (0 or even).
        rope_base: Base b of the rotary key's bands (> 1).

    Raises:
        TypeError: If a size is not an int or ``rope_base`` not a number.
        ValueError: If a size is out of range, the heads do not divide the
            width, or ``rope_key_dim`` is odd.
    """

    def __init__(self, d_model: int, query_heads: int,
                 latent_rank: int,                # r
                 rope_key_dim: int = 0,           # d_R; 0 = no rotary key
                 rope_base: float = 10_000.0):    # b of the rotary bands
        """Build the projections; the Args are the class's."""
        d_model = check_int("d_model", d_model, minimum=1)
        query_heads = check_int("query_heads", query_heads, minimum=1)
        check_divides("query_heads", query_heads, "d_model", d_model)
        latent_rank = check_int("latent_rank", latent_rank, minimum=1)
        rope_key_dim = check_int("rope_key_dim", rope_key_dim, minimum=0)
        if rope_key_dim % 2:                 # odd: a coordinate left unturned
            raise ValueError(f"rope_key_dim must be even (got {rope_key_dim})")
        rope_base = check_number("rope_base", rope_base, above=1)
        super().__init__()
        self.d_model, self.query_heads = d_model, query_heads
        self.head_dim = d_model // query_heads
        self.latent_rank = latent_rank                                 # r
        self.rope_key_dim = rope_key_dim                               # d_R
        self.rope_base = rope_base                                     # b
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.latent_down = nn.Linear(d_model, latent_rank, bias=False)
        self.key_up = nn.Linear(latent_rank, d_model, bias=False)
        self.value_up = nn.Linear(latent_rank, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model, bias=False)
        if rope_key_dim:
            self.rope_query = nn.Linear(d_model, query_heads * rope_key_dim,
                                        bias=False)
            self.rope_key = nn.Linear(d_model, rope_key_dim, bias=False)

    def latent_width(self) -> int:
        """Return the numbers cached per token, r + d_R."""
        return self.latent_rank + self.rope_key_dim

    def forward(self, x: Tensor, cache: Tensor | None = None, *,
                start: int | None = None) -> tuple[Tensor, Tensor]:
        """Return (output (B, T, d_model), cache (B, T_past + T, r + d_R)).

        Args:
            x: New tokens, (B, T, d_model).
            cache: The latent returned by the previous call, or None.
            start: Position of the first new token for the rotary key;
                defaults to the cache length (the only correct value; it is
                exposed so that the chapter can break it on purpose).
        """
        latent, positions = self.extend_latent(x, cache, start=start)
        content = latent[..., :self.latent_rank]           # (B, T_k, r)
        heads = self.query_heads
        q = ch01.split_heads(self.query(x), heads)         # (B, H, T, d_h)
        k = ch01.split_heads(self.key_up(content), heads)  # (B, H, T_k, d_h)
        v = ch01.split_heads(self.value_up(content), heads)
        if self.rope_key_dim:              # content + rotary score terms
            q_rot = self.rotary_queries(x, positions)      # (B, H, T, d_R)
            k_rot = latent[:, None, :, self.latent_rank:]  # (B, 1, T_k, d_R)
            k_rot = k_rot.expand(-1, heads, -1, -1)        # a view per head
            q = torch.cat((q, q_rot), dim=-1)
            k = torch.cat((k, k_rot), dim=-1)
        visible = causal_rows(x.size(1), latent.size(1), device=x.device)
        out, _ = ch01.scaled_dot_product_attention(q, k, v, visible)
        return self.output(ch01.merge_heads(out)), latent

    def rotary_bands(self) -> Tensor:
        """Return the rotary key's band frequencies, (d_R/2,) float64."""
        bands, _ = inverse_frequencies(self.rope_key_dim, base=self.rope_base)
        return bands

    def extend_latent(self, x: Tensor, cache: Tensor | None = None, *,
                      start: int | None = None) -> tuple[Tensor, Tensor]:
        """Return (latent, positions): the cache with ``x`` appended.

        The new tokens' latents (and, with ``rope_key_dim > 0``, their
        rotated rotary keys) are appended to ``cache``, giving
        (B, T_past + T, r + d_R). ``positions`` (T,) are the new tokens'
        positions, from ``start`` or the cache length.
        """
        check_type("cache", cache, Tensor, optional=True)  # one latent tensor
        start = check_int("start", start, minimum=0, optional=True)
        past = 0 if cache is None else cache.size(1)
        first = past if start is None else start
        positions = torch.arange(x.size(1), device=x.device) + first
        fresh = self.latent_down(x)                              # (B, T, r)
        if self.rope_key_dim:
            rotated = apply_rope(self.rope_key(x), positions,
                                 self.rotary_bands())            # (B, T, d_R)
            fresh = torch.cat((fresh, rotated), dim=-1)          # (B, T, r+d_R)
        if cache is None:
            return fresh, positions
        return torch.cat((cache, fresh), dim=1), positions     # (B, T_k, r+d_R)

    def rotary_queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """Return each head's rotated rotary query, (B, H, T, d_R)."""
        per_head = ch01.split_heads(self.rope_query(x), self.query_heads)
        return apply_rope(per_head, positions, self.rotary_bands())


# chapters/ch03-caches.qmd:1151
LatentCache = Tensor
"""A latent cache: (B, T, r + d_R), the stored latents plus any rotary keys."""


class AbsorbedLatentAttention(ToyLatentKVAttention):
    """``ch03``'s latent layer with a pass that builds no key or value.

    ``forward_absorbed`` returns ``forward``'s output and cache
    (Equation 4.4) with the up-projections merged into their neighbours, head by
    head: W_Q_h^T W_UK_h takes a token straight to head h's query in latent
    coordinates, and W_UV_h^T W_O_h^T takes a blend of latents straight to
    head h's share of the output. A decoupled rotary key (rope_key_dim > 0)
    is rotated by position, so it cannot be merged: it is cached as it is
    and scored as in ``forward``, as DeepSeek-V2 does.

    Args:
        d_model: Model width.
        query_heads: Heads; must divide ``d_model``.
        latent_rank: Cached latent width r.
        rope_key_dim: Width d_R of the decoupled rotary key (0 or even).
        rope_base: Base b of the rotary key's bands (> 1).
    """

    def merged_weights(self) -> tuple[Tensor, Tensor]:
        """Return (to_latent (H, d_model, r), to_output (H, r, d_model)).

        ``x @ to_latent[h]`` is head h's query in latent coordinates, and
        ``blend @ to_output[h]`` is head h's share of the output for a
        blend of latents. Compute them once after training and pass them to
        ``forward_absorbed``, as a deployed model would.
        """
        heads, width, rank = self.query_heads, self.head_dim, self.latent_rank
        w_q = self.query.weight.view(heads, width, self.d_model)  # W_Q_h rows
        w_uk = self.key_up.weight.view(heads, width, rank)  # (H, d_h, r)
        w_uv = self.value_up.weight.view(heads, width, rank)  # (H, d_h, r)
        w_o = self.output.weight.view(self.d_model, heads, width)
        w_o = w_o.permute(1, 2, 0)  # W_O_h^T: (H, d_h, d_model)
        to_latent = w_q.transpose(1, 2) @ w_uk  # (H, d_model, r)
        to_output = w_uv.transpose(1, 2) @ w_o  # (H, r, d_model)
        return to_latent, to_output

    def forward_absorbed(
        self, x: Tensor, cache: LatentCache | None = None, *,
        merged: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, LatentCache]:
        """Return (output (B, T, d_model), cache (B, T_past + T, r + d_R)).

        Both equal ``forward``'s. ``merged`` is what ``merged_weights()``
        returns; None computes it here.
        """
        rank, rope = self.latent_rank, self.rope_key_dim
        latent, positions = self.extend_latent(x, cache)  # ch03's cache
        if merged is None:
            merged = self.merged_weights()
        to_latent, to_output = merged
        content = latent[:, None, :, :rank]  # (B, 1, T_k, r): shared by heads
        query_latent = x[:, None] @ to_latent  # (B, H, T, r)
        scores = query_latent @ content.transpose(-2, -1)  # (B, H, T, T_k)
        if rope:
            rotary_query = self.rotary_queries(x, positions)  # (B, H, T, d_R)
            rotary_key = latent[:, None, :, rank:]  # (B, 1, T_k, d_R)
            scores = scores + rotary_query @ rotary_key.transpose(-2, -1)
        scores = scores / math.sqrt(self.head_dim + rope)  # forward's scale
        visible = causal_rows(x.size(1), latent.size(1), device=x.device)
        weights = ch01.softmax(scores.masked_fill(~visible, -math.inf), dim=-1)
        blend = weights @ content  # (B, H, T, r): blend the latents first,
        output = (blend @ to_output).sum(dim=1)  # then map once: (B, T, d)
        return output, latent


# chapters/ch03-windows.qmd:81
def visibility_mask(seq_len: int,               # T
                    window: int | None = None,  # W; None = full causal
                    sinks: int = 0, *,
                    query_len: int | None = None,
                    device: torch.device | str | None = None) -> Tensor:
    """Return a bool grid, True where a query row may read a key column.

    ``window=None`` gives the causal mask. A finite ``window`` W keeps, for
    the query at position i, the keys j with i - W < j <= i; ``sinks``
    keeps the first ``sinks`` positions visible as well (StreamingLLM).
    With ``query_len`` only the rows of the last ``query_len`` positions
    are built, (query_len, seq_len): what a decode step needs. A length
    that is not an integer, a window below 1 (rows with no key) and
    negative sinks are refused.
    """
    seq_len = check_int("seq_len", seq_len, minimum=0)  # 2.5: a 3-row mask
    window = check_int("window", window, minimum=1, optional=True)
    sinks = check_int("sinks", sinks, minimum=0)
    rows = seq_len if query_len is None else query_len
    visible = causal_rows(rows, seq_len, device=device)           # (T_q, T)
    if window is None:
        return visible
    query = torch.arange(seq_len - rows, seq_len, device=device)[:, None]
    key = torch.arange(seq_len, device=device)[None, :]
    return visible & ((query - key < window) | (key < sinks))     # (T_q, T)


# chapters/ch03-windows.qmd:194
def read_window_fields(mapping: Mapping[str, Any],
                       layers: int) -> dict[str, int]:
    """Return window and windowed_layers for a config's sliding window, or {}.

    Reads ``sliding_window`` (W). Which of the ``layers`` use it comes from
    ``layer_types`` (count of ``"sliding_attention"``), else
    ``sliding_window_pattern`` p (every p-th layer global), else every
    layer; ``model_type`` ``"gemma2"`` alternates (p = 2).
    ``use_sliding_window: false`` turns the window off.

    Raises:
        TypeError: If ``mapping`` is not a mapping or ``layers`` not an int.
        ValueError: If a field is present but not a usable integer.
    """
    check_type("mapping", mapping, Mapping)
    window = check_int("sliding_window", mapping.get("sliding_window"),  # W
                       minimum=1, optional=True)
    pattern = check_int("sliding_window_pattern",                        # p
                        mapping.get("sliding_window_pattern"), minimum=1,
                        optional=True)
    enabled = check_bool("use_sliding_window",
                         config_value(mapping, "use_sliding_window", True))
    layers = check_int("layers", layers, minimum=1)
    if window is None or not enabled:
        return {}
    if isinstance(mapping.get("layer_types"), list):
        kinds = mapping["layer_types"]
        windowed = sum(kind == "sliding_attention" for kind in kinds)
    else:
        if pattern is None and mapping.get("model_type") == "gemma2":
            pattern = 2
        if pattern is None:
            windowed = layers                          # every layer
        else:
            windowed = layers - layers // pattern      # every p-th is global
    if windowed == 0:
        return {}
    return {"window": window, "windowed_layers": windowed}


# chapters/ch03-windows.qmd:354
def rolling_buffer_slots(tokens_seen: int, window: int) -> list[int]:
    """Return the token in each of ``window`` ring slots (-1 = still empty).

    Token t is written to slot t mod window, over the token that left.
    """
    tokens_seen = check_int("tokens_seen", tokens_seen, minimum=0)
    window = check_int("window", window, minimum=1)
    slots = [-1] * window
    for token in range(max(0, tokens_seen - window), tokens_seen):
        slots[token % window] = token
    return slots


def sliding_window_decode(query: Tensor, key: Tensor, value: Tensor,
                          window: int) -> tuple[Tensor, int]:
    """Return (outputs, most entries held) of decoding with a ring of W slots.

    query, key: (..., T, d); value: (..., T, d_v). Token t overwrites slot
    t mod W, and the outputs equal attention masked with
    ``visibility_mask(T, window=W)``.
    """
    window = check_int("window", window, minimum=1)
    *lead, tokens, width = key.shape
    key_ring = key.new_zeros(*lead, window, width)  # (..., W, d): all there is
    value_ring = value.new_zeros(*lead, window, value.shape[-1])
    outputs, most = [], 0
    for t in range(tokens):
        key_ring[..., t % window, :] = key[..., t, :]
        value_ring[..., t % window, :] = value[..., t, :]
        held = min(t + 1, window)  # slots 0 .. held-1 are filled
        most = max(most, held)
        out, _ = ch01.scaled_dot_product_attention(
            query[..., t : t + 1, :], key_ring[..., :held, :],
            value_ring[..., :held, :])
        outputs.append(out)
    return torch.cat(outputs, dim=-2), most


# chapters/ch03-windows.qmd:508
def window_reach(window: int, layers: int) -> int:
    """Return L (W - 1), how far L windowed layers carry (Equation 5.1)."""
    window = check_int("window", window, minimum=1)
    return layers * (window - 1)


def hops_needed(distance: int, window: int) -> int:
    """Return ceil(D / (W - 1)): windowed layers that carry D positions."""
    window = check_int("window", window, minimum=2)
    return -(-distance // (window - 1))  # ceil(D / (W - 1)), exactly


# chapters/ch03-windows.qmd:673
def tokens_that_fit(config: KVConfig, budget: int,
                    batch: int = 1) -> int | None:
    """Return the most tokens T with kv_bytes(config, T, batch) <= budget.

    Equation 4.1 turned around: while T < W every layer holds T tokens;
    past the window only the global layers grow. ``None`` means that no
    length fills ``budget``: every layer is windowed, and the cache stops
    at W tokens a layer, below the budget.

    Raises:
        TypeError: If ``config`` is not a KVConfig or a count not an int.
        ValueError: If ``budget`` is negative or ``batch`` is below 1.
    """
    config = check_type("config", config, KVConfig)
    budget = check_int("budget", budget, minimum=0)              # M, bytes
    batch = check_int("batch", batch, minimum=1)                 # B
    slot = (batch * config.cached_scalars_per_layer_token()
            * config.bytes_per_scalar)           # one token in one layer
    slots = budget // slot                 # layer-token slots in M_budget
    every_layer = slots // config.layers         # T while T < W
    if config.window is None or every_layer < config.window:
        return every_layer
    global_layers = config.layers - config.windowed_layers   # L_global
    if global_layers == 0:                       # the cache stops at W
        return None
    windowed = config.windowed_layers * config.window        # L_local W
    return (slots - windowed) // global_layers
