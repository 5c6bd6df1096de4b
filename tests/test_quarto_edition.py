"""The Quarto edition: executed and rendered by Quarto from a staged copy, checked by EPUBCheck.

The first tests need nothing but Python: the staged project, the finishing step that makes every
page load only what the book ships, the browser lookup, the API appendix's signatures. The rest
read the edition that the `quarto_book` fixture (tests/conftest.py) executes and renders once
per session (all marked `slow`); where Quarto or EPUBCheck is not installed they skip, saying so,
and in CI (`CI` set) they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import nbformat
import pytest
from booktools import quarto
from booktools.apiref import api_entries, api_reference_markdown, wrap_signatures
from booktools.book import load_book
from booktools.numbering import compute_numbering
from booktools.qmd import CROSSREF_PREFIXES, parse_file
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
EPUBCHECK = Path("/usr/share/java/epubcheck.jar")


# --- staging: the book laid out for Quarto, away from the source tree -------------------------


def test_the_stage_copies_what_quarto_writes_beside_and_links_the_rest(fixture_book, tmp_path):
    (fixture_book / "data").mkdir()
    (fixture_book / "data" / "x.json").write_text("{}")
    (fixture_book / "_freeze").mkdir()  # an old freeze is never thawed
    (fixture_book / "chapters" / "ch01-alpha.quarto_ipynb").write_text("{}")  # an interrupted render's
    stage = tmp_path / "stage"
    quarto.stage_project(fixture_book, stage)
    for name in ("_quarto.yml", "index.qmd", "chapters/ch01-alpha.qmd", "chapters/appendix-extra.qmd"):
        assert (stage / name).is_file() and not (stage / name).is_symlink(), name
        assert (stage / name).read_text() == (fixture_book / name).read_text()
    assert (stage / "data").is_symlink() and (stage / "data" / "x.json").read_text() == "{}"
    assert (stage / "references.bib").is_symlink()
    assert not (stage / "_freeze").exists() and not list(stage.rglob("*.quarto_ipynb"))
    beta = fixture_book / "chapters" / "ch02-beta.qmd"
    folded = "#| label: tbl-ch02-quads\n#| tbl-cap: >-\n#|   Quads by\n#|   length\n"
    beta.write_text(beta.read_text().replace('#| label: tbl-ch02-quads\n#| tbl-cap: "Quads"\n', folded))
    assert folded in beta.read_text()
    quarto.stage_project(fixture_book, stage)
    staged = (stage / "chapters" / "ch02-beta.qmd").read_text()
    # Quarto would print a folded table caption's div as text: the stage gives it one line
    assert '#| label: tbl-ch02-quads\n#| tbl-cap: "Quads by length"\n#|\n#|\n' in staged
    assert staged.count("\n") == beta.read_text().count("\n")  # Quarto's line numbers are the chapter's
    quarto.stage_project(fixture_book, stage)  # a second stage replaces the first
    assert sorted(path.name for path in stage.iterdir()) == [
        "_quarto.yml", "chapters", "data", "index.qmd", "references.bib"]


def _fake_node_modules(root: Path) -> Path:
    modules = root / "node_modules"
    mathjax = modules / "mathjax"
    (mathjax / "es5" / "output" / "chtml" / "fonts" / "woff-v2").mkdir(parents=True)
    (mathjax / "es5" / "tex-chtml-full.js").write_text("// mathjax")
    (mathjax / "es5" / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Main-Regular.woff").write_bytes(b"w")
    (mathjax / "LICENSE").write_text("Apache-2.0")
    fonts = modules / "@fontsource" / "source-sans-pro"
    (fonts / "files").mkdir(parents=True)
    for weight in quarto.FONT_WEIGHTS:
        number, _, italic = weight.partition("-")
        style = italic or "normal"
        rules = []
        for subset in ("cyrillic", *quarto.FONT_SUBSETS):
            name = f"source-sans-pro-{subset}-{number}-{style}"
            (fonts / "files" / f"{name}.woff2").write_bytes(b"f")
            rules.append(
                f"/* {name} */\n@font-face {{\n  font-family: 'Source Sans Pro';\n  font-weight: {number};\n"
                f"  src: url(./files/{name}.woff2) format('woff2'), url(./files/{name}.woff) format('woff');\n"
                "  unicode-range: U+0000-00FF;\n}"
            )
        (fonts / f"{weight}.css").write_text("\n\n".join(rules))
    return modules


PAGE = """<html><head>
  <script src="https://cdnjs.cloudflare.com/polyfill/v3/polyfill.min.js?features=es6"></script>
  <script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml-full.js" type="text/javascript"></script>
