"""Exercise 14.2: what the page size costs a prefix cache, on the chapter's conversation trace."""
from longctx import ch03, ch08

llama = ch03.KVConfig.from_hf_config(ch03.load_model_config("llama-3.1-8b"))
budget_tokens = 4 * 2**30 // ch03.kv_bytes(llama, 1)  # a 4 GiB pool
chats = ch08.conversation_trace(200, seed=0, max_tokens=4_096)
prompts = sum(len(turn.prompt) for turn in chats)
rates = {}
for size in (1, 16, 64, 256):
    found = ch08.serve_conversations(chats, budget_tokens // size, size)
    rates[size] = sum(hit for _, hit in found) / prompts
assert rates[1] > rates[16] > rates[64] > rates[256], rates
assert rates[1] - rates[256] > 0.05, rates
print("ok ch08", {size: round(rate, 3) for size, rate in rates.items()})
