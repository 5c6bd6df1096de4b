"""Every tangle rule of CONTRIBUTING.md ("Saved cells and the tangle"), and each error case, on tiny books in temporary folders."""

from __future__ import annotations

import importlib.util
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


def test_only_chNN_files_make_modules_in_quarto_order(tmp_path, booktools):
    root = make_book(
        tmp_path / "b",
        {"chapters/ch02-first.qmd": BETA.replace("from longctx import ch01", "import math"), "chapters/ch01-second.qmd": ALPHA},
        extra=["chapters/appendix-notes.qmd"],
    )
    (root / "chapters" / "appendix-notes.qmd").write_text("# Notes\n")
    result = tangle_book(load_book(root))
    assert list(result.outputs) == ["ch02", "ch01"]  # _quarto.yml's order
    assert result.problems == []


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
            "# B\n\n```{python}\n# @save\nimport math  # for pi\n\nX = math.pi\n```\n",
            "chapters/ch02-beta.qmd:5: a comment on a saved import would be lost",
            id="comment-on-import",
        ),
        pytest.param(
            "# B\n\n```{python}\n# @save\nimport math; X = math.pi\n```\n",
            "chapters/ch02-beta.qmd:5: an import shares its line with other code",
            id="import-sharing-a-line",
        ),
    ],
)
def test_errors_name_file_and_line(tmp_path, booktools, body, expected):
    code, err = error_for(tmp_path, booktools, body)
    assert code == 1
    assert expected in err, err
    assert "no files were written" in err
    assert not (tmp_path / "err" / "code").exists()


def test_broken_chapter_changes_nothing_and_leaves_no_temporary_files(book, booktools):
    booktools(book, "tangle")
    before = snapshot(book)
    chapter = book / "chapters" / "ch01-alpha.qmd"
    chapter.write_text(chapter.read_text().replace("return x * SCALE", "return x * (SCALE"))
    code, _, err = booktools(book, "tangle")
    assert code == 1 and "chapters/ch01-alpha.qmd:20: saved code does not compile" in err
    assert snapshot(book) == before  # neither the broken chapter's module nor any other changed
    leftovers = [path for path in (book / "code").rglob("*") if path.name.endswith(".tmp")]
    assert leftovers == []


def test_chapter_without_saved_cells_gets_an_empty_module(tmp_path, booktools):
    root = make_book(tmp_path / "e", {"chapters/ch01-alpha.qmd": "# A\n\nNo code.\n"})
    assert booktools(root, "tangle")[0] == 0
    package = load_package(root / "code" / "ch01", "fixture_tangle_empty")
    assert package.__all__ == []


# --- imports hoisted to the top and sorted by ruff; the modules' style is ruff's -------------------

RUFF_CONFIG = REPO / "code" / "ruff.toml"  # the repository's settings for code/: `longctx` first-party


def ruff_check(*paths: Path, select: str | None = None, ignore: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(RUFF_CONFIG)]
    command += ["--select", select] if select else []
    command += ["--extend-ignore", ignore] if ignore else []
    return subprocess.run(command + [str(path) for path in paths], capture_output=True, text=True)


MIXED = """
# Mixed

```{python}
# @save
import torch
from longctx import ch01
import math
from torch import nn, Tensor
from longctx.support import check_int, check_number, check_tensor, check_choice, describe


def first(x: Tensor) -> Tensor:
    \"\"\"Return x through a layer.\"\"\"
    import json  # an import inside a function stays where it is

    check_int("n", 1)
    return nn.Identity()(torch.as_tensor(x)) + math.pi * len(json.dumps(ch01.double(1)))
```

Prose between the cells.

```{python}
# @save
from __future__ import annotations

import math
from collections.abc import Sequence
from torch import Tensor
import torch.nn.functional as F
import os, sys
from dataclasses import replace as _replace

LIMIT = 3


def second(values: Sequence[float], x: Tensor) -> float:
    \"\"\"Return a number from everything imported.\"\"\"
    check_number("x", 1.0), check_tensor("x", x), check_choice("c", "a", ("a",)), describe(x)
    return math.fsum(values) + F.relu(x).sum().item() + len(os.sep + sys.platform) + LIMIT + id(_replace)
```
"""


