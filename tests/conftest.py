"""Shared fixtures: a copy of the small fixture book, and the real book executed once.

- `fixture_book` (function scope): a fresh copy of tests/fixtures/book/ in a temporary
  folder; tooling tests change it freely.
- `book_execution` (session scope): every file the real `_quarto.yml` lists exported and
  executed once, `--jobs 2`, into a temporary folder; gives the folder and each run.
- `executed_book` (session scope): just that folder of executed notebooks
  (`<stem>.ipynb`), for tests that build the notebook edition from it.
- `notebook_edition` (session scope): the real book's notebook edition, built once from
  them into a temporary `_book/`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURE_BOOK = Path(__file__).resolve().parent / "fixtures" / "book"


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
    from longctx.booktools.book import load_book
    from longctx.booktools.execute import execute_book

    book = load_book(REPO)
    work = tmp_path_factory.mktemp("real-book")
    directory = work / "executed"
    missing = [entry.path for entry in book.entries if not (book.root / entry.path).is_file()]
    runs, problems = execute_book(book, directory, jobs=2, timeout=600, notebooks_dir=work / "notebooks")
    return BookExecution(directory, {run.source: run for run in runs}, problems, missing)


@pytest.fixture(scope="session")
def executed_book(book_execution: BookExecution) -> Path:
    """The folder of the real book's executed notebooks (one `<stem>.ipynb` per listed file)."""
    return book_execution.directory


@pytest.fixture(scope="session")
def notebook_edition(executed_book: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real book's notebook edition (`_book/`), built once per session."""
    from longctx.booktools.html import build_book

    out = tmp_path_factory.mktemp("notebook-edition") / "_book"
    build_book(REPO, executed_book, out)
    return out


@pytest.fixture
def booktools(capsys: pytest.CaptureFixture):
    """Run `python -m longctx.booktools --root ROOT ARGS...` in-process: (exit code, stdout, stderr)."""
    from longctx.booktools.cli import main

    def run(root: Path, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--root", str(root), *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run
