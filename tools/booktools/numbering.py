"""The book's numbering, as Quarto numbers it: chapters by their place among the numbered files of
`_quarto.yml` (`index.qmd` and `{.unnumbered}` chapters have none; appendices are lettered A, B, ...);
sections `##` N.M and `###` N.M.K (not `{.unnumbered}`/`{-}` ones); figure and table cells, pipe
tables and equations per chapter in order: Figure 3.2, Table 3.1, Equation 3.1. `compute_numbering`
parses every listed file once; a command computes it once and hands it on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .book import Book, ChapterEntry, load_book
from .qmd import ATTRIBUTE_LABEL, EQUATION_LABEL, PIPE_CAPTION, CellItem, Document, QmdError, parse_file, walk

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
        if not self.number:
            return self.title or self.label if self.kind != "chapter" else self.title
        if self.kind == "chapter":
            return f"Appendix {self.number}" if self.number.isalpha() else f"Chapter {self.number}"
        return f"{self.kind.capitalize()} {self.number}"


@dataclass
class ChapterInfo:
    """One file listed in `_quarto.yml`, with its number and parsed document."""

    entry: ChapterEntry
    number: str | None  # "3", "A", or None when unnumbered
    title: str = ""
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
    #: every label as written (file, line, label, the prefixes it may have), numbered or not: `check` reads them
    labels: list[tuple[str, int, str, tuple[str, ...]]] = field(default_factory=list)
    problems: list[QmdError] = field(default_factory=list)

    def chapter(self, path: str) -> ChapterInfo | None:
        return next((info for info in self.chapters if info.display == path), None)

    def add(self, target: Target) -> None:
        if target.label in self.targets:
            self.duplicates.append((target, self.targets[target.label]))
        else:
            self.targets[target.label] = target


def compute_numbering(book: Book) -> Numbering:
    """Number every chapter, section, figure, table and equation; a file that is missing or does not
    parse is numbered but empty (its parse error is in `problems`)."""
    numbering = Numbering()
    chapters, appendices = 0, 0
    for entry in book.entries:
        doc, path = None, book.root / entry.path
        if path.is_file() and path.suffix == ".qmd":
            try:
                doc = parse_file(path, entry.path)
            except QmdError as exc:
                numbering.problems.append(exc)
        h1 = next((heading for heading in doc.headings() if heading.level == 1), None) if doc is not None else None
        if (Path(entry.path).stem == "index" and not entry.appendix) or (h1 is not None and h1.unnumbered):
            number = None
        elif entry.appendix:
            number, appendices = chr(ord("A") + appendices), appendices + 1
        else:
            chapters += 1
            number = str(chapters)
        info = ChapterInfo(entry, number, h1.text if h1 is not None else "", doc)
        numbering.chapters.append(info)
        if doc is not None:
            _number_document(numbering, info, doc)
    return numbering


def _number_document(numbering: Numbering, info: ChapterInfo, doc: Document) -> None:
    counters = [0] * 7  # index = heading level
    counts = {"figure": 0, "table": 0, "equation": 0}
    seen_h1 = False

    def add(label: str, kind: str, line: int, title: str = "") -> None:
        counts[kind] += 1
        numbering.add(Target(label, kind, f"{info.number}.{counts[kind]}" if info.number else str(counts[kind]),
                             doc.display, line, title))

    def site(label: str | None, line: int, *allowed: str) -> None:
        if label:
            numbering.labels.append((doc.display, line, label, allowed))

    for item in walk(doc)[0]:
        if isinstance(item, CellItem):
            label = item.cell.label or ""
            site(label if item.cell.executable else None, item.cell.line, "fig", "tbl")
            if item.cell.executable and label.startswith(("fig-", "tbl-")):
                kind, option = ("figure", "fig-cap") if label.startswith("fig-") else ("table", "tbl-cap")
                add(label, kind, item.cell.line, str(item.cell.options.get(option, "") or ""))
        elif item.kind == "heading" and not item.in_math:
            heading = item.heading
            site(heading.label, item.line, "sec")
            if heading.level == 1 and not seen_h1:
                seen_h1 = True
                if heading.label:
                    numbering.add(Target(heading.label, "chapter", info.number or "", doc.display, item.line, heading.text))
                numbering.heading_numbers[(doc.display, item.line)] = info.number or ""
                continue
            number = ""
            if info.number is not None and not heading.unnumbered and heading.level >= 2:
                counters[heading.level] += 1
                counters[heading.level + 1 :] = [0] * (len(counters) - heading.level - 1)
                number = ".".join([info.number] + [str(counters[level]) for level in range(2, heading.level + 1)])
            numbering.heading_numbers[(doc.display, item.line)] = number
            if heading.label:
                numbering.add(Target(heading.label, "section", number, doc.display, item.line, heading.text))
        elif item.kind == "div_open" and item.div.identifier:
            site(item.div.identifier, item.line)  # a div figure or table: `check` refuses it
        elif item.kind == "text":
            caption = PIPE_CAPTION.match(item.text)
            if caption is not None:
                site(caption.group("label"), item.line, "tbl")
                add(caption.group("label"), "table", item.line, caption.group("caption"))
                continue
            for match in ATTRIBUTE_LABEL.finditer(EQUATION_LABEL.sub("", item.text)):
                site(match.group("label"), item.line)  # an image figure: `check` refuses it
            for match in EQUATION_LABEL.finditer(item.text):
                site(match.group("label"), item.line, "eq")
                if match.group("label").startswith("eq-"):
                    add(match.group("label"), "equation", item.line)


def book_numbering(root: Path | str | None = None) -> dict[str, Target]:
    """Every label in the book -> its Target: `book_numbering()["sec-ch03-rope"].text == "Section 3.4"`."""
    return compute_numbering(load_book(root)).targets
