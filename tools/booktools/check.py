"""`check`: the book's integrity, every problem reported as `FILE:LINE: message`.

References name labels that exist and citations keys of the bibliography; labels are unique, use
the fig-/tbl-/eq-/sec- prefixes and name their chapter (`fig-ch03-…`, `sec-index-…`,
`sec-appendix-…`); figure cells have `fig-cap` and `fig-alt`, table cells `tbl-cap`; `_quarto.yml`
lists exactly the files in chapters/; saved code obeys the book's rules (`saved_code_problems`);
and nothing Quarto trips on. Whether the generated modules are current is the tangle's to say
(`tangle --check`; `make check` runs both).
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from pathlib import Path

from . import qmd
from .bib import bibliography_keys
from .book import Book
from .numbering import ChapterInfo, Numbering, compute_numbering
from .tangle import branches

CODE_LINE_LIMIT = 80
"""The longest line a chapter's code may have: 80 characters fit the text column of both
editions at 1280 px without scrolling (tests/test_quarto_edition.py measures it)."""


#: What a labelled figure or table cell must have, by its label's prefix.
_CAPTIONS = {"fig": ("figure", ("fig-cap", "fig-alt")), "tbl": ("table", ("tbl-cap",))}


def _blank_out(pattern: re.Pattern, text: str) -> str:
    """`text` with every match of `pattern` replaced by spaces (newlines kept, so offsets stay)."""
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)


def check_book(book: Book) -> list[str]:
    """Every integrity problem of the book, as `FILE:LINE: message` lines (sorted)."""
    problems: list[tuple[str, int, str]] = []
    seen: dict[str, int] = {}
    for entry in book.entries:
        if not (book.root / entry.path).is_file():
            problems.append(("_quarto.yml", entry.line, f"{entry.path} is listed but does not exist"))
        if entry.path in seen:
            problems.append(("_quarto.yml", entry.line, f"{entry.path} is listed twice (first at line {seen[entry.path]})"))
        seen.setdefault(entry.path, entry.line)
    for path in sorted((book.root / "chapters").glob("*.qmd")):
        if (name := path.relative_to(book.root).as_posix()) not in seen:
            problems.append((name, 1, "this chapter file is not listed in _quarto.yml (book.chapters or book.appendices)"))
    bib = bibliography_keys(book.bibliography, problems)
    bib_names = ", ".join(path.name for path in book.bibliography) or "no bibliography in _quarto.yml"
    numbering = compute_numbering(book)
    problems += [(error.path, error.line, error.message) for error in numbering.problems]
    problems += [(repeat.file, repeat.line, f"label {repeat.label} is already used at {first.file}:{first.line}")
                 for repeat, first in numbering.duplicates]
    for info, line, label, allowed in numbering.labels:
        path, name, prefix = info.display, Path(info.display).name, label.split("-", 1)[0]
        # what the label must name after its prefix: "ch03", "index", "appendix"
        scope = info.entry.module or ("index" if name == "index.qmd" else "appendix" if name.startswith("appendix") else None)
        if not allowed:
            problems.append((path, line, f"label {label} is on an image or a div; the book's figures and tables are "
                             "labelled cells and pipe tables, the ones the tools number as Quarto does"))
        elif prefix not in allowed:
            problems.append((path, line, f"label {label} should start with {' or '.join(f'{kind}-' for kind in allowed)}"))
        elif scope is not None and not label.startswith(f"{prefix}-{scope}-") and not (
            scope == "appendix" and re.match(r"ch\d\d-", label.split("-", 1)[1])  # a chapter's section moved there
        ):
            problems.append((path, line, f"label {label} should name its chapter: {prefix}-{scope}-..."))
    for info in (info for info in numbering.chapters if info.document is not None):
        found = _document_problems(info, numbering, bib, bib_names)
        problems += [(info.display, line, message) for line, message in found]
    return [f"{path}:{line}: {message}" for path, line, message in sorted(set(problems))]


def _document_problems(info: ChapterInfo, numbering: Numbering, bib, bib_names) -> list[tuple[int, str]]:
    """One file's problems (check_book reads its labels): references, captions, Quarto's pitfalls, saved code."""
    doc, module = info.document, info.entry.module
    found = maths_with_space_before_closing_dollar(doc) + markdown_in_inline_values(doc)
    found += saved_code_problems(doc, module, numbering) if module else []
    if doc.front_matter_lines and not doc.front_matter:
        found.append((1, "empty front matter block (`---` then `---`): Pandoc reads it as a rule and a paragraph "
                      "holding a dash, which Quarto turns into a chapter of its own; delete both lines"))

    def references(text: str, line: int) -> None:
        for match in qmd.REFERENCE.finditer(_blank_out(qmd.CODE_SPAN, text)):
            key = match.group("key")
            if key.startswith(qmd.CROSSREF_PREFIXES) and key not in numbering.targets:
                found.append((line, f"cross-reference @{key} points at no label"))
            elif not key.startswith(qmd.CROSSREF_PREFIXES) and key not in bib:
                found.append((line, f"citation @{key} is not in the bibliography ({bib_names})"))

    for item in info.items:
        if item.kind == "cell":
            cell = item.cell
            if cell.saved and module is None:
                found.append((cell.code_line, "`# @save` in a file that produces no module (only chapters/chNN-*.qmd do)"))
            if cell.executable and cell.lang == "mermaid" and not (cell.label or "").startswith("fig-"):
                found.append((cell.line, "mermaid diagram without `%%| label: fig-…`: Quarto 1.7's EPUB wraps an "
                              "unlabelled diagram in markup that is not valid XHTML; label it as a figure and give it "
                              "`%%| fig-cap:` and `%%| fig-alt:`"))
            if not cell.executable or cell.is_python:  # code the reader sees ({mermaid} is drawn)
                first, lines = (cell.code_line, cell.code_lines) if cell.executable else (cell.line + 1, cell.lines)
                found += [(line, f"code line is {len(text)} characters; the book's code lines are at most "
                           f"{CODE_LINE_LIMIT} so that they fit the page")
                          for line, text in enumerate(lines, first) if len(text) > CODE_LINE_LIMIT]
            if not cell.executable:
                continue
            kind, wanted = _CAPTIONS.get((cell.label or "").split("-", 1)[0], ("", ()))
            found += [(cell.line, f"{kind} cell {cell.label} has no `#| {option}:`") for option in wanted
                      if not cell.option(option).strip()]
            for option in ("fig-cap", "tbl-cap", "fig-alt"):
                if isinstance(cell.options.get(option), str):
                    references(cell.options[option], cell.line)
        elif item.kind == "heading":
            if "$" in item.heading.text:  # EPUBCheck refuses MathML in nav
                found.append((item.line, "maths in a heading: the EPUB's contents would hold MathML"))
            if any(div.callout_type for div in item.divs):
                found.append((item.line, "a heading inside a callout, which Quarto would take for the callout's "
                              "title: give the callout a `title=\"...\"` attribute instead"))
            references(item.heading.text, item.line)
        elif item.kind == "text":
            text = qmd.EQUATION_LABEL.sub("", item.text)
            references(re.sub(r"\{#[^}]*\}\s*$", "", text), item.line)
    return found


# What Quarto and Pandoc trip on across lines (a cell's own and a heading's are in _document_problems).

# Markdown a plain str value would carry to the reader as raw characters.
_MARKDOWN_IN_TEXT = (
    ("backticks", re.compile(r"`")),
    ("`*…*` emphasis", re.compile(r"(?<![*\\])(\*\*?)(?=[^\s*])[^\n]*?(?<=[^\s*\\])\1")),
    ("`_…_` emphasis", re.compile(r"(?<![\w\\])(__?)(?=[^\s_])[^\n]*?(?<=[^\s_\\])\1(?!\w)")),
    ("a `[…](…)` link", re.compile(r"\[[^\]\n]+\]\([^)\n]+\)")),
    ("`$…$` maths", re.compile(r"(?<![\\$])\$(?=[^\s$])[^$\n]*?(?<=[^\s\\])\$(?!\$)")),
)


def maths_with_space_before_closing_dollar(doc) -> list[tuple[int, str]]:
    """`$j = $`: Pandoc's inline maths must end on a non-space, so it prints both `$` as text."""
    found = []
    for block in doc.markdown:
        text = _blank_out(qmd.DISPLAY_MATH, _blank_out(qmd.CODE_SPAN, block.text.replace("\\$", "  ")))
        offset = 0
        for paragraph in re.split(r"(\n[ \t]*\n)", text):
            dollars = [m.start() for m in re.finditer(r"\$", paragraph)]
            for opening, closing in zip(dollars[0::2], dollars[1::2], strict=False):
                if paragraph[closing - 1].isspace() and not paragraph[opening + 1].isspace():
                    span = " ".join(paragraph[opening : closing + 1].split())
                    found.append((block.line + text.count("\n", 0, offset + closing), f"maths span {span} has a space "
                                  "before its closing `$`, so Pandoc prints it as text; end the span on a non-space "
                                  "character (`$x$ = …`)"))
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
    return [kind for kind, pattern in _MARKDOWN_IN_TEXT if any(pattern.search(text) for text in texts)]


