"""Every tangle rule of DESIGN.md, and each error case, on tiny books in temporary folders."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from booktools.book import load_book
from booktools.tangle import tangle_book

REPO = Path(__file__).resolve().parents[1]


def make_book(root: Path, chapters: dict[str, str], extra: list[str] | None = None) -> Path:
    """A book whose _quarto.yml lists index.qmd, then `chapters` in the given order."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "chapters").mkdir(exist_ok=True)
    listed = ["index.qmd", *chapters, *(extra or [])]
    lines = ["project:", "  type: book", "book:", "  chapters:"] + [f"    - {path}" for path in listed]
    (root / "_quarto.yml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "index.qmd").write_text("# Preface {.unnumbered}\n", encoding="utf-8")
    for path, text in chapters.items():
        (root / path).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    code = root / "code"
    if not code.exists():
        return {}
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(code.rglob("*"))
        if path.is_file()
    }


ALPHA = """
# Alpha {#sec-ch01-alpha}

Not saved:

```{python}
scratch = 1
```

```{python}
#| echo: false
# @save
import math

_PRIVATE = 3
SCALE: float = 2.0


def double(x: float) -> float:
    \"\"\"Return twice x.\"\"\"
    return x * SCALE + 0 * math.pi
```

```{python}
# @save
class Box:
    \"\"\"A box.\"\"\"

    size = 1


try:
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None
```
"""

