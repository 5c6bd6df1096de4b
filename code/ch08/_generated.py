# Generated from chapters/ch08-serving.qmd and chapters/ch08-sharing.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch08-serving.qmd ("Serving a long context") and chapters/ch08-sharing.qmd ("Sharing a server's work: prefixes, chunks and drafts")."""

import functools
import heapq
import importlib.util
import math
import os
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx import ch02, ch03, ch05, support


# chapters/ch08-serving.qmd:90
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


# chapters/ch08-serving.qmd:178
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


# chapters/ch08-serving.qmd:252
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


# chapters/ch08-serving.qmd:293
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


# chapters/ch08-serving.qmd:671
#: The decode kernel in C++: the state of every chunk of a float32, int8
#: or int4 cache in one pass per chunk (load_kernel compiles it).
DECODE_KERNEL_SOURCE = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// A cache's rows as floats: row j stands for scale(j) times row(j). A
// float32 row is read where it lies; int8 codes are converted into buf; a
// packed int4 byte holds code i in its low nibble, code i + d/2 in its high.
struct Rows {
  const void* data;
  const float* scales;  // one per row; unused for float32
  int64_t width, bits;  // d; 32, 8 or 4
  const float* row(int64_t j, float* buf) const {
    if (bits == 32) return static_cast<const float*>(data) + j * width;
    const int8_t* c = static_cast<const int8_t*>(data) + j * width * bits / 8;
    if (bits == 8) {
      #pragma omp simd
      for (int64_t i = 0; i < width; ++i) buf[i] = c[i];
      return buf;
    }
    #pragma omp simd
    for (int64_t i = 0; i < width / 2; ++i) {
      buf[i] = static_cast<int8_t>(c[i] << 4) >> 4;  // low nibble, signed
      buf[width / 2 + i] = c[i] >> 4;  // high nibble: the shift keeps sign
    }
    return buf;
  }
  float scale(int64_t j) const { return bits == 32 ? 1.0f : scales[j]; }
};

constexpr int64_t kRows = 4;  // cached rows read side by side

// The state (m, l, a) of the G query rows q (G, d) over the cached rows
// [first, last): scores, softmax and value mix in one pass over the chunk.
void chunk_state(const float* q, int64_t groups, const Rows& keys,
                 const Rows& values, int64_t first, int64_t last,
                 float* top, float* total, float* mixed) {
  const int64_t width = keys.width, n = last - first;
  const int64_t padded = (n + kRows - 1) / kRows * kRows;
  std::vector<float> z(groups * padded, 0.0f), buf(kRows * width);
  const float* r[kRows];
  float s[kRows];
  auto read = [&](const Rows& cache, int64_t j) {  // rows j to j + 3
    for (int64_t u = 0; u < kRows; ++u) {  // past the end: the last again
      const int64_t at = first + std::min(j + u, n - 1);
      r[u] = cache.row(at, buf.data() + u * width);
      s[u] = cache.scale(at);
    }
  };
  for (int64_t j = 0; j < n; j += kRows) {  // z_j = sigma_j (q . c_j)
    read(keys, j);
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = q + g * width;
      float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
      #pragma omp simd reduction(+ : d0, d1, d2, d3)
      for (int64_t i = 0; i < width; ++i) {
        d0 += qg[i] * r[0][i];
        d1 += qg[i] * r[1][i];
        d2 += qg[i] * r[2][i];
        d3 += qg[i] * r[3][i];
      }
      float* zg = z.data() + g * padded + j;
      zg[0] = d0 * s[0], zg[1] = d1 * s[1];
      zg[2] = d2 * s[2], zg[3] = d3 * s[3];
    }
  }
  for (int64_t g = 0; g < groups; ++g) {  // m, w_j = e^(z_j - m), l
    float* w = z.data() + g * padded;
    const float m = *std::max_element(w, w + n);
    float l = 0.0f;
    #pragma omp simd reduction(+ : l)
    for (int64_t j = 0; j < n; ++j) {
      w[j] = std::exp(w[j] - m);
      l += w[j];
    }
    std::fill(w + n, w + padded, 0.0f);  // the repeated rows weigh nothing
    top[g] = m, total[g] = l;
  }
  std::fill(mixed, mixed + groups * width, 0.0f);
  for (int64_t j = 0; j < n; j += kRows) {  // a = sum_j (w_j sigma_j) c_j
    read(values, j);
    for (int64_t g = 0; g < groups; ++g) {
      const float* w = z.data() + g * padded + j;
      const float w0 = w[0] * s[0], w1 = w[1] * s[1];
      const float w2 = w[2] * s[2], w3 = w[3] * s[3];
      float* a = mixed + g * width;
      #pragma omp simd
      for (int64_t i = 0; i < width; ++i)
        a[i] += w0 * r[0][i] + w1 * r[1][i] + w2 * r[2][i] + w3 * r[3][i];
    }
  }
}

