"""Tangle: the `# @save` cells of each chapter become `code/chNN/_generated.py` + `__init__.py`.

The rules are DESIGN.md's "The tangle rules". The generated module reads like a library: the
saved cells' top-level imports come first, once each, sorted as ruff's isort rules want them;
then each saved block under a `# chapters/FILE.qmd:LINE` comment naming its first line. Its
docstrings hold no Quarto syntax, only numbers the book has ("Equation 3.1"), in Google style.
Everything is computed first; files are written only when every chapter asked for is
clean, each through a temporary file and `os.replace`, so a broken chapter never leaves a
half-written module and changes nothing.
"""

from __future__ import annotations

import ast
import inspect
import io
import itertools
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, ChapterEntry, write_atomic
from .numbering import Numbering
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


# ---------------------------------------------------------------------------
# Imports hoisted to the top of the module, sorted as ruff's isort rules (I001, with the
# settings of pyproject.toml and code/ruff.toml) want them. Written here rather than by
# calling ruff, so that a reader can tangle without it; tests compare the two.

FIRST_PARTY = frozenset({"longctx"})
"""Top-level packages that are the book's own: the last section of the imports."""

IMPORT_WIDTH = 80
"""A `from` import longer than this is wrapped one name a line, with a trailing comma
(ruff's "magic trailing comma" keeps it so): the generated module fits the page as the
chapters' code does."""

_SECTIONS = ("future", "stdlib", "third-party", "first-party", "local")


def _natural(text: str) -> tuple:
    """Natural order, as ruff sorts: `item9` before `item10`, otherwise character by character."""
    # A run of digits compares by its value with another run, and as a digit with any other
    # character (no character sits between "0" and "9", so the first digit decides).
    return tuple((ord("0"), int(part)) if part.isdigit() else (ord(part), 0) for part in re.findall(r"\d+|\D", text))


def _member_key(name: str) -> tuple[int, str, str]:
    """isort's / ruff's order-by-type key: CONSTANTS, then Classes, then functions."""
    if name.isupper() and len(name) > 1:
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return (kind, name.lower(), name)


def _alias_key(alias: tuple[str, str | None]) -> tuple:
    name, asname = alias
    kind, lower, original = _member_key(name)
    return (kind, _natural(lower), original, _natural(asname.lower()) if asname else (), asname or "")


def _module_key(module: str) -> tuple:
    return (_natural(module.lower()), module)


