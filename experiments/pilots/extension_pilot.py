"""Chapter 6's training pilot, whose output is extension-pilot.log; not part of make experiment.

python -m experiments.pilots.extension_pilot SEED SHORT_STEPS STEPS KEY_SHARE trains one seed with one
recipe (SHORT_STEPS at 32 bytes, then STEPS at 64) and prints the single- and several-record shares
found at the trained length on the validation trials, and the single-record share at 256 bytes.
"""

from __future__ import annotations

import sys
import time

import torch
from longctx import ch02, ch06

from experiments.common import texts


def main(argv: list[str]) -> None:
    seed, short_steps, steps, share = int(argv[0]), int(argv[1]), int(argv[2]), float(argv[3])
    torch.set_num_threads(1)
    train_text, held_out = texts()
    validation = held_out[: held_out.numel() // 4]
    config = ch02.GPTConfig(vocab_size=256, context_length=64, d_model=64, layers=3, heads=2)
    torch.manual_seed(seed)
    model = ch06.RotaryGPT(config, base=27.0, fused=True)
    clock = time.process_time()

    def found(length: int, keys: int) -> float:
        trials = ch06.key_trials(validation, length=length, depths=(0, 0.25, 0.5, 0.75, 1), trials=16,
                                 seed=2000 + seed, keys=keys)
        return (ch06.key_guesses(model, trials) == trials.values[:, 0]).float().mean().item()

    def train(steps: int, batch: int, length: int, data_seed: int) -> float:
        losses = ch06.train_with_keys(model, train_text, steps=steps, batch_size=batch, length=length,
                                      key_share=share, learning_rate=3e-3, seed=data_seed, max_keys=4)
        return round(sum(losses[-20:]) / 20, 3)

    if short_steps:
        loss = train(short_steps, 64, 32, seed)
        print(seed, "short", round(time.process_time() - clock), "loss", loss, "single64", found(64, 1),
              "multi64", found(64, 4), flush=True)
    loss = train(steps, 32, 64, seed + 10_000)
    print(seed, short_steps, steps, share, "long", round(time.process_time() - clock), "loss", loss,
          "single64", found(64, 1), "multi64", found(64, 4), "single256", found(256, 1), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
