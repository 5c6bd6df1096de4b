"""The `html` verb: executed notebooks -> the notebook edition's pages (fast, no browser)."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from longctx.booktools import html as book_html


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
"""

INDEX = """\
# Preface {.unnumbered}

Welcome. The book has maths like $x^2$.
"""

CH01 = """\
# Demo chapter {#sec-ch01-demo}

Intro.

## Softmax {#sec-ch01-softmax}

$$
y = e^x
$$ {#eq-ch01-exp}

See @fig-ch01-plot.

```{python}
#| label: fig-ch01-plot
#| fig-cap: "How does it grow?"
#| fig-alt: "A grey square."
#| code-fold: true
plot()
```

## Unlabelled section

```{python}
#| label: tbl-ch01-sizes
#| tbl-cap: "Sizes"
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

## Exercises {#sec-ch01-exercises}

::: {.callout-tip collapse="true" title="Solution 1.1"}
Explained.

```{python}
answer = 42  # see @eq-ch01-exp
```

Done.
:::
"""

CH02 = """\
# More {#sec-ch02-more}

## Uses {#sec-ch02-uses}

Back to @sec-ch01-softmax.
"""

APPX = """\
# Extra {#sec-extra}

## Details
"""


def code_cell(source, outputs, longctx=None):
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = outputs
    if longctx:
        cell.metadata["longctx"] = longctx
    return cell


CALLOUT = {"collapse": True, "id": "callout-1", "title": "Solution 1.1", "type": "tip"}


def callout_md(part, source):
    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["longctx"] = {"callout": CALLOUT | {"part": part}}
    return cell


def caption_md(kind, label, source):
    cell = nbformat.v4.new_markdown_cell(source)
    cell.metadata["longctx"] = {"kind": kind, "label": label, "role": "caption"}
    return cell


def make_fixture_book(tmp_path: Path) -> tuple[Path, Path]:
    """A two-chapter book with one appendix and its 'executed' notebooks; returns (root, executed)."""
    root = tmp_path / "book"
    (root / "chapters").mkdir(parents=True)
    (root / "_quarto.yml").write_text(QUARTO)
    (root / "index.qmd").write_text(INDEX)
    (root / "chapters" / "ch01-demo.qmd").write_text(CH01)
    (root / "chapters" / "ch02-more.qmd").write_text(CH02)
    (root / "chapters" / "appendix-extra.qmd").write_text(APPX)
    executed = root / "_build" / "executed"
    executed.mkdir(parents=True)
    md = nbformat.v4.new_markdown_cell
    out = nbformat.v4.new_output
    index = nbformat.v4.new_notebook(cells=[md("# Preface\n\nWelcome. The book has maths like $x^2$.")])
    ch01 = nbformat.v4.new_notebook(
        cells=[
            md(
                "# 1 Demo chapter\n\nIntro.\n\n## 1.1 Softmax\n\n$$\ny = e^x \\tag{1.1}\n$$\n\nSee Figure 1.1 and Equation 1.1."
            ),
            code_cell(
                '#| label: fig-ch01-plot\n#| fig-cap: "How does it grow?"\n#| fig-alt: "A grey square."\n'
                "#| code-fold: true\nplot()",
                [out("display_data", data={"image/png": tiny_png(), "text/plain": "<Figure>"})],
                {
                    "label": "fig-ch01-plot",
                    "number": "1.1",
                    "caption": "How does it grow?",
                    "alt": "A grey square.",
                },
            ),
            caption_md("figure", "fig-ch01-plot", "**Figure 1.1:** How does it *grow*?"),
            md("## 1.2 Unlabelled section"),
            caption_md("table", "tbl-ch01-sizes", "**Table 1.1:** *Sizes*"),
            code_cell(
                '#| label: tbl-ch01-sizes\n#| tbl-cap: "Sizes"\ntable()',
                [
                    out("stream", name="stdout", text="progress 10%"),
                    out("stream", name="stdout", text="\rprogress 100%\ndone\n"),
                    out(
                        "execute_result",
                        data={"text/markdown": "| a | b |\n|---|---|\n| 1 | 2 |", "text/plain": "<Markdown>"},
                        execution_count=2,
                    ),
                ],
                {"label": "tbl-ch01-sizes", "number": "1.1", "caption": "Sizes"},
            ),
            md(
                '```mermaid\ngraph LR\n  A["one<br/>two"] --> B\n```\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n\n'
                "**Table 1.2:** Static sizes"
            ),
            md("## 1.3 Exercises"),
            callout_md(
                "start",
                '<div class="callout callout-tip callout-collapse">\n<p class="callout-title">Solution 1.1</p>\n\nExplained.\n\n</div>',
            ),
            code_cell("answer = 42  # see @eq-ch01-exp", [], {"callout": CALLOUT | {"part": "code"}}),
            callout_md("continued", '<div class="callout callout-tip callout-continued">\n\nDone.\n\n</div>'),
            md("After the callout."),
        ]
    )
    ch02 = nbformat.v4.new_notebook(
        cells=[
            md(
                "# 2 More\n\n## A heading only the export has\n\n## 2.1 Uses\n\nBack to Section 1.1, see [the demo](ch01-demo.ipynb) and Chapter 1. "
                "With $x$ from Equation 1.1 and $\\text{Figure 1.1}$ untouched."
            )
        ]
    )
    appx = nbformat.v4.new_notebook(cells=[md("# A Extra\n\n## A.1 Details\n\nNothing here.")])
    for name, notebook in (
        ("index", index),
        ("ch01-demo", ch01),
        ("ch02-more", ch02),
        ("appendix-extra", appx),
    ):
        nbformat.write(notebook, executed / f"{name}.ipynb")
    return root, executed