</head><body>{body}</body></html>"""


def test_finishing_makes_every_page_load_only_what_the_book_ships(tmp_path):
    out = tmp_path / "_book"
    (out / "chapters").mkdir(parents=True)
    (out / "index.html").write_text(PAGE.format(body='<p id="top"><a href="#eq-ch01-x">Eq</a></p>'))
    chapter = out / "chapters" / "ch01-a.html"
    chapter.write_text(
        PAGE.format(
            body='<span id="eq-ch01-x"></span><a href="#top">top</a><a href="#nowhere">x</a>'
            '<a href="https://github.com/o/r/blob/main/chapters/ch01-a.ipynb">source</a>'
            '<a href="https://github.com/o/r/edit/main/chapters/ch01-a.ipynb#L1">edit</a>'
        )
    )
    changed = quarto.finish_html(out, _fake_node_modules(tmp_path))
    assert set(changed) == {out / "index.html", chapter}
    index, text = (out / "index.html").read_text(), chapter.read_text()
    for page in (index, text):
        assert "cdn" not in page and "polyfill" not in page and "googleapis" not in page
    assert 'src="site_libs/mathjax/tex-chtml-full.js"' in index
    assert 'src="../site_libs/mathjax/tex-chtml-full.js"' in text
    assert '<link href="../site_libs/fonts/source-sans-pro.css" rel="stylesheet">' in text
    assert 'href="chapters/ch01-a.html#eq-ch01-x"' in index  # a fragment on another page
    assert 'href="../index.html#top"' in text and 'href="#nowhere"' in text  # unknown ids stay
    assert (out / "site_libs" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2" / "MathJax_Main-Regular.woff").is_file()
    css = (out / "site_libs" / "fonts" / "source-sans-pro.css").read_text()
    assert css.count("@font-face") == len(quarto.FONT_WEIGHTS) * len(quarto.FONT_SUBSETS)
    assert "cyrillic" not in css and ".woff)" not in css
    assert "src: url(source-sans-pro-greek-700-italic.woff2) format('woff2');" in css
    assert quarto.finish_html(out, _fake_node_modules(tmp_path / "again")) == []


def test_a_mathjax_file_the_book_does_not_ship_is_an_error(tmp_path):
    out = tmp_path / "_book"
    out.mkdir()
    (out / "index.html").write_text(PAGE.replace("tex-chtml-full.js", "tex-mml-svg.js").format(body=""))
    with pytest.raises(quarto.QuartoError, match="tex-mml-svg.js, which the book does not ship"):
        quarto.finish_html(out, _fake_node_modules(tmp_path))


def test_debian_chromium_is_found_for_quarto(tmp_path, monkeypatch):
    browser = tmp_path / "chrome"
    browser.write_text("")
    monkeypatch.setenv("QUARTO_CHROMIUM", str(browser))
    assert quarto.find_chromium() == str(browser)
    monkeypatch.setenv("QUARTO_CHROMIUM", str(tmp_path / "gone"))  # a browser that is gone is no browser
    for found, expected in (({"chromium": "/usr/bin/chromium"}, "/usr/bin/chromium"), ({}, None),
                            ({"google-chrome": "/opt/chrome", "chromium": "/usr/bin/chromium"}, "/opt/chrome")):
        monkeypatch.setattr(shutil, "which", found.get)
        assert quarto.find_chromium() == expected  # Debian's name, else the one Quarto itself would pick


FAKE_QUARTO = """#!/bin/sh
mkdir -p _book
case "$*" in
  *"--to html"*) echo "<html><head></head><body>fixture</body></html>" > _book/index.html ;;
  *) echo x >> epub-tries  # the first EPUB pass hangs, as Quarto's Chromium connection now and then does
     if [ "$(wc -l < epub-tries)" -eq 1 ]; then sleep 120; fi
     printf PK > _book/fixture.epub ;;