BETA = """
# Beta

```{python}
# @save
from longctx import ch01


def quadruple(x):
    return ch01.double(ch01.double(x))
```
"""


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return make_book(tmp_path / "book", {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": BETA})


def load_package(directory: Path, name: str):
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_saved_cells_in_order_with_header_and_source_lines(book, booktools):
    code, out, err = booktools(book, "tangle")
    assert (code, err) == (0, "")
    generated = (book / "code" / "ch01" / "_generated.py").read_text()
    assert generated.startswith("# Generated from chapters/ch01-alpha.qmd by `python -m booktools tangle`.\n")
    assert "Do not edit" in generated.splitlines()[1]
    assert "scratch" not in generated
    assert "# @save" not in generated.splitlines() and "#| echo: false" not in generated
    assert generated.index("def double") < generated.index("class Box")
    chapter = (book / "chapters" / "ch01-alpha.qmd").read_text().splitlines()
    lines = generated.splitlines()
    markers = [index for index, line in enumerate(lines) if line.startswith("# chapters/ch01-alpha.qmd:")]
    assert len(markers) == 2
    for index in markers:
        source_line = int(lines[index].rsplit(":", 1)[1])
        # Every emitted line sits at a known offset from its chapter line.
        for offset, text in enumerate(lines[index + 1 : index + 6]):
            assert chapter[source_line - 1 + offset] == text
    # The saved `import math` moved to the top; the first block's comment names the first
    # line left after it.
    assert chapter[int(lines[markers[0]].rsplit(":", 1)[1]) - 1] == "_PRIVATE = 3"
    assert lines[3:6] == ["", "import math", ""]
    assert "timestamp" not in generated.lower() and "20" + "26" not in generated


def test_init_reexports_public_names_defined_not_imported(book, booktools):
    booktools(book, "tangle")
    init = (book / "code" / "ch01" / "__init__.py").read_text()
    assert "from ._generated import (" in init
    package = load_package(book / "code" / "ch01", "fixture_tangle_ch01")
    assert package.__all__ == ["SCALE", "Box", "double"]  # constants, classes, functions (isort's order)
    assert package.double(2.0) == 4.0
    assert not hasattr(package, "math") and "_PRIVATE" not in package.__all__


def test_output_is_byte_identical_and_unchanged_files_are_not_rewritten(book, booktools):
    booktools(book, "tangle")
    first = snapshot(book)
    code, out, _ = booktools(book, "tangle")
    assert code == 0 and "0 file(s) changed" in out
    assert snapshot(book) == first
    (book / "code" / "ch01" / "_generated.py").unlink()
    booktools(book, "tangle")
    again = snapshot(book)
    assert {path: data for path, (data, _) in again.items()} == {path: data for path, (data, _) in first.items()}


def test_check_names_each_stale_module_and_writes_nothing(book, booktools):
    code, _, err = booktools(book, "tangle", "--check")
    assert code == 1 and "code/ch01/_generated.py: stale" in err and "code/ch02/__init__.py: stale" in err
    assert not (book / "code").exists()
    booktools(book, "tangle")
    assert booktools(book, "tangle", "--check")[0] == 0
    target = book / "code" / "ch02" / "_generated.py"
    target.write_text(target.read_text() + "\n# a hand edit\n")
    code, _, err = booktools(book, "tangle", "--check")
    assert code == 1
    assert err.splitlines()[0].startswith("code/ch02/_generated.py: stale")
    assert "ch01" not in err


def test_tangle_one_file_only(book, booktools):
    code, out, _ = booktools(book, "tangle", str(book / "chapters" / "ch02-beta.qmd"))
    assert code == 0
    assert (book / "code" / "ch02" / "_generated.py").exists()
    assert not (book / "code" / "ch01").exists()


def test_only_chNN_files_make_modules_in_quarto_order(tmp_path, booktools):
    root = make_book(
        tmp_path / "b",
        {"chapters/ch02-first.qmd": BETA.replace("from longctx import ch01", "import math"), "chapters/ch01-second.qmd": ALPHA},
        extra=["chapters/appendix-notes.qmd"],
    )
    (root / "chapters" / "appendix-notes.qmd").write_text("# Notes\n")
    result = tangle_book(load_book(root))
    # ch02 comes first in _quarto.yml: it cannot import ch01, which comes later.
    assert [output.module for output in result.outputs] == ["ch01"]
    assert [str(problem) for problem in result.problems] == [
        "chapters/ch02-first.qmd:9: saved code uses `ch01`, which no saved cell defines or imports "
        "(the module cannot see names from cells without `# @save`)"
    ]


def error_for(tmp_path: Path, booktools, body: str, name: str = "chapters/ch02-beta.qmd") -> tuple[int, str]:
    root = make_book(
        tmp_path / "err", {"chapters/ch01-alpha.qmd": ALPHA, name: body, "chapters/ch03-gamma.qmd": "# Gamma\n"}
    )
    code, _, err = booktools(root, "tangle")
    return code, err


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "# B\n\n```python\n# @save\nx = 1\n```\n",
            "chapters/ch02-beta.qmd:4: `# @save` in a block that is not a Python cell",
            id="save-in-non-python-block",
        ),
        pytest.param(
            "# B\n\n```{r}\n# @save\nx <- 1\n```\n",
            "chapters/ch02-beta.qmd:4: `# @save` in a block that is not a Python cell (```{r})",
            id="save-in-r-cell",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nx = 1\n",
            "chapters/ch02-beta.qmd:3: code fence ```{python} is never closed",
            id="unclosed-fence",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nimport math\n\ndef f(:\n    pass\n```\n",
            "chapters/ch02-beta.qmd:7: saved code does not compile: ",
            id="syntax-error",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\ndef f():\n    return helper(1)\n```\n",
            "chapters/ch02-beta.qmd:6: saved code uses `helper`, which no saved cell defines or imports",
            id="undefined-name",
        ),
        pytest.param(
            "# B\n\n```{python}\nhelper = abs\n```\n\n```{python}\n# @save\ndef f():\n    return helper(1)\n```\n",
            "chapters/ch02-beta.qmd:10: saved code uses `helper`",
            id="name-only-in-unsaved-cell",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\ndef f():\n    return 1\n```\n\n```{python}\n# @save\nf = 2\n```\n",
            "chapters/ch02-beta.qmd:11: top-level name `f` is already defined in saved code at chapters/ch02-beta.qmd:5",
            id="defined-twice",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nimport math\n```\n\n```{python}\n# @save\nimport os as math\n```\n",
            "chapters/ch02-beta.qmd:10: `import os as math` rebinds `math`, already bound by `import math` at chapters/ch02-beta.qmd:5",
            id="import-rebinds-name",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nfrom longctx import ch03\n```\n",
            "chapters/ch02-beta.qmd:5: `from longctx import ch03` imports ch03, a later chapter; "
            "a chapter may import only earlier chapters (ch01)",
            id="later-import",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nfrom longctx import ch05\n```\n",
            "chapters/ch02-beta.qmd:5: `from longctx import ch05` imports ch05, which is not a chapter of this book",
            id="import-of-unknown-chapter",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\ndef f():\n    from longctx.ch03 import thing\n    return thing\n```\n",
            "chapters/ch02-beta.qmd:6: `from longctx.ch03 import ...` imports ch03, a later chapter",
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
    ],
)
def test_errors_name_file_and_line(tmp_path, booktools, body, expected):
    code, err = error_for(tmp_path, booktools, body)
    assert code == 1
    assert expected in err, err
    assert "no files were written" in err
    assert not (tmp_path / "err" / "code").exists()


def test_definitions_constants_and_guarded_imports_are_not_side_effects(tmp_path, booktools):
    body = """
    # B

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
    code, err = error_for(tmp_path, booktools, body)
    assert (code, err) == (0, "")
    generated = (tmp_path / "err" / "code" / "ch02" / "_generated.py").read_text()
    # `from __future__` opens the module's imports; the guarded import stays in its `if`.
    header, marker, rest = generated.partition("# chapters/ch02-beta.qmd:9\n")
    assert marker and header.splitlines()[3:] == [
        "",
        "from __future__ import annotations",
        "",
        "from typing import TYPE_CHECKING",
        "",  # one blank line before a statement that is not a definition, as ruff's isort wants
    ]
    assert rest.startswith("if TYPE_CHECKING:\n    from collections.abc import Iterator\n")
    assert "__future__" not in rest
    compile(generated, "g.py", "exec")


def test_broken_chapter_changes_nothing_and_leaves_no_temporary_files(book, booktools):
    booktools(book, "tangle")
    before = snapshot(book)
    chapter = book / "chapters" / "ch01-alpha.qmd"
    chapter.write_text(chapter.read_text().replace("return x * SCALE", "return x * UNKNOWN"))
    code, _, err = booktools(book, "tangle")
    assert code == 1 and "UNKNOWN" in err
    assert snapshot(book) == before  # neither the broken chapter's module nor any other changed
    leftovers = [path for path in (book / "code").rglob("*") if path.name.endswith(".tmp")]
    assert leftovers == []


def test_warns_about_unused_imports_and_missing_chapters(tmp_path, booktools):
    root = make_book(
        tmp_path / "w",
        {"chapters/ch01-alpha.qmd": "# A\n\n```{python}\n# @save\nimport os\n```\n"},
        extra=["chapters/ch02-missing.qmd"],
    )
    code, _, err = booktools(root, "tangle")
    assert code == 0
    assert "warning: chapters/ch01-alpha.qmd:5: `os` is imported in saved code but no saved code uses it" in err
    assert "warning: _quarto.yml:7: chapters/ch02-missing.qmd is listed but does not exist yet" in err


def test_chapter_without_saved_cells_gets_an_empty_module(tmp_path, booktools):
    root = make_book(tmp_path / "e", {"chapters/ch01-alpha.qmd": "# A\n\nNo code.\n"})
    assert booktools(root, "tangle")[0] == 0
    package = load_package(root / "code" / "ch01", "fixture_tangle_empty")
    assert package.__all__ == []


def test_generated_files_pass_ruff(book, booktools):
    booktools(book, "tangle")
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed in this environment")
    result = subprocess.run(
        [str(ruff), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(book / "code")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_usage_errors_exit_2(book, booktools):
    with pytest.raises(SystemExit) as caught:
        booktools(book, "no-such-verb")
    assert caught.value.code == 2
    code, _, err = booktools(book.parent / "nowhere", "tangle")
    assert code == 2 and "_quarto.yml" in err


def test_module_entry_point_runs_and_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "booktools", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0
    for verb in ("tangle", "notebooks", "execute", "check", "html"):
        assert verb in result.stdout


def test_no_code_package_shadows_the_standard_library():
    assert not (REPO / "code" / "__init__.py").exists()
    result = subprocess.run(
        [sys.executable, "-c", "import code; print(code.__file__)"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert result.returncode == 0
    location = Path(result.stdout.strip())
    assert location.name == "code.py" and REPO not in location.parents


def test_html_verb_without_its_module_says_so_and_exits_2(book, booktools, monkeypatch):
    monkeypatch.setitem(sys.modules, "booktools.html", None)
    code, _, err = booktools(book, "html")
    assert code == 2 and "booktools.html" in err
