"""Shared fixtures: a copy of the small fixture book, and the real book executed once.

- `fixture_book` (function scope): a fresh copy of tests/fixtures/book/ in a temporary
  folder; tooling tests change it freely.
- `book_execution` (session scope): every file the real `_quarto.yml` lists exported and
  executed once, `--jobs 2`, into a temporary folder; gives the folder and each run.
- `executed_book` (session scope): just that folder of executed notebooks (`<stem>.ipynb`).
- `quarto_book` (session scope): the book (HTML and EPUB) rendered by Quarto from those same
  executed notebooks, so no chapter runs twice. The render starts in the background as soon as
  the chapters have run, and the tests that need it wait for it. Where `quarto` is not on PATH
  they skip, saying so; in CI (the `CI` environment variable set) they fail instead.

Every test that executes chapters, renders, trains a model or runs a benchmark is marked `slow`:
`make test-fast` leaves them out.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE_BOOK = Path(__file__).resolve().parent / "fixtures" / "book"


SLOW_FIXTURES = {"book_execution", "executed_book", "quarto_book"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the executed or rendered book is `slow` even where its file forgot to say so."""
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
class BookExecution:
    """The real book, exported and executed once per test session."""

    directory: Path  # the executed notebooks, <stem>.ipynb
    runs: dict  # listed path ("chapters/ch01-attention.qmd") -> execute.ChapterRun
    problems: list  # export problems ("FILE:LINE: message")
    missing: list  # listed files that do not exist yet


@pytest.fixture(scope="session")
def book_execution(tmp_path_factory: pytest.TempPathFactory) -> BookExecution:
    from booktools.book import load_book
    from booktools.execute import execute_book

    book = load_book(REPO)
    work = tmp_path_factory.mktemp("real-book")
    directory = work / "executed"
    missing = [entry.path for entry in book.entries if not (book.root / entry.path).is_file()]
    runs, problems = execute_book(book, directory, jobs=2, timeout=600, notebooks_dir=work / "notebooks")
    if not problems and all(run.error is None for run in runs):
        _start_quarto_render(directory, work / "quarto")
    return BookExecution(directory, {run.source: run for run in runs}, problems, missing)


@dataclass
class QuartoBook:
    """The Quarto edition, rendered once per test session from the executed chapters."""

    directory: Path  # the rendered _book/ (index.html, chapters/*.html, the .epub, site_libs/)
    seconds: float  # wall time of the render (run beside other tests)


_QUARTO: dict = {}


def _start_quarto_render(executed: Path, work: Path) -> None:
    """Render the Quarto edition in a background thread while the other tests run."""
    from booktools.quarto import build_quarto_book, find_quarto

    if find_quarto() is None or os.environ.get("LONGCTX_QUARTO_BOOK_DIR"):
        return

    def render() -> None:
        started = time.perf_counter()
        try:
            build_quarto_book(
                REPO, executed, work / "_book", formats=["html", "epub"], stage=work / "stage", quiet=True
            )
            _QUARTO["book"] = QuartoBook(work / "_book", time.perf_counter() - started)
            artifacts = REPO / "tests" / "artifacts"
            artifacts.mkdir(parents=True, exist_ok=True)
            (artifacts / "quarto-render-seconds.txt").write_text(f"{_QUARTO['book'].seconds:.1f}\n")
        except Exception as exc:  # reported by the fixture, in the tests that need the book
            _QUARTO["error"] = f"{type(exc).__name__}: {exc}"

    _QUARTO["thread"] = threading.Thread(target=render, name="quarto-render", daemon=True)
    _QUARTO["thread"].start()


@pytest.fixture(scope="session")
def quarto_book(request: pytest.FixtureRequest) -> QuartoBook:
    """The rendered book; skips (saying why) where Quarto is not installed, and fails so in CI.

    Set LONGCTX_QUARTO_BOOK_DIR to a rendered `_book/` to check that folder instead.
    """
    from booktools.quarto import find_quarto

    override = os.environ.get("LONGCTX_QUARTO_BOOK_DIR")
    if override:
        return QuartoBook(Path(override), 0.0)

    if find_quarto() is None:
        skip_or_fail(
            "`quarto` is not on PATH (install it from quarto.org or `pip install quarto-cli`; on our "
            "machines .ci/run gets it from ../shared/quarto-kit/setup.sh)"
        )
    book_execution = request.getfixturevalue("book_execution")
    if "thread" not in _QUARTO:
        pytest.fail(f"the chapters did not execute, so Quarto had nothing to render: {book_execution.problems}")
    _QUARTO["thread"].join()
    if "error" in _QUARTO:
        pytest.fail(f"the Quarto render failed: {_QUARTO['error']}")
    return _QUARTO["book"]


@pytest.fixture(scope="session")
def executed_book(book_execution: BookExecution) -> Path:
    """The folder of the real book's executed notebooks (one `<stem>.ipynb` per listed file)."""
    return book_execution.directory


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
