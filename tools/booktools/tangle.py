"""Tangle: the `# @save` cells of each chapter become `code/chNN/_generated.py` and `__init__.py`.

The module reads like a library: the saved cells' top-level imports first, once each, then each saved
block under a `# chapters/FILE.qmd:LINE` comment naming its first line. Ruff's isort rules (the pinned
ruff, one run for the book) order the imports; the rest of the modules' style is `make lint`'s and the
book's rules for saved code are `booktools check`'s. Nothing is written unless every chapter asked for
tangles cleanly. Same chapters, same ruff: same bytes.
"""

from __future__ import annotations

import ast
import io
import itertools
import subprocess
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from .book import Book
from .qmd import Document, QmdError, parse_file, title_heading, walk

IMPORT_WIDTH = 80  # imports longer than this are wrapped one name a line, to fit the page as the chapters' code does
ISOLATED = ["--isolated", "--config", 'lint.isort.known-first-party = ["longctx"]']


@dataclass
class TangleResult:
    outputs: dict[str, dict[Path, str]] = field(default_factory=dict)  # "ch03" -> its files' paths -> texts
    problems: list[QmdError] = field(default_factory=list)

    @property
    def files(self) -> dict[Path, str]:
        """Every file the modules are made of -> its text."""
        return {path: text for files in self.outputs.values() for path, text in files.items()}


def _saved_code(doc: Document, problems: list[QmdError], imports: list[str]) -> list[tuple[int, list[str]]]:
    """(chapter line, lines) for each run of saved code between the top-level imports, which move to
    `imports` (once each); each run keeps its chapter lines, so its `# FILE:LINE` comment stays true."""
    runs: list[tuple[int, list[str]]] = []
    for cell in doc.cells:
        if cell.saved and not cell.is_python:
            kind = f"```{cell.info}" if cell.info else "a plain ``` fence"
            problems.append(doc.error(cell.code_line, f"`# @save` in a block that is not a Python cell ({kind}); "
                                      "only ```{python} cells can be saved"))
            continue
        if not cell.saved:
            continue
        lines, first = cell.saved_code_lines, cell.saved_code_line
        try:
            tree = ast.parse("\n".join(lines) + "\n", filename=doc.display)
        except SyntaxError as exc:
            problems.append(doc.error(first + (exc.lineno or 1) - 1, f"saved code does not compile: {exc.msg}"))
            continue
        removed: set[int] = set()  # the hoisted imports' lines
        for stmt in tree.body:
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            span = set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
            text = "\n".join(lines[number - 1] for number in sorted(span))
            if any(other is not stmt and {other.lineno, other.end_lineno or other.lineno} & span for other in tree.body):
                problems.append(doc.error(first + stmt.lineno - 1, "an import shares its line with other code; give it "
                                          "a line of its own (saved imports move to the top of the module)"))
            elif "#" in text and any(token.type == tokenize.COMMENT for token in
                                     tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline)):
                problems.append(doc.error(first + stmt.lineno - 1, "a comment on a saved import would be lost: saved "
                                          "imports move to the top of the module; put the comment on the code that "
                                          "uses the import, or in the prose"))
            else:
                imports += [ast.unparse(stmt)] if ast.unparse(stmt) not in imports else []
                removed |= span
        for code, numbers in itertools.groupby(range(1, len(lines) + 1), key=lambda number: number not in removed):
            kept = [number for number in numbers if code and lines[number - 1].strip()]
            if kept:
                runs.append((first + kept[0] - 1, lines[kept[0] - 1 : kept[-1]]))
    return runs


def branches(stmt: ast.If | ast.Try | ast.TryStar) -> list[ast.stmt]:
    """The statements of an `if` or `try` that stand at its own level: its bodies, handlers and `else`."""
    handlers = [line for handler in getattr(stmt, "handlers", []) for line in handler.body]
    return stmt.body + stmt.orelse + getattr(stmt, "finalbody", []) + handlers


