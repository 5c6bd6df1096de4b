"""The reader's `notebooks/`: the chapters as Jupyter notebooks that read cleanly without Quarto,
with the outputs and inline values of Quarto's own execution of the book (`booktools quarto`).

One notebook per listed file, markdown split at headings (levels 1-3), code cells and callouts.
Headings carry their numbers ("## 3.2 Grouped heads", "# Appendix A: Title"); cross-references
become "Figure 3.2", "Section 3.4"; a labelled equation gets `\\tag{3.1}`; captions become
"**Figure 3.2:** caption" cells; citations read as citeproc formats them in the book's style,
"(Vaswani et al. 2017)" (one pandoc run for the book); callouts become titled `<div>` blocks
(split around code cells, `callout-continued`); diagrams stay fenced, with caption and alt text.
Each code cell keeps its `#|` lines and carries metadata `longctx` (`source`, `line`; a figure's
or table's `kind` and `label`; `collapsed` in a collapsed callout). The reader's notebooks drop the
`#|` lines, take each cell's outputs and each inline value from the notebook Quarto executed, and
open with a cell that installs `longctx` outside the repository.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat

from .bib import bibliography_keys, render_citations
from .book import Book, repo_url, write_if_changed
from .numbering import ChapterInfo, Numbering, Target, compute_numbering
from .qmd import (
    BRACKET,
    BRACKET_ITEM,
    CODE_SPAN,
    CROSSREF_PREFIXES,
    IMAGE_LABEL,
    INLINE_EXPRESSION,
    LABELLED_EQUATION,
    PIPE_CAPTION,
    REFERENCE,
    Cell,
    CellItem,
    Div,
    Line,
    inline_text,
    parse_attributes,
    parse_options,
    walk,
)

__all__ = [
    "export_chapter", "export_notebooks", "finish_book", "finish_notebook",
    "needs_kernel", "setup_cell_source", "translate_inline",
]

NOTEBOOK_KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

#: cite(citation as written, its keys) -> its text, or None to leave it as written.
Cite = Callable[[str, list[str]], str | None]


# ---------------------------------------------------------------------------
# inline syntax: cross-references and citations


def _render_crossref(item: re.Match, target: Target) -> str:
    prefix = item.group("prefix").strip()
    suffix = item.group("suffix")
    if prefix:
        text = f"{prefix} {target.number or target.title}"
    elif item.group("minus"):
        text = target.number or target.title
    else:
        text = target.text
    return text + suffix


def _translate_bracket(match: re.Match, targets: dict[str, Target], cite: Cite) -> str:
    items = [BRACKET_ITEM.match(part) for part in match.group("body").split(";")]
    if not items or any(item is None for item in items):
        return match.group(0)
    keys = [item.group("key") for item in items]
    if all(key.startswith(CROSSREF_PREFIXES) for key in keys):
        if any(key not in targets for key in keys):
            return match.group(0)
        return ", ".join(_render_crossref(item, targets[item.group("key")]) for item in items)
    rendered = cite(match.group(0), keys)
    return match.group(0) if rendered is None else rendered


def _translate_narrative(match: re.Match, targets: dict[str, Target], cite: Cite) -> str:
    key = match.group("key")
    if key.startswith(CROSSREF_PREFIXES):
        target = targets.get(key)
        if target is None:
            return match.group(0)
        return (target.number or target.title) if match.group("minus") else target.text
    rendered = cite(match.group(0), [key])
    return match.group(0) if rendered is None else rendered


def translate_inline(text: str, targets: dict[str, Target], cite: Cite) -> str:
    """Cross-references and citations -> text, leaving code spans (and `{python}`) alone."""
    out = []
    position = 0
    for span in CODE_SPAN.finditer(text):
        out.append(_translate_prose(text[position : span.start()], targets, cite))
        out.append(span.group(0))
        position = span.end()
    out.append(_translate_prose(text[position:], targets, cite))
    return "".join(out)


def _translate_prose(text: str, targets: dict[str, Target], cite: Cite) -> str:
    if "@" not in text:
        return text
    text = BRACKET.sub(lambda m: _translate_bracket(m, targets, cite), text)
    return REFERENCE.sub(lambda m: _translate_narrative(m, targets, cite), text)


# ---------------------------------------------------------------------------
# one chapter


class _Builder:
    def __init__(self, info: ChapterInfo, numbering: Numbering, cite: Cite):
        self.info = info
        self.doc = info.document
        self.numbering = numbering
        self.targets = numbering.targets
        self.cite = cite
        self.cells: list[dict] = []
        self.segments: list[tuple[str, str]] = []  # ("md", line) or ("raw", fenced text)
        self.context: Div | None = None  # the innermost open callout of the buffered lines
        self.started: set[int] = set()  # id() of each callout whose titled first part is out
        self.v4 = nbformat.v4

    # -- helpers -------------------------------------------------------------
    def inline(self, text: str) -> str:
        return translate_inline(text, self.targets, self.cite)

    def add_markdown(self, source: str) -> None:
        self.cells.append(self.v4.new_markdown_cell(source))

    def open_callout(self, callout: Div, body: str) -> None:
        """Emit the titled first part of a callout (body may be empty)."""
        kind = callout.callout_type
        classes = f"callout callout-{kind}" + (" callout-collapse" if callout.collapse else "")
        title = html.escape(self.inline(callout.display_title), quote=False)
        head = f'<div class="{classes}">\n<p class="callout-title">{title}</p>'
        source = f"{head}\n\n{body}\n\n</div>" if body else f"{head}\n</div>"
        self.started.add(id(callout))
        self.add_markdown(source)

    # -- markdown buffer ----------------------------------------------------------
    def flush(self) -> None:
        body = "\n".join(text if kind == "raw" else self.inline(text) for kind, text in self.segments)
        self.segments = []
        body = self.block_rewrites(body).strip("\n")
        callout = self.context
        if not body.strip():
            return
        if callout is None:
            self.add_markdown(body)
        elif id(callout) not in self.started:
            self.open_callout(callout, body)
        else:
            kind = callout.callout_type
            source = f'<div class="callout callout-{kind} callout-continued">\n\n{body}\n\n</div>'
            self.add_markdown(source)

    def block_rewrites(self, text: str) -> str:
        def equation(match: re.Match) -> str:
            target = self.targets.get(match.group("label"))
            body = match.group("body")
            if target is None or not target.number:
                return f"$${body}$$"
            return f"$${body.rstrip()} \\tag{{{target.number}}}{body[len(body.rstrip()) :]}$$"

        return LABELLED_EQUATION.sub(equation, text)

    def set_context(self, callout: Div | None) -> None:
        if callout is not self.context:
            self.flush()
            self.context = callout

    # -- items --------------------------------------------------------------------
    def line(self, item: Line) -> None:
        callouts = [div for div in item.divs if div.callout_type]
        innermost = callouts[-1] if callouts else None
        if item.kind == "div_open":
            self.set_context(innermost)
            return
        if item.kind == "div_close":
            closed = item.div
            if closed is not None and closed.callout_type:
                self.flush()
                if id(closed) not in self.started:
                    self.open_callout(closed, "")
            self.set_context(innermost)
            return
        self.set_context(innermost)
        if item.kind == "heading" and not item.in_math:
            if item.callout_title:
                return
            heading = item.heading
            if heading.level <= 3:
                self.flush()
            number = self.numbering.heading_numbers.get((self.doc.display, item.line), "")
            if heading.level == 1 and number == (self.info.number or "") and self.info.number:
                prefix = self.info.heading_prefix
            else:
                prefix = f"{number} " if number else ""
            self.segments.append(("md", f"{'#' * heading.level} {prefix}{heading.text}"))
            return
        if item.kind == "text" and not item.in_math:
            caption = PIPE_CAPTION.match(item.text)
            if caption is not None:
                target = self.targets.get(caption.group("label"))
                name = target.text if target is not None else "Table"
                self.segments += [("md", ""), ("md", f"**{name}:** {caption.group('caption')}"), ("md", "")]
                return
            if "{#fig-" in item.text:
                self.segments.append(("md", IMAGE_LABEL.sub(self.image, item.text)))
                return
        self.segments.append(("md", item.text))

    def image(self, match: re.Match) -> str:
        if not match.group("label").startswith("fig-"):
            return match.group(0)
        target = self.targets.get(match.group("label"))
        alt = parse_attributes(match.group("attrs"))[2].get("fig-alt", match.group("caption"))
        name = target.text if target is not None else "Figure"
        return f"![{alt}]({match.group('path')}{match.group('title') or ''})\n\n**{name}:** {match.group('caption')}"

    def cell(self, item: CellItem) -> None:
        callouts = [div for div in item.divs if div.callout_type]
        innermost = callouts[-1] if callouts else None
        self.set_context(innermost)
        cell = item.cell
        if not cell.is_python:
            self.segments.append(("raw", self.fenced_text(cell)))
            return
        self.flush()
        if innermost is not None and id(innermost) not in self.started:
            self.open_callout(innermost, "")
        lines = cell.lines
        if cell.indent:
            lines = [text[len(cell.indent) :] if text.startswith(cell.indent) else text for text in lines]
        code = self.v4.new_code_cell("\n".join(lines))
        meta: dict = {"source": self.doc.display, "line": cell.line}
        label = cell.label or ""
        caption = None
        for prefix, kind, option in (("fig-", "figure", "fig-cap"), ("tbl-", "table", "tbl-cap")):
            if label.startswith(prefix) or (not label and option in cell.options):
                meta.update(kind=kind, **({"label": label} if label else {}))
                target = self.targets.get(label)
                name = target.text if target is not None and target.number else kind.capitalize()
                caption = f"**{name}:** {self.inline(str(cell.options.get(option, '') or ''))}"
                break
        if innermost is not None and innermost.collapse:
            meta["collapsed"] = True  # an exercise's solution: the reader's notebook folds its code
        code.metadata["longctx"] = meta
        if caption is not None and meta["kind"] == "table":
            self.add_markdown(caption)
        self.cells.append(code)
        if caption is not None and meta["kind"] == "figure":
            self.add_markdown(caption)

    def fenced_text(self, cell: Cell) -> str:
        """A non-Python block as fenced code; a diagram (mermaid, ...) with its caption and alt text.

        A notebook draws a mermaid fence only where its front end can (JupyterLab 4.1+); the
        caption and the alt text below the source give every reader the figure's content.
        """
        # an executable block loses Quarto's `%%|` / `#|` options
        body, info = (cell.code_lines, cell.lang) if cell.executable else (cell.lines, cell.info)
        fenced = "\n".join([f"{cell.indent}{cell.fence}{info}", *body, f"{cell.indent}{cell.fence}"])
        caption = str(cell.options.get("fig-cap", "") or "").strip()
        if not caption:
            return fenced
        target = self.targets.get(cell.label or "")
        name = target.text if target is not None and target.kind == "figure" and target.number else "Figure"
        parts = [fenced, "", f"{cell.indent}**{name}:** {self.inline(caption)}"]
        alt = str(cell.options.get("fig-alt", "") or "").strip()
        if alt:
            parts += ["", f"{cell.indent}*The diagram in words:* {self.inline(alt)}"]
        return "\n".join(parts)

    def build(self):
        items, _ = walk(self.doc)
        first_heading = next((i for i in items if isinstance(i, Line) and i.kind == "heading"), None)
        if (first_heading is None or first_heading.heading.level != 1) and self.info.title:
            self.segments.append(("md", f"# {self.info.heading_prefix}{self.info.title}"))
            self.flush()
        for item in items:
            if isinstance(item, CellItem):
                self.cell(item)
            else:
                self.line(item)
        self.set_context(None)
        self.flush()
        notebook = nbformat.v4.new_notebook()
        notebook.nbformat, notebook.nbformat_minor = 4, 5
        for index, cell in enumerate(self.cells):
            cell["id"] = f"cell-{index}"
        notebook.cells = self.cells
        notebook.metadata = {"kernelspec": dict(NOTEBOOK_KERNELSPEC), "language_info": {"name": "python"},
                             "longctx": {"source": self.doc.display}}
        return notebook


def export_chapter(info: ChapterInfo, numbering: Numbering, cite: Cite):
    """The notebook (an nbformat NotebookNode) for one parsed chapter; `cite` gives citations their text."""
    if info.document is None:
        raise ValueError(f"{info.display} has no parsed document")
    return _Builder(info, numbering, cite).build()


def export_notebooks(
    book: Book, files: list[str | Path] | None = None, numbering: Numbering | None = None
) -> tuple[list, list[str]]:
    """The unexecuted notebook of every listed (or named) file that exists, in book order.

    Returns:
        (exported, problems): `(ChapterInfo, notebook)` pairs, and the problems
        ("FILE:LINE: message") that stopped a chapter from being exported.
    """
    numbering = numbering or compute_numbering(book)
    problems = [str(exc) for exc in numbering.problems]
    keys = bibliography_keys(book.bibliography)
    wanted = None
    if files:
        wanted = set()
        for name in files:
            entry = book.entry_for(name)
            if entry is None:
                problems.append(f"{name}:0: not a file listed in _quarto.yml")
            else:
                wanted.add(entry.path)
    chapters = []
    for info in numbering.chapters:
        if wanted is not None and info.display not in wanted:
            continue
        if info.document is None:
            if not (book.root / info.display).is_file():
                print(
                    f"warning: _quarto.yml:{info.entry.line}: {info.display} is listed but does not exist yet; skipped",
                    file=sys.stderr,
                )
            continue
        chapters.append(info)
    # Every citation of these chapters, formatted by citeproc in one pandoc run.
    citations: dict[str, str | None] = {}

    def collect(source: str, cited: list[str]) -> None:
        if all(key in keys for key in cited):
            citations.setdefault(source, None)

    for info in chapters:
        export_chapter(info, numbering, collect)
    texts = render_citations(list(citations), book.bibliography, csl=book.csl, what="notebooks")
    citations.update(zip(citations, texts, strict=True))
    exported = [
        (info, export_chapter(info, numbering, lambda source, _keys: citations.get(source))) for info in chapters
    ]
    return exported, problems


# ---------------------------------------------------------------------------
# the reader's notebooks: the export, executed, finished for Jupyter

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


def _hide_source(cell, options: dict) -> bool:
    """Whether the book folds or hides this cell's code (an exercise's solution counts)."""
    collapsed = cell.metadata.get("longctx", {}).get("collapsed", False)
    return bool(options.get("code-fold") is True or options.get("echo") is False or collapsed)


class StaleNotebook(Exception):
    """The executed notebook does not match the chapter as it is now."""


def finish_notebook(notebook, executed, url: str, display: str):
    """The reader's notebook: a fresh export `notebook` with `executed`'s outputs and values.

    Code cells get the executed cell's outputs and lose their Quarto `#|` option lines (a folded
    or hidden cell is collapsed with Jupyter's `source_hidden`); markdown cells get their inline
    values, each formatted by `qmd.inline_text` from the executed notebook's
    `user_expressions`; a notebook with code starts with the `setup_cell_source` cell.

    Raises:
        StaleNotebook: `executed` ran different code or other inline expressions
            (message `FILE:LINE: ...`).
    """
    ran_code = [cell for cell in (executed.cells if executed is not None else []) if cell.cell_type == "code"]
    values = [
        entry
        for cell in (executed.cells if executed is not None else [])
        if cell.cell_type == "markdown"
        for entry in cell.metadata.get("user_expressions", [])
    ]
    stale = "the executed notebook is stale ({}); run `make book` (or `python -m booktools quarto`)"
    code_index = 0
    for cell in notebook.cells:
        line = cell.metadata.get("longctx", {}).get("line", 0)
        if cell.cell_type == "code":
            ran = ran_code[code_index] if code_index < len(ran_code) else None
            code_index += 1
            if ran is None or _code(ran.source) != _code(cell.source):
                raise StaleNotebook(f"{display}:{line}: " + stale.format("this cell changed since it ran"))
            cell.outputs = ran.get("outputs", [])
            cell.execution_count = ran.get("execution_count")
            lines = cell.source.split("\n")
            option_lines, options = parse_options(lines, display, line + 1)
            cell.source = "\n".join(lines[len(option_lines) :])
            if _hide_source(cell, options):
                cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        elif cell.cell_type == "markdown":
            used = []
            for match in INLINE_EXPRESSION.finditer(cell.source):
                expression = match.group("expr").strip()
                if not values or values[0].get("expression") != expression:
                    raise StaleNotebook(
                        f"{display}:0: " + stale.format(f"it has no value for `{{python}} {expression}` here")
                    )
                used.append(values.pop(0))
            if used:
                texts = iter([inline_text(entry["result"]) for entry in used])
                cell.source = INLINE_EXPRESSION.sub(lambda _match, texts=texts: next(texts), cell.source)
                cell.metadata["user_expressions"] = used
    if code_index != len(ran_code) or values:
        raise StaleNotebook(f"{display}:0: " + stale.format("it ran cells or values the chapter no longer has"))
    if code_index:
        setup = nbformat.v4.new_code_cell(setup_cell_source(url))
        setup["id"] = "longctx-setup"
        setup.metadata["longctx"] = {"role": "setup"}
        notebook.cells.insert(0, setup)
    return notebook


def _code(source: str) -> str:
    """A cell's code without its `#|` options and trailing blank lines (Quarto's notebook drops them)."""
    lines = source.split("\n")
    return "\n".join(lines[len(parse_options(lines, "<cell>", 1)[0]) :]).rstrip()


def needs_kernel(notebook) -> bool:
    """Whether a notebook has code to run or inline values to compute."""
    return any(
        cell.cell_type == "code" or (cell.cell_type == "markdown" and INLINE_EXPRESSION.search(cell.source))
        for cell in notebook.cells
    )


def finish_book(
    book: Book, executed: Path, out: Path, files: list[str | Path] | None = None
) -> tuple[list[Path], list[str]]:
    """Write the reader's notebooks: each listed (or named) file exported, with its executed outputs.

    Args:
        executed: the notebooks Quarto executed (`booktools quarto` moves them there, `<stem>.ipynb`).
        out: where the reader's notebooks go (`notebooks/`).

    Returns:
        (paths, problems): the notebooks written (or already current) and the problems
        ("FILE:LINE: message"): a chapter not executed, or executed before its last change.

    Raises:
        BookError: `_quarto.yml` has no usable `book.repo-url` (checked before anything is written).
    """
    url = repo_url(book)
    exported, problems = export_notebooks(book, files)
    finished = []
    for info, notebook in exported:
        stem = Path(info.display).stem
        ran = None
        if needs_kernel(notebook):
            path = executed / f"{stem}.ipynb"
            if not path.is_file():
                problems.append(
                    f"{info.display}:0: not executed yet ({book.display(path)} is missing); "
                    "run `make book` (or `python -m booktools quarto`)"
                )
                continue
            ran = nbformat.read(str(path), as_version=4)
        try:
            finished.append((stem, finish_notebook(notebook, ran, url, info.display)))
        except StaleNotebook as exc:
            problems.append(str(exc))
    paths = []
    for stem, notebook in finished:
        nbformat.validate(notebook)
        path = out / f"{stem}.ipynb"
        write_if_changed(path, nbformat.writes(notebook) + "\n")
        paths.append(path)
    return paths, problems