def test_imports_are_hoisted_merged_and_sorted_and_ruff_agrees(tmp_path, booktools):
    root = make_book(tmp_path / "m", {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-mixed.qmd": MIXED})
    code, _, err = booktools(root, "tangle")
    assert (code, err) == (0, "")
    generated = (root / "code" / "ch02" / "_generated.py").read_text()
    lines = generated.splitlines()
    assert "ruff: noqa" not in generated
    assert lines[2].startswith('"""Code saved from chapters/ch02-mixed.qmd')
    first_marker = next(index for index, line in enumerate(lines) if line.startswith("# chapters/"))
    assert lines[3:first_marker] == [
        "",
        "from __future__ import annotations",
        "",
        "import math",
        "import os",
        "import sys",
        "from collections.abc import Sequence",
        "from dataclasses import replace as _replace",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import Tensor, nn",
        "",
        "from longctx import ch01",
        "from longctx.support import (",  # 84 characters on one line: wrapped to fit the page
        "    check_choice,",
        "    check_int,",
        "    check_number,",
        "    check_tensor,",
        "    describe,",
        ")",
        "",
        "",
    ]
    # Each block's comment names the chapter line of the first line that follows it.
    chapter = (root / "chapters" / "ch02-mixed.qmd").read_text().splitlines()
    markers = [index for index, line in enumerate(lines) if line.startswith("# chapters/ch02-mixed.qmd:")]
    assert [lines[index + 1] for index in markers] == ["def first(x: Tensor) -> Tensor:", "LIMIT = 3"]
    for index in markers:
        start = int(lines[index].rsplit(":", 1)[1])
        assert chapter[start - 1] == lines[index + 1]
    assert "    import json  # an import inside a function stays where it is" in lines
    assert generated.count("import math") == 1 and "__future__" not in "\n".join(lines[first_marker:])
    package = load_package(root / "code" / "ch02", "fixture_tangle_mixed")
    assert package.__all__ == ["LIMIT", "first", "second"]
    assert ruff_check(root / "code").returncode == 0, ruff_check(root / "code").stdout


def test_fixture_book_modules_have_their_imports_on_top_and_pass_ruff(fixture_book, booktools):
    assert booktools(fixture_book, "tangle")[0] == 0
    alpha = (fixture_book / "code" / "ch01" / "_generated.py").read_text().splitlines()
    beta = (fixture_book / "code" / "ch02" / "_generated.py").read_text().splitlines()
    assert alpha[3:7] == ["", "import math", "", "# chapters/ch01-alpha.qmd:21"]  # then `SCALE = 2`
    assert alpha[7] == "SCALE = 2"
    assert beta[3:8] == ["", "from longctx import ch01", "", "", "# chapters/ch02-beta.qmd:10"]
    assert beta[8] == "def quad(n: int) -> int:"
    # The fixture saves `import math` and never uses it (tangle warns; other tests edit those lines).
    result = ruff_check(fixture_book / "code", ignore="F401")
    assert result.returncode == 0, result.stdout


def test_what_the_tangle_leaves_to_ruff_ruff_finds(tmp_path, booktools):
    """Unused and undefined names and a name saved twice tangle; ruff on the module names each."""
    body = (
        "# B\n\n```{python}\n# @save\nimport os\n\n\ndef f():\n    return helper(1)\n```\n\n"
        "```{python}\n# @save\ndef f():\n    return 2\n```\n"
    )
    root = make_book(tmp_path / "r", {"chapters/ch01-alpha.qmd": body})
    assert booktools(root, "tangle")[0] == 0
    found = ruff_check(root / "code", select="F").stdout
    for rule in ("F401", "F821", "F811"):
        assert rule in found, found


def parted_book(root: Path, listing: list[str], pages: dict[str, str]) -> Path:
    """A book whose _quarto.yml groups its chapters in `part:`s; `listing` holds its lines under `chapters:`."""
    make_book(root, pages)
    lines = ["project:", "  type: book", "book:", "  chapters:", "    - index.qmd", *listing]
    (root / "_quarto.yml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


PAGE_ONE = "# Beta, first page\n\n```{python}\n# @save\nimport math\n\nONE = math.pi\n```\n"
PAGE_TWO = "# Beta, second page\n\n```{python}\n# @save\nimport os\n\ndef two():\n    return ONE, os.sep\n```\n"


def test_a_chapters_pages_in_a_part_make_one_module_in_their_order(tmp_path):
    root = parted_book(tmp_path / "b", [
        "    - chapters/ch01-alpha.qmd",
        "    - part: \"The beta chapter (longctx.ch02)\"",
        "      chapters:",
        "        - chapters/ch02-beta.qmd",
        "        - chapters/ch02-beta-more.qmd",
    ], {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": PAGE_ONE, "chapters/ch02-beta-more.qmd": PAGE_TWO})
    book = load_book(root)
    assert [entry.path for entry in book.entries][2:] == ["chapters/ch02-beta.qmd", "chapters/ch02-beta-more.qmd"]
    result = tangle_book(book)
    assert result.problems == [] and list(result.outputs) == ["ch01", "ch02"]
    generated = result.outputs["ch02"][root / "code" / "ch02" / "_generated.py"]
    assert generated.startswith("# Generated from chapters/ch02-beta.qmd and chapters/ch02-beta-more.qmd by")
    assert '("Beta, first page") and chapters/ch02-beta-more.qmd ("Beta, second page")' in generated
    assert generated.index("import math") < generated.index("import os") < generated.index("ONE = math.pi")
    assert generated.index("# chapters/ch02-beta.qmd:7\nONE") < generated.index("# chapters/ch02-beta-more.qmd:7\ndef two")
    init = result.outputs["ch02"][root / "code" / "ch02" / "__init__.py"]
    assert '"""Beta, first page: the code saved from chapters/ch02-beta.qmd and chapters/ch02-beta-more.qmd."""' in init
    assert '"ONE",' in init and '"two",' in init


def test_a_chapters_pages_apart_in_the_listing_are_refused(tmp_path):
    root = parted_book(tmp_path / "b", [
        "    - chapters/ch02-beta.qmd",
        "    - chapters/ch01-alpha.qmd",
        "    - chapters/ch02-beta-more.qmd",
    ], {"chapters/ch01-alpha.qmd": ALPHA, "chapters/ch02-beta.qmd": PAGE_ONE, "chapters/ch02-beta-more.qmd": PAGE_TWO})
    problems = [str(problem) for problem in tangle_book(load_book(root)).problems]
    assert problems == ["_quarto.yml:8: chapters/ch02-beta-more.qmd makes module ch02 but is not listed right after "
                        "its other pages (chapters/ch02-beta.qmd)"]
