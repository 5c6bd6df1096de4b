"""A small BibTeX reader: enough to turn `[@key]` into "(Author Year)"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BibEntry", "BibError", "parse_bibtex", "load_bibliography"]

_ENTRY_START = re.compile(r"@(?P<type>[A-Za-z]+)\s*[{(]\s*(?P<key>[^,\s]+)\s*,")
_FIELD_NAME = re.compile(r"\s*(?P<name>[A-Za-z][\w-]*)\s*=\s*")


class BibError(Exception):
    """A malformed BibTeX file."""


@dataclass(frozen=True)
class BibEntry:
    key: str
    entry_type: str
    fields: dict[str, str]
    line: int

    @property
    def authors(self) -> list[str]:
        """Surnames of the authors (or editors, or an organisation) in order."""
        names = self.fields.get("author") or self.fields.get("editor") or ""
        surnames = []
        for name in re.split(r"\s+and\s+", names.strip()) if names.strip() else []:
            surnames.append(_surname(name))
        return [name for name in surnames if name]

    @property
    def year(self) -> str:
        year = self.fields.get("year") or ""
        if not year:
            match = re.match(r"\d{4}", self.fields.get("date", ""))
            year = match.group(0) if match else "n.d."
        return _plain(year)

    @property
    def author_text(self) -> str:
        """ "Vaswani et al.", "Su and Lu", "Xiao" — the first author's surname, as cited."""
        names = self.authors
        if not names:
            return _plain(self.fields.get("organization") or self.fields.get("title") or self.key)
        if len(names) == 1:
            return names[0]
        if len(names) == 2:
            return f"{names[0]} and {names[1]}"
        return f"{names[0]} et al."

    @property
    def title(self) -> str:
        return _plain(self.fields.get("title", ""))


def _plain(text: str) -> str:
    """Drop BibTeX braces and simple escapes."""
    text = re.sub(r"\\[`'^\"~=.]\{?([A-Za-z])\}?", r"\1", text)
    text = text.replace("\\&", "&").replace("--", "\u2013")
    return re.sub(r"\s+", " ", text.replace("{", "").replace("}", "")).strip()


def _surname(name: str) -> str:
    name = name.strip()
    if not name:
        return ""
    if name.startswith("{") and name.endswith("}") and name.count("{") == 1:
        return _plain(name)  # {OpenAI}: an organisation, kept whole
    if "," in name:
        return _plain(name.split(",", 1)[0])
    # "First von Last": the last word, with braces protecting multi-word surnames.
    tokens = re.findall(r"\{[^{}]*\}|\S+", name)
    return _plain(tokens[-1]) if tokens else ""


def _read_value(text: str, index: int) -> tuple[str, int]:
    """Read one field value starting at `index` (braced, quoted, bare, joined by #)."""
    parts = []
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            raise BibError("unexpected end of file in a field value")
        char = text[index]
        if char == "{":
            depth, start = 0, index
            while index < len(text):
                if text[index] == "{":
                    depth += 1
                elif text[index] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                index += 1
            else:
                raise BibError("unbalanced braces in a field value")
            parts.append(text[start + 1 : index])
            index += 1
        elif char == '"':
            start = index + 1
            index = start
            depth = 0
            while index < len(text) and not (text[index] == '"' and depth == 0):
                depth += {"{": 1, "}": -1}.get(text[index], 0)
                index += 1
            parts.append(text[start:index])
            index += 1
        else:
            match = re.match(r"[^\s,#})]+", text[index:])
            if match is None:
                raise BibError(f"cannot read a field value at {text[index:index + 20]!r}")
            parts.append(match.group(0))
            index += match.end()
        while index < len(text) and text[index].isspace():
            index += 1
        if index < len(text) and text[index] == "#":
            index += 1
            continue
        return "".join(parts), index


def parse_bibtex(text: str, display: str = "references.bib", problems: list[str] | None = None) -> dict[str, BibEntry]:
    """Parse BibTeX text into entries by key.

    A repeated key keeps its first entry; when `problems` is given, each repeat is
    reported there as "FILE:LINE: message".
    """
    entries: dict[str, BibEntry] = {}
    index = 0
    while True:
        at = text.find("@", index)
        if at < 0:
            return entries
        line = text.count("\n", 0, at) + 1
        match = _ENTRY_START.match(text, at)
        if match is None:
            kind = re.match(r"@(\w+)", text[at:])
            if kind and kind.group(1).lower() in ("comment", "preamble", "string"):
                index = at + 1
                continue
            index = at + 1
            continue
        key, entry_type = match.group("key"), match.group("type").lower()
        index = match.end()
        fields: dict[str, str] = {}
        while True:
            while index < len(text) and text[index] in " \t\r\n,":
                index += 1
            if index >= len(text):
                raise BibError(f"{display}:{line}: entry {key} is never closed")
            if text[index] in "})":
                index += 1
                break
            name = _FIELD_NAME.match(text, index)
            if name is None:
                raise BibError(f"{display}:{text.count(chr(10), 0, index) + 1}: cannot read a field of entry {key}")
            try:
                value, index = _read_value(text, name.end())
            except BibError as exc:
                raise BibError(f"{display}:{line}: entry {key}: {exc}") from None
            fields[name.group("name").lower()] = value
        if key in entries:
            if problems is not None:
                problems.append(f"{display}:{line}: duplicate key {key} (first at line {entries[key].line})")
            continue
        entries[key] = BibEntry(key, entry_type, fields, line)


def load_bibliography(paths: list[Path], problems: list[str] | None = None) -> dict[str, BibEntry]:
    """Parse .bib files (in order, first entry of a key wins); absent files add nothing."""
    entries: dict[str, BibEntry] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if problems is not None:
                problems.append(f"{path.name}:0: bibliography file does not exist")
            continue
        for key, entry in parse_bibtex(text, path.name, problems).items():
            entries.setdefault(key, entry)
    return entries