def fake_node_modules(tmp_path: Path) -> Path:
    modules = tmp_path / "node_modules"
    for source, _ in book_html.NPM_ASSETS.values():
        (modules / source).parent.mkdir(parents=True, exist_ok=True)
        (modules / source).write_text("/* stand-in */\n")
    return modules


@pytest.fixture
def built(tmp_path):
    root, executed = make_fixture_book(tmp_path)
    out = tmp_path / "_book"
    pages = book_html.build_book(root, executed, out, node_modules=fake_node_modules(tmp_path))
    soups = {page.name: BeautifulSoup(page.read_text(), "html.parser") for page in pages}
    return out, pages, soups


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


def test_headings_get_quarto_ids(built):
    _, _, soups = built
    assert soups["ch02-more.html"].find("h2", id="sec-ch02-uses") is not None
    assert soups["ch02-more.html"].find("h2", id="a-heading-only-the-export-has") is not None
    soup = soups["ch01-demo.html"]
    assert soup.find("h2", id="sec-ch01-softmax").get_text().startswith("1.1 Softmax")
    assert soup.find("h2", id="unlabelled-section") is not None
    assert [h1.get_text() for h1 in soup.find_all("h1")] == ["1 Demo chapter"]


def test_figure_has_caption_alt_and_file(built):
    out, _, soups = built
    figure = soups["ch01-demo.html"].find("figure", id="fig-ch01-plot")
    img = figure.find("img")
    assert img["alt"] == "A grey square."
    assert (out / img["src"]).is_file()
    assert figure.figcaption.get_text() == "Figure\u00a01.1: How does it grow?"
    assert figure.figcaption.find("em").get_text() == "grow"  # the export's caption cell, rendered


def test_caption_cell_is_not_repeated(built):
    _, _, soups = built
    assert "Figure 1.1:" not in soups["ch01-demo.html"].select_one("article").get_text().replace(
        soups["ch01-demo.html"].find("figcaption").get_text(), ""
    )


def test_static_table_caption_and_id(built):
    _, _, soups = built
    table = soups["ch01-demo.html"].find("table", id="tbl-ch01-static")
    assert table is not None and table.caption.get_text() == "Table\u00a01.2: Static sizes"


