"""The API reference appendix, generated from the chapters' modules when the book is built.

For every public name of every chapter module (`longctx.ch01`, ...): its signature (one parameter
a line past 80 characters, as a formatter breaks it), the first paragraph of its docstring, and a
link to the section whose `# @save` cell defines it, found from the `# chapters/FILE.qmd:LINE`
comments of `code/chNN/_generated.py` and linked by fragment alone (`#sec-ch03-rope`), the one form
both Quarto's HTML and its EPUB resolve. The book is read once per call. The appendix's one cell is
`from booktools.apiref import api_reference; api_reference()`.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from .book import find_root, load_book
from .numbering import Numbering, compute_numbering
from .qmd import CROSS_REFERENCE

__all__ = ["ApiEntry", "api_entries", "api_reference", "api_reference_markdown", "defining_lines", "wrap_signature"]

SOURCE_COMMENT = re.compile(r"^# (?P<file>\S+\.qmd):(?P<line>\d+)\s*$")
REFERENCE = re.compile(r"\[?" + CROSS_REFERENCE.pattern + r"\]?")  # `[@eq-x]` or `@eq-x`, brackets and all


@dataclass
class ApiEntry:
    """One public name of one chapter module."""

    module: str  # "longctx.ch03"
    name: str
    kind: str  # "class", "function", "constant"
    signature: str  # "kv_bytes(config, tokens, batch=1) -> int"
    summary: str  # the docstring's first paragraph ("" when there is none)
    file: str | None  # the chapter file that defines it
    line: int | None  # the line of its saved cell
    section: str | None  # "Section 3.2 Grouped heads" (or the chapter, before its first section)
    href: str | None  # "ch03-long-context.html#sec-ch03-gqa"


def defining_lines(generated: Path) -> dict[str, tuple[str, int]]:
    """Top-level name -> (chapter file, line) from a generated module's source comments."""
    text = generated.read_text(encoding="utf-8")
    lines = text.split("\n")
    marks: list[tuple[int, str, int]] = []  # (line in generated file, chapter file, chapter line)
    for number, line in enumerate(lines, start=1):
        match = SOURCE_COMMENT.match(line)
        if match:
            marks.append((number, match.group("file"), int(match.group("line"))))
    found: dict[str, tuple[str, int]] = {}
    for node in ast.parse(text).body:
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [target.id for target in node.targets if isinstance(target, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        first = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", [])])
        before = [mark for mark in marks if mark[0] < first]
        if not before:
            continue
        _, file, line = before[-1]
        for name in names:
            found.setdefault(name, (file, line))
    return found


SIGNATURE_WIDTH = 80


def _split_top_level(text: str) -> list[str]:
    """`a: int, b: dict[str, int] = {}` -> ["a: int", "b: dict[str, int] = {}"] (commas inside brackets or quotes stay)."""
    parts, depth, quote, current = [], 0, None, []
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def wrap_signature(signature: str, width: int = SIGNATURE_WIDTH) -> str:
    """A signature on one line when it fits `width`, else one parameter per line.

    `f(a, b) -> int` stays as it is; a longer one becomes
    `f(\n    a,\n    b,\n) -> int`, the layout Python formatters use.
    """
    if len(signature) <= width or "(" not in signature:
        return signature
    name, _, rest = signature.partition("(")
    depth, close = 1, None
    for index, char in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            close = index
            break
    if close is None:
        return signature
    params, tail = _split_top_level(rest[:close]), rest[close + 1 :]
    lines = [f"{name}("]
    for param in params:
        lines += _wrap_parameter(param, width)
    return "\n".join([*lines, f"){tail}"])


def _wrap_parameter(param: str, width: int) -> list[str]:
    """One parameter line, or, when its default is a long tuple or list, that default over lines."""
    line = f"    {param},"
    opener = next((mark for mark in (" = (", " = [") if mark in param), None)
    if len(line) <= width or opener is None or param[-1] not in ")]":
        return [line]
    head, _, inner = param.partition(opener)
    items = _split_top_level(inner[:-1])
    lines, current = [f"    {head}{opener}"], "       "
    for item in items:
        if len(current) + len(item) + 2 > width:
            lines.append(current)
            current = "       "
        current += f" {item},"
    return [*lines, current, f"    {param[-1]},"]


def _signature(name: str, obj) -> tuple[str, str]:
    if inspect.isclass(obj):
        try:
            signature = _plain_annotations(str(inspect.signature(obj))).removesuffix(" -> None")
        except (TypeError, ValueError):
            signature = "(...)"
        return "class", f"{name}{signature}"
    if callable(obj):
        try:
            signature = _plain_annotations(str(inspect.signature(obj)))
        except (TypeError, ValueError):
            signature = "(...)"
        return "function", f"{name}{signature}"
    return "constant", f"{name}: {type(obj).__name__}"


def _summary(obj, kind: str) -> str:
    if kind == "constant":
        return ""
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and doc and obj.__doc__ is None:
        return ""
    paragraph = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0] if doc.strip() else ""
    return " ".join(line.strip() for line in paragraph.split("\n"))


def _section_for(numbering: Numbering, file: str, line: int) -> tuple[str | None, str | None]:
    info = numbering.chapter(file)
    if info is None or info.document is None:
        return None, None
    page = f"{Path(file).stem}.html"
    chosen = None
    for heading, ident in info.document.section_ids:  # computed once per chapter
        if heading.line < line:
            chosen = (heading, ident)
        else:
            break
    if chosen is None:
        return (f"Chapter {info.number}" if info.number else info.title), page
    heading, ident = chosen
    number = numbering.heading_numbers.get((file, heading.line), "")
    if heading.level == 1:
        kind = "Appendix" if info.entry.appendix else "Chapter"
        text = f"{kind} {number}" if number else heading.text
        return text, f"{page}#{ident}"
    text = f"Section {number} {heading.text}" if number else heading.text
    return text, f"{page}#{ident}"


def api_entries(root: Path | str | None = None, numbering: Numbering | None = None) -> list[ApiEntry]:
    """Every public name of every chapter module that exists, in book order.

    Args:
        root: the book's root (default: found from the working directory).
        numbering: the book's numbering when the caller has computed it (the book is then
            not read again).
    """
    root = Path(root) if root is not None else find_root()
    book = load_book(root)  # the chapter list only; the chapters are parsed by compute_numbering
    numbering = numbering or compute_numbering(book)
    entries: list[ApiEntry] = []
    for chapter in book.module_entries:
        module_name = f"longctx.{chapter.module}"
        generated = root / "code" / chapter.module / "_generated.py"
        if not generated.is_file():
            continue
        module = importlib.import_module(module_name)
        lines = defining_lines(generated)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            kind, signature = _signature(name, obj)
            file, line = lines.get(name, (None, None))
            section, href = _section_for(numbering, file, line) if file else (None, None)
            entries.append(
                ApiEntry(module_name, name, kind, signature, _summary(obj, kind), file, line, section, href)
            )
    return entries


def _references_to_links(text: str, numbering: Numbering) -> str:
    """`@eq-ch03-kvbytes` -> a Markdown link reading "Equation 3.1" (Quarto syntax never reaches a reader)."""

    def replace(match: re.Match) -> str:
        target = numbering.targets.get(match.group("label"))
        if target is None:
            return match.group("label")
        return f"[{target.text}](#{target.label})"

    return REFERENCE.sub(replace, text)


def _escape_markdown(text: str) -> str:
    """Keep a docstring's text as text: `<` and `&` are not markup."""
    return html.escape(text, quote=False)


def _plain_annotations(signature: str) -> str:
    """`x: 'Tensor'` -> `x: Tensor` (annotations are strings under `from __future__ import annotations`)."""
    return re.sub(r"(:\s|->\s)'([^']*)'", r"\1\2", signature)


def api_reference_markdown(root: Path | str | None = None) -> str:
    """The API reference as Markdown: per chapter module, each public name's signature (a Python
    code block), the first paragraph of its docstring and a link to the section that defines it."""
    root = Path(root) if root is not None else find_root()
    numbering = compute_numbering(load_book(root))  # parses and walks every listed file once
    entries = api_entries(root, numbering)
    if not entries:
        return "No chapter module exists yet: run `make tangle`."
    titles = {info.entry.module: info for info in numbering.chapters if info.entry.module}
    out: list[str] = []
    current = None
    for entry in entries:
        if entry.module != current:
            current = entry.module
            short = current.rsplit(".", 1)[-1]
            info = titles.get(short)
            chapter = f"Chapter {info.number}, {info.title}" if info is not None and info.number else short
            anchor = _chapter_anchor(numbering, info)
            heading = f"[{chapter}](#{anchor})" if anchor else chapter
            count = sum(1 for item in entries if item.module == current)
            out.append(f"**`{current}`**: {heading} ({count} public names)")
        parts = ["```python", wrap_signature(entry.signature), "```", ""]
        words = []
        if entry.summary:
            words.append(_references_to_links(_escape_markdown(entry.summary), numbering))
        elif entry.kind == "constant":
            words.append("A constant.")
        fragment = entry.href.partition("#")[2] if entry.href else ""
        if entry.href and not fragment:  # defined before the chapter's first section
            fragment = _chapter_anchor(numbering, numbering.chapter(entry.file)) or ""
        if fragment:
            words.append(f"Defined in [{entry.section}](#{fragment}).")
        if words:
            parts.append(" ".join(words))
        out.append("\n".join(parts).rstrip())
    return "\n\n".join(out).strip() + "\n"


def _chapter_anchor(numbering: Numbering, info) -> str | None:
    """The id of a chapter's title heading (its `sec-` label, else Pandoc's slug)."""
    if info is None or info.document is None:
        return None
    for heading, ident in info.document.section_ids:
        if heading.level == 1:
            return ident
    return None


def api_reference(root: Path | str | None = None):
    """The API reference as an IPython Markdown object (what the appendix's cell displays)."""
    from IPython.display import Markdown

    return Markdown(api_reference_markdown(root))
