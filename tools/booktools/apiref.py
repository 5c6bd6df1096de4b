"""The API reference appendix, generated from the chapters' modules when the book is built: for each public
name of each chapter module its signature (laid out by `ruff format` past 80 characters), the first paragraph
of its docstring (a constant's `#:` lines), and a link by fragment alone (`#sec-ch03-rope`, the one form both
Quarto's HTML and its EPUB resolve) to the section whose `# @save` cell defines it.
The appendix's one cell is `from booktools.apiref import api_reference; api_reference()`.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .book import load_book
from .numbering import Numbering, compute_numbering
from .tangle import public_names

COMMENTED = re.compile(r"^((?:#:.*\n)+)(\w+)\s*[:=]", re.MULTILINE)  # a constant's `#:` lines: all it has (no docstring)
SIGNATURE_WIDTH = 80


@dataclass
class ApiEntry:
    """One public name of one chapter module."""

    module: str  # "longctx.ch03"
    name: str
    kind: str  # "class", "function", "constant"
    signature: str  # "kv_bytes(config, tokens, batch=1) -> int"
    summary: str  # the docstring's first paragraph ("" when there is none)
    section: str | None  # "Section 3.2 Grouped heads" (or the chapter, before its first section)
    fragment: str | None  # that section's id, "sec-ch03-gqa"


def _is_def(signature: str) -> bool:
    try:
        ast.parse(f"def {signature}: ...")
    except SyntaxError:
        return False
    return True


def wrap_signatures(signatures: list[str], width: int = SIGNATURE_WIDTH) -> list[str]:
    """Each signature as it is where it fits `width`, else laid out as ruff formats a `def` (one run)."""
    from ruff.__main__ import find_ruff_bin

    wrapped = list(signatures)
    long = [index for index, text in enumerate(signatures) if len(text) > width and _is_def(text)]
    if long:
        source = "".join(f"def {signatures[index]}: ...\n" for index in long)
        settings = ["--isolated", "--line-length", str(width), "--config", "format.quote-style = 'preserve'"]
        done = subprocess.run([find_ruff_bin(), "format", *settings, "-"], input=source, capture_output=True,
                              text=True, check=True)
        for index, text in zip(long, re.split(r"\n+(?=def )", done.stdout.strip()), strict=True):
            wrapped[index] = text.removeprefix("def ").removesuffix(": ...")
    return wrapped


def _describe(name: str, obj) -> tuple[str, str, str]:
    """(kind, signature, summary) of a public object; a constant's summary comes from its `#:` lines."""
    if not callable(obj):
        return "constant", f"{name}: {type(obj).__name__}", ""
    try:  # `x: 'Tensor'` -> `x: Tensor`: annotations are strings under `from __future__ import annotations`
        signature = re.sub(r"(:\s|->\s|\[)'([^']*)'", r"\1\2", str(inspect.signature(obj)))
        signature = signature.replace("= <factory>", "= ...")  # a dataclass field's default_factory
    except (TypeError, ValueError):
        signature = "(...)"
    doc = (inspect.getdoc(obj) or "") if obj.__doc__ is not None else ""  # never the docstring a class inherits
    summary = " ".join(line.strip() for line in re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0].split("\n"))
    if inspect.isclass(obj):
        return "class", f"{name}{signature.removesuffix(' -> None')}", summary
    return "function", f"{name}{signature}", summary


def api_entries(root: Path | str | None = None, numbering: Numbering | None = None) -> list[ApiEntry]:
    """Every public name of every chapter module that exists, in book order (the book is read once)."""
    book = load_book(root)
    numbering = numbering or compute_numbering(book)
    entries: list[ApiEntry] = []
    pages: dict[str, list] = {}  # "ch03" -> the pages that make it, in order
    for info in numbering.chapters:
        if info.entry.module is not None and info.document is not None:
            pages.setdefault(info.entry.module, []).append(info)
    for chapter, infos in pages.items():
        if not (book.root / "code" / chapter / "_generated.py").is_file():
            continue
        module = importlib.import_module(f"longctx.{chapter}")
        sections: dict[str, tuple[str, str | None]] = {}  # each name the saved cells define -> (section, its label)
        notes: dict[str, str] = {}
        for info, item in ((page, item) for page in infos for item in page.items):
            if item.kind == "heading" and item.heading.level == 1:  # above a page's first section: the page
                section = info.name, info.label
            elif item.kind == "heading":
                heading, number = item.heading, numbering.heading_numbers[(info.display, item.line)]
                section = f"Section {number} {heading.text}" if number else heading.text, heading.label
            elif item.kind == "cell" and item.cell.is_python and item.cell.saved:
                source = "\n".join(item.cell.saved_code_lines)
                notes |= {match[2]: " ".join(line[2:].strip() for line in match[1].splitlines())
                          for match in COMMENTED.finditer(source)}
                for name in public_names(ast.parse(source).body):
                    sections.setdefault(name, section)
        for name in getattr(module, "__all__", []):
            kind, signature, summary = _describe(name, getattr(module, name))
            section, fragment = sections.get(name, (None, None))
            summary = notes.get(name, "") if kind == "constant" else summary
            entries.append(ApiEntry(module.__name__, name, kind, signature, summary, section, fragment))
    return entries


def api_reference_markdown(root: Path | str | None = None) -> str:
    """The API reference as Markdown: per chapter module, each public name's signature (a Python
    code block), the first paragraph of its docstring and a link to the section that defines it."""
    book = load_book(root)
    numbering = compute_numbering(book)  # parses and walks every listed file once
    entries = api_entries(book.root, numbering)
    if not entries:
        return "No chapter module exists yet: run `make tangle`."
    titles = {info.entry.module: info for info in reversed(numbering.chapters) if info.entry.module}  # first pages

    out: list[str] = []
    current = None
    for entry, signature in zip(entries, wrap_signatures([entry.signature for entry in entries]), strict=True):
        if entry.module != current:
            current = entry.module
            info = titles[current.removeprefix("longctx.")]
            chapter = f"Chapter {info.number}, {info.title}" if info.number else current
            count = sum(1 for item in entries if item.module == current)
            out.append(f"**`{current}`**: {f'[{chapter}](#{info.label})' if info.label else chapter} ({count} public names)")
        words = [html.escape(entry.summary, quote=False)] if entry.summary else []  # `check` keeps out Quarto syntax
        words += ["A constant."] if not entry.summary and entry.kind == "constant" else []
        words += [f"Defined in [{entry.section}](#{entry.fragment})."] if entry.fragment else (
            [f"Defined in {entry.section}."] if entry.section else [])
        out.append("\n".join(["```python", signature, "```", "", " ".join(words)]).rstrip())
    return "\n\n".join(out).strip() + "\n"


def api_reference(root: Path | str | None = None):
    """The API reference as an IPython Markdown object (what the appendix's cell displays)."""
    from IPython.display import Markdown

    return Markdown(api_reference_markdown(root))
