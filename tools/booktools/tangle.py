"""Tangle: the `# @save` cells of each chapter become `code/chNN/_generated.py` + `__init__.py`.

The rules are CONTRIBUTING.md's "Saved cells and the tangle". The generated module reads like a library: the
saved cells' top-level imports come first, once each; then each saved block under a
`# chapters/FILE.qmd:LINE` comment naming its first line. The tangle tangles: ruff's isort
rules (`ruff check --fix-only --select I`, the pinned ruff, one run for the whole book) put
the imports in order, and
everything else about the modules' style is `make lint`'s. The book's own rules for saved
code (no side effects, chapter order, no Quarto syntax in docstrings) are `booktools check`'s.
Everything is computed first; files are written only when every chapter asked for is
clean, each through a temporary file and `os.replace`, so a broken chapter never leaves a
half-written module and changes nothing. Same chapters, same ruff: same bytes.
"""

from __future__ import annotations

import ast
import io
import subprocess
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, ChapterEntry, write_if_changed
from .qmd import Cell, Document, QmdError, parse_file

__all__ = ["Problem", "TangleResult", "ModuleOutput", "tangle_book", "tangle_document", "write_outputs", "stale_outputs"]

GENERATED_NAME = "_generated.py"
INIT_NAME = "__init__.py"
IMPORT_WIDTH = 80
"""Imports longer than this are wrapped one name a line (ruff's isort at this line length), so
the generated module's imports fit the page as the chapters' code does."""


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


def saved_blocks(doc: Document, problems: list[Problem]) -> list[_Block]:
    """The saved code of each `# @save` cell, dedented and without blank lines at either end."""
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
        indent = cell.indent
        lines = [text[len(indent) :] if indent and text.startswith(indent) else text for text in cell.saved_code_lines]
        first = cell.saved_code_line
        while lines and not lines[0].strip():
            lines, first = lines[1:], first + 1
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if lines:
            blocks.append(_Block(cell, first, lines))
    return blocks


