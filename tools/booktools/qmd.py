"""The one `.qmd` parser: front matter, then blocks (`Markdown` runs and fenced `Cell`s), with
1-based file lines, so every problem reads `chapters/FILE.qmd:LINE: message`; `walk` adds the
fenced divs (callouts) and display maths around each line."""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

_OPEN_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# `#| key: value` (Python), `%%| key: value` (mermaid), `//| key: value` (dot, ojs)
_OPTION_LINE = re.compile(r"^\s*(?:#|%%|//)\| ?")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: several times faster
_HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<text>.*?)[ \t]*$")
_ATTRS = re.compile(r"[ \t]*\{(?P<attrs>[^{}]*)\}[ \t]*$")

# Quarto's syntax inside markdown, defined once for every step.
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
LABELLED_EQUATION = re.compile(r"\$\$(?P<body>(?:(?!\$\$).)*?)\$\$[ \t]*\{#(?P<label>eq-[^\s}]+)[^}]*\}", re.DOTALL)
#: A figure or table label in a markdown attribute block, `![a](b.png){#fig-x}`: the tools number none.
ATTRIBUTE_LABEL = re.compile(r"\{[^}]*#(?P<label>(?:fig|tbl)-[^\s}]+)[^}]*\}")
#: A pipe table's caption line with its label, `: Caption {#tbl-x}`.
PIPE_CAPTION = re.compile(r"^:[ \t]+(?P<caption>.*?)[ \t]*\{#(?P<label>tbl-[^\s}]+)[^}]*\}[ \t]*$")
#: An inline expression, `` `{python} expr` ``.
INLINE_EXPRESSION = re.compile(r"`\{python\}[ \t]+(?P<expr>[^`]+?)[ \t]*`")
#: A display equation, `$$ ... $$`, across lines.
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.DOTALL)


def inline_text(result: dict) -> str:
    """An inline value as Quarto prints it from its `user_expressions` result: a str without quotes,
    `text/markdown` as it is, anything else its `text/plain` (its repr)."""
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
        self.path, self.line, self.message = path, line, message


@dataclass
class Markdown:
    line: int  # file line of the first line
    lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Cell:
    """A fenced block: executable (```` ```{python} ````, ```` ```{mermaid} ````) or shown (```` ```python ````)."""

    line: int  # the opening fence's line
    fence: str  # e.g. "```"
    indent: str  # whitespace before the opening fence
    info: str  # as written: "{python}", "python", ""
    lang: str
    executable: bool  # the braced form {lang}
    lines: list[str]  # the body, without the fences and without the fence's indent
    option_lines: list[str] = field(default_factory=list)  # the leading `#|` lines
    options: dict = field(default_factory=dict)  # those lines read as YAML

    @property
    def is_python(self) -> bool:
        return self.executable and self.lang == "python"

    @property
    def code_lines(self) -> list[str]:
        return self.lines[len(self.option_lines) :]

    @property
    def code(self) -> str:
        return "\n".join(self.code_lines)

    @property
    def code_line(self) -> int:
        return self.line + 1 + len(self.option_lines)

    @property
    def saved(self) -> bool:
        """Whether the first line after the options is `# @save`."""
        first = self.code_lines[0].strip() if self.code_lines else ""
        return first == "# @save" or first.startswith("# @save ")

    @property
    def saved_code_lines(self) -> list[str]:
        return self.code_lines[1:] if self.saved else []

    @property
    def saved_code_line(self) -> int:
        return self.code_line + 1

    @property
    def label(self) -> str | None:
        return self.option("label") or None

    def option(self, name: str) -> str:
        """An option's value as text ("" when the cell has none)."""
        return str(self.options.get(name) or "")


@dataclass
class Heading:
    line: int
    level: int
    text: str  # without the attribute block
    label: str | None  # `#sec-...`
    unnumbered: bool  # `{.unnumbered}` or `{-}`


@dataclass
class Document:
    display: str  # the path named in messages, e.g. "chapters/ch03-long-context.qmd"
    front_matter: dict
    front_matter_lines: int  # 0 when there is none
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

    def error(self, line: int, message: str) -> QmdError:
        return QmdError(self.display, line, message)