def public_names(body: list[ast.stmt]) -> list[str]:
    """The names a module's top level defines (not imports) that do not start with `_`."""
    found: list[str] = []
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [stmt.name]
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names = [node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)]
        elif isinstance(stmt, ast.If | ast.Try):
            names = public_names(branches(stmt))
        else:
            names = []
        found += [name for name in names if not name.startswith("_") and name not in found]
    return found


def _member_key(name: str) -> tuple[int, str, str]:
    """isort's order-by-type: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2), name.lower(), name


def _escape_docstring(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def tangle_document(docs: list[Document], module: str, root: Path) -> tuple[dict[Path, str] | None, list[QmdError]]:
    """One module from its chapter's pages, in the book's order: (its files' paths -> texts, problems);
    no files when there are problems."""
    problems: list[QmdError] = []
    imports: list[str] = []
    runs = [(doc, line, lines) for doc in docs for line, lines in _saved_code(doc, problems, imports)]
    if problems:
        return None, sorted(problems, key=lambda item: (item.path, item.line))
    titles = [getattr(title_heading(walk(doc)[0]), "text", "") for doc in docs]
    described = " and ".join(f'{doc.display} ("{title}")' if title else doc.display
                             for doc, title in zip(docs, titles, strict=True))
    sources = " and ".join(doc.display for doc in docs)
    header = [f"# Generated from {sources} by `python -m booktools tangle`.",
              "# Do not edit: change the chapter's `# @save` cells, then tangle again."]
    out = [*header, f'"""Code saved from {_escape_docstring(described)}."""'] + ([""] + imports if imports else [])
    for doc, line, lines in runs:
        out += ["", "", f"# {doc.display}:{line}", *lines]
    generated = "\n".join(out) + "\n"
    public = sorted(public_names(ast.parse(generated).body), key=_member_key)
    init = [*header, f'"""{_escape_docstring(titles[0] or module)}: the code saved from {sources}."""', ""]
    if public:
        init += ["from ._generated import (", *[f"    {name}," for name in public], ")", ""]
        init += ["__all__ = [", *[f'    "{name}",' for name in public], "]"]
    else:
        init.append("__all__: list[str] = []")
    directory = root / "code" / module
    return {directory / "_generated.py": generated, directory / "__init__.py": "\n".join(init) + "\n"}, []


def sort_imports(texts: dict[Path, str], root: Path) -> dict[Path, str]:
    """Each module's text with its imports in the order ruff's isort rules want (the book's
    `code/ruff.toml`, or ruff's defaults with `longctx` first-party), in one ruff run."""
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


def tangle_book(book: Book) -> TangleResult:
    """Tangle every chapter `_quarto.yml` lists, without writing anything: the pages of one chapter
    (chapters/ch03-*.qmd, listed one after another) make one module."""
    result, pages = TangleResult(), {}
    entries = [entry for entry in book.entries if entry.module is not None]
    for before, entry in itertools.pairwise([None, *entries]):
        if entry.module in pages and before.module != entry.module:
            result.problems.append(QmdError("_quarto.yml", entry.line, f"{entry.path} makes module {entry.module} "
                                            f"but is not listed right after its other pages ({pages[entry.module][-1]})"))
        pages.setdefault(entry.module, []).append(entry.path)
    for module, paths in pages.items():
        try:  # `check` names a listed file that does not exist
            docs = [parse_file(book.root / path, path) for path in paths if (book.root / path).is_file()]
            files, problems = tangle_document(docs, module, book.root) if docs else (None, [])
        except QmdError as exc:  # the chapter does not parse
            files, problems = None, [exc]
        result.problems += problems
        result.outputs |= {module: files} if files is not None else {}
    if not result.problems and result.outputs:
        texts = sort_imports(result.files, book.root)  # a QmdError if ruff fails: the command line reports it
        result.outputs = {module: {path: texts[path] for path in files} for module, files in result.outputs.items()}
    return result
