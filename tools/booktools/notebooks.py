"""The reader's `notebooks/`: each listed file as a Jupyter notebook that reads cleanly without Quarto,
with the outputs and inline values of Quarto's own execution of the book (`booktools quarto`).

Markdown is split at headings (levels 1-3), which carry the book's numbers; cross-references read
"Figure 3.2", labelled equations get `\\tag{3.1}`, captions become "**Figure 3.2:** caption",
citations read as citeproc formats them in the book's style, callouts become titled `<div>`s (split
around code cells), diagrams stay fenced with caption and alt text. Code cells carry metadata
`longctx` (`source`, `line`; a figure's or table's `kind` and `label`; `collapsed`).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import nbformat

from . import qmd
from .bib import bibliography_keys, render_citations
from .book import Book, repo_url, write_if_changed
from .numbering import ChapterInfo, Numbering, Target, compute_numbering

#: cite(citation as written, its keys) -> its text, or None to leave it as written.
Cite = Callable[[str, list[str]], str | None]
STALE = "the executed notebook is stale ({}); run `make book` (or `python -m booktools quarto`)"


def _crossref(target: Target, minus: bool, prefix: str = "") -> str:
    """How Quarto prints a reference: "Figure 3.2"; with `-@` the number alone; with a prefix, "Fig. 3.2"."""
    return f"{prefix} {target.number or target.title}".strip() if prefix or minus else target.text


def _bracket(match: re.Match, targets: dict[str, Target], cite: Cite) -> str:
    items = [qmd.BRACKET_ITEM.match(part) for part in match.group("body").split(";")]
    if any(item is None for item in items):
        return match.group(0)
    keys = [item.group("key") for item in items]
    if all(key.startswith(qmd.CROSSREF_PREFIXES) for key in keys):
        if any(key not in targets for key in keys):
            return match.group(0)
        return ", ".join(_crossref(targets[item.group("key")], bool(item.group("minus")), item.group("prefix").strip())
                         + item.group("suffix") for item in items)
    return cite(match.group(0), keys) or match.group(0)


def _narrative(match: re.Match, targets: dict[str, Target], cite: Cite) -> str:
    key = match.group("key")
    if not key.startswith(qmd.CROSSREF_PREFIXES):
        return cite(match.group(0), [key]) or match.group(0)
    return _crossref(targets[key], bool(match.group("minus"))) if key in targets else match.group(0)


def translate_inline(text: str, targets: dict[str, Target], cite: Cite) -> str:
    """Cross-references and citations -> text, leaving code spans (and `{python}`) alone."""

    def prose(part: str) -> str:
        part = qmd.BRACKET.sub(lambda m: _bracket(m, targets, cite), part)
        return qmd.REFERENCE.sub(lambda m: _narrative(m, targets, cite), part)

    pieces = qmd.CODE_SPAN.split(text)  # text, (ticks, span text)...: rebuilt with each span as written
    spans = [m.group(0) for m in qmd.CODE_SPAN.finditer(text)]
    return "".join(prose(piece) + (spans[i] if i < len(spans) else "") for i, piece in enumerate(pieces[::2]))


class _Builder:
    """One chapter's notebook: markdown lines buffered per callout, flushed into cells."""

    def __init__(self, info: ChapterInfo, numbering: Numbering, cite: Cite):
        self.info, self.numbering, self.cite = info, numbering, cite
        self.cells: list[dict] = []
        self.lines: list[str] = []  # the markdown not yet in a cell, its references already text
        self.context: qmd.Div | None = None  # the innermost open callout of the buffered lines
        self.started: set[int] = set()  # id() of each callout whose titled first part is out

    def inline(self, text: str) -> str:
        return translate_inline(text, self.numbering.targets, self.cite)

    def name(self, label: str | None, kind: str) -> str:
        """"Figure 3.2" for a numbered label of this kind, else "Figure"."""
        target = self.numbering.targets.get(label or "")
        return target.text if target is not None and target.number and target.kind == kind else kind.capitalize()

    def markdown_cell(self, body: str, callout: qmd.Div | None) -> None:
        """A markdown cell of `body`; inside a callout, a `<div>` of its classes, titled in its first part."""
        if callout is None:
            source = body
        elif id(callout) in self.started:
            source = f'<div class="callout callout-{callout.callout_type} callout-continued">\n\n{body}\n\n</div>'
        else:
            self.started.add(id(callout))
            classes = f"callout callout-{callout.callout_type}" + (" callout-collapse" if callout.collapse else "")
            title = html.escape(self.inline(callout.display_title), quote=False)
            head = f'<div class="{classes}">\n<p class="callout-title">{title}</p>'
            source = f"{head}\n\n{body}\n\n</div>" if body else f"{head}\n</div>"
        self.cells.append(nbformat.v4.new_markdown_cell(source))

    def flush(self) -> None:
        body = qmd.LABELLED_EQUATION.sub(self.equation, "\n".join(self.lines)).strip("\n")
        self.lines = []
        if body.strip():
            self.markdown_cell(body, self.context)

    def equation(self, match: re.Match) -> str:
        target, body = self.numbering.targets.get(match.group("label")), match.group("body")
        if target is None or not target.number:
            return f"$${body}$$"
        return f"$${body.rstrip()} \\tag{{{target.number}}}{body[len(body.rstrip()) :]}$$"

    def set_context(self, divs: tuple[qmd.Div, ...]) -> qmd.Div | None:
        callout = next((div for div in reversed(divs) if div.callout_type), None)
        if callout is not self.context:
            self.flush()
            self.context = callout
        return callout

    def line(self, item: qmd.Item) -> None:
        if item.kind == "div_close" and item.div.callout_type:
            self.flush()
            if id(item.div) not in self.started:  # an empty callout still shows its title
                self.markdown_cell("", item.div)
        self.set_context(item.divs)
        if item.kind == "heading":
            if item.heading.level <= 3:
                self.flush()
            number = self.numbering.heading_numbers.get((self.info.display, item.line), "")
            prefix = (self.info.heading_prefix if item.heading.level == 1 else f"{number} ") if number else ""
            self.lines.append(self.inline(f"{'#' * item.heading.level} {prefix}{item.heading.text}"))
        elif item.kind == "text":
            caption = None if item.in_math else qmd.PIPE_CAPTION.match(item.text)
            if caption is not None:
                name = self.name(caption.group("label"), "table")
                self.lines += ["", self.inline(f"**{name}:** {caption.group('caption')}"), ""]
            else:
                self.lines.append(self.inline(item.text))

    def cell(self, item: qmd.Item) -> None:
        callout, cell = self.set_context(item.divs), item.cell
        if not cell.is_python:
            self.lines.append(self.fenced_text(cell))
            return
        self.flush()
        if callout is not None and id(callout) not in self.started:
            self.markdown_cell("", callout)
        code = nbformat.v4.new_code_cell("\n".join(cell.lines))
        meta: dict = {"source": self.info.display, "line": cell.line}
        label, captions = cell.label or "", []
        for prefix, kind, option in (("fig-", "figure", "fig-cap"), ("tbl-", "table", "tbl-cap")):
            if label.startswith(prefix) or (not label and option in cell.options):
                meta.update(kind=kind, **({"label": label} if label else {}))
                caption = f"**{self.name(label, kind)}:** {self.inline(cell.option(option))}"
                captions = [nbformat.v4.new_markdown_cell(caption)]
                break
        if callout is not None and callout.collapse:
            meta["collapsed"] = True  # an exercise's solution: the reader's notebook folds its code
        code.metadata["longctx"] = meta
        # as in the book, a table's caption stands above it and a figure's below
        self.cells += [*captions, code] if meta.get("kind") == "table" else [code, *captions]

    def fenced_text(self, cell: qmd.Cell) -> str:
        """A non-Python block as fenced code; a diagram with its caption and alt text below, for the
        front ends that do not draw mermaid (JupyterLab draws it from 4.1)."""
        body, info = (cell.code_lines, cell.lang) if cell.executable else (cell.lines, cell.info)
        lines = [f"{cell.fence}{info}", *body, cell.fence]
        caption, alt = cell.option("fig-cap").strip(), cell.option("fig-alt").strip()
        if caption:
            lines += ["", f"**{self.name(cell.label, 'figure')}:** {self.inline(caption)}"]
        if caption and alt:
            lines += ["", f"*The diagram in words:* {self.inline(alt)}"]
        return "\n".join(f"{cell.indent}{line}" if line else line for line in lines)

    def build(self):
        for item in self.info.items:
            self.cell(item) if item.kind == "cell" else self.line(item)
        self.flush()
        for index, cell in enumerate(self.cells):
            cell["id"] = f"cell-{index}"
        kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
        metadata = {"kernelspec": kernel, "language_info": {"name": "python"}, "longctx": {"source": self.info.display}}
        return nbformat.v4.new_notebook(cells=self.cells, metadata=metadata, nbformat_minor=5)


