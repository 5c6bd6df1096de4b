"""The notation appendix's promises, checked against the chapters' own text.

``data/notation.json`` is the one list of the book's symbols: the appendix
(chapters/appendix-notation.qmd) renders it as its table, and these tests read
the chapters' prose (code cells left out) to check that

- every symbol appears in the section the list says defines it;
- every symbol table a chapter shows (a Markdown table whose first header is
  "Symbol", or a table a cell builds from a ``meanings`` dict) gives a listed
  symbol a meaning that carries one of the list's keywords for it, and gives an
  indexed symbol such as ``s_j`` (an element of ``s``) its letter's meaning;
- no chapter writes a listed letter with a counting subscript (``B_t``,
  ``a_t``) for an element that is not one of that letter's quantity;
- chapter prose writes memory in KiB, MiB or GiB: KB, MB, GB or TB only in
  the names of the devices that are sold that way, or as a rate (GB/s).
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.qmd")) + [ROOT / "index.qmd"]
NOTATION = json.loads((ROOT / "data" / "notation.json").read_text())["symbols"]
BY_LATEX = {entry["latex"]: entry for entry in NOTATION}

# Indexed forms of a listed letter that the chapters write, each an element of
# that letter's quantity (E_t: the input map E of Mamba's step t), or (T_k, d_k) a count
# of tokens or a width named for the keys.
CONSISTENT_INDEXED = {"\\Delta_t", "\\sigma_j", "T_k", "d_k", "E_t"}

# Where a decimal unit may stand for memory: an accelerator's product name, as sold.
ALLOWED_GB = ("80 GB", "80GB")

# A subscript that numbers the elements of a symbol: s_j is an entry of s.
INDEX_SUBSCRIPT = re.compile(r"^(?P<base>\\?[A-Za-z]+)_(?:\{)?(?P<index>[ijklmnt]|\d+)(?:\})?$")
# One symbol inside math: a letter or a command, with its subscript if any.
SYMBOL = re.compile(r"\\[A-Za-z]+(?:_\{[^}]*\}|_[A-Za-z0-9])?|[A-Za-z](?:_\{[^}]*\}|_[A-Za-z0-9])?")
MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
HEADING = re.compile(r"^(#+) .*\{#(sec-[\w-]+)\}", re.M)


def prose(text: str) -> str:
    """The text with every fenced block and inline code span blanked, lines kept."""
    text = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)


def code_cells(text: str) -> list[str]:
    """The bodies of the chapter's executable Python cells."""
    return re.findall(r"^```\{python\}\n(.*?)^```", text, re.S | re.M)


def normalise(latex: str) -> str:
    """One spelling per symbol: ``H_\\text{kv}`` and ``H_{\\text{kv}}`` become ``H_{kv}``."""
    latex = re.sub(r"_\{?\\(?:text|mathrm)\{([^}]*)\}\}?", r"_{\1}", latex)
    latex = re.sub(r"_\{([A-Za-z0-9])\}", r"_\1", latex)
    # words and bold vectors are not the book's symbols
    return re.sub(r"\\(?:text|operatorname|mathrm|mathbf|boldsymbol|mathcal)\{[^}]*\}", " ", latex)


def math_symbols(text: str) -> set[str]:
    """Every symbol written inside the math of ``text`` (already prose only)."""
    found: set[str] = set()
    for match in MATH.finditer(text):
        found |= set(SYMBOL.findall(normalise(match.group(1) or match.group(2))))
    return found


@functools.cache
def chapter_prose(path: Path) -> str:
    return prose(path.read_text())


def section_text(label: str) -> str:
    """The prose of the section labelled ``label``, up to the next heading of its level or above."""
    for path in CHAPTERS:
        text = chapter_prose(path)
        headings = list(HEADING.finditer(text))
        for number, heading in enumerate(headings):
            if heading.group(2) != label:
                continue
            level = len(heading.group(1))
            end = next((h.start() for h in headings[number + 1:] if len(h.group(1)) <= level), len(text))
            return text[heading.start():end]
    raise AssertionError(f"no section is labelled {label}")


def table_rows(path: Path) -> list[tuple[str, str]]:
    """(symbol, meaning) for every row of the chapter's symbol tables."""
    raw = path.read_text()
    rows: list[tuple[str, str]] = []
    lines = prose(raw).splitlines()
    for number, line in enumerate(lines):
        if not re.match(r"^\|\s*Symbol\s*\|", line, re.I):
            continue
        for row in lines[number + 2:]:
            if not row.startswith("|"):
                break
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            for symbol in re.findall(r"\$([^$]+)\$", cells[0]):
                for part in symbol.split(","):
                    rows.append((normalise(part).strip(), cells[1]))
    # tables a cell builds, such as @tbl-ch03-symbols: a literal dict named `meanings`
    for cell in code_cells(raw):
        for node in ast.walk(ast.parse(cell)):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "meanings" for t in node.targets
            ):
                for symbol, meaning in ast.literal_eval(node.value).items():
                    base, _, sub = symbol.partition("_")
                    rows.append((normalise(f"{base}_{{{sub}}}" if sub else base), meaning))
    return rows


