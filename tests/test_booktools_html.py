"""The `html` verb: the source and the executed notebooks -> the notebook edition's pages (fast, no browser).

A small book with every construct the edition renders, "executed" by hand: the real export
writes its notebooks (so cells carry their source lines) and the tests fill in the outputs
and the inline values that `execute` would record.
"""

from __future__ import annotations

import base64
import functools
import re
import struct
import zlib
from pathlib import Path

import nbformat
import pytest
from booktools import html as book_html
from booktools.book import BookError, load_book
from booktools.notebooks import export_book
from bs4 import BeautifulSoup


def tiny_png(width: int = 4, height: int = 3) -> str:
    """A valid grey PNG, base64-encoded as notebooks store images."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return base64.b64encode(png).decode()


QUARTO = """\
project:
  type: book
book:
  title: "A Tiny Book"
  subtitle: "For testing the web edition"
  chapters:
    - index.qmd
    - chapters/ch01-demo.qmd
    - chapters/ch02-more.qmd
  appendices:
    - chapters/appendix-extra.qmd
bibliography: references.bib
"""

REFERENCES = r"""
@string{neurips = "Advances in Neural Information Processing Systems"}
@inproceedings{vaswani2017attention,
  author = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob},
  title = {Attention Is All You Need}, booktitle = neurips, year = {2017}}
