"""What the studies share: the text they train and score on, and the form of a hit record."""

from __future__ import annotations

import pathlib

import torch
from longctx import ch02, ch06

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 2's split of the novel (90 % to train), each part without key symbols."""
    ids = torch.tensor(ch02.ByteTokenizer().encode(ch02.load_corpus()))
    split = int(0.9 * ids.numel())
    return ch06.key_free_text(ids[:split]), ch06.key_free_text(ids[split:])


def bits(hits: torch.Tensor) -> str:
    """A grid of hits (depths, trials) as one string of 0 and 1, depth after depth."""
    return "".join("1" if h else "0" for h in hits.flatten().tolist())
