"""The book, rendered by Quarto from the chapters `execute` has already run (`booktools quarto`).

1. Stage: each listed file becomes a Quarto notebook in `_build/quarto/`, its markdown exactly as
   written, its cells with their `#|` options and the executed notebook's outputs and inline values
   (`user_expressions`, which Quarto reads as its own); a copy of `_quarto.yml` lists them and turns
   execution off. Each chapter runs once, and Quarto writes nothing into the source tree.
2. Render: `quarto render` there (html, epub, and pdf where TeX exists). Quarto's EPUB draws the
   diagrams with Chrome; Debian's `/usr/bin/chromium` is handed to it as `QUARTO_CHROMIUM`.
3. Finish: MathJax and Source Sans Pro are copied in from `web/node_modules/` (pinned in
   `web/package-lock.json`), so no page asks another host for anything; source links name the `.qmd`.
4. Publish: the new `_book/` replaces the old one only when the render succeeded.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .book import Book, BookError, load_book, repo_url, write_atomic
from .notebooks import NOTEBOOK_KERNELSPEC
from .qmd import INLINE_EXPRESSION, Document, QmdError, parse_file

__all__ = [
    "QuartoError", "build_quarto_book", "find_chromium", "find_quarto", "find_tex", "finish_html",
    "quarto_notebook", "stage_project",
]

STAGE_DIR = Path("_build") / "quarto"
# What Quarto's HTML pages load from CDNs, and what the book serves instead (from web/node_modules).
_POLYFILL = re.compile(r'[ \t]*<script src="https://cdnjs\.cloudflare\.com/polyfill/[^"]*"></script>\n?')
_MATHJAX = re.compile(r'src="https://cdn\.jsdelivr\.net/npm/mathjax@3/es5/(?P<file>[\w.-]+\.js)"')
_ID = re.compile(r'\sid="([^"]+)"')
_FRAGMENT_LINK = re.compile(r'href="#(?P<id>[^"]+)"')
MATHJAX_FILES = ("es5/tex-chtml-full.js", "es5/output/chtml/fonts/woff-v2")
FONT_PACKAGE = "@fontsource/source-sans-pro"
FONT_WEIGHTS = ("300", "400", "400-italic", "700", "700-italic")  # what Cosmo's styles use
FONT_SUBSETS = ("latin", "latin-ext", "greek")  # the book's prose: English, names, Greek symbols
_FONT_FACE = re.compile(r"/\* source-sans-pro-(?P<subset>[a-z-]+)-\d+-\w+ \*/\s*@font-face \{[^}]*\}")
_FONT_URL = re.compile(r"src: url\(\./files/(?P<file>[\w.-]+\.woff2)\) format\('woff2'\)[^;]*;")
# The book's own Quarto assets (theme, EPUB stylesheet, filters) live here and travel to the stage.
ASSETS = Path("style")


class QuartoError(RuntimeError):
    """The Quarto edition could not be built (the message says why and what to do)."""


# ---------------------------------------------------------------------------
# the tools


def find_quarto() -> str | None:
    """The `quarto` command: on PATH, or in the virtual environment (`pip install quarto-cli`)."""
    found = shutil.which("quarto")
    if found:
        return found
    candidate = Path(sys.prefix) / "bin" / "quarto"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def find_chromium(environ=None, which=shutil.which) -> str | None:
    """A Chrome or Chromium for Quarto's diagrams: `QUARTO_CHROMIUM`, then the usual names.

    Quarto 1.7 itself looks only for `google-chrome` and `chromium-browser`; Debian's package
    installs `/usr/bin/chromium`, which Quarto is then given through `QUARTO_CHROMIUM`.
    Nothing is ever downloaded: with no browser here, None.
    """
    environ = os.environ if environ is None else environ
    given = environ.get("QUARTO_CHROMIUM")
    if given and Path(given).is_file():
        return given
    for name in ("google-chrome", "google-chrome-stable", "chromium-browser", "chromium"):
        found = which(name)
        if found:
            return found
    return None


def find_tex() -> str | None:
    """A TeX engine Quarto can render PDF with (on PATH, or Quarto's TinyTeX), else None."""
    found = [shutil.which(name) for name in ("lualatex", "xelatex", "pdflatex")]
    for pattern in ("~/.TinyTeX/bin/*/xelatex", "~/Library/TinyTeX/bin/*/xelatex"):
        found += sorted(glob.glob(os.path.expanduser(pattern)))
    return next((path for path in found if path), None)


# ---------------------------------------------------------------------------
# staging: one Quarto notebook per listed file


def _option_value(value) -> str:
    """A cell option's value as one line of YAML: plain where it can be, else quoted."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_./-]+", value):
        return value
    return json.dumps(value, ensure_ascii=False)


def quarto_notebook(doc: Document, executed: dict) -> dict:
    """The notebook Quarto renders for one chapter (an nbformat-4 dict).

    Args:
        doc: the parsed `.qmd`.
        executed: its executed notebook (nbformat dict) from `booktools execute`.

    Raises:
        QuartoError: the executed notebook does not match the chapter (it is stale).
    """
    lines = doc.path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    ran = executed.get("cells", [])
    outputs = {int(cell["metadata"]["longctx"]["line"]): cell for cell in ran
               if cell.get("cell_type") == "code" and "line" in cell.get("metadata", {}).get("longctx", {})}
    values = [value for cell in ran if cell.get("cell_type") == "markdown"
              for value in cell.get("metadata", {}).get("user_expressions", [])]
    cells: list[dict] = []
    start = 0  # 0-based index of the first line not yet placed
    if doc.front_matter:
        # Quarto reads a notebook's front matter from a raw cell at the top. An empty block stays
        # in the markdown, where Pandoc reads it as it reads the .qmd (`check` reports it).
        cells.append({"cell_type": "raw", "metadata": {}, "source": "\n".join(lines[: doc.front_matter_lines])})
        start = doc.front_matter_lines
    pending = values

    def add_markdown(end: int) -> None:
        text = "\n".join(lines[start:end]).strip("\n")
        if not text.strip():
            return
        given: dict[str, dict] = {}
        for match in INLINE_EXPRESSION.finditer(text):
            expression = match.group("expr").strip()
            if not pending or pending[0]["expression"] != expression:
                raise QuartoError(f"{doc.display}: the executed notebook has no value for `{{python}} "
                                  f"{expression}` here; execute the chapter again (`make execute`)")
            given.setdefault(expression, pending.pop(0)["result"])
        metadata = {"user_expressions": [{"expression": key, "result": value} for key, value in given.items()]}
        cells.append({"cell_type": "markdown", "metadata": metadata if given else {}, "source": text})

    for cell in doc.python_cells:
        add_markdown(cell.line - 1)
        body = [text[len(cell.indent) :] if text.startswith(cell.indent) else text for text in cell.code_lines]
        # Options go to Quarto one per line, whatever YAML spelling the chapter uses (a caption
        # folded over several lines to fit 80 columns reaches Quarto's notebook reader mangled).
        body = [f"#| {key}: {_option_value(value)}" for key, value in cell.options.items()] + body
        if cell.line not in outputs:
            raise QuartoError(f"{doc.display}:{cell.line}: this cell is not in the executed notebook; execute "
                              "the chapter again (`make execute`)")
        cells.append({"cell_type": "code", "execution_count": outputs[cell.line].get("execution_count"),
                      "metadata": {}, "outputs": copy.deepcopy(outputs[cell.line].get("outputs", [])),
                      "source": "\n".join(body)})
        start = cell.end_line
    add_markdown(len(lines))
    if pending:
        raise QuartoError(
            f"{doc.display}: the executed notebook has inline values the chapter no longer uses; "
            "execute the chapter again (`make execute`)"
        )
    for index, cell in enumerate(cells):
        cell["id"] = f"cell-{index}"
    metadata = {"kernelspec": dict(NOTEBOOK_KERNELSPEC), "language_info": {"name": "python"}}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def stage_project(book: Book, executed: Path, stage: Path, *, formats: list[str]) -> list[str]:
    """Write the Quarto project that renders the executed chapters into `stage` (emptied first).

    Returns:
        The staged files, as `_quarto.yml` lists them.
    """
    import nbformat

    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    renamed: dict[str, str] = {}
    for entry in book.entries:
        source = book.root / entry.path
        if not source.is_file():
            continue
        try:
            doc = parse_file(source, book.root)
        except QmdError as exc:
            raise QuartoError(str(exc)) from None
        notebook_path = executed / f"{Path(entry.path).stem}.ipynb"
        if not doc.python_cells:
            # Nothing to execute: Quarto renders the file itself (as a notebook, a preface's
            # `{.unnumbered}` heading would become the title of a numbered chapter).
            target = stage / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            renamed[entry.path] = entry.path
            continue
        if not notebook_path.is_file():
            raise QuartoError(
                f"{entry.path} has not been executed ({book.display(notebook_path)} is missing): run `make execute` first"
            )
        ran = json.loads(notebook_path.read_text(encoding="utf-8"))
        staged = str(Path(entry.path).with_suffix(".ipynb"))
        target = stage / staged
        target.parent.mkdir(parents=True, exist_ok=True)
        # nbformat writes each source as a list of lines, as Quarto expects (a single string loses its newlines)
        target.write_text(nbformat.writes(nbformat.from_dict(quarto_notebook(doc, ran))) + "\n", encoding="utf-8")
        renamed[entry.path] = staged
    config = copy.deepcopy(book.config)
    config["book"] = dict(config.get("book") or {})
    for key in set(config["book"]) & {"chapters", "appendices"}:
        config["book"][key] = [renamed.get(path, path) for path in config["book"][key] or []]
    config["execute"] = {"enabled": False}
    # Quarto renders every format the project lists (its `--to a,b` does not work for books).
    given = config.get("format") or {}
    config["format"] = {name: (given.get(name) if isinstance(given, dict) else None) or {} for name in formats}
    config["book"].pop("downloads", None)
    if downloads := [name for name in ("pdf", "epub") if name in formats]:
        config["book"]["downloads"] = downloads
    config.setdefault("project", {})["output-dir"] = "_book"
    write_atomic(stage / "_quarto.yml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=100))
    if (book.root / ASSETS).is_dir():
        shutil.copytree(book.root / ASSETS, stage / ASSETS)
    # The .bib files and the citation style (`csl:`), at the paths the staged _quarto.yml names.
    for path in [*book.bibliography, *([book.csl] if book.csl else [])]:
        target = stage / path.relative_to(book.root)
        if path.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return [renamed[entry.path] for entry in book.entries if entry.path in renamed]


# ---------------------------------------------------------------------------
# finishing: everything the pages load comes from the book itself


def _relative(page: Path, target: Path) -> str:
    return os.path.relpath(target, page.parent).replace(os.sep, "/")


def _copy_fonts(package: Path, fonts: Path) -> Path:
    """Copy Source Sans Pro's woff2 files (FONT_WEIGHTS x FONT_SUBSETS) and write their @font-face CSS."""
    fonts.mkdir(parents=True, exist_ok=True)
    rules = []
    for weight in FONT_WEIGHTS:
        css = (package / f"{weight}.css").read_text(encoding="utf-8")
        for match in _FONT_FACE.finditer(css):
            if match.group("subset") not in FONT_SUBSETS:
                continue
            rule = match.group(0)
            url = _FONT_URL.search(rule)
            if url is None:
                raise QuartoError(f"{package / (weight + '.css')}: no woff2 source in {rule[:80]!r}")
            shutil.copyfile(package / "files" / url.group("file"), fonts / url.group("file"))
            rules.append(_FONT_URL.sub(lambda found: f"src: url({found.group('file')}) format('woff2');", rule))
    if len(rules) != len(FONT_WEIGHTS) * len(FONT_SUBSETS):
        raise QuartoError(f"{package}: expected {len(FONT_WEIGHTS) * len(FONT_SUBSETS)} font faces, found {len(rules)}")
    if (package / "LICENSE").is_file():
        shutil.copyfile(package / "LICENSE", fonts / "LICENSE")
    target = fonts / "source-sans-pro.css"
    target.write_text("\n".join(rules) + "\n", encoding="utf-8")
    return target


def finish_html(out: Path, node_modules: Path, *, repo_url: str | None = None) -> list[Path]:
    """Make the rendered HTML pages self-contained; returns the pages changed.

    MathJax (and its fonts) and Source Sans Pro are copied into `out/site_libs/`; each page loads
    MathJax from there instead of a CDN and drops the CDN polyfill (a Promise polyfill for
    browsers older than every one MathJax 3 supports). Links to the source on `repo_url` name
    the chapter's `.qmd` rather than the staged notebook.
    """
    mathjax = out / "site_libs" / "mathjax"
    for item in MATHJAX_FILES:
        source = node_modules / "mathjax" / item
        target = mathjax / Path(item).relative_to("es5")
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    shutil.copyfile(node_modules / "mathjax" / "LICENSE", mathjax / "LICENSE")
    fonts_css = _copy_fonts(node_modules / FONT_PACKAGE, out / "site_libs" / "fonts")
    source_link = None
    if repo_url:
        source_link = re.compile(
            r'(href="' + re.escape(repo_url.rstrip("/")) + r'/(?:blob|edit)/[^"#?]*?)\.ipynb(?=["#?])'
        )
    pages = sorted(out.rglob("*.html"))
    ids = {page: set(_ID.findall(page.read_text(encoding="utf-8"))) for page in pages}
    owners: dict[str, list[Path]] = {}
    for page, found in ids.items():
        for ident in found:
            owners.setdefault(ident, []).append(page)
    changed = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        new = _POLYFILL.sub("", text)

        def other_page(match: re.Match, page=page) -> str:
            ident = match.group("id")
            where = owners.get(ident, [])
            if ident in ids[page] or len(where) != 1:
                return match.group(0)
            return f'href="{_relative(page, where[0])}#{ident}"'

        # A link by fragment alone (`#eq-ch03-kvbytes`, as the API appendix writes them) to an id
        # on another page: Quarto fixes those to headings, this the rest.
        new = _FRAGMENT_LINK.sub(other_page, new)

        def local_mathjax(match: re.Match, page=page) -> str:
            file = mathjax / match.group("file")
            if not file.is_file():
                raise QuartoError(
                    f"{page.name} loads MathJax's {match.group('file')}, which the book does not ship "
                    f"(it has {', '.join(MATHJAX_FILES)}); add it to MATHJAX_FILES"
                )
            return f'src="{_relative(page, file)}"'

        new = _MATHJAX.sub(local_mathjax, new)
        if "</head>" in new and "source-sans-pro.css" not in new:
            link = f'<link href="{_relative(page, fonts_css)}" rel="stylesheet">\n'
            new = new.replace("</head>", link + "</head>", 1)
        if source_link is not None:
            new = source_link.sub(r"\1.qmd", new)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


# ---------------------------------------------------------------------------
# the whole edition


def build_quarto_book(
    root: Path,
    executed: Path,
    out: Path,
    *,
    formats: list[str] | None = None,
    stage: Path | None = None,
    quarto: str | None = None,
    node_modules: Path | None = None,
    quiet: bool = False,
) -> dict:
    """Render the Quarto edition of the book from its executed notebooks into `out`.

    Args:
        root: the book's root.
        executed: the folder of executed notebooks (`booktools execute`).
        out: where the rendered book goes (replaced only when the render succeeds).
        formats: Quarto formats; default html and epub, and pdf where TeX exists.
        stage: the staging project (default `_build/quarto/` under `root`).

    Returns:
        {"formats": rendered, "skipped": {format: reason}, "seconds": wall time}.

    Raises:
        QuartoError: Quarto, MathJax or an executed chapter is missing, or the render failed.
    """
    started = time.perf_counter()
    book = load_book(root)
    quarto = quarto or find_quarto()
    if quarto is None:
        raise QuartoError("Quarto is not installed (quarto.org, or `pip install quarto-cli`)")
    skipped: dict[str, str] = {}
    if formats is None:
        formats = ["html", "epub"]
        if find_tex():
            formats.append("pdf")
        else:
            skipped["pdf"] = "no TeX installation (install one with `quarto install tinytex`)"
    node_modules = node_modules or root / "web" / "node_modules"
    for item in ("mathjax/" + MATHJAX_FILES[0], f"{FONT_PACKAGE}/400.css"):
        if not (node_modules / item).exists():
            raise QuartoError(f"{node_modules / item} is missing: run `npm ci --prefix web`")
    stage = stage or root / STAGE_DIR
    stage_project(book, executed, stage, formats=formats)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("QUARTO_PYTHON", sys.executable)
    chromium = find_chromium()
    if chromium:
        env["QUARTO_CHROMIUM"] = chromium
    command = [quarto, "render"]
    if quiet:
        command.append("--quiet")
    done = subprocess.run(command, cwd=stage, env=env, capture_output=quiet, text=True)
    rendered = stage / "_book"
    outputs = {"html": "index.html", "epub": "*.epub", "pdf": "*.pdf"}
    missing = [name for name in formats if name in outputs and not list(rendered.glob(outputs[name]))]
    if done.returncode != 0 or missing:
        tail = ((done.stdout or "") + (done.stderr or ""))[-3000:] if quiet else ""
        raise QuartoError(
            f"`quarto render` failed in {stage} (exit {done.returncode}"
            + (f", no {', '.join(missing)} output" if missing else "")
            + f"); _book/ was left as it was\n{tail}"
        )
    try:
        url = repo_url(book)
    except BookError:
        url = None  # no source links to name
    finish_html(rendered, node_modules, repo_url=url)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(rendered), str(out))
    return {"formats": formats, "skipped": skipped, "seconds": time.perf_counter() - started}
