"""Execution: inline `{python}` substitution, and failures that name the chapter file and line.

Kernel runs are few and tiny (three kernels in all).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from longctx.booktools.execute import _HELPER, _HELPER_SOURCE, _substitute, kernel_env
from longctx.booktools.qmd import INLINE_EXPRESSION


def test_inline_values_are_formatted_as_quarto_does():
    from IPython.display import Markdown

    namespace: dict = {}
    exec(_HELPER_SOURCE, namespace)
    show = namespace[_HELPER]
    assert show("64.0 GiB") == "64.0 GiB"  # a str renders without quotes
    assert show(Markdown("**bold**")) == "**bold**"
    assert show(42) == "42"
    assert show(0.5) == "0.5"
    assert show([1, 2]) == "[1, 2]"


def test_inline_pattern_and_substitution_in_order():
    text = "A `{python} a` and `{python} f\"{b:.1f}\"` but not `python a` or ```{python}```."
    assert [match.group("expr") for match in INLINE_EXPRESSION.finditer(text)] == ["a", 'f"{b:.1f}"']
    assert _substitute(text, ["1", "2.0"]) == "A 1 and 2.0 but not `python a` or ```{python}```."


def test_kernel_environment_shows_figures_inline():
    env = kernel_env(jobs=2)
    assert env["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"
    assert int(env["OMP_NUM_THREADS"]) >= 1


def test_execute_substitutes_inline_expressions_at_their_position(fixture_book, booktools, tmp_path):
    chapter = fixture_book / "chapters" / "ch01-alpha.qmd"
    text = chapter.read_text()
    # A later cell changes `label`: the prose above it must still show the earlier value.
    text = text.replace("### A detail", "```{python}\nlabel = 'changed'\n```\n\nNow `{python} label`.\n\n### A detail")
    chapter.write_text(text)
    out = tmp_path / "executed"
    code, stdout, stderr = booktools(fixture_book, "execute", "chapters/ch01-alpha.qmd", "--out", str(out))
    assert code == 0, stderr
    assert "chapters/ch01-alpha.qmd: ok in" in stdout
    notebook = nbformat.read(out / "ch01-alpha.ipynb", as_version=4)
    prose = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    assert "Four tokens give 10 pairs." in prose
    assert "Now changed." in prose
    assert "{python}" not in prose
    # every value in the order it was evaluated: the notebook edition reads them from here
    assert notebook.metadata.longctx.inline == [["label", "10"], ["label", "changed"]]
    figure = next(cell for cell in notebook.cells if cell.metadata.get("longctx", {}).get("label") == "fig-ch01-curve")
    assert figure.metadata.longctx.number == "1.1" and figure.metadata.longctx.alt == "A rising curve."
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")


def test_failures_name_chapter_file_and_line(fixture_book, booktools, tmp_path):
    chapters = fixture_book / "chapters"
    (chapters / "ch01-alpha.qmd").write_text(
        "# Alpha\n\nText.\n\n```{python}\nx = 1\n```\n\n```{python}\n#| echo: false\ny = x + undefined_name\n```\n"
    )
    (chapters / "ch02-beta.qmd").write_text("# Beta\n\n```{python}\nz = 2\n```\n\nValue: `{python} z / 0`.\n")
    out = tmp_path / "executed"
    out.mkdir()
    (out / "ch01-alpha.ipynb").write_text("stale")
    code, stdout, stderr = booktools(
        fixture_book, "execute", "chapters/ch01-alpha.qmd", "chapters/ch02-beta.qmd", "--out", str(out)
    )
    assert code == 1
    assert "chapters/ch01-alpha.qmd: FAILED" in stdout
    assert "chapters/ch01-alpha.qmd:9: cell failed:" in stderr
    assert "NameError: name 'undefined_name' is not defined" in stderr
    assert "chapters/ch02-beta.qmd:7: inline expression `{python} z / 0` failed: ZeroDivisionError" in stderr
    assert not (out / "ch01-alpha.ipynb").exists()  # no stale notebook survives a failure
    assert not Path(out / "ch02-beta.ipynb").exists()
