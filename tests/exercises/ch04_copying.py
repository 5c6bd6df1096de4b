"""Chapter 6: the saved selective-copying run loads from anywhere and holds every trial."""
from longctx import support

run, path = support.load_results("copying")
assert run["machine"]["mode"] == "full", path
mixers = {trial["mixer"] for trial in run["trials"]}
assert len(mixers) == 3 and len(run["trials"]) % 3 == 0, mixers
print("ok ch04", sorted(mixers), len(run["trials"]))
