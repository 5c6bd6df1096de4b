"""The book's pages, read in headless Chromium (Debian's, driven by Playwright).

The pages are the ones Quarto renders in the session from the executed chapters (fixture
`quarto_book`, tests/conftest.py). For every page the book lists, at 1280 px and at 390 px: no
console errors, no failed requests and none to another host; every image loaded, with alt text,
no wider than the text column; maths typeset; every Mermaid diagram drawn, and its text at least
MIN_DIAGRAM_TEXT_PX high on the screen; no raw Quarto syntax and no Markdown printed as
characters; every internal link resolving to a file and an id; code blocks of at most 80
characters a line shown whole at 1280 px; and the page never scrolling sideways (wide tables,
code, equations and diagrams scroll inside their own boxes); and no chapter page longer than
PAGE_SCREENS screens at 1280 px (a longer chapter is split into pages along its lesson). A
screenshot of each page at both widths goes to tests/artifacts/screenshots/ (git-ignored): the
first screenful by default, the whole page when LONGCTX_FULL_SCREENSHOTS=1 (for reading the book
as it renders).

Where Chromium or Quarto is missing the tests skip, saying so; in CI (`CI` set) they fail.
Set LONGCTX_QUARTO_BOOK_DIR to a rendered `_book/` to read that folder instead of rendering one.
"""

from __future__ import annotations

