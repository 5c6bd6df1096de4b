"""The book's numbering, as Quarto numbers it: chapters by their place among the numbered files of
`_quarto.yml` (`index.qmd` and `{.unnumbered}` chapters have none; appendices are lettered A, B, ...);
sections `##` N.M and `###` N.M.K (not `{.unnumbered}`/`{-}` ones); figure and table cells, pipe
tables and equations per chapter in order: Figure 3.2, Table 3.1, Equation 3.1. `compute_numbering`
parses and walks every listed file once; a command computes it once and hands it on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import qmd
from .book import Book, ChapterEntry, load_book
from .qmd import QmdError, parse_file, walk


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
    """One file listed in `_quarto.yml`: its number, its title heading, its parsed document and walk."""

    entry: ChapterEntry
    number: str | None  # "3", "A", or None when unnumbered
    title: str = ""
    label: str | None = None  # the title heading's, "sec-ch03-long-context"
    document: qmd.Document | None = None
    items: list[qmd.Item] = field(default_factory=list)  # `qmd.walk`'s lines and cells

    @property
    def display(self) -> str:
        return self.entry.path

    @property
    def name(self) -> str:
        """How the book names it: "Chapter 3", "Appendix A", or its title when it has no number."""
        if self.number is None:
            return self.title
        return f"Appendix {self.number}" if self.entry.appendix else f"Chapter {self.number}"

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
    #: every label as written (its file, line, label, the prefixes it may have), numbered or not: `check` reads them
    labels: list[tuple[ChapterInfo, int, str, tuple[str, ...]]] = field(default_factory=list)
    problems: list[QmdError] = field(default_factory=list)

    def add(self, target: Target) -> None:
        first = self.targets.setdefault(target.label, target)
        if first is not target:
            self.duplicates.append((target, first))


def compute_numbering(book: Book) -> Numbering:
    """Number every chapter, section, figure, table and equation; a file that is missing or does not
    parse is numbered but empty; `problems` holds the parse errors and the fenced divs never closed or opened."""
    numbering = Numbering()
    chapters, appendices = 0, 0
    for entry in book.entries:
        doc, items, path = None, [], book.root / entry.path
        if path.is_file() and path.suffix == ".qmd":
            try:
                doc = parse_file(path, entry.path)
                items, problems = walk(doc)
                numbering.problems += problems
            except QmdError as exc:
                numbering.problems.append(exc)
        h1 = qmd.title_heading(items)
        if (Path(entry.path).stem == "index" and not entry.appendix) or (h1 is not None and h1.unnumbered):
            number = None
        elif entry.appendix:
            number, appendices = chr(ord("A") + appendices), appendices + 1
        else:
            number, chapters = str(chapters + 1), chapters + 1
        info = ChapterInfo(entry, number, h1.text if h1 else "", h1.label if h1 else None, doc, items)
        numbering.chapters.append(info)
        if doc is not None:
            _number_document(numbering, info, h1)
    return numbering


def _number_document(numbering: Numbering, info: ChapterInfo, h1: qmd.Heading | None) -> None:
    display = info.display
    counters = [0] * 7  # index = heading level
    counts = {"figure": 0, "table": 0, "equation": 0}

    def add(label: str, kind: str, line: int, title: str = "") -> None:
        counts[kind] += 1
        numbering.add(Target(label, kind, f"{info.number}.{counts[kind]}" if info.number else str(counts[kind]),
                             display, line, title))

    def site(label: str | None, line: int, *allowed: str) -> None:
        if label:
            numbering.labels.append((info, line, label, allowed))

    for item in info.items:
        if item.kind == "cell":
            label = item.cell.label or ""
            site(label if item.cell.executable else None, item.cell.line, "fig", "tbl")
            if item.cell.executable and label.startswith(("fig-", "tbl-")):
                kind, option = ("figure", "fig-cap") if label.startswith("fig-") else ("table", "tbl-cap")
                add(label, kind, item.cell.line, item.cell.option(option))
        elif item.kind == "heading":
            heading, number = item.heading, info.number or ""
            site(heading.label, item.line, "sec")
            if heading is not h1:  # the title heading carries the chapter's number
                number = ""
                if info.number is not None and not heading.unnumbered and heading.level >= 2:
                    counters[heading.level] += 1
                    counters[heading.level + 1 :] = [0] * (len(counters) - heading.level - 1)
                    number = ".".join([info.number] + [str(counters[level]) for level in range(2, heading.level + 1)])
            numbering.heading_numbers[(display, item.line)] = number
            if heading.label:
                kind = "chapter" if heading is h1 else "section"
                numbering.add(Target(heading.label, kind, number, display, item.line, heading.text))
        elif item.kind == "div_open" and item.div.identifier:
            site(item.div.identifier, item.line)  # a div figure or table: `check` refuses it
        elif item.kind == "text":
            caption = qmd.PIPE_CAPTION.match(item.text)
            if caption is not None:
                site(caption.group("label"), item.line, "tbl")
                add(caption.group("label"), "table", item.line, caption.group("caption"))
                continue
            for match in qmd.ATTRIBUTE_LABEL.finditer(qmd.EQUATION_LABEL.sub("", item.text)):
                site(match.group("label"), item.line)  # an image figure: `check` refuses it
            for match in qmd.EQUATION_LABEL.finditer(item.text):
                site(match.group("label"), item.line, "eq")
                if match.group("label").startswith("eq-"):
                    add(match.group("label"), "equation", item.line)

def book_numbering(root: Path | str | None = None) -> dict[str, Target]:
    """Every label in the book -> its Target: `book_numbering()["sec-ch03-rope"].text == "Section 3.4"`."""
    return compute_numbering(load_book(root)).targets