esac
"""


def test_a_hung_later_pass_is_killed_and_tried_again(fixture_book, tmp_path, monkeypatch):
    config = fixture_book / "_quarto.yml"
    config.write_text(config.read_text() + "format:\n  html: default\n  epub: default\n")
    fake = tmp_path / "quarto"
    fake.write_text(FAKE_QUARTO)
    fake.chmod(0o755)
    monkeypatch.setattr(quarto, "LATER_FORMAT_SECONDS", 0.5)
    stage, out = tmp_path / "stage", tmp_path / "_book"
    result = quarto.build_quarto_book(fixture_book, out, stage=stage, executed=tmp_path / "executed",
                                      quarto=str(fake), node_modules=_fake_node_modules(tmp_path), quiet=True)
    assert result["formats"] == ["html", "epub"]
    assert (stage / "epub-tries").read_text() == "x\nx\n"  # killed once, then done
    assert (out / "fixture.epub").exists() and (out / "index.html").exists()


def test_no_quarto_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(quarto, "find_quarto", lambda: None)
    with pytest.raises(quarto.QuartoError, match="Quarto is not installed"):
        quarto.build_quarto_book(ROOT, tmp_path / "_book")


# --- the API appendix ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        ("f(a: int) -> int", "f(a: int) -> int"),
        (
            "attend(query: torch.Tensor, key: torch.Tensor, mask: dict[str, tuple[int, int]] | None = None, *, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]",
            "attend(\n    query: torch.Tensor,\n    key: torch.Tensor,\n    mask: dict[str, tuple[int, int]] | None = None,\n"
            "    *,\n    scale: float = 1.0,\n) -> tuple[torch.Tensor, torch.Tensor]",
        ),
        (
            "g(names: str = 'a, b', text: str = \"(x, y)\", extra: list[int] = [1, 2], other_long_name: int = 0)",
            "g(\n    names: str = 'a, b',\n    text: str = \"(x, y)\",\n    extra: list[int] = [1, 2],\n    other_long_name: int = 0,\n)",
        ),
    ],
)
def test_long_signatures_break_one_parameter_per_line(signature, expected):
    assert wrap_signatures([signature]) == [expected]


def test_the_api_appendix_reads_each_chapter_once_fits_the_page_and_links_by_fragment(monkeypatch):
    from booktools import numbering, qmd

    parsed: dict[str, int] = {}
    original = qmd.parse_file

    def counting(path, display=None):
        parsed[str(path)] = parsed.get(str(path), 0) + 1
        return original(path, display)

    monkeypatch.setattr(numbering, "parse_file", counting)
    monkeypatch.setattr(qmd, "parse_file", counting)
    text = api_reference_markdown(ROOT)
    assert len(parsed) == len(load_book(ROOT).entries) and set(parsed.values()) == {1}
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) > 50
    assert max(len(line) for block in blocks for line in block.splitlines()) <= 80
    labels = compute_numbering(load_book(ROOT)).targets
    links = re.findall(r"\]\(([^)]*)\)", text)
    assert links and all(link.startswith("#") for link in links), [link for link in links if not link.startswith("#")][:3]
    assert {link[1:] for link in links} <= set(labels)


def test_the_api_appendix_names_the_section_whose_saved_cell_defines_each_name():
    entries = {f"{entry.module}.{entry.name}": entry for entry in api_entries(ROOT)}
    assert (entries["longctx.ch01.causal_mask"].section, entries["longctx.ch01.causal_mask"].fragment) == (
        "Section 1.4 The causal mask", "sec-ch01-causal")
    targets = compute_numbering(load_book(ROOT)).targets
    for key, entry in entries.items():  # each in a section of its own chapter
        assert targets[entry.fragment].file.startswith(f"chapters/{entry.module.removeprefix('longctx.')}-"), key


# --- the rendered edition --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_render_leaves_the_source_tree_as_it_was(quarto_book):
    """Quarto worked in a staging folder: no index.html, .quarto/, _freeze/, *_files/ or .gitignore edit here."""
    for leftover in ("index.html", "index.tex", ".quarto", "_freeze", "chapters/ch01-attention_files"):
        assert not (ROOT / leftover).exists(), leftover
    assert not list(ROOT.glob("chapters/*.quarto_ipynb")) and not list(ROOT.glob("chapters/*.html"))
    assert "/.quarto/" in (ROOT / ".gitignore").read_text().splitlines()  # Quarto would append it otherwise
    assert (quarto_book.directory / "index.html").is_file()


def _pages(book_dir: Path) -> list[Path]:
    return [book_dir / "index.html", *sorted((book_dir / "chapters").glob("*.html"))]


@pytest.mark.slow
def test_every_listed_file_is_a_page_and_the_sidebar_numbers_the_chapters(quarto_book):
    book = load_book(ROOT)
    numbering = compute_numbering(book)
    expected = []
    for info in numbering.chapters:
        page = "index.html" if info.display == "index.qmd" else f"{Path(info.display).with_suffix('.html')}"
        assert (quarto_book.directory / page).is_file(), page
        expected.append(" ".join(part for part in (info.number or "", info.title) if part))
    soup = BeautifulSoup((quarto_book.directory / "index.html").read_text(encoding="utf-8"), "html.parser")
    shown = [
        " ".join(item.get_text(" ", strip=True).split())
        for item in soup.select("#quarto-sidebar .sidebar-item-text")
        if item.find_parent(class_="sidebar-item-section") is None or item.find_parent("ul", class_="collapse")
    ]
    # Pandoc's smart typography curls apostrophes and quotes in titles, as it should
    curled = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"'})
    shown = [text.translate(curled) for text in shown if text != "Appendices"]
    assert shown == expected


def _text(tag) -> str:
    return re.sub(r"[ \t\n]+", " ", tag.get_text()).strip()


@pytest.mark.slow
def test_the_pages_cite_in_the_books_style_and_list_what_they_cite(quarto_book):
    """Citations read as the book's style (style/longctx-author-date.csl) wants, each page lists its References."""
    book = load_book(ROOT)
    assert book.csl == ROOT / "style" / "longctx-author-date.csl"
    cited: dict[str, set[str]] = {}
    for entry in book.entries:
        page = BeautifulSoup((quarto_book.directory / Path(entry.path).with_suffix(".html")).read_text(encoding="utf-8"), "html.parser")
        keys = {key for span in page.select("main span.citation") for key in span["data-cites"].split()}
        listed = {tag["id"].removeprefix("ref-") for tag in page.select("#refs .csl-entry")}
        assert keys <= listed, (entry.path, sorted(keys - listed))
        for span in page.select("main span.citation"):
            cited.setdefault(span["data-cites"], set()).add(_text(span))
    assert cited["gu2021s4"] == {"(Gu et al. 2022)"}  # three authors read "et al."


