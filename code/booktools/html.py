"""The notebook edition of the book as web pages: executed notebooks -> `_book/`.

`python -m longctx.booktools html` turns every executed notebook in
`_build/executed/` (one per file that `_quarto.yml` lists, in book order) into one
HTML page inside a single book layout:

- every page has the book's title, a sidebar listing every chapter with its number,
  previous/next links and the chapter number in its `<title>`;
- markdown is rendered with nbconvert's markdown filter (maths left for MathJax);
  headings get the ids Quarto gives them (their `sec-` label, else Pandoc's slug);
- figures become `<figure>` with the caption "Figure 3.2: ..." and the alt text from
  the cell (metadata written by the export, else the cell's `#|` options); computed
  tables get a `<caption>`; every table scrolls sideways when it is too wide;
- code shows without its `#|` option lines; `code-fold: true` cells fold into a
  closed `<details>`; `echo: false` hides code, `output: false` hides output;
- "Figure 3.2", "Section 3.2", "Equation 3.1", "Table 3.1", "Chapter 3" in prose link
  to their targets, on whichever page they are; links to `.qmd`/`.ipynb` become `.html`;
- callouts that the export split across cells (metadata `longctx.callout`) become one
  block again; collapsed ones (the exercise solutions) are a closed `<details>`;
- MathJax (SVG output) and Mermaid are copied from `web/node_modules/` into
  `_book/assets/` and loaded from there: no page loads anything from another host.
  They are npm packages pinned in `web/package-lock.json`; when they are missing the
  build runs `npm ci --prefix web` once (Node.js and npm needed), else says what to run.

Usage: `python -m longctx.booktools html [--executed DIR] [--out DIR]` (through the
booktools CLI, options after `--`: `html -- --out /tmp/site`).

`_book/index.html` is the preface (index.qmd's notebook, or index.qmd's markdown when
there is none) followed by the contents, linking every page in order.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import html
import re
import shutil
import subprocess
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from bs4 import BeautifulSoup, NavigableString
from nbconvert.filters import ansi2html, strip_ansi
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from . import qmd
from .book import Book, BookError, ChapterEntry, find_root, load_book
from .numbering import Numbering, compute_numbering

__all__ = [
    "AssetError",
    "Page",
    "build_book",
    "heading_ids",
    "main",
    "pandoc_slug",
    "plan_pages",
    "render_page",
    "strip_option_lines",
]

HERE = Path(__file__).resolve().parent
STATIC = HERE / "html_assets"

# The browser libraries (npm packages pinned in web/package.json) and the file of each
# that a page loads. Both bundles are self-contained: they fetch nothing else.
NPM_ASSETS = {
    "mathjax": ("mathjax/es5/tex-svg-full.js", "assets/mathjax/tex-svg-full.js"),
    "mermaid": ("mermaid/dist/mermaid.min.js", "assets/mermaid/mermaid.min.js"),
}
NPM_INSTALL = "npm ci --prefix web --no-audit --no-fund"

# Quarto syntax that must never reach a reader (checked after rendering, in prose).
RAW_QUARTO = re.compile(r"@(?:fig|tbl|eq|sec)-|\{#(?:fig|tbl|eq|sec)-|^:::|#\||\{python\}", re.MULTILINE)

_OUTPUT_PRIORITY = (
    "image/svg+xml",
    "image/png",
    "image/jpeg",
    "image/gif",
    "text/markdown",
    "text/html",
    "text/latex",
    "text/plain",
)
_CROSSREF_WORDS = {
    "Figure": "fig",
    "Figures": "fig",
    "Table": "tbl",
    "Tables": "tbl",
    "Equation": "eq",
    "Equations": "eq",
    "Section": "sec",
    "Sections": "sec",
    "Chapter": "chapter",
    "Appendix": "chapter",
}
_CROSSREF = re.compile(
    r"\b(?P<word>Figures?|Tables?|Equations?|Sections?|Chapter|Appendix)(?P<space>\s|&nbsp;|\u00a0)+"
    r"(?P<number>(?:\d+|[A-Z])(?:\.\d+)*)\b"
)
_NUMBER_PREFIX = re.compile(
    r"^\s*(?:(?:Chapter|Appendix)\s+)?(?P<number>(?:\d+|[A-Z])(?:\.\d+)*)[.:]?\s+(?=\S)"
)
_MATH_SPAN = re.compile(r"\$\$.*?\$\$|\\\[.*?\\\]|\\\(.*?\\\)|\$[^$]*\$", re.DOTALL)
_CODE_REFERENCE = re.compile(r"@(?P<label>(?:fig|tbl|eq|sec)-[A-Za-z0-9_-]*[A-Za-z0-9])")
_ATTR_SUFFIX = re.compile(r"\s*\{[^{}]*\}\s*$")


class AssetError(RuntimeError):
    """A browser library the book needs (MathJax, Mermaid) is not installed."""


# ---------------------------------------------------------------------------
# planning: which pages, in which order, with which numbers and titles


@dataclass
class Page:
    """One HTML page of the book."""

    source: str  # the listed file, e.g. "chapters/ch03-long-context.qmd"
    slug: str  # "ch03-long-context"; "index" for the preface
    number: str | None  # "3", "A"; None for unnumbered pages (the preface)
    appendix: bool
    title: str = ""
    notebook: nbformat.NotebookNode | None = None
    document: qmd.Document | None = None
    body: str = ""  # rendered article HTML (without the chapter title)
    headings: list[tuple[int, str, str]] = field(default_factory=list)  # (level, id, text)
    title_id: str = ""
    has_math: bool = False
    has_mermaid: bool = False

    @property
    def href(self) -> str:
        return f"{self.slug}.html"

    @property
    def label(self) -> str:
        """The title with its number, as the sidebar and <title> show it."""
        if self.number is None:
            return self.title
        return f"{self.number}\u2002{self.title}"


def _first_heading(text: str) -> str | None:
    for line in text.splitlines():
        heading = qmd.parse_heading(line)
        if heading is not None and heading.level == 1:
            return heading.text
    return None


def _clean_title(text: str, number: str | None) -> str:
    text = _ATTR_SUFFIX.sub("", text).strip()
    match = _NUMBER_PREFIX.match(text)
    if match is not None:
        found = match.group("number")
        # with no number expected, only a numeral strips ("3.2 Title"), not a word ("A heading")
        if found == number or (
            number is None and (any(ch.isdigit() for ch in found) or text.startswith(("Chapter", "Appendix")))
        ):
            text = text[match.end() :]
    return text.strip()


def plan_pages(book: Book, executed: Path, numbering: Numbering | None = None) -> list[Page]:
    """One page per file `_quarto.yml` lists that has an executed notebook (or is index.qmd).

    Numbers come from the book's numbering (as Quarto numbers): chapters 1, 2, ...;
    index.qmd and `{.unnumbered}` chapters get none; appendices are lettered A, B, ...
    """
    numbering = numbering or compute_numbering(book)
    pages: list[Page] = []
    for info in numbering.chapters:
        entry = info.entry
        stem = Path(entry.path).stem
        is_index = stem == "index" and not entry.appendix
        notebook_path = executed / f"{stem}.ipynb"
        page = Page(source=entry.path, slug=stem, number=info.number, appendix=entry.appendix)
        page.document = info.document
        if notebook_path.is_file():
            page.notebook = nbformat.read(notebook_path, as_version=4)
        elif not is_index:
            if (book.root / entry.path).is_file():
                print(f"html: skipping {entry.path}: no executed notebook {notebook_path}", file=sys.stderr)
            continue
        elif page.document is None:
            continue
        page.title = _page_title(page, entry)
        page.title_id = info.label or ""
        pages.append(page)
    return pages


def _page_title(page: Page, entry: ChapterEntry) -> str:
    found = None
    if page.notebook is not None:
        for cell in page.notebook.cells:
            if cell.cell_type == "markdown":
                found = _first_heading(cell.source)
                if found:
                    break
    if not found and page.document is not None:
        found = page.document.front_matter.get("title")
        if not found:
            for heading in page.document.headings():
                if heading.level == 1:
                    found = heading.text
                    break
    if not found:
        found = "Preface" if page.number is None else Path(entry.path).stem
    return _clean_title(str(found), page.number)


# ---------------------------------------------------------------------------
# small helpers


def pandoc_slug(text: str) -> str:
    """The identifier Pandoc (and so Quarto) gives a heading that has no label."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"[*]", "", text)
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_-. \n\t")
    text = re.sub(r"\s+", "-", text.strip())
    text = re.sub(r"^[^a-z]+", "", text)
    return text or "section"


