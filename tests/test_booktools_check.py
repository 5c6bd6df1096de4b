"""`check` catches each kind of broken book, reporting FILE:LINE: message."""

from __future__ import annotations

from pathlib import Path

import pytest
from booktools.book import load_book
from booktools.check import check_book
from test_booktools_tangle import ALPHA, make_book

# The shared fixture's diagram has no label (its numbering is what the other tooling tests
# expect); the clean book labels it, which moves every later line of ch01-alpha.qmd down by two.
UNLABELLED = '%%| fig-cap: "A flow"\n'
LABELLED = '%%| label: fig-ch01-flow\n%%| fig-cap: "A flow"\n%%| fig-alt: "Box A, an arrow, box B."\n'


@pytest.fixture
def clean_book(fixture_book: Path) -> Path:
    edit(fixture_book / "chapters" / "ch01-alpha.qmd", UNLABELLED, LABELLED)
    return fixture_book


def problems(root: Path) -> list[str]:
    return check_book(load_book(root))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_fixture_book_is_clean(clean_book, booktools):
    assert problems(clean_book) == []
    code, out, err = booktools(clean_book, "check")
    assert (code, err) == (0, "") and "consistent" in out


def chapter(root: Path, name: str = "ch01-alpha") -> Path:
    return root / "chapters" / f"{name}.qmd"


INLINE_CELL = '```{python}\nwords = ", ".join(f"*{w}*" for w in ["hate", "love"])\n```\n\nWords: `{python} words`.\n'