def parse_heading(text: str, line: int = 0) -> Heading | None:
    """One markdown line as an ATX heading, or None."""
    match = _HEADING.match(text)
    if match is None:
        return None
    body = re.sub(r"[ \t]+#+[ \t]*$", "", match.group("text"))  # closing hashes, "## Title ##"
    label, unnumbered = None, False
    attrs = _ATTRS.search(body)
    if attrs is not None:
        body = body[: attrs.start()].rstrip()
        label, classes, _ = parse_attributes(attrs.group("attrs"))
        unnumbered = "unnumbered" in classes
    return Heading(line, len(match.group("hashes")), body, label, unnumbered)


def parse_options(lines: list[str], display: str, first_line: int) -> tuple[list[str], dict]:
    """The leading `#|` lines of a cell body, and the mapping they hold (QmdError if not YAML)."""
    option_lines = list(itertools.takewhile(_OPTION_LINE.match, lines))
    yaml_lines = [_OPTION_LINE.sub("", text, count=1) for text in option_lines]
    return option_lines, _load_yaml(yaml_lines, display, first_line, "cell options (#| lines)", "`key: value` lines")


def _load_yaml(lines: list[str], display: str, first_line: int, what: str, wanted: str) -> dict:
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


def parse(text: str, display: str = "<string>") -> Document:
    """Parse `.qmd` text; QmdError for an unclosed front matter or fence, or invalid YAML."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline does not start another line
    start, front_matter, front_matter_lines = 0, {}, 0
    if lines and lines[0].rstrip() == "---":
        end = next((end for end in range(1, len(lines)) if lines[end].rstrip() in ("---", "...")), None)
        if end is None:
            raise QmdError(display, 1, "front matter opened with --- is never closed")
        front_matter = _load_yaml(lines[1:end], display, 2, "front matter", "a YAML mapping")
        start = front_matter_lines = end + 1
    blocks: list[Markdown | Cell] = []
    index = pending = start  # pending: the first markdown line not yet in a block
    while index < len(lines):
        match = _OPEN_FENCE.match(lines[index])
        if match is None or match.group("fence")[0] == "`" and "`" in match.group("info"):  # ```a``` is inline code
            index += 1
            continue
        if index > pending:
            blocks.append(Markdown(pending + 1, lines[pending:index]))
        fence, info = match.group("fence"), match.group("info").strip()
        close = next((probe for probe in range(index + 1, len(lines)) if lines[probe].strip()
                      and set(lines[probe].strip()) == {fence[0]} and len(lines[probe].strip()) >= len(fence)), None)
        if close is None:
            raise QmdError(display, index + 1, f"code fence {fence}{info} is never closed")
        braced = info.startswith("{") and info.endswith("}")
        word = (re.split(r"[\s,]", info[1:-1].strip() if braced else info, maxsplit=1)[0]).lower()
        executable = braced and word[:1].isalpha()  # not {.python} (shown) nor {=html} (raw)
        cell = Cell(index + 1, fence, match.group("indent"), info, word.lstrip(".="), executable,
                    [text.removeprefix(match.group("indent")) for text in lines[index + 1 : close]])
        if executable:
            cell.option_lines, cell.options = parse_options(cell.lines, display, index + 2)
        blocks.append(cell)
        index = pending = close + 1
    if pending < len(lines):
        blocks.append(Markdown(pending + 1, lines[pending:]))
    return Document(display, front_matter, front_matter_lines, blocks)


def parse_file(path: Path | str, display: str | None = None) -> Document:
    """Read and parse a `.qmd` file; messages name it `display` (by default, the path as given)."""
    return parse(Path(path).read_text(encoding="utf-8"), display or str(path))


# Fenced divs (callouts), headings and display maths, line by line.

_DIV_OPEN = re.compile(r"^(?P<colons>:{3,})[ \t]*(?:\{(?P<attrs>[^{}]*)\}|(?P<cls>[A-Za-z][\w-]*))[ \t]*(?::*)[ \t]*$")
_DIV_CLOSE = re.compile(r"^:{3,}[ \t]*$")
_ATTR_PAIR = re.compile(r"""(?P<key>[A-Za-z_][\w-]*)=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>[^\s"']+))""")


