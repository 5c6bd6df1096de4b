# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch08-serving.qmd ("Serving a long context")."""

import math
from typing import NamedTuple

import torch
from torch import Tensor

from longctx import ch02, ch05, support


# chapters/ch08-serving.qmd:76
class Request(NamedTuple):
    """One request of a trace: when it arrives, and its lengths in tokens."""

    arrival: float  # seconds after the trace starts
    prompt: int  # tokens read before the first output token
    output: int  # tokens generated, the first included


def request_trace(count: int, *, seed: int = 0, rate: float = 4.0,
                  prompt_median: int = 2_048, prompt_sigma: float = 1.0,
                  output_median: int = 256, output_sigma: float = 0.8,
                  max_tokens: int = 32_768) -> list[Request]:
    """Return ``count`` requests arriving as a Poisson stream of ``rate``.

    Prompt and output lengths are log-normal with the given medians and
    log-space spreads (sigma), rounded to at least one token; a prompt is
    cut so that prompt + output <= max_tokens, the longest context.
    """
    count = support.check_int("count", count, minimum=1)
    seed = support.check_int("seed", seed, minimum=0)
    rate = support.check_number("rate", rate, above=0)
    prompt_median = support.check_int("prompt_median", prompt_median,
                                      minimum=1)
    prompt_sigma = support.check_number("prompt_sigma", prompt_sigma,
                                        minimum=0)
    output_median = support.check_int("output_median", output_median,
                                      minimum=1)
    output_sigma = support.check_number("output_sigma", output_sigma,
                                        minimum=0)
    max_tokens = support.check_int("max_tokens", max_tokens, minimum=2)
    generator = torch.Generator().manual_seed(seed)
    gaps = torch.empty(count, dtype=torch.float64).exponential_(
        rate, generator=generator)
    normal = torch.randn(2, count, dtype=torch.float64, generator=generator)
    prompts = (math.log(prompt_median) + prompt_sigma * normal[0]).exp()
    outputs = (math.log(output_median) + output_sigma * normal[1]).exp()
    outputs = outputs.round().clamp(1, max_tokens - 1)
    prompts = torch.minimum(prompts.round().clamp(min=1),
                            max_tokens - outputs)
    return [Request(float(t), int(p), int(o)) for t, p, o in
            zip(gaps.cumsum(0), prompts, outputs, strict=True)]


# chapters/ch08-serving.qmd:321
def token_probabilities(logits: Tensor, temperature: float) -> Tensor:
    """Return the distribution (..., n_vocab) a sampler draws from.

    The softmax of ``logits / temperature``; at temperature 0, the one-hot
    row of the argmax, so that greedy decoding is sampling from it.
    """
    support.check_number("temperature", temperature, minimum=0)
    if temperature == 0:
        best = logits.argmax(-1, keepdim=True)  # (..., 1)
        return torch.zeros_like(logits).scatter_(-1, best, 1.0)
    return torch.softmax(logits / temperature, dim=-1)


def acceptance_rate(target: Tensor, draft: Tensor) -> Tensor:
    """Return alpha = sum_x min(P(x), P_hat(x)) for each row (...).

    target P and draft P_hat are distributions (..., n_vocab); alpha is
    the chance that a drafted token is kept, one minus the total variation
    distance between the two.
    """
    return torch.minimum(target, draft).sum(-1)


def expected_tokens(alpha: float, k: int) -> float:
    """Return the mean tokens one target step writes, as the papers give it.

    With k drafted tokens each kept with chance ``alpha``: 1 + alpha + ...
    + alpha^k = (1 - alpha^(k+1)) / (1 - alpha), which is k + 1 at 1.
    """
    alpha = support.check_number("alpha", alpha, minimum=0, maximum=1)
    k = support.check_int("k", k, minimum=0)
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, cost: float) -> float:
    """Return the papers' expected speedup over plain decoding.

    ``cost`` is c, a draft step's time over a target step's; a round costs
    k c + 1 target steps if the target's k + 1 positions cost one step,
    and writes expected_tokens(alpha, k) tokens.
    """
    cost = support.check_number("cost", cost, minimum=0)
    return expected_tokens(alpha, k) / (k * cost + 1)


# chapters/ch08-serving.qmd:373
def speculative_verify(target: Tensor, draft: Tensor, drafted: Tensor,
                       generator: torch.Generator) -> tuple[int, int]:
    """Return (kept, next token) for k drafted tokens.

    target (k + 1, n_vocab): P at each drafted position and one past the
    last; draft (k, n_vocab): the P_hat each drafted token was drawn from;
    drafted (k,). Token i is kept with chance min(1, P / P_hat); the first
    one refused is replaced from max(0, P - P_hat), normalised; if all k
    are kept, the next token is drawn from the last row of P.
    """
    k = drafted.shape[0]
    rows = torch.arange(k)
    ratio = target[rows, drafted] / draft[rows, drafted]  # P / P_hat
    uniform = torch.rand(k, generator=generator, dtype=ratio.dtype)
    refused = (uniform >= ratio).nonzero()  # u < ratio keeps token i
    if refused.numel() == 0:
        return k, int(torch.multinomial(target[k], 1, generator=generator))
    first = int(refused[0, 0])
    leftover = (target[first] - draft[first]).clamp(min=0)
    if leftover.sum() == 0:  # P = P_hat up to rounding: nothing left over
        leftover = target[first]
    return first, int(torch.multinomial(leftover, 1, generator=generator))


