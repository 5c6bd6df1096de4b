"""Chapter 6's training pilot (see extension-pilot.log): one seed, one training recipe, the single- and
multi-key shares at T_0 on the validation trials. Not part of make experiment."""
import sys, time, torch
from longctx import ch02, ch06
from experiments.common import texts
torch.set_num_threads(1)
seed, short_steps, steps, share = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
tr, ho = texts()
val = ho[: ho.numel() // 4]
cfg = ch02.GPTConfig(vocab_size=256, context_length=64, d_model=64, layers=3, heads=2)
torch.manual_seed(seed); m = ch06.RotaryGPT(cfg, base=27.0, fused=True)
t = time.process_time()
def acc(L, keys):
    b = ch06.key_trials(val, length=L, depths=(0,.25,.5,.75,1), trials=16, seed=2000+seed, keys=keys)
    return (ch06.key_guesses(m, b) == b.values[:, 0]).float().mean().item()
if short_steps:
    l = ch06.train_with_keys(m, tr, steps=short_steps, batch_size=64, length=32, key_share=share, learning_rate=3e-3, seed=seed, max_keys=4)
    print(seed, "short", round(time.process_time()-t), "loss", round(sum(l[-20:])/20, 3), "single64", acc(64, 1), "multi64", acc(64, 4), flush=True)
l = ch06.train_with_keys(m, tr, steps=steps, batch_size=32, length=64, key_share=share, learning_rate=3e-3, seed=seed + 10_000, max_keys=4)
print(seed, short_steps, steps, share, "long", round(time.process_time()-t), "loss", round(sum(l[-20:])/20, 3), "single64", acc(64, 1), "multi64", acc(64, 4), "single256", acc(256,1), flush=True)
