"""Shared fixtures: a copy of the small fixture book, and the real book rendered by Quarto once.

- `fixture_book` (function scope): a fresh copy of tests/fixtures/book/ in a temporary
  folder; tooling tests change it freely.
- `quarto_book` (session scope): the real book executed and rendered by Quarto once (HTML and
  EPUB, `booktools.quarto.build_quarto_book`) into a temporary folder: the pages, and the
  executed notebook Quarto kept of each chapter. A failing cell fails the render, and every test
  that needs it fails with Quarto's message. Where `quarto` is not on PATH those tests skip,
  saying so; in CI (the `CI` environment variable set) they fail instead.
- `executed_book` (session scope): just that folder of executed notebooks (`<stem>.ipynb`).

Every test that executes chapters, renders, builds Chapter 13's C++ kernel (a compiler's processes),
trains a model or runs a benchmark is marked `slow`: `make test-fast` leaves them out.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE_BOOK = Path(__file__).resolve().parent / "fixtures" / "book"


SLOW_FIXTURES = {"executed_book", "quarto_book", "kernel"}  # kernel: tests/test_ch08_kernel.py's build


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the executed or rendered book, or the built kernel, is `slow` even where its file
    forgot to say so."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def skip_or_fail(reason: str) -> None:
    """Skip a test for want of a tool, saying so; in CI (`CI` set, as .ci/run and CI services do) fail instead."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: every tool must be installed)")
    pytest.skip(f"skipped: {reason}")


@pytest.fixture
def fixture_book(tmp_path: Path) -> Path:
    """A writable copy of the fixture book (its own _quarto.yml and references.bib)."""
    root = tmp_path / "book"
    shutil.copytree(FIXTURE_BOOK, root, ignore=shutil.ignore_patterns("notebooks", "code", "_build", "__pycache__"))
    return root


@dataclass
class QuartoBook:
    """The Quarto edition, executed and rendered once per test session."""

    directory: Path  # the rendered _book/ (index.html, chapters/*.html, the .epub, site_libs/)
    executed: Path  # the executed notebooks Quarto kept, <stem>.ipynb
    seconds: float  # wall time of the render, execution included


_QUARTO: dict = {}


@pytest.fixture(scope="session")
def quarto_book(tmp_path_factory: pytest.TempPathFactory) -> QuartoBook:
    """The rendered book; skips (saying why) where Quarto is not installed, and fails so in CI.

    Set LONGCTX_QUARTO_BOOK_DIR to a rendered `_book/` (beside it, `_build/executed/`) to check
    that folder instead.
    """
    from booktools.quarto import build_quarto_book, find_quarto

    override = os.environ.get("LONGCTX_QUARTO_BOOK_DIR")
    if override:
        return QuartoBook(Path(override), Path(override).parent / "_build" / "executed", 0.0)
    if find_quarto() is None:
        skip_or_fail(
            "`quarto` is not on PATH (install it from quarto.org; on our machines .ci/run gets it "
            "from ../shared/quarto-kit/setup.sh)"
        )
    if "error" in _QUARTO:
        pytest.fail(_QUARTO["error"])
    if "book" not in _QUARTO:
        work = tmp_path_factory.mktemp("quarto")
        started = time.perf_counter()
        try:
            build_quarto_book(REPO, work / "_book", executed=work / "executed", stage=work / "stage", quiet=True)
        except Exception as exc:
            _QUARTO["error"] = f"the Quarto render failed: {type(exc).__name__}: {exc}"
            pytest.fail(_QUARTO["error"])
        _QUARTO["book"] = QuartoBook(work / "_book", work / "executed", time.perf_counter() - started)
        artifacts = REPO / "tests" / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "quarto-render-seconds.txt").write_text(f"{_QUARTO['book'].seconds:.1f}\n")
    return _QUARTO["book"]


@pytest.fixture(scope="session")
def executed_book(quarto_book: QuartoBook) -> Path:
    """The folder of the real book's executed notebooks (one `<stem>.ipynb` per chapter with code)."""
    return quarto_book.executed


@pytest.fixture
def booktools(capsys: pytest.CaptureFixture):
    """Run `python -m booktools --root ROOT ARGS...` in-process: (exit code, stdout, stderr)."""
    from booktools.cli import main

    def run(root: Path, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--root", str(root), *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
