"""Execution: inline `{python}` substitution, and failures that name the chapter file and line.

Kernel runs are few and tiny (three kernels in all).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from booktools.execute import _substitute, kernel_env
from booktools.qmd import INLINE_EXPRESSION, inline_text


def test_inline_values_are_formatted_as_quarto_does():
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import Markdown

    shell = InteractiveShell.instance()

    def show(value):
        # the mime bundle a kernel returns for a `user_expressions` entry
        data, metadata = shell.display_formatter.format(value)
        return inline_text({"data": data, "metadata": metadata, "status": "ok"})

    assert show("64.0 GiB") == "64.0 GiB"  # a str renders without quotes
    assert show("it's") == "it's"
    assert show(Markdown("**bold**")) == "**bold**"
    assert show(42) == "42"
    assert show(0.5) == "0.5"
    assert show([1, 2]) == "[1, 2]"
    assert show(("a", 1)) == "('a', 1)"  # a literal that is not a str keeps its repr
    assert inline_text({"data": {"text/plain": "<object at 0x1>"}}) == "<object at 0x1>"


def test_inline_pattern_and_substitution_in_order():
    text = "A `{python} a` and `{python} f\"{b:.1f}\"` but not `python a` or ```{python}```."
    assert [match.group("expr") for match in INLINE_EXPRESSION.finditer(text)] == ["a", 'f"{b:.1f}"']
    assert _substitute(text, ["1", "2.0"]) == "A 1 and 2.0 but not `python a` or ```{python}```."


def test_kernel_environment_shows_figures_inline():
    env = kernel_env(jobs=2)
    assert env["MPLBACKEND"] == "module://matplotlib_inline.backend_inline"
    assert int(env["OMP_NUM_THREADS"]) >= 1


@pytest.mark.slow
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
    # each markdown cell keeps its values as Jupyter's user_expressions, in order: Quarto and
    # the notebook edition both read them from there
    recorded = [entry for cell in notebook.cells for entry in cell.metadata.get("user_expressions", [])]
    assert [entry["expression"] for entry in recorded] == ["label", "label"]
    assert [inline_text(entry["result"]) for entry in recorded] == ["10", "changed"]
    assert recorded[0]["result"]["data"]["text/plain"] == "'10'"
    figure = next(cell for cell in notebook.cells if cell.metadata.get("longctx", {}).get("label") == "fig-ch01-curve")
    assert figure.metadata.longctx.kind == "figure"  # the export's metadata survives execution
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.slow
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
