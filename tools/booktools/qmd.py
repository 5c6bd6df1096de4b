"""The one `.qmd` parser: every other booktools step works on what it returns.

A Quarto document is split into its YAML front matter and a list of blocks:

- :class:`Markdown` — a run of markdown lines between fenced blocks;
- :class:`Cell` — a fenced block. ```` ```{python} ```` is an executable Python cell
  (``cell.is_python``); ```` ```{mermaid} ````, ```` ```python ```` and plain ```` ``` ````
  fences are cells too, with ``executable``/``lang`` saying which.

Line numbers are 1-based line numbers in the file, so every error can be reported
as ``chapters/FILE.qmd:LINE: what is wrong``.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

__all__ = [
    "BRACKET", "BRACKET_ITEM", "CITATION_KEY", "CODE_SPAN", "CROSSREF_PREFIXES", "CROSS_REFERENCE",
    "DISPLAY_MATH", "EQUATION_LABEL", "IMAGE_LABEL", "INLINE_EXPRESSION", "LABELLED_EQUATION",
    "PIPE_CAPTION", "REFERENCE", "Cell", "CellItem", "Div", "Line", "Document", "Heading", "Markdown",
    "QmdError", "parse", "parse_file", "parse_options", "parse_attributes", "parse_heading", "pandoc_slug",
    "inline_text", "walk",
]

# An opening fence: backticks or tildes (3 or more), then an info string.
_OPEN_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# `#| key: value` (Python, R), `%%| key: value` (mermaid), `//| key: value` (dot, ojs).
_OPTION_PREFIXES = ("#|", "%%|", "//|")
# libyaml's loader when present: the same YAML, several times faster (tangle stays well under 1 s).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<text>.*?)[ \t]*$")
_ATTRS = re.compile(r"[ \t]*\{(?P<attrs>[^{}]*)\}[ \t]*$")

# Quarto's syntax inside markdown. Each pattern is defined here once; numbering, check, the
# tangle, the notebook export, execution, the Quarto staging and the API appendix import them.
#: A citation key or label after `@`, as Pandoc reads it (inner punctuation must precede a word character).
CITATION_KEY = r"[A-Za-z0-9_](?:[\w-]|[:.#$%&+?<>~/](?=\w))*"
#: An inline code span (`` `x` ``, ``` ``x`` ```): its text is never a reference.
CODE_SPAN = re.compile(r"(`+)(?:[^`]|(?!\1)`)*?\1(?!`)", re.DOTALL)
#: `@key` or `-@key` anywhere in prose (inside brackets too), not in an e-mail address.
REFERENCE = re.compile(r"(?<![\w@\\`])(?P<minus>-)?@(?P<key>" + CITATION_KEY + ")")
#: A bracketed citation or cross-reference: `[@a]`, `[see @a, p. 3; @b]`, `[-@a]`.
BRACKET = re.compile(r"\[(?P<body>[^\[\]]*?-?@" + CITATION_KEY + r"[^\[\]]*)\](?![(\[{])")
#: One item of a bracket's `;`-separated list: prefix, optional `-`, key, suffix.
BRACKET_ITEM = re.compile(r"^(?P<prefix>.*?)(?P<minus>-)?@(?P<key>" + CITATION_KEY + r")(?P<suffix>.*)$", re.DOTALL)
#: The label prefixes of cross-references (anything else after `@` is a citation).
CROSSREF_PREFIXES = ("fig-", "tbl-", "eq-", "sec-")
#: A cross-reference label after `@` in code or a docstring (`@eq-ch03-kvbytes`).
CROSS_REFERENCE = re.compile(r"@(?P<label>(?:fig|tbl|eq|sec)-[A-Za-z0-9_-]*[A-Za-z0-9])")
#: The attribute block closing a display equation, `$$ {#eq-x}` (any label: `check` wants `eq-`).
EQUATION_LABEL = re.compile(r"\$\$[ \t]*\{[^}]*#(?P<label>[^\s}]+)[^}]*\}")
#: A whole labelled display equation, `$$ body $$ {#eq-x}`, across lines.
LABELLED_EQUATION = re.compile(
    r"\$\$(?P<body>(?:(?!\$\$).)*?)\$\$[ \t]*\{#(?P<label>eq-[^\s}]+)[^}]*\}", re.DOTALL
)
#: An image with a label, `![caption](path "title"){#fig-x fig-alt="..."}` (any label).
IMAGE_LABEL = re.compile(
    r"!\[(?P<caption>[^\]]*)\]\((?P<path>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)"
    r"\{(?P<attrs>[^}]*#(?P<label>[^\s}]+)[^}]*)\}"
)
#: A pipe table's caption line with its label, `: Caption {#tbl-x}`.
PIPE_CAPTION = re.compile(r"^:[ \t]+(?P<caption>.*?)[ \t]*\{#(?P<label>tbl-[^\s}]+)[^}]*\}[ \t]*$")
#: An inline expression, `` `{python} expr` ``: its value replaces it when the book is built.
INLINE_EXPRESSION = re.compile(r"`\{python\}[ \t]+(?P<expr>[^`]+?)[ \t]*`")
#: A display equation, `$$ ... $$`, across lines.
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)


def inline_text(result: dict) -> str:
    """An inline expression's value as Quarto prints it, from its `user_expressions` result.

    A `str` is its text (no quotes), an object with `_repr_markdown_` its markdown, anything
    else its `text/plain` form (its `repr`).
    """
    data = result.get("data", {})
    if "text/markdown" in data:
        return str(data["text/markdown"])
    plain = str(data.get("text/plain", ""))
    try:
        value = ast.literal_eval(plain)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return plain
    return value if isinstance(value, str) else plain


class QmdError(Exception):
    """A problem in a `.qmd` file, located at a file and line."""

    def __init__(self, path: str, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass
class Markdown:
    """A run of markdown lines (everything that is not a fenced block)."""

    line: int  # 1-based line of the first line
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Cell:
    """A fenced block: an executable cell (```` ```{python} ````) or any other fence."""

    line: int  # 1-based line of the opening fence
    end_line: int  # 1-based line of the closing fence
    fence: str  # the opening fence characters, e.g. "```"
    indent: str  # whitespace before the opening fence
    info: str  # the info string as written, e.g. "{python}", "python", ""
    lang: str  # "python", "mermaid", "" ...
    executable: bool  # True for the braced form {lang}
    lines: list[str]  # the body lines, without the fences
    option_lines: list[str] = field(default_factory=list)  # the leading `#|` lines
    options: dict = field(default_factory=dict)  # the `#|` lines parsed as YAML

    @property
    def is_python(self) -> bool:
        """Whether this is an executable Python cell (```` ```{python} ````)."""
        return self.executable and self.lang == "python"

    @property
    def code_lines(self) -> list[str]:
        """The body lines after the `#|` option lines."""
        return self.lines[len(self.option_lines) :]

    @property
    def code(self) -> str:
        return "\n".join(self.code_lines)

    @property
    def code_line(self) -> int:
        """File line of the first body line after the options."""
        return self.line + 1 + len(self.option_lines)

    @property
    def saved(self) -> bool:
        """Whether the first line after the `#|` options is `# @save`."""
        code = self.code_lines
        return bool(code) and _is_save_marker(code[0])

    @property
    def saved_code_lines(self) -> list[str]:
        """The lines after `# @save` (empty when the cell is not saved)."""
        return self.code_lines[1:] if self.saved else []

    @property
    def saved_code_line(self) -> int:
        """File line of the first line after `# @save`."""
        return self.code_line + 1

    @property
    def label(self) -> str | None:
        label = self.options.get("label")
        return str(label) if label is not None else None


def _is_save_marker(line: str) -> bool:
    stripped = line.strip()
    return stripped == "# @save" or stripped.startswith("# @save ")


@dataclass
class Heading:
    """An ATX heading found in a markdown block."""

    line: int
    level: int
    text: str  # heading text without the attribute block
    label: str | None  # `#sec-...` id, if any
    classes: list[str]

    @property
    def unnumbered(self) -> bool:
        return "unnumbered" in self.classes or "-" in self.classes


@dataclass
class Document:
    """A parsed `.qmd` file."""

    path: Path
    display: str  # the path used in messages, e.g. "chapters/ch03-long-context.qmd"
    front_matter: dict
    front_matter_lines: int  # how many lines the front matter takes (0 when none)
    blocks: list[Markdown | Cell]

    @property
    def cells(self) -> list[Cell]:
        return [block for block in self.blocks if isinstance(block, Cell)]

    @property
    def python_cells(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.is_python]

    @property
    def markdown(self) -> list[Markdown]:
        return [block for block in self.blocks if isinstance(block, Markdown)]

    def headings(self) -> list[Heading]:
        """Every ATX heading in markdown blocks (never inside fences), in order."""
        found = []
        for block in self.markdown:
            for offset, text in enumerate(block.lines):
                heading = parse_heading(text, block.line + offset)
                if heading is not None:
                    found.append(heading)
        return found

    def error(self, line: int, message: str) -> QmdError:
        return QmdError(self.display, line, message)

    @cached_property
    def section_ids(self) -> list[tuple[Heading, str]]:
        """Every section heading with the id Pandoc (and so Quarto) gives it: its label, else its slug.

        Headings that give a callout its title are not sections and are left out, but their
        slugs are taken, as Pandoc takes them before the callout consumes the heading.
        Computed once per document (the API reference asks for it once per entry).
        """
        found: list[tuple[Heading, str]] = []
        used: set[str] = set()
        items, _ = walk(self)
        for item in items:
            if not isinstance(item, Line) or item.kind != "heading" or item.in_math:
                continue
            heading = item.heading
            ident = heading.label or pandoc_slug(heading.text)
            base, number = ident, 1
            while ident in used:
                ident = f"{base}-{number}"
                number += 1
            used.add(ident)
            if not item.callout_title:
                found.append((heading, ident))
        return found


def pandoc_slug(text: str) -> str:
    """The identifier Pandoc gives a heading that has no label (its `auto_identifiers` rule)."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[*$]", "", text)
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_-. \n\t")
    text = re.sub(r"\s+", "-", text.strip())
    text = re.sub(r"^[^a-z]+", "", text)
    return text or "section"


def parse_heading(text: str, line: int = 0) -> Heading | None:
    """Parse one markdown line as an ATX heading (None when it is not one)."""
    match = _HEADING.match(text)
    if match is None:
        return None
    body = match.group("text")
    # Closing hashes ("## Title ##") are allowed by Pandoc.
    body = re.sub(r"[ \t]+#+[ \t]*$", "", body)
    label, classes = None, []
    attrs = _ATTRS.search(body)
    if attrs is not None:
        body = body[: attrs.start()].rstrip()
        for token in attrs.group("attrs").split():
            if token.startswith("#"):
                label = token[1:]
            elif token.startswith("."):
                classes.append(token[1:])
            elif token == "-":
                classes.append("-")
    return Heading(line, len(match.group("hashes")), body, label, classes)


def parse_options(lines: list[str], display: str, first_line: int) -> tuple[list[str], dict]:
    """Split the leading `#|` option lines off a cell body and parse them as YAML.

    Returns:
        (option_lines, options): the raw option lines and the mapping they hold.

    Raises:
        QmdError: the options are not valid YAML or not a mapping.
    """
    option_lines: list[str] = []
    for text in lines:
        stripped = text.lstrip()
        if stripped.startswith(_OPTION_PREFIXES):
            option_lines.append(text)
        else:
            break
    if not option_lines:
        return [], {}
    yaml_lines = []
    for text in option_lines:
        stripped = text.lstrip()
        for prefix in _OPTION_PREFIXES:
            if stripped.startswith(prefix):
                rest = stripped[len(prefix) :]
                yaml_lines.append(rest[1:] if rest.startswith(" ") else rest)
                break
    options = _load_yaml(yaml_lines, display, first_line, "cell options (#| lines)", "`key: value` lines")
    return option_lines, options


def _load_yaml(lines: list[str], display: str, first_line: int, what: str, wanted: str) -> dict:
    """`lines` (starting at file line `first_line`) read as a YAML mapping; {} when empty."""
    try:
        loaded = yaml.load("\n".join(lines), Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = first_line + min(mark.line if mark is not None else 0, max(len(lines) - 1, 0))
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise QmdError(display, line, f"{what} is not valid YAML: {problem}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise QmdError(display, first_line, f"{what} must be {wanted}")
    return loaded or {}


def _parse_info(info: str) -> tuple[str, bool]:
    """Return (lang, executable) from a fence's info string."""
    info = info.strip()
    if info.startswith("{") and info.endswith("}"):
        inner = info[1:-1].strip()
        if inner.startswith("."):
            # {.python} is a displayed (non-executed) block in Pandoc syntax.
            return inner[1:].split()[0].lower() if inner[1:] else "", False
        if inner.startswith("="):
            return inner[1:].split()[0].lower() if inner[1:] else "", False
        word = re.split(r"[\s,]", inner, maxsplit=1)[0] if inner else ""
        return word.lower(), bool(word)
    word = info.split()[0] if info else ""
    return word.lower(), False


def parse(text: str, display: str = "<string>", path: Path | None = None) -> Document:
    """Parse `.qmd` text.

    Args:
        text: the file's contents.
        display: the path to name in errors (e.g. "chapters/ch03-long-context.qmd").
        path: the file's path, kept on the returned document.

    Returns:
        The document: front matter and blocks with 1-based line numbers.

    Raises:
        QmdError: unclosed front matter or fence, invalid YAML (front matter or `#|` options).
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline does not start another line
    index = 0
    front_matter: dict = {}
    front_matter_lines = 0
    if lines and lines[0].rstrip() == "---":
        for end in range(1, len(lines)):
            if lines[end].rstrip() in ("---", "..."):
                break
        else:
            raise QmdError(display, 1, "front matter opened with --- is never closed")
        front_matter = _load_yaml(lines[1:end], display, 2, "front matter", "a YAML mapping")
        front_matter_lines = end + 1
        index = end + 1

    blocks: list[Markdown | Cell] = []
    pending_start = index  # 0-based index of the first markdown line not yet in a block
    while index <= len(lines):
        match = _OPEN_FENCE.match(lines[index]) if index < len(lines) else None
        if match is not None and (match.group("fence")[0] == "`" and "`" in match.group("info")):
            match = None  # a line like ```a``` is inline code, not a fence
        if index == len(lines) or match is not None:
            if index > pending_start:
                blocks.append(Markdown(pending_start + 1, lines[pending_start:index]))
            if match is None:
                break
            fence, info = match.group("fence"), match.group("info").strip()
            close = next((probe for probe in range(index + 1, len(lines)) if lines[probe].strip()
                          and set(lines[probe].strip()) == {fence[0]} and len(lines[probe].strip()) >= len(fence)), None)
            if close is None:
                raise QmdError(display, index + 1, f"code fence {fence}{info} is never closed")
            lang, executable = _parse_info(info)
            cell = Cell(index + 1, close + 1, fence, match.group("indent"), info, lang, executable, lines[index + 1 : close])
            if executable:
                cell.option_lines, cell.options = parse_options(cell.lines, display, index + 2)
            blocks.append(cell)
            index = pending_start = close + 1
            continue
        index += 1
    return Document(path or Path(display), display, front_matter, front_matter_lines, blocks)


def parse_file(path: Path | str, root: Path | str | None = None) -> Document:
    """Read and parse a `.qmd` file; errors name it relative to `root` when given."""
    path = Path(path)
    display = str(path)
    if root is not None:
        try:
            display = path.resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            display = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QmdError(display, 0, "file not found") from None
    return parse(text, display, path)


# ---------------------------------------------------------------------------
# Markdown structure: fenced divs (callouts), headings, display maths.
# ---------------------------------------------------------------------------

_DIV_OPEN = re.compile(r"^(?P<colons>:{3,})[ \t]*(?:\{(?P<attrs>[^{}]*)\}|(?P<cls>[A-Za-z][\w-]*))[ \t]*(?::*)[ \t]*$")
_DIV_CLOSE = re.compile(r"^:{3,}[ \t]*$")
_ATTR_PAIR = re.compile(r"""(?P<key>[A-Za-z_][\w-]*)=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s"']+))""")
CALLOUT_TITLES = {
    "note": "Note",
    "tip": "Tip",
    "warning": "Warning",
    "important": "Important",
    "caution": "Caution",
}


