"""Exercise 14.1: the chapter's scheduler priced as an H100 at its datasheet peaks, against this CPU's fitted costs."""
import statistics

from longctx import ch03, ch08, support

config = ch03.load_model_config("llama-3.1-8b")
shape, layers = ch08.layer_shape(config), ch03.KVConfig.from_hf_config(config).layers
heads, kv = shape.query_heads * shape.head_dim, shape.kv_heads * shape.head_dim
weights = 2 * shape.d_model * (heads + kv) + 3 * shape.d_model * shape.hidden + 2 * shape.d_model
h100 = ch08.StepCost(fixed=2 * weights / 3.35e12, per_row=2 * weights / 989e12, per_cached=2 * 2 * kv / 3.35e12,
                     per_pair=4 * heads / 989e12)

run, _ = support.load_results("serving")
points = [{"rows": r["batch"], "cached": r["batch"] * r["tokens"], "pairs": 0, "seconds": r["median"]["step"]}
          for r in run["step"]["decode"] if r["measured"] and r["dtype"] == "bfloat16"]
points += [{term: r[term] for term in (*ch08.COST_TERMS, "seconds")} for r in run["step"]["mixed"]]
cpu = ch08.fit_step_cost(points)


def alone(request, cost):
    """One request served by itself: its prompt whole, then one token a step."""
    tokens = request.output - 1
    cached = tokens * request.prompt + tokens * (tokens + 1) // 2
    return layers * (cost.seconds(request.prompt, 0, ch08.chunk_pairs(0, request.prompt))
                     + cost.seconds(tokens, cached, 0) + (tokens - 1) * cost.fixed)


def first_token_delay(cost):
    """Median first token with chunks of 256 over that with whole prompts, at the chapter's load of 70 %."""
    trace = ch08.request_trace(400, seed=0)
    slow = ch08.request_trace(400, seed=0, rate=0.7 / statistics.mean(alone(r, cost) for r in trace))
    whole, chunked = (ch08.serve_trace(slow, cost, chunk=c, layers=layers) for c in (None, 256))
    return statistics.median(chunked.first_token) / statistics.median(whole.first_token), whole, chunked


h100_delay, whole, chunked = first_token_delay(h100)
cpu_delay = first_token_delay(cpu)[0]
assert h100.fixed / h100.per_row > 256 > cpu.fixed / cpu.per_row, "a chunk of 256 lies below r there, above here"
assert h100_delay > cpu_delay, (h100_delay, cpu_delay)
assert max(whole.gaps) > 10 * max(chunked.gaps)
print("ok ch08", f"first token x{h100_delay:.2f} on the H100's costs, x{cpu_delay:.2f} on this CPU's")