// rows (B, H_kv, G, d); caches (B, H_kv, T, .). Returns the states of
// every chunk, (B, H_kv, C, G, 1) twice and (B, H_kv, C, G, d).
std::vector<torch::Tensor> fused_chunk_states(
    torch::Tensor rows, torch::Tensor key, torch::Tensor key_scale,
    torch::Tensor value, torch::Tensor value_scale, int64_t bits,
    int64_t chunk, int64_t threads) {
  const int64_t batch = rows.size(0), heads = rows.size(1);
  const int64_t groups = rows.size(2), width = rows.size(3);
  const int64_t tokens = key.size(2), count = (tokens + chunk - 1) / chunk;
  auto top = torch::empty({batch, heads, count, groups, 1}, rows.options());
  auto total = torch::empty_like(top);
  auto mixed = torch::empty({batch, heads, count, groups, width},
                            rows.options());
  const Rows keys{key.data_ptr(), key_scale.data_ptr<float>(), width, bits};
  const Rows values{value.data_ptr(), value_scale.data_ptr<float>(), width,
                    bits};
  const float* q = rows.data_ptr<float>();
  float *m = top.data_ptr<float>(), *l = total.data_ptr<float>();
  float* a = mixed.data_ptr<float>();
  #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
  for (int64_t h = 0; h < batch * heads; ++h) {  // every (b, KV head)
    for (int64_t c = 0; c < count; ++c) {  // and every chunk of it
      const int64_t at = h * count + c;  // its state, flattened
      chunk_state(q + h * groups * width, groups, keys, values,
                  h * tokens + c * chunk,
                  h * tokens + std::min(tokens, (c + 1) * chunk),
                  m + at * groups, l + at * groups, a + at * groups * width);
    }
  }
  return {top, total, mixed};
}
"""


# chapters/ch08-serving.qmd:842
#: Optimise for this CPU, with OpenMP's threads and simd loops; -ffast-math
#: lets the exponentials' loop call glibc's vector exp. It is a compile flag
#: only: the linker never sees it, so the process's float mode is unchanged.
KERNEL_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math")


class DecodeKernel(NamedTuple):
    """The compiled decode kernel, or None and the reason it is missing.

    Attributes:
        module: the extension, whose fused_chunk_states is the C++ entry.
        reason: "" when the kernel was built; else what was missing.
    """

    module: ModuleType | None
    reason: str


def missing_build_tools() -> list[str]:
    """Return what the kernel's build needs and this machine lacks."""
    missing = []
    if not (shutil.which("c++") or shutil.which("g++")):
        missing.append("C++ compiler (c++ or g++)")
    if not (shutil.which("ninja") or importlib.util.find_spec("ninja")):
        missing.append("ninja")
    return missing


@functools.cache
def load_kernel() -> DecodeKernel:
    """Return the decode kernel, compiled quietly on first use.

    torch.utils.cpp_extension.load_inline builds DECODE_KERNEL_SOURCE
    with KERNEL_FLAGS into torch's extensions folder, and a later call, in
    this process or the next, loads it from there.
    """
    missing = missing_build_tools()
    if missing:
        return DecodeKernel(None, "no " + " and no ".join(missing) + " found")
    if shutil.which("ninja") is None:  # pip's ninja: put its program on PATH
        import ninja
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR,
                                              os.environ.get("PATH", "")])
    from torch.utils.cpp_extension import load_inline
    try:
        module = load_inline(
            "longctx_decode_kernel", [DECODE_KERNEL_SOURCE],
            functions=["fused_chunk_states"], extra_cflags=list(KERNEL_FLAGS),
            extra_ldflags=["-fopenmp"])
    except (OSError, RuntimeError, ImportError) as error:
        first_line = str(error).strip().splitlines()[0]
        return DecodeKernel(None, f"the build failed: {first_line}")
    return DecodeKernel(module, "")


