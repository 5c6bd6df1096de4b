"""Tangle: the `# @save` cells of each chapter become `code/chNN/_generated.py` + `__init__.py`.

The rules are DESIGN.md's "The tangle rules". Everything is computed first; files are
written only when every chapter asked for is clean, each through a temporary file and
`os.replace`, so a broken chapter never leaves a half-written module and changes nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, ChapterEntry, write_atomic
from .qmd import Cell, Document, QmdError, parse_file

__all__ = [
    "Problem",
    "TangleResult",
    "ModuleOutput",
    "tangle_book",
    "tangle_document",
    "write_outputs",
    "stale_outputs",
]

GENERATED_NAME = "_generated.py"
INIT_NAME = "__init__.py"
_CHAPTER_MODULE = re.compile(r"^ch\d{2}$")

# Calls that do something when the module is imported (outside any function body).
_SIDE_EFFECT_CALLS = {"print", "open", "input", "exec", "eval", "display", "breakpoint", "exit", "quit"}
_SIDE_EFFECT_METHODS = {
    "show", "savefig", "manual_seed", "seed", "backward", "write", "write_text", "write_bytes",
    "mkdir", "unlink", "rmdir", "remove", "system", "makedirs", "download", "urlretrieve",
}
_SIDE_EFFECT_ROOTS = {"plt", "pyplot", "matplotlib", "subprocess", "shutil"}


@dataclass(frozen=True)
class Problem:
    """One error, located in a chapter."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class ModuleOutput:
    """The two files generated for one chapter."""

    entry: ChapterEntry
    module: str  # "ch03"
    files: dict[Path, str] = field(default_factory=dict)  # absolute path -> text
    public_names: list[str] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)


@dataclass
class TangleResult:
    outputs: list[ModuleOutput] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Block:
    cell: Cell
    first_line: int  # chapter line of the first emitted line
    lines: list[str]


def _dedent(cell: Cell, lines: list[str]) -> list[str]:
    if not cell.indent:
        return lines
    return [text[len(cell.indent) :] if text.startswith(cell.indent) else text for text in lines]


def _saved_blocks(doc: Document, problems: list[Problem]) -> list[_Block]:
    blocks = []
    for cell in doc.cells:
        if not cell.saved:
            continue
        if not cell.is_python:
            kind = f"```{cell.info}" if cell.info else "a plain ``` fence"
            problems.append(
                Problem(
                    doc.display,
                    cell.code_line,
                    f"`# @save` in a block that is not a Python cell ({kind}); only ```{{python}} cells can be saved",
                )
            )
            continue
        lines = _dedent(cell, cell.saved_code_lines)
        first = cell.saved_code_line
        while lines and not lines[0].strip():
            lines = lines[1:]
            first += 1
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if lines:
            blocks.append(_Block(cell, first, lines))
    return blocks


