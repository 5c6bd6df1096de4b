"""The notebook edition of the book: the source rendered by pandoc, the outputs from the executed notebooks.

`python -m booktools html` writes one page per file that `_quarto.yml` lists
into `_book/`, in book order:

- the prose is the chapter's own source (`.qmd`), parsed once for the whole book and
  rendered by pandoc (the pinned `pypandoc-binary`), with citeproc for citations in the
  Quarto edition's style (the `csl:` that `_quarto.yml` names) and a References section on
  every page that cites anything;
- the book's numbering (numbering.py) is applied by a small pandoc filter
  (html_assets/edition.lua): section numbers, cross-references as links made from their
  labels ("Figure 3.2"), equation tags, figure and table captions, callouts;
- each Python cell shows its code without its `#|` lines (folded with `code-fold: true`,
  hidden with `echo: false`) and its outputs, taken from the executed notebook in
  `_build/executed/` with nbconvert's own preprocessors (streams coalesced as a terminal
  shows them, images extracted into `figures/`); an inline `` `{python} expr` `` shows the
  value recorded when that notebook was executed;
- every page has the book's title, a sidebar listing every chapter (and this chapter's
  sections), previous/next links and the chapter number in its `<title>`; the preface
  (`index.html`) ends with the contents;
- MathJax (SVG output) and Mermaid are copied from `web/node_modules/` into
  `_book/assets/` and loaded from there: no page loads anything from another host.
  They are npm packages pinned in `web/package-lock.json`; when they are missing the
  build runs `npm ci --prefix web` once (Node.js and npm needed), else says what to run.

Usage: `python -m booktools html [--executed DIR] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbconvert.filters import ansi2html, strip_ansi
from nbconvert.preprocessors import CoalesceStreamsPreprocessor, ExtractOutputPreprocessor
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer, get_lexer_by_name
from pygments.util import ClassNotFound

from . import qmd
from .bib import citeproc_arguments
from .book import Book, BookError, find_root, load_book
from .execute import inline_text
from .numbering import ChapterInfo, Numbering, page_name
from .pandoc import PandocError, run_pandoc

__all__ = ["AssetError", "Page", "build_book", "heading_ids", "main", "page_markdown", "plan_pages"]

HERE = Path(__file__).resolve().parent
STATIC = HERE / "html_assets"
FILTER = STATIC / "edition.lua"
TEMPLATE = STATIC / "page-template.html"
_BODY_MARK = "<!-- longctx:body -->"

# The browser libraries (npm packages pinned in web/package.json) and the file of each
# that a page loads. Both bundles are self-contained: they fetch nothing else.
NPM_ASSETS = {
    "mathjax": ("mathjax/es5/tex-svg-full.js", "assets/mathjax/tex-svg-full.js"),
    "mermaid": ("mermaid/dist/mermaid.min.js", "assets/mermaid/mermaid.min.js"),
}
NPM_INSTALL = "npm ci --prefix web --no-audit --no-fund"

# Quarto syntax that must never reach a reader (checked after rendering, in prose).
RAW_QUARTO = re.compile(r"@(?:fig|tbl|eq|sec)-|\{#(?:fig|tbl|eq|sec)-|^:::|#\||\{python\}", re.MULTILINE)

_IMAGES = ("image/svg+xml", "image/png", "image/jpeg", "image/gif")
_NUMBERED_WORDS = {"figure", "table", "equation"}  # Quarto keeps their word and number together
_FORMATTER = HtmlFormatter(cssclass="highlight")


class AssetError(RuntimeError):
    """A browser library the book needs (MathJax, Mermaid) is not installed."""


def heading_ids(document: qmd.Document) -> list[tuple[qmd.Heading, str]]:
    """Every section heading of a chapter with the id Quarto and this edition give it (see qmd)."""
    return document.section_ids


# ---------------------------------------------------------------------------
# pages


@dataclass
class Page:
    """One HTML page of the book: a listed file, its executed notebook, and what pandoc made of it."""

    info: ChapterInfo
    notebook: nbformat.NotebookNode | None = None
    body: str = ""  # the article's HTML, without the chapter title
    sections: str = ""  # pandoc's table of contents: the sidebar's list of this page's sections

    @property
    def source(self) -> str:
        return self.info.entry.path

    @property
    def slug(self) -> str:
        return Path(self.source).stem

    @property
    def href(self) -> str:
        return page_name(self.source)

    @property
    def number(self) -> str | None:
        return self.info.number

    @property
    def appendix(self) -> bool:
        return self.info.entry.appendix

    @property
    def title(self) -> str:
        return self.info.title or ("Preface" if self.number is None else self.slug)

    @property
    def title_id(self) -> str:
        return self.info.label or "top"

    @property
    def label(self) -> str:
        """The title with its number, as the sidebar and <title> show it."""
        return self.title if self.number is None else f"{self.number}\u2002{self.title}"

    @property
    def has_math(self) -> bool:
        return 'class="math' in self.body

    @property
    def has_mermaid(self) -> bool:
        return 'class="mermaid"' in self.body


def _runs_code(document: qmd.Document) -> bool:
    """Whether a page needs its executed notebook: it has Python cells or inline expressions."""
    return bool(document.python_cells) or any("{python}" in block.text for block in document.markdown)


def plan_pages(book: Book, executed: Path) -> list[Page]:
    """One page per listed file that exists, with its executed notebook where it runs code."""
    pages: list[Page] = []
    for info in book.numbering.chapters:
        if info.document is None:
            continue
        notebook_path = executed / f"{Path(info.entry.path).stem}.ipynb"
        notebook = nbformat.read(notebook_path, as_version=4) if notebook_path.is_file() else None
        if notebook is None and _runs_code(info.document):
            print(f"html: skipping {info.entry.path}: no executed notebook {notebook_path}", file=sys.stderr)
            continue
        pages.append(Page(info, notebook))
    return pages


# ---------------------------------------------------------------------------
# one page's source for pandoc: the chapter's markdown, its cells replaced by what a reader sees


def _raw_html(text: str) -> str:
    """A raw HTML block that pandoc passes through untouched."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{{=html}}\n{text}\n{fence}"