def kernel_chunk_states(rows: Tensor, key: Tensor | ch05.QuantizedKV,
                        value: Tensor | ch05.QuantizedKV,
                        chunk: int) -> ch05.OnlineState:
    """Return the state (m, l, a) of every chunk, from the C++ kernel.

    rows (B, H_kv, G, d) float32; key and value float32 (B, H_kv, T, d), or
    QuantizedKV of 8 or 4 bits. The states cover (B, H_kv, C, G) for
    C = ceil(T / chunk), the last chunk shorter, as in ch05.chunk_states.
    """
    if isinstance(key, ch05.QuantizedKV):
        parts, bits = (key.codes, key.scale, value.codes, value.scale), key.bits
    else:
        no_scale = rows.new_empty(0)
        parts, bits = (key, no_scale, value, no_scale), 32
    states = load_kernel().module.fused_chunk_states(
        rows.contiguous(), *(part.contiguous() for part in parts), bits,
        chunk, torch.get_num_threads())
    return ch05.OnlineState(*states)


def fused_decode(query: Tensor, key: Tensor | ch05.QuantizedKV,
                 value: Tensor | ch05.QuantizedKV, *,
                 chunk: int = 512) -> Tensor:
    """Return one decode step by the C++ kernel (Equation 9.2).

    query (B, H_q, 1, d) float32 on the CPU; key and value float32
    (B, H_kv, T, d), or QuantizedKV of the same bits, with H_kv dividing
    H_q. Every chunk's state comes from kernel_chunk_states; the states
    are merged by ch05.merge_states. Returns (B, H_q, 1, d).

    Raises:
        TypeError, ValueError: for arguments the kernel cannot read.
        RuntimeError: where the kernel cannot be built (it says why).
    """
    support.check_tensor("query", query, dims=4, dtype=torch.float32,
                         nonempty=True, sizes={2: 1})
    support.check_type("key", key, (Tensor, ch05.QuantizedKV))
    support.check_type("value", value, type(key))  # float or codes, both
    if isinstance(key, Tensor):
        support.check_tensor("key", key, dims=4, dtype=torch.float32,
                             nonempty=True)
        support.check_tensor("value", value, dtype=torch.float32)
    elif value.bits != key.bits:
        raise ValueError(f"value must have key's {key.bits} bits "
                         f"(got {value.bits})")
    batch, query_heads, _, width = query.shape
    if (key.shape[0], key.shape[3]) != (batch, width):
        raise ValueError(f"key must be (B={batch}, H_kv, T, d={width}) "
                         f"(got {tuple(key.shape)})")
    if value.shape != key.shape:
        raise ValueError(f"value must have key's shape {tuple(key.shape)} "
                         f"(got {tuple(value.shape)})")
    support.check_divides("key heads", key.shape[1], "query heads",
                          query_heads)
    chunk = support.check_int("chunk", chunk, minimum=1)
    stored = [c if isinstance(c, Tensor) else c.codes for c in (key, value)]
    if {t.device.type for t in (query, *stored)} != {"cpu"}:
        raise ValueError("query, key and value must be on the CPU: the "
                         "kernel is C++ for the CPU")
    kernel = load_kernel()
    if kernel.module is None:
        raise RuntimeError(f"the decode kernel is not available: "
                           f"{kernel.reason}")
    rows = ch05.stacked_rows(query, key.shape[1], None)  # (B, H_kv, G, d)
    state = ch05.merge_states(kernel_chunk_states(rows, key, value, chunk),
                              dim=2)
    return ch05.finish_online_softmax(state).reshape(query.shape)


# chapters/ch08-serving.qmd:1332
class Request(NamedTuple):
    """One request of a trace: when it arrives, and its lengths in tokens.

    Attributes:
        arrival: Seconds after the trace starts.
        prompt: Tokens read before the first output token.
        output: Tokens generated, the first included.
    """

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


# chapters/ch08-serving.qmd:1419
#: A layout's rule: the tokens of memory it holds for a request's
#: sequence while the sequence has cached the given number of tokens.
Reservation = Callable[[Request, int], int]


