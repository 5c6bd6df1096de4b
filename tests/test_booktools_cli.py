"""The command line, `python -m booktools VERB`: its verbs, its help and its exit codes."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
from booktools.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
VERBS = ("tangle", "notebooks", "check", "quarto")


def test_module_entry_point_runs_and_lists_every_verb(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["booktools", "--help"])
    with pytest.raises(SystemExit) as caught:
        runpy.run_module("booktools", run_name="__main__")  # `python -m booktools --help`, in this process
    assert caught.value.code == 0
    shown = capsys.readouterr().out
    for verb in VERBS:
        assert verb in shown
    assert "html" not in shown.replace("HTML and EPUB", "")  # Quarto is the one renderer
    assert "\n    execute " not in shown  # and the one executor: no verb of our own


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_is_parsed_by_the_one_parser(verb):
    args = build_parser().parse_args(["--root", "somewhere", verb])
    assert args.verb == verb and args.root == "somewhere" and callable(args.run)


def test_usage_errors_exit_2(fixture_book, booktools):
    for argv in (["no-such-verb"], ["execute"], ["quarto", "--no-such-option"]):
        with pytest.raises(SystemExit) as caught:
            booktools(fixture_book, *argv)
        assert caught.value.code == 2, argv
    code, _, err = booktools(fixture_book.parent / "nowhere", "tangle")
    assert code == 2 and "_quarto.yml" in err


def test_problems_exit_1_naming_file_and_line(fixture_book, booktools):
    chapter = fixture_book / "chapters" / "ch01-alpha.qmd"
    chapter.write_text(chapter.read_text() + "\n```{python}\n#| label: [unclosed\n```\n")
    code, _, err = booktools(fixture_book, "check")
    assert code == 1 and "chapters/ch01-alpha.qmd:" in err


def test_quarto_without_what_it_needs_says_what_to_run(fixture_book, booktools, monkeypatch):
    from booktools import quarto

    monkeypatch.setattr(quarto, "find_quarto", lambda: "/bin/true")
    code, _, err = booktools(fixture_book, "quarto")
    assert code == 1 and "run `npm ci --prefix web`" in err