def _div(classes: str, content: list[str], identifier: str | None = None) -> str:
    """A fenced div; its colons outnumber any div inside it."""
    inner = "\n\n".join(part for part in content if part)
    colons = ":" * (max((len(run) for run in re.findall(r"^:{3,}", inner, re.MULTILINE)), default=2) + 1)
    ident = f"#{identifier} " if identifier else ""
    return f"{colons} {{{ident}{classes}}}\n{inner}\n{colons}"


def _dedent(cell: qmd.Cell, lines: list[str]) -> str:
    """A block's lines without the indentation of its fence (a cell inside a list item)."""
    return "\n".join(text[len(cell.indent) :] if text.startswith(cell.indent) else text for text in lines)


def _highlighted(code: str, lang: str) -> str:
    if not lang:
        return f"<pre><code>{html.escape(code)}</code></pre>"
    try:
        lexer = PythonLexer() if lang == "python" else get_lexer_by_name(lang)
    except ClassNotFound:
        return f'<pre><code class="language-{html.escape(lang)}">{html.escape(code)}</code></pre>'
    return highlight(code, lexer, _FORMATTER)


class _PageSource:
    """Builds pandoc's markdown input for one page, in one pass over the parsed chapter."""

    def __init__(self, page: Page, numbering: Numbering, project_options: dict):
        self.page = page
        self.info = page.info
        self.document = page.info.document
        self.numbering = numbering
        self.defaults = {**project_options, **(self.document.front_matter.get("execute") or {})}
        self.outputs: dict[int, list] = {}  # the source line of a cell's fence -> its outputs
        self.files: dict[str, bytes] = {}  # "figures/NAME.png" -> the image
        self.values: dict[str, deque[str]] = defaultdict(deque)  # inline expression -> its values, in order
        if page.notebook is not None:
            self._read_notebook(page.notebook)

    def _read_notebook(self, notebook) -> None:
        notebook = nbformat.from_dict(notebook)  # a copy: the preprocessors change it
        resources = {"unique_key": self.page.slug, "output_files_dir": "figures", "outputs": {}}
        notebook, resources = CoalesceStreamsPreprocessor().preprocess(notebook, resources)
        extract = ExtractOutputPreprocessor(extract_output_types=set(_IMAGES))
        notebook, resources = extract.preprocess(notebook, resources)
        self.files = resources["outputs"]
        for cell in notebook.cells:
            if cell.cell_type == "code":
                line = (cell.metadata.get("longctx") or {}).get("line")
                if line is not None:
                    self.outputs[int(line)] = cell.get("outputs", [])
            for entry in cell.metadata.get("user_expressions", []):
                self.values[entry["expression"]].append(inline_text(entry["result"]))

    def error(self, line: int, message: str) -> BookError:
        return BookError(f"{self.document.display}:{line}: {message}")

    # -- markdown lines --------------------------------------------------------------
    def markdown(self) -> str:
        items, _ = qmd.walk(self.document)
        lines: list[str] = []
        for item in items:
            if isinstance(item, qmd.CellItem):
                block = self.cell(item.cell)
                if block:
                    indent = item.cell.indent
                    lines += ["", *(indent + text if text else text for text in block.split("\n")), ""]
                continue
            if item.line == self.info.title_line:
                continue  # the page's title is the layout's own heading
            number = self.numbering.heading_numbers.get((self.document.display, item.line))
            if item.kind == "heading" and not item.callout_title and number:
                heading = item.heading  # its number goes in an attribute, for the filter to show
                text = self.inline_values(heading.text, item.line)
                lines.append(f'{"#" * heading.level} {text} {{{heading.attributes} number="{number}"}}')
            else:
                lines.append(self.inline_values(item.text, item.line))
        return "\n".join(lines) + "\n"

    def inline_values(self, text: str, line: int) -> str:
        """`{python} expr` -> the value it had when the chapter was executed."""
        if "{python}" not in text:
            return text

        def value(match: re.Match) -> str:
            queue = self.values.get(match.group("expr").strip())
            if not queue:
                raise self.error(
                    line,
                    f"no value was recorded for `{{python}} {match.group('expr')}` in the executed notebook: "
                    "run `python -m booktools execute` again",
                )
            return queue.popleft()

        return qmd.INLINE_EXPRESSION.sub(value, text)

    # -- cells ---------------------------------------------------------------------------
    def cell(self, cell: qmd.Cell) -> str:
        """What a reader sees of a fenced block; its lines keep their place (the caller re-indents)."""
        if cell.is_python:
            return self.python_cell(cell)
        code = _dedent(cell, cell.code_lines if cell.executable else cell.lines)
        if cell.executable and cell.lang == "mermaid":
            diagram = _raw_html(f'<pre class="mermaid">{html.escape(code)}</pre>')
            return self.float_figure(cell, [diagram]) if "fig-cap" in cell.options else diagram
        return _raw_html(f'<div class="cell-input">{_highlighted(code, cell.lang)}</div>')

    def option(self, cell: qmd.Cell, name: str, default):
        return cell.options.get(name, self.defaults.get(name, default))

    def python_cell(self, cell: qmd.Cell) -> str:
        if self.option(cell, "include", True) is False:
            return ""
        parts: list[str] = []
        code = qmd.CROSS_REFERENCE.sub(self.reference_text, _dedent(cell, cell.code_lines)).strip("\n")
        if self.option(cell, "echo", True) is not False and code.strip():
            shown = f'<div class="cell-input">{_highlighted(code, "python")}</div>'
            if str(cell.options.get("code-fold", False)).lower() == "true":
                summary = html.escape(str(cell.options.get("code-summary", "Code")))
                shown = f'<details class="code-fold"><summary>{summary}</summary>{shown}</details>'
            parts.append(_raw_html(shown))
        if self.option(cell, "output", True) is not False:
            if cell.line not in self.outputs:
                raise self.error(
                    cell.line,
                    "this cell is not in the executed notebook (the chapter changed since it was executed): "
                    "run `python -m booktools execute` again",
                )
            outputs = self.cell_outputs(cell, self.outputs[cell.line])
            if outputs:
                parts.append(_div(".cell-output", outputs))
        return _div(".cell", parts) if parts else ""

    def reference_text(self, match: re.Match) -> str:
        """`@eq-ch01-softmax` in code reads "Equation 1.1", as no reader should see a raw label."""
        target = self.numbering.targets.get(match.group("label"))
        return target.text if target is not None else match.group(0)

    def cell_outputs(self, cell: qmd.Cell, outputs: list) -> list[str]:
        label = cell.label or ""
        figure = label.startswith("fig-") or (not label and "fig-cap" in cell.options)
        table = label.startswith("tbl-")
        pieces: list[str] = []
        images: list[str] = []
        figure_at = 0  # where the figure goes among the outputs: at its first image
        for output in outputs:
            kind = output.get("output_type")
            if kind == "stream":
                text = strip_ansi(output.get("text", "")).rstrip()
                if text.strip():
                    name = "stderr" if output.get("name") == "stderr" else "stdout"
                    pieces.append(_raw_html(f'<pre class="output-stream {name}">{html.escape(text)}</pre>'))
                continue
            if kind == "error":
                trace = ansi2html("\n".join(output.get("traceback", [])))
                pieces.append(_raw_html(f'<pre class="output-error">{trace}</pre>'))
                continue
            data = output.get("data", {})
            image = next((mime for mime in _IMAGES if mime in data), None)
            if image is not None:
                img = self.image(cell, output, image)
                if figure:
                    if not images:
                        figure_at = len(pieces)
                    images.append(img)
                else:
                    pieces.append(_raw_html(f'<div class="output-image">{img}</div>'))
            elif "text/markdown" in data:
                markdown = data["text/markdown"]
                pieces.append(self.float_table(cell, markdown) if table else markdown)
            elif "text/html" in data:
                shown = data["text/html"]
                if "<table" in shown:
                    shown = f'<div class="table-scroll">{shown}</div>'
                pieces.append(self.float_table(cell, _raw_html(shown)) if table else _raw_html(shown))
            elif "text/latex" in data:
                pieces.append(_raw_html(f'<div class="output-latex">{html.escape(data["text/latex"])}</div>'))
            elif "text/plain" in data:
                text = html.escape(strip_ansi(data["text/plain"]))
                pieces.append(_raw_html(f'<pre class="output-text">{text}</pre>'))
        if images:
            pieces.insert(figure_at, self.float_figure(cell, [_raw_html("\n".join(images))]))
        return pieces

    def image(self, cell: qmd.Cell, output, mime: str) -> str:
        path = output["metadata"]["filenames"][mime]
        alt = str(cell.options.get("fig-alt") or "").strip() or "A figure drawn by the code above."
        metadata = output.get("metadata", {}).get(mime, {})
        size = "".join(
            f' {name}="{int(metadata[name])}"' for name in ("width", "height") if isinstance(metadata.get(name), int | float)
        )
        return f'<img src="{html.escape(path)}" alt="{html.escape(alt, quote=True)}"{size} loading="eager">'

    def caption(self, cell: qmd.Cell, option: str) -> str:
        text = self.inline_values(str(cell.options.get(option) or ""), cell.line)
        return _div(".float-caption", [text]) if text else ""

    def float_figure(self, cell: qmd.Cell, content: list[str]) -> str:
        return _div(".float-figure", [*content, self.caption(cell, "fig-cap")], cell.label)

    def float_table(self, cell: qmd.Cell, content: str) -> str:
        return _div(".float-table", [content, self.caption(cell, "tbl-cap")], cell.label)


