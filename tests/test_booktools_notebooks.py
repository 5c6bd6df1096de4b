"""Notebook export: each Quarto construct translated with the book's real numbers, and the
reader's notebooks `make notebooks` gives: executed, with values and outputs, no Quarto syntax,
and a first cell that installs longctx outside the repository."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from booktools.book import BookError, load_book, repo_url
from booktools.notebooks import export_notebooks, finish_book, setup_cell_source, translate_inline
from booktools.numbering import book_numbering, compute_numbering
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
FIXTURE_BOOK = REPO / "tests" / "fixtures" / "book"
FIXTURE_URL = "https://github.com/example/fixture-book"


def export_book(book, out: Path) -> tuple[list[Path], list[str]]:
    """Write the unexecuted export of each listed file into `out`: (paths, problems)."""
    exported, problems = export_notebooks(book)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{Path(info.display).stem}.ipynb" for info, _ in exported]
    for path, (_, notebook) in zip(paths, exported, strict=True):
        path.write_text(nbformat.writes(notebook) + "\n", encoding="utf-8")
    return paths, problems


def render_with_quarto(root: Path) -> None:
    """Quarto executes and renders the (fixture) book at `root`, its executed notebooks to _build/executed/."""
    from booktools.quarto import build_quarto_book, find_quarto
    from conftest import skip_or_fail

    if find_quarto() is None:
        skip_or_fail("`quarto` is not on PATH")
    build_quarto_book(root, root / "_book", node_modules=REPO / "web" / "node_modules", quiet=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, nbformat.NotebookNode]:
    """The fixture book's export, made once: the tests that take it only read it."""
    paths, problems = export_book(load_book(FIXTURE_BOOK), tmp_path_factory.mktemp("exported"))
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
    assert exported["ch01-alpha"].metadata.longctx == {"source": "chapters/ch01-alpha.qmd"}
    assert markdown(exported["appendix-extra"]).startswith("# Appendix A: ")  # numbered as Quarto numbers it
    assert markdown(exported["index"]).startswith("# ") and not markdown(exported["index"]).startswith("# 1")


def test_export_is_byte_identical(exported, tmp_path):
    again, _ = export_book(load_book(FIXTURE_BOOK), tmp_path)
    assert [nbformat.writes(notebook) + "\n" for notebook in exported.values()] == [path.read_text() for path in again]


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


#: (notebook, text its markdown holds): each Quarto construct as the book prints it.
READS = [
    pytest.param("ch01-alpha", "See Section 1.1,\nFigure 1.1, Table 1.1 and Equation 1.1.", id="cross-references"),
    pytest.param("ch02-beta", "Builds on Chapter 1 and Figure 1.1", id="reference-to-another-chapter"),
    pytest.param("appendix-extra", "See Section A.1 and Table 2.1.", id="appendix-numbers"),
    pytest.param("index", "Read Chapter 1 first.", id="reference-from-the-preface"),
    pytest.param("ch01-alpha", "`# @save` and `a @fig-ch01-curve`", id="code-spans-left-alone"),
    # the Quarto edition's citation style: up to three authors named, a locator's "p." dropped
    pytest.param("ch01-alpha", "Attention (Vaswani, Shazeer, and Parmar 2017) scores pairs; Su and Lu (2021) rotate them.",
                 id="citations"),
    pytest.param("ch01-alpha", "Both matter (Vaswani, Shazeer, and Parmar 2017; Su and Lu 2021).", id="two-citations"),
    pytest.param("ch02-beta", "(see Xiao 2024, 3)", id="citation-with-locator"),
    pytest.param("ch01-alpha", "$$\nP(n) = \\frac{n(n+1)}{2} \\tag{1.1}\n$$", id="equation-tag"),
    pytest.param("ch01-alpha", "**Table 1.1:** Pairs by length", id="pipe-table-caption"),
    pytest.param("ch01-alpha", "```mermaid\ngraph LR\n  A --> B\n```", id="mermaid-stays-fenced"),
    pytest.param("ch01-alpha", "```python\n# shown, not run\nx = 1\n```", id="shown-code"),
    pytest.param("ch01-alpha", "Four tokens give `{python} label` pairs.", id="inline-value-left-for-quarto"),
]


@pytest.mark.parametrize(("name", "text"), READS)
def test_each_construct_reads_as_the_book_prints_it(exported, name, text):
    assert text in markdown(exported[name])
    assert not [mark for mark in ("{#eq-", "{#tbl-", "%%|") if mark in markdown(exported[name])]  # no Quarto syntax


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


