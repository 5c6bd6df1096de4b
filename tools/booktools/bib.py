"""The bibliography: its keys (for `check`, with their lines), and citations formatted by pandoc's
citeproc in the style `_quarto.yml` names (`csl:`), as Quarto formats them. Pandoc is the pinned
`pypandoc-binary`'s, the same 3.6.1 as the Quarto kit's: the reader's notebooks cite as the pages do."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .book import BookError

#: The head of a BibTeX entry, `@article{key,` (macros `@string{name = ...}` have no `key,`).
ENTRY = re.compile(r"@(?P<type>[A-Za-z]+)\s*[{(]\s*(?P<key>[^,\s{}()]+)\s*,")


def bibliography_keys(paths: list[Path], problems: list) -> dict[str, tuple[str, int]]:
    """Every entry key of the `.bib` files -> (file name, line) of its first entry; each repeated key
    and missing file goes to `problems` as (file name, line, message)."""
    keys: dict[str, tuple[str, int]] = {}
    for path in paths:
        if not path.is_file():
            problems.append((path.name, 0, "bibliography file does not exist"))
            continue
        text = path.read_text(encoding="utf-8")
        for match in ENTRY.finditer(text):
            key, line = match.group("key"), text.count("\n", 0, match.start()) + 1
            if match.group("type").lower() in ("comment", "preamble", "string"):
                continue
            if key in keys:
                first_file, first_line = keys[key]
                where = f"line {first_line}" if first_file == path.name else f"{first_file}:{first_line}"
                problems.append((path.name, line, f"duplicate key {key} (first at {where})"))
            keys.setdefault(key, (path.name, line))
    return keys


def render_citations(citations: list[str], bibliography: list[Path], *, csl: Path | None = None) -> list[str]:
    """Each citation as written (`[@a; @b, p. 3]`, `@a`) as plain text, in one pandoc run:
    `render_citations(["[@vaswani2017attention]"], [Path("references.bib")])` gives
    `["(Vaswani et al. 2017)"]`. BookError when pypandoc-binary is missing or pandoc failed."""
    if not citations:
        return []
    try:
        import pypandoc

        pandoc = pypandoc.get_pandoc_path()
    except (ModuleNotFoundError, OSError) as exc:
        raise BookError(f"pandoc comes with the pinned `pypandoc-binary` package: run `make env` ({exc})") from None
    separator = "\u2063"  # an invisible separator: a paragraph of its own between citations
    arguments = ["--from=markdown", "--to=plain", "--wrap=none", "--metadata=suppress-bibliography:true", "--citeproc"]
    arguments += [f"--bibliography={path}" for path in bibliography] + ([f"--csl={csl}"] if csl else [])
    done = subprocess.run([pandoc, *arguments], input=f"\n\n{separator}\n\n".join(citations),
                          capture_output=True, text=True, encoding="utf-8", check=False)
    if done.returncode != 0:
        raise BookError(f"pandoc could not format the citations: {done.stderr.strip()}")
    rendered = [part.strip() for part in done.stdout.strip().split(separator)]
    if len(rendered) != len(citations):
        raise BookError(f"citeproc gave {len(rendered)} citations for {len(citations)}")
    return rendered
