"""The bibliography: its keys, and citations formatted by pandoc's citeproc, as Quarto formats them.

Pandoc reads the `.bib` files (`@string` macros, accents such as `R{\\'e}`, `and others`)
and citeproc formats the citations in the style `_quarto.yml` names (`csl:`; the book's is
style/longctx-author-date.csl), as Quarto does; with none, in pandoc's default, Chicago author-date. The only reading done here is the scan for keys, so that
`check` can name a duplicate or a missing key with its line without running pandoc.

Pandoc comes from the pinned `pypandoc-binary` (requirements.txt), whose wheel carries the same
pandoc 3.6.1 that the Quarto kit on our machines runs: the reader's notebooks cite as the pages do.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

__all__ = ["ENTRY", "PandocError", "bibliography_keys", "render_citations"]

#: The head of a BibTeX entry, `@article{key,` (macros `@string{name = ...}` have no `key,`).
ENTRY = re.compile(r"@(?P<type>[A-Za-z]+)\s*[{(]\s*(?P<key>[^,\s{}()]+)\s*,")
_NOT_ENTRIES = ("comment", "preamble", "string")


def bibliography_keys(paths: list[Path], problems: list[str] | None = None) -> dict[str, tuple[str, int]]:
    """Every entry key of the `.bib` files -> (file name, line), the first of a repeated key.

    When `problems` is given, each repeated key and each missing file is reported there as
    "FILE:LINE: message".
    """
    keys: dict[str, tuple[str, int]] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if problems is not None:
                problems.append(f"{path.name}:0: bibliography file does not exist")
            continue
        for match in ENTRY.finditer(text):
            if match.group("type").lower() in _NOT_ENTRIES:
                continue
            key, line = match.group("key"), text.count("\n", 0, match.start()) + 1
            if key in keys:
                if problems is not None:
                    first_file, first_line = keys[key]
                    where = f"line {first_line}" if first_file == path.name else f"{first_file}:{first_line}"
                    problems.append(f"{path.name}:{line}: duplicate key {key} (first at {where})")
                continue
            keys[key] = (path.name, line)
    return keys


class PandocError(RuntimeError):
    """Pandoc is missing, or it failed (the message carries its own)."""


def render_citations(
    citations: list[str], bibliography: list[Path], *, csl: Path | None = None, what: str
) -> list[str]:
    """Each citation as written in markdown (`[@a; @b, p. 3]`, `@a`) as plain text, in one pandoc run.

    Citeproc reads the `.bib` files and the `csl:` style as Quarto passes them (none: pandoc's
    default). Example: `render_citations(["[@vaswani2017attention]"], [Path("references.bib")],
    what="ch01")` gives `["(Vaswani et al. 2017)"]`.

    Raises:
        PandocError: pypandoc-binary is not installed, or pandoc failed on `what`.
    """
    if not citations:
        return []
    try:
        import pypandoc

        pandoc = pypandoc.get_pandoc_path()
    except (ModuleNotFoundError, OSError) as exc:
        raise PandocError(f"pandoc comes with the pinned `pypandoc-binary` package: run `make env` ({exc})") from None
    separator = "\u2063"  # an invisible separator: a paragraph of its own between citations
    arguments = ["--from=markdown", "--to=plain", "--wrap=none", "--metadata=suppress-bibliography:true", "--citeproc"]
    arguments += [f"--bibliography={path}" for path in bibliography] + ([f"--csl={csl}"] if csl else [])
    done = subprocess.run([pandoc, *arguments], input=f"\n\n{separator}\n\n".join(citations),
                          capture_output=True, text=True, encoding="utf-8", check=False)
    if done.returncode != 0:
        raise PandocError(f"{what}: pandoc failed: {done.stderr.strip()}")
    rendered = [part.strip() for part in done.stdout.strip().split(separator)]
    if len(rendered) != len(citations):
        raise PandocError(f"{what}: citeproc gave {len(rendered)} citations for {len(citations)}")
    return rendered