def page_markdown(page: Page, numbering: Numbering, project_options: dict | None = None) -> tuple[str, dict]:
    """Pandoc's input for a page and the image files its outputs need ("figures/NAME" -> bytes)."""
    source = _PageSource(page, numbering, project_options or {})
    return source.markdown(), source.files


# ---------------------------------------------------------------------------
# pandoc, once per page


def _targets_file(book: Book, pages: list[Page], folder: Path) -> Path:
    """The JSON the filter reads: every label's reference text, number and page; the book's pages."""
    targets = {}
    for label, target in book.numbering.targets.items():
        text = target.text
        if target.kind in _NUMBERED_WORDS and target.number:
            text = text.replace(" ", "\u00a0", 1)
        targets[label] = {"text": text, "number": target.number, "href": target.href}
    path = folder / "targets.json"
    path.write_text(json.dumps({"targets": targets, "pages": [page.slug for page in pages]}), encoding="utf-8")
    return path


def _render(page: Page, markdown: str, book: Book, targets: Path) -> None:
    arguments = [
        "--from=markdown",
        "--to=html5",
        "--mathjax",
        "--wrap=none",
        "--standalone",
        f"--template={TEMPLATE}",
        "--toc",
        "--toc-depth=2",
        f"--lua-filter={FILTER}",  # before citeproc: labels are not citations
        *citeproc_arguments(book.bibliography, book.csl),
        "--metadata=link-citations:true",  # as Quarto: each citation links to its entry
        f"--metadata=longctx-targets:{targets}",
        f"--metadata=longctx-page:{page.href}",
        f"--metadata=pagetitle:{page.slug}",
    ]
    text, warnings = run_pandoc(arguments, markdown, what=page.source)
    for warning in warnings.strip().splitlines():
        print(f"html: {page.source}: {warning}", file=sys.stderr)
    sections, _, page.body = text.partition(_BODY_MARK)
    page.sections = sections.strip()


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
        if page is current and page.sections:
            entry += f'<div class="sidebar-sections">{page.sections}</div>'
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
            f'<h1 class="chapter-title" id="{html.escape(page.title_id)}">'
            f'<span class="chapter-number" aria-label="{kind} {html.escape(page.number)}">{html.escape(page.number)}</span> '
            f"{html.escape(page.title)}</h1>"
        )
    else:
        sub = f'<p class="subtitle">{html.escape(subtitle)}</p>' if subtitle else ""
        heading = f'<h1 class="book-cover-title" id="{html.escape(page.title_id)}">{html.escape(book_title)}</h1>{sub}'
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
        if item.suffix in (".css", ".js"):
            shutil.copyfile(item, assets / item.name)
    (assets / "pygments.css").write_text(
        HtmlFormatter(style="friendly").get_style_defs(".highlight"), encoding="utf-8"
    )
    for source, target in NPM_ASSETS.values():
        destination = out / target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(node_modules / source, destination)
    for package in ("mathjax", "mermaid"):
        license_file = node_modules / package / "LICENSE"
        if license_file.is_file():
            shutil.copyfile(license_file, out / "assets" / package / "LICENSE")