def markdown_in_inline_values(doc) -> list[tuple[int, str]]:
    """An inline value that is a plain str holding Markdown: Quarto escapes it, so the marks show. The
    expression, or the chapter's last assignment to the name before the prose uses it, is searched."""
    assigned: dict[str, list[tuple[int, ast.AST]]] = {}
    for cell in doc.python_cells:
        try:
            tree = ast.parse(cell.code)
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
            for match in qmd.INLINE_EXPRESSION.finditer(text):
                try:
                    value = ast.parse(match.group("expr"), mode="eval").body
                except SyntaxError:
                    continue
                if isinstance(value, ast.Name):  # its last assignment before the prose, else the chapter's last
                    values = assigned.get(value.id, [])
                    value = next((node for at, node in reversed(values) if at < line), values[-1][1] if values else None)
                kinds = _markdown_kinds(value) if value is not None else []
                if kinds:
                    found.append((line, f"inline value `{{python}} {match.group('expr')}` is a str carrying Markdown "
                                  f"({', '.join(kinds)}); Quarto prints a str as plain text, so the reader sees the "
                                  "marks: make the value plain text, or wrap it in IPython.display.Markdown"))
    return found


# The book's rules for saved code (ruff checks the modules' style): importing a module has no side
# effects, a chapter imports only earlier chapters, and what `help()` shows (docstrings, comments)
# holds no Quarto syntax and only numbers the book has.

