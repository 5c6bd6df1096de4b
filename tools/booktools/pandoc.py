"""Pandoc, the converter Quarto itself runs: where it is and how the build calls it.

The book pins `pypandoc-binary` (requirements.txt), whose wheel carries a pandoc
binary: the same pandoc 3.6.1 that the Quarto kit on our machines runs, so the reader's
notebooks format citations with the citeproc Quarto's pages use.
"""

from __future__ import annotations

import subprocess
from functools import cache

__all__ = ["PandocError", "pandoc_path", "run_pandoc"]


class PandocError(RuntimeError):
    """Pandoc is missing, or it failed (the message carries its own)."""


@cache
def pandoc_path() -> str:
    """The pandoc binary of the pinned `pypandoc-binary` wheel."""
    try:
        import pypandoc
    except ModuleNotFoundError:
        raise PandocError(
            "pandoc is needed and comes with the pinned `pypandoc-binary` package: "
            "run `make env` (or `pip install -r requirements.txt`)"
        ) from None
    try:
        return pypandoc.get_pandoc_path()
    except OSError as exc:
        raise PandocError(f"pypandoc-binary is installed but its pandoc is not found: {exc}") from None


def run_pandoc(arguments: list[str], text: str, *, what: str) -> tuple[str, str]:
    """Run pandoc on `text` (stdin); returns (stdout, stderr).

    Raises:
        PandocError: pandoc exited with an error; the message names `what` it was converting.
    """
    done = subprocess.run(
        [pandoc_path(), *arguments], input=text, capture_output=True, text=True, encoding="utf-8", check=False
    )
    if done.returncode != 0:
        raise PandocError(f"{what}: pandoc failed: {done.stderr.strip()}")
    return done.stdout, done.stderr
