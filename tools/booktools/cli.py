"""Argument parsing and dispatch for `python -m booktools`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from .book import BookError, find_root, load_book

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


def _root(args: argparse.Namespace) -> Path:
    return Path(args.root).resolve() if args.root else find_root()


def cmd_tangle(args: argparse.Namespace) -> int:
    from .tangle import stale_outputs, tangle_book, write_outputs

    started = time.perf_counter()
    book = load_book(_root(args))
    result = tangle_book(book, args.files or None)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.problems:
        for problem in result.problems:
            print(problem, file=sys.stderr)
        print(f"tangle: {len(result.problems)} problem(s); no files were written", file=sys.stderr)
        return EXIT_PROBLEMS
    if args.check:
        stale = stale_outputs(result)
        for path in stale:
            print(f"{book.display(path)}: stale: it differs from what its chapter's `# @save` cells give "
                  "(run `python -m booktools tangle`)", file=sys.stderr)
        if stale:
            return EXIT_PROBLEMS
        if not args.quiet:
            print(f"tangle --check: {len(result.outputs)} module(s) current")
        return EXIT_OK
    written = write_outputs(result)
    if not args.quiet:
        elapsed = time.perf_counter() - started
        for path in written:
            print(f"wrote {book.display(path)}")
        print(f"tangle: {len(result.outputs)} module(s), {len(written)} file(s) changed, {elapsed * 1000:.0f} ms")
    return EXIT_OK


def cmd_notebooks(args: argparse.Namespace) -> int:
    from .notebooks import main_notebooks

    return main_notebooks(_root(args), args)


def cmd_execute(args: argparse.Namespace) -> int:
    from .execute import main_execute

    return main_execute(_root(args), args)


def cmd_check(args: argparse.Namespace) -> int:
    from .check import main_check

    return main_check(_root(args), args)


def cmd_html(args: argparse.Namespace) -> int:
    try:
        html = importlib.import_module("booktools.html")
    except ModuleNotFoundError as exc:
        if exc.name not in ("booktools.html", "booktools"):
            raise
        print(
            "html: the notebook-edition builder (booktools.html) is not installed yet; "
            "run `tangle`, `notebooks` and `execute` for the executed notebooks in _build/executed/",
            file=sys.stderr,
        )
        return EXIT_USAGE
    argv = list(args.html_args)
    if args.root:
        argv = ["--root", args.root, *argv]
    return int(html.main(argv) or 0)


def cmd_quarto(args: argparse.Namespace) -> int:
    from .quarto import main

    argv = list(args.html_args)
    if args.root:
        argv = ["--root", args.root, *argv]
    return int(main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m booktools",
        description="Tools for the executable book: tangle chapters into modules, export and execute "
        "notebooks, check the book's integrity, build the notebook edition.",
        epilog="Exit status: 0 success, 1 the book has problems (printed as FILE:LINE: message), 2 usage error.",
    )
    parser.add_argument("--root", help="the book's root (the folder holding _quarto.yml); default: found from the cwd")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    tangle = verbs.add_parser("tangle", help="write code/chNN/ from each chapter's `# @save` cells")
    tangle.add_argument("files", nargs="*", help="chapter files (default: every chapter in _quarto.yml)")
    tangle.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale module")
    tangle.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    tangle.set_defaults(run=cmd_tangle)

    notebooks = verbs.add_parser(
        "notebooks",
        help="the reader's notebooks/chNN-*.ipynb: the executed chapters (run `execute` first) with their "
        "outputs and inline values, no Quarto syntax, and a first cell that installs longctx outside the repository",
    )
    notebooks.add_argument("files", nargs="*", help="chapter files (default: every chapter in _quarto.yml)")
    notebooks.add_argument("--executed", help="the executed notebooks (default: _build/executed/)")
    notebooks.add_argument("--out", help="output folder (default: notebooks/)")
    notebooks.add_argument("-q", "--quiet", action="store_true")
    notebooks.set_defaults(run=cmd_notebooks)

    execute = verbs.add_parser("execute", help="execute the chapters' notebooks into _build/executed/")
    execute.add_argument("files", nargs="*", help="chapter files (default: every chapter in _quarto.yml)")
    execute.add_argument("--out", help="output folder (default: _build/executed/)")
    execute.add_argument("--jobs", "-j", type=int, default=1, help="chapters executed in parallel (default 1)")
    execute.add_argument("--timeout", type=int, default=600, help="seconds one cell may run (default 600)")
    execute.add_argument("-q", "--quiet", action="store_true")
    execute.set_defaults(run=cmd_execute)

    check = verbs.add_parser("check", help="check cross-references, citations, labels, captions and modules")
    check.set_defaults(run=cmd_check)

    html = verbs.add_parser("html", help="build the notebook edition of the book into _book/", add_help=False)
    html.add_argument("html_args", nargs=argparse.REMAINDER, help="arguments for the html builder")
    html.set_defaults(run=cmd_html)

    quarto = verbs.add_parser(
        "quarto", help="render the Quarto edition into _book/ from the executed chapters", add_help=False
    )
    quarto.add_argument("html_args", nargs=argparse.REMAINDER, help="arguments for the Quarto renderer")
    quarto.set_defaults(run=cmd_quarto)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # `html` and `quarto` hand their options to their builders' own parsers; argparse's REMAINDER does not capture
    # options that come straight after a subcommand (`html --out X`), so collect them explicitly.
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if args.verb not in ("html", "quarto"):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.html_args = [*unknown, *args.html_args]
    if getattr(args, "jobs", 1) is not None and getattr(args, "jobs", 1) < 1:
        parser.error("--jobs must be at least 1")
    try:
        return args.run(args)
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
