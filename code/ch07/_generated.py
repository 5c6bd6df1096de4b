# Generated from chapters/ch07-forgetting.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch07-forgetting.qmd ("What a cache can forget")."""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx import ch02, ch05, ch06, support


# chapters/ch07-forgetting.qmd:88
class Seen(NamedTuple):
    """What one layer's heads have attended to, for the cached entries.

    Every policy reads one and returns the indices (B, H, keep) of the
    entries to keep, sorted by position.

    Attributes:
        positions: (B, H, n) int: where each of the n entries sits in the
            text.
        accumulated: (B, H, n): A_j of Equation 12.1, over every query so
            far.
        recent: (B, H, w, n): the attention rows of the w newest queries,
            from which nu_j is summed.
    """

    positions: Tensor
    accumulated: Tensor
    recent: Tensor


def top_positions(score: Tensor, keep: int) -> Tensor:
    """Return the indices (B, H, keep) of the highest scores, in order."""
    support.check_int("keep", keep, minimum=1, maximum=score.shape[-1])
    return score.topk(keep, dim=-1).indices.sort(dim=-1).values


def newest(seen: Seen, count: int) -> Tensor:
    """Return a bool (B, H, n): is the entry among the ``count`` newest?"""
    cutoff = seen.positions.amax(-1, keepdim=True) - count
    return seen.positions > cutoff


# chapters/ch07-forgetting.qmd:132
def keep_all(seen: Seen, keep: int) -> Tensor:
    """The full cache: every entry, whatever the budget."""
    return top_positions(-seen.positions.double(), seen.positions.shape[-1])


def keep_recent(seen: Seen, keep: int) -> Tensor:
    """A sliding window: the ``keep`` newest entries."""
    return top_positions(seen.positions.double(), keep)


def keep_sinks(seen: Seen, keep: int, sinks: int = 4) -> Tensor:
    """StreamingLLM: the first ``sinks`` positions and the newest rest."""
    score = seen.positions.double()
    score[seen.positions < sinks] = math.inf
    return top_positions(score, keep)


def keep_heavy(seen: Seen, keep: int, recent_share: float = 0.5) -> Tensor:
    """H2O: the newest share of ``keep``, then the largest A_j of the rest."""
    score = seen.accumulated.double().clone()
    score[newest(seen, round(recent_share * keep))] = math.inf
    return top_positions(score, keep)


# chapters/ch07-forgetting.qmd:172
def snap_votes(seen: Seen, window: int, pool: int) -> Tensor:
    """Return SnapKV's votes (B, H, n - window), pooled along the cache.

    nu_j of Equation 12.1 over the newest ``window`` queries, for the
    n - window entries before them (the window's own columns are sliced
    off, as in SnapKV's code: the window is kept whatever its votes),
    averaged over ``pool`` neighbouring entries (odd, so that each entry
    is the centre of its neighbourhood). The entries are those of a
    prompt, in order. Neither has a default here; the chapter's SnapKV
    uses window 4 and pool 5 (``POLICIES``).
    """
    support.check_int("window", window, minimum=1)
    if support.check_int("pool", pool, minimum=1) % 2 == 0:  # n + 1 votes
        raise ValueError(f"pool must be odd (got {pool})")
    votes = seen.recent[..., -window:, :-window].sum(-2)  # (B, H, n - w)
    batch, heads, entries = votes.shape
    pooled = F.avg_pool1d(votes.reshape(batch * heads, 1, entries), pool,
                          stride=1, padding=pool // 2,
                          count_include_pad=False)
    return pooled.view(batch, heads, entries)


