"""The real book: Quarto executes every listed file top to bottom, and the book is consistent.

Quarto runs the chapters once per session, as it renders the book (fixture `quarto_book` in
conftest.py); a failing cell fails that render, as the fixture book's raising cell shows here.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from booktools.book import load_book
from booktools.check import check_book
from booktools.qmd import INLINE_EXPRESSION, parse_file
from booktools.quarto import QuartoError, build_quarto_book, find_quarto
from conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
LISTED = [entry.path for entry in load_book(REPO).entries]


@pytest.mark.slow
@pytest.mark.parametrize("source", LISTED)
def test_chapter_executes_in_quartos_render(executed_book, source):
    if not (REPO / source).is_file():
        pytest.fail(f"{source} is listed in _quarto.yml but not yet written")
    doc = parse_file(REPO / source, source)
    path = executed_book / f"{Path(source).stem}.ipynb"
    if not doc.python_cells:
        assert not path.exists(), f"{source} has no Python cell, yet Quarto ran a kernel for it"
        return
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert len(code) == len(doc.python_cells), f"{source}: Quarto ran {len(code)} cells of {len(doc.python_cells)}"
    for cell, written in zip(code, doc.python_cells, strict=True):
        assert not any(output.get("output_type") == "error" for output in cell.get("outputs", [])), written.line
        crowded = [output["text"] for output in cell.get("outputs", [])
                   if output.get("output_type") == "stream" and "FigureTextWarning" in output.get("text", "")]
        assert not crowded, f"{source}:{written.line}: {written.label}: {crowded}"  # support.style's watch
        if (written.label or "").startswith("fig-"):
            kinds = {key for output in cell.get("outputs", []) for key in output.get("data", {})}
            assert kinds & {"image/png", "image/svg+xml"}, f"{source}:{written.line}: {written.label} drew no image"
    asked = {match.group("expr").strip() for block in doc.markdown for match in INLINE_EXPRESSION.finditer(block.text)}
    given = [entry for cell in notebook.cells for entry in cell.metadata.get("user_expressions", [])]
    assert {entry["expression"] for entry in given} == asked, f"{source}: an inline value Quarto did not evaluate"
    assert all(entry["result"]["status"] == "ok" for entry in given), source


@pytest.mark.slow
def test_a_failing_cell_fails_the_render(fixture_book, tmp_path):
    if find_quarto() is None:
        skip_or_fail("`quarto` is not on PATH")
    chapter = fixture_book / "chapters" / "ch02-beta.qmd"
    chapter.write_text(chapter.read_text() + '\n```{python}\nraise ValueError("the fixture cell fails")\n```\n')
    out = fixture_book / "_book"
    with pytest.raises(QuartoError, match=r"(?s)`quarto render` failed.*the fixture cell fails"):
        build_quarto_book(fixture_book, out, node_modules=REPO / "web" / "node_modules", quiet=True)
    assert not out.exists()


def test_generated_modules_are_current(booktools):
    code, _, err = booktools(REPO, "tangle", "--check", "--quiet")
    assert code == 0, err


def test_book_integrity():
    problems = check_book(load_book(REPO))
    assert problems == [], "\n".join(problems)
