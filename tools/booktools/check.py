"""`check`: the book's integrity, every problem reported as `FILE:LINE: message`.

- every cross-reference (`@fig-…`, `@tbl-…`, `@eq-…`, `@sec-…`) names a label that exists;
- every citation (`[@key]`, `@key`) names an entry of the bibliography;
- labels are unique book-wide, use the fig-/tbl-/eq-/sec- prefixes and name their
  chapter (`fig-ch03-…`; `sec-index-…` in index.qmd, `sec-appendix-…` in appendices);
- every figure cell (label `fig-…`) has `fig-cap` and `fig-alt`; every table cell `tbl-cap`;
- `_quarto.yml` lists exactly the chapter files in chapters/, and each listed file exists;
- no chapter imports a later chapter (in any cell); `# @save` only in chNN-*.qmd files;
- the generated modules are current (`tangle --check`) and tangle without errors;
- what Quarto trips on although the notebook edition does not (`source_problems`): an empty
  front-matter block, a maths span with a space before its closing `$`, an inline value that
  is a str carrying Markdown, an unlabelled mermaid diagram, a code line over 80 characters.
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

__all__ = ["CODE_LINE_LIMIT", "check_book", "main_check", "source_problems"]


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
        for line, message in source_problems(doc):
            add(display, line, message)

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
        add(book.display(path), 1, "generated module is stale: run `python -m booktools tangle`")

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


# ---------------------------------------------------------------------------
# Source problems that Quarto and Pandoc trip on, though the notebook edition hides them.
# Each check is one self-contained function of a parsed document that returns
# (line, message) pairs; `source_problems` runs them all. Their patterns are their own.

CODE_LINE_LIMIT = 80
"""The longest line a chapter's code may have: 80 characters fit the text column of both
editions at 1280 px without scrolling (tests/test_quarto_edition.py measures it)."""

_SRC_CODE_SPAN = re.compile(r"(`+)(?:[^`]|(?!\1)`)*?\1(?!`)", re.DOTALL)
_SRC_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)
_SRC_INLINE = re.compile(r"`\{python\}[ \t]+(?P<expr>[^`]+?)[ \t]*`")
# Markdown a plain str value would carry to the reader as raw characters.
_SRC_MARKDOWN_IN_TEXT = (
    ("backticks", re.compile(r"`")),
    ("`*…*` emphasis", re.compile(r"(?<![*\\])(\*\*?)(?=[^\s*])[^\n]*?(?<=[^\s*\\])\1")),
    ("`_…_` emphasis", re.compile(r"(?<![\w\\])(__?)(?=[^\s_])[^\n]*?(?<=[^\s_\\])\1(?!\w)")),
    ("a `[…](…)` link", re.compile(r"\[[^\]\n]+\]\([^)\n]+\)")),
    ("`$…$` maths", re.compile(r"(?<![\\$])\$(?=[^\s$])[^$\n]*?(?<=[^\s\\])\$(?!\$)")),
)


def source_problems(doc) -> list[tuple[int, str]]:
    """Every source problem of one parsed document that Quarto trips on, as (line, message)."""
    return sorted(
        empty_front_matter(doc)
        + maths_with_space_before_closing_dollar(doc)
        + markdown_in_inline_values(doc)
        + unlabelled_mermaid(doc)
        + long_code_lines(doc)
    )


def empty_front_matter(doc) -> list[tuple[int, str]]:
    """A `---` `---` block with nothing in it: Pandoc reads it as a rule and a dash paragraph."""
    if doc.front_matter_lines and not doc.front_matter:
        return [
            (
                1,
                "empty front matter block (`---` then `---`): Pandoc reads it as a rule and a "
                "paragraph holding a dash, which Quarto turns into a chapter of its own; delete both lines",
            )
        ]
    return []


def _blank_out(pattern: re.Pattern, text: str) -> str:
    """`text` with every match of `pattern` replaced by spaces (newlines kept, so offsets stay)."""
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)


def maths_with_space_before_closing_dollar(doc) -> list[tuple[int, str]]:
    """`$j = $`: Pandoc's inline maths must end on a non-space, so it prints both `$` as text."""
    found = []
    for block in doc.markdown:
        text = block.text.replace("\\$", "  ")
        text = _blank_out(_SRC_DISPLAY_MATH, _blank_out(_SRC_CODE_SPAN, text))
        offset = 0
        for paragraph in re.split(r"(\n[ \t]*\n)", text):
            dollars = [m.start() for m in re.finditer(r"\$", paragraph)]
            for opening, closing in zip(dollars[0::2], dollars[1::2], strict=False):
                if paragraph[closing - 1].isspace() and not paragraph[opening + 1].isspace():
                    line = block.line + text.count("\n", 0, offset + closing)
                    span = " ".join(paragraph[opening : closing + 1].split())
                    found.append(
                        (
                            line,
                            f"maths span {span} has a space before its closing `$`, so Pandoc prints it "
                            "as text; end the span on a non-space character (`$x$ = …`)",
                        )
                    )
            offset += len(paragraph)
    return found