# ---------------------------------------------------------------------------
# the whole book


def build_book(
    root: Path,
    executed: Path,
    out: Path,
    *,
    node_modules: Path | None = None,
    book: Book | None = None,
) -> list[Path]:
    """Write the notebook edition of the book into `out`; returns the pages written, in order."""
    book = book or load_book(root)
    node_modules = node_modules or ensure_node_modules(book.root)
    pages = plan_pages(book, executed)
    if not pages:
        raise BookError(f"no executed notebooks in {executed}: run `python -m booktools execute` first")
    if book.numbering.problems:  # a chapter that does not parse
        raise BookError("; ".join(str(problem) for problem in book.numbering.problems))
    project_options = book.config.get("execute") or {}
    sources = [page_markdown(page, book.numbering, project_options) for page in pages]
    if out.exists():
        for stale in ("figures", "assets"):
            shutil.rmtree(out / stale, ignore_errors=True)
        for stale in out.glob("*.html"):
            stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    for _, files in sources:
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
    with tempfile.TemporaryDirectory(prefix="longctx-html-") as folder:
        targets = _targets_file(book, pages, Path(folder))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            runs = [pool.submit(_render, page, markdown, book, targets) for page, (markdown, _) in zip(pages, sources, strict=True)]
            for run in runs:
                run.result()
    written = []
    for index, page in enumerate(pages):
        target = out / page.href
        target.write_text(_layout(pages, index, book.title, book.subtitle), encoding="utf-8")
        written.append(target)
    copy_assets(out, node_modules)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m booktools html",
        description="Build the notebook edition of the book (HTML) from its source and the executed notebooks.",
    )
    parser.add_argument("--executed", default=None, help="folder of executed notebooks (default: _build/executed)")
    parser.add_argument("--out", default=None, help="output folder (default: _book)")
    parser.add_argument("--root", default=None, help="the book's root (default: the folder holding _quarto.yml)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]  # `python -m booktools html -- --out DIR`
    args = parser.parse_args(argv)
    try:
        root = Path(args.root).resolve() if args.root else find_root()
        executed = Path(args.executed) if args.executed else root / "_build" / "executed"
        out = Path(args.out) if args.out else root / "_book"
        written = build_book(root, executed, out)
    except (AssetError, BookError, PandocError, qmd.QmdError) as exc:
        print(f"html: {exc}", file=sys.stderr)
        return 1
    print(f"html: wrote {len(written)} pages to {out}")
    print(f"html: open {(out / 'index.html').resolve()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