_EPUBCHECK_LINE = re.compile(
    r"^(?P<severity>FATAL|ERROR|WARNING|INFO|USAGE)\((?P<id>[A-Z]+-\d+)\): (?P<where>.+?)"
    r"(?:\((?P<line>-?\d+),(?P<column>-?\d+)\))?: (?P<message>.*)$"
)


def _epubcheck(epub: Path) -> list[dict]:
    """EPUBCheck's messages, one per location (its JSON report shortens long lists of locations)."""
    if not EPUBCHECK.is_file() or shutil.which("java") is None:
        missing = "EPUBCheck: /usr/share/java/epubcheck.jar or java is missing (apt-get install epubcheck)"
        pytest.fail(missing) if os.environ.get("CI") else pytest.skip(f"skipped: {missing}")
    done = subprocess.run(["java", "-jar", str(EPUBCHECK), str(epub)], capture_output=True, text=True, timeout=600)
    messages = []
    for text in (done.stdout + done.stderr).splitlines():
        match = _EPUBCHECK_LINE.match(text)
        if match:
            where = match.group("where")
            path = where.split(".epub/", 1)[1] if ".epub/" in where else where
            line = int(match.group("line")) if match.group("line") else -1
            column = int(match.group("column")) if match.group("column") else -1
            messages.append({"severity": match.group("severity"), "ID": match.group("id"), "path": path,
                             "line": line, "column": column, "message": match.group("message")})
    assert "Messages:" in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]
    return messages


@pytest.mark.slow
def test_the_epub_passes_epubcheck(quarto_book):
    """No fatal error and no error in the EPUB.

    Warnings are Quarto's and Pandoc's own and allowed: NAV-011 (the nav lists a chapter's sections
    before the chapter's own later anchors, as Pandoc's EPUB writer orders them).
    """
    epub = next(quarto_book.directory.glob("*.epub"))
    assert epub.is_file()
    messages = _epubcheck(epub)
    problems = [
        f"{message['severity']} {message['ID']} {message['path']}:{message['line']}: {message['message']}"
        for message in messages
        if message["severity"] in ("FATAL", "ERROR")
    ]
    assert not problems, "\n".join(problems[:30])