@dataclass
class Div:
    """A Pandoc fenced div (`::: {.callout-note title="X"}` ... `:::`)."""

    line: int
    identifier: str | None
    classes: list[str]
    attributes: dict[str, str]

    @property
    def callout_type(self) -> str | None:
        """"note", "tip", ... for a callout, else None."""
        return next((name.removeprefix("callout-") for name in self.classes if name.startswith("callout-")), None)

    @property
    def collapse(self) -> bool:
        return str(self.attributes.get("collapse", "false")).lower() == "true"

    @property
    def display_title(self) -> str:
        return self.attributes.get("title") or (self.callout_type or "").capitalize() or "Note"


def parse_attributes(text: str) -> tuple[str | None, list[str], dict[str, str]]:
    """A Pandoc attribute block's inside, `#id .class key="value"`: (id, classes, attributes); `-` is
    Pandoc's short form of the class `unnumbered`."""
    attributes = {m.group("key"): next(v for v in m.group("dq", "sq", "bare") if v is not None)
                  for m in _ATTR_PAIR.finditer(text)}
    tokens = [".unnumbered" if token == "-" else token for token in _ATTR_PAIR.sub(" ", text).split()]
    identifier = next((token[1:] for token in reversed(tokens) if token.startswith("#") and len(token) > 1), None)
    return identifier, [token[1:] for token in tokens if token.startswith(".") and len(token) > 1], attributes


@dataclass
class Item:
    """One markdown line, classified, or a fenced block, with the fenced divs open around it."""

    kind: str  # "text", "heading", "div_open", "div_close", "cell"
    line: int
    text: str  # the markdown line ("" for a cell)
    divs: tuple[Div, ...]  # open divs, outermost first (for div_open: including the new one)
    in_math: bool = False  # inside a $$ ... $$ display, the $$ lines included
    heading: Heading | None = None
    div: Div | None = None  # the div opened or closed
    cell: Cell | None = None


def walk(doc: Document) -> tuple[list[Item], list[QmdError]]:
    """Every markdown line and cell in order, with the divs open around it; and the unclosed or unopened divs."""
    items: list[Item] = []
    problems: list[QmdError] = []
    stack: list[Div] = []
    in_math = False
    for block in doc.blocks:
        if isinstance(block, Cell):
            items.append(Item("cell", block.line, "", tuple(stack), cell=block))
            continue
        for number, text in enumerate(block.lines, block.line):
            opened, heading = _DIV_OPEN.match(text), parse_heading(text, number)
            if in_math or text.count("$$") % 2 == 1 and opened is None and heading is None:
                in_math = in_math != (text.count("$$") % 2 == 1)
                items.append(Item("text", number, text, tuple(stack), in_math=True))
            elif opened is not None:
                attrs = opened.group("attrs")
                div = Div(number, *parse_attributes(f".{opened.group('cls')}" if attrs is None else attrs))
                stack.append(div)
                items.append(Item("div_open", number, text, tuple(stack), div=div))
            elif _DIV_CLOSE.match(text) and stack:
                div = stack.pop()
                items.append(Item("div_close", number, text, tuple(stack), div=div))
            elif heading is not None:
                items.append(Item("heading", number, text, tuple(stack), heading=heading))
            else:  # prose, or a `:::` that closes nothing
                if _DIV_CLOSE.match(text):
                    problems.append(doc.error(number, "`:::` closes a fenced div that was never opened"))
                items.append(Item("text", number, text, tuple(stack), in_math="$$" in text))
    problems += [doc.error(div.line, "fenced div opened here (`:::`) is never closed") for div in stack]
    return items, problems


def title_heading(items: list[Item]) -> Heading | None:
    """The first level-1 heading of a walk (none in maths): the file's title."""
    return next((item.heading for item in items if item.kind == "heading" and item.heading.level == 1), None)