@inproceedings{gu2021s4,
  author = {Gu, Albert and Goel, Karan and R{\'e}, Christopher},
  title = {Efficiently Modeling Long Sequences with Structured State Spaces}, year = {2022}}
@article{grattafiori2024llama3, author = {Grattafiori, Aaron and others}, title = {The Llama 3 Herd of Models},
  journal = {arXiv preprint arXiv:2407.21783}, year = {2024}}
@misc{su2021roformer, author = {Su, Jianlin and Lu, Yu}, title = {{RoFormer}}, year = {2021}}
@misc{never2020cited, author = {Nobody, Anne}, title = {Never Cited}, year = {2020}}
"""

INDEX = """\
# Preface {.unnumbered}

Welcome. The book has maths like $x^2$.
"""

CH01 = """\
# Demo chapter {#sec-ch01-demo}

Intro cites [@vaswani2017attention] and @gu2021s4.

## Softmax {#sec-ch01-softmax}

$$
y = e^x
$$ {#eq-ch01-exp}

See @fig-ch01-plot. The value was `{python} value` here.

```{python}
#| label: fig-ch01-plot
#| fig-cap: "How does it *grow*? [@grattafiori2024llama3]"
#| fig-alt: "A grey square."
#| code-fold: true
plot()
```

Then it was `{python} value`.

## Unlabelled section

```{python}
#| label: tbl-ch01-sizes
#| tbl-cap: "Sizes, by @eq-ch01-exp"
table()
```

```{mermaid}
graph LR
  A["one<br/>two"] --> B
```

| x | y |
|---|---|
| 1 | 2 |

: Static sizes {#tbl-ch01-static}

```{python}
#| echo: false
print("shown without its code")
```

## Exercises {#sec-ch01-exercises}

::: {.callout-tip collapse="true" title="Solution 1.1"}
Explained.

```{python}
answer = 42  # see @eq-ch01-exp
```

Done.
:::

::: {.callout-note}
## A note on @sec-ch01-softmax

Noted.
:::

After the callouts.
"""

CH02 = """\
# More {#sec-ch02-more}

## Uses {#sec-ch02-uses}

Back to @sec-ch01-softmax, see [the demo](ch01-demo.qmd) and @sec-ch01-demo,
[Fig. @fig-ch01-plot] and -@tbl-ch01-sizes. With $x$ from @eq-ch01-exp.
Cites [@su2021roformer; @grattafiori2024llama3, p. 7]. Pandoc reads a label and a
bracket after it as one citation: @tbl-ch01-static [see @gu2021s4, p. 2].

## Uses again
"""

APPX = """\
# Extra {#sec-extra}

## Details

Nothing here.
"""

OUTPUTS = {  # the source of a code cell -> the outputs its execution gives
    "plot()": [nbformat.v4.new_output("display_data", data={"image/png": tiny_png(), "text/plain": "<Figure>"})],
    "table()": [
        nbformat.v4.new_output("stream", name="stdout", text="progress 10%"),
        nbformat.v4.new_output("stream", name="stdout", text="\rprogress 100%\ndone\n"),
        nbformat.v4.new_output(
            "execute_result", data={"text/markdown": "| a | b |\n|---|---|\n| 1 | 2 |", "text/plain": "<Md>"}
        ),
    ],
    'print("shown without its code")': [nbformat.v4.new_output("stream", name="stdout", text="shown without its code\n")],
}


def make_fixture_book(tmp_path: Path) -> tuple[Path, Path]:
    """The book and its "executed" notebooks; returns (root, executed)."""
    root = tmp_path / "book"
    (root / "chapters").mkdir(parents=True)
    for name, text in {
        "_quarto.yml": QUARTO,
        "references.bib": REFERENCES,
        "index.qmd": INDEX,
        "chapters/ch01-demo.qmd": CH01,
        "chapters/ch02-more.qmd": CH02,
        "chapters/appendix-extra.qmd": APPX,
    }.items():
        (root / name).write_text(text)
    executed = root / "_build" / "executed"
    paths, problems = export_book(load_book(root), executed)
    assert problems == []
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        for cell in notebook.cells:
            if cell.cell_type == "code":
                code = cell.source.split("\n")[-1]
                cell.outputs = OUTPUTS.get(code, [])
        if path.stem == "ch01-demo":
            record_values(notebook, ["1", "2"])
        nbformat.write(notebook, path)
    return root, executed


def record_values(notebook, values: list[str]) -> None:
    """Record inline values as `execute` does: `user_expressions` on each markdown cell, in order."""
    from booktools.qmd import INLINE_EXPRESSION

    pending = list(values)
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        found = [match.group("expr").strip() for match in INLINE_EXPRESSION.finditer(cell.source)]
        taken, pending = pending[: len(found)], pending[len(found) :]
        cell.metadata["user_expressions"] = [
            {"expression": expression, "result": {"data": {"text/plain": repr(value)}, "metadata": {}, "status": "ok"}}
            for expression, value in zip(found, taken, strict=False)
        ]


def fake_node_modules(tmp_path: Path) -> Path:
    modules = tmp_path / "node_modules"
    for source, _ in book_html.NPM_ASSETS.values():
        (modules / source).parent.mkdir(parents=True, exist_ok=True)
        (modules / source).write_text("/* stand-in */\n")
    return modules


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture book built once for the tests that only read it."""
    tmp_path = tmp_path_factory.mktemp("html")
    root, executed = make_fixture_book(tmp_path)
    out = tmp_path / "_book"
    pages = book_html.build_book(root, executed, out, node_modules=fake_node_modules(tmp_path))
    soups = {page.name: BeautifulSoup(page.read_text(), "html.parser") for page in pages}
    return out, pages, soups


def text_of(tag) -> str:
    return re.sub(r"[ \t\n]+", " ", tag.get_text()).strip()  # a no-break space stays one


def test_one_page_per_listed_file_in_book_order(built):
    out, pages, _ = built
    assert [page.name for page in pages] == [
        "index.html",
        "ch01-demo.html",
        "ch02-more.html",
        "appendix-extra.html",
    ]


def test_every_page_has_title_sidebar_and_chapter_number(built):
    _, _, soups = built
    for name, soup in soups.items():
        assert soup.select_one(".book-title").get_text() == "A Tiny Book"
        entries = [a.get_text(" ", strip=True) for a in soup.select(".sidebar-chapters > li > a")]
        assert entries == ["Preface", "1 Demo chapter", "2 More", "A Extra"], name
    assert soups["ch01-demo.html"].title.get_text().startswith("1\u2002Demo chapter")
    assert soups["appendix-extra.html"].select_one("h1 .chapter-number").get_text() == "A"
    assert soups["ch01-demo.html"].select_one("h1").get("id") == "sec-ch01-demo"


def test_sidebar_lists_the_page_sections_with_their_numbers(built):
    _, _, soups = built
    sections = [
        (a["href"], text_of(a)) for a in soups["ch01-demo.html"].select(".sidebar .current .sidebar-sections a")
    ]
    assert sections == [
        ("#sec-ch01-softmax", "1.1 Softmax"),
        ("#unlabelled-section", "1.2 Unlabelled section"),
        ("#sec-ch01-exercises", "1.3 Exercises"),
        ("#references", "References"),
    ]


def test_previous_and_next_links_follow_book_order(built):
    _, _, soups = built
    nav = soups["ch01-demo.html"].select_one(".page-nav")
    assert nav.select_one("a[rel=prev]")["href"] == "index.html"
    assert nav.select_one("a[rel=next]")["href"] == "ch02-more.html"
    assert soups["index.html"].select_one("a[rel=prev]") is None
    assert soups["appendix-extra.html"].select_one("a[rel=next]") is None


def test_contents_page_links_every_chapter_in_order(built):
    _, _, soups = built
    links = [a["href"] for a in soups["index.html"].select(".contents-list a")]
    assert links == ["ch01-demo.html", "ch02-more.html", "appendix-extra.html"]


def test_headings_are_numbered_with_the_ids_quarto_gives_them(built):
    _, _, soups = built
    soup = soups["ch01-demo.html"]
    assert text_of(soup.find("h2", id="sec-ch01-softmax")) == "1.1 Softmax"
    assert text_of(soup.find("h2", id="unlabelled-section")) == "1.2 Unlabelled section"
    assert [h1.get_text() for h1 in soup.find_all("h1")] == ["1 Demo chapter"]
    assert text_of(soups["appendix-extra.html"].find("h2", id="details")) == "A.1 Details"
    assert text_of(soups["ch02-more.html"].find("h2", id="uses-again")) == "2.2 Uses again"
    # the ids the API reference links to (qmd's section ids) are the ones pandoc gave
    book = load_book(built[0].parent / "book")
    for info in book.numbering.chapters:
        page = soups[f"{Path(info.entry.path).stem}.html"]
        rendered = [tag["id"] for tag in page.select("article h2[id], article h3[id]") if tag["id"] != "references"]
        assert rendered == [ident for heading, ident in info.document.section_ids if heading.level > 1]


def test_figure_has_numbered_caption_alt_and_file(built):
    out, _, soups = built
    figure = soups["ch01-demo.html"].find("figure", id="fig-ch01-plot")
    img = figure.find("img")
    assert img["alt"] == "A grey square."
    assert (out / img["src"]).is_file()
    assert text_of(figure.figcaption) == "Figure\u00a01.1: How does it grow? (Grattafiori et al. 2024)"
    assert figure.figcaption.find("em").get_text() == "grow"  # the caption is markdown


def test_static_and_computed_tables_have_numbered_captions_and_scroll(built):
    _, _, soups = built
    soup = soups["ch01-demo.html"]
    computed = soup.find("table", id="tbl-ch01-sizes")
    assert text_of(computed.caption) == "Table\u00a01.1: Sizes, by Equation\u00a01.1"
    assert computed.caption.find("a")["href"] == "#eq-ch01-exp"
    static = soup.find("table", id="tbl-ch01-static")
    assert text_of(static.caption) == "Table\u00a01.2: Static sizes"
    for table in (computed, static):
        assert "table-scroll" in table.parent["class"]


def test_equation_is_tagged_with_its_number_and_id(built):
    _, _, soups = built
    equation = soups["ch01-demo.html"].find(id="eq-ch01-exp")
    assert equation.select_one(".math.display").get_text() == "\\[\ny = e^x\n\\tag{1.1}\\]"


def test_callouts_collapsed_or_open_with_their_titles(built):
    _, _, soups = built
    callouts = soups["ch01-demo.html"].select(".callout")
    assert [callout.name for callout in callouts] == ["details", "div"]
    solution, note = callouts
    assert not solution.has_attr("open") and text_of(solution.summary) == "Solution 1.1"
    text = solution.get_text()
    assert "Explained." in text and "answer = 42" in text and "Done." in text
    assert "Equation 1.1" in text and "@eq-" not in text  # a label in code reads as its reference
    assert text_of(note.select_one(".callout-title")) == "A note on Section 1.1"  # a heading as title, linked
    assert note.select_one(".callout-title a")["href"] == "#sec-ch01-softmax"
    assert text_of(note.select_one(".callout-body")) == "Noted."


def test_mermaid_source_stays_text(built):
    _, _, soups = built
    pre = soups["ch01-demo.html"].select_one("pre.mermaid")
    assert pre.find(True) is None
    assert 'A["one<br/>two"] --> B' in pre.get_text()


def test_code_folds_hides_and_shows_without_option_lines(built):
    _, _, soups = built
    soup = soups["ch01-demo.html"]
    details = soup.select_one("details.code-fold")
    assert details is not None and not details.has_attr("open")
    assert "plot()" in details.get_text()
    assert "#|" not in soup.get_text()
    assert "shown without its code" in soup.select_one("article").get_text()
    assert 'print("shown' not in soup.select_one("article").get_text()  # echo: false


def test_streams_are_coalesced_keeping_the_last_rewrite(built):
    _, _, soups = built
    text = soups["ch01-demo.html"].select_one("pre.output-stream").get_text()
    assert text == "progress 100%\ndone"


def test_inline_values_are_the_ones_recorded_in_order(built):
    _, _, soups = built
    text = text_of(soups["ch01-demo.html"].select_one("article"))
    assert "The value was 1 here." in text and "Then it was 2." in text


def test_crossrefs_are_links_made_from_labels(built):
    _, _, soups = built
    ch01 = {a.get_text(): a["href"] for a in soups["ch01-demo.html"].select("a.crossref")}
    assert ch01["Figure\u00a01.1"] == "#fig-ch01-plot"
    ch02 = [(a.get_text(), a["href"]) for a in soups["ch02-more.html"].select("a.crossref")]
    assert ch02 == [
        ("Section 1.1", "ch01-demo.html#sec-ch01-softmax"),
        ("Chapter 1", "ch01-demo.html"),
        ("Fig.\u00a01.1", "ch01-demo.html#fig-ch01-plot"),
        ("1.1", "ch01-demo.html#tbl-ch01-sizes"),
        ("Equation\u00a01.1", "ch01-demo.html#eq-ch01-exp"),
        ("Table\u00a01.2", "ch01-demo.html#tbl-ch01-static"),
    ]


def test_citations_and_references_per_chapter(built):
    """No `csl:` in `_quarto.yml`: citeproc's default, Chicago author-date ("et al." from four authors)."""
    _, _, soups = built
    ch01 = soups["ch01-demo.html"]
    assert [text_of(span) for span in ch01.select("span.citation")] == [
        "(Vaswani et al. 2017)",
        "Gu, Goel, and R\u00e9 (2022)",  # three authors are named; the accent of R{\'e} is kept
        "(Grattafiori et al. 2024)",
    ]
    assert [entry["id"] for entry in ch01.select("#refs .csl-entry")] == [
        "ref-grattafiori2024llama3",
        "ref-gu2021s4",
        "ref-vaswani2017attention",
    ]
    assert text_of(ch01.select_one("#ref-vaswani2017attention")).startswith(
        "Vaswani, Ashish, Noam Shazeer, Niki Parmar, and Jakob Uszkoreit. 2017."
    )
    assert "Advances in Neural Information Processing Systems" in text_of(ch01.select_one("#refs"))  # @string
    assert ch01.select_one("span.citation a")["href"] == "#ref-vaswani2017attention"
    ch02 = soups["ch02-more.html"]
    assert [text_of(span) for span in ch02.select("span.citation")] == [
        "(Su and Lu 2021; Grattafiori et al. 2024, 7)",
        "(see Gu, Goel, and R\u00e9 2022, 2)",  # the label became a link, the key stayed a citation
    ]
    assert len(ch02.select("#refs .csl-entry")) == 3
    for name in ("index.html", "appendix-extra.html"):  # nothing cited: no References section
        assert soups[name].select_one("#refs") is None and soups[name].find(id="references") is None


# The book's own style (style/longctx-author-date.csl), which the real `_quarto.yml` names.
BOOK_CSL = Path(__file__).resolve().parents[1] / "style" / "longctx-author-date.csl"


@pytest.fixture(scope="module")
def built_in_book_style(tmp_path_factory):
    """The fixture book with the book's own style named in its `_quarto.yml`: (pages, notebooks)."""
    tmp_path = tmp_path_factory.mktemp("html-book-style")
    root, executed = make_fixture_book(tmp_path)
    (root / "style").mkdir()
    (root / "style" / BOOK_CSL.name).write_bytes(BOOK_CSL.read_bytes())
    (root / "_quarto.yml").write_text(QUARTO + f"csl: style/{BOOK_CSL.name}\n")
    out = tmp_path / "_book"
    book_html.build_book(root, executed, out, node_modules=fake_node_modules(tmp_path))
    pages = {name: BeautifulSoup((out / name).read_text(), "html.parser") for name in ("ch01-demo.html", "ch02-more.html")}
    paths, _ = export_book(load_book(root), tmp_path / "notebooks")
    return pages, [nbformat.read(path, as_version=4) for path in paths]


def test_the_book_style_cites_three_authors_with_et_al_in_both_editions(built_in_book_style):
    """The style `_quarto.yml` names is the one both editions use: first author and "et al." from three."""
    pages, notebooks = built_in_book_style
    ch01, ch02 = pages["ch01-demo.html"], pages["ch02-more.html"]
    assert [text_of(span) for span in ch01.select("span.citation")] == [
        "(Vaswani et al. 2017)",
        "Gu et al. (2022)",  # three authors: Chicago's default would name all three
        "(Grattafiori et al. 2024)",
    ]
    assert [text_of(span) for span in ch02.select("span.citation")] == [
        "(Su and Lu 2021; Grattafiori et al. 2024, 7)",  # two authors are both named; a page needs no "p."
        "(see Gu et al. 2022, 2)",
    ]
    assert "Intro cites (Vaswani et al. 2017) and Gu et al. (2022)." in notebooks[1].cells[0].source
    assert "(Su and Lu 2021; Grattafiori et al. 2024, 7)" in "".join(cell.source for cell in notebooks[2].cells)


def test_the_book_style_lists_every_author_sorted_by_author(built_in_book_style):
    pages, _ = built_in_book_style
    entries = {entry["id"]: text_of(entry) for entry in pages["ch01-demo.html"].select("#refs .csl-entry")}
    assert list(entries) == ["ref-grattafiori2024llama3", "ref-gu2021s4", "ref-vaswani2017attention"]
    assert entries["ref-vaswani2017attention"] == (
        "Vaswani, Ashish, Noam Shazeer, Niki Parmar, and Jakob Uszkoreit. 2017. "
        "\u201cAttention Is All You Need.\u201d In Advances in Neural Information Processing Systems."
    )
    # R{\'e} keeps its accent; `and others` reads "et al."; the arXiv preprint is named as the .bib gives it
    assert entries["ref-gu2021s4"].startswith("Gu, Albert, Karan Goel, and Christopher R\u00e9. 2022. ")
    assert entries["ref-grattafiori2024llama3"] == (
        "Grattafiori, Aaron, et al. 2024. \u201cThe Llama 3 Herd of Models.\u201d arXiv preprint arXiv:2407.21783."
    )
    assert pages["ch01-demo.html"].select_one("#refs .csl-entry em").get_text() == "arXiv preprint arXiv:2407.21783"


def test_notebook_links_become_html(built):
    _, _, soups = built
    hrefs = [a["href"] for a in soups["ch02-more.html"].select("article a")]
    assert "ch01-demo.html" in hrefs
    assert not any(".ipynb" in href or ".qmd" in href for href in hrefs)


def test_internal_links_all_resolve(built):
    out, _, soups = built
    ids = {name: {tag["id"] for tag in soup.find_all(id=True)} for name, soup in soups.items()}
    for name, soup in soups.items():
        for anchor in soup.find_all("a", href=True):
            href = anchor["href"]
            if href.startswith("data:"):
                continue
            path, _, fragment = href.partition("#")
            target = path or name
            assert (out / target).is_file(), (name, href)
            if fragment:
                assert fragment in ids[target], (name, href)


def test_mermaid_and_math_assets_are_local(built):
    out, _, soups = built
    ch01 = soups["ch01-demo.html"]
    assert ch01.select_one("pre.mermaid") is not None
    scripts = [script["src"] for script in ch01.find_all("script", src=True)]
    assert "assets/mathjax/tex-svg-full.js" in scripts and "assets/mermaid/mermaid.min.js" in scripts
    for soup in soups.values():
        for tag in soup.find_all(["script", "link", "img"]):
            url = tag.get("src") or tag.get("href") or ""
            assert not re.match(r"^(https?:)?//", url), url
            if url and not url.startswith("data:"):
                assert (out / url).is_file(), url
    # a page without diagrams does not load Mermaid
    assert "mermaid" not in str(soups["ch02-more.html"].find_all("script"))
    assert not (out / "assets" / "edition.lua").exists()  # the build's own files stay out of the book


def test_no_raw_quarto_syntax_in_text(built):
    _, _, soups = built
    for name, soup in soups.items():
        assert not book_html.RAW_QUARTO.search(soup.get_text()), name


def test_a_stale_executed_notebook_is_named_with_its_cell(tmp_path):
    root, executed = make_fixture_book(tmp_path)
    chapter = root / "chapters" / "ch01-demo.qmd"
    chapter.write_text(chapter.read_text().replace("Intro cites", "A new line.\n\nIntro cites"))
    with pytest.raises(BookError, match=r"^chapters/ch01-demo\.qmd:15: this cell is not in the executed notebook"):
        book_html.build_book(root, executed, tmp_path / "_book", node_modules=fake_node_modules(tmp_path))


def test_an_inline_expression_without_a_recorded_value_is_named(tmp_path):
    root, executed = make_fixture_book(tmp_path)
    path = executed / "ch01-demo.ipynb"
    notebook = nbformat.read(path, as_version=4)
    record_values(notebook, ["1"])
    nbformat.write(notebook, path)
    with pytest.raises(BookError, match=r"^chapters/ch01-demo\.qmd:21: no value was recorded for `\{python\} value`"):
        book_html.build_book(root, executed, tmp_path / "_book", node_modules=fake_node_modules(tmp_path))


def test_missing_assets_name_the_install_command(tmp_path, monkeypatch):
    root, executed = make_fixture_book(tmp_path)
    with pytest.raises(book_html.AssetError, match="npm ci --prefix web"):
        book_html.ensure_node_modules(root, install=False)


def test_main_accepts_a_leading_double_dash(tmp_path, monkeypatch):
    root, executed = make_fixture_book(tmp_path)
    modules = fake_node_modules(tmp_path)
    monkeypatch.setattr(book_html, "ensure_node_modules", lambda root, install=True: modules)
    out = tmp_path / "site"
    code = book_html.main(["--", "--root", str(root), "--executed", str(executed), "--out", str(out)])
    assert code == 0 and (out / "index.html").is_file()


# --- the real book's notebook edition: the same numbers, citations and references as Quarto's ---

REPO = Path(__file__).resolve().parents[1]
REAL_PAGES = [(entry.path, f"{Path(entry.path).stem}.html") for entry in load_book(REPO).entries]


@functools.cache
def _real_book():
    """The real book, parsed once for these tests."""
    return load_book(REPO)


@functools.cache
def _page(edition: Path, name: str) -> BeautifulSoup:
    """A page of the built edition, parsed once (the tests only read it)."""
    return BeautifulSoup((edition / name).read_text(encoding="utf-8"), "html.parser")


def _source_citations(info, keys) -> list[str]:
    """Every citation a chapter's source makes, as written (`[@a; @b, p. 3]`, `@a`), outside code."""
    from booktools import qmd

    texts = [block.text for block in info.document.markdown]
    texts += [str(cell.options.get(name)) for cell in info.document.python_cells for name in ("fig-cap", "tbl-cap")
              if cell.options.get(name)]
    found = []
    for text in texts:
        prose = qmd.CODE_SPAN.sub(" ", text)
        for match in qmd.BRACKET.finditer(prose):
            cited = [item.group("key") for item in map(qmd.BRACKET_ITEM.match, match.group("body").split(";")) if item]
            if cited and all(key in keys for key in cited):
                found.append(match.group(0))
        for match in qmd.REFERENCE.finditer(qmd.BRACKET.sub(" ", prose)):
            if match.group("key") in keys:
                found.append(match.group(0))
    return found


def _citeproc(citations: list[str]) -> BeautifulSoup:
    """Pandoc's citeproc on its own (no filter) for these citations, in the style `_quarto.yml` names."""
    import subprocess

    from booktools.pandoc import pandoc_path

    csl = _real_book().csl
    assert csl == REPO / "style" / "longctx-author-date.csl" and csl.is_file()
    done = subprocess.run(
        [pandoc_path(), "--from=markdown", "--to=html", "--citeproc", f"--bibliography={REPO / 'references.bib'}",
         f"--csl={csl}"],
        input="\n\n".join(citations), capture_output=True, text=True, check=True,
    )
    return BeautifulSoup(done.stdout, "html.parser")


@pytest.mark.slow
@pytest.mark.parametrize(("source", "name"), REAL_PAGES)
def test_real_chapter_cites_and_lists_references_as_citeproc_does(notebook_edition, source, name):
    from collections import Counter

    from booktools.bib import bibliography_keys

    book = _real_book()
    info = next(info for info in book.numbering.chapters if info.entry.path == source)
    citations = _source_citations(info, bibliography_keys(book.bibliography))
    page = _page(notebook_edition, name)
    shown = [text_of(span) for span in page.select("article span.citation")]
    listed = [(entry["id"], text_of(entry)) for entry in page.select("#refs .csl-entry")]
    if not citations:
        assert shown == [] and listed == [] and page.find(id="references") is None
        return
    expected = _citeproc(citations)
    assert Counter(shown) == Counter(text_of(span) for span in expected.select("span.citation"))
    assert listed == [(entry["id"], text_of(entry)) for entry in expected.select("#refs .csl-entry")]
    assert page.select_one("h2#references").find_next_sibling().get("id") == "refs"


@pytest.mark.slow
def test_real_book_many_authors_read_et_al_and_accents_stay(notebook_edition):
    shown = {}
    entries = {}
    for _, name in REAL_PAGES:
        page = _page(notebook_edition, name)
        for span in page.select("article span.citation"):
            shown.setdefault(span["data-cites"], set()).add(text_of(span))
        entries.update((entry["id"], text_of(entry)) for entry in page.select("#refs .csl-entry"))
    assert "(Grattafiori et al. 2024)" in shown["grattafiori2024llama3"]  # author = {Grattafiori, Aaron and others}
    assert "(Vaswani et al. 2017)" in shown["vaswani2017attention"]  # eight authors
    assert shown["gu2021s4"] == {"(Gu et al. 2022)"}  # three authors: the book's style, not Chicago's "Gu, Goel, and Re"
    assert "(Su et al. 2021)" in shown["su2021roformer"]
    assert "(Gu and Dao 2023)" in shown["gu2023mamba"]  # two authors are both named
    # every author is listed, accents kept (R{\'e}, Lebr{\'o}n, {\L}ukasz)
    assert entries["ref-gu2021s4"].startswith("Gu, Albert, Karan Goel, and Christopher R\u00e9. 2022. ")
    assert "Federico Lebr\u00f3n" in entries["ref-ainslie2023gqa"]
    assert "\u0141ukasz Kaiser, and Illia Polosukhin. 2017." in entries["ref-vaswani2017attention"]
    assert not any("others" in text for texts in shown.values() for text in texts)


@pytest.mark.slow
def test_real_book_tells_apart_two_works_that_would_cite_alike(notebook_edition):
    """Chapter 4 cites two 2024 papers whose first author is a Liu: 2024a and 2024b, in text and in its list."""
    page = _page(notebook_edition, "ch04-efficient-architectures.html")
    shown: dict[str, set[str]] = {}
    for span in page.select("article span.citation"):
        shown.setdefault(span["data-cites"], set()).add(text_of(span))
    entries = {entry["id"]: text_of(entry) for entry in page.select("#refs .csl-entry")}
    assert shown["liu2024lost"] == {"(Liu et al. 2024a)"} and shown["liu2024kivi"] == {"(Liu et al. 2024b)"}
    assert entries["ref-liu2024lost"].startswith("Liu, Nelson F., ")
    assert ", and Percy Liang. 2024a." in entries["ref-liu2024lost"]
    assert ", and Xia Hu. 2024b." in entries["ref-liu2024kivi"]
    assert list(entries).index("ref-liu2024lost") < list(entries).index("ref-liu2024kivi")  # Nelson before Zirui


@pytest.mark.slow
@pytest.mark.parametrize(("source", "name"), REAL_PAGES)
def test_real_chapter_shows_the_book_numbering(notebook_edition, source, name):
    """Every label of the chapter is an id on its page with its number; every heading has its number and id."""
    book = _real_book()
    info = next(info for info in book.numbering.chapters if info.entry.path == source)
    page = _page(notebook_edition, name)
    for target in book.numbering.targets.values():
        if target.file != source:
            continue
        element = page.find(id=target.label)
        assert element is not None, target.label
        if target.kind == "figure":
            assert text_of(element.figcaption).startswith(f"Figure\u00a0{target.number}: "), target.label
        elif target.kind == "table":
            caption = element.caption or element.figcaption
            assert text_of(caption).startswith(f"Table\u00a0{target.number}: "), target.label
        elif target.kind == "equation":
            assert element.get_text().endswith(f"\\tag{{{target.number}}}\\]"), target.label
    shown = [
        (tag["id"], number.get_text() if (number := tag.select_one(".header-section-number")) else "")
        for tag in page.select("article h2[id], article h3[id], article h4[id]")
        if tag["id"] != "references"
    ]
    numbers = book.numbering.heading_numbers
    assert shown == [
        (ident, numbers.get((source, heading.line), ""))
        for heading, ident in info.document.section_ids
        if heading.level > 1
    ]
    for link in page.select("article a.crossref"):
        label = link["href"].partition("#")[2] or None
        if label:
            number = book.numbering.targets[label].number
            assert link.get_text().endswith(number), (link, number)


# --- the API reference appendix (generated from the real chapter modules) ---------------------


def test_defining_lines_follow_source_comments(tmp_path):
    from booktools.apiref import defining_lines

    generated = tmp_path / "_generated.py"
    generated.write_text(
        "# header\n\n# chapters/ch09-x.qmd:12\nimport math\n\n\ndef f():\n    pass\n\n"
        "# chapters/ch09-x.qmd:40\n@staticmethod\ndef g():\n    pass\n\nLIMIT: int = 3\n"
    )
    assert defining_lines(generated) == {
        "f": ("chapters/ch09-x.qmd", 12),
        "g": ("chapters/ch09-x.qmd", 40),
        "LIMIT": ("chapters/ch09-x.qmd", 40),
    }


def test_api_reference_lists_every_public_name_with_a_section_link():
    from booktools import qmd
    from booktools.apiref import api_entries, api_reference_markdown
    from longctx import ch01

    entries = [entry for entry in api_entries(REPO) if entry.module == "longctx.ch01"]
    assert [entry.name for entry in entries] == list(ch01.__all__)
    ids = {
        ident for _, ident in book_html.heading_ids(qmd.parse_file(REPO / "chapters" / "ch01-attention.qmd"))
    }
    for entry in entries:
        page, _, fragment = entry.href.partition("#")
        assert page == "ch01-attention.html"
        assert fragment in ids, entry
        assert entry.signature.startswith(entry.name)
    softmax = next(entry for entry in entries if entry.name == "softmax")
    assert softmax.summary and "\n" not in softmax.summary
    text = api_reference_markdown(REPO)
    assert "\nsoftmax(scores" in text  # a signature is a Python code block
    assert not book_html.RAW_QUARTO.search(text)  # @eq- labels became "Equation N" links


def test_cli_passes_options_after_the_html_verb_to_the_builder(monkeypatch):
    """`python -m booktools html --out X` reaches the builder with its options intact."""
    from booktools import cli

    seen = {}
    monkeypatch.setattr(book_html, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main(["--root", "/tmp/book", "html", "--out", "X", "--executed", "E"]) == 0
    assert seen["argv"] == ["--root", "/tmp/book", "--out", "X", "--executed", "E"]


def test_cli_rejects_unknown_options_for_other_verbs(capsys):
    from booktools import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["tangle", "--bogus"])
    assert stop.value.code == 2
    assert "--bogus" in capsys.readouterr().err