@dataclass
class Div:
    """A Pandoc fenced div (`::: {.callout-note title="X"}` ... `:::`)."""

    line: int
    identifier: str | None
    classes: list[str]
    attributes: dict[str, str]
    title: str | None = None  # callouts: from title="..." or a leading heading

    @property
    def callout_type(self) -> str | None:
        """"note", "tip", ... for a callout, else None."""
        for name in self.classes:
            if name.startswith("callout-"):
                return name[len("callout-") :]
        return None

    @property
    def collapse(self) -> bool:
        return str(self.attributes.get("collapse", "false")).lower() == "true"

    @property
    def display_title(self) -> str:
        kind = self.callout_type or ""
        return self.title or CALLOUT_TITLES.get(kind, kind.capitalize() or "Note")


def parse_attributes(text: str) -> tuple[str | None, list[str], dict[str, str]]:
    """Parse a Pandoc attribute block's inside: `#id .class key="value"`."""
    identifier, classes, attributes = None, [], {}
    rest = text
    for match in _ATTR_PAIR.finditer(text):
        value = match.group("dq") if match.group("dq") is not None else match.group("sq")
        if value is None:
            value = match.group("bare")
        attributes[match.group("key")] = value
    rest = _ATTR_PAIR.sub(" ", text)
    for token in rest.split():
        if token.startswith("#") and len(token) > 1:
            identifier = token[1:]
        elif token.startswith(".") and len(token) > 1:
            classes.append(token[1:])
    return identifier, classes, attributes