def _has_comment(source: str) -> bool:
    try:
        return any(token.type == tokenize.COMMENT for token in tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - the source compiled
        return False


def _hoist_imports(block: _Block, tree: ast.Module, imports: list[str], problem) -> list[_Block]:
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
        elif "#" in text and _has_comment(text.strip() + "\n"):
            problem(at, "a comment on a saved import would be lost: saved imports move to the top of "
                    "the module; put the comment on the code that uses the import, or in the prose")
        else:
            statement = ast.unparse(stmt)
            if statement not in imports:
                imports.append(statement)
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


ISOLATED = ["--isolated", "--config", 'lint.isort.known-first-party = ["longctx"]']


def sort_imports(texts: dict[Path, str], root: Path) -> dict[Path, str]:
    """Each module's text with its imports in the order ruff's isort rules want, in one ruff run.

    The settings are the book's `code/ruff.toml`; a book without one (a test's) gets ruff's
    defaults, with `longctx` first-party as there.
    """
    if not texts:
        return {}
    from ruff.__main__ import find_ruff_bin

    config = root / "code" / "ruff.toml"
    with tempfile.TemporaryDirectory(prefix="tangle-") as folder:
        names = {path: Path(folder) / f"{index}-{path.parent.name}-{path.name}" for index, path in enumerate(texts)}
        for path, name in names.items():
            name.write_text(texts[path], encoding="utf-8")
        command = [find_ruff_bin(), "check", "--no-cache", "--fix-only", "--exit-zero", "--quiet", "--select", "I",
                   "--line-length", str(IMPORT_WIDTH), *(["--config", str(config)] if config.is_file() else ISOLATED)]
        done = subprocess.run([*command, *map(str, names.values())], capture_output=True, text=True, cwd=folder)
        if done.returncode != 0:
            raise QmdError("code", 0, f"ruff could not sort the imports (run `make env`): {done.stderr.strip()[-500:]}")
        return {path: name.read_text(encoding="utf-8") for path, name in names.items()}


def _member_key(name: str) -> tuple[int, str, str]:
    """isort's order-by-type: CONSTANTS, then Classes, then functions."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return (kind, name.lower(), name)


def _public_names(body: list[ast.stmt]) -> list[str]:
    """The names a module's top level defines (not imports) that do not start with `_`."""
    found: list[str] = []

    def bind(node: ast.AST) -> None:
        if isinstance(node, ast.Name) and not node.id.startswith("_") and node.id not in found:
            found.append(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                bind(element)
        elif isinstance(node, ast.Starred):
            bind(node.value)

    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(ast.Name(stmt.name))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                bind(target)
        elif isinstance(stmt, ast.AnnAssign):
            bind(stmt.target)
        elif isinstance(stmt, ast.If):
            found += [name for name in _public_names(stmt.body + stmt.orelse) if name not in found]
        elif isinstance(stmt, ast.Try):
            inner = stmt.body + stmt.orelse + stmt.finalbody + [s for h in stmt.handlers for s in h.body]
            found += [name for name in _public_names(inner) if name not in found]
    return found


def _chapter_title(doc: Document) -> str:
    title = doc.front_matter.get("title")
    if isinstance(title, str) and title.strip():
        return title.strip()
    return next((heading.text for heading in doc.headings() if heading.level == 1), "")


def _escape_docstring(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def tangle_document(doc: Document, module: str, root: Path) -> tuple[ModuleOutput | None, list[Problem]]:
    """Build one chapter's module: (output, problems); output is None when there are problems."""
    problems: list[Problem] = []
    blocks = saved_blocks(doc, problems)

    def problem(line: int, message: str) -> None:
        problems.append(Problem(doc.display, line, message))

    imports: list[str] = []
    segments: list[_Block] = []
    for block in blocks:
        try:
            tree = ast.parse("\n".join(block.lines) + "\n", filename=doc.display)
        except SyntaxError as exc:
            problem(block.first_line + (exc.lineno or 1) - 1, f"saved code does not compile: {exc.msg}")
            continue
        segments += _hoist_imports(block, tree, imports, problem)
    if problems:
        return None, sorted(problems, key=lambda item: (item.path, item.line))

    title = _chapter_title(doc)
    described = f'{doc.display} ("{title}")' if title else doc.display
    header = [
        f"# Generated from {doc.display} by `python -m booktools tangle`.",
        "# Do not edit: change the chapter's `# @save` cells, then tangle again.",
    ]
    out = [*header, f'"""Code saved from {_escape_docstring(described)}."""']
    if imports:
        out += [""] + imports
    for segment in segments:
        out += ["", "", f"# {doc.display}:{segment.first_line}", *segment.lines]
    directory = root / "code" / module
    generated = "\n".join(out) + "\n"
    public = sorted(_public_names(ast.parse(generated).body), key=_member_key)
    init = [*header, f'"""{_escape_docstring(title or module)}: the code saved from {doc.display}."""', ""]
    if public:
        init += ["from ._generated import (", *[f"    {name}," for name in public], ")", ""]
        init += ["__all__ = [", *[f'    "{name}",' for name in public], "]"]
    else:
        init.append("__all__: list[str] = []")
    output = ModuleOutput(
        entry=ChapterEntry(doc.display, 0, False),
        module=module,
        files={directory / GENERATED_NAME: generated, directory / INIT_NAME: "\n".join(init) + "\n"},
    )
    return output, []


def tangle_book(book: Book, files: list[Path | str] | None = None) -> TangleResult:
    """Tangle every chapter `_quarto.yml` lists (or just `files`), without writing anything."""
    result = TangleResult()
    selected = book.module_entries
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
            output, problems = tangle_document(parse_file(path, book.root), entry.module, book.root)
        except QmdError as exc:
            result.problems.append(Problem(exc.path, exc.line, exc.message))
            continue
        result.problems.extend(problems)
        if output is not None:
            output.entry = entry
            result.outputs.append(output)
    if not result.problems:
        try:
            texts = sort_imports({path: text for output in result.outputs for path, text in output.files.items()}, book.root)
        except QmdError as exc:
            result.problems.append(Problem(exc.path, exc.line, exc.message))
            return result
        for output in result.outputs:
            output.files = {path: texts[path] for path in output.files}
    return result


def stale_outputs(result: TangleResult) -> list[Path]:
    """Generated files whose contents on disk differ from what tangling gives."""
    return [path for output in result.outputs for path, text in output.files.items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def write_outputs(result: TangleResult) -> list[Path]:
    """Write every changed file (temporary file, then rename); returns the paths written."""
    return [path for output in result.outputs for path, text in output.files.items() if write_if_changed(path, text)]