def test_python_cells_keep_options_and_carry_metadata(exported):
    cells = [cell for cell in exported["ch01-alpha"].cells if cell.cell_type == "code"]
    assert [cell.metadata.longctx.line for cell in cells] == [17, 29, 60, 69]
    figure = cells[-1]
    assert figure.source.startswith("#| label: fig-ch01-curve\n#| fig-cap: \"How do pairs grow with n?\"\n")
    assert figure.metadata.longctx == {
        "source": "chapters/ch01-alpha.qmd",
        "line": 69,
        "kind": "figure",
        "label": "fig-ch01-curve",
    }
    notebook = exported["ch01-alpha"]
    index = notebook.cells.index(figure)
    caption = notebook.cells[index + 1]
    assert caption.cell_type == "markdown"
    assert caption.source == "**Figure 1.1:** How do pairs grow with n?"


def test_table_cell_caption_comes_first(exported):
    cells = exported["ch02-beta"].cells
    table = next(cell for cell in cells if cell.cell_type == "code" and cell.metadata.longctx.get("kind") == "table")
    before = cells[cells.index(table) - 1]
    assert before.source == "**Table 2.1:** Quads"
    assert table.metadata.longctx.label == "tbl-ch02-quads"


def test_callouts_become_titled_blocks_split_around_code(exported):
    cells = exported["ch01-alpha"].cells
    callout_cells = [
        cell for cell in cells if cell.source.startswith("<div") or cell.metadata.get("longctx", {}).get("collapsed")
    ]
    assert [cell.cell_type for cell in callout_cells] == ["markdown", "markdown", "code", "markdown"]
    note = callout_cells[0].source
    assert note == (
        '<div class="callout callout-note">\n<p class="callout-title">Landscape 2026</p>\n\n'
        "Models grow; see Figure 1.1.\n\n</div>"
    )
    solution = callout_cells[1]
    assert solution.source.startswith('<div class="callout callout-tip callout-collapse">\n')
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


def test_markdown_is_split_at_headings(exported):
    cells = [cell for cell in exported["ch01-alpha"].cells if cell.cell_type == "markdown"]
    starts = [cell.source.splitlines()[0] for cell in cells if cell.source.startswith("#")]
    assert starts == ["# 1 Alpha", "## 1.1 Counting pairs", "### 1.1.1 A detail", "## Notes", "## 1.2 The curve"]


def test_mermaid_keeps_its_caption_and_alt_text(fixture_book, tmp_path):
    chapter = fixture_book / "chapters" / "ch01-alpha.qmd"
    chapter.write_text(
        chapter.read_text().replace(
            '%%| fig-cap: "A flow"',
            '%%| label: fig-ch01-flow\n%%| fig-cap: "Where does A go?"\n%%| fig-alt: "Box A points at box B."',
        )
    )
    paths, problems = export_book(load_book(fixture_book), tmp_path / "notebooks")
    assert problems == []
    text = markdown(nbformat.read(paths[1], as_version=4))
    # Quarto numbers the diagram before the curve: Figure 1.1, the curve 1.2.
    assert (
        "```mermaid\ngraph LR\n  A --> B\n```\n\n**Figure 1.1:** Where does A go?\n\n"
        "*The diagram in words:* Box A points at box B." in text
    )
    assert "**Figure 1.2:** How do pairs grow with n?" in text
    assert "%%|" not in text


# ---------------------------------------------------------------------------
# the reader's notebooks


def _with_repo_url(root: Path, url: str = FIXTURE_URL) -> None:
    config = root / "_quarto.yml"
    config.write_text(config.read_text().replace("book:\n", f"book:\n  repo-url: {url}\n", 1))


@pytest.fixture(scope="module")
def reader_book(tmp_path_factory) -> tuple[Path, dict[str, nbformat.NotebookNode]]:
    """The fixture book, its figure cell drawing and printing, executed by Quarto and finished once."""
    from conftest import FIXTURE_BOOK

    root = tmp_path_factory.mktemp("reader") / "book"
    shutil.copytree(FIXTURE_BOOK, root, ignore=shutil.ignore_patterns("notebooks", "_build", "__pycache__"))
    _with_repo_url(root)
    chapter = root / "chapters" / "ch01-alpha.qmd"
    chapter.write_text(
        chapter.read_text().replace(
            "values = [pairs(n) for n in range(5)]\n",
            "import matplotlib.pyplot as plt\n\nvalues = [pairs(n) for n in range(5)]\n"
            'print("largest:", values[-1])\nplt.plot(values)\nplt.show()\n',
        )
    )
    book = load_book(root)
    render_with_quarto(root)
    paths, problems = finish_book(book, root / "_build" / "executed", root / "notebooks")
    assert problems == []
    return root, {path.stem: nbformat.read(path, as_version=4) for path in paths}