_CHAPTER_MODULE = re.compile(r"^longctx\.ch\d{2}(?:\.|$)")
_TYPED_REFERENCE = re.compile(
    r"\b(?P<kind>Equation|Figure|Table|Section)\s+(?P<number>\d+(?:\.\d+)+)\b"
    r"|\b(?P<chapter>Chapter|Appendix)\s+(?P<which>\d+|[A-Z])\b"
)
# Calls that do something when the module is imported (outside any function body).
_SIDE_EFFECT_CALLS = {"print", "open", "input", "exec", "eval", "display", "breakpoint", "exit", "quit"}
_SIDE_EFFECT_METHODS = {"show", "savefig", "manual_seed", "seed", "backward", "write", "write_text", "write_bytes",
                        "mkdir", "unlink", "rmdir", "remove", "system", "makedirs", "download", "urlretrieve"}
_SIDE_EFFECT_ROOTS = {"plt", "pyplot", "matplotlib", "subprocess", "shutil"}
_STATEMENT_NAMES = {ast.For: "this loop", ast.AsyncFor: "this loop", ast.While: "this loop",
                    ast.With: "this `with` block", ast.AsyncWith: "this `with` block", ast.Assert: "this assert"}


def _describe(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


def _side_effect_call(node: ast.AST) -> ast.Call | None:
    """The first call with an effect that evaluating `node` at import time makes (lambda bodies excluded)."""
    if isinstance(node, ast.Call):
        func, root = node.func, node.func
        while isinstance(root, ast.Attribute | ast.Call):
            root = root.value if isinstance(root, ast.Attribute) else root.func
        if (isinstance(func, ast.Name) and func.id in _SIDE_EFFECT_CALLS) or (isinstance(func, ast.Attribute) and (
                func.attr in _SIDE_EFFECT_METHODS or getattr(root, "id", None) in _SIDE_EFFECT_ROOTS)):
            return node
    children = node.args.defaults + node.args.kw_defaults if isinstance(node, ast.Lambda) else ast.iter_child_nodes(node)
    return next((call for child in children if child is not None and (call := _side_effect_call(child))), None)


def _side_effects(statements: list[ast.stmt]) -> list[tuple[int, str]]:
    """(line, message) for each statement that does something when the module is imported."""
    found = []
    for stmt in statements:
        if isinstance(stmt, ast.If | ast.Try | ast.TryStar):
            found += _side_effects(branches(stmt))
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Assign | ast.AnnAssign):
            # what runs at import: all of a definition but its body (decorators, defaults, bases, annotations)
            parts = [node for node in ast.iter_child_nodes(stmt) if not isinstance(node, ast.stmt)]
            call = next((hit for part in parts if (hit := _side_effect_call(part))), None)
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
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, f"import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "longctx":
            found += [(node.lineno, f"longctx.{alias.name}", f"from longctx import {alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, f"from {node.module} import ..."))
    return [(line, name.split(".")[1], how) for line, name, how in found if _CHAPTER_MODULE.match(name)]


def _reading_problems(text: str, where: str, numbering: Numbering, references: set[str]) -> list[tuple[int, str]]:
    """(offset in text, message) for Quarto syntax, and references to nothing, in what `help()` shows."""
    found = []
    for match in qmd.CROSS_REFERENCE.finditer(text):
        target = numbering.targets.get(match.group("label"))
        advice = f'write "{target.text}"' if target is not None else "write the reference in words"
        found.append((match.start(), f"{where} holds the Quarto cross-reference `{match.group(0)}`, which "
                      f"`help()` shows as it is; {advice}"))
    for match in qmd.BRACKET.finditer(text):
        if not qmd.CROSS_REFERENCE.search(match.group(0)):
            found.append((match.start(), f"{where} holds the Quarto citation `{match.group(0)}`, which "
                          "`help()` shows as it is; name the work in words (authors, year)"))
    for match in qmd.INLINE_EXPRESSION.finditer(text):
        found.append((match.start(), f"{where} holds a Quarto inline value `{{python}}`, which never runs "
                      "there; state the value in words"))
    for match in _TYPED_REFERENCE.finditer(text):
        kind, number = match.group("kind", "number") if match.group("kind") else match.group("chapter", "which")
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


def saved_code_problems(doc, module: str, numbering: Numbering) -> list[tuple[int, str]]:
    """One chapter's code against the book's rules, as (line, message): its cells import only earlier
    chapters; a `# @save` cell does nothing at import, and what `help()` shows of it is plain prose."""
    order = [info.entry.module for info in numbering.chapters if info.entry.module]
    earlier = order[: order.index(module)]  # and a later page's unsaved cells, its chapter's earlier pages
    later_page = any(info.entry.module == module for info in numbering.chapters[: next(
        index for index, info in enumerate(numbering.chapters) if info.document is doc)])
    references = {target.text for target in numbering.targets.values() if target.number}
    references |= {f"Section {number}" for number in numbering.heading_numbers.values() if "." in number}
    references |= {info.name for info in numbering.chapters if info.number is not None}
    found = []
    for cell in doc.python_cells:
        first, source = cell.code_line, cell.code
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue  # the tangle reports saved cells; execution reports the rest
        for line, other, how in _chapter_imports(tree):
            if other not in earlier and not (other == module and later_page and not cell.saved):
                allowed = ", ".join(earlier) or "none: this is the first chapter"
                what = "this chapter's own module" if other == module else other
                found.append((first + line - 1, f"`{how}` imports {what}; a chapter may import only earlier chapters ({allowed})"))
        if not cell.saved:
            continue
        found += [(first + line - 1, message) for line, message in _side_effects(tree.body)]
        for where, node in _documented(tree):
            for offset, message in _reading_problems(node.value.value, where, numbering, references):
                found.append((first + node.lineno - 1 + node.value.value.count("\n", 0, offset), message))
        for token in tokenize.generate_tokens(io.StringIO(source + "\n").readline):
            if token.type == tokenize.COMMENT:
                for _, message in _reading_problems(token.string, "a comment", numbering, references):
                    found.append((first + token.start[0] - 1, message))
    return found
