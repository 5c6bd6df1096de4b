"""The book project: where its root is, which chapters `_quarto.yml` lists, in order, and its repository.

A `Book` is loaded once per command; the numbering (`numbering.compute_numbering`), which
parses every listed file, is computed once by the command and handed to each step.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

__all__ = ["Book", "BookError", "ChapterEntry", "find_root", "load_book", "repo_url", "write_if_changed", "MODULE_FILE"]

# Only chapter files named like this produce modules: chapters/ch03-long-context.qmd -> code/ch03/
MODULE_FILE = re.compile(r"^ch(?P<number>\d{2})-[A-Za-z0-9_.-]+\.qmd$")


class BookError(Exception):
    """A problem with the book project itself (missing or malformed _quarto.yml)."""


@dataclass(frozen=True)
class ChapterEntry:
    """One file listed in `_quarto.yml`."""

    path: str  # as listed, relative to the root, e.g. "chapters/ch03-long-context.qmd"
    line: int  # the line in _quarto.yml that lists it
    appendix: bool

    @property
    def module(self) -> str | None:
        """The module name (e.g. "ch03") when this file produces one, else None."""
        match = MODULE_FILE.match(Path(self.path).name)
        return f"ch{match.group('number')}" if match else None


@dataclass
class Book:
    root: Path
    entries: list[ChapterEntry]
    config: dict = field(default_factory=dict)

    @property
    def bibliography(self) -> list[Path]:
        """The .bib files `_quarto.yml` names (`bibliography:`), as absolute paths."""
        value = self.config.get("bibliography") or []
        names = [value] if isinstance(value, str) else list(value)
        return [self.root / str(name) for name in names]

    @property
    def csl(self) -> Path | None:
        """The citation style `_quarto.yml` names (`csl:`), or None for pandoc's default."""
        value = self.config.get("csl")
        return self.root / str(value) if value else None

    @property
    def module_entries(self) -> list[ChapterEntry]:
        """The entries that produce modules (files named chNN-*.qmd), in book order."""
        return [entry for entry in self.entries if entry.module is not None]

    def entry_for(self, path: Path | str) -> ChapterEntry | None:
        """The entry listing `path` (absolute, or relative to the root or the cwd)."""
        path = Path(path)
        candidates = [path] if path.is_absolute() else [Path.cwd() / path, self.root / path]
        for candidate in candidates:
            try:
                rel = candidate.resolve().relative_to(self.root.resolve()).as_posix()
            except ValueError:
                continue
            for entry in self.entries:
                if entry.path == rel:
                    return entry
        return None

    def display(self, path: Path | str) -> str:
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)


def find_root(start: Path | str | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding `_quarto.yml`."""
    here = Path(start or os.getcwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "_quarto.yml").is_file():
            return candidate
    raise BookError(f"no _quarto.yml found in {here} or any directory above it")


def _line_of(lines: list[str], item: str, start: int) -> int:
    """The first line (1-based) at or after `start` that mentions `item`."""
    for number in range(start, len(lines)):
        if item in lines[number]:
            return number + 1
    return 0


def _flatten(items, appendix: bool, lines: list[str], cursor: list[int]) -> list[ChapterEntry]:
    found: list[ChapterEntry] = []
    for item in items or []:
        if not isinstance(item, str):  # the tools number, stage and check a flat list of files
            raise BookError(f"_quarto.yml lists {item!r}: list the book's files one a line (parts are not used)")
        line = _line_of(lines, item, cursor[0])
        cursor[0] = line or cursor[0]
        found.append(ChapterEntry(item, line, appendix))
    return found


def load_book(root: Path | str | None = None) -> Book:
    """Read `_quarto.yml`: every file in book.chapters then book.appendices, in order."""
    root = find_root(root) if root is None else Path(root)
    config_path = root / "_quarto.yml"
    try:
        text = config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BookError(f"{config_path} does not exist") from None
    try:
        config = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise BookError(f"_quarto.yml is not valid YAML: {exc}") from None
    book = config.get("book") or {}
    lines = text.split("\n")
    cursor = [0]
    entries = _flatten(book.get("chapters"), False, lines, cursor)
    entries += _flatten(book.get("appendices"), True, lines, cursor)
    return Book(root=root, entries=entries, config=config)


_REPO_URL = re.compile(r"^(?:https?|ssh|git)://[^\s'\"\\]+$")


def repo_url(book: Book) -> str:
    """`_quarto.yml`'s `book.repo-url`: where the pages' source links point and the notebooks install from.

    Raises:
        BookError: it is missing, or not an http(s)/ssh/git URL.
    """
    value = (book.config.get("book") or {}).get("repo-url")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BookError(
            "_quarto.yml has no book.repo-url: the notebooks' first cell installs longctx from it "
            "(add `repo-url: https://github.com/OWNER/REPO` under `book:`)"
        )
    if not isinstance(value, str) or not _REPO_URL.match(value.strip()):
        raise BookError(
            f"_quarto.yml: book.repo-url must be an https://, ssh:// or git:// URL of the book's "
            f"repository (pip installs `longctx @ git+URL`), not {value!r}"
        )
    return value.strip()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so no reader sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` (atomically) unless it already holds it; whether it wrote."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    write_atomic(path, text)
    return True