def strip_option_lines(source: str) -> str:
    """Cell source without its leading `#|` option lines (as readers of the book see it)."""
    lines = source.split("\n")
    index = 0
    while index < len(lines) and lines[index].lstrip().startswith("#|"):
        index += 1
    return "\n".join(lines[index:]).strip("\n")


def _cell_options(cell) -> dict:
    lines = cell.source.split("\n")
    try:
        _, options = qmd.parse_options(lines, "<notebook>", 1)
    except qmd.QmdError:
        options = {}
    meta = cell.get("metadata", {}).get("longctx") or {}
    merged = dict(options)
    for key in ("label", "number", "caption", "alt", "kind"):
        if meta.get(key) not in (None, ""):
            merged[f"longctx-{key}"] = meta[key]
    return merged


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


_MERMAID_FENCE = re.compile(
    r"^(?P<fence>`{3,}|~{3,})[ \t]*\{?mermaid\}?[ \t]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


def markdown_to_html(text: str) -> str:
    """Markdown -> HTML with nbconvert's renderer (maths left for MathJax), Mermaid kept as text.

    nbconvert copies a Mermaid block's source into the page unescaped, so a label such as
    `A<br/>B` would turn into markup; the block is escaped here and Mermaid reads it back.
    """

    def mermaid(match: re.Match) -> str:
        lines = [line for line in match.group("body").split("\n") if not line.lstrip().startswith("%%|")]
        return f'\n<pre class="mermaid">{html.escape(chr(10).join(lines).strip(chr(10)))}\n</pre>\n'

    return markdown2html_mistune(_MERMAID_FENCE.sub(mermaid, text))


def _inline_markdown(text: str) -> str:
    rendered = markdown_to_html(text).strip()
    if rendered.startswith("<p>") and rendered.endswith("</p>") and rendered.count("<p>") == 1:
        rendered = rendered[3:-4]
    return rendered


def _text_of(output_text) -> str:
    return "".join(output_text) if isinstance(output_text, list) else str(output_text)


def _merge_streams(outputs: list) -> list:
    """Consecutive stdout (or stderr) pieces as one, as a terminal shows them (progress bars arrive in pieces)."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            merged[-1] = {
                **previous,
                "text": _text_of(previous.get("text", "")) + _text_of(output.get("text", "")),
            }
        else:
            merged.append(output)
    return merged


def _collapse_carriage_returns(text: str) -> str:
    """Keep what a terminal would show for progress bars that rewrite their line."""
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            parts = [part for part in line.split("\r") if part]
            line = parts[-1] if parts else ""
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# rendering one notebook


class _Renderer:
    def __init__(self, page: Page, out: Path, numbering: Numbering | None = None):
        self.numbering = numbering
        self.page = page
        self.out = out
        self.figure_count = 0
        self.formatter = HtmlFormatter(cssclass="highlight")
        self.caption_cells: dict[str, str] = {}  # label -> the export's caption cell ("**Figure 1.2:** ...")
        self.lexer = PythonLexer()

    def render(self) -> str:
        parts: list[str] = []
        callout: dict | None = None  # the callout being assembled: its metadata and rendered pieces
        cells = self.page.notebook.cells
        # The export writes a figure's caption as a markdown cell after it and a table's before it
        # (metadata role "caption"); the web edition puts that text into the <figcaption>/<caption>.
        code_labels = {
            str((cell.get("metadata", {}).get("longctx") or {}).get("label") or "")
            for cell in cells
            if cell.cell_type == "code"
        }
        skip: set[int] = set()
        for index, cell in enumerate(cells):
            meta = cell.get("metadata", {}).get("longctx") or {}
            if (
                cell.cell_type == "markdown"
                and meta.get("role") == "caption"
                and meta.get("label") in code_labels
            ):
                self.caption_cells[str(meta["label"])] = cell.source
                skip.add(index)
        for index, cell in enumerate(cells):
            if index in skip:
                continue
            meta = cell.get("metadata", {}).get("longctx") or {}
            info = meta.get("callout") if isinstance(meta.get("callout"), dict) else None
            if callout is not None and (info is None or info.get("id") != callout["id"]):
                parts.append(_close_callout(callout))
                callout = None
            if info is not None and callout is None:
                callout = {**info, "pieces": []}
            if cell.cell_type == "markdown":
                piece = markdown_to_html(cell.source)
                if callout is not None:
                    callout["pieces"].append(_callout_inner(piece))
                else:
                    parts.append(f'<div class="cell markdown-cell">{piece}</div>')
            elif cell.cell_type == "code":
                piece = self.code_cell(index, cell)
                if callout is not None:
                    callout["pieces"].append(piece)
                else:
                    parts.append(piece)
            # raw cells are meant for other formats; the web edition leaves them out
        if callout is not None:
            parts.append(_close_callout(callout))
        return "\n".join(part for part in parts if part)

    def references_as_text(self, code: str) -> str:
        """`@eq-ch01-softmax` in a comment or docstring reads "Equation 1.1" in the web edition."""
        if self.numbering is None:
            return code

        def replace(match: re.Match) -> str:
            target = self.numbering.targets.get(match.group("label"))
            return target.text if target is not None else match.group(0)

        return _CODE_REFERENCE.sub(replace, code)

    def code_cell(self, index: int, cell) -> str:
        options = _cell_options(cell)
        if options.get("include") is False:
            return ""
        code = self.references_as_text(strip_option_lines(cell.source))
        blocks = []
        if options.get("echo", True) is not False and code.strip():
            highlighted = highlight(code, self.lexer, self.formatter)
            if _truthy(options.get("code-fold", False)):
                summary = html.escape(str(options.get("code-summary", "Code")))
                blocks.append(
                    f'<details class="code-fold"><summary>{summary}</summary>'
                    f'<div class="cell-input">{highlighted}</div></details>'
                )
            else:
                blocks.append(f'<div class="cell-input">{highlighted}</div>')
        self._figure_id_used = False
        if options.get("output", True) is not False:
            outputs = [
                self.output(index, k, output, options)
                for k, output in enumerate(_merge_streams(cell.get("outputs", [])))
            ]
            outputs = [item for item in outputs if item]
            if outputs:
                blocks.append('<div class="cell-output">' + "\n".join(outputs) + "</div>")
        if not blocks:
            return ""
        return '<div class="cell code-cell">' + "\n".join(blocks) + "</div>"

    def output(self, index: int, k: int, output, options: dict) -> str:
        kind = output.get("output_type")
        if kind == "stream":
            text = _collapse_carriage_returns(strip_ansi(_text_of(output.get("text", ""))))
            if not text.strip():
                return ""
            name = "stderr" if output.get("name") == "stderr" else "stdout"
            return f'<pre class="output-stream {name}">{html.escape(text.rstrip())}</pre>'
        if kind == "error":
            trace = "\n".join(output.get("traceback", []))
            return f'<pre class="output-error">{ansi2html(trace)}</pre>'
        data = output.get("data", {})
        for mime in _OUTPUT_PRIORITY:
            if mime in data:
                return self.data(
                    index, k, mime, data[mime], output.get("metadata", {}).get(mime, {}), options
                )
        return ""

    def data(self, index: int, k: int, mime: str, value, metadata: dict, options: dict) -> str:
        label = str(options.get("longctx-label") or options.get("label") or "")
        if mime.startswith("image/"):
            return self.image(index, k, mime, value, metadata, options, label)
        text = _text_of(value)
        if mime == "text/markdown":
            rendered = markdown_to_html(text)
        elif mime == "text/html":
            rendered = text
        elif mime == "text/latex":
            rendered = f'<div class="output-latex">{html.escape(text)}</div>'
        else:
            rendered = f'<pre class="output-text">{html.escape(strip_ansi(text))}</pre>'
        if label.startswith("tbl-") and "<table" in rendered:
            caption = self.caption(options, "tbl", "Table")
            rendered = rendered.replace("<table", f"<table data-caption-from='{html.escape(label)}'", 1)
            soup = BeautifulSoup(rendered, "html.parser")
            table = soup.find("table")
            if caption:
                tag = soup.new_tag("caption")
                tag.append(BeautifulSoup(caption, "html.parser"))
                table.insert(0, tag)
            del table["data-caption-from"]
            table["id"] = label
            rendered = str(soup)
        return rendered

    def caption(self, options: dict, prefix: str, word: str) -> str:
        """ "Figure 3.2: caption" as HTML: the export's caption cell, else the cell's own caption."""
        label = str(options.get("longctx-label") or options.get("label") or "")
        number = options.get("longctx-number")
        if label in self.caption_cells:
            return _caption_html(self.caption_cells[label], word, number)
        text = options.get("longctx-caption") or options.get(f"{prefix}-cap") or ""
        caption = _inline_markdown(str(text)) if text else ""
        if number:
            caption = (
                f"{word}\u00a0{html.escape(str(number))}: {caption}" if caption else f"{word}\u00a0{number}"
            )
        return caption

    def image(self, index, k, mime, value, metadata, options, label) -> str:
        self.figure_count += 1
        extension = {"image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif"}[
            mime
        ]
        name = f"{self.page.slug}-{index:03d}-{k}.{extension}"
        target = self.out / "figures" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if mime == "image/svg+xml":
            target.write_text(_text_of(value), encoding="utf-8")
        else:
            target.write_bytes(base64.b64decode(_text_of(value)))
        alt = str(options.get("longctx-alt") or options.get("fig-alt") or "").strip()
        is_figure = label.startswith("fig-")
        caption = self.caption(options, "fig", "Figure") if is_figure else ""
        if not alt:
            alt = (
                BeautifulSoup(caption, "html.parser").get_text()
                if caption
                else "A figure drawn by the code above."
            )
        size = ""
        for attr in ("width", "height"):
            if isinstance(metadata.get(attr), int | float):
                size += f' {attr}="{int(metadata[attr])}"'
        img = f'<img src="figures/{name}" alt="{html.escape(alt, quote=True)}"{size} loading="eager">'
        if is_figure:
            ident = "" if self._figure_id_used else f' id="{html.escape(label)}"'
            self._figure_id_used = True
            return f'<figure class="figure"{ident}>{img}<figcaption>{caption}</figcaption></figure>'
        return f'<div class="output-image">{img}</div>'

    _figure_id_used = False


_CAPTION_PREFIX = re.compile(
    r"^\s*(?:\*\*|__)?(?P<word>Figure|Table)\s+(?P<number>[0-9A-Z]+(?:\.\d+)*)\s*:?\s*(?:\*\*|__)?\s*:?\s*"
)


def _caption_html(markdown: str, word: str, number) -> str:
    """The export's caption text ("**Figure 1.2:** Why ...") as "Figure 1.2: Why ..." in HTML."""
    match = _CAPTION_PREFIX.match(markdown)
    if match:
        number = number or match.group("number")
        markdown = markdown[match.end() :]
    body = _inline_markdown(markdown.strip()) if markdown.strip() else ""
    prefix = f"{word}\u00a0{html.escape(str(number))}" if number else ""
    if prefix and body:
        return f"{prefix}: {body}"
    return prefix or body


def _callout_inner(rendered: str) -> str:
    """The content of one piece of a callout the export split across cells (without its wrapper and title)."""
    soup = BeautifulSoup(rendered, "html.parser")
    wrapper = soup.find("div", class_="callout")
    if wrapper is None:
        return rendered
    title = wrapper.find(class_="callout-title")
    if title is not None:
        title.decompose()
    return wrapper.decode_contents()


def _close_callout(callout: dict) -> str:
    kind = re.sub(r"[^a-z-]", "", str(callout.get("type") or "note")) or "note"
    title = html.escape(str(callout.get("title") or kind.capitalize()))
    inner = "\n".join(callout["pieces"])
    if callout.get("collapse"):
        return (
            f'<details class="callout callout-{kind}"><summary class="callout-title">{title}</summary>'
            f'<div class="callout-body">{inner}</div></details>'
        )
    return (
        f'<div class="callout callout-{kind}"><p class="callout-title">{title}</p>'
        f'<div class="callout-body">{inner}</div></div>'
    )


def _static_table_captions(page: Page, soup: BeautifulSoup, numbering: Numbering | None) -> None:
    """A "**Table 1.1:** ..." paragraph right after a table becomes that table's <caption> and id."""
    labels = {}
    if numbering is not None:
        labels = {
            target.number: target.label
            for target in numbering.targets.values()
            if target.kind == "table" and target.file == page.source
        }
    for paragraph in soup.find_all("p"):
        first = paragraph.find(True)
        text = paragraph.get_text()
        match = re.match(r"^\s*Table\s+([0-9A-Z]+(?:\.\d+)*):", text)
        if not match or first is None or first.name not in ("strong", "b"):
            continue
        previous = paragraph.find_previous_sibling(True)
        if previous is None or previous.name != "table" or previous.find("caption") is not None:
            continue
        first.decompose()
        caption = soup.new_tag("caption")
        caption.append(f"Table\u00a0{match.group(1)}: ")
        for position, child in enumerate(list(paragraph.contents)):
            child = child.extract()
            if position == 0 and isinstance(child, NavigableString):
                child = NavigableString(str(child).lstrip(" :"))
            caption.append(child)
        previous.insert(0, caption)
        label = labels.get(match.group(1))
        if label and not previous.get("id"):
            previous["id"] = label
        paragraph.decompose()


def _math_in(text: str) -> bool:
    return bool(re.search(r"\$[^$]+\$|\\\(|\\\[|\\begin\{", text))


def render_page(page: Page, out: Path, numbering: Numbering | None = None) -> None:
    """Render `page.notebook` (or its markdown source) into `page.body` and collect its headings."""
    if page.notebook is not None:
        body = _Renderer(page, out, numbering).render()
    else:
        text = "\n\n".join(block.text for block in page.document.markdown)
        body = f'<div class="cell markdown-cell">{markdown_to_html(text)}</div>'
    soup = BeautifulSoup(body, "html.parser")
    _assign_heading_ids(page, soup)
    _static_table_captions(page, soup, numbering)
    _wrap_tables(soup)
    _fix_mermaid(soup)
    page.has_mermaid = soup.select_one("pre.mermaid") is not None
    page.has_math = _math_in(soup.get_text())
    page.body = str(soup)


def _plain(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def heading_ids(document: qmd.Document) -> list[tuple[qmd.Heading, str]]:
    """Every section heading of a chapter with the id Quarto gives it: its label, else Pandoc's slug.

    Headings that give a callout its title are not sections and are left out. The API
    reference links to these ids, and the notebook edition gives its headings the same ones.
    """
    found: list[tuple[qmd.Heading, str]] = []
    used: set[str] = set()
    items, _ = qmd.walk(document)
    for item in items:
        if getattr(item, "kind", None) != "heading" or item.callout_title or item.in_math:
            continue
        heading = item.heading
        ident = heading.label or pandoc_slug(heading.text)
        base, n = ident, 1
        while ident in used:
            ident = f"{base}-{n}"
            n += 1
        used.add(ident)
        found.append((heading, ident))
    return found


def _assign_heading_ids(page: Page, soup: BeautifulSoup) -> None:
    """Give headings their Quarto ids (label, else slug); drop the page's own title heading."""
    sources = heading_ids(page.document) if page.document is not None else []
    used = {ident for _, ident in sources}
    rendered = [
        tag for tag in soup.find_all(re.compile(r"^h[1-6]$")) if tag.find_parent(class_="cell-output") is None
    ]
    cursor = 0
    page.headings = []
    title_done = False
    for tag in rendered:
        level = int(tag.name[1])
        for anchor in tag.select("a.anchor-link"):
            anchor.decompose()
        text = tag.get_text().strip()
        ident = None
        # Match the rendered heading with the next source heading of the same level: the one
        # whose text is the same among the next few, else simply the next one.
        candidates = [probe for probe in range(cursor, len(sources)) if sources[probe][0].level == level][:4]
        wanted = _plain(_clean_title(text, None))
        chosen = next((probe for probe in candidates if _plain(sources[probe][0].text) == wanted), None)
        if chosen is None and candidates:
            # not the same text (a cross-reference in a heading reads differently once translated):
            # take the next heading when the texts are alike, else this heading is the export's own
            similar = difflib.SequenceMatcher(None, _plain(sources[candidates[0]][0].text), wanted).ratio()
            chosen = candidates[0] if similar >= 0.5 else None
        if chosen is not None:
            ident = sources[chosen][1]
            cursor = chosen + 1
        if ident is None:
            ident = base = pandoc_slug(_clean_title(text, None))
            n = 1
            while ident in used:
                ident = f"{base}-{n}"
                n += 1
            used.add(ident)
        if level == 1 and not title_done:
            title_done = True
            page.title_id = page.title_id or ident
            tag.decompose()
            continue
        tag["id"] = ident
        anchor = soup.new_tag(
            "a", href=f"#{ident}", attrs={"class": "anchor-link", "aria-label": "Link to this section"}
        )
        anchor.string = "#"
        tag.append(anchor)
        page.headings.append((level, ident, text))


def _wrap_tables(soup: BeautifulSoup) -> None:
    for table in soup.find_all("table"):
        if table.parent is not None and "table-scroll" in (table.parent.get("class") or []):
            continue
        wrapper = soup.new_tag("div", attrs={"class": "table-scroll"})
        table.wrap(wrapper)


def _fix_mermaid(soup: BeautifulSoup) -> None:
    """Any Mermaid block still in a `<code class="language-mermaid">` becomes a `<pre class="mermaid">`."""
    for code in soup.select("pre > code.language-mermaid"):
        pre = code.parent
        pre["class"] = ["mermaid"]
        pre.string = code.get_text()


# ---------------------------------------------------------------------------
# cross-page work: targets, cross-reference links, link rewriting


def _collect_targets(
    pages: list[Page], numbering: Numbering
) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """(id -> page href) for every id, and ((kind, number) -> "page.html#id") for cross-references."""
    ids: dict[str, str] = {}
    numbers: dict[tuple[str, str], str] = {}
    by_source = {page.source: page for page in pages}
    for page in pages:
        if page.title_id:
            ids.setdefault(page.title_id, page.href)
        if page.number is not None:
            numbers[("chapter", page.number)] = page.href
        soup = BeautifulSoup(page.body, "html.parser")
        for tag in soup.find_all(id=True):
            ids.setdefault(tag["id"], page.href)
    kinds = {"section": "sec", "figure": "fig", "table": "tbl", "equation": "eq"}
    for target in numbering.targets.values():
        page = by_source.get(target.file)
        if page is None or not target.number or target.kind not in kinds:
            continue
        if ids.get(target.label) == page.href:
            numbers.setdefault((kinds[target.kind], target.number), f"{page.href}#{target.label}")
    return ids, numbers


def _label_equations(page: Page, numbering: Numbering) -> None:
    """Put an anchor with the label's id before each display equation tagged with its number."""
    wanted = {
        target.number: target.label
        for target in numbering.targets.values()
        if target.kind == "equation" and target.file == page.source and target.number
    }
    if not wanted:
        return
    soup = BeautifulSoup(page.body, "html.parser")
    for text in list(soup.find_all(string=re.compile(r"\\tag\{"))):
        if text.find_parent(["pre", "code", "script"]) is not None:
            continue
        value = str(text)
        cuts: list[tuple[int, str]] = []
        for match in re.finditer(r"\\tag\*?\{([^}]*)\}", value):
            label = wanted.pop(match.group(1).strip(), None)
            if label is not None:
                opening = value.rfind("$$", 0, match.start())
                cuts.append((max(opening, 0), label))
        if not cuts:
            continue
        pieces: list = []
        last = 0
        for position, label in cuts:  # the anchor goes right before the equation's opening $$
            pieces.append(NavigableString(value[last:position]))
            pieces.append(soup.new_tag("span", id=label, attrs={"class": "eq-anchor"}))
            last = position
        pieces.append(NavigableString(value[last:]))
        for piece in pieces:
            text.insert_before(piece)
        text.extract()
    page.body = str(soup)


def _rewrite_href(href: str, page: Page, ids: dict[str, str], slugs: set[str]) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.IGNORECASE) or href.startswith("//"):
        return href
    path, _, fragment = href.partition("#")
    if path:
        name = Path(path).name
        stem, suffix = Path(name).stem, Path(name).suffix
        if suffix in (".qmd", ".ipynb") or (suffix == ".html" and stem in slugs):
            path = f"{stem}.html" if stem in slugs else path
    elif fragment and fragment in ids and ids[fragment] != page.href:
        path = ids[fragment]
    return f"{path}#{fragment}" if fragment else path


def _link_crossrefs(soup: BeautifulSoup, numbers: dict[tuple[str, str], str], page: Page) -> None:
    skip = (
        "a",
        "pre",
        "code",
        "script",
        "style",
        "figcaption",
        "caption",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "title",
    )
    for text in list(soup.find_all(string=_CROSSREF)):
        if text.find_parent(skip) is not None:
            continue
        pieces: list = []
        last = 0
        value = str(text)
        maths = [span.span() for span in _MATH_SPAN.finditer(value)]
        for match in _CROSSREF.finditer(value):
            if any(start <= match.start() < end for start, end in maths):
                continue  # never split a formula: MathJax reads each one from a single text node
            kind = _CROSSREF_WORDS[match.group("word")]
            target = numbers.get((kind, match.group("number")))
            if target is None:
                continue
            if target.startswith(page.href + "#"):
                target = target[len(page.href) :]
            pieces.append(NavigableString(value[last : match.start()]))
            link = soup.new_tag("a", href=target, attrs={"class": "crossref"})
            link.string = match.group(0)
            pieces.append(link)
            last = match.end()
        if not pieces:
            continue
        pieces.append(NavigableString(value[last:]))
        for piece in pieces:
            text.insert_before(piece)
        text.extract()


# ---------------------------------------------------------------------------
# the layout


def _sidebar(pages: list[Page], current: Page) -> str:
    items = []
    appendix_started = False
    for page in pages:
        if page.appendix and not appendix_started:
            appendix_started = True
            items.append('<li class="sidebar-part">Appendices</li>')
        number = f'<span class="chapter-number">{html.escape(page.number)}</span>' if page.number else ""
        attrs = ' class="current" aria-current="page"' if page is current else ""
        entry = f'<li{attrs}><a href="{page.href}">{number}<span class="chapter-title">{html.escape(page.title)}</span></a>'
        if page is current:
            sections = [
                f'<li><a href="#{ident}">{html.escape(text)}</a></li>'
                for level, ident, text in page.headings
                if level == 2
            ]
            if sections:
                entry += '<ol class="sidebar-sections">' + "".join(sections) + "</ol>"
        items.append(entry + "</li>")
    return '<ol class="sidebar-chapters">' + "".join(items) + "</ol>"


def _page_nav(pages: list[Page], index: int) -> str:
    links = []
    if index > 0:
        prev = pages[index - 1]
        links.append(
            f'<a class="nav-prev" rel="prev" href="{prev.href}"><span class="nav-dir">\u2190 Previous</span>'
            f'<span class="nav-title">{html.escape(prev.label)}</span></a>'
        )
    else:
        links.append("<span></span>")
    if index + 1 < len(pages):
        nxt = pages[index + 1]
        links.append(
            f'<a class="nav-next" rel="next" href="{nxt.href}"><span class="nav-dir">Next \u2192</span>'
            f'<span class="nav-title">{html.escape(nxt.label)}</span></a>'
        )
    return '<nav class="page-nav" aria-label="Previous and next">' + "".join(links) + "</nav>"


def _contents(pages: list[Page]) -> str:
    items = []
    appendix_started = False
    for page in pages:
        if page.slug == "index":
            continue
        if page.appendix and not appendix_started:
            appendix_started = True
            items.append('<li class="contents-part">Appendices</li>')
        number = f'<span class="chapter-number">{html.escape(page.number)}</span>' if page.number else ""
        items.append(f'<li><a href="{page.href}">{number}{html.escape(page.title)}</a></li>')
    return (
        '<section class="contents" id="contents"><h2>Contents</h2><ol class="contents-list">'
        + "".join(items)
        + "</ol></section>"
    )


def _layout(pages: list[Page], index: int, book_title: str, subtitle: str) -> str:
    page = pages[index]
    head_title = f"{page.label} \u2013 {book_title}" if page.slug != "index" else book_title
    if page.number is not None:
        kind = "Appendix" if page.appendix else "Chapter"
        heading = (
            f'<h1 class="chapter-title" id="{html.escape(page.title_id or "top")}">'
            f'<span class="chapter-number" aria-label="{kind} {html.escape(page.number)}">{html.escape(page.number)}</span> '
            f"{html.escape(page.title)}</h1>"
        )
    else:
        sub = f'<p class="subtitle">{html.escape(subtitle)}</p>' if subtitle else ""
        heading = f'<h1 class="book-cover-title" id="{html.escape(page.title_id or "top")}">{html.escape(book_title)}</h1>{sub}'
    scripts = ['<script defer src="assets/book.js"></script>']
    if page.has_math:
        scripts.insert(0, '<script src="assets/mathjax-config.js"></script>')
        scripts.insert(1, '<script defer src="assets/mathjax/tex-svg-full.js" id="MathJax-script"></script>')
    if page.has_mermaid:
        scripts.insert(0, '<script defer src="assets/mermaid/mermaid.min.js"></script>')
    body = page.body
    if page.slug == "index":
        body += _contents(pages)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(head_title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/book.css">
<link rel="stylesheet" href="assets/pygments.css">
{chr(10).join(scripts)}
</head>
<body>
<a class="skip-link" href="#content">Skip to the text</a>
<header class="book-header">
<button class="sidebar-toggle" type="button" aria-controls="sidebar" aria-expanded="false">Contents</button>
<a class="book-title" href="index.html">{html.escape(book_title)}</a>
</header>
<div class="book-layout">
<nav class="sidebar" id="sidebar" aria-label="Chapters">
{_sidebar(pages, page)}
</nav>
<main class="content" id="content">
<article class="chapter">
{heading}
{body}
</article>
{_page_nav(pages, index)}
</main>
</div>
</body>
</html>
"""


# ---------------------------------------------------------------------------
# assets


def _find_node_modules(root: Path) -> Path | None:
    for candidate in (root / "web" / "node_modules", root / "node_modules"):
        if all((candidate / source).is_file() for source, _ in NPM_ASSETS.values()):
            return candidate
    return None


def ensure_node_modules(root: Path, *, install: bool = True) -> Path:
    """The node_modules folder holding MathJax and Mermaid; runs `npm ci` once when missing."""
    found = _find_node_modules(root)
    if found is None and install and (root / "web" / "package.json").is_file() and shutil.which("npm"):
        print(f"html: installing MathJax and Mermaid: {NPM_INSTALL}", file=sys.stderr)
        subprocess.run(NPM_INSTALL.split(), cwd=root, check=False)
        found = _find_node_modules(root)
    if found is None:
        raise AssetError(
            "MathJax and Mermaid are not installed (looked in web/node_modules and node_modules); "
            f"run `{NPM_INSTALL}` in the repository root (needs Node.js and npm)"
        )
    return found


def copy_assets(out: Path, node_modules: Path) -> None:
    """Copy the stylesheet, scripts, MathJax and Mermaid into `out/assets/`."""
    assets = out / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    for item in STATIC.iterdir():
        if item.is_file():
            shutil.copyfile(item, assets / item.name)
    (assets / "pygments.css").write_text(
        HtmlFormatter(style="friendly").get_style_defs(".highlight"), encoding="utf-8"
    )
    for source, target in NPM_ASSETS.values():
        destination = out / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(node_modules / source, destination)
    license_file = node_modules / "mathjax" / "LICENSE"
    if license_file.is_file():
        shutil.copyfile(license_file, out / "assets" / "mathjax" / "LICENSE")
    license_file = node_modules / "mermaid" / "LICENSE"
    if license_file.is_file():
        shutil.copyfile(license_file, out / "assets" / "mermaid" / "LICENSE")


# ---------------------------------------------------------------------------
# the whole book


def _book_titles(root: Path) -> tuple[str, str]:
    import yaml

    try:
        config = yaml.safe_load((root / "_quarto.yml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        config = {}
    book = config.get("book") or {}
    return str(book.get("title") or "The book"), str(book.get("subtitle") or "")


def build_book(
    root: Path,
    executed: Path,
    out: Path,
    *,
    node_modules: Path | None = None,
) -> list[Path]:
    """Write the notebook edition of the book into `out`; returns the pages written, in order."""
    book = load_book(root)
    node_modules = node_modules or ensure_node_modules(root)
    numbering = compute_numbering(book)
    pages = plan_pages(book, executed, numbering)
    if not pages:
        raise BookError(
            f"no executed notebooks in {executed}: run `python -m longctx.booktools execute` first"
        )
    if out.exists():
        for stale in ("figures", "assets"):
            shutil.rmtree(out / stale, ignore_errors=True)
        for stale in out.glob("*.html"):
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    for page in pages:
        render_page(page, out, numbering)
        _label_equations(page, numbering)
    ids, numbers = _collect_targets(pages, numbering)
    slugs = {page.slug for page in pages}
    for page in pages:
        soup = BeautifulSoup(page.body, "html.parser")
        _link_crossrefs(soup, numbers, page)
        for anchor in soup.find_all("a", href=True):
            anchor["href"] = _rewrite_href(anchor["href"], page, ids, slugs)
        page.body = str(soup)
    title, subtitle = _book_titles(root)
    written = []
    for index, page in enumerate(pages):
        target = out / page.href
        target.write_text(_layout(pages, index, title, subtitle), encoding="utf-8")
        written.append(target)
    copy_assets(out, node_modules)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m longctx.booktools html",
        description="Build the notebook edition of the book (HTML) from the executed notebooks.",
    )
    parser.add_argument(
        "--executed", default=None, help="folder of executed notebooks (default: _build/executed)"
    )
    parser.add_argument("--out", default=None, help="output folder (default: _book)")
    parser.add_argument(
        "--root", default=None, help="the book's root (default: the folder holding _quarto.yml)"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]  # `python -m longctx.booktools html -- --out DIR`
    args = parser.parse_args(argv)
    try:
        root = Path(args.root).resolve() if args.root else find_root()
        executed = Path(args.executed) if args.executed else root / "_build" / "executed"
        out = Path(args.out) if args.out else root / "_book"
        written = build_book(root, executed, out)
    except (AssetError, BookError, qmd.QmdError) as exc:
        print(f"html: {exc}", file=sys.stderr)
        return 1
    print(f"html: wrote {len(written)} pages to {out}")
    print(f"html: open {(out / 'index.html').resolve()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
