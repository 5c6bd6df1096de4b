# Generated from chapters/ch08-serving.qmd by `python -m booktools tangle`.
# Do not edit: change the chapter's `# @save` cells, then tangle again.
"""Code saved from chapters/ch08-serving.qmd ("Serving a long context")."""

import functools
import importlib.util
import math
import os
import shutil
from types import ModuleType
from typing import NamedTuple

import torch
from torch import Tensor

from longctx import ch02, ch05, support

# chapters/ch08-serving.qmd:109
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


# chapters/ch08-serving.qmd:280
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
    """Return one decode step by the C++ kernel (Equation 5.3).

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


# chapters/ch08-serving.qmd:720
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