#: Each broken book (a breakage of the clean fixture) and the first words of the problem `check` names,
#: the book's integrity first, then what Quarto trips on although the notebook edition does not.
BROKEN = [
        pytest.param(
            lambda root: edit(chapter(root), "@fig-ch01-curve,", "@fig-ch01-curvy,"),
            "chapters/ch01-alpha.qmd:9: cross-reference @fig-ch01-curvy points at no label",
            id="unresolved-cross-reference",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "[@vaswani2017attention]", "[@nobody2020]"),
            "chapters/ch01-alpha.qmd:7: citation @nobody2020 is not in the bibliography (references.bib)",
            id="unknown-citation",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "{#sec-ch01-cost}", "{#sec-ch01-alpha}"),
            "chapters/ch01-alpha.qmd:11: label sec-ch01-alpha is already used at chapters/ch01-alpha.qmd:5",
            id="duplicate-label",
        ),
        pytest.param(
            lambda root: edit(chapter(root, "ch02-beta"), "{#sec-ch02-beta}", "{#sec-ch01-beta}"),
            "chapters/ch02-beta.qmd:1: label sec-ch01-beta should name its chapter: sec-ch02-...",
            id="label-names-wrong-chapter",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "## Counting pairs {#sec-ch01-cost}", "## Counting pairs {#counting}"),
            "chapters/ch01-alpha.qmd:11: label counting should start with sec-",
            id="label-without-prefix",
        ),
        pytest.param(
            lambda root: edit(chapter(root), '#| fig-alt: "A rising curve."\n', ""),
            "chapters/ch01-alpha.qmd:71: figure cell fig-ch01-curve has no `#| fig-alt:`",
            id="figure-without-alt",
        ),
        pytest.param(
            lambda root: edit(chapter(root), '#| fig-cap: "How do pairs grow with n?"\n', ""),
            "chapters/ch01-alpha.qmd:71: figure cell fig-ch01-curve has no `#| fig-cap:`",
            id="figure-without-caption",
        ),
        pytest.param(
            lambda root: (root / "chapters" / "ch03-extra.qmd").write_text("# Extra\n"),
            "chapters/ch03-extra.qmd:1: this chapter file is not listed in _quarto.yml",
            id="chapter-not-listed",
        ),
        pytest.param(
            lambda root: chapter(root, "appendix-extra").unlink(),
            "_quarto.yml:10: chapters/appendix-extra.qmd is listed but does not exist",
            id="listed-file-missing",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "total = pairs(4)", "from longctx import ch02\ntotal = pairs(4)"),
            "chapters/ch01-alpha.qmd:30: `from longctx import ch02` imports ch02; a chapter may import only earlier",
            id="later-import-in-unsaved-cell",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "Models grow; see @fig-ch01-curve.\n:::", "Models grow."),
            "chapters/ch01-alpha.qmd:54: fenced div opened here (`:::`) is never closed",
            id="unclosed-callout",
        ),
        pytest.param(
            lambda root: (root / "index.qmd").write_text("# Preface {.unnumbered}\n\n```{python}\n# @save\nx = 1\n```\n"),
            "index.qmd:4: `# @save` in a file that produces no module",
            id="save-outside-a-chapter-module",
        ),
        pytest.param(
            lambda root: (root / "references.bib").write_text(
                (root / "references.bib").read_text() + "@misc{xiao2024streaming, author = {X}, year = {2024}}\n"
            ),
            "references.bib:17: duplicate key xiao2024streaming",
            id="duplicate-bibliography-key",
        ),
    # --- what Quarto trips on although the notebook edition does not
        pytest.param(
            lambda root: chapter(root, "ch02-beta").write_text("---\n---\n" + chapter(root, "ch02-beta").read_text()),
            "chapters/ch02-beta.qmd:1: empty front matter block (`---` then `---`)",
            id="empty-front-matter",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "Four tokens give", "Here $j_{\\text{low}} = $ 3 and $k$ = 2. Four tokens give"),
            "chapters/ch01-alpha.qmd:34: maths span $j_{\\text{low}} = $ has a space before its closing `$`",
            id="space-before-closing-dollar",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "### A detail\n", INLINE_CELL + "\n### A detail\n"),
            "chapters/ch01-alpha.qmd:40: inline value `{python} words` is a str carrying Markdown (`*…*` emphasis)",
            id="markdown-in-an-inline-str",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "### A detail\n", INLINE_CELL.replace('f"*{w}*"', 'f"`{w}`"') + "\n### A detail\n"),
            "chapters/ch01-alpha.qmd:40: inline value `{python} words` is a str carrying Markdown (backticks)",
            id="backticks-in-an-inline-str",
        ),
        pytest.param(
            lambda root: edit(chapter(root), LABELLED, UNLABELLED),
            "chapters/ch01-alpha.qmd:44: mermaid diagram without `%%| label: fig-…`",
            id="unlabelled-mermaid",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "total = pairs(4)", "total = pairs(4)  # " + "x" * 70),
            "chapters/ch01-alpha.qmd:30: code line is 90 characters; the book's code lines are at most 80",
            id="code-line-over-80",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "x = 1\n```", "x = '" + "y" * 80 + "'\n```"),
            "chapters/ch01-alpha.qmd:81: code line is 86 characters",
            id="long-line-in-a-shown-block",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "### A detail\n", "![A curve](curve.png){#fig-ch01-image}\n\n### A detail\n"),
            "chapters/ch01-alpha.qmd:36: label fig-ch01-image is on an image or a div",
            id="image-figure-the-tools-would-not-number",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "Models grow;", "## Growth\n\nModels grow;"),
            "chapters/ch01-alpha.qmd:55: a heading inside a callout, which Quarto would take for the callout's title",
            id="heading-inside-a-callout",
        ),
        pytest.param(
            lambda root: edit(chapter(root), "### A detail\n", "### A detail with $k$\n"),
            "chapters/ch01-alpha.qmd:36: maths in a heading: the EPUB's contents would hold MathML",
            id="maths-in-a-heading",
        ),
]


@pytest.mark.parametrize(("breakage", "expected"), BROKEN)
def test_each_broken_book_is_caught(clean_book, booktools, breakage, expected):
    breakage(clean_book)
    found = problems(clean_book)
    assert any(problem.startswith(expected) for problem in found), "\n".join(found)
    code, _, err = booktools(clean_book, "check")
    assert code == 1 and expected in err



@pytest.mark.parametrize(
    "fine",
    [
        pytest.param('```{python}\nfrom IPython.display import Markdown\nwords = Markdown("*a*")\n```\n\n`{python} words`\n', id="markdown-object"),
        pytest.param('```{python}\nwords = "a, b"\n```\n\n`{python} words` and `{python} 2 * 3`\n', id="plain-text-and-arithmetic"),
        pytest.param("It costs \\$5; $x$, $$y = 1$$ and `$ ls` are fine.\n", id="maths-and-escaped-dollars"),
        pytest.param("```{mermaid}\n%%| label: fig-ch01-ok\n%%| fig-cap: \"Ok?\"\n%%| fig-alt: \"A.\"\ngraph LR\n  A --> B\n```\n", id="labelled-mermaid"),
        pytest.param("```{python}\n#| fig-alt: \"" + "long option text " * 10 + "\"\nx = 1\n```\n", id="long-option-lines-are-not-code"),
    ],
)
def test_what_quarto_reads_correctly_passes(clean_book, fine):
    edit(chapter(clean_book), "### A detail\n", fine + "\n### A detail\n")
    assert problems(clean_book) == []