def test_callout_split_across_cells_is_one_closed_details(built):
    _, _, soups = built
    callouts = soups["ch01-demo.html"].select(".callout")
    assert len(callouts) == 1
    callout = callouts[0]
    assert callout.name == "details" and not callout.has_attr("open")
    assert callout.summary.get_text() == "Solution 1.1"
    text = callout.get_text()
    assert "Explained." in text and "answer = 42" in text and "Done." in text
    assert "Equation 1.1" in text and "@eq-" not in text  # references in code read as text


def test_mermaid_source_stays_text(built):
    _, _, soups = built
    pre = soups["ch01-demo.html"].select_one("pre.mermaid")
    assert pre.find(True) is None
    assert 'A["one<br/>two"] --> B' in pre.get_text()


def test_folded_code_is_closed_details_without_option_lines(built):
    _, _, soups = built
    soup = soups["ch01-demo.html"]
    details = soup.select_one("details.code-fold")
    assert details is not None and not details.has_attr("open")
    assert "plot()" in details.get_text()
    assert "#|" not in soup.get_text()


def test_computed_table_has_caption_and_scrolls(built):
    _, _, soups = built
    table = soups["ch01-demo.html"].find("table", id="tbl-ch01-sizes")
    assert table.caption.get_text() == "Table\u00a01.1: Sizes"
    assert table.caption.find("em") is not None  # from the export's caption cell, which comes first
    assert "Table 1.1:" not in soups["ch01-demo.html"].select_one("article").get_text().replace(
        table.caption.get_text(), ""
    )
    assert "table-scroll" in table.parent["class"]


def test_progress_output_keeps_last_rewrite(built):
    _, _, soups = built
    text = soups["ch01-demo.html"].select_one("pre.output-stream").get_text()
    assert text == "progress 100%\ndone"


def test_crossrefs_become_links_across_pages(built):
    _, _, soups = built
    ch01 = {a.get_text(): a["href"] for a in soups["ch01-demo.html"].select("a.crossref")}
    assert "Figure 1.1" in ch01
    assert ch01["Figure 1.1"] == "#fig-ch01-plot"
    assert ch01["Equation 1.1"] == "#eq-ch01-exp"
    ch02 = {a.get_text(): a["href"] for a in soups["ch02-more.html"].select("a.crossref")}
    assert ch02["Section 1.1"] == "ch01-demo.html#sec-ch01-softmax"
    assert ch02["Chapter 1"] == "ch01-demo.html"
    assert ch02["Equation 1.1"] == "ch01-demo.html#eq-ch01-exp"  # beside inline maths
    assert "Figure 1.1" not in ch02  # inside maths: left alone


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


def test_no_raw_quarto_syntax_in_text(built):
    _, _, soups = built
    for name, soup in soups.items():
        assert not book_html.RAW_QUARTO.search(soup.get_text()), name


def test_strip_option_lines():
    assert book_html.strip_option_lines("#| echo: true\n#| label: x\n# @save\nx = 1\n") == "# @save\nx = 1"


@pytest.mark.parametrize(
    ("text", "slug"),
    [("The KV cache", "the-kv-cache"), ("3 ways: `softmax` & more", "ways-softmax-more"), ("1.2", "section")],
)
def test_pandoc_slug(text, slug):
    assert book_html.pandoc_slug(text) == slug


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


# --- the API reference appendix (generated from the real chapter modules) ---------------------

REPO = Path(__file__).resolve().parents[1]


def test_defining_lines_follow_source_comments(tmp_path):
    from longctx.booktools.apiref import defining_lines

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
    from longctx import ch01
    from longctx.booktools import qmd
    from longctx.booktools.apiref import api_entries, api_reference_markdown

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
    """`python -m longctx.booktools html --out X` reaches the builder with its options intact."""
    from longctx.booktools import cli

    seen = {}
    monkeypatch.setattr(book_html, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    assert cli.main(["--root", "/tmp/book", "html", "--out", "X", "--executed", "E"]) == 0
    assert seen["argv"] == ["--root", "/tmp/book", "--out", "X", "--executed", "E"]


def test_cli_rejects_unknown_options_for_other_verbs(capsys):
    from longctx.booktools import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["tangle", "--bogus"])
    assert stop.value.code == 2
    assert "--bogus" in capsys.readouterr().err
