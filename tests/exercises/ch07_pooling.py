"""Exercise 12.2: SnapKV on the chapter's twelve-entry case, with and without pooling."""
from longctx import ch07

toy = ch07.toy_seen()
unpooled = set(ch07.keep_snap(toy, 6, window=3, pool=1)[0, 0].tolist())
pooled = set(ch07.keep_snap(toy, 6, window=3, pool=5)[0, 0].tolist())
assert {9, 10, 11} <= unpooled & pooled and unpooled != pooled, (unpooled, pooled)
print("ok ch07", sorted(unpooled), sorted(pooled))