def test_an_appendix_keeps_the_label_of_a_chapter_section_moved_into_it(clean_book):
    appendix = chapter(clean_book, "appendix-extra")
    appendix.write_text(appendix.read_text() + "\n## Moved {#sec-ch01-moved}\n\nText.\n")
    edit(chapter(clean_book), "### A detail\n", "See @sec-ch01-moved.\n\n### A detail\n")
    assert problems(clean_book) == []
    appendix.write_text(appendix.read_text() + "\n## Stray {#sec-other-stray}\n")
    assert any("label sec-other-stray should name its chapter: sec-appendix-" in p
               for p in problems(clean_book))


def test_the_shared_fixture_has_exactly_one_problem_its_unlabelled_diagram(fixture_book):
    found = problems(fixture_book)
    assert len(found) == 1 and found[0].startswith("chapters/ch01-alpha.qmd:44: mermaid diagram without"), found


# --- the book's rules for saved code: chapter order, no side effects, what `help()` shows -------------

NUMBERED = """
# Beta {#sec-ch02-beta}

## Counting {#sec-ch02-counting}

$$
y = 2x
$$ {#eq-ch02-double}

```{python}
# @save
def twice(x: int) -> int:
    \"\"\"DOC\"\"\"
    return 2 * x  # COMMENT
```
"""


def saved_code_problems(tmp_path, body: str) -> list[str]:
    """`check`'s problems for a book of ch01-alpha, `body` as ch02-beta and an empty ch03-gamma."""
    root = make_book(
        tmp_path / "err",
        {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": body, "chapters/ch03-gamma.qmd": "# Gamma\n"},
    )
    return check_book(load_book(root))


def numbered_problems(tmp_path, doc: str, comment: str = "Equation 2.1") -> list[str]:
    return saved_code_problems(tmp_path, NUMBERED.replace("DOC", doc).replace("COMMENT", comment))


def test_docstrings_that_name_the_books_numbers_pass(tmp_path):
    doc = "Return 2x (Equation 2.1 of Section 2.1, as in Chapter 1).\n\n    Args:\n        x: a number.\n    "
    assert numbered_problems(tmp_path, doc) == []


@pytest.mark.parametrize(
    ("doc", "comment", "expected"),
    [
        pytest.param(
            "Return 2x (@eq-ch02-double).", "Equation 2.1",
            "chapters/ch02-beta.qmd:12: the docstring of `twice` holds the Quarto cross-reference "
            '`@eq-ch02-double`, which `help()` shows as it is; write "Equation 2.1"',
            id="equation-label",
        ),
        pytest.param(
            "Return 2x, as @sec-ch02-counting says.", "Equation 2.1",
            'cross-reference `@sec-ch02-counting`, which `help()` shows as it is; write "Section 2.1"',
            id="section-label",
        ),
        pytest.param(
            "Return 2x [@vaswani2017attention].", "Equation 2.1",
            "the docstring of `twice` holds the Quarto citation `[@vaswani2017attention]`",
            id="citation",
        ),
        pytest.param(
            "Return `{python} doubled`.", "Equation 2.1",
            "the docstring of `twice` holds a Quarto inline value `{python}`",
            id="inline-value",
        ),
        pytest.param(
            "Return 2x (Equation 2.2).", "Equation 2.1",
            "chapters/ch02-beta.qmd:12: the docstring of `twice` names Equation 2.2, which the book does not have",
            id="equation-number-that-does-not-exist",
        ),
        pytest.param(
            "Return 2x (see Figure 1.1).", "Equation 2.1",
            "names Figure 1.1, which the book does not have",
            id="figure-number-that-does-not-exist",
        ),
        pytest.param(
            "Return 2x.", "y of @eq-ch02-double",
            "chapters/ch02-beta.qmd:13: a comment holds the Quarto cross-reference `@eq-ch02-double`",
            id="label-in-a-comment",
        ),
        pytest.param(
            "Return 2x.", "Section 2.9",
            "chapters/ch02-beta.qmd:13: a comment names Section 2.9, which the book does not have",
            id="section-number-in-a-comment",
        ),
    ],
)
def test_docstrings_and_comments_refuse_quarto_syntax_and_missing_numbers(tmp_path, doc, comment, expected):
    found = numbered_problems(tmp_path, doc, comment)
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "# B\n\n```{python}\n# @save\nfrom longctx import ch03\n```\n",
            "chapters/ch02-beta.qmd:5: `from longctx import ch03` imports ch03; a chapter may import only "
            "earlier chapters (ch01)",
            id="later-import",
        ),
        pytest.param(
            "# B\n\n```{python}\nfrom longctx import ch03\n```\n",
            "chapters/ch02-beta.qmd:4: `from longctx import ch03` imports ch03",
            id="later-import-in-a-cell-not-saved",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\ndef f():\n    from longctx.ch03 import thing\n    return thing\n```\n",
            "chapters/ch02-beta.qmd:6: `from longctx.ch03 import ...` imports ch03",
            id="later-import-inside-function",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nimport longctx.ch02\n```\n",
            "chapters/ch02-beta.qmd:5: `import longctx.ch02` imports this chapter's own module",
            id="self-import",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nX = 1\nprint(X)\n```\n",
            "chapters/ch02-beta.qmd:6: `print(X)` runs when the module is imported",
            id="side-effect-call",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nTOTAL = 0\nfor i in range(3):\n    TOTAL += i\n```\n",
            "chapters/ch02-beta.qmd:6: this loop runs when the module is imported",
            id="side-effect-loop",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nimport matplotlib.pyplot as plt\nFIG = plt.figure()\n```\n",
            "chapters/ch02-beta.qmd:6: `plt.figure()` runs when the module is imported",
            id="side-effect-in-assignment",
        ),
        pytest.param(
            '# B {#sec-ch02-beta}\n\n```{python}\n# @save\nLIMIT = 2\n"""A limit (@eq-ch02-double)."""\n```\n',
            "chapters/ch02-beta.qmd:6: an attribute's docstring holds the Quarto cross-reference `@eq-ch02-double`",
            id="attribute-docstring-with-a-label",
        ),
    ],
)
def test_saved_code_breaking_a_book_rule_is_caught(tmp_path, body, expected):
    found = saved_code_problems(tmp_path, body)
    assert any(problem.startswith(expected) for problem in found), found