QUARTO_SYNTAX = re.compile(r"\{python\}|@(?:fig|sec|eq|tbl)-|:::|\{#|\{\.|^#\|", re.MULTILINE)


def quarto_syntax(notebook) -> list[str]:
    """Every piece of Quarto syntax a reader would see, outside code spans of the prose."""
    found = []
    for cell in notebook.cells:
        text = cell.source
        if cell.cell_type == "markdown":
            text = re.sub(r"`[^`\n]*`", "", text)
        elif cell.metadata.get("longctx", {}).get("role") != "setup":
            found += [line for line in text.splitlines() if line.startswith("#|")]
            continue
        found += [match.group(0) for match in QUARTO_SYNTAX.finditer(text)]
    return found


@pytest.mark.slow
def test_reader_notebooks_show_no_quarto_syntax(reader_book):
    _, notebooks = reader_book
    assert list(notebooks) == ["index", "ch01-alpha", "ch02-beta", "appendix-extra"]
    for name, notebook in notebooks.items():
        nbformat.validate(notebook)
        assert quarto_syntax(notebook) == [], name
    alpha = markdown(notebooks["ch01-alpha"])
    # cross-references, citations, callouts, equations and captions read as the book prints them
    assert "See Section 1.1,\nFigure 1.1, Table 1.1 and Equation 1.1." in alpha
    assert "(Vaswani, Shazeer, and Parmar 2017)" in alpha
    assert '<p class="callout-title">Landscape 2026</p>' in alpha
    assert "\\tag{1.1}" in alpha and "**Table 1.1:** Pairs by length" in alpha


@pytest.mark.slow
def test_reader_notebooks_carry_values_and_outputs(reader_book):
    _, notebooks = reader_book
    alpha = notebooks["ch01-alpha"]
    value_cell = next(cell for cell in alpha.cells if "Four tokens give" in cell.source)
    assert value_cell.source == "Four tokens give 10 pairs."
    assert value_cell.metadata.user_expressions[0]["expression"] == "label"
    figure = next(cell for cell in alpha.cells if cell.metadata.get("longctx", {}).get("label") == "fig-ch01-curve")
    kinds = [output.output_type for output in figure.outputs]
    assert "stream" in kinds and "display_data" in kinds
    assert next(o for o in figure.outputs if o.output_type == "stream").text == "largest: 10\n"  # pairs(4)
    assert any("image/png" in o.get("data", {}) for o in figure.outputs)
    beta = [cell for cell in notebooks["ch02-beta"].cells if cell.cell_type == "code"]
    table = next(cell for cell in beta if cell.metadata.longctx.get("kind") == "table")
    assert table.outputs[0].data["text/markdown"] == "| n | q |\n|---|---|\n| 1 | 1 |"
    code = [cell for notebook in notebooks.values() for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code if cell.metadata.longctx.get("role") != "setup")


@pytest.mark.slow
def test_reader_code_cells_drop_quarto_options_and_fold_as_the_book_does(reader_book):
    _, notebooks = reader_book
    cells = [cell for cell in notebooks["ch01-alpha"].cells if cell.cell_type == "code"][1:]
    figure = cells[-1]
    assert figure.source.startswith("import matplotlib.pyplot as plt\n")
    assert figure.metadata.jupyter.source_hidden is True  # `#| code-fold: true`
    solution = next(cell for cell in cells if cell.metadata.longctx.get("collapsed"))
    assert solution.source == "assert pairs(3) == 6"
    assert solution.metadata.jupyter.source_hidden is True  # a collapsed callout's code
    assert cells[0].source.startswith("# @save\nimport math")
    assert "jupyter" not in cells[0].metadata


@pytest.mark.slow
def test_first_cell_installs_longctx_only_where_needed(reader_book):
    _, notebooks = reader_book
    for name in ("ch01-alpha", "ch02-beta"):
        first = notebooks[name].cells[0]
        assert first.cell_type == "code" and first.id == "longctx-setup"
        assert first.source == setup_cell_source(FIXTURE_URL)
        assert f'REPO_URL = "{FIXTURE_URL}"' in first.source
        assert max(len(line) for line in first.source.splitlines()) <= 80
    # a notebook with no code has nothing to install for
    assert all(cell.cell_type == "markdown" for cell in notebooks["index"].cells)
    assert all(cell.cell_type == "markdown" for cell in notebooks["appendix-extra"].cells)