def keep_snap(seen: Seen, keep: int, window: int, pool: int = 5) -> Tensor:
    """SnapKV: the observation window itself and its best pooled votes.

    Returns the indices (B, H, keep) of the entries kept, sorted by
    position: the ``window`` newest (the chapter's policies use a window
    of 4, ``POLICIES["snapkv"]``) and the ``keep - window`` best votes of
    ``snap_votes``, pooled over ``pool`` (default 5) entries. ``keep`` must
    hold the window and at most the n cached entries.
    """
    if support.check_int("keep", keep, minimum=1) < window:  # window cut
        raise ValueError(f"keep must be at least window={window} (got {keep})")
    if keep == window:
        return top_positions(seen.positions.double(), keep)
    votes = snap_votes(seen, window, pool).double()  # (B, H, n - window)
    score = F.pad(votes, (0, window), value=math.inf)  # the window: kept
    return top_positions(score, keep)


def pyramid_budgets(keep: int, layers: int, *, tokens: int, window: int,
                    beta: float = 20.0) -> list[int]:
    """Return PyramidKV's per-layer budgets, falling linearly with depth.

    As its reference code: of the ``keep`` entries a layer has on average,
    ``window`` are the observation window; the deepest layer keeps the
    window and a ``beta``-th of the rest, the first as much above ``keep``
    (none more than ``tokens``), the layers between a straight line. They
    sum to ``layers * keep``; rounding is settled on the first layer.
    """
    last = window + int((keep - window) // beta)
    first = min(tokens, 2 * keep - last)
    last = 2 * keep - first
    if layers == 1:
        return [keep]
    budgets = [round(first + (last - first) * layer / (layers - 1))
               for layer in range(layers)]
    budgets[0] += layers * keep - sum(budgets)
    return budgets


# chapters/ch07-forgetting.qmd:244
def toy_seen(entries: int = 12, window: int = 3, *, seed: int = 7) -> Seen:
    """Return the chapter's small case: one head's random causal attention.

    Scores 2 N(0, 1), drawn with ``seed``, between ``entries`` queries and
    keys, softmaxed under a causal mask: ``positions`` 0..entries-1, and
    ``recent`` the rows of the ``window`` newest queries.
    """
    entries = support.check_int("entries", entries, minimum=1)
    window = support.check_int("window", window, minimum=1, maximum=entries)
    seed = support.check_int("seed", seed, minimum=0)
    scores = 2 * torch.randn(1, 1, entries, entries,
                             generator=torch.Generator().manual_seed(seed))
    causal = torch.ones(entries, entries, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, -math.inf).softmax(-1)  # (1,1,n,n)
    return Seen(torch.arange(entries).view(1, 1, entries), weights.sum(-2),
                weights[..., -window:, :])


# chapters/ch07-forgetting.qmd:321
class TokensRead:
    """The tokens each layer of a cache has read, which set its positions.

    A cache that evicts keeps fewer entries than it has read, so the next
    token's RoPE position is this count, not the number of entries stored.

    Args:
        layers: Number of layers L.
    """

    def __init__(self, layers: int):
        """Start every layer at 0 tokens read."""
        self.read = [0] * layers  # tokens each layer has read

    @property
    def length(self) -> int:
        """Return the number of tokens read so far."""
        return self.read[0]

    def position(self, layer: int) -> int:
        """Return the position of ``layer``'s next token: the tokens read."""
        return self.read[layer]


class EvictingCache(TokensRead):
    """Per-layer keys and values (B, H, k_l, d_h) that a policy keeps.

    The prompt is read with full attention; ``compress``, once, right
    after it, cuts layer l to its budget k_l(P) of the P tokens read
    (``layer_budgets``, summing to L floor(zeta P)). Each later token,
    read alone, attends over the kept entries and itself and is appended:
    nothing more is evicted, as SnapKV and PyramidKV run (H2O as those
    papers run it).

    ``make_cache`` builds one with checked arguments.

    Args:
        policy: A keep function (``keep_recent``, ``keep_sinks``, ...):
            (what the layer has seen, keep) -> kept indices (B, H, keep).
        fraction: The budget zeta, a fraction in (0, 1] of the tokens read.
        layers: Number of layers L.
        beta: None for equal budgets in every layer; else PyramidKV's
            ``beta`` of ``pyramid_budgets``, falling with depth.
        **settings: The policy's own settings (``window``, ``pool``,
            ``sinks``, ``recent_share``), passed to it when it evicts.
    """

    def __init__(self, policy, fraction: float, layers: int, *,
                 beta: float | None = None, **settings):
        self.policy, self.settings = policy, settings
        self.fraction, self.layers, self.beta = fraction, layers, beta
        self.window = settings.get("window", 1)  # w rows kept for votes
        self.keys, self.values = [None] * layers, [None] * layers
        self.seen: list[Seen | None] = [None] * layers
        super().__init__(layers)

    def layer_budgets(self, tokens: int) -> list[int]:
        """Return k_l(t), the entries a head keeps in each layer."""
        keep = max(1, math.floor(self.fraction * tokens + 1e-9))
        if self.beta is None:
            return [keep] * self.layers
        return pyramid_budgets(keep, self.layers, tokens=tokens,
                               window=self.window, beta=self.beta)

    def attend(self, layer: int, query: Tensor, key: Tensor,
               value: Tensor) -> Tensor:
        """Return attention (B, H, T, d_h) of T new tokens; cache them.

        The prompt (into an empty cache) may be T tokens; after it, T = 1.
        """
        new, start = query.shape[2], self.read[layer]
        self.read[layer] += new
        positions = torch.arange(start, start + new).expand(*key.shape[:2],
                                                            new)
        if self.keys[layer] is None:  # the prompt: causal, in full
            mixed, weights = ch02.attend_with_cache(query, key, value)
            self.keys[layer], self.values[layer] = key, value
            self.seen[layer] = Seen(positions, weights.sum(-2),
                                    weights[..., -self.window:, :])
            return mixed
        keys = torch.cat([self.keys[layer], key], dim=2)  # (B, H, k + 1, d_h)
        values = torch.cat([self.values[layer], value], dim=2)
        mixed, weights = ch02.attend_with_cache(query, keys, values)
        seen = self.seen[layer]
        self.keys[layer], self.values[layer] = keys, values
        self.seen[layer] = Seen(  # kept up to date; no more evictions
            torch.cat([seen.positions, positions], dim=-1),
            F.pad(seen.accumulated, (0, new)) + weights.sum(-2),  # A_j
            torch.cat([F.pad(seen.recent, (0, new)), weights],
                      dim=-2)[..., -self.window:, :])
        return mixed

    def evict(self, layer: int, keep: int) -> None:
        """Cut ``layer`` to the ``keep`` entries a head its policy picks."""
        seen = self.seen[layer]
        if seen.positions.shape[-1] <= keep:
            return
        chosen = self.policy(seen, keep, **self.settings)  # (B, H, keep)
        width = self.keys[layer].shape[-1]
        rows = chosen[..., None].expand(-1, -1, -1, width)
        self.keys[layer] = self.keys[layer].gather(2, rows)
        self.values[layer] = self.values[layer].gather(2, rows)
        columns = chosen[:, :, None].expand(-1, -1, seen.recent.shape[2], -1)
        self.seen[layer] = Seen(seen.positions.gather(-1, chosen),
                                seen.accumulated.gather(-1, chosen),
                                seen.recent.gather(-1, columns))

    def compress(self) -> None:
        """Cut every layer to its budget: once, right after the prompt."""
        for layer, keep in enumerate(self.layer_budgets(self.length)):
            self.evict(layer, keep)

    def nbytes(self) -> int:
        """Return the bytes of the kept keys and values."""
        return sum(t.nbytes for t in self.keys + self.values)


# chapters/ch07-forgetting.qmd:453
class StreamingCache(EvictingCache):
    """StreamingLLM as its paper runs it: every token read alone.

    Each token, prompt or decode, attends over the kept entries and
    itself, is appended, and the cache evicts back to ``keep`` entries a
    head: the first ``sinks`` positions and the newest rest. Keys keep
    the RoPE of their positions in the text (no re-indexing inside the
    cache).

    Args:
        keep: Entries a head holds, k = floor(zeta P).
        layers: Number of layers L.
        sinks: First positions always kept.
    """

    def __init__(self, keep: int, layers: int, *, sinks: int = 4):
        super().__init__(keep_sinks, 1.0, layers, sinks=sinks)
        self.keep = keep

    def attend(self, layer: int, query: Tensor, key: Tensor,
               value: Tensor) -> Tensor:
        """Return attention (B, H, T, d_h), reading the T tokens one by one."""
        mixed = []
        for at in range(query.shape[2]):
            one = slice(at, at + 1)
            if self.keys[layer] is None:  # the first token: nothing cached
                self.keys[layer] = key[:, :, :0]
                self.values[layer] = value[:, :, :0]
                empty = key.new_zeros(*key.shape[:2], 0)
                self.seen[layer] = Seen(empty.long(), empty,
                                        empty[:, :, :0, None])
            keys = torch.cat([self.keys[layer], key[:, :, one]], dim=2)
            values = torch.cat([self.values[layer], value[:, :, one]], dim=2)
            mixed.append(ch02.attend_with_cache(query[:, :, one], keys,
                                                values)[0])
            seen = self.seen[layer]
            where = torch.full((*key.shape[:2], 1), self.read[layer])
            self.read[layer] += 1
            self.keys[layer], self.values[layer] = keys, values
            self.seen[layer] = Seen(torch.cat([seen.positions, where], -1),
                                    F.pad(seen.accumulated, (0, 1)),
                                    F.pad(seen.recent, (0, 1)))
            self.evict(layer, self.keep)
        return torch.cat(mixed, dim=2)

    def compress(self) -> None:
        """Nothing to cut: the cache held its size while it read."""


# chapters/ch07-forgetting.qmd:526
class QuantizedCache(TokensRead):
    """Keys and values stored in ``bits`` bits, every entry kept.

    Per token with absmax (``ch05``'s ``quantize_cache``), or KIVI-style
    (``ch05.KiviCache``: keys per channel in groups of ``group`` tokens,
    values per token, the newest ``residual`` or more in full precision).

    ``make_cache`` builds one with checked arguments.

    Args:
        layers: Number of layers L.
        bits: Bits a stored code has (8, 4 or 2 for KIVI; 8 or 4 per token).
        kivi: Whether to store KIVI-style instead of per token.
        group: Tokens a key scale covers (KIVI only).
        residual: Newest tokens kept in full precision (KIVI only).
    """

    def __init__(self, layers: int, bits: int, *, kivi: bool = False,
                 group: int = 16, residual: int = 16):
        self.bits, self.kivi = bits, kivi
        self.group, self.residual = group, residual
        self.stored = [None] * layers
        super().__init__(layers)

    def store(self, key: Tensor, value: Tensor):
        """Return keys and values (B, H, T, d_h) in this cache's format."""
        if self.kivi:
            return ch05.KiviCache.from_keys_values(
                key, value, bits=self.bits, group=self.group,
                residual=self.residual)
        return (ch05.quantize_cache(key, self.bits),
                ch05.quantize_cache(value, self.bits))

    def floats(self, layer: int) -> tuple[Tensor, Tensor]:
        """Return ``layer``'s keys and values as the floats they stand for."""
        if self.kivi:
            return self.stored[layer].dequantize()
        return tuple(ch05.dequantize_cache(part) for part in self.stored[layer])

    def attend(self, layer: int, query: Tensor, key: Tensor,
               value: Tensor) -> Tensor:
        """Return attention (B, H, T, d_h) of T new tokens; cache them."""
        self.read[layer] += query.shape[2]
        if self.stored[layer] is None:  # the prompt: full precision
            self.stored[layer] = self.store(key, value)
            return ch02.attend_with_cache(query, key, value)[0]
        if self.kivi:
            self.stored[layer].append(key, value)
            return self.stored[layer].attend(query)
        self.stored[layer] = tuple(
            ch05.QuantizedKV(torch.cat([old.codes, part.codes], 2),
                             torch.cat([old.scale, part.scale], 2), self.bits)
            for old, part in zip(self.stored[layer], self.store(key, value),
                                 strict=True))
        keys, values = self.floats(layer)
        return ch02.attend_with_cache(query, keys, values)[0]

    def compress(self) -> None:
        """Nothing to cut: the bits were chosen when the cache was made."""

    def nbytes(self) -> int:
        """Return the bytes of every code, scale, offset and residual."""
        if self.kivi:
            return sum(part.nbytes for part in self.stored)
        return sum(part.nbytes for pair in self.stored for part in pair)


# chapters/ch07-forgetting.qmd:616
def read_with_cache(model: ch06.RotaryGPT, tokens: Tensor, cache) -> Tensor:
    """Return logits (B, T, V) for ``tokens`` (B, T) read into ``cache``.

    The model's own forward pass: each layer turns its queries and keys by
    RoPE from ``cache.position``, the tokens read so far, and hands them to
    ``cache.attend``.

    Raises:
        TypeError, ValueError: For a model that is not a RotaryGPT,
            ``tokens`` that are not (B, T) byte ids, or a cache that is
            not one of this chapter's.
    """
    support.check_type("model", model, ch06.RotaryGPT)
    support.check_tensor("tokens", tokens, dims=2, dtype=torch.long,
                         nonempty=True)
    support.check_type("cache", cache, (EvictingCache, QuantizedCache))
    return model(tokens, cache)


# chapters/ch07-forgetting.qmd:637
#: Each policy's name -> (keep function, settings). An evicting policy's
#: keep function picks the entries to keep; its settings are the
#: function's own (``sinks`` first positions kept, H2O's ``recent_share``
#: of the budget for the newest entries, SnapKV's observation ``window``
#: and vote ``pool``). None marks a quantized cache, whose settings are
#: ``bits`` a code and, KIVI-style, the key ``group`` and ``residual``.
POLICIES = {
    "full": (keep_all, {}),
    "window": (keep_recent, {}),
    "sinks": (keep_sinks, {"sinks": 4}),
    "streaming": (keep_sinks, {"sinks": 4}),
    "h2o": (keep_heavy, {"recent_share": 0.5}),
    "snapkv": (keep_snap, {"window": 4, "pool": 5}),
    "pyramidkv": (keep_snap, {"window": 4, "pool": 5}),
    "int8": (None, {"bits": 8}),
    "int4": (None, {"bits": 4}),
    "kivi4": (None, {"bits": 4, "kivi": True, "group": 16, "residual": 16}),
    "kivi2": (None, {"bits": 2, "kivi": True, "group": 16, "residual": 16}),
}
#: The budgets measured, as fractions of the full cache's bytes.
BUDGETS = (0.1, 0.25, 0.5, 1.0)
#: PyramidKV's beta (its reference code's): the deepest layer keeps its
#: window and a beta-th of the rest of the mean budget.
PYRAMID_BETA = 20.0


def make_cache(model: ch06.RotaryGPT, policy: str,
               budget: float | None = None, *, prompt_tokens: int):
    """Return an empty cache of ``policy`` for ``model``.

    Eviction policies take ``budget``, a fraction of the full cache's
    bytes in (0, 1]; the full cache and the quantized ones (int8, int4,
    kivi4, kivi2) take none (or 1): they keep every entry, and bits set the
    size of a quantized one. ``streaming`` holds floor(budget *
    ``prompt_tokens``) entries from the first token on (``StreamingCache``);
    the others read the prompt in full and compress once.

    Raises:
        TypeError, ValueError: For an unknown policy, a budget outside
            (0, 1], a budget for a quantized cache or below 1 for the full
            one, or a budget that keeps no more entries of
            ``prompt_tokens`` than the policy's fixed part (sinks, window).
    """
    support.check_type("model", model, ch06.RotaryGPT)
    keep, settings = POLICIES[support.check_choice("policy", policy, POLICIES)]
    prompt_tokens = support.check_int("prompt_tokens", prompt_tokens, minimum=1)
    sized = keep is None or policy == "full"  # the policy fixes its size
    budget = 1.0 if sized and budget is None else budget
    budget = support.check_number("budget", budget, above=0, maximum=1)
    fixed = settings.get("sinks", 0) + settings.get("window", 0)
    if sized and budget != 1 or math.floor(budget * prompt_tokens
                                           + 1e-9) <= fixed:
        raise ValueError(f"budget {budget} does not fit {policy!r} at "
                         f"{prompt_tokens} tokens (the full and quantized "
                         f"caches take none; fixed part {fixed})")
    if keep is None:
        return QuantizedCache(len(model.blocks), **settings)
    if policy == "streaming":
        return StreamingCache(math.floor(budget * prompt_tokens + 1e-9),
                              len(model.blocks), **settings)
    beta = PYRAMID_BETA if policy == "pyramidkv" else None
    return EvictingCache(keep, budget, len(model.blocks), beta=beta,
                         **settings)


@torch.no_grad()
def compressed_guesses(model: ch06.RotaryGPT, batch: ch06.KeyBatch,
                       policy: str, budget: float | None = None) -> Tensor:
    """Return the most likely byte (B,) after each question, compressed.

    The prompt is every input but the last: it ends on the asked name, so
    a policy that reads the last queries reads the question. After
    compression the last input, ``KEY_ASK``, is decoded against the
    cache, and its most likely next byte is the answer.

    Raises:
        TypeError, ValueError: As ``make_cache``, or if ``batch`` is not
            a ``ch06.KeyBatch``.
    """
    support.check_type("batch", batch, ch06.KeyBatch)
    cache = make_cache(model, policy, budget,
                       prompt_tokens=batch.inputs.shape[1] - 1)
    read_with_cache(model, batch.inputs[:, :-1], cache)
    cache.compress()
    logits = read_with_cache(model, batch.inputs[:, -1:], cache)
    return logits[:, -1].argmax(-1)


def compressed_hits(model: ch06.RotaryGPT, batch: ch06.KeyBatch,
                    policy: str, budget: float | None = None) -> Tensor:
    """Return a bool (B,): was the asked value the most likely byte?

    ``compressed_guesses`` compared with each window's answer.

    Raises:
        TypeError, ValueError: As ``compressed_guesses``.
    """
    guesses = compressed_guesses(model, batch, policy, budget)
    return guesses == batch.targets[:, -1]


@torch.no_grad()
def compressed_losses(model: ch06.RotaryGPT, inputs: Tensor, targets: Tensor,
                      policy: str, budget: float | None = None, *,
                      prompt: int) -> Tensor:
    """Return the next-byte losses (B, T - prompt) of a streamed decode.

    The first ``prompt`` bytes of each window are read at once and the
    cache compressed; each later byte is decoded alone, the budget held.

    Raises:
        TypeError, ValueError: As ``make_cache``, or for ``inputs`` and
            ``targets`` that are not matching (B, T) byte ids, or a
            ``prompt`` not in 1 .. T - 1.
    """
    support.check_tensor("inputs", inputs, dims=2, dtype=torch.long,
                         nonempty=True)
    support.check_tensor("targets", targets, dims=2, dtype=torch.long,
                         sizes=dict(enumerate(inputs.shape)))
    prompt = support.check_int("prompt", prompt, minimum=1,
                               maximum=inputs.shape[1] - 1)
    cache = make_cache(model, policy, budget, prompt_tokens=prompt)
    read_with_cache(model, inputs[:, :prompt], cache)
    cache.compress()
    logits = [read_with_cache(model, inputs[:, at:at + 1], cache)
              for at in range(prompt, inputs.shape[1])]
    return F.cross_entropy(torch.cat(logits, 1).transpose(1, 2),
                           targets[:, prompt:], reduction="none")
