"""Notebook export: each Quarto construct translated with the book's real numbers."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from longctx.booktools.book import load_book
from longctx.booktools.notebooks import export_book, translate_inline
from longctx.booktools.numbering import book_numbering, compute_numbering


@pytest.fixture
def exported(fixture_book: Path, tmp_path: Path) -> dict[str, nbformat.NotebookNode]:
    paths, problems = export_book(load_book(fixture_book), tmp_path / "notebooks")
    assert problems == []
    return {path.stem: nbformat.read(path, as_version=4) for path in paths}


def markdown(notebook) -> str:
    return "\n\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def test_one_valid_v4_notebook_per_listed_file(exported, fixture_book):
    assert list(exported) == ["index", "ch01-alpha", "ch02-beta", "appendix-extra"]
    for notebook in exported.values():
        nbformat.validate(notebook)
        assert notebook.nbformat == 4
        assert notebook.metadata.kernelspec.name == "python3"
    assert exported["ch01-alpha"].metadata.longctx == {
        "source": "chapters/ch01-alpha.qmd",
        "number": "1",
        "title": "Alpha",
        "kind": "chapter",
    }
    assert exported["appendix-extra"].metadata.longctx.number == "A"
    assert exported["index"].metadata.longctx.number is None


def test_export_is_byte_identical(fixture_book, tmp_path):
    book = load_book(fixture_book)
    first, _ = export_book(book, tmp_path / "a")
    second, _ = export_book(book, tmp_path / "b")
    assert [path.read_bytes() for path in first] == [path.read_bytes() for path in second]


def test_numbering_over_the_whole_book(fixture_book):
    targets = book_numbering(fixture_book)
    texts = {label: target.text for label, target in targets.items()}
    assert texts == {
        "sec-index-preface": "Preface",
        "sec-ch01-alpha": "Chapter 1",
        "sec-ch01-cost": "Section 1.1",
        "eq-ch01-pairs": "Equation 1.1",
        "tbl-ch01-sizes": "Table 1.1",
        "fig-ch01-curve": "Figure 1.1",
        "sec-ch02-beta": "Chapter 2",
        "tbl-ch02-quads": "Table 2.1",
        "sec-appendix-extra": "Appendix A",
        "sec-appendix-more": "Section A.1",
    }
    curve = targets["fig-ch01-curve"]
    assert (curve.kind, curve.number, curve.file, curve.title) == (
        "figure",
        "1.1",
        "chapters/ch01-alpha.qmd",
        "How do pairs grow with n?",
    )
    numbering = compute_numbering(load_book(fixture_book))
    assert numbering.duplicates == []


def test_headings_numbered_and_attributes_stripped(exported):
    text = markdown(exported["ch01-alpha"])
    headings = [line for line in text.splitlines() if line.startswith("#") and "not run" not in line]
    assert headings == [
        "# 1 Alpha",
        "## 1.1 Counting pairs",
        "### 1.1.1 A detail",
        "## Notes",
        "## 1.2 The curve",
    ]
    assert markdown(exported["appendix-extra"]).splitlines()[0] == "# Appendix A: Extra"
    assert "## A.1 More" in markdown(exported["appendix-extra"])
    assert markdown(exported["index"]).startswith("# Preface\n")


def test_cross_references_become_numbers_across_chapters(exported):
    alpha = markdown(exported["ch01-alpha"])
    assert "See Section 1.1,\nFigure 1.1, Table 1.1 and Equation 1.1." in alpha
    assert "Builds on Chapter 1 and Figure 1.1" in markdown(exported["ch02-beta"])
    assert "See Section A.1 and Table 2.1." in markdown(exported["appendix-extra"])
    assert "Read Chapter 1 first." in markdown(exported["index"])
    # Code spans are left alone.
    assert "`# @save` and `a @fig-ch01-curve`" in alpha


def test_citations_read_as_citeproc_formats_them(exported):
    """The Quarto edition's style: up to three authors named, a locator's "p." dropped."""
    alpha = markdown(exported["ch01-alpha"])
    assert "Attention (Vaswani, Shazeer, and Parmar 2017) scores pairs; Su and Lu (2021) rotate them." in alpha
    assert "Both matter (Vaswani, Shazeer, and Parmar 2017; Su and Lu 2021)." in alpha
    assert "(see Xiao 2024, 3)" in markdown(exported["ch02-beta"])


def test_translate_inline_forms(fixture_book):
    book = load_book(fixture_book)
    targets = compute_numbering(book).targets
    cited = {"[-@vaswani2017attention]": "(2017)"}

    def cite(source, keys):
        return cited.get(source)

    cases = {
        "[@fig-ch01-curve]": "Figure 1.1",
        "-@fig-ch01-curve": "1.1",
        "[Fig. @fig-ch01-curve]": "Fig. 1.1",
        "[@fig-ch01-curve; @tbl-ch01-sizes]": "Figure 1.1, Table 1.1",
        "(@eq-ch01-pairs)": "(Equation 1.1)",
        "mail me@example.com": "mail me@example.com",
        "@unknown-key stays": "@unknown-key stays",
        "[@fig-ch09-missing]": "[@fig-ch09-missing]",
        "`{python} value` and @sec-ch01-cost.": "`{python} value` and Section 1.1.",
        "[-@vaswani2017attention]": "(2017)",
    }
    for source, expected in cases.items():
        assert translate_inline(source, targets, cite) == expected, source


def test_equation_labels_become_tags(exported):
    assert "$$\nP(n) = \\frac{n(n+1)}{2} \\tag{1.1}\n$$" in markdown(exported["ch01-alpha"])
    assert "{#eq-" not in markdown(exported["ch01-alpha"])


def test_pipe_table_caption_and_mermaid(exported):
    alpha = markdown(exported["ch01-alpha"])
    assert "**Table 1.1:** Pairs by length" in alpha
    assert "{#tbl-" not in alpha
    assert "```mermaid\ngraph LR\n  A --> B\n```" in alpha
    assert "%%|" not in alpha
    assert "```python\n# shown, not run\nx = 1\n```" in alpha


def test_python_cells_keep_options_and_carry_metadata(exported):
    cells = [cell for cell in exported["ch01-alpha"].cells if cell.cell_type == "code"]
    assert [cell.metadata.longctx.line for cell in cells] == [17, 29, 61, 70]
    figure = cells[-1]
    assert figure.source.startswith("#| label: fig-ch01-curve\n#| fig-cap: \"How do pairs grow with n?\"\n")
    assert figure.metadata.longctx == {
        "source": "chapters/ch01-alpha.qmd",
        "line": 70,
        "kind": "figure",
        "label": "fig-ch01-curve",
        "number": "1.1",
        "caption": "How do pairs grow with n?",
        "alt": "A rising curve.",
    }
    notebook = exported["ch01-alpha"]
    index = notebook.cells.index(figure)
    caption = notebook.cells[index + 1]
    assert caption.cell_type == "markdown"
    assert caption.source == "**Figure 1.1:** How do pairs grow with n?"
    assert caption.metadata.longctx == {"role": "caption", "kind": "figure", "label": "fig-ch01-curve"}


def test_table_cell_caption_comes_first(exported):
    cells = exported["ch02-beta"].cells
    table = next(cell for cell in cells if cell.cell_type == "code" and cell.metadata.longctx.get("kind") == "table")
    before = cells[cells.index(table) - 1]
    assert before.source == "**Table 2.1:** Quads"
    assert table.metadata.longctx.number == "2.1" and table.metadata.longctx.caption == "Quads"


def test_callouts_become_titled_blocks_split_around_code(exported):
    cells = exported["ch01-alpha"].cells
    callout_cells = [cell for cell in cells if "callout" in cell.metadata.get("longctx", {})]
    parts = [(cell.cell_type, cell.metadata.longctx.callout.part) for cell in callout_cells]
    assert parts == [("markdown", "start"), ("markdown", "start"), ("code", "code"), ("markdown", "continued")]
    note = callout_cells[0].source
    assert note == (
        '<div class="callout callout-note">\n<p class="callout-title">Landscape 2026</p>\n\n'
        "Models grow; see Figure 1.1.\n\n</div>"
    )
    solution = callout_cells[1]
    assert solution.metadata.longctx.callout == {
        "type": "tip",
        "title": "Solution 1.1",
        "collapse": True,
        "id": "callout-2",
        "part": "start",
    }
    assert '<p class="callout-title">Solution 1.1</p>' in solution.source
    assert "## Solution 1.1" not in markdown(exported["ch01-alpha"])
    assert callout_cells[3].source.startswith('<div class="callout callout-tip callout-continued">')
    assert ":::" not in markdown(exported["ch01-alpha"])


def test_callout_markdown_still_renders_in_nbconvert(exported):
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    note = next(cell for cell in exported["ch01-alpha"].cells if "Landscape" in cell.source)
    rendered = markdown2html_mistune(note.source)
    assert '<div class="callout callout-note">' in rendered
    assert "<p>Models grow; see Figure 1.1.</p>" in rendered


def test_inline_python_is_left_for_execute(exported):
    assert "Four tokens give `{python} label` pairs." in markdown(exported["ch01-alpha"])


def test_markdown_is_split_at_headings(exported):
    cells = [cell for cell in exported["ch01-alpha"].cells if cell.cell_type == "markdown"]
    starts = [cell.source.splitlines()[0] for cell in cells if cell.source.startswith("#")]
    assert starts == ["# 1 Alpha", "## 1.1 Counting pairs", "### 1.1.1 A detail", "## Notes", "## 1.2 The curve"]


def test_cli_writes_notebooks_folder(fixture_book, booktools):
    code, out, err = booktools(fixture_book, "notebooks", "chapters/ch02-beta.qmd")
    assert code == 0, err
    assert sorted(path.name for path in (fixture_book / "notebooks").iterdir()) == ["ch02-beta.ipynb"]
