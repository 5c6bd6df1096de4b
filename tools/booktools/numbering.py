"""The book's numbering, computed over the whole book as Quarto numbers it.

- Chapters are numbered by their position among the numbered chapters in
  `_quarto.yml` (`index.qmd` and `{.unnumbered}` chapters get no number);
  appendices are lettered A, B, ...
- Sections: `##` -> N.M, `###` -> N.M.K (headings marked `{.unnumbered}` or `{-}` are
  skipped; a heading that gives a callout its title is not a section).
- Figures, tables and equations are numbered per chapter in order of appearance:
  Figure 3.2, Table 3.1, Equation 3.1.

`compute_numbering(book)` parses every listed file once and numbers the book; a command
computes it once and hands it to the notebook export, `check` and the API appendix.
`book_numbering(root)` gives every label's number, kind, file and title.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, ChapterEntry, load_book
from .qmd import (
    EQUATION_LABEL,
    IMAGE_LABEL,
    PIPE_CAPTION,
    CellItem,
    Document,
    Line,
    QmdError,
    parse_file,
    walk,
)

__all__ = ["ChapterInfo", "Numbering", "Target", "book_numbering", "compute_numbering", "KIND_NAMES"]

KIND_NAMES = {"figure": "Figure", "table": "Table", "equation": "Equation", "section": "Section"}
LABEL_KINDS = {"fig": "figure", "tbl": "table", "eq": "equation", "sec": "section"}


@dataclass(frozen=True)
class Target:
    """Something a cross-reference can point at."""

    label: str  # "fig-ch03-probe"
    kind: str  # "chapter", "section", "figure", "table", "equation"
    number: str  # "3.2", "3", "A"; "" when unnumbered
    file: str  # "chapters/ch03-long-context.qmd"
    line: int
    title: str  # heading text, or the caption

    @property
    def text(self) -> str:
        """How a reference reads: "Figure 3.2", "Chapter 3", "Appendix A", "Section 3.4"."""
        if self.kind == "chapter":
            if not self.number:
                return self.title
            return f"Appendix {self.number}" if self.number.isalpha() else f"Chapter {self.number}"
        if not self.number:
            return self.title or self.label
        return f"{KIND_NAMES[self.kind]} {self.number}"


@dataclass
class ChapterInfo:
    """One file listed in `_quarto.yml`, with its number and parsed document."""

    entry: ChapterEntry
    number: str | None  # "3", "A", or None when unnumbered
    title: str = ""
    label: str | None = None
    document: Document | None = None

    @property
    def display(self) -> str:
        return self.entry.path

    @property
    def heading_prefix(self) -> str:
        """What precedes the title in the chapter's own heading: "3 ", "Appendix A: " or ""."""
        if self.number is None:
            return ""
        return f"Appendix {self.number}: " if self.entry.appendix else f"{self.number} "


@dataclass
class Numbering:
    chapters: list[ChapterInfo] = field(default_factory=list)
    targets: dict[str, Target] = field(default_factory=dict)
    heading_numbers: dict[tuple[str, int], str] = field(default_factory=dict)  # (file, line) -> "3.2"
    duplicates: list[tuple[Target, Target]] = field(default_factory=list)  # (repeat, first)
    problems: list[QmdError] = field(default_factory=list)

    def chapter(self, path: str) -> ChapterInfo | None:
        for info in self.chapters:
            if info.display == path:
                return info
        return None


def compute_numbering(book: Book, documents: dict[str, Document] | None = None) -> Numbering:
    """Number every chapter, section, figure, table and equation in the book.

    Args:
        book: the project.
        documents: already-parsed documents by listed path (others are read from disk).

    Returns:
        The numbering; files that are missing or do not parse are numbered but empty
        (parse errors are in `problems`).
    """
    numbering = Numbering()
    documents = dict(documents or {})
    chapter_count, appendix_count = 0, 0
    for entry in book.entries:
        doc = documents.get(entry.path)
        path = book.root / entry.path
        if doc is None and path.is_file() and path.suffix == ".qmd":
            try:
                doc = parse_file(path, book.root)
            except QmdError as exc:
                numbering.problems.append(exc)
        h1 = next((heading for heading in doc.headings() if heading.level == 1), None) if doc is not None else None
        unnumbered = (Path(entry.path).stem == "index" and not entry.appendix) or (h1 is not None and h1.unnumbered)
        if unnumbered:
            number = None
        elif entry.appendix:
            number = chr(ord("A") + appendix_count)
            appendix_count += 1
        else:
            chapter_count += 1
            number = str(chapter_count)
        title = ""
        if doc is not None:
            front_title = doc.front_matter.get("title")
            title = h1.text if h1 is not None else (str(front_title) if front_title else "")
        info = ChapterInfo(entry, number, title, h1.label if h1 is not None else None, doc)
        numbering.chapters.append(info)
        if doc is not None:
            _number_document(numbering, info, doc)
    return numbering


