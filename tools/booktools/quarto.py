"""The book, executed and rendered by Quarto (`booktools quarto`), and finished to load nothing from the web.

1. Stage: `_build/quarto/` holds copies of `_quarto.yml` and the chapters (each cell's options one a
   line) and links to the rest, so Quarto writes nothing into the source tree and starts with no `_freeze/`.
2. Render: Quarto executes every chapter (a failing cell fails the render), evaluates the inline values,
   numbers the references and cites, for each format `_quarto.yml` lists; the first format's run, frozen,
   serves the rest. Its EPUB draws the diagrams with Chrome (Debian's `chromium`, as `QUARTO_CHROMIUM`).
   The notebooks Quarto keeps (`keep-ipynb`) go to `_build/executed/`, for the reader's notebooks.
3. Finish: MathJax and Source Sans Pro come from `web/node_modules/` (pinned in `web/package-lock.json`),
   and the new `_book/` replaces the old one only when the render succeeded.
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
#: How long a frozen later pass (the EPUB) may take before it is killed and tried again.
LATER_FORMAT_SECONDS = 420.0

#: What a render never needs (build output, caches, the environment) and Quarto must not see.
_NOT_STAGED = {".git", ".venv", "_book", "_build", "_freeze", ".quarto", "notebooks", "build",
               ".pytest_cache", ".ruff_cache", ".hypothesis", "node_modules"}


class QuartoError(RuntimeError):
    """The Quarto edition could not be built (the message says why and what to do)."""


def find_quarto() -> str | None:
    return shutil.which("quarto")


def find_chromium() -> str | None:
    """`QUARTO_CHROMIUM`, else the first of the names Quarto 1.7 looks for and Debian's `chromium`
    (which Quarto does not look for); never a download."""
    given = os.environ.get("QUARTO_CHROMIUM", "")
    names = ("google-chrome", "google-chrome-stable", "chromium-browser", "chromium")
    return given if Path(given).is_file() else next(filter(None, map(shutil.which, names)), None)


def stage_project(root: Path, stage: Path) -> None:
    """Lay out the book in `stage` (emptied first) for `quarto render`: `_quarto.yml`, the listed files
    and `chapters/` are copied (Quarto writes beside each chapter it executes), every other top-level
    entry is a link, so a chapter finds the saved runs and data it reads."""
    shutil.rmtree(stage, ignore_errors=True)
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


def _one_line_options(path: Path) -> None:
    """Each Python cell's `#|` options one a line, the file's line numbers kept: Quarto 1.7 prints the
    `:::` div of a `tbl-cap` folded over lines (`>-`) as text when the cell's output is a Markdown table."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for cell in parse_file(path).python_cells:
        count = len(cell.option_lines)
        if count != len(cell.options):
            plain = lambda value: isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_./-]+", value)  # noqa: E731
            options = [f"{cell.indent}#| {key}: {value if plain(value) else json.dumps(value, ensure_ascii=False)}"
                       for key, value in cell.options.items()]
            lines[cell.line : cell.line + count] = options + [f"{cell.indent}#|"] * (count - len(options))
    path.write_text("\n".join(lines), encoding="utf-8")


def _relative(page: Path, target: Path) -> str:
    return os.path.relpath(target, page.parent).replace(os.sep, "/")


def _copy_fonts(package: Path, fonts: Path) -> Path:
    """Copy Source Sans Pro's woff2 files (FONT_WEIGHTS x FONT_SUBSETS) and write their @font-face CSS."""
    fonts.mkdir(parents=True, exist_ok=True)
    rules = []
    for weight in FONT_WEIGHTS:
        for match in _FONT_FACE.finditer((package / f"{weight}.css").read_text(encoding="utf-8")):
            if match.group("subset") in FONT_SUBSETS:
                url = _FONT_URL.search(match.group(0))
                if url is None:
                    raise QuartoError(f"{package / (weight + '.css')}: no woff2 source in {match.group(0)[:80]!r}")
                shutil.copyfile(package / "files" / url.group("file"), fonts / url.group("file"))
                rules.append(_FONT_URL.sub(lambda found: f"src: url({found.group('file')}) format('woff2');", match.group(0)))
    if len(rules) != len(FONT_WEIGHTS) * len(FONT_SUBSETS):
        raise QuartoError(f"{package}: expected {len(FONT_WEIGHTS) * len(FONT_SUBSETS)} font faces, found {len(rules)}")
    if (package / "LICENSE").is_file():
        shutil.copyfile(package / "LICENSE", fonts / "LICENSE")
    (fonts / "source-sans-pro.css").write_text("\n".join(rules) + "\n", encoding="utf-8")
    return fonts / "source-sans-pro.css"