def export_notebooks(book: Book) -> tuple[list, list[str]]:
    """The unexecuted notebook of every listed file that exists (`check` names those that do not), in
    book order: `(ChapterInfo, notebook)` pairs, and the problems ("FILE:LINE: message")."""
    numbering = compute_numbering(book)
    problems = [str(exc) for exc in numbering.problems]
    chapters = [info for info in numbering.chapters if info.document is not None]
    keys = bibliography_keys(book.bibliography, [])  # `check` reports the bibliography's problems
    citations: dict[str, str | None] = {}  # every citation, formatted by citeproc in one pandoc run
    for info in chapters:
        _Builder(info, numbering, lambda source, cited: citations.setdefault(source, None)
                 if all(key in keys for key in cited) else None).build()
    texts = render_citations(list(citations), book.bibliography, csl=book.csl)
    citations.update(zip(citations, texts, strict=True))
    return [(info, _Builder(info, numbering, lambda source, _: citations.get(source)).build()) for info in chapters], problems


# The reader's notebooks: the export, with the outputs and values of Quarto's execution.

#: The first cell of a reader's notebook; `{repo_url}` is `_quarto.yml`'s `book.repo-url` as a literal.
SETUP_CELL = """\
# Makes the book's package, longctx, importable. In a clone of the book's
# repository, or where longctx is installed, this cell does nothing; anywhere
# else (Colab, a fresh Jupyter) it installs longctx from the book's repository.
import importlib.util
import pathlib
import subprocess
import sys

REPO_URL = {repo_url}


def longctx_install_command(start):
    \"\"\"The pip command that installs longctx, or None where none is needed.\"\"\"
    if importlib.util.find_spec("longctx") is not None:
        return None
    for folder in (start, *start.parents):
        if (folder / "_quarto.yml").is_file() and (folder / "code").is_dir():
            return None  # the book's repository: `make env` installs longctx
    package = f"longctx @ git+{{REPO_URL}}"
    return [sys.executable, "-m", "pip", "install", "--quiet", package]


command = longctx_install_command(pathlib.Path.cwd().resolve())
if command is not None:
    subprocess.run(command, check=True)
    importlib.invalidate_caches()
# In the repository `make env` installs longctx (kernel: .venv/bin/python).
import longctx\
"""


