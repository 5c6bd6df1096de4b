"""`check`: the book's integrity, every problem reported as `FILE:LINE: message`.

- every cross-reference (`@fig-…`, `@tbl-…`, `@eq-…`, `@sec-…`) names a label that exists;
- every citation (`[@key]`, `@key`) names an entry of the bibliography;
- labels are unique book-wide, use the fig-/tbl-/eq-/sec- prefixes and name their
  chapter (`fig-ch03-…`; `sec-index-…` in index.qmd, `sec-appendix-…` in appendices);
- every figure cell (label `fig-…`) has `fig-cap` and `fig-alt`; every table cell `tbl-cap`;
- `_quarto.yml` lists exactly the chapter files in chapters/, and each listed file exists;
- no chapter imports a later chapter (in any cell); `# @save` only in chNN-*.qmd files;
- saved code has no side effects at import, and its docstrings and comments hold no Quarto
  syntax and only numbers the book has (`saved_code_problems`);
- the generated modules are current (`tangle --check`) and tangle without errors;
- what Quarto trips on (`source_problems`): an empty
  front-matter block, a maths span with a space before its closing `$`, an inline value that
  is a str carrying Markdown, an unlabelled mermaid diagram, a code line over 80 characters.
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from pathlib import Path

from .bib import bibliography_keys
from .book import MODULE_FILE, Book
from .numbering import LABEL_KINDS, Numbering, compute_numbering
from .qmd import (
    BRACKET,
    CODE_SPAN,
    CROSS_REFERENCE,
    DISPLAY_MATH,
    EQUATION_LABEL,
    IMAGE_LABEL,
    INLINE_EXPRESSION,
    PIPE_CAPTION,
    REFERENCE,
    CellItem,
    Line,
    walk,
)

__all__ = ["CODE_LINE_LIMIT", "check_book", "saved_code_problems", "source_problems"]


#: The chapter part of a label (`ch05-` in `sec-ch05-timing`), which an appendix may keep.
MOVED_LABEL = re.compile(r"ch\d\d-")


def _label_scope(path: str) -> str | None:
    """What a label must name after its prefix in this file: "ch03", "index", "appendix"."""
    name, match = Path(path).name, MODULE_FILE.match(Path(path).name)
    if match:
        return f"ch{match.group('number')}"
    return "index" if Path(path).stem == "index" else "appendix" if name.startswith("appendix") else None


def check_book(book: Book, numbering: Numbering | None = None) -> list[str]:
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
    bib_names = ", ".join(path.name for path in book.bibliography) or "no bibliography in _quarto.yml"
    for text in bib_problems:
        path, line, message = text.split(":", 2)
        add(path, int(line or 0), message.strip())

    numbering = numbering or compute_numbering(book)
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
        if module is not None:
            for line, message in saved_code_problems(doc, module, order, numbering):
                add(display, line, message)

        def check_label(label: str, line: int, allowed: tuple[str, ...], display=display, scope=scope) -> None:
            prefix = label.split("-", 1)[0]
            if prefix not in LABEL_KINDS or f"{prefix}-" not in [f"{kind}-" for kind in allowed]:
                wanted = " or ".join(f"{kind}-" for kind in allowed)
                add(display, line, f"label {label} should start with {wanted}")
                return
            # an appendix may hold a chapter's section moved there, under the label it had
            moved = scope == "appendix" and MOVED_LABEL.match(label.split("-", 1)[1])
            if scope is not None and not label.startswith(f"{prefix}-{scope}-") and not moved:
                add(display, line, f"label {label} should name its chapter: {prefix}-{scope}-...")

        def check_references(text: str, line: int, display=display) -> None:
            for match in REFERENCE.finditer(_blank_out(CODE_SPAN, text)):
                key = match.group("key")
                prefix = key.split("-", 1)[0]
                if prefix in LABEL_KINDS and "-" in key:
                    if key not in targets:
                        add(display, line, f"cross-reference @{key} points at no label")
                elif key not in bib:
                    add(display, line, f"citation @{key} is not in the bibliography ({bib_names})")

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
                continue
            line: Line = item
            if line.kind == "heading":
                if line.heading.label and not line.callout_title:
                    check_label(line.heading.label, line.line, ("sec",))
                if "$" in line.heading.text and not line.callout_title:  # EPUBCheck refuses MathML in nav
                    add(display, line.line, "maths in a heading: the EPUB's contents would hold MathML")
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


# ---------------------------------------------------------------------------
# Source problems that Quarto and Pandoc trip on. Each check is one function of a parsed
# document that returns (line, message) pairs; `source_problems` runs them all.

CODE_LINE_LIMIT = 80
"""The longest line a chapter's code may have: 80 characters fit the text column of both
editions at 1280 px without scrolling (tests/test_quarto_edition.py measures it)."""

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
        text = _blank_out(DISPLAY_MATH, _blank_out(CODE_SPAN, text))
        offset = 0
        for paragraph in re.split(r"(\n[ \t]*\n)", text):
            dollars = [m.start() for m in re.finditer(r"\$", paragraph)]
            for opening, closing in zip(dollars[0::2], dollars[1::2], strict=False):
                if paragraph[closing - 1].isspace() and not paragraph[opening + 1].isspace():
                    line = block.line + text.count("\n", 0, offset + closing)
                    span = " ".join(paragraph[opening : closing + 1].split())
                    found.append((line, f"maths span {span} has a space before its closing `$`, so Pandoc prints it "
                        "as text; end the span on a non-space character (`$x$ = …`)"))
            offset += len(paragraph)
    return found


def _markdown_kinds(value: ast.AST) -> list[str]:
    """The Markdown a value's string literals carry (f-string values count as `x`); none for `Markdown(...)`."""
    function = value.func if isinstance(value, ast.Call) else None
    if getattr(function, "attr", getattr(function, "id", "")) == "Markdown":
        return []  # IPython.display.Markdown: Quarto renders it as Markdown
    texts = [node.value for node in ast.walk(value) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    texts += ["".join(part.value if isinstance(part, ast.Constant) else "x" for part in node.values)
              for node in ast.walk(value) if isinstance(node, ast.JoinedStr)]
    return [kind for kind, pattern in _SRC_MARKDOWN_IN_TEXT if any(pattern.search(text) for text in texts)]


def markdown_in_inline_values(doc) -> list[tuple[int, str]]:
    """An inline value that is a plain str holding Markdown: Quarto escapes it, so the marks show.

    Static: the expression itself, or the chapter's last assignment to the name before the
    prose uses it, is searched for string literals carrying Markdown.
    """
    assigned: dict[str, list[tuple[int, ast.AST]]] = {}
    for cell in doc.python_cells:
        try:
            tree = ast.parse("\n".join(cell.code_lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign) and node.value is not None:
                for target in getattr(node, "targets", [getattr(node, "target", None)]):
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append((cell.code_line + node.lineno - 1, node.value))
    found = []
    for block in doc.markdown:
        for line, text in enumerate(block.lines, block.line):
            for match in INLINE_EXPRESSION.finditer(text):
                try:
                    value = ast.parse(match.group("expr"), mode="eval").body
                except SyntaxError:
                    continue
                if isinstance(value, ast.Name):
                    values = assigned.get(value.id, [])
                    values = [node for at, node in values if at < line] or [node for _, node in values]
                    if not values:
                        continue
                    value = values[-1]
                kinds = _markdown_kinds(value)
                if kinds:
                    found.append((line, f"inline value `{{python}} {match.group('expr')}` is a str carrying Markdown "
                        f"({', '.join(kinds)}); Quarto prints a str as plain text, so the reader sees the "
                        "marks: make the value plain text, or wrap it in IPython.display.Markdown"))
    return found


def unlabelled_mermaid(doc) -> list[tuple[int, str]]:
    """A ```{mermaid} diagram without `%%| label: fig-…`: Quarto's EPUB writes it as malformed XHTML."""
    found = []
    for cell in doc.cells:
        if cell.executable and cell.lang == "mermaid" and not str(cell.label or "").startswith("fig-"):
            found.append((cell.line, "mermaid diagram without `%%| label: fig-…`: Quarto 1.7's EPUB wraps an unlabelled "
                "diagram in markup that is not valid XHTML; label it as a figure and give it "
                "`%%| fig-cap:` and `%%| fig-alt:`"))
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
                found.append((first + offset, f"code line is {len(text)} characters; the book's code lines are at most {limit} "
                    "so that they fit the page"))
    return found


# ---------------------------------------------------------------------------
# The book's rules for saved code (the tangle only tangles; ruff checks the modules' style):
# importing a module has no side effects, a chapter imports only earlier chapters, and what
# `help()` shows (docstrings, comments) holds no Quarto syntax and only numbers the book has.

_CHAPTER_MODULE = re.compile(r"^ch\d{2}$")
_TYPED_REFERENCE = re.compile(
    r"\b(?P<kind>Equation|Figure|Table|Section)\s+(?P<number>\d+(?:\.\d+)+)\b"
    r"|\b(?P<chapter>Chapter|Appendix)\s+(?P<which>\d+|[A-Z])\b"
)
# Calls that do something when the module is imported (outside any function body).
_SIDE_EFFECT_CALLS = {"print", "open", "input", "exec", "eval", "display", "breakpoint", "exit", "quit"}
_SIDE_EFFECT_METHODS = {
    "show", "savefig", "manual_seed", "seed", "backward", "write", "write_text", "write_bytes",
    "mkdir", "unlink", "rmdir", "remove", "system", "makedirs", "download", "urlretrieve",
}
_SIDE_EFFECT_ROOTS = {"plt", "pyplot", "matplotlib", "subprocess", "shutil"}


def _describe(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _side_effect_call(node: ast.AST) -> ast.Call | None:
    """A call with an effect, evaluated at import time (lambda bodies excluded)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Lambda):
            stack.extend(current.args.defaults + [d for d in current.args.kw_defaults if d is not None])
            continue
        if isinstance(current, ast.Call):
            func, root = current.func, current.func
            while isinstance(root, ast.Attribute | ast.Call):
                root = root.value if isinstance(root, ast.Attribute) else root.func
            if (isinstance(func, ast.Name) and func.id in _SIDE_EFFECT_CALLS) or (isinstance(func, ast.Attribute) and (
                    func.attr in _SIDE_EFFECT_METHODS or getattr(root, "id", None) in _SIDE_EFFECT_ROOTS)):
                return current
        stack.extend(ast.iter_child_nodes(current))
    return None


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
_STATEMENT_NAMES = {ast.For: "this loop", ast.AsyncFor: "this loop", ast.While: "this loop",
                    ast.With: "this `with` block", ast.AsyncWith: "this `with` block", ast.Assert: "this assert"}


def _side_effects(statements: list[ast.stmt]) -> list[tuple[int, str]]:
    """(line, message) for each statement that does something when the module is imported."""
    found = []
    for stmt in statements:
        if isinstance(stmt, ast.If | ast.Try) or type(stmt).__name__ == "TryStar":
            handlers = [line for handler in getattr(stmt, "handlers", []) for line in handler.body]
            found += _side_effects(stmt.body + stmt.orelse + getattr(stmt, "finalbody", []) + handlers)
        elif isinstance(stmt, _DEFINITIONS):
            # what runs at import: decorators, defaults and bases of a definition, an assignment's value
            args = getattr(stmt, "args", None)
            parts = [*getattr(stmt, "decorator_list", []), *getattr(stmt, "bases", [])]
            parts += [keyword.value for keyword in getattr(stmt, "keywords", [])] + [getattr(stmt, "value", None)]
            parts += [*args.defaults, *args.kw_defaults] if args is not None else []
            call = next((hit for part in parts if part is not None and (hit := _side_effect_call(part))), None)
            if call is not None:
                found.append((stmt.lineno, f"`{_describe(call)}` runs when the module is imported; saved cells "
                              "must not have side effects"))
            if isinstance(stmt, ast.ClassDef):
                found += _side_effects(stmt.body)
        elif not (isinstance(stmt, ast.Import | ast.ImportFrom | ast.Pass) or type(stmt).__name__ == "TypeAlias"
                  or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))):  # a docstring, `...`
            what = _STATEMENT_NAMES.get(type(stmt)) or (
                f"`{_describe(stmt)}`" if isinstance(stmt, ast.Expr | ast.AugAssign) else "this statement")
            found.append((stmt.lineno, f"{what} runs when the module is imported; saved cells hold only imports, "
                          "functions, classes and constants (move it to a cell without `# @save`)"))
    return found


def _chapter_imports(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, module "chNN", how) for every import of a book chapter module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "longctx":
                continue
            if len(parts) == 1:
                for alias in node.names:
                    if _CHAPTER_MODULE.match(alias.name):
                        found.append((node.lineno, alias.name, f"from longctx import {alias.name}"))
            elif _CHAPTER_MODULE.match(parts[1]):
                found.append((node.lineno, parts[1], f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "longctx" and len(parts) > 1 and _CHAPTER_MODULE.match(parts[1]):
                    found.append((node.lineno, parts[1], f"import {alias.name}"))
    return found


def _book_references(numbering: Numbering) -> set[str]:
    """Every reference the book's numbering makes true: "Equation 3.1", "Section 3.2", "Chapter 3"."""
    texts = {target.text for target in numbering.targets.values() if target.number}
    texts |= {f"Section {number}" for number in numbering.heading_numbers.values() if "." in number}
    for info in numbering.chapters:
        if info.number is not None:
            texts.add(f"Appendix {info.number}" if info.entry.appendix else f"Chapter {info.number}")
    return texts


def _reading_problems(text: str, where: str, numbering: Numbering, references: set[str]) -> list[tuple[int, str]]:
    """(offset in text, message) for Quarto syntax, and references to nothing, in what `help()` shows."""
    found = []
    for match in CROSS_REFERENCE.finditer(text):
        target = numbering.targets.get(match.group("label"))
        advice = f'write "{target.text}"' if target is not None else "write the reference in words"
        found.append((match.start(), f"{where} holds the Quarto cross-reference `{match.group(0)}`, which "
                      f"`help()` shows as it is; {advice}"))
    for match in BRACKET.finditer(text):
        if not CROSS_REFERENCE.search(match.group(0)):
            found.append((match.start(), f"{where} holds the Quarto citation `{match.group(0)}`, which "
                          "`help()` shows as it is; name the work in words (authors, year)"))
    for match in INLINE_EXPRESSION.finditer(text):
        found.append((match.start(), f"{where} holds a Quarto inline value `{{python}}`, which never runs "
                      "there; state the value in words"))
    for match in _TYPED_REFERENCE.finditer(text):
        kind, number = (match.group("kind"), match.group("number")) if match.group("kind") else match.group("chapter", "which")
        if f"{kind} {number}" not in references:
            found.append((match.start(), f"{where} names {kind} {number}, which the book does not have "
                          "(its numbering has changed, or the number is a typo)"))
    return found


def _is_string(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _documented(tree: ast.Module):
    """(what, string statement) for every docstring: functions', classes' and attributes'."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _is_string(node.body[0]):
            yield f"the docstring of `{node.name}`", node.body[0]
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for before, stmt in itertools.pairwise(node.body):
                if isinstance(before, (ast.Assign, ast.AnnAssign)) and _is_string(stmt):
                    yield "an attribute's docstring", stmt


def saved_code_problems(doc, module: str, order: list[str], numbering: Numbering) -> list[tuple[int, str]]:
    """The book's rules for one chapter's code, as (line, message).

    Every Python cell imports only earlier chapters; each `# @save` cell has no side effects
    at import, and its docstrings and comments hold no Quarto syntax and name only numbers the
    book has ("Equation 3.1").
    """
    earlier = order[: order.index(module)] if module in order else order
    references = _book_references(numbering)
    found = []
    for cell in doc.python_cells:
        saved = cell.saved
        lines = cell.saved_code_lines if saved else cell.code_lines
        first = cell.saved_code_line if saved else cell.code_line
        source = "\n".join(text[len(cell.indent) :] if text.startswith(cell.indent) else text for text in lines)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # the tangle reports saved cells; execution reports the rest
        for line, other, how in _chapter_imports(tree):
            if other not in earlier:
                allowed = ", ".join(earlier) or "none: this is the first chapter"
                what = "this chapter's own module" if other == module else other
                found.append((first + line - 1, f"`{how}` imports {what}; a chapter may import only earlier chapters ({allowed})"))
        if not saved:
            continue
        found += [(first + line - 1, message) for line, message in _side_effects(tree.body)]
        for where, node in _documented(tree):
            text = node.value.value
            for offset, message in _reading_problems(text, where, numbering, references):
                found.append((first + node.lineno - 1 + text.count("\n", 0, offset), message))
        try:
            comments = [t for t in tokenize.generate_tokens(io.StringIO(source + "\n").readline) if t.type == tokenize.COMMENT]
        except (tokenize.TokenError, SyntaxError):  # pragma: no cover - the source compiled
            comments = []
        for token in comments:
            for _, message in _reading_problems(token.string, "a comment", numbering, references):
                found.append((first + token.start[0] - 1, message))
    return found