@pytest.mark.slow
def test_the_epub_has_a_language_and_no_links_to_web_pages_of_the_book(quarto_book):
    epub = next(quarto_book.directory.glob("*.epub"))
    with zipfile.ZipFile(epub) as archive:
        opf = next(archive.read(name).decode() for name in archive.namelist() if name.endswith(".opf"))
        assert "<dc:language>en</dc:language>" in opf
        for name in archive.namelist():
            if name.endswith(".xhtml"):
                text = archive.read(name).decode("utf-8", "replace")
                assert not re.search(r'href="(?:\.\./)*(?:chapters/)?(?:ch\d\d|appendix|index)[\w-]*\.html', text), name


def test_a_long_tuple_default_is_wrapped_inside_its_parentheses():
    long = "Settings(steps: int = 600, depths: tuple[float, ...] = (" + ", ".join(f"{i / 8}" for i in range(9))
    long += "), seeds: tuple[int, ...] = (0, 1))"
    [shown] = wrap_signatures([long], width=60)
    assert max(len(line) for line in shown.splitlines()) <= 60
    assert shown.splitlines()[2] == "    depths: tuple[float, ...] = ("
    # the same signature, once the layout's spaces and trailing commas are taken out
    assert re.sub(r",([)\]])", r"\1", "".join(shown.split())) == "".join(long.split())


@pytest.mark.slow
def test_the_three_editions_carry_the_same_reference_citation_and_value(quarto_book, tmp_path):
    """Chapter 3's first figure reference, first citation and first inline value read the same in the
    HTML page, the EPUB and the reader's notebook (which `make notebooks` writes from this render)."""
    from booktools.notebooks import finish_book
    from booktools.qmd import BRACKET, INLINE_EXPRESSION, REFERENCE, inline_text

    book = load_book(ROOT)
    source = "chapters/ch03-long-context.qmd"
    doc = parse_file(ROOT / source, source)
    prose = "\n".join(block.text for block in doc.markdown)
    prose = INLINE_EXPRESSION.sub("", prose)
    label = next(match.group("key") for match in REFERENCE.finditer(prose) if match.group("key").startswith("fig-"))
    reference = compute_numbering(book).targets[label].text
    assert re.fullmatch(r"Figure 3\.\d+", reference)
    cited = next(match.group(0) for match in BRACKET.finditer(prose)
                 if not any(f"@{prefix}" in match.group(0) for prefix in CROSSREF_PREFIXES))
    executed = nbformat.read(quarto_book.executed / "ch03-long-context.ipynb", as_version=4)
    value = next(text for cell in executed.cells for entry in cell.metadata.get("user_expressions", [])
                 if len(text := inline_text(entry["result"])) >= 6)

    assert finish_book(book, quarto_book.executed, tmp_path)[1] == []
    notebook = " ".join(cell.source for cell in nbformat.read(tmp_path / "ch03-long-context.ipynb", as_version=4).cells
                        if cell.cell_type == "markdown")
    page = BeautifulSoup((quarto_book.directory / "chapters" / "ch03-long-context.html").read_text(), "html.parser")
    html = " ".join(page.get_text(" ").replace("\u00a0", " ").split())
    keys = re.findall(r"@([\w:.-]+)", cited)

    def citation(soup: BeautifulSoup) -> str:
        span = next(span for span in soup.select("span.citation") if span["data-cites"].split() == keys)
        return " ".join(span.get_text().replace("\u00a0", " ").split())

    with zipfile.ZipFile(next(quarto_book.directory.glob("*.epub"))) as archive:
        chapter = next(text for name in archive.namelist() if name.endswith(".xhtml")
                       and label in (text := archive.read(name).decode("utf-8")))
    chapter = BeautifulSoup(chapter, "html.parser")
    epub = " ".join(chapter.get_text(" ").replace("\u00a0", " ").split())
    notebook = " ".join(notebook.replace("\u00a0", " ").split())
    citation_text = citation(page)
    assert re.fullmatch(r"\(.+ \d{4}[a-z]?\)", citation_text) and citation(chapter) == citation_text
    assert citation_text in notebook
    for edition, text in (("html", html), ("epub", epub), ("notebook", notebook)):
        assert reference in text, (edition, reference)
        assert value in text, (edition, value)
