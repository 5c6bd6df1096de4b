"""The book, executed and rendered by Quarto (`booktools quarto`), and finished to load nothing from the web.

1. Stage: `_build/quarto/` holds a copy of `_quarto.yml` and the chapters (each cell's options
   one a line) and links to the rest, so Quarto writes nothing into the source tree and starts
   with no `_freeze/`.
2. Render: `quarto render` there executes every chapter through Jupyter (a failing cell fails
   the render), evaluates the inline `{python}` values, numbers the references and formats the
   citations, for every format `_quarto.yml` lists (the first format's run, frozen, serves the rest). Quarto's EPUB draws the diagrams with
   Chrome; Debian's `/usr/bin/chromium` is handed to it as `QUARTO_CHROMIUM`. The executed
   notebooks Quarto keeps go to `_build/executed/`, for the reader's notebooks.
3. Finish: MathJax and Source Sans Pro are copied in from `web/node_modules/` (pinned in
   `web/package-lock.json`), so no page asks another host for anything.
4. Publish: the new `_book/` replaces the old one only when the render succeeded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .book import load_book
from .qmd import parse_file

__all__ = [
    "QuartoError", "build_quarto_book", "find_chromium", "find_quarto", "finish_html", "stage_project",
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
    """The `quarto` command on PATH, else None."""
    return shutil.which("quarto")


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


# ---------------------------------------------------------------------------
# staging: the book's files, for Quarto to execute and render away from the source tree

#: What a render never needs (build output, caches, the environment) and Quarto must not see.
_NOT_STAGED = {".git", ".venv", "_book", "_build", "_freeze", ".quarto", "notebooks", "build",
               ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules"}


def stage_project(root: Path, stage: Path) -> None:
    """Lay out the book in `stage` (emptied first) for `quarto render` to run there.

    `_quarto.yml`, the listed files and `chapters/` are copied, since Quarto writes beside each
    chapter while it executes it; every other top-level entry (`code/`, `data/`, `experiments/`,
    `style/`, ...) is a link to the source, so a chapter's `support.book_root()` (the stage)
    finds the saved runs and data it reads. Quarto's `_freeze/` starts empty: every render
    executes every chapter.
    """
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    book = load_book(root)
    copied = {"_quarto.yml", ".gitignore", "chapters"} | {entry.path for entry in book.entries}
    for item in sorted(root.iterdir()):
        if item.name in _NOT_STAGED or item.name.startswith(".") and item.name != ".gitignore":
            continue
        if item.name not in copied:
            (stage / item.name).symlink_to(item.resolve(), target_is_directory=item.is_dir())
        elif item.is_dir():
            shutil.copytree(item, stage / item.name, ignore=shutil.ignore_patterns("*_files", "*.quarto_ipynb"))
        else:
            shutil.copyfile(item, stage / item.name)
    for entry in book.entries:
        if (stage / entry.path).is_file():
            _one_line_options(stage / entry.path)


def _option_value(value) -> str:
    """A cell option's value as one line of YAML: plain where it can be, else quoted."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_./-]+", value):
        return value
    return json.dumps(value, ensure_ascii=False)


def _one_line_options(path: Path) -> None:
    """Rewrite each Python cell's `#|` options one a line, the file's line numbers kept.

    Quarto 1.7 mangles a `tbl-cap` folded over several lines (`>-`) of a cell whose output is a
    Markdown table: the page shows the caption's `:::` div as text.
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    for cell in parse_file(path).python_cells:
        count = len(cell.option_lines)
        if count == len(cell.options):
            continue  # already one option a line
        options = [f"{cell.indent}#| {key}: {_option_value(value)}" for key, value in cell.options.items()]
        lines[cell.line : cell.line + count] = options + [f"{cell.indent}#|"] * (count - len(options))
    path.write_text("\n".join(lines), encoding="utf-8")


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


def finish_html(out: Path, node_modules: Path) -> list[Path]:
    """Make the rendered HTML pages self-contained; returns the pages changed.

    MathJax (and its fonts) and Source Sans Pro are copied into `out/site_libs/`; each page loads
    MathJax from there instead of a CDN and drops the CDN polyfill (a Promise polyfill for
    browsers older than every one MathJax 3 supports).
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
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