# chapters/ch08-serving.qmd:455
def truncate_cache(cache: ch02.KVCache, length: int) -> ch02.KVCache:
    """Cut every layer of ``cache`` back to its first ``length`` tokens.

    The rollback after a refused draft: the tokens past ``length`` are
    dropped in place, and the next forward continues at ``length``.
    Returns the same cache.
    """
    support.check_type("cache", cache, ch02.KVCache)
    length = support.check_int("length", length, minimum=0,
                               maximum=cache.length)  # no silent no-op
    for layer in range(cache.layers):  # (B, H, T, d_h) -> (B, H, length, d_h)
        cache.keys[layer] = cache.keys[layer][:, :, :length]
        cache.values[layer] = cache.values[layer][:, :, :length]
    return cache


# chapters/ch08-serving.qmd:480
class SpeculativeRun(NamedTuple):
    """What speculative_generate wrote, and how each target step went.

    Attributes:
        tokens: The new token ids.
        drafted: The tokens drafted before each target step.
        accepted: Of those, how many the target kept, step by step.
    """

    tokens: list[int]
    drafted: list[int]
    accepted: list[int]


@torch.no_grad()
def speculative_generate(target: ch02.TinyGPT, draft: ch02.TinyGPT,
                         prompt_ids: list[int] | Tensor, max_new_tokens: int,
                         *, k: int = 4, temperature: float = 1.0,
                         seed: int | None = None) -> SpeculativeRun:
    """Return ``max_new_tokens`` ids of ``target``, drafted by ``draft``.

    Each round the draft writes k tokens, one cached step each; the target
    reads the last token and the k drafted ones in one cached forward,
    speculative_verify keeps a prefix and adds one token, and both caches
    are cut back to the text kept. The output is distributed as the
    target's own samples at ``temperature`` (0: its greedy text). Both
    models are left in eval mode.
    """
    support.check_type("target", target, ch02.TinyGPT)
    support.check_type("draft", draft, ch02.TinyGPT)
    vocab = target.config.vocab_size
    if draft.config.vocab_size != vocab:
        raise ValueError(f"draft must share the target's vocabulary "
                         f"(got {draft.config.vocab_size} and {vocab})")
    longest = min(target.config.context_length, draft.config.context_length)
    prompt = support.check_int_sequence("prompt_ids", prompt_ids, minimum=0,
                                        maximum=vocab - 1, nonempty=True,
                                        max_length=longest).tolist()
    max_new_tokens = support.check_int("max_new_tokens", max_new_tokens,
                                       minimum=1, maximum=longest - len(prompt))
    k = support.check_int("k", k, minimum=1)
    temperature = support.check_number("temperature", temperature, minimum=0)
    seed = support.check_int("seed", seed, minimum=0, optional=True)
    if temperature > 0 and seed is None:
        raise ValueError("sampling (temperature > 0) needs a seed")
    generator = torch.Generator().manual_seed(seed or 0)
    for model in (target, draft):
        model.eval()  # no dropout while decoding
    sequence, caches = list(prompt), (target.new_cache(), draft.new_cache())
    drafted_counts, accepted_counts = [], []
    while (left := max_new_tokens - (len(sequence) - len(prompt))) > 0:
        drafted, rows = [], []
        for _ in range(min(k, left - 1)):  # no token drafted past the end
            unread = (sequence + drafted)[caches[1].length :]
            logits = draft(torch.tensor([unread]), caches[1])[0, -1]
            rows.append(token_probabilities(logits, temperature))
            drafted.append(int(torch.multinomial(rows[-1], 1,
                                                 generator=generator)))
        unread = (sequence + drafted)[caches[0].length :]  # 1 + k tokens
        logits = target(torch.tensor([unread]), caches[0])[0]
        checked = token_probabilities(logits[-len(drafted) - 1 :],
                                      temperature)  # (k + 1, n_vocab)
        kept, token = speculative_verify(
            checked, torch.stack(rows) if rows else checked[:0],
            torch.tensor(drafted, dtype=torch.long), generator)
        sequence += drafted[:kept] + [token]
        for cache in caches:  # keep only keys of the text both agree on
            truncate_cache(cache, min(cache.length, len(sequence) - 1))
        drafted_counts.append(len(drafted))
        accepted_counts.append(kept)
    return SpeculativeRun(sequence[len(prompt) :], drafted_counts,
                          accepted_counts)
