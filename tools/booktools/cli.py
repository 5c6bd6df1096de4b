"""The command line, `python -m booktools VERB`: one parser, one function per verb. Exit status:
0 success, 1 the book has problems (each printed as FILE:LINE: message), 2 usage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .book import BookError, load_book, write_if_changed
from .qmd import QmdError


def _report(problems: list, verb: str) -> int:
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{verb}: {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def cmd_tangle(book, args: argparse.Namespace) -> int:
    from .tangle import tangle_book

    result = tangle_book(book)
    if result.problems:
        _report(result.problems, "tangle")
        print("tangle: no files were written", file=sys.stderr)
        return 1
    if args.check:
        stale = [path for path, text in result.files.items()
                 if not path.is_file() or path.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"{book.display(path)}: stale: it differs from what its chapter's `# @save` cells give "
                  "(run `python -m booktools tangle`)", file=sys.stderr)
        if not stale and not args.quiet:
            print(f"tangle --check: {len(result.outputs)} module(s) current")
        return 1 if stale else 0
    written = [path for path, text in result.files.items() if write_if_changed(path, text)]
    if not args.quiet:
        for path in written:
            print(f"wrote {book.display(path)}")
        print(f"tangle: {len(result.outputs)} module(s), {len(written)} file(s) changed")
    return 0


def cmd_notebooks(book, args: argparse.Namespace) -> int:
    from .notebooks import finish_book

    paths, problems = finish_book(book, book.root / "_build" / "executed", book.root / "notebooks")
    for path in paths:
        print(f"wrote {book.display(path)}")
    return _report(problems, "notebooks")


def cmd_check(book, args: argparse.Namespace) -> int:
    from .check import check_book

    problems = check_book(book)
    if not problems:
        print("check: the book is consistent")
    return _report(problems, "check")


def cmd_quarto(book, args: argparse.Namespace) -> int:
    from .quarto import QuartoError, build_quarto_book

    out = book.root / "_book"
    try:
        result = build_quarto_book(book.root, out)
    except QuartoError as exc:
        print(f"quarto: {exc}", file=sys.stderr)
        return 1
    print(f"quarto: executed and rendered {', '.join(result['formats'])} in {result['seconds']:.0f} s -> {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m booktools",
        description="Tools for the executable book: tangle chapters into modules, check the book's integrity, "
        "execute and render the book with Quarto, write the reader's notebooks from Quarto's executed chapters.",
        epilog="Exit status: 0 success, 1 the book has problems (printed as FILE:LINE: message), 2 usage error.",
    )
    parser.add_argument("--root", help="the book's root (the folder holding _quarto.yml); default: found from the cwd")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    tangle = verbs.add_parser("tangle", help="write code/chNN/ from each chapter's `# @save` cells")
    tangle.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale module")
    tangle.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    tangle.set_defaults(run=cmd_tangle)
    notebooks = verbs.add_parser("notebooks", help="the reader's notebooks/chNN-*.ipynb: the chapters Quarto executed "
                                 "(run `quarto` first) with their outputs and inline values, no Quarto syntax, and a "
                                 "first cell that installs longctx outside the repository")
    notebooks.set_defaults(run=cmd_notebooks)
    check = verbs.add_parser("check", help="check cross-references, citations, labels, captions and saved code")
    check.set_defaults(run=cmd_check)
    quarto = verbs.add_parser("quarto", help="execute and render the book with Quarto into _book/ (HTML and EPUB)")
    quarto.set_defaults(run=cmd_quarto)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(load_book(Path(args.root).resolve() if args.root else None), args)
    except BookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except QmdError as exc:
        print(exc, file=sys.stderr)
        return 1
