"""The book project: its root, the files `_quarto.yml` lists (chapters, then appendices), its repository."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

# Only chapter files named like this produce modules: chapters/ch03-long-context.qmd -> code/ch03/
MODULE_FILE = re.compile(r"^ch(?P<number>\d{2})-[A-Za-z0-9_.-]+\.qmd$")


class BookError(Exception):
    """A problem with the book project itself (missing or malformed _quarto.yml), or its tools (no pandoc)."""


@dataclass(frozen=True)
class ChapterEntry:
    path: str  # as listed, relative to the root, e.g. "chapters/ch03-long-context.qmd"
    line: int  # the line of _quarto.yml that lists it
    appendix: bool

    @property
    def module(self) -> str | None:
        """"ch03" when this file produces a module, else None."""
        match = MODULE_FILE.match(Path(self.path).name)
        return f"ch{match.group('number')}" if match else None


@dataclass
class Book:
    root: Path
    entries: list[ChapterEntry]
    config: dict

    @property
    def bibliography(self) -> list[Path]:
        value = self.config.get("bibliography") or []
        return [self.root / str(name) for name in ([value] if isinstance(value, str) else value)]

    @property
    def csl(self) -> Path | None:
        """The citation style `_quarto.yml` names, or None for pandoc's default."""
        return self.root / str(self.config["csl"]) if self.config.get("csl") else None

    def display(self, path: Path | str) -> str:
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)


def find_root() -> Path:
    """The nearest directory at or above the working directory holding `_quarto.yml`."""
    here = Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "_quarto.yml").is_file():
            return candidate
    raise BookError(f"no _quarto.yml found in {here} or any directory above it")


def load_book(root: Path | str | None = None) -> Book:
    """Read `_quarto.yml`: every file of book.chapters then book.appendices, in order, with its line."""
    root = find_root() if root is None else Path(root)
    try:
        text = (root / "_quarto.yml").read_text(encoding="utf-8")
        config = yaml.safe_load(text) or {}
    except FileNotFoundError:
        raise BookError(f"{root / '_quarto.yml'} does not exist") from None
    except yaml.YAMLError as exc:
        raise BookError(f"_quarto.yml is not valid YAML: {exc}") from None
    lines, cursor, entries = text.split("\n"), 0, []
    for key in ("chapters", "appendices"):
        listed = (config.get("book") or {}).get(key) or []  # a `part:` group lists its files under `chapters:`
        for item in (name for group in listed for name in (group.get("chapters") or [] if isinstance(group, dict)
                                                            and "part" in group else [group])):
            if not isinstance(item, str):  # the tools number, stage and check the files in their order
                raise BookError(f"_quarto.yml lists {item!r}: list the book's files one a line, or in "
                                "`- part: TITLE` groups with their `chapters:`")
            line = next((number + 1 for number in range(cursor, len(lines)) if item in lines[number]), 0)
            cursor = line or cursor
            entries.append(ChapterEntry(item, line, key == "appendices"))
    return Book(root=root, entries=entries, config=config)


def repo_url(book: Book) -> str:
    """`_quarto.yml`'s `book.repo-url`, where the notebooks install longctx from (BookError if unusable)."""
    value = (book.config.get("book") or {}).get("repo-url")
    if not str(value or "").strip():
        raise BookError("_quarto.yml has no book.repo-url: the notebooks' first cell installs longctx from it "
                        "(add `repo-url: https://github.com/OWNER/REPO` under `book:`)")
    if not isinstance(value, str) or not re.match(r"^(?:https?|ssh|git)://[^\s'\"\\]+$", value.strip()):
        raise BookError(f"_quarto.yml: book.repo-url must be an https://, ssh:// or git:// URL of the book's "
                        f"repository (pip installs `longctx @ git+URL`), not {value!r}")
    return value.strip()


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` unless it already holds it; whether it wrote."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")
    return True