def _describe(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node we see
        text = type(node).__name__
    text = text.splitlines()[0] if text else type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _call_root(func: ast.AST) -> str | None:
    while isinstance(func, ast.Attribute):
        func = func.value
    if isinstance(func, ast.Call):
        return _call_root(func.func)
    return func.id if isinstance(func, ast.Name) else None


def _side_effect_call(node: ast.AST) -> ast.Call | None:
    """A call with an effect, evaluated at import time (lambda bodies excluded)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.Lambda):
            stack.extend(current.args.defaults + [d for d in current.args.kw_defaults if d is not None])
            continue
        if isinstance(current, ast.Call):
            func = current.func
            if isinstance(func, ast.Name) and func.id in _SIDE_EFFECT_CALLS:
                return current
            if isinstance(func, ast.Attribute) and (
                func.attr in _SIDE_EFFECT_METHODS or _call_root(func) in _SIDE_EFFECT_ROOTS
            ):
                return current
        stack.extend(ast.iter_child_nodes(current))
    return None


def _import_time_parts(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions of a definition that run at import: decorators, defaults, bases."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = stmt.args
        parts = list(stmt.decorator_list) + list(args.defaults) + [d for d in args.kw_defaults if d is not None]
        return parts
    if isinstance(stmt, ast.ClassDef):
        return list(stmt.decorator_list) + list(stmt.bases) + [k.value for k in stmt.keywords]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        return [stmt.value] if stmt.value is not None else []
    return []


def _side_effects(statements: list[ast.stmt], in_class: bool = False) -> list[tuple[int, str]]:
    """(line, message) for each statement that does something when the module is imported."""
    found = []
    for stmt in statements:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring or `...`
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            for part in _import_time_parts(stmt):
                call = _side_effect_call(part)
                if call is not None:
                    found.append(
                        (stmt.lineno, f"`{_describe(call)}` runs when the module is imported; saved cells must not have side effects")
                    )
                    break
            if isinstance(stmt, ast.ClassDef):
                found.extend(_side_effects(stmt.body, in_class=True))
            continue
        if type(stmt).__name__ == "TypeAlias":
            continue
        if isinstance(stmt, ast.If):
            found.extend(_side_effects(stmt.body + stmt.orelse, in_class))
            continue
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            inner = stmt.body + stmt.orelse + stmt.finalbody
            for handler in stmt.handlers:
                inner = inner + handler.body
            found.extend(_side_effects(inner, in_class))
            continue
        what = "this statement" if not isinstance(stmt, ast.Expr) else f"`{_describe(stmt)}`"
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            what = "this loop"
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            what = "this `with` block"
        elif isinstance(stmt, ast.Assert):
            what = "this assert"
        elif isinstance(stmt, ast.AugAssign):
            what = f"`{_describe(stmt)}`"
        found.append(
            (
                stmt.lineno,
                f"{what} runs when the module is imported; saved cells hold only imports, "
                "functions, classes and constants (move it to a cell without `# @save`)",
            )
        )
    return found


def _bound_names(stmt: ast.stmt) -> tuple[dict[str, str], dict[str, str]]:
    """Names a top-level statement binds: (defined name -> kind, imported name -> source)."""
    defined: dict[str, str] = {}
    imported: dict[str, str] = {}

    def targets(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            defined.setdefault(node.id, "assignment")
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                targets(element)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.setdefault(node.name, "function")
        elif isinstance(node, ast.ClassDef):
            defined.setdefault(node.name, "class")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                targets(target)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None or isinstance(node.target, ast.Name):
                targets(node.target)
        elif type(node).__name__ == "TypeAlias":
            targets(node.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                imported[name] = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    continue
                name = alias.asname or alias.name
                imported[name] = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
        elif isinstance(node, ast.If):
            for inner in node.body + node.orelse:
                visit(inner)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            for inner in node.body + node.orelse + node.finalbody:
                visit(inner)
            for handler in node.handlers:
                for inner in handler.body:
                    visit(inner)

    visit(stmt)
    return defined, imported


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


def _member_key(name: str) -> tuple[int, str, str]:
    """isort's / ruff's order-by-type key: CONSTANTS, then Classes, then functions."""
    if name.isupper() and len(name) > 1:
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return (kind, name.lower(), name)


def _chapter_title(doc: Document) -> str:
    title = doc.front_matter.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    for heading in doc.headings():
        if heading.level == 1:
            return heading.text
    return ""


def tangle_document(
    doc: Document,
    module: str,
    earlier: list[str],
    root: Path,
    later: list[str] | None = None,
    *,
    reuse_lint: bool = True,
) -> tuple[ModuleOutput | None, list[Problem]]:
    """Build one chapter's module text.

    Args:
        doc: the parsed chapter.
        module: its module name ("ch03").
        earlier: the modules of the chapters before it in `_quarto.yml` order.
        later: the modules of the chapters after it (only to word the error).
        reuse_lint: skip the pyflakes lint when the module on disk already holds exactly
            this text (tangle writes a module only after it passed the lint), which keeps a
            whole-book tangle fast when few chapters changed.
        root: the book root (files go to root/code/<module>/).

    Returns:
        (output, problems): output is None when there are problems.
    """
    problems: list[Problem] = []
    later = later or []
    blocks = _saved_blocks(doc, problems)

    def problem(line: int, message: str) -> None:
        problems.append(Problem(doc.display, line, message))

    future: list[str] = []
    defined_at: dict[str, int] = {}
    imported_from: dict[str, tuple[str, int]] = {}
    public: list[str] = []
    for block in blocks:
        source = "\n".join(block.lines) + "\n"
        try:
            tree = ast.parse(source, filename=doc.display)
        except SyntaxError as exc:
            line = block.first_line + (exc.lineno or 1) - 1
            problem(line, f"saved code does not compile: {exc.msg}")
            continue
        # `from __future__` must open the module: move it to the header, keep the line count.
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                text = ast.unparse(stmt)
                if text not in future:
                    future.append(text)
                for number in range(stmt.lineno - 1, (stmt.end_lineno or stmt.lineno)):
                    original = block.lines[number]
                    block.lines[number] = "# " + original.strip() + "  (moved to the top of the module)"
        for line, message in _side_effects(tree.body):
            problem(block.first_line + line - 1, message)
        for line, other, how in _chapter_imports(tree) if "longctx" in source else []:
            at = block.first_line + line - 1
            if other == module:
                problem(at, f"`{how}` imports this chapter's own module; a chapter may import only earlier chapters")
            elif other not in earlier:
                allowed = ", ".join(earlier) if earlier else "none: this is the first chapter"
                what = "a later chapter" if other in later else "which is not a chapter of this book"
                problem(
                    at,
                    f"`{how}` imports {other}, {what}; a chapter may import only earlier chapters ({allowed})",
                )
        for stmt in tree.body:
            defined, imported = _bound_names(stmt)
            # `try: import x / except ImportError: x = None` binds one name in one statement.
            imported = {name: how for name, how in imported.items() if name not in defined}
            at = block.first_line + stmt.lineno - 1
            for name in defined:
                if name in defined_at:
                    problem(
                        at,
                        f"top-level name `{name}` is already defined in saved code at "
                        f"{doc.display}:{defined_at[name]}; define each name once per chapter",
                    )
                elif name in imported_from:
                    source_text, line = imported_from[name]
                    problem(at, f"top-level name `{name}` is already bound by `{source_text}` at {doc.display}:{line}")
                else:
                    defined_at[name] = at
                    if not name.startswith("_"):
                        public.append(name)
            for name, source_text in imported.items():
                if name in defined_at:
                    problem(at, f"`{source_text}` rebinds `{name}`, defined in saved code at {doc.display}:{defined_at[name]}")
                elif name in imported_from and imported_from[name][0] != source_text:
                    previous, line = imported_from[name]
                    problem(at, f"`{source_text}` rebinds `{name}`, already bound by `{previous}` at {doc.display}:{line}")
                else:
                    imported_from.setdefault(name, (source_text, at))
    if any("does not compile" in item.message for item in problems):
        return None, _sorted(problems)

    title = _chapter_title(doc)
    described = f'{doc.display} ("{title}")' if title else doc.display
    header = [
        f"# Generated from {doc.display} by `python -m booktools tangle`.",
        "# Do not edit: change the chapter's `# @save` cells, then tangle again.",
        "# ruff: noqa: E402, F811, I001",
        f'"""Code saved from {_escape_docstring(described)}."""',
    ]
    if future:
        header += [""] + future
    out = list(header)
    mapping: list[tuple[int, int, int]] = []  # (generated first line, chapter first line, count)
    for block in blocks:
        out += ["", "", f"# {doc.display}:{block.first_line}"]
        mapping.append((len(out) + 1, block.first_line, len(block.lines)))
        out += block.lines
    generated = "\n".join(out) + "\n"

    def chapter_line(generated_line: int) -> int:
        for start, first, count in mapping:
            if start <= generated_line < start + count:
                return first + generated_line - start
        return blocks[0].first_line if blocks else 1

    try:
        tree = ast.parse(generated, filename=f"code/{module}/{GENERATED_NAME}")
    except SyntaxError as exc:
        problems.append(Problem(doc.display, chapter_line(exc.lineno or 1), f"saved code does not compile: {exc.msg}"))
        return None, _sorted(problems)
    existing = _read(root / "code" / module / GENERATED_NAME) if reuse_lint else None
    if existing == generated:
        undefined, unused = [], []
    else:
        undefined, unused = _lint(tree, doc.display, chapter_line)
    problems.extend(undefined)
    if problems:
        return None, _sorted(problems)

    public.sort(key=_member_key)
    init = [
        f"# Generated from {doc.display} by `python -m booktools tangle`.",
        "# Do not edit: change the chapter's `# @save` cells, then tangle again.",
        f'"""{_escape_docstring(title or module)}: the code saved from {doc.display}."""',
        "",
    ]
    if public:
        init.append("from ._generated import (")
        init += [f"    {name}," for name in public]
        init += [")", ""]
        init.append("__all__ = [")
        init += [f'    "{name}",' for name in public]
        init.append("]")
    else:
        init.append("__all__: list[str] = []")
    directory = root / "code" / module
    output = ModuleOutput(
        entry=ChapterEntry(doc.display, 0, False),
        module=module,
        files={directory / GENERATED_NAME: generated, directory / INIT_NAME: "\n".join(init) + "\n"},
        public_names=public,
        warnings=unused,
    )
    return output, []


def _escape_docstring(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def _sorted(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda item: (item.path, item.line))


def _lint(tree: ast.AST, display: str, chapter_line) -> tuple[list[Problem], list[Problem]]:
    """Lint the generated module with pyflakes.

    Returns:
        (undefined, unused): names used but never defined or imported (errors), and
        imports nothing in saved code uses (warnings: `make lint` rejects them).
    """
    from pyflakes import checker, messages

    lint = checker.Checker(tree, filename="_generated.py")
    found = []
    unused = []
    seen = set()
    for message in sorted(lint.messages, key=lambda m: (m.lineno, getattr(m, "col", 0))):
        if isinstance(message, messages.UnusedImport):
            unused.append(
                Problem(
                    display,
                    chapter_line(message.lineno),
                    f"`{message.message_args[0]}` is imported in saved code but no saved code uses it",
                )
            )
            continue
        if isinstance(message, (messages.UndefinedName, messages.UndefinedLocal)):
            name = message.message_args[0]
            line = chapter_line(message.lineno)
            if (line, name) in seen:
                continue
            seen.add((line, name))
            if isinstance(message, messages.UndefinedLocal):
                text = f"local variable `{name}` is used before it is assigned"
            else:
                text = (
                    f"saved code uses `{name}`, which no saved cell defines or imports "
                    "(the module cannot see names from cells without `# @save`)"
                )
            found.append(Problem(display, line, text))
    return found, unused


def tangle_book(book: Book, files: list[Path | str] | None = None) -> TangleResult:
    """Tangle every chapter `_quarto.yml` lists (or just `files`), without writing anything."""
    result = TangleResult()
    order = [entry.module for entry in book.module_entries]
    if files:
        selected = []
        for name in files:
            entry = book.entry_for(name)
            if entry is None:
                result.problems.append(Problem(str(name), 0, "not a chapter listed in _quarto.yml"))
            elif entry.module is None:
                result.problems.append(
                    Problem(entry.path, 0, "produces no module: only files named chNN-*.qmd are tangled")
                )
            else:
                selected.append(entry)
    else:
        selected = book.module_entries
    seen_modules: dict[str, str] = {}
    for entry in book.module_entries:
        if entry.module in seen_modules and seen_modules[entry.module] != entry.path:
            result.problems.append(
                Problem("_quarto.yml", entry.line, f"{entry.path} and {seen_modules[entry.module]} both make module {entry.module}")
            )
        seen_modules.setdefault(entry.module, entry.path)
    for entry in selected:
        path = book.root / entry.path
        if not path.is_file():
            result.warnings.append(f"_quarto.yml:{entry.line}: {entry.path} is listed but does not exist yet; skipped")
            continue
        try:
            doc = parse_file(path, book.root)
        except QmdError as exc:
            result.problems.append(Problem(exc.path, exc.line, exc.message))
            continue
        position = order.index(entry.module)
        output, problems = tangle_document(doc, entry.module, order[:position], book.root, order[position + 1 :])
        result.problems.extend(problems)
        if output is not None:
            output.entry = entry
            result.warnings.extend(str(item) for item in output.warnings)
            result.outputs.append(output)
    return result


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def stale_outputs(result: TangleResult) -> list[Path]:
    """Generated files whose contents on disk differ from what tangling gives."""
    return [path for output in result.outputs for path, text in output.files.items() if _read(path) != text]


def write_outputs(result: TangleResult) -> list[Path]:
    """Write every changed file (temporary file, then rename); returns the paths written."""
    written = []
    for path in stale_outputs(result):
        for output in result.outputs:
            if path in output.files:
                write_atomic(path, output.files[path])
                written.append(path)
    return written
