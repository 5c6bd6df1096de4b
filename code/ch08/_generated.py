# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch08-serving.qmd ("Serving a long context")."""

import math
from typing import NamedTuple

import torch
from torch import Tensor

from longctx import ch02, ch05, support


# chapters/ch08-serving.qmd:69
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