def _string_templates(node: ast.AST) -> list[str]:
    """The text every string literal inside `node` contributes; f-string values become `x`."""
    found = []
    for child in ast.walk(node):
        if isinstance(child, ast.JoinedStr):
            found.append(
                "".join(
                    part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "x"
                    for part in child.values
                )
            )
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            found.append(child.value)
    return found


def _displayed_as_markdown(node: ast.AST) -> bool:
    """Whether an expression is `Markdown(...)` (IPython.display.Markdown), which Quarto renders."""
    if isinstance(node, ast.Call):
        function = node.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        return name == "Markdown"
    return False


def markdown_in_inline_values(doc) -> list[tuple[int, str]]:
    """An inline value that is a plain str holding Markdown: Quarto escapes it, so the marks show.

    Static: the expression itself, or the chapter's last assignment to the name before the
    prose uses it, is searched for string literals carrying Markdown (f-string values count
    as text). A value wrapped in `Markdown(...)` is rendered as Markdown and passes.
    """
    assignments: list[tuple[int, str, ast.AST]] = []
    for cell in doc.python_cells:
        try:
            tree = ast.parse("\n".join(cell.code_lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets = [target.id for target in node.targets if isinstance(target, ast.Name)]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            else:
                continue
            if node.value is not None:
                for name in targets:
                    assignments.append((cell.code_line + node.lineno - 1, name, node.value))
    found = []
    for block in doc.markdown:
        for offset, text in enumerate(block.lines):
            line = block.line + offset
            for match in _SRC_INLINE.finditer(text):
                expression = match.group("expr")
                try:
                    node = ast.parse(expression, mode="eval").body
                except SyntaxError:
                    continue
                if _displayed_as_markdown(node):
                    continue
                values = [node]
                if isinstance(node, ast.Name):
                    before = [value for at, name, value in assignments if name == node.id and at < line]
                    values = before[-1:] or [value for _, name, value in assignments if name == node.id][-1:]
                for value in values:
                    if _displayed_as_markdown(value):
                        continue
                    kinds = [
                        kind
                        for kind, pattern in _SRC_MARKDOWN_IN_TEXT
                        if any(pattern.search(template) for template in _string_templates(value))
                    ]
                    if kinds:
                        found.append(
                            (
                                line,
                                f"inline value `{{python}} {expression}` is a str carrying Markdown "
                                f"({', '.join(kinds)}); Quarto prints a str as plain text, so the reader "
                                "sees the marks: make the value plain text, or wrap it in "
                                "IPython.display.Markdown",
                            )
                        )
    return found


def unlabelled_mermaid(doc) -> list[tuple[int, str]]:
    """A ```{mermaid} diagram without `%%| label: fig-…`: Quarto's EPUB writes it as malformed XHTML."""
    found = []
    for cell in doc.cells:
        if cell.executable and cell.lang == "mermaid" and not str(cell.label or "").startswith("fig-"):
            found.append(
                (
                    cell.line,
                    "mermaid diagram without `%%| label: fig-…`: Quarto 1.7's EPUB wraps an unlabelled "
                    "diagram in markup that is not valid XHTML; label it as a figure and give it "
                    "`%%| fig-cap:` and `%%| fig-alt:`",
                )
            )
    return found


def long_code_lines(doc, limit: int = CODE_LINE_LIMIT) -> list[tuple[int, str]]:
    """Lines of code a reader sees (every fenced block but diagrams) longer than `limit`."""
    found = []
    for cell in doc.cells:
        if cell.executable and not cell.is_python:
            continue  # {mermaid}, {dot}: drawn, not shown as code
        first = cell.code_line if cell.executable else cell.line + 1
        lines = cell.code_lines if cell.executable else cell.lines
        for offset, text in enumerate(lines):
            if text.startswith(cell.indent):
                text = text[len(cell.indent) :]
            if len(text) > limit:
                found.append(
                    (
                        first + offset,
                        f"code line is {len(text)} characters; the book's code lines are at most {limit} "
                        "so that they fit the page",
                    )
                )
    return found