def setup_cell_source(url: str) -> str:
    """The code of a reader's first cell, installing longctx from `url` outside the repository."""
    return SETUP_CELL.format(repo_url=json.dumps(url))


def _code(source: str) -> tuple[str, dict]:
    """A cell's code without its `#|` options and trailing blank lines (as Quarto keeps it), and the options."""
    lines = source.split("\n")
    option_lines, options = qmd.parse_options(lines, "<cell>", 1)
    return "\n".join(lines[len(option_lines) :]), options


def finish_notebook(notebook, executed, url: str, display: str):
    """The reader's notebook: the export `notebook` with `executed`'s outputs and inline values, no `#|`
    lines (a folded or hidden cell is `source_hidden`), the setup cell first where there is code.
    QmdError (the notebook is stale) when `executed` ran other code or other inline expressions."""
    cells = executed.cells if executed is not None else []
    ran_code = iter([cell for cell in cells if cell.cell_type == "code"])
    values = [entry for cell in cells if cell.cell_type == "markdown" for entry in cell.metadata.get("user_expressions", [])]
    has_code = any(cell.cell_type == "code" for cell in notebook.cells)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            meta, ran = cell.metadata.get("longctx", {}), next(ran_code, None)
            code, options = _code(cell.source)
            if ran is None or _code(ran.source)[0].rstrip() != code.rstrip():
                raise qmd.QmdError(display, meta.get("line", 0), STALE.format("this cell changed since it ran"))
            cell.outputs, cell.execution_count, cell.source = ran.get("outputs", []), ran.get("execution_count"), code
            if options.get("code-fold") is True or options.get("echo") is False or meta.get("collapsed", False):
                cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        elif cell.cell_type == "markdown":
            used = []
            for match in qmd.INLINE_EXPRESSION.finditer(cell.source):
                expression = match.group("expr").strip()
                if not values or values[0].get("expression") != expression:
                    raise qmd.QmdError(display, 0, STALE.format(f"it has no value for `{{python}} {expression}` here"))
                used.append(values.pop(0))
            if used:
                texts = iter([qmd.inline_text(entry["result"]) for entry in used])
                cell.source = qmd.INLINE_EXPRESSION.sub(lambda _match, texts=texts: next(texts), cell.source)
                cell.metadata["user_expressions"] = used
    if next(ran_code, None) is not None or values:
        raise qmd.QmdError(display, 0, STALE.format("it ran cells or values the chapter no longer has"))
    if has_code:
        metadata = {"longctx": {"role": "setup"}}
        notebook.cells.insert(0, nbformat.v4.new_code_cell(setup_cell_source(url), id="longctx-setup", metadata=metadata))
    return notebook


def finish_book(book: Book, executed: Path, out: Path) -> tuple[list[Path], list[str]]:
    """Write the reader's notebooks into `out` from the notebooks Quarto executed (`executed/<stem>.ipynb`):
    (paths written or current, problems: a chapter not executed, or executed before its last change).
    BookError, before anything is written, when `_quarto.yml` has no usable `book.repo-url`."""
    url = repo_url(book)
    exported, problems = export_notebooks(book)
    paths = []
    for info, notebook in exported:
        stem, ran = Path(info.display).stem, None
        if any(cell.cell_type == "code" or qmd.INLINE_EXPRESSION.search(cell.source) for cell in notebook.cells):
            path = executed / f"{stem}.ipynb"  # the chapter has code to run or inline values to compute
            if not path.is_file():
                problems.append(f"{info.display}:0: not executed yet ({book.display(path)} is missing); "
                                "run `make book` (or `python -m booktools quarto`)")
                continue
            ran = nbformat.read(str(path), as_version=4)
        try:
            notebook = finish_notebook(notebook, ran, url, info.display)
        except qmd.QmdError as exc:  # stale
            problems.append(str(exc))
            continue
        nbformat.validate(notebook)
        write_if_changed(out / f"{stem}.ipynb", nbformat.writes(notebook) + "\n")
        paths.append(out / f"{stem}.ipynb")
    return paths, problems