def test_definitions_constants_and_guarded_imports_are_not_side_effects(tmp_path):
    body = """# B

```{python}
# @save
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
\"\"\"A module docstring-like string.\"\"\"
LIMITS = {"small": 1, "large": 2}
NAMES: tuple[str, ...] = tuple(sorted(LIMITS))


def count(items: Iterator[int]) -> int:
    return sum(1 for _ in items)
```
"""
    assert saved_code_problems(tmp_path, body) == []


def test_an_equation_gone_from_the_book_fails_check_though_the_module_is_unchanged(tmp_path, booktools):
    """A docstring's number is checked against the book every time, not only when its text changes."""
    body = NUMBERED.replace("DOC", "Return 2x (Equation 2.1).").replace("COMMENT", "y = 2x")
    root = make_book(tmp_path / "r", {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": body})
    assert booktools(root, "tangle")[0] == 0
    chapter = root / "chapters" / "ch02-beta.qmd"
    chapter.write_text(chapter.read_text().replace("$$ {#eq-ch02-double}", "$$"))  # no line moves
    assert booktools(root, "tangle", "--check")[0] == 0
    code, _, err = booktools(root, "check")
    assert code == 1 and err.splitlines()[0].startswith(
        "chapters/ch02-beta.qmd:12: the docstring of `twice` names Equation 2.1, which the book does not have")
    assert len(err.splitlines()) == 2  # that problem, and the count


def test_a_later_page_may_import_its_own_chapters_module_outside_saved_cells(tmp_path):
    from test_booktools_tangle import PAGE_ONE, PAGE_TWO, parted_book

    importing = "\n```{python}\nfrom longctx.ch02 import ONE\n```\n"
    saved = "\n```{python}\n# @save\nfrom longctx.ch02 import ONE\n```\n"
    root = parted_book(tmp_path / "b", ["    - chapters/ch01-alpha.qmd", "    - part: Beta",
                                        "      chapters:", "        - chapters/ch02-beta.qmd",
                                        "        - chapters/ch02-beta-more.qmd"],
                       {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": PAGE_ONE + importing,
                        "chapters/ch02-beta-more.qmd": PAGE_TWO + importing + saved})
    found = [problem for problem in check_book(load_book(root)) if "imports" in problem]
    assert found == [
        "chapters/ch02-beta-more.qmd:17: `from longctx.ch02 import ...` imports this chapter's own module; a chapter "
        "may import only earlier chapters (ch01)",
        "chapters/ch02-beta.qmd:11: `from longctx.ch02 import ...` imports this chapter's own module; a chapter "
        "may import only earlier chapters (ch01)",
    ]