@dataclass
class _Imports:
    """Every top-level import of a chapter's saved cells, de-duplicated."""

    plain: set[tuple[str, str | None]] = field(default_factory=set)  # import a.b as c
    members: dict[tuple[int, str], set[tuple[str, str | None]]] = field(default_factory=dict)

    def add(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            self.plain.update((alias.name, alias.asname) for alias in stmt.names)
        else:
            names = self.members.setdefault((stmt.level, stmt.module or ""), set())
            names.update((alias.name, alias.asname) for alias in stmt.names)

    @staticmethod
    def _section(module: str, level: int) -> str:
        if level:
            return "local"
        top = module.split(".")[0]
        if top == "__future__":
            return "future"
        if top in FIRST_PARTY:
            return "first-party"
        # The running Python's list; it agrees with ruff's for every module the book imports
        # (they differ only on modules a newer Python removed, such as `imghdr`).
        return "stdlib" if top in sys.stdlib_module_names else "third-party"

    def lines(self) -> list[str]:
        """The import block: sections apart, `import x` before `from x import` in each."""
        sections: dict[str, tuple[list, list]] = {name: ([], []) for name in _SECTIONS}
        for module, asname in self.plain:
            text = f"import {module}" + (f" as {asname}" if asname else "")
            key = (_module_key(module), _natural((asname or "").lower()), asname or "")
            sections[self._section(module, 0)][0].append((key, [text]))
        for (level, module), names in self.members.items():
            # ruff's default (combine-as-imports = false): each `a as b` is a statement of its own.
            groups = [sorted(alias for alias in names if alias[1] is None)]
            groups += [[alias] for alias in sorted(alias for alias in names if alias[1] is not None)]
            for group in groups:
                if not group:
                    continue
                group.sort(key=_alias_key)
                where = "." * level + module
                names_text = [name + (f" as {asname}" if asname else "") for name, asname in group]
                text = f"from {where} import {', '.join(names_text)}"
                if len(text) > IMPORT_WIDTH:
                    text_lines = [f"from {where} import ("] + [f"    {name}," for name in names_text] + [")"]
                else:
                    text_lines = [text]
                # Relative imports: furthest first (`..` before `.`), ruff's default.
                key = (-level, _module_key(module), _alias_key(group[0]))
                sections[self._section(module, level)][1].append((key, text_lines))
        out: list[str] = []
        for name in _SECTIONS:
            plain, froms = sections[name]
            if not plain and not froms:
                continue
            if out:
                out.append("")
            for _, text_lines in sorted(plain, key=lambda item: item[0]) + sorted(froms, key=lambda item: item[0]):
                out += text_lines
        return out


def _comment_lines(source: str) -> set[int]:
    """The lines of `source` (1-based) that hold a comment."""
    found = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT:
                found.add(token.start[0])
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - the source compiled
        pass
    return found


def _hoist_imports(block: _Block, tree: ast.Module, imports: _Imports, problem) -> list[_Block]:
    """Move the block's top-level imports into `imports`; return the code left, in runs.

    Each run keeps its exact chapter lines, so the `# chapters/FILE.qmd:LINE` comment
    written before it still names the line of its first statement. Imports inside
    functions, `if` or `try` blocks stay where they are.
    """
    removed: set[int] = set()
    for stmt in tree.body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        span = set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        at = block.first_line + stmt.lineno - 1
        text = "\n".join(block.lines[number - 1] for number in sorted(span))
        if any(other is not stmt and {other.lineno, other.end_lineno or other.lineno} & span for other in tree.body):
            problem(at, "an import shares its line with other code; give it a line of its own "
                    "(saved imports move to the top of the module)")
        elif "#" in text and _comment_lines(text.strip() + "\n"):
            problem(at, "a comment on a saved import would be lost: saved imports move to the top of "
                    "the module; put the comment on the code that uses the import, or in the prose")
        else:
            imports.add(stmt)
            removed |= span
    runs: list[_Block] = []
    current: list[tuple[int, str]] = []

    def flush() -> None:
        while current and not current[0][1].strip():
            current.pop(0)
        while current and not current[-1][1].strip():
            current.pop()
        if current:
            runs.append(_Block(block.cell, block.first_line + current[0][0] - 1, [text for _, text in current]))
        current.clear()

    for number, text in enumerate(block.lines, start=1):
        if number in removed:
            flush()
        else:
            current.append((number, text))
    flush()
    return runs


def _opens_definition(lines: list[str]) -> bool:
    """Whether the first statement of `lines` is a function or class (or its decorator)."""
    for text in lines:
        if text.strip() and not text.lstrip().startswith("#"):
            return text.startswith(("def ", "async def ", "class ", "@"))
    return False


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
    numbering: Numbering | None = None,
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
        numbering: the book's numbering; with it, every "Equation 3.1", "Section 3.2",
            "Figure 3.1", "Table 3.1", "Chapter 3" in a docstring or comment must exist,
            and a Quarto label found there is named with the words to write instead.

    Returns:
        (output, problems): output is None when there are problems.
    """
    problems: list[Problem] = []
    later = later or []
    blocks = _saved_blocks(doc, problems)

    def problem(line: int, message: str) -> None:
        problems.append(Problem(doc.display, line, message))

    imports = _Imports()
    segments: list[_Block] = []
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
        segments += _hoist_imports(block, tree, imports, problem)
    if any("does not compile" in item.message for item in problems):
        return None, _sorted(problems)

    title = _chapter_title(doc)
    described = f'{doc.display} ("{title}")' if title else doc.display
    out = [
        f"# Generated from {doc.display} by `python -m booktools tangle`.",
        "# Do not edit: change the chapter's `# @save` cells, then tangle again.",
        f'"""Code saved from {_escape_docstring(described)}."""',
    ]
    import_lines = imports.lines()
    if import_lines:
        out += [""] + import_lines
    mapping: list[tuple[int, int, int]] = []  # (generated first line, chapter first line, count)
    for index, segment in enumerate(segments):
        # Two blank lines between blocks; after the imports, one unless a definition follows
        # (ruff's isort: `lines-after-imports` left automatic).
        gap = 2 if index or not import_lines or _opens_definition(segment.lines) else 1
        out += [""] * gap + [f"# {doc.display}:{segment.first_line}"]
        mapping.append((len(out) + 1, segment.first_line, len(segment.lines)))
        out += segment.lines
    generated = "\n".join(out) + "\n"

    def chapter_line(generated_line: int) -> int:
        for start, first, count in mapping:
            if start <= generated_line < start + count:
                return first + generated_line - start
        return segments[0].first_line if segments else (blocks[0].first_line if blocks else 1)

    try:
        tree = ast.parse(generated, filename=f"code/{module}/{GENERATED_NAME}")
    except SyntaxError as exc:
        problems.append(Problem(doc.display, chapter_line(exc.lineno or 1), f"saved code does not compile: {exc.msg}"))
        return None, _sorted(problems)
    existing = _read(root / "code" / module / GENERATED_NAME) if reuse_lint else None
    if existing == generated:
        undefined, unused = [], []
    else:
        undefined, unused = _lint(tree, doc.display, chapter_line, imported_from)
    problems.extend(undefined)
    # Always, not only when the text changed: the book's numbering can change around it.
    problems.extend(_reading_problems(tree, generated, doc.display, chapter_line, numbering))
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


def _import_line(description: str, imported_from: dict[str, tuple[str, int]]) -> int | None:
    """The chapter line of the import pyflakes describes ("math", "torch.nn.functional as F")."""
    if " as " in description:
        candidates = [description.rsplit(" as ", 1)[1]]
    else:
        parts = description.split(".")
        candidates = [parts[-1], parts[0]]
    for name in candidates:
        if name in imported_from:
            return imported_from[name][1]
    return None


def _lint(
    tree: ast.AST, display: str, chapter_line, imported_from: dict[str, tuple[str, int]] | None = None
) -> tuple[list[Problem], list[Problem]]:
    """Lint the generated module with pyflakes.

    Returns:
        (errors, unused): names used but never defined or imported, and names defined
        twice where the first definition is never used (a chapter that saves two versions
        of one function or method), as errors; imports nothing in saved code uses, as
        warnings (`make lint` rejects them).
    """
    from pyflakes import checker, messages

    imported_from = imported_from or {}
    lint = checker.Checker(tree, filename="_generated.py")
    found = []
    unused = []
    seen = set()
    for message in sorted(lint.messages, key=lambda m: (m.lineno, getattr(m, "col", 0))):
        if isinstance(message, messages.UnusedImport):
            description = message.message_args[0]
            line = _import_line(description, imported_from) or chapter_line(message.lineno)
            unused.append(
                Problem(display, line, f"`{description}` is imported in saved code but no saved code uses it")
            )
            continue
        if isinstance(message, messages.RedefinedWhileUnused):
            name, first = message.message_args
            found.append(
                Problem(
                    display,
                    chapter_line(message.lineno),
                    f"`{name}` is defined again here, and its definition at {display}:{chapter_line(first)} "
                    "is never used; save only the final version (one definition per name)",
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


# ---------------------------------------------------------------------------
# Docstrings and comments read by `help()`, an editor and the API appendix, not by Quarto:
# no Quarto syntax in them, numbers that exist in the book, and one docstring style
# (Google's: a one-line summary, then Args: / Returns: / Raises: ...).

_QUARTO_REFERENCE = re.compile(r"(?<![\w.@])-?@(?P<label>(?:eq|sec|fig|tbl)-[A-Za-z0-9_-]*[A-Za-z0-9])")
_QUARTO_CITATION = re.compile(r"\[-?@[A-Za-z0-9_][^\]\s;,]*")
_QUARTO_INLINE = re.compile(r"`?\{python\}")
_TYPED_REFERENCE = re.compile(
    r"\b(?P<kind>Equation|Figure|Table|Section)\s+(?P<number>\d+(?:\.\d+)+)\b"
    r"|\b(?P<chapter>Chapter|Appendix)\s+(?P<which>\d+|[A-Z])\b"
)
_GOOGLE_SECTIONS = {
    "Args", "Attributes", "Returns", "Yields", "Raises", "Examples", "Example", "Note", "Notes",
    "Warning", "Warnings", "See Also", "Todo", "References", "Methods",
}
_OTHER_SECTIONS = {
    "Arguments": "Args", "Parameters": "Args", "Params": "Args", "Keyword Arguments": "Args",
    "Return": "Returns", "Yield": "Yields", "Raise": "Raises", "Throws": "Raises", "Exceptions": "Raises",
}
_SECTION_HEADER = re.compile(r"^(?P<name>[A-Z][A-Za-z ]*):\s*$")
_REST_FIELD = re.compile(r"^\s*:(?:param|type|returns?|rtype|raises?|ivar|var)\b")
_ENTRY = re.compile(r"^    (?P<names>\*{0,2}\w+(?:, \*{0,2}\w+)*): ")
_SECOND_ENTRY = re.compile(r"\.\s+(?P<names>\*{0,2}\w+(?:, \*{0,2}\w+)*): ")


def _book_references(numbering: Numbering) -> set[str]:
    """Every reference the book's numbering makes true: "Equation 3.1", "Section 3.2", "Chapter 3"."""
    texts = {target.text for target in numbering.targets.values() if target.number}
    texts |= {f"Section {number}" for number in numbering.heading_numbers.values() if "." in number}
    for info in numbering.chapters:
        if info.number is not None:
            texts.add(f"Appendix {info.number}" if info.entry.appendix else f"Chapter {info.number}")
    return texts


def _text_problems(text: str, where: str, numbering: Numbering | None, references: set[str]) -> list[tuple[int, str]]:
    """(offset in text, message) for Quarto syntax and references to nothing in `text`."""
    found = []
    for match in _QUARTO_REFERENCE.finditer(text):
        label = match.group("label")
        target = numbering.targets.get(label) if numbering is not None else None
        advice = f'write "{target.text}"' if target is not None else "write the reference in words"
        found.append(
            (match.start(), f"{where} holds the Quarto cross-reference `@{label}`, which `help()` shows "
             f"as it is; {advice}")
        )
    for match in _QUARTO_CITATION.finditer(text):
        found.append(
            (match.start(), f"{where} holds the Quarto citation `{match.group(0)}]`, which `help()` shows "
             "as it is; name the work in words (authors, year)")
        )
    for match in _QUARTO_INLINE.finditer(text):
        found.append(
            (match.start(), f"{where} holds a Quarto inline value `{{python}}`, which never runs there; "
             "state the value in words")
        )
    if numbering is not None:
        for match in _TYPED_REFERENCE.finditer(text):
            if match.group("kind"):
                reference = f"{match.group('kind')} {match.group('number')}"
            else:
                reference = f"{match.group('chapter')} {match.group('which')}"
            if reference not in references:
                found.append(
                    (match.start(), f"{where} names {reference}, which the book does not have "
                     "(its numbering has changed, or the number is a typo)")
                )
    return found


def _docstring_style(doc: str, where: str) -> list[tuple[int, str]]:
    """(line offset, message) where a docstring leaves Google style, the book's one style."""
    lines = inspect.cleandoc(doc).split("\n")
    found = []
    if len(lines) > 1 and lines[1].strip():
        found.append(
            (1, f"{where}: the summary runs over more than one line; open with a one-line summary, "
             "then a blank line (Google style, the book's)")
        )
    section = None
    for offset, line in enumerate(lines):
        header = _SECTION_HEADER.match(line)
        if header and header.group("name") in _OTHER_SECTIONS:
            name = header.group("name")
            found.append((offset, f"{where}: `{name}:` is not a Google-style section; write `{_OTHER_SECTIONS[name]}:`"))
        if header:
            section = header.group("name")
            continue
        if line and not line.startswith(" "):
            section = None
        if re.match(r"^\s*-{3,}\s*$", line) or _REST_FIELD.match(line):
            found.append(
                (offset, f"{where}: `{line.strip()}` is NumPy or reST docstring syntax; the book writes "
                 "Google style (`Args:` with one `name: description` entry a line)")
            )
        entry = _ENTRY.match(line) if section in ("Args", "Attributes") else None
        if entry is not None:
            second = _SECOND_ENTRY.search(line, entry.end())
            if second is not None:
                found.append(
                    (offset, f"{where}: `{entry.group('names')}` and `{second.group('names')}` share one "
                     f"line of `{section}:`; give each entry a line of its own")
                )
    return found


def _comments(tree: ast.Module, generated: str) -> list[tuple[int, str]]:
    """(line, text) of each comment in `generated`, found without tokenizing the whole module.

    A `#` starts a comment unless a string literal of the parsed module covers it; only lines
    holding a `#` are looked at, and AST columns are UTF-8 byte offsets.
    """
    lines = generated.split("\n")
    candidates = {number for number, text in enumerate(lines, start=1) if "#" in text}
    if not candidates:
        return []
    spans = [
        (node.lineno, node.col_offset, node.end_lineno or node.lineno, node.end_col_offset or 0)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))
    ]
    found = []
    for number in sorted(candidates):
        encoded = lines[number - 1].encode("utf-8")
        column = encoded.find(b"#")
        while column != -1:
            inside = any(
                (first, first_col) <= (number, column) < (last, last_col) for first, first_col, last, last_col in spans
            )
            if not inside:
                found.append((number, encoded[column:].decode("utf-8")))
                break
            column = encoded.find(b"#", column + 1)
    return found