def reserve_longest(max_tokens: int) -> Reservation:
    """Return a contiguous cache's rule: max_tokens for every sequence."""
    max_tokens = support.check_int("max_tokens", max_tokens, minimum=1)
    return lambda request, tokens: max_tokens


def reserve_exact(request: Request, tokens: int) -> int:
    """Return an oracle's contiguous reservation: the final length."""
    return request.prompt + request.output


def reserve_pages(page_size: int) -> Reservation:
    """Return a paged cache's rule: whole pages for the tokens held."""
    page_size = support.check_int("page_size", page_size, minimum=1)
    return lambda request, tokens: -(-tokens // page_size) * page_size


def replay_memory(trace: list[Request], budget: int, reserve: Reservation, *,
                step_seconds: float = 0.05) -> dict[str, float]:
    """Replay ``trace`` first come, first served, and count its memory.

    Time moves in decode steps of ``step_seconds``. At each step the
    requests that have arrived join the queue; the queue's head is
    admitted while every reservation fits in ``budget`` tokens; each
    running sequence caches one more token; a sequence with all its
    output leaves and frees its memory. ``reserve(request, tokens)`` is
    the layout. Where a reservation grows past the budget, the newest
    sequences go back to the head of the queue, keeping their tokens.

    Returns:
        empty_share, the share of the reserved memory (summed over the
        steps) that held no token; mean_running and peak_running, the
        sequences decoding per step; steps; preemptions.

    Raises:
        ValueError: if a request alone cannot fit in the budget.
    """
    if not support.check_type("trace", trace, list):
        raise ValueError("trace must hold at least one request (got [])")
    budget = support.check_int("budget", budget, minimum=1)
    reserve = support.check_type("reserve", reserve, Callable)
    step_seconds = support.check_number("step_seconds", step_seconds,
                                        above=0)
    for number, request in enumerate(trace):
        if reserve(request, request.prompt + request.output) > budget:
            raise ValueError(f"budget of {budget} tokens cannot hold "
                             f"request {number} ({request})")
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival)
    held = {i: trace[i].prompt for i in order}  # tokens cached, or to be
    waiting, running = deque(), []  # running in the order admitted
    arrived = finished = steps = preemptions = peak = 0
    held_sum = reserved_sum = running_sum = 0

    def used(extra: int = 0) -> int:
        return sum(reserve(trace[i], held[i] + extra) for i in running)

    while finished < len(trace):
        while (arrived < len(order)
               and trace[order[arrived]].arrival <= steps * step_seconds):
            waiting.append(order[arrived])
            arrived += 1
        while waiting and (used(1) + reserve(trace[waiting[0]],
                                             held[waiting[0]] + 1) <= budget):
            running.append(waiting.popleft())
        while used(1) > budget:  # the newest waits again
            waiting.appendleft(running.pop())
            preemptions += 1
        for i in running:  # one token each
            held[i] += 1
        held_sum += sum(held[i] for i in running)
        reserved_sum += used()
        running_sum += len(running)
        peak = max(peak, len(running))
        done = [i for i in running
                if held[i] == trace[i].prompt + trace[i].output]
        running = [i for i in running if i not in done]
        finished += len(done)
        steps += 1
    return {"empty_share": 1 - held_sum / reserved_sum,
            "mean_running": running_sum / steps, "peak_running": peak,
            "steps": steps, "preemptions": preemptions}


