"""`check`: the book's integrity, every problem reported as `FILE:LINE: message`.

- every cross-reference (`@fig-…`, `@tbl-…`, `@eq-…`, `@sec-…`) names a label that exists;
- every citation (`[@key]`, `@key`) names an entry of the bibliography;
- labels are unique book-wide, use the fig-/tbl-/eq-/sec- prefixes and name their
  chapter (`fig-ch03-…`; `sec-index-…` in index.qmd, `sec-appendix-…` in appendices);
- every figure cell (label `fig-…`) has `fig-cap` and `fig-alt`; every table cell `tbl-cap`;
- `_quarto.yml` lists exactly the chapter files in chapters/, and each listed file exists;
- no chapter imports a later chapter (in any cell); `# @save` only in chNN-*.qmd files;
- the generated modules are current (`tangle --check`) and tangle without errors.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from .bib import bibliography_keys
from .book import MODULE_FILE, Book, load_book
from .numbering import LABEL_KINDS
from .qmd import CODE_SPAN, EQUATION_LABEL, IMAGE_LABEL, PIPE_CAPTION, REFERENCE, CellItem, Line, walk

__all__ = ["check_book", "main_check"]


def _label_scope(path: str) -> str | None:
    """What a label must name after its prefix in this file: "ch03", "index", "appendix"."""
    name = Path(path).name
    match = MODULE_FILE.match(name)
    if match:
        return f"ch{match.group('number')}"
    if Path(path).stem == "index":
        return "index"
    if name.startswith("appendix"):
        return "appendix"
    return None


def _strip_code(text: str) -> str:
    return CODE_SPAN.sub(lambda match: " " * len(match.group(0)), text)


def check_book(book: Book) -> list[str]:
    """Every integrity problem of the book, as `FILE:LINE: message` lines (sorted)."""
    problems: list[tuple[str, int, str]] = []

    def add(path: str, line: int, message: str) -> None:
        problems.append((path, line, message))

    # _quarto.yml against chapters/
    listed = {entry.path for entry in book.entries}
    for entry in book.entries:
        if not (book.root / entry.path).is_file():
            add("_quarto.yml", entry.line, f"{entry.path} is listed but does not exist")
    chapters_dir = book.root / "chapters"
    if chapters_dir.is_dir():
        for path in sorted(chapters_dir.glob("*.qmd")):
            rel = path.relative_to(book.root).as_posix()
            if rel not in listed:
                add(rel, 1, "this chapter file is not listed in _quarto.yml (book.chapters or book.appendices)")
    seen_paths: dict[str, int] = {}
    for entry in book.entries:
        if entry.path in seen_paths:
            add("_quarto.yml", entry.line, f"{entry.path} is listed twice (first at line {seen_paths[entry.path]})")
        seen_paths.setdefault(entry.path, entry.line)

    bib_problems: list[str] = []
    bib = bibliography_keys(book.bibliography, bib_problems)
    for text in bib_problems:
        path, line, message = text.split(":", 2)
        add(path, int(line or 0), message.strip())

    numbering = book.numbering
    for error in numbering.problems:
        add(error.path, error.line, error.message)
    for repeat, first in numbering.duplicates:
        add(repeat.file, repeat.line, f"label {repeat.label} is already used at {first.file}:{first.line}")
    targets = numbering.targets
    order = [entry.module for entry in book.module_entries]

    for info in numbering.chapters:
        doc = info.document
        if doc is None:
            continue
        display = doc.display
        scope = _label_scope(display)
        module = info.entry.module
        items, walk_problems = walk(doc)
        for error in walk_problems:
            add(error.path, error.line, error.message)

        def check_label(label: str, line: int, allowed: tuple[str, ...], display=display, scope=scope) -> None:
            prefix = label.split("-", 1)[0]
            if prefix not in LABEL_KINDS or f"{prefix}-" not in [f"{kind}-" for kind in allowed]:
                wanted = " or ".join(f"{kind}-" for kind in allowed)
                add(display, line, f"label {label} should start with {wanted}")
                return
            if scope is not None and not label.startswith(f"{prefix}-{scope}-"):
                add(display, line, f"label {label} should name its chapter: {prefix}-{scope}-...")

        def check_references(text: str, line: int, display=display) -> None:
            for match in REFERENCE.finditer(_strip_code(text)):
                key = match.group("key")
                prefix = key.split("-", 1)[0]
                if prefix in LABEL_KINDS and "-" in key:
                    if key not in targets:
                        add(display, line, f"cross-reference @{key} points at no label")
                elif key not in bib:
                    add(display, line, f"citation @{key} is not in the bibliography ({_bib_names(book)})")

        for item in items:
            if isinstance(item, CellItem):
                cell = item.cell
                if cell.saved and module is None:
                    add(display, cell.code_line, "`# @save` in a file that produces no module (only chapters/chNN-*.qmd do)")
                if not cell.executable:
                    continue
                label = cell.label
                if label:
                    check_label(label, cell.line, ("fig", "tbl"))
                    if label.startswith("fig-"):
                        for option in ("fig-cap", "fig-alt"):
                            if not str(cell.options.get(option, "") or "").strip():
                                add(display, cell.line, f"figure cell {label} has no `#| {option}:`")
                    if label.startswith("tbl-") and not str(cell.options.get("tbl-cap", "") or "").strip():
                        add(display, cell.line, f"table cell {label} has no `#| tbl-cap:`")
                for option in ("fig-cap", "tbl-cap", "fig-alt"):
                    value = cell.options.get(option)
                    if isinstance(value, str):
                        check_references(value, cell.line)
                if cell.is_python and module is not None:
                    _check_cell_imports(cell, module, order, lambda line, message, display=display: add(display, line, message))
                continue
            line: Line = item
            if line.kind == "heading":
                if line.heading.label and not line.callout_title:
                    check_label(line.heading.label, line.line, ("sec",))
            elif line.kind == "div_open" and line.div is not None and line.div.identifier:
                check_label(line.div.identifier, line.line, ("fig", "tbl"))
            elif line.kind == "text":
                for match in EQUATION_LABEL.finditer(line.text):
                    check_label(match.group("label"), line.line, ("eq",))
                for match in IMAGE_LABEL.finditer(line.text):
                    check_label(match.group("label"), line.line, ("fig",))
                caption = PIPE_CAPTION.match(line.text)
                if caption:
                    check_label(caption.group("label"), line.line, ("tbl",))
            if line.kind in ("text", "heading"):
                text = line.text
                if line.kind == "heading":
                    text = line.heading.text
                if line.kind == "text":
                    text = EQUATION_LABEL.sub("", IMAGE_LABEL.sub("", text))
                    text = re.sub(r"\{#[^}]*\}\s*$", "", text)
                check_references(text, line.line)

    # generated modules
    from .tangle import stale_outputs, tangle_book

    result = tangle_book(book)
    for problem in result.problems:
        add(problem.path, problem.line, problem.message)
    for path in stale_outputs(result):
        add(book.display(path), 1, "generated module is stale: run `python -m longctx.booktools tangle`")

    unique = sorted(set(problems), key=lambda item: (item[0], item[1], item[2]))
    return [f"{path}:{line}: {message}" for path, line, message in unique]


def _bib_names(book: Book) -> str:
    return ", ".join(path.name for path in book.bibliography) or "no bibliography in _quarto.yml"


def _check_cell_imports(cell, module: str, order: list[str], add) -> None:
    """A chapter may import only earlier chapters, in any cell (saved or not)."""
    try:
        tree = ast.parse("\n".join(cell.code_lines))
    except SyntaxError:
        return  # tangle reports saved cells; execution reports the rest
    from .tangle import _chapter_imports

    position = order.index(module) if module in order else len(order)
    earlier = order[:position]
    for line, other, how in _chapter_imports(tree):
        if other not in earlier:
            add(cell.code_line + line - 1, f"`{how}` imports {other}; a chapter may import only earlier chapters")


def main_check(root: Path, args) -> int:
    book = load_book(root)
    problems = check_book(book)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check: the book is consistent")
    return 0