import functools
import http.server
import io
import os
import re
import shutil
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from booktools.book import load_book
from bs4 import BeautifulSoup
from conftest import skip_or_fail

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = ROOT / "tests" / "artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# What a reader must never see: Quarto's own syntax, left untranslated.
RAW_QUARTO = re.compile(
    r"@(?:fig|tbl|eq|sec)-[A-Za-z0-9]|\{#(?:fig|tbl|eq|sec)-|(?:^|\n)\s*:::|#\||\{python\}"
)
CODE_LINE_LIMIT = 80
MIN_DIAGRAM_TEXT_PX = 9
"""The smallest a diagram's text may be drawn, in CSS pixels, at either width (the prose is 16 px)."""
WIDTHS = ((1280, 900), (390, 844))
PAGE_SCREENS = 40
"""The most screens (900 px at 1280 px) a page may take: a page a reader can finish (issue 36)."""


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        skip_or_fail("the browser test needs /usr/bin/chromium (Debian's package: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ModuleNotFoundError:
        skip_or_fail("the browser test needs Playwright for Python (requirements.txt; run `make env`)")
    return CHROMIUM


@pytest.fixture(scope="session")
def book_dir(chromium_path, quarto_book) -> Path:
    """The rendered book (Quarto's `_book/`)."""
    return quarto_book.directory


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the name the base class uses
        pass


@pytest.fixture(scope="session")
def server(book_dir):
    handler = functools.partial(_QuietHandler, directory=str(book_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser(chromium_path, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(chromium_path),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    if SCREENSHOTS.exists():
        shutil.rmtree(SCREENSHOTS)
    SCREENSHOTS.mkdir(parents=True)
    return SCREENSHOTS


def _full_page_screenshot(page, path: Path) -> None:
    """The whole page as one PNG, stitched from viewport-sized shots.

    Playwright's own full-page capture resizes the viewport to the page's height, which takes
    about a minute for a long chapter on two cores; scrolling and stitching takes seconds.
    """
    if os.environ.get("LONGCTX_FULL_SCREENSHOTS") != "1":
        page.screenshot(path=str(path))  # the first screenful
        return
    from PIL import Image

    page.add_style_tag(
        content=".book-header, .sidebar { position: static !important; } .sidebar { height: auto !important; }"
        " html { scroll-behavior: auto !important; }"
    )
    size = page.viewport_size
    height = page.evaluate("() => document.documentElement.scrollHeight")
    width = size["width"]
    sheet = Image.new("RGB", (width, height), "white")
    offset = 0
    while offset < height:
        page.evaluate(f"() => window.scrollTo(0, {offset})")
        actual = page.evaluate("() => window.scrollY")
        shot = Image.open(io.BytesIO(page.screenshot()))
        sheet.paste(shot.convert("RGB").crop((0, 0, width, min(shot.height, height - actual))), (0, actual))
        offset = actual + size["height"]
        if actual + size["height"] >= height:
            break
    sheet.save(path, compress_level=1)


@functools.cache
def _ids_in(path: Path) -> frozenset[str]:
    soup = BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")
    return frozenset(tag["id"] for tag in soup.find_all(id=True))


def _overflowing(page) -> list[str]:
    """The first few elements that stick out of the page's width and are not inside a scrolling box."""
    return page.evaluate(
        """() => {
      const width = document.documentElement.clientWidth;
      const scrolls = (element) => {
        for (let a = element.parentElement; a; a = a.parentElement) {
          const overflow = getComputedStyle(a).overflowX;
          if (overflow === "auto" || overflow === "scroll" || overflow === "hidden") return true;
        }
        return false;
      };
      return Array.from(document.querySelectorAll("body *"))
        .filter(e => e.getBoundingClientRect().right > width + 1 && !scrolls(e))
        .slice(0, 5)
        .map(e => e.tagName + "." + e.className + ": " + (e.textContent || "").slice(0, 60));
    }"""
    )


# --- the checks -----------------------------------------------------------------------------------


def _image_problems(page) -> list[str]:
    """Images that did not load, have no alt text or are wider than the text column."""
    images = page.evaluate(
        "() => Array.from(document.images).map(i => ({src: i.getAttribute('src'), "
        "ok: i.complete && i.naturalWidth > 0, alt: (i.getAttribute('alt') || '').trim(), "
        "fits: i.getBoundingClientRect().width <= (i.closest('main') || document.body).clientWidth + 1}))"
    )
    problems = []
    for image in images:
        if not image["ok"]:
            problems.append(f"image did not load: {image['src']}")
        if not image["alt"]:
            problems.append(f"image without alt text: {image['src']}")
        if not image["fits"]:
            problems.append(f"image wider than the text column: {image['src']}")
    return problems


# Each diagram: drawn or not, and the smallest of its labels' font sizes as drawn on the screen
# (the label's CSS font size times the scale from the SVG's units to the screen's pixels).
# Quarto's mermaid-init.js replaces each `pre.mermaid-js` by the `svg.mermaid-js` it draws.
_DIAGRAMS = """() => Array.from(document.querySelectorAll('svg.mermaid-js')).map(svg => {
  const sizes = [];
  for (const label of svg.querySelectorAll('text, foreignObject')) {
    if (!label.textContent.trim()) continue;
    const ctm = label.getScreenCTM();
    const inner = label.querySelector('span, div, p, tspan') || label;
    if (ctm) sizes.push(parseFloat(getComputedStyle(inner).fontSize) * Math.hypot(ctm.a, ctm.b));
  }
  return {error: svg.getAttribute('aria-roledescription') === 'error', text: svg.id,
          smallest: sizes.length ? Math.min(...sizes) : null};
})"""


def _maths_and_diagram_problems(page, width: int, expected: int) -> list[str]:
    """MathJax errors; mermaid diagrams not drawn, drawn as an error, or with text too small to read."""
    errors = page.evaluate("() => Array.from(document.querySelectorAll('mjx-merror')).map(e => e.textContent)")
    problems = [f"MathJax error: {error}" for error in errors]
    diagrams = page.evaluate(_DIAGRAMS)
    if len(diagrams) != expected:
        problems.append(f"{len(diagrams)} mermaid diagrams drawn of the {expected} on the page")
    for diagram in diagrams:
        if diagram["error"]:
            problems.append(f"mermaid diagram not rendered: {diagram['text']!r}")
        elif diagram["smallest"] is None or diagram["smallest"] < MIN_DIAGRAM_TEXT_PX:
            problems.append(
                f"at {width} px a mermaid diagram's text is {diagram['smallest'] or 0:.1f} px high "
                f"(at least {MIN_DIAGRAM_TEXT_PX}): {diagram['text']!r}"
            )
    return problems


def _raw_quarto_problems(text: str) -> list[str]:
    problems = []
    for match in RAW_QUARTO.finditer(text):
        start = max(0, match.start() - 40)
        problems.append(f"raw Quarto syntax {match.group(0)!r} in: ...{text[start : match.end() + 40]!r}")
    return problems


def _link_problems(page, host: str, book_dir: Path) -> list[str]:
    """Links on this host whose file or id does not exist (a folder link means its index.html).

    External links are allowed in prose; the browser never loaded them.
    """
    problems = []
    links = page.evaluate("() => Array.from(document.querySelectorAll('a[href]')).map(a => a.href)")
    for link in sorted(set(links)):
        target = urllib.parse.urlsplit(link)
        if target.scheme in ("data", "mailto") or target.hostname != host:
            continue
        path = urllib.parse.unquote(target.path).lstrip("/") or "index.html"
        file = book_dir / path
        if file.is_dir():
            file = file / "index.html"
        if not file.is_file():
            problems.append(f"broken link: {link} (no file {path})")
        elif target.fragment and file.suffix == ".html" and urllib.parse.unquote(target.fragment) not in _ids_in(file):
            problems.append(f"broken link: {link} (no id #{target.fragment} in {path})")
    return problems


def _pages() -> list[str]:
    """The page Quarto writes for every file _quarto.yml lists (index.html, chapters/*.html)."""
    book = load_book(ROOT)
    return [
        str(Path(entry.path).with_suffix(".html")) for entry in book.entries if (ROOT / entry.path).is_file()
    ]


# Prose a reader sees: not code, outputs, typeset maths, diagrams or scripts.
_PROSE = """() => {
  const skip = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "MJX-CONTAINER", "svg", "SVG", "CODE", "PRE", "KBD",
                        "SAMP", "NAV", "HEADER", "FOOTER"]);
  const parts = [];
  const walk = (node) => {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) { parts.push(child.textContent); }
      else if (child.nodeType === Node.ELEMENT_NODE && !skip.has(child.tagName)
               && !child.classList.contains("cell-output") && !child.classList.contains("sourceCode")
               && !child.classList.contains("math")) { walk(child); }
    }
  };
  walk(document.querySelector("main") || document.body);
  return parts.join("");
}"""
# What Markdown looks like when it reached the reader as characters.
_LEAKS = (
    ("raw `$` (maths not typeset)", re.compile(r"\$|\\\(|\\\)")),
    ("raw `*word*` (emphasis printed as text)", re.compile(r"(?<![\w*])\*[^\s*][^*\n]{0,80}?(?<=\S)\*(?![\w*])")),
    ("raw backticks (code printed as text)", re.compile(r"`")),
)


def _screenshot(page, path: Path) -> None:
    page.add_style_tag(
        content="#quarto-header, #quarto-sidebar, #quarto-margin-sidebar, .sidebar, .headroom "
        "{ position: static !important; transform: none !important; } html { scroll-behavior: auto !important; }"
    )
    _full_page_screenshot(page, path)


def _long_code_problems(page) -> list[str]:
    """Code blocks whose lines are at most 80 characters that scroll (folded code and callouts opened)."""
    page.evaluate(
        "() => { document.querySelectorAll('details').forEach(d => { d.open = true; });"
        " document.querySelectorAll('.callout-collapse.collapse').forEach(c => c.classList.add('show')); }"
    )
    blocks = page.evaluate(
        """() => Array.from(document.querySelectorAll('div.sourceCode pre, div.cell-output pre')).map(pre => ({
             longest: Math.max(0, ...pre.textContent.replace(/\\n$/, '').split('\\n').map(line => line.length)),
             scrolls: pre.scrollWidth > pre.clientWidth + 1,
             first: pre.innerText.slice(0, 60)}))"""
    )
    return [
        f"a code block of {block['longest']}-character lines scrolls at 1280 px: {block['first']!r}"
        for block in blocks
        if block["longest"] <= CODE_LINE_LIMIT and block["scrolls"]
    ]


def _wait_until_quiet(page, in_flight: set, quiet: float = 0.5, limit: float = 120.0) -> None:
    """Wait until no request of the page has been in flight for `quiet` seconds.

    Playwright's "networkidle" waits for Chromium's own lifecycle event, which a page whose
    layout changes after load (the diagrams being sized) does not always send.
    """
    deadline, since = time.monotonic() + limit, None
    while time.monotonic() < deadline:
        now = time.monotonic()
        since = None if in_flight else (since or now)
        if since is not None and now - since >= quiet:
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"requests still in flight after {limit:.0f} s: {[r.url for r in in_flight][:5]}")


@pytest.mark.parametrize("name", _pages())
def test_page_reads_cleanly(name, book_dir, server, browser, screenshots):
    assert (book_dir / name).is_file(), f"{name} was not rendered"
    problems: list[str] = []
    page = browser.new_page()
    host = urllib.parse.urlsplit(server).hostname

    in_flight: set = set()

    def on_request(request):
        in_flight.add(request)
        requested = urllib.parse.urlsplit(request.url)
        if requested.scheme in ("http", "https", "ws", "wss") and requested.hostname != host:
            problems.append(f"request to another host: {request.url}")

    page.on("console", lambda message: message.type == "error" and problems.append(f"console error: {message.text}"))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("request", on_request)
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url} ({request.failure})"))
    page.on("requestfinished", lambda request: in_flight.discard(request))
    page.on("requestfailed", lambda request: in_flight.discard(request))
    page.on("response", lambda response: response.status >= 400 and problems.append(f"HTTP {response.status}: {response.url}"))
    stem = name.replace("/", "-").removesuffix(".html")
    try:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(server + name, wait_until="load", timeout=120_000)
        page.wait_for_function("() => document.querySelectorAll('pre.mermaid-js').length === 0", timeout=60_000)
        page.evaluate(
            "() => (window.MathJax && MathJax.startup && MathJax.startup.promise) ? "
            "MathJax.startup.promise.then(() => true) : true"
        )
        _wait_until_quiet(page, in_flight)

        problems += _image_problems(page)
        html_source = (book_dir / name).read_text(encoding="utf-8")
        diagrams = html_source.count('<pre class="mermaid mermaid-js"')
        if 'class="math' in html_source:
            if page.evaluate("() => document.querySelectorAll('mjx-container').length") == 0:
                problems.append("the page has maths but none was typeset")
        text = page.evaluate(_PROSE)
        problems += _raw_quarto_problems(text)
        for what, pattern in _LEAKS:
            for match in pattern.finditer(text):
                start = max(0, match.start() - 40)
                problems.append(f"{what}: ...{text[start : match.end() + 40]!r}")
        problems += _link_problems(page, host, book_dir)

        for width, height in WIDTHS:
            page.set_viewport_size({"width": width, "height": height})
            page.evaluate("() => window.scrollTo(0, 0)")
            page.wait_for_timeout(300)
            problems += _maths_and_diagram_problems(page, width, diagrams)
            wide = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
            if wide > 0:
                problems.append(f"the page scrolls sideways by {wide} px at {width} px: {_overflowing(page)}")
            if width == 1280:
                screens = page.evaluate("() => document.documentElement.scrollHeight") / height
                # chapters only: the appendices are reference pages
                if re.match(r"ch\d\d-", Path(name).stem) and screens > PAGE_SCREENS:
                    problems.append(f"the page is {screens:.1f} screens of {height} px long at 1280 px (at most "
                                    f"{PAGE_SCREENS}): move its method detail to an appendix or split it along "
                                    "its lesson")
                _screenshot(page, screenshots / f"{stem}.png")
                problems += _long_code_problems(page)
            else:
                page.screenshot(path=str(screenshots / f"{stem}-narrow.png"))
    finally:
        page.close()
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)
