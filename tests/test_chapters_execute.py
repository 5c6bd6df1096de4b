"""The real book: every listed file executes top to bottom as a notebook, and the book is consistent.

The chapters run once per session (fixture `book_execution` in conftest.py, `--jobs 2`).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from booktools.book import load_book
from booktools.check import check_book

REPO = Path(__file__).resolve().parents[1]
LISTED = [entry.path for entry in load_book(REPO).entries]


@pytest.mark.slow
@pytest.mark.parametrize("source", LISTED)
def test_chapter_executes_as_a_notebook(book_execution, source):
    if not (REPO / source).is_file():
        pytest.fail(f"{source} is listed in _quarto.yml but not yet written")
    assert book_execution.problems == []
    run = book_execution.runs.get(source)
    assert run is not None, f"{source} was not executed"
    assert run.error is None, run.error
    notebook = nbformat.read(book_execution.directory / f"{Path(source).stem}.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            assert "`{python}" not in cell.source, f"{source}: an inline expression was not substituted"
        elif cell.cell_type == "code":
            assert not any(output.get("output_type") == "error" for output in cell.get("outputs", []))
            meta = cell.metadata.get("longctx", {})
            if meta.get("kind") == "figure":
                kinds = {key for output in cell.get("outputs", []) for key in output.get("data", {})}
                assert kinds & {"image/png", "image/svg+xml"}, (
                    f"{source}:{meta.get('line')}: figure {meta.get('label')} produced no image"
                )


def test_generated_modules_are_current(booktools):
    code, _, err = booktools(REPO, "tangle", "--check", "--quiet")
    assert code == 0, err


def test_book_integrity():
    problems = check_book(load_book(REPO))
    assert problems == [], "\n".join(problems)