def finish_html(out: Path, node_modules: Path) -> list[Path]:
    """Make the rendered pages self-contained (the pages changed): MathJax and Source Sans Pro copied into
    `out/site_libs/` and loaded from there, no CDN polyfill (for browsers older than any MathJax 3 runs
    in), and a link by fragment alone to an id on another page (the API appendix's) made to point there."""
    mathjax = out / "site_libs" / "mathjax"
    for item in (*MATHJAX_FILES, "LICENSE"):
        source, target = node_modules / "mathjax" / item, mathjax / item.removeprefix("es5/")
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    fonts_css = _copy_fonts(node_modules / FONT_PACKAGE, out / "site_libs" / "fonts")
    ids = {page: set(_ID.findall(page.read_text(encoding="utf-8"))) for page in sorted(out.rglob("*.html"))}
    owners = {ident: [page for page, found in ids.items() if ident in found] for ident in set().union(*ids.values())}
    changed = []
    for page in ids:

        def other_page(match: re.Match, page=page) -> str:
            ident, where = match.group("id"), owners.get(match.group("id"), [])
            return match.group(0) if ident in ids[page] or len(where) != 1 else f'href="{_relative(page, where[0])}#{ident}"'

        def local_mathjax(match: re.Match, page=page) -> str:
            if not (mathjax / match.group("file")).is_file():
                raise QuartoError(f"{page.name} loads MathJax's {match.group('file')}, which the book does not ship "
                                  f"(it has {', '.join(MATHJAX_FILES)}); add it to MATHJAX_FILES")
            return f'src="{_relative(page, mathjax / match.group("file"))}"'

        text = page.read_text(encoding="utf-8")
        new = _MATHJAX.sub(local_mathjax, _FRAGMENT_LINK.sub(other_page, _POLYFILL.sub("", text)))
        if "</head>" in new and "source-sans-pro.css" not in new:
            new = new.replace("</head>", f'<link href="{_relative(page, fonts_css)}" rel="stylesheet">\n</head>', 1)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def build_quarto_book(root: Path, out: Path, *, executed: Path | None = None, stage: Path | None = None,
                      quarto: str | None = None, node_modules: Path | None = None, quiet: bool = False) -> dict:
    """Execute and render the book with Quarto (every format `_quarto.yml` lists) into `out`, working in `stage`
    and keeping the executed notebooks in `executed`: {"formats", "seconds"}; QuartoError if it cannot."""
    started = time.perf_counter()
    book = load_book(root)
    quarto = quarto or find_quarto()
    if quarto is None:
        raise QuartoError("Quarto is not installed: see https://quarto.org/docs/get-started/")
    node_modules = node_modules or root / "web" / "node_modules"
    for item in ("mathjax/" + MATHJAX_FILES[0], f"{FONT_PACKAGE}/400.css"):
        if not (node_modules / item).exists():
            raise QuartoError(f"{node_modules / item} is missing: run `npm ci --prefix web`")
    stage = stage or root / "_build" / "quarto"
    executed = executed or root / "_build" / "executed"
    stage_project(root, stage)
    env = {"QUARTO_PYTHON": sys.executable, "TQDM_DISABLE": "1", "PYTHONHASHSEED": "0", **os.environ}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if find_chromium():
        env["QUARTO_CHROMIUM"] = find_chromium()
    rendered = stage / "_book"
    formats = list(book.config.get("format") or {}) or ["html"]

    def render(*arguments: str, limit: float | None = None, tries: int = 1) -> None:
        # quiet: Quarto's log is kept for the error message (its own --quiet drops a cell's traceback)
        for _ in range(tries):
            command = subprocess.Popen([quarto, "render", *arguments], cwd=stage, env=env, text=True,
                                       start_new_session=True,  # its Chromium goes with it on a kill
                                       stdout=subprocess.PIPE if quiet else None,
                                       stderr=subprocess.STDOUT if quiet else None)
            try:
                log = command.communicate(timeout=limit)[0] or ""
            except subprocess.TimeoutExpired:
                os.killpg(command.pid, 9)
                command.communicate()
                continue
            if command.returncode != 0:
                raise QuartoError(f"`quarto render` failed in {stage} (exit {command.returncode}); {out} was left "
                                  f"as it was\n{log[-3000:]}")
            return
        raise QuartoError(f"`quarto render {' '.join(arguments)}` in {stage} ran past {limit:.0f} s {tries} times; "
                          f"{out} was left as it was")

    # The first format's run executes every chapter and keeps its notebook; its frozen results serve the rest.
    render("--to", formats[0], "--metadata", "keep-ipynb:true")
    shutil.rmtree(executed, ignore_errors=True)
    executed.mkdir(parents=True)
    for kept in stage.rglob("*.quarto_ipynb"):
        shutil.move(kept, executed / f"{kept.stem}.ipynb")
    for frozen in (stage / "_freeze").rglob(f"execute-results/{formats[0]}.json"):
        for name in formats[1:]:
            shutil.copyfile(frozen, frozen.with_name(f"{name}.json"))
    first = stage / "_first"  # each later render empties _book/ (site_libs/ too): the first's pages wait here
    shutil.move(rendered, first)
    for name in formats[1:]:
        # These passes execute nothing (the freeze serves them), so they take a minute or two. Quarto
        # 1.7's EPUB draws diagrams through a Chromium it drives over a debugging port, and that
        # connection now and then never opens (quarto-cli's own cri.ts notes the flakiness): a pass
        # that runs past its limit is killed, Chromium with it, and tried again.
        render("--to", name, limit=LATER_FORMAT_SECONDS, tries=3)
        for item in rendered.iterdir():
            if not (first / item.name).exists():
                shutil.move(item, first / item.name)
    outputs = {"html": "index.html", "epub": "*.epub", "pdf": "*.pdf"}
    missing = [name for name in formats if name in outputs and not list(first.glob(outputs[name]))]
    if missing:
        raise QuartoError(f"`quarto render` in {stage} wrote no {', '.join(missing)}; {out} was left as it was")
    finish_html(first, node_modules)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(first, out)
    return {"formats": formats, "seconds": time.perf_counter() - started}