def _definitions(body: list[ast.stmt]):
    """Every function and class defined in `body`, at any depth (statements only: fast)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield stmt
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list):
                yield from _definitions(inner)
        for handler in getattr(stmt, "handlers", []):
            yield from _definitions(handler.body)


def _reading_problems(tree: ast.Module, generated: str, display: str, chapter_line, numbering: Numbering | None) -> list[Problem]:
    """Quarto syntax, references to nothing and other docstring styles, in docstrings and comments."""
    references = _book_references(numbering) if numbering is not None else set()
    problems = []
    for node in _definitions(tree.body):
        if not (node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)):
            continue
        value = node.body[0].value.value
        if not isinstance(value, str):
            continue
        start = node.body[0].lineno
        where = f"the docstring of `{node.name}`"
        for offset, message in _text_problems(value, where, numbering, references):
            problems.append(Problem(display, chapter_line(start + value.count("\n", 0, offset)), message))
        # cleandoc keeps the line count, so offsets are lines of the docstring.
        for offset, message in _docstring_style(value, where):
            problems.append(Problem(display, chapter_line(start + offset), message))
    # Attribute docstrings: a string statement after a constant (`RUNNING_EXAMPLE = ...`
    # then `"""The chapter's running example..."""`), at module or class level.
    bodies = [tree.body] + [node.body for node in _definitions(tree.body) if isinstance(node, ast.ClassDef)]
    for body in bodies:
        for before, stmt in itertools.pairwise(body):
            if (
                isinstance(before, (ast.Assign, ast.AnnAssign))
                and isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                value = stmt.value.value
                for offset, message in _text_problems(value, "an attribute's docstring", numbering, references):
                    problems.append(Problem(display, chapter_line(stmt.lineno + value.count("\n", 0, offset)), message))
    for line, comment in _comments(tree, generated):
        for _, message in _text_problems(comment, "a comment", numbering, references):
            problems.append(Problem(display, chapter_line(line), message))
    return problems


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
        info = book.numbering.chapter(entry.path)  # the numbering has parsed each chapter once
        try:
            doc = info.document if info is not None and info.document is not None else parse_file(path, book.root)
        except QmdError as exc:
            result.problems.append(Problem(exc.path, exc.line, exc.message))
            continue
        position = order.index(entry.module)
        output, problems = tangle_document(
            doc, entry.module, order[:position], book.root, order[position + 1 :], numbering=book.numbering
        )
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