# ---------------------------------------------------------------------------
# the whole edition


def build_quarto_book(
    root: Path,
    out: Path,
    *,
    executed: Path | None = None,
    stage: Path | None = None,
    quarto: str | None = None,
    node_modules: Path | None = None,
    quiet: bool = False,
) -> dict:
    """Execute and render the book with Quarto (every format `_quarto.yml` lists) into `out`.

    Quarto runs each chapter through Jupyter (a failing cell fails the render), evaluates the
    inline values, numbers the cross-references and formats the citations; it runs in `stage`
    (default `_build/quarto/`). Quarto keeps each chapter's executed notebook
    (`keep-ipynb`); they are moved to `executed` (default `_build/executed/`, `<stem>.ipynb`),
    from which `booktools notebooks` writes the reader's notebooks.

    Returns:
        {"formats": rendered, "seconds": wall time}.

    Raises:
        QuartoError: Quarto or MathJax is missing, or the render failed (a cell raised, ...).
    """
    started = time.perf_counter()
    book = load_book(root)
    quarto = quarto or find_quarto()
    if quarto is None:
        raise QuartoError("Quarto is not installed: see https://quarto.org/docs/get-started/")
    node_modules = node_modules or root / "web" / "node_modules"
    for item in ("mathjax/" + MATHJAX_FILES[0], f"{FONT_PACKAGE}/400.css"):
        if not (node_modules / item).exists():
            raise QuartoError(f"{node_modules / item} is missing: run `npm ci --prefix web`")
    stage = stage or root / STAGE_DIR
    executed = executed or root / "_build" / "executed"
    stage_project(root, stage)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("QUARTO_PYTHON", sys.executable)
    env.setdefault("TQDM_DISABLE", "1")
    env.setdefault("PYTHONHASHSEED", "0")
    chromium = find_chromium()
    if chromium:
        env["QUARTO_CHROMIUM"] = chromium  # Quarto's EPUB draws the diagrams with it
    rendered = stage / "_book"
    formats = list(book.config.get("format") or {}) or ["html"]

    def render(*arguments: str) -> None:
        # quiet: Quarto's log is kept for the error message (its own --quiet drops a cell's traceback)
        done = subprocess.run([quarto, "render", *arguments], cwd=stage, env=env, capture_output=quiet, text=True)
        if done.returncode != 0:
            tail = ((done.stdout or "") + (done.stderr or ""))[-3000:] if quiet else ""
            raise QuartoError(f"`quarto render` failed in {stage} (exit {done.returncode}); {out} was left as it was\n{tail}")

    # Quarto executes a chapter once per format. The first format's run executes every chapter and
    # keeps its notebook; its frozen results then serve the other formats, which execute nothing.
    render("--to", formats[0], "--metadata", "keep-ipynb:true")
    if executed.exists():
        shutil.rmtree(executed)
    executed.mkdir(parents=True)
    for kept in stage.rglob("*.quarto_ipynb"):
        shutil.move(str(kept), str(executed / f"{kept.stem}.ipynb"))
    for frozen in (stage / "_freeze").rglob(f"execute-results/{formats[0]}.json"):
        for name in formats[1:]:
            shutil.copyfile(frozen, frozen.with_name(f"{name}.json"))
    # Each later format's render empties _book/ (site_libs/ included): the first one's pages wait aside.
    first = stage / "_first"
    shutil.move(str(rendered), str(first))
    for name in formats[1:]:
        render("--to", name)
        for item in rendered.iterdir():
            if not (first / item.name).exists():
                shutil.move(str(item), str(first / item.name))
    shutil.rmtree(rendered, ignore_errors=True)
    first.rename(rendered)
    outputs = {"html": "index.html", "epub": "*.epub", "pdf": "*.pdf"}
    missing = [name for name in formats if name in outputs and not list(rendered.glob(outputs[name]))]
    if missing:
        raise QuartoError(f"`quarto render` in {stage} wrote no {', '.join(missing)}; {out} was left as it was")
    finish_html(rendered, node_modules)
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(rendered), str(out))
    return {"formats": formats, "seconds": time.perf_counter() - started}