def _add(numbering: Numbering, target: Target) -> None:
    first = numbering.targets.get(target.label)
    if first is not None:
        numbering.duplicates.append((target, first))
        return
    numbering.targets[target.label] = target


def _number_document(numbering: Numbering, info: ChapterInfo, doc: Document) -> None:
    items, _ = walk(doc)
    counters = [0] * 7  # index = heading level
    counts = {"figure": 0, "table": 0, "equation": 0}
    seen_h1 = False

    def next_number(kind: str) -> str:
        counts[kind] += 1
        return f"{info.number}.{counts[kind]}" if info.number else str(counts[kind])

    for item in items:
        if isinstance(item, CellItem):
            cell = item.cell
            label = cell.label
            if not cell.executable or not label:
                continue
            if label.startswith("fig-"):
                caption = str(cell.options.get("fig-cap", "") or "")
                _add(numbering, Target(label, "figure", next_number("figure"), doc.display, cell.line, caption))
            elif label.startswith("tbl-"):
                caption = str(cell.options.get("tbl-cap", "") or "")
                _add(numbering, Target(label, "table", next_number("table"), doc.display, cell.line, caption))
            continue
        line: Line = item
        if line.kind == "heading" and not line.callout_title and not line.in_math:
            heading = line.heading
            if heading.level == 1 and not seen_h1:
                seen_h1 = True
                if heading.label:
                    _add(numbering, Target(heading.label, "chapter", info.number or "", doc.display, line.line, heading.text))
                numbering.heading_numbers[(doc.display, line.line)] = info.number or ""
                continue
            number = ""
            if info.number is not None and not heading.unnumbered and heading.level >= 2:
                counters[heading.level] += 1
                for deeper in range(heading.level + 1, len(counters)):
                    counters[deeper] = 0
                number = ".".join([info.number] + [str(counters[level]) for level in range(2, heading.level + 1)])
            numbering.heading_numbers[(doc.display, line.line)] = number
            if heading.label:
                _add(numbering, Target(heading.label, "section", number, doc.display, line.line, heading.text))
            continue
        if line.kind == "div_open" and line.div is not None and line.div.identifier:
            identifier = line.div.identifier
            for prefix, kind in (("fig-", "figure"), ("tbl-", "table")):
                if identifier.startswith(prefix):
                    _add(numbering, Target(identifier, kind, next_number(kind), doc.display, line.line, ""))
            continue
        if line.kind != "text":
            continue
        caption = PIPE_CAPTION.match(line.text)
        if caption is not None:
            label = caption.group("label")
            _add(numbering, Target(label, "table", next_number("table"), doc.display, line.line, caption.group("caption")))
            continue
        for match in IMAGE_LABEL.finditer(line.text):
            label = match.group("label")
            if label.startswith("fig-"):
                caption = match.group("caption")
                _add(numbering, Target(label, "figure", next_number("figure"), doc.display, line.line, caption))
        for match in EQUATION_LABEL.finditer(line.text):
            if match.group("label").startswith("eq-"):
                label = match.group("label")
                _add(numbering, Target(label, "equation", next_number("equation"), doc.display, line.line, ""))


def book_numbering(root: Path | str | None = None) -> dict[str, Target]:
    """Every label in the book -> its Target (number, kind, chapter file, title).

    Example: `book_numbering()["sec-ch03-rope"].text == "Section 3.4"`.
    """
    return compute_numbering(load_book(root)).targets
