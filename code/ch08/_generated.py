# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch08-serving.qmd ("Serving a long context")."""

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx import ch02, ch03, ch05, support


# chapters/ch08-serving.qmd:77
class LayerShape(NamedTuple):
    """The sizes of one Llama-style decoder layer.

    Attributes:
        d_model: d, the residual stream's width.
        query_heads: H_q.
        kv_heads: H_kv, the heads a token caches a key and a value for.
        head_dim: d_h.
        hidden: the MLP's inner width.
        eps: RMSNorm's epsilon.
    """

    d_model: int
    query_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    eps: float


def layer_shape(mapping: Mapping[str, Any]) -> LayerShape:
    """Return one decoder layer's shape as a Hugging Face config gives it.

    Heads and their width come from ch03.KVConfig.from_hf_config; the
    residual and MLP widths and RMSNorm's epsilon from hidden_size,
    intermediate_size and rms_norm_eps.

    Raises:
        TypeError: If ``mapping`` is not a mapping or a field not a number.
        ValueError: If a field is missing or out of range, or the config
            describes a latent cache (this layer caches keys and values).
    """
    attention = ch03.KVConfig.from_hf_config(mapping)
    fields = ch03.merge_text_config(mapping)
    if attention.kv_heads is None:
        raise ValueError("mapping describes a latent cache; layer_shape "
                         "needs key-value heads (num_key_value_heads)")
    d_model = support.check_int("hidden_size", support.config_value(
        fields, "hidden_size"), minimum=1)
    hidden = support.check_int("intermediate_size", support.config_value(
        fields, "intermediate_size"), minimum=1)
    eps = support.check_number("rms_norm_eps", support.config_value(
        fields, "rms_norm_eps", 1e-5), above=0)
    return LayerShape(d_model, attention.query_heads, attention.kv_heads,
                      attention.head_dim, hidden, eps)


# chapters/ch08-serving.qmd:165
class LayerWeights(NamedTuple):
    """One layer's weights; a matrix is (outputs, inputs), as nn.Linear's.

    Attributes:
        attention_norm: (D,), the gain of the RMSNorm before attention.
        query: (H_q d_h, D).
        key: (H_kv d_h, D).
        value: (H_kv d_h, D).
        output: (D, H_q d_h), the heads projected back.
        mlp_norm: (D,), the gain of the RMSNorm before the MLP.
        gate: (hidden, D).
        up: (hidden, D).
        down: (D, hidden).
    """

    attention_norm: Tensor
    query: Tensor
    key: Tensor
    value: Tensor
    output: Tensor
    mlp_norm: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor

    @property
    def nbytes(self) -> int:
        """Bytes of all nine tensors: what one step must read of the layer."""
        return sum(weight.nbytes for weight in self)