def notation_entry(symbol: str) -> dict | None:
    """The notation entry a table's symbol must agree with: its own, or its letter's for an indexed one."""
    if symbol in BY_LATEX:
        return BY_LATEX[symbol]
    indexed = INDEX_SUBSCRIPT.match(symbol)
    if indexed and indexed.group("base") in BY_LATEX:
        return BY_LATEX[indexed.group("base")]
    return None


def table_conflicts(paths: list[Path]) -> dict[tuple[str, str], str]:
    """(file, symbol) -> meaning, for every symbol-table row that contradicts the notation."""
    conflicts = {}
    for path in paths:
        for symbol, meaning in table_rows(path):
            entry = notation_entry(symbol)
            if entry and not any(word in meaning.lower() for word in entry["keywords"]):
                conflicts[(path.name, symbol)] = meaning
    return conflicts


def test_notation_lists_each_symbol_once_with_all_its_fields():
    latex = [entry["latex"] for entry in NOTATION]
    assert len(latex) == len(set(latex))
    for entry in NOTATION:
        assert set(entry) == {"latex", "meaning", "unit", "section", "keywords"}, entry
        assert entry["keywords"] and all(word == word.lower() for word in entry["keywords"]), entry


@pytest.mark.parametrize("entry", NOTATION, ids=[entry["latex"] for entry in NOTATION])
def test_every_symbol_is_written_in_the_section_that_defines_it(entry):
    assert entry["latex"] in math_symbols(section_text(entry["section"])), (
        f"${entry['latex']}$ ({entry['meaning']}) does not appear in @{entry['section']}"
    )


def test_symbol_tables_give_each_listed_symbol_its_one_meaning():
    # the tables are found at all: Chapters 1, 2 and 3 each have some
    assert {path.name for path in CHAPTERS if table_rows(path)} >= {
        "ch01-attention.qmd", "ch02-tinygpt.qmd", "ch03-long-context.qmd"}
    conflicts = table_conflicts(CHAPTERS)
    assert not conflicts, f"symbol tables contradict data/notation.json: {conflicts}"


def test_the_table_check_catches_a_symbol_given_another_meaning(tmp_path):
    """Chapter 1's softmax row once called a row of scores s, and s is bytes per number."""
    chapter = tmp_path / "ch99-example.qmd"
    chapter.write_text(
        "| Symbol | Meaning |\n|---|---|\n| $s$ | a row of scores |\n| $s_j$ | the score of key $j$ |\n"
        "| $z$ | a row of scores |\n| $d_h$ | head width |\n"
        "```{python}\nmeanings = {'H_kv': 'heads a layer stores', 'W': 'operations'}\n```\n"
    )
    assert set(table_conflicts([chapter])) == {("ch99-example.qmd", "s"), ("ch99-example.qmd", "s_j"),
                                               ("ch99-example.qmd", "W")}


def indexed_conflicts(paths: list[Path]) -> set[tuple[str, str]]:
    """(file, symbol) for every indexed form of a listed letter, such as s_j, that is not known consistent."""
    found = set()
    for path in paths:
        for symbol in math_symbols(chapter_prose(path)):
            indexed = INDEX_SUBSCRIPT.match(symbol)
            if (symbol not in BY_LATEX and symbol not in CONSISTENT_INDEXED and indexed
                    and indexed.group("base") in BY_LATEX):
                found.add((path.name, symbol))
    return found


def test_no_chapter_indexes_a_listed_letter_to_mean_something_else():
    # the appendix names such forms in order to warn against them
    conflicts = indexed_conflicts([path for path in CHAPTERS if path.name != "appendix-notation.qmd"])
    assert not conflicts, f"an indexed symbol gives a listed letter another meaning: {sorted(conflicts)}"


def test_the_index_check_catches_a_letter_reused_with_an_index(tmp_path):
    chapter = tmp_path / "ch99-example.qmd"
    chapter.write_text("The scores $s_j$ and the weights $w_j$; the codes $c_j$ at scale $\\sigma_j$.\n")
    assert indexed_conflicts([chapter]) == {("ch99-example.qmd", "s_j")}


def memory_gb_phrases(text: str) -> list[str]:
    """Phrases of prose that write a memory size in GB, the allowed device names left out."""
    text = prose(text)
    for allowed in ALLOWED_GB:
        text = text.replace(allowed, " ")
    return [m.group(0) for m in re.finditer(r"\S*\s?\b[KMGT]B\b(?!/s)", text)]


def test_prose_writes_memory_in_binary_units():
    found = {path.name: memory_gb_phrases(path.read_text()) for path in CHAPTERS}
    assert not {name: phrases for name, phrases in found.items() if phrases}


def test_the_unit_check_catches_a_memory_size_in_gb():
    assert memory_gb_phrases("The cache takes 64 GB at this length.") == ["64 GB"]
    assert memory_gb_phrases("The weights take 900 MB.") == ["900 MB"]
    assert memory_gb_phrases("It reads 12 GB/s; an 80 GB card holds 80 GiB.") == []
    assert memory_gb_phrases("```{python}\nprint('64 GB')\n```\n") == []