def _run_setup_cell(monkeypatch, cwd: Path, importable: bool) -> list:
    """Run the first cell's code in `cwd` with pip replaced by a recorder; returns what it ran."""
    ran = []
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "longctx" and not importable:
            return None
        return real_find_spec(name, *args, **kwargs)

    def run(command, **kwargs):
        ran.append((command, kwargs))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "run", run)
    namespace: dict = {}
    exec(compile(setup_cell_source(FIXTURE_URL), "<setup cell>", "exec"), namespace)
    assert namespace["longctx"].__name__ == "longctx"  # the cell ends by importing it
    return ran


def test_setup_cell_does_nothing_inside_the_repository(monkeypatch):
    assert _run_setup_cell(monkeypatch, REPO / "chapters", importable=True) == []
    # the repository's files are enough: `make env` installs longctx there, not pip from the URL
    assert _run_setup_cell(monkeypatch, REPO / "chapters", importable=False) == []


def test_setup_cell_installs_from_the_repository_url_outside(monkeypatch, tmp_path):
    assert _run_setup_cell(monkeypatch, tmp_path, importable=True) == []
    ran = _run_setup_cell(monkeypatch, tmp_path, importable=False)
    assert ran == [
        ([sys.executable, "-m", "pip", "install", "--quiet", f"longctx @ git+{FIXTURE_URL}"], {"check": True})
    ]
    requirement = Requirement(ran[0][0][-1])
    assert (requirement.name, requirement.url) == ("longctx", f"git+{FIXTURE_URL}")


def test_repo_url_comes_from_quarto_yml(fixture_book):
    assert repo_url(load_book(REPO)) == load_book(REPO).config["book"]["repo-url"]
    with pytest.raises(BookError, match=r"_quarto.yml has no book.repo-url: .*first cell installs longctx"):
        repo_url(load_book(fixture_book))
    _with_repo_url(fixture_book, "'not a url; rm -rf'")
    with pytest.raises(BookError, match=r"book.repo-url must be an https://, ssh:// or git:// URL"):
        repo_url(load_book(fixture_book))


def test_cli_without_repo_url_fails_before_writing(fixture_book, booktools):
    code, out, err = booktools(fixture_book, "notebooks")
    assert code == 2
    assert "error: _quarto.yml has no book.repo-url" in err
    assert not (fixture_book / "notebooks").exists()


@pytest.mark.slow
def test_cli_finishes_executed_notebooks_and_reports_stale_ones(fixture_book, booktools):
    _with_repo_url(fixture_book)
    code, out, err = booktools(fixture_book, "notebooks")
    assert code == 1
    assert "chapters/ch02-beta.qmd:0: not executed yet (_build/executed/ch02-beta.ipynb is missing)" in err
    render_with_quarto(fixture_book)
    code, out, err = booktools(fixture_book, "notebooks")
    assert code == 0, err
    assert sorted(path.name for path in (fixture_book / "notebooks").iterdir()) == [
        "appendix-extra.ipynb", "ch01-alpha.ipynb", "ch02-beta.ipynb", "index.ipynb"]
    notebook = nbformat.read(fixture_book / "notebooks" / "ch02-beta.ipynb", as_version=4)
    assert notebook.cells[0].id == "longctx-setup" and quarto_syntax(notebook) == []
    # the chapter changes after it ran: its numbers could be wrong, so nothing is finished
    chapter = fixture_book / "chapters" / "ch02-beta.qmd"
    chapter.write_text(chapter.read_text().replace("| 1 | 1 |", "| 2 | 36 |"))
    code, out, err = booktools(fixture_book, "notebooks")
    assert code == 1
    assert "chapters/ch02-beta.qmd:15: the executed notebook is stale (this cell changed since it ran)" in err


@pytest.mark.slow
def test_real_book_reader_notebooks_open_clean(executed_book, tmp_path):
    """Every notebook `make notebooks` gives: no Quarto syntax, values, outputs, the setup cell."""
    book = load_book(REPO)
    paths, problems = finish_book(book, executed_book, tmp_path)
    assert problems == []
    assert [path.stem for path in paths] == [Path(entry.path).stem for entry in book.entries]
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        assert quarto_syntax(notebook) == [], path.name
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        if not code:
            continue
        assert notebook.cells[0].source == setup_cell_source(book.config["book"]["repo-url"])
        for cell in code[1:]:
            if cell.metadata.longctx.get("kind") == "figure":
                assert any("image/png" in output.get("data", {}) for output in cell.outputs), (path.name, cell.id)
        for cell in notebook.cells:
            if cell.cell_type == "markdown" and "```mermaid" in cell.source:
                assert "*The diagram in words:*" in cell.source and "**Figure " in cell.source
    values = [
        entry
        for path in paths
        for cell in nbformat.read(path, as_version=4).cells
        for entry in cell.metadata.get("user_expressions", [])
    ]
    assert len(values) > 50
