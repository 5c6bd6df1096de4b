"""The one .qmd parser: front matter, blocks, cell options, line numbers, divs; BibTeX keys;
an inline value's text, as Quarto prints it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from booktools.bib import bibliography_keys, render_citations
from booktools.book import load_book
from booktools.qmd import QmdError, inline_text, parse, parse_heading, walk


def qmd(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


SAMPLE = qmd(
    """
    ---
    title: "Sample"
    execute:
      echo: false
    ---
    # Sample {#sec-ch09-sample}

    Prose with `{python} value` inline.

    ```{python}
    #| label: fig-ch09-plot
    #| fig-cap: "What grows?"
    #| fig-alt: >-
    #|   A line that rises.
    # @save
    def f():
        return 1
    ```

    ```{mermaid}
    %%| fig-cap: "Flow"
    graph LR
      A --> B
    ```

    ````markdown
    ```{python}
    # @save
    ```
    ````

    ```
    plain
    ```

    ```python
    shown = True
    ```
    """
)


def test_front_matter_is_yaml_and_blocks_keep_file_line_numbers():
    doc = parse(SAMPLE, "chapters/ch09-sample.qmd")
    assert doc.front_matter == {"title": "Sample", "execute": {"echo": False}}
    assert doc.front_matter_lines == 5
    assert doc.blocks[0].lines[0] == "# Sample {#sec-ch09-sample}"
    kinds = [(type(block).__name__, block.line) for block in doc.blocks]
    assert kinds == [
        ("Markdown", 6),
        ("Cell", 10),
        ("Markdown", 19),
        ("Cell", 20),
        ("Markdown", 25),
        ("Cell", 26),
        ("Markdown", 31),
        ("Cell", 32),
        ("Markdown", 35),
        ("Cell", 36),
    ]


def test_python_cell_options_are_parsed_as_yaml_and_save_marker_found():
    doc = parse(SAMPLE, "chapters/ch09-sample.qmd")
    cell = doc.python_cells[0]
    assert cell.is_python and cell.executable and cell.lang == "python"
    assert cell.options == {"label": "fig-ch09-plot", "fig-cap": "What grows?", "fig-alt": "A line that rises."}
    assert cell.label == "fig-ch09-plot"
    assert len(cell.option_lines) == 4
    assert cell.code_line == 15
    assert cell.saved and cell.saved_code_line == 16
    assert cell.saved_code_lines == ["def f():", "    return 1"]


def test_other_fences_are_cells_that_are_not_python():
    doc = parse(SAMPLE, "chapters/ch09-sample.qmd")
    mermaid, outer, plain, shown = doc.cells[1:]
    assert (mermaid.lang, mermaid.executable, mermaid.options) == ("mermaid", True, {"fig-cap": "Flow"})
    assert mermaid.code_lines == ["graph LR", "  A --> B"]
    # A longer fence holds shorter ones as text: the inner ```{python} is not a cell.
    assert outer.fence == "````" and outer.lines == ["```{python}", "# @save", "```"]
    assert (plain.lang, plain.executable, plain.lines) == ("", False, ["plain"])
    assert (shown.lang, shown.executable, shown.is_python) == ("python", False, False)
    assert len(doc.python_cells) == 1


def test_unclosed_fence_is_an_error_at_its_opening_line():
    text = "# T\n\n```{python}\nx = 1\n"
    with pytest.raises(QmdError) as caught:
        parse(text, "chapters/ch09-x.qmd")
    assert str(caught.value).startswith("chapters/ch09-x.qmd:3: ")
    assert "never closed" in str(caught.value)


def test_unclosed_front_matter_and_bad_yaml_are_errors_with_lines():
    with pytest.raises(QmdError, match=r"^a\.qmd:1: front matter"):
        parse("---\ntitle: x\n", "a.qmd")
    with pytest.raises(QmdError, match=r"^a\.qmd:4: cell options"):
        parse("# T\n\n```{python}\n#| label: [unclosed\nx = 1\n```\n", "a.qmd")


def test_crlf_and_empty_documents():
    doc = parse("# T\r\n\r\n```{python}\r\nx = 1\r\n```\r\n", "a.qmd")
    assert doc.python_cells[0].code == "x = 1"
    empty = parse("", "a.qmd")
    assert empty.blocks == [] and empty.front_matter == {}


def test_headings_with_attributes():
    heading = parse_heading("## Grouped heads {#sec-ch03-gqa .unnumbered}", 7)
    assert (heading.level, heading.text, heading.label, heading.unnumbered, heading.line) == (
        2,
        "Grouped heads",
        "sec-ch03-gqa",
        True,
        7,
    )
    assert parse_heading("#hashtag not a heading") is None
    assert parse_heading("### Plain").label is None


def test_walk_tracks_callouts_across_cells_and_titles():
    doc = parse(
        qmd(
            """
            # T

            ::: {.callout-tip collapse="true" title="Solution 1.1"}
            Text.

            ```{python}
            x = 1
            ```
            :::

            ::: {.callout-warning}
            $$
            # not a heading
            $$
            :::
            """
        ),
        "a.qmd",
    )
    items, problems = walk(doc)
    assert problems == []
    cell_item = next(item for item in items if item.kind == "cell")
    assert cell_item.cell.code == "x = 1"
    assert [div.callout_type for div in cell_item.divs] == ["tip"]
    assert cell_item.divs[0].collapse and cell_item.divs[0].display_title == "Solution 1.1"
    assert items[-1].div.display_title == "Warning"  # a callout without a title is named by its kind
    maths = [item for item in items if getattr(item, "in_math", False)]
    assert [item.text for item in maths] == ["$$", "# not a heading", "$$"]
    assert all(item.kind == "text" for item in maths)


def test_walk_reports_unclosed_div():
    doc = parse("# T\n\n::: {.callout-note}\nText\n", "a.qmd")
    _, problems = walk(doc)
    assert [str(problem) for problem in problems] == ["a.qmd:3: fenced div opened here (`:::`) is never closed"]


BIBTEX = qmd(
    """
    @string{neurips = "Advances in Neural Information Processing Systems"}
    @inproceedings{a2017, author = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob},
      title = {T}, booktitle = neurips, year = {2017}}
    @misc{b2021,
      author = "Jianlin Su and Yu {Lu}",
      title = "{RoFormer}",
      year = 2021
    }
    @article{c2022, author = {Gu, Albert and Goel, Karan and R{\\'e}, Christopher}, title = {S4}, year = {2022}}
    @article{d2024, author = {Grattafiori, Aaron and others}, title = {Llama 3}, year = {2024}}
    @misc{e2024, author = {{OpenAI}}, title = {Report}, date = {2024-05-01}}
    @misc{a2017, author = {Someone}, year = {1999}}
    """
)


def test_bibliography_keys_lines_and_duplicates(tmp_path):
    bib = tmp_path / "refs.bib"
    bib.write_text(BIBTEX)
    problems = []
    keys = bibliography_keys([bib, tmp_path / "missing.bib"], problems)
    assert keys == {
        "a2017": ("refs.bib", 2),
        "b2021": ("refs.bib", 4),
        "c2022": ("refs.bib", 9),
        "d2024": ("refs.bib", 10),
        "e2024": ("refs.bib", 11),
    }
    assert problems == [
        ("refs.bib", 12, "duplicate key a2017 (first at line 2)"),
        ("missing.bib", 0, "bibliography file does not exist"),
    ]


BOOK_CSL = Path(__file__).resolve().parents[1] / "style" / "longctx-author-date.csl"


def test_the_book_style_cites_first_author_et_al_from_three(tmp_path):
    """style/longctx-author-date.csl: one or two authors are named, three or more read "et al."."""
    bib = tmp_path / "refs.bib"
    bib.write_text(
        BIBTEX.replace("@misc{a2017, author = {Someone}, year = {1999}}", "")
        + qmd(
            """
            @article{f2024, author = {Liu, Nelson and Lin, Kevin and Hewitt, John}, title = {Lost}, year = {2024}}
            @article{g2024, author = {Liu, Zirui and Yuan, Jiayi and Jin, Hongye}, title = {KIVI}, year = {2024}}
            @article{i2022, author = {Su, Jianlin and Lu, Yu}, title = {Again}, year = {2022}}
            @article{h2019, author = {Sch{\\"u}tze, Hinrich and {\\O}stergaard, Pia}, title = {Accents}, year = {2019}}
            """
        )
    )
    cited = [
        "[@a2017]", "@b2021", "[@c2022, p. 3]", "[see @c2022, sec. 2]", "[@b2021; @d2024, 7]",
        "[@d2024; @e2024]", "[-@a2017]", "[@f2024; @g2024]", "[@b2021; @i2022]", "@h2019",
    ]
    assert render_citations(cited, [bib], csl=BOOK_CSL) == [
        "(Vaswani et al. 2017)",
        "Su and Lu (2021)",
        "(Gu et al. 2022, 3)",  # three authors: "et al."; a page number stands alone
        "(see Gu et al. 2022, sec. 2)",  # a prefix, and any other locator keeps its label
        "(Su and Lu 2021; Grattafiori et al. 2024, 7)",
        "(Grattafiori et al. 2024; OpenAI 2024)",
        "(2017)",
        "(Liu et al. 2024a; Liu et al. 2024b)",  # two works that would read alike get a and b
        "(Su and Lu 2021, 2022)",  # works of the same authors share their names
        "Sch\u00fctze and \u00d8stergaard (2019)",  # accents kept
    ]


def test_book_lists_chapters_then_appendices_in_order(fixture_book):
    book = load_book(fixture_book)
    assert [entry.path for entry in book.entries] == [
        "index.qmd",
        "chapters/ch01-alpha.qmd",
        "chapters/ch02-beta.qmd",
        "chapters/appendix-extra.qmd",
    ]
    assert [entry.module for entry in book.entries] == [None, "ch01", "ch02", None]
    assert [entry.appendix for entry in book.entries] == [False, False, False, True]
    assert book.entries[1].line == 7


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