# chapters/ch08-serving.qmd:1610
class PagePool:
    """Pages of ``page_size`` tokens: a free list, counts, block tables.

    A sequence's block table lists its pages in order, so its token t
    lies in slot t mod P of page table[t // P]. A page counts one
    reference for every table (or cache) that holds it, and goes back to
    the free list when the last of them lets go.

    Args:
        pages: Pages in the pool.
        page_size: Tokens a page holds, P.
    """

    def __init__(self, pages: int, page_size: int) -> None:
        """Start with every page free; the Args are the class's."""
        self.pages = support.check_int("pages", pages, minimum=1)
        self.page_size = support.check_int("page_size", page_size, minimum=1)
        self.free = list(range(self.pages - 1, -1, -1))  # pop(): page 0 first
        self.references = [0] * self.pages
        self.tables: dict[int, list[int]] = {}  # sequence -> its pages
        self.lengths: dict[int, int] = {}  # sequence -> its tokens

    def pages_for(self, tokens: int) -> int:
        """Return how many pages hold ``tokens`` tokens: ceil(T / P)."""
        return -(-tokens // self.page_size)

    def allocate(self) -> int:
        """Take a free page, with one reference."""
        page = self.free.pop()
        self.references[page] = 1
        return page

    def share(self, page: int) -> int:
        """Add a reference to ``page``, and return it."""
        self.references[page] += 1
        return page

    def release(self, page: int) -> None:
        """Drop a reference to ``page``; with none left it is free."""
        self.references[page] -= 1
        if self.references[page] == 0:
            self.free.append(page)

    def add(self, sequence: int, prefix: list[int] = (),
            tokens: int = 0) -> None:
        """Start ``sequence`` on the pages ``prefix``, which hold ``tokens``."""
        self.tables[sequence] = [self.share(page) for page in prefix]
        self.lengths[sequence] = tokens

    def fork(self, sequence: int, child: int) -> None:
        """Start ``child`` on every page of ``sequence``, shared."""
        self.add(child, self.tables[sequence], self.lengths[sequence])

    def grow(self, sequence: int, tokens: int) -> list[tuple[int, int]]:
        """Make room for ``tokens`` more tokens; return the pages to copy.

        A last page that is shared and not full is copied before the
        sequence writes into it (copy-on-write): the table takes a fresh
        page, and the pair (shared page, fresh page) is returned for the
        caller to copy the slots already written.

        Raises:
            RuntimeError: if too few pages are free (nothing changes).
        """
        tokens = support.check_int("tokens", tokens, minimum=0)
        table, length = self.tables[sequence], self.lengths[sequence]
        copy = int(tokens > 0 and length % self.page_size > 0
                   and self.references[table[-1]] > 1)
        needed = self.pages_for(length + tokens) - len(table) + copy
        if needed > len(self.free):
            raise RuntimeError(f"sequence {sequence} needs {needed} pages; "
                               f"{len(self.free)} are free")
        copies = []
        if copy:
            shared, table[-1] = table[-1], self.allocate()
            self.release(shared)
            copies.append((shared, table[-1]))
        table += [self.allocate() for _ in range(needed - copy)]
        self.lengths[sequence] = length + tokens
        return copies

    def remove(self, sequence: int) -> None:
        """End ``sequence``: release each of its pages."""
        for page in self.tables.pop(sequence):
            self.release(page)
        del self.lengths[sequence]


# chapters/ch08-serving.qmd:1768
def page_states(rows: Tensor, key_pages: Tensor, value_pages: Tensor,
                table: Sequence[int], tokens: int) -> ch05.OnlineState:
    """Return the state (m, l, a) of every page of one sequence.

    rows (1, H_kv, G, d) are its stacked query rows; key_pages
    (pages, H_kv, P, d) and value_pages (pages, H_kv, P, d_v) the pool;
    table its pages in order and tokens its length T. Each page is one
    chunk of ch05.chunk_states, read where it lies (a view of the pool,
    nothing copied), and the last page only as far as it is written.
    The states are stacked on the first axis, one row per page.
    """
    size = key_pages.shape[2]  # P
    states = []
    for number, page in enumerate(table[:-(-tokens // size)]):
        filled = min(size, tokens - number * size)  # the last may be partial
        keys = key_pages[page:page + 1, :, :filled]  # (1, H_kv, filled, d)
        values = value_pages[page:page + 1, :, :filled]
        states.append(ch05.chunk_states(rows, keys, values, filled))
    return ch05.OnlineState(*(torch.cat(piece)
                              for piece in zip(*states, strict=True)))


def paged_decode(query: Tensor, key_pages: Tensor, value_pages: Tensor,
                 tables: list[Sequence[int]], lengths: list[int], *,
                 scale: float | None = None) -> Tensor:
    """Return one decode step of B sequences whose caches lie in pages.

    query (B, H_q, 1, d); key_pages (pages, H_kv, P, d) and value_pages
    (pages, H_kv, P, d_v); tables[b] and lengths[b] are sequence b's
    block table (its page numbers in order) and length. The page states
    of each sequence are merged by log-sum-exp (Equation 9.2). Returns
    (B, H_q, 1, d_v), the output of ch05.split_kv_decode with chunk P on
    the same cache laid out contiguously.
    """
    outputs = []
    for b, (table, tokens) in enumerate(zip(tables, lengths, strict=True)):
        rows = ch05.stacked_rows(query[b:b + 1], key_pages.shape[1], scale)
        state = ch05.merge_states(
            page_states(rows, key_pages, value_pages, table, tokens), dim=0)
        outputs.append(ch05.finish_online_softmax(state))  # (H_kv, 1, G, d_v)
    out = torch.stack(outputs)  # (B, H_kv, 1, G, d_v) -> (B, H_q, 1, d_v)
    return out.reshape(query.shape[:-1] + (value_pages.shape[-1],))


class PagedKVCache:
    """One layer's keys and values, kept in the pages of a PagePool.

    keys and values are (pages, H_kv, P, d) tensors; a sequence's tokens
    are written into the slots its block table names, and read back
    through the same table by paged_decode.

    Args:
        pool: The pages and block tables.
        kv_heads: Key-value heads H_kv.
        head_dim: Width d of a key or value.
        dtype: The tensors' dtype.
    """

    def __init__(self, pool: PagePool, kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32) -> None:
        """Build the zeroed pages; the Args are the class's."""
        self.pool = support.check_type("pool", pool, PagePool)
        kv_heads = support.check_int("kv_heads", kv_heads, minimum=1)
        head_dim = support.check_int("head_dim", head_dim, minimum=1)
        dtype = support.check_dtype("dtype", dtype)
        shape = (pool.pages, kv_heads, pool.page_size, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype)
        self.values = torch.zeros(shape, dtype=dtype)

    def append(self, sequence: int, key: Tensor, value: Tensor) -> None:
        """Write key and value (H_kv, n, d) after the sequence's tokens."""
        start, size = self.pool.lengths[sequence], self.pool.page_size
        for shared, fresh in self.pool.grow(sequence, key.shape[1]):
            self.keys[fresh] = self.keys[shared]  # copy-on-write
            self.values[fresh] = self.values[shared]
        positions = torch.arange(start, start + key.shape[1])
        pages = torch.tensor(self.pool.tables[sequence])[positions // size]
        slots = positions % size  # token t: slot t mod P of page table[t // P]
        self.keys[pages, :, slots] = key.transpose(0, 1)  # (n, H_kv, d)
        self.values[pages, :, slots] = value.transpose(0, 1)

    def decode(self, query: Tensor, sequences: list[int]) -> Tensor:
        """Return paged_decode for ``sequences``, query (B, H_q, 1, d)."""
        return paged_decode(query, self.keys, self.values,
                            [self.pool.tables[s] for s in sequences],
                            [self.pool.lengths[s] for s in sequences])


# chapters/ch08-sharing.qmd:138
@dataclass(eq=False)
class RadixNode:
    """A node of a prefix tree: the edge into it, a whole number of pages.

    Attributes:
        tokens: The token ids on the edge from the parent.
        pages: The pages that cache them, one per P tokens.
        parent: The node above (None for the root).
        children: The nodes below, by the tokens of their first page.
        last_used: The lookup that last passed through this node.
    """

    tokens: tuple[int, ...]
    pages: list[int]
    parent: "RadixNode | None"
    children: dict[tuple[int, ...], "RadixNode"] = field(default_factory=dict)
    last_used: int = 0


class RadixCache:
    """Cached prefixes in a radix tree over token ids, a page at a time.

    SGLang's RadixAttention keeps finished requests' caches in such a
    tree. Every edge holds whole pages; the tree holds one reference on
    each of them, so a sequence started on a cached prefix shares its
    pages, and a leaf no running sequence shares can be evicted, the
    least recently used first.

    Args:
        pool: The pages; the tree works in its page size P.
    """

    def __init__(self, pool: PagePool) -> None:
        """Start with an empty tree; the Args are the class's."""
        self.pool = support.check_type("pool", pool, PagePool)
        self.root = RadixNode((), [], None)
        self.clock = 0  # lookups so far: the time of last use
        self.cached_pages = 0

    def walk(self, tokens: Sequence[int]) -> tuple[RadixNode, list[int]]:
        """Return the deepest node on the path of ``tokens``, and its pages.

        The path follows whole pages; an edge that matches only its
        first pages is split there, so that the match ends at a node.
        """
        tokens, size = tuple(tokens), self.pool.page_size
        node, pages = self.root, []
        self.clock += 1
        while True:
            start = len(pages) * size  # tokens matched so far
            child = node.children.get(tokens[start:start + size])
            if child is None:
                return node, pages
            same = 1  # pages of the edge that match
            while (same < len(child.pages) and
                   child.tokens[same * size:(same + 1) * size]
                   == tokens[start + same * size:start + (same + 1) * size]):
                same += 1
            if same < len(child.pages):
                child = self.split(child, same)
            child.last_used = self.clock
            node, pages = child, pages + child.pages

    def split(self, node: RadixNode, pages: int) -> RadixNode:
        """Cut the edge into ``node`` after ``pages`` pages; return the top."""
        size, cut = self.pool.page_size, pages * self.pool.page_size
        top = RadixNode(node.tokens[:cut], node.pages[:pages], node.parent,
                        last_used=node.last_used)
        node.parent.children[node.tokens[:size]] = top
        node.tokens, node.pages = node.tokens[cut:], node.pages[pages:]
        node.parent = top
        top.children[node.tokens[:size]] = node
        return top

    def match(self, tokens: Sequence[int]) -> tuple[list[int], int]:
        """Return the pages of the longest cached prefix, and its tokens."""
        _, pages = self.walk(tokens)
        return pages, len(pages) * self.pool.page_size

    def insert(self, tokens: Sequence[int], table: list[int]) -> None:
        """Cache the whole pages of a sequence, its tokens and block table.

        A prefix already in the tree keeps its pages; the sequence's own
        pages past it are shared by one new leaf.
        """
        tokens, size = tuple(tokens), self.pool.page_size
        node, cached = self.walk(tokens)
        whole = len(tokens) // size
        if whole > len(cached):
            leaf = RadixNode(tokens[len(cached) * size:whole * size],
                             [self.pool.share(page)
                              for page in table[len(cached):whole]],
                             node, last_used=self.clock)
            node.children[leaf.tokens[:size]] = leaf
            self.cached_pages += len(leaf.pages)

    def nodes(self) -> Iterator[RadixNode]:
        """Yield every node below the root."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def unused(self, node: RadixNode) -> bool:
        """Return whether ``node`` is a leaf that only the tree holds."""
        return (node is not self.root and not node.children
                and all(self.pool.references[page] == 1
                        for page in node.pages))

    def evict(self, pages: int) -> int:
        """Free at least ``pages`` pages, least recently used leaves first.

        A leaf whose pages a running sequence shares stays, so fewer may
        be freed; a parent left childless joins the candidates. Returns
        the pages freed.
        """
        size, freed = self.pool.page_size, 0
        leaves = [(n.last_used, n.pages[0], n) for n in self.nodes()
                  if self.unused(n)]
        heapq.heapify(leaves)
        while leaves and freed < pages:
            _, _, node = heapq.heappop(leaves)
            for page in node.pages:
                self.pool.release(page)
            freed += len(node.pages)
            del node.parent.children[node.tokens[:size]]
            if self.unused(node.parent):
                parent = node.parent
                heapq.heappush(leaves,
                               (parent.last_used, parent.pages[0], parent))
        self.cached_pages -= freed
        return freed


# chapters/ch08-sharing.qmd:326
class Turn(NamedTuple):
    """One turn of a conversation: when it comes, what it reads and writes.

    Attributes:
        arrival: Seconds after the trace starts.
        conversation: Which conversation the turn belongs to.
        prompt: Token ids read: the history, then the new message.
        reply: The token ids the model answers with.
    """

    arrival: float
    conversation: int
    prompt: tuple[int, ...]
    reply: tuple[int, ...]


def conversation_trace(conversations: int, *, seed: int = 0,
                       rate: float = 1.0, system_tokens: int = 1_000,
                       turns: float = 4.0, message_median: int = 96,
                       message_sigma: float = 1.0, reply_median: int = 192,
                       reply_sigma: float = 0.8, think_seconds: float = 20.0,
                       vocab: int = 32_000,
                       max_tokens: int = 8_192) -> list[Turn]:
    """Return the turns of ``conversations`` chats, in order of arrival.

    Every chat opens with one shared system prompt of ``system_tokens``
    ids. Chats start as a Poisson stream of ``rate``; a chat has 1 +
    Poisson(turns - 1) turns, each a user message and a reply of
    log-normal lengths (medians and log-space sigmas), the next message
    an exponential think time (mean ``think_seconds``) after the last.
    A turn reads the whole history; a chat ends early where a turn would
    pass ``max_tokens``. Ids are uniform over ``vocab``: only whether
    two are equal matters here.
    """
    conversations = support.check_int("conversations", conversations,
                                      minimum=1)
    seed = support.check_int("seed", seed, minimum=0)
    rate = support.check_number("rate", rate, above=0)
    system_tokens = support.check_int("system_tokens", system_tokens,
                                      minimum=0)
    turns = support.check_number("turns", turns, minimum=1)
    message_median = support.check_int("message_median", message_median,
                                       minimum=1)
    message_sigma = support.check_number("message_sigma", message_sigma,
                                         minimum=0)
    reply_median = support.check_int("reply_median", reply_median,
                                     minimum=1)
    reply_sigma = support.check_number("reply_sigma", reply_sigma, minimum=0)
    think_seconds = support.check_number("think_seconds", think_seconds,
                                         above=0)
    vocab = support.check_int("vocab", vocab, minimum=2)
    max_tokens = support.check_int("max_tokens", max_tokens,
                                   minimum=system_tokens + 2)
    generator = torch.Generator().manual_seed(seed)

    def ids(median: int, sigma: float) -> tuple[int, ...]:
        normal = torch.randn((), dtype=torch.float64, generator=generator)
        count = max(1, round(math.exp(math.log(median) + sigma * normal)))
        return tuple(torch.randint(vocab, (count,),
                                   generator=generator).tolist())

    def draw_exponential(mean: float) -> float:
        return torch.empty((), dtype=torch.float64).exponential_(
            1 / mean, generator=generator).item()

    system = tuple(torch.randint(vocab, (system_tokens,),
                                 generator=generator).tolist())
    found, start = [], 0.0
    for chat in range(conversations):
        start += draw_exponential(1 / rate)
        count = 1 + int(torch.poisson(torch.tensor(turns - 1.0),
                                      generator=generator))
        history, clock = system, start
        for _ in range(count):
            message = ids(message_median, message_sigma)
            reply = ids(reply_median, reply_sigma)
            if len(history) + len(message) + len(reply) > max_tokens:
                break
            found.append(Turn(clock, chat, history + message, reply))
            history += message + reply
            clock += draw_exponential(think_seconds)
    return sorted(found, key=lambda turn: turn.arrival)


def serve_conversations(turns: list[Turn], pages: int,
                        page_size: int) -> list[tuple[int, int]]:
    """Serve ``turns`` in order over a RadixCache; return what each found.

    A turn starts on the longest cached prefix of its prompt (the last
    prompt token is always computed: its output is the first reply
    token), grows by the rest of its prompt and its reply, evicting
    least recently used prefixes when the pool is short, and leaves its
    whole pages in the tree when it ends. Returns, per turn, (prompt
    tokens, prompt tokens found cached).

    Raises:
        ValueError: if a turn alone needs more than ``pages`` pages.
    """
    if not support.check_type("turns", turns, list):
        raise ValueError("turns must hold at least one turn (got [])")
    pool = PagePool(pages, page_size)
    longest = max(len(turn.prompt) + len(turn.reply) for turn in turns)
    if pool.pages_for(longest) > pool.pages:
        raise ValueError(f"pages={pages} of {page_size} tokens cannot hold "
                         f"the longest turn ({longest} tokens)")
    cache, found = RadixCache(pool), []
    for number, turn in enumerate(turns):
        shared, hit = cache.match(turn.prompt[:-1])
        pool.add(number, shared, hit)
        new = len(turn.prompt) + len(turn.reply) - hit
        short = pool.pages_for(hit + new) - len(shared) - len(pool.free)
        if short > 0:
            cache.evict(short)
        pool.grow(number, new)
        cache.insert(turn.prompt + turn.reply, pool.tables[number])
        pool.remove(number)
        found.append((len(turn.prompt), hit))
    return found


# chapters/ch08-sharing.qmd:654
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


# chapters/ch08-sharing.qmd:767
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


# chapters/ch08-sharing.qmd:907
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


# chapters/ch08-sharing.qmd:1379
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


# chapters/ch08-sharing.qmd:1431
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


# chapters/ch08-sharing.qmd:1513
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


# chapters/ch08-sharing.qmd:1538
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