#: The dtypes a layer is built in, by name: its weights, rows and cache.
LAYER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def layer_weights(shape: LayerShape, *, dtype: str = "float32",
                  seed: int = 0) -> LayerWeights:
    """Return seeded random weights of ``shape`` in ``dtype``.

    Matrices are normal with variance 1 / inputs, so that activations keep
    their scale through the layer; the norms' gains are ones.
    """
    shape = support.check_type("shape", shape, LayerShape)
    dtype = LAYER_DTYPES[support.check_choice("dtype", dtype, LAYER_DTYPES)]
    seed = support.check_int("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)

    def matrix(outputs: int, inputs: int) -> Tensor:
        drawn = torch.randn(outputs, inputs, generator=generator)
        return drawn.div_(math.sqrt(inputs)).to(dtype)

    d_model, heads, kv_width = (shape.d_model, shape.query_heads
                                * shape.head_dim, shape.kv_heads
                                * shape.head_dim)
    ones = torch.ones(d_model, dtype=dtype)
    return LayerWeights(
        ones, matrix(heads, d_model), matrix(kv_width, d_model),
        matrix(kv_width, d_model), matrix(d_model, heads), ones.clone(),
        matrix(shape.hidden, d_model), matrix(shape.hidden, d_model),
        matrix(d_model, shape.hidden))


# chapters/ch08-serving.qmd:239
def rms_norm(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    """Return x / sqrt(mean(x^2) + eps) * gain over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def swiglu(x: Tensor, weights: LayerWeights) -> Tensor:
    """Return the MLP's output (..., D): down(silu(gate x) * up x)."""
    return (F.silu(x @ weights.gate.T) * (x @ weights.up.T)) @ weights.down.T


def project_qkv(x: Tensor, weights: LayerWeights,
                shape: LayerShape) -> tuple[Tensor, Tensor, Tensor]:
    """Return the normed rows' query (B, H_q, S, d_h), key and value.

    x (B, S, D); the key and value are (B, H_kv, S, d_h).
    """
    batch, length, _ = x.shape
    rows = rms_norm(x, weights.attention_norm, shape.eps)

    def heads(matrix: Tensor) -> Tensor:
        out = rows @ matrix.T  # (B, S, heads * d_h)
        return out.view(batch, length, -1, shape.head_dim).transpose(1, 2)

    return heads(weights.query), heads(weights.key), heads(weights.value)


def finish_layer(x: Tensor, mixed: Tensor, weights: LayerWeights,
                 shape: LayerShape) -> Tensor:
    """Return the layer's output (B, S, D) from its input and attention's.

    x (B, S, D) is the residual; mixed (B, H_q, S, d_h) what attention
    returned. The heads are projected back and added, then the MLP.
    """
    batch, _, length, _ = mixed.shape
    heads = mixed.transpose(1, 2).reshape(batch, length, -1)  # (B, S, H_q d_h)
    x = x + heads @ weights.output.T
    return x + swiglu(rms_norm(x, weights.mlp_norm, shape.eps), weights)


# chapters/ch08-serving.qmd:280
def decode_step(x: Tensor, weights: LayerWeights, keys: Tensor,
                values: Tensor, shape: LayerShape) -> Tensor:
    """Return one layer's decode step (B, 1, D) for one token a sequence.

    x (B, 1, D); keys and values (B, H_kv, T, d_h): the last slot is this
    token's, written here, the T - 1 before it the sequence's past.
    Attention over all T is ch05.split_kv_decode.
    """
    query, key, value = project_qkv(x, weights, shape)  # (B, H, 1, d_h)
    keys[..., -1:, :] = key
    values[..., -1:, :] = value
    mixed = ch05.split_kv_decode(query, keys, values)  # (B, H_q, 1, d_h)
    return finish_layer(x, mixed, weights, shape)


# chapters/ch08-serving.qmd:624
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


# chapters/ch08-serving.qmd:707
def chunk_attention(query: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """Return causal attention of a chunk's n queries over its prefix.

    query (B, H_q, n, d_h) holds positions P .. P + n - 1; keys and values
    (B, H_kv, P + n, d_h) every position up to the chunk's last. The mask
    is ch03.causal_rows; torch's fused kernel applies it tile by tile.
    """
    mask = ch03.causal_rows(query.shape[2], keys.shape[2],
                            device=query.device)  # (n, P + n)
    return F.scaled_dot_product_attention(query, keys, values,
                                          attn_mask=mask, enable_gqa=True)


def prefill_chunk(x: Tensor, weights: LayerWeights, keys: Tensor,
                  values: Tensor, shape: LayerShape) -> Tensor:
    """Return one layer's output (B, n, D) for the next n prompt tokens.

    keys and values (B, H_kv, P + n, d_h): P cached positions and n free
    last slots, written here. With P = 0 it is a whole prompt's prefill.
    """
    length = x.shape[1]
    query, key, value = project_qkv(x, weights, shape)  # (B, H, n, d_h)
    keys[..., -length:, :] = key
    values[..., -length:, :] = value
    mixed = chunk_attention(query, keys, values)  # (B, H_q, n, d_h)
    return finish_layer(x, mixed, weights, shape)


def mixed_step(chunk: Tensor, chunk_keys: Tensor, chunk_values: Tensor,
               x: Tensor, keys: Tensor, values: Tensor,
               weights: LayerWeights,
               shape: LayerShape) -> tuple[Tensor, Tensor]:
    """Return one step's outputs for a prompt's chunk and a decode batch.

    chunk (1, n, D) with chunk_keys and chunk_values as in prefill_chunk;
    x (B, 1, D) with keys and values as in decode_step. The weights are
    read once, for all n + B rows; each attention reads its own cache.
    Returns the chunk's rows (1, n, D) and the batch's (B, 1, D).
    """
    length = chunk.shape[1]
    rows = torch.cat([chunk[0], x[:, 0]]).unsqueeze(0)  # (1, n + B, D)
    query, key, value = project_qkv(rows, weights, shape)  # (1, H, n + B, d_h)
    chunk_keys[..., -length:, :] = key[..., :length, :]
    chunk_values[..., -length:, :] = value[..., :length, :]
    keys[..., -1:, :] = key[..., length:, :].transpose(0, 2)  # (B, H, 1, d_h)
    values[..., -1:, :] = value[..., length:, :].transpose(0, 2)
    prompt_part = chunk_attention(query[..., :length, :], chunk_keys,
                                  chunk_values)  # (1, H_q, n, d_h)
    decode_rows = query[..., length:, :].transpose(0, 2)  # (B, H_q, 1, d_h)
    decode_part = ch05.split_kv_decode(decode_rows, keys, values)
    mixed = torch.cat([prompt_part, decode_part.transpose(0, 2)], dim=2)
    out = finish_layer(rows, mixed, weights, shape)  # (1, n + B, D)
    return out[:, :length], out[0, length:].unsqueeze(1)


# chapters/ch08-serving.qmd:820
def chunk_pairs(start: int, length: int) -> int:
    """Return the (query, key) pairs a causal chunk scores.

    The chunk holds positions start .. start + length - 1; the query at
    position p reads p + 1 keys.
    """
    return length * start + length * (length + 1) // 2


class StepCost(NamedTuple):
    """Seconds one layer's step takes, as a sum over the work it holds.

    Attributes:
        fixed: each step: reading the weights once.
        per_row: each row (prompt token or decode row) the weights take.
        per_cached: each cached token a decode row's attention reads.
        per_pair: each (query, key) pair a chunk's attention scores.
    """

    fixed: float
    per_row: float
    per_cached: float
    per_pair: float

    def seconds(self, rows: int, cached: int, pairs: int) -> float:
        """Return the step's seconds for its rows, cached tokens and pairs."""
        return (self.fixed + self.per_row * rows + self.per_cached * cached
                + self.per_pair * pairs)


#: The counts a measured step gives beside its seconds, in StepCost's order.
COST_TERMS = ("rows", "cached", "pairs")


def fit_step_cost(points: Sequence[Mapping[str, float]]) -> StepCost:
    """Return the StepCost that fits measured steps with least relative error.

    Each point gives ``rows``, ``cached``, ``pairs`` and ``seconds``. The
    fit minimises the sum of squared (predicted - measured) / measured, so
    a 10 ms step counts as much as a 2 s one.

    Raises:
        TypeError: If ``points`` is not a sequence of mappings.
        ValueError: If it holds fewer than four points (four unknowns), or
            a point lacks a term or has a time that is not above zero.
    """
    support.check_type("points", points, Sequence)
    if len(points) < 4:
        raise ValueError("points must hold at least 4 steps "
                         f"(got {len(points)})")
    for point in points:
        support.check_type("points", point, Mapping)
        support.check_number("points", point.get("seconds"), above=0)
        for term in COST_TERMS:
            support.check_number("points", point.get(term), minimum=0)
    seconds = torch.tensor([p["seconds"] for p in points],
                           dtype=torch.float64)
    terms = torch.tensor([[1.0] + [p[term] for term in COST_TERMS]
                          for p in points], dtype=torch.float64)  # (N, 4)
    scale = terms.abs().amax(0).clamp(min=1)  # columns of like size
    solution = torch.linalg.lstsq(terms / scale / seconds[:, None],
                                  torch.ones(len(points), 1,
                                             dtype=torch.float64)).solution
    return StepCost(*(solution[:, 0] / scale).tolist())


# chapters/ch08-serving.qmd:959
class Served(NamedTuple):
    """What serving a trace gave: each request's waits, and the machine's.

    Attributes:
        first_token: per request, seconds from its arrival to its first
            token (time to first token).
        per_token: per request with more than one output token, seconds
            per token after the first (time per output token).
        gaps: every gap, in seconds, between two output tokens of one
            request.
        busy: the share of the time the machine ran steps.
        steps: how many steps it ran.
    """

    first_token: list[float]
    per_token: list[float]
    gaps: list[float]
    busy: float
    steps: int


class Queue(NamedTuple):
    """The scheduler's view: prompts not yet read, and sequences decoding.

    Attributes:
        waiting: requests (their index in the trace) that have arrived and
            whose prompt is not read yet, oldest first.
        decoding: requests generating tokens.
        prefilled: for every request of the trace, the prompt tokens read.
    """

    waiting: list[int]
    decoding: list[int]
    prefilled: list[int]


def plan_whole_prompt(queue: Queue, trace: Sequence, chunk: int | None,
                      room: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Return a step holding the oldest waiting prompt whole, or the decodes.

    A prompt, when one waits and the batch has room, runs alone: every
    decoding sequence waits for it. Returns (prompt pieces, decode rows).
    """
    if queue.waiting and room > 0:
        first = queue.waiting[0]
        return [(first, trace[first].prompt)], []
    return [], list(queue.decoding)


def plan_chunked(queue: Queue, trace: Sequence, chunk: int | None,
                 room: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Return a step of every decode row and up to ``chunk`` prompt tokens.

    The prompt tokens are taken from the waiting prompts in arrival order,
    at most ``room`` prompts, each piece continuing where the last stopped.
    """
    pieces, budget = [], chunk
    for request in queue.waiting[:room]:
        take = min(budget, trace[request].prompt - queue.prefilled[request])
        pieces.append((request, take))
        budget -= take
        if budget == 0:
            break
    return pieces, list(queue.decoding)


def serve_trace(trace: Sequence, cost: StepCost, *, chunk: int | None,
                plan: Callable | None = None, layers: int = 32,
                max_batch: int = 64) -> Served:
    """Return what serving ``trace`` with steps priced by ``cost`` gives.

    A step of the model is ``layers`` layer steps. ``plan`` fills each step
    (``plan(queue, trace, chunk, room)``, as plan_chunked); by default
    ``chunk=None`` runs each prompt whole in a step of its own
    (plan_whole_prompt) and an integer runs every step with all decode
    rows and up to ``chunk`` prompt tokens (plan_chunked). At most
    ``max_batch`` sequences are read or decoded at once. A prompt's last
    piece gives its first token.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If ``trace`` is empty or out of arrival order, or a
            count is below one.
    """
    support.check_type("trace", trace, Sequence)
    if not trace:
        raise ValueError("trace must hold at least one request (got none)")
    for request in trace:
        support.check_type("trace", request, Request)
    if any(b.arrival < a.arrival for a, b in zip(trace, trace[1:],
                                                strict=False)):
        raise ValueError("trace must be in order of arrival, as "
                         "request_trace returns it")
    support.check_type("cost", cost, StepCost)
    chunk = support.check_int("chunk", chunk, minimum=1, optional=True)
    support.check_type("plan", plan, Callable, optional=True)
    layers = support.check_int("layers", layers, minimum=1)
    max_batch = support.check_int("max_batch", max_batch, minimum=1)
    if plan is None:
        plan = plan_whole_prompt if chunk is None else plan_chunked
    queue = Queue([], [], [0] * len(trace))
    made, last = [0] * len(trace), [0.0] * len(trace)
    first_token, gaps = [0.0] * len(trace), []
    clock = busy = 0.0
    arrivals, steps = iter(range(len(trace))), 0
    upcoming = next(arrivals, None)
    while upcoming is not None or queue.waiting or queue.decoding:
        while upcoming is not None and trace[upcoming].arrival <= clock:
            queue.waiting.append(upcoming)
            upcoming = next(arrivals, None)
        if not queue.waiting and not queue.decoding:  # idle until the next
            clock = trace[upcoming].arrival
            continue
        pieces, rows = plan(queue, trace, chunk,
                            max_batch - len(queue.decoding))
        seconds = layers * cost.seconds(
            len(rows) + sum(n for _, n in pieces),
            sum(trace[r].prompt + made[r] for r in rows),
            sum(chunk_pairs(queue.prefilled[r], n) for r, n in pieces))
        clock, busy, steps = clock + seconds, busy + seconds, steps + 1
        for request in rows:  # each decode row gives one token
            gaps.append(clock - last[request])
            made[request], last[request] = made[request] + 1, clock
        queue.decoding[:] = [r for r in queue.decoding
                             if made[r] < trace[r].output]
        for request, tokens in pieces:
            queue.prefilled[request] += tokens
            if queue.prefilled[request] == trace[request].prompt:
                queue.waiting.remove(request)  # its first token is out
                first_token[request] = clock - trace[request].arrival
                made[request], last[request] = 1, clock
                if trace[request].output > 1:
                    queue.decoding.append(request)
    per_token = [(last[r] - first_token[r] - trace[r].arrival)
                 / (trace[r].output - 1) for r in range(len(trace))
                 if trace[r].output > 1]
    return Served(first_token, per_token, gaps, busy / clock, steps)