@dataclass
class Line:
    """One markdown line, classified, with the fenced divs open around it."""

    kind: str  # "text", "blank", "heading", "div_open", "div_close"
    line: int
    text: str
    divs: tuple[Div, ...]  # open divs, outermost first (for div_open: including the new one)
    in_math: bool = False  # inside a $$ ... $$ display (the $$ lines included)
    heading: Heading | None = None
    div: Div | None = None  # the div opened or closed
    callout_title: bool = False  # a heading that gives its callout's title


@dataclass
class CellItem:
    """A fenced block in document order, with the fenced divs open around it."""

    cell: Cell
    divs: tuple[Div, ...]


def walk(doc: Document) -> tuple[list[Line | CellItem], list[QmdError]]:
    """Classify every markdown line and cell in order, tracking fenced divs across cells.

    Returns:
        (items, problems): problems are unclosed or unopened divs (not fatal).
    """
    items: list[Line | CellItem] = []
    problems: list[QmdError] = []
    stack: list[Div] = []
    in_math = False
    awaiting_title: Div | None = None
    for block in doc.blocks:
        if isinstance(block, Cell):
            items.append(CellItem(block, tuple(stack)))
            awaiting_title = None
            continue
        for offset, text in enumerate(block.lines):
            number = block.line + offset
            if in_math:
                if text.count("$$") % 2 == 1:
                    in_math = False
                items.append(Line("text", number, text, tuple(stack), in_math=True))
                continue
            if not text.strip():
                items.append(Line("blank", number, text, tuple(stack)))
                continue
            opened = _DIV_OPEN.match(text)
            if opened is not None:
                if opened.group("attrs") is not None:
                    identifier, classes, attributes = parse_attributes(opened.group("attrs"))
                else:
                    identifier, classes, attributes = None, [opened.group("cls")], {}
                div = Div(number, identifier, classes, attributes, attributes.get("title"))
                stack.append(div)
                items.append(Line("div_open", number, text, tuple(stack), div=div))
                awaiting_title = div if div.callout_type and div.title is None else None
                continue
            if _DIV_CLOSE.match(text):
                if stack:
                    div = stack.pop()
                    items.append(Line("div_close", number, text, tuple(stack), div=div))
                else:
                    problems.append(doc.error(number, "`:::` closes a fenced div that was never opened"))
                    items.append(Line("text", number, text, tuple(stack)))
                awaiting_title = None
                continue
            heading = parse_heading(text, number)
            if heading is not None:
                is_title = awaiting_title is not None
                if is_title:
                    awaiting_title.title = heading.text
                items.append(Line("heading", number, text, tuple(stack), heading=heading, callout_title=is_title))
                awaiting_title = None
                continue
            awaiting_title = None
            if text.count("$$") % 2 == 1:
                in_math = True
                items.append(Line("text", number, text, tuple(stack), in_math=True))
                continue
            items.append(Line("text", number, text, tuple(stack), in_math="$$" in text))
    for div in stack:
        problems.append(doc.error(div.line, "fenced div opened here (`:::`) is never closed"))
    return items, problems
