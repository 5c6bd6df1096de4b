"""The repository keeps its promises: the README's commands, CI, the pins and the package layout agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_readme_names_the_two_commands_first():
    first_block = _fenced_blocks(README, "bash")[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make test", "make book"]


def test_ci_runs_exactly_the_readme_test_command():
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[-1] == "make test"


def test_every_make_target_the_readme_names_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    named = set(re.findall(r"`make ([a-z][a-z-]*)`", README))
    assert named, "the README should name its make targets"
    assert named <= targets, f"README names targets the Makefile lacks: {sorted(named - targets)}"


@pytest.mark.slow  # starts another Python process
def test_readme_python_examples_run():
    """The snippets a reader will paste first must work as printed."""
    blocks = _fenced_blocks(README, "python")
    inline = re.findall(r'\.venv/bin/python -c "(.*?)"', README, flags=re.S)
    assert blocks and inline
    # one interpreter (torch is imported once), each snippet in a namespace of its own, as if pasted alone
    runner = "import sys\nfor source in sys.argv[1:]:\n    exec(compile(source, 'README', 'exec'), {'__name__': '__main__'})"
    done = subprocess.run([sys.executable, "-c", runner, *blocks, *inline], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"a README example failed:\n{done.stderr[-2000:]}"


def test_requirements_are_exact_pins_with_the_local_torch():
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    pins = [line for line in lines if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-]+", pin) for pin in pins), pins
    assert "torch==2.13.0" in pins


def test_conda_environment_uses_the_same_pins():
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    assert "-r requirements.txt" in pip_section and "-e ." in pip_section


def test_code_folder_is_not_a_package_and_does_not_shadow_the_standard_library():
    assert not (ROOT / "code" / "__init__.py").exists()
    done = subprocess.run([sys.executable, "-c", "import code; print(code.__file__)"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert not done.stdout.strip().startswith(str(ROOT))


@pytest.mark.slow  # starts another Python process
def test_every_chapter_module_imports_from_outside_the_repository(tmp_path):
    chapters = sorted(p.name for p in (ROOT / "code").glob("ch[0-9][0-9]"))
    assert chapters[:5] == ["ch01", "ch02", "ch03", "ch04", "ch05"]
    script = "; ".join(f"from longctx import {name}; print(len({name}.__all__))" for name in chapters)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert all(int(count) > 0 for count in done.stdout.split())


def test_quarto_project_lists_index_chapters_and_appendices():
    config = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    assert config["project"]["type"] == "book"
    assert config["execute"]["freeze"] == "auto"
    assert config["bibliography"] == "references.bib"
    assert {"html", "epub"} <= set(config["format"])
    assert config["book"]["chapters"][0] == "index.qmd"


def test_every_reference_gives_a_doi_or_a_url():
    """A reader can reach every work the book cites: each entry of references.bib has a doi or url field
    (the book's style prints one of them), and each code link in a note is a full https address."""
    text = (ROOT / "references.bib").read_text(encoding="utf-8")
    entries = re.split(r"\n(?=@)", text)
    keys = [re.match(r"@\w+\{([^,]+),", e.strip()).group(1) for e in entries if e.strip().startswith("@")]
    missing = [key for key, e in zip(keys, [e for e in entries if e.strip().startswith("@")], strict=True)
               if not re.search(r"^\s*(doi|url)\s*=\s*\{\S+\}", e, flags=re.M | re.I)]
    assert len(keys) > 50 and missing == []
    assert all(link.startswith("https://") for link in re.findall(r"[Cc]ode: (\S+?)\}", text))


def test_code_tests_and_benchmarks_are_lint_clean():
    """`make lint` passes: ruff on code/ (the generated modules' imports, names and Google-style docstrings,
    code/ruff.toml), tools/, tests/, benchmarks/ and experiments/."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "code", "tools", "tests", "benchmarks", "experiments"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_publish_workflow_renders_with_quarto_and_deploys_the_book_to_pages():
    """.github/workflows/publish.yml is a valid workflow: Quarto's setup action, `make book`, Pages."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "publish.yml").read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on:` as True
    assert triggers["push"]["branches"] == ["main"] and "workflow_dispatch" in triggers
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    jobs = workflow["jobs"]
    for job in jobs.values():
        assert job["runs-on"] == "ubuntu-latest" and job["steps"]
        for step in job["steps"]:
            assert set(step) <= {"name", "uses", "with", "run", "id", "env"}, step
            assert ("uses" in step) != ("run" in step), step
    steps = jobs["render"]["steps"]
    uses = [step.get("uses", "") for step in steps]
    setup = next(step for step in steps if step.get("uses", "").startswith("quarto-dev/quarto-actions/setup@"))
    assert setup["with"]["version"] == "1.7.34"
    assert uses.index(setup["uses"]) < next(i for i, step in enumerate(steps) if step.get("run") == "make book")
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_book"
    publish = jobs["publish"]
    assert publish["needs"] == "render" and publish["environment"]["name"] == "github-pages"
    assert [step["uses"].split("@")[0] for step in publish["steps"]] == ["actions/deploy-pages"]


def test_quarto_project_says_where_the_book_is_published_and_its_source():
    config = yaml.safe_load((ROOT / "_quarto.yml").read_text())
    book = config["book"]
    assert book["site-url"].startswith("https://") and book["site-url"].endswith("/")
    assert book["repo-url"].startswith("https://github.com/")
    assert book["repo-actions"] == ["source", "issue"]
    assert config["lang"] == "en"
    assert (ROOT / book["favicon"]).is_file()
    for asset in (config["format"]["html"]["theme"][1], config["format"]["epub"]["css"]):
        assert (ROOT / asset).is_file(), asset


def test_ci_installs_what_the_rendering_tests_need_and_fails_without_it():
    script = (ROOT / ".ci/run").read_text()
    assert "../shared/quarto-kit/setup.sh" in script and "PATH=" in script
    assert "epubcheck" in script and "chromium" in script
    assert 'export CI="${CI:-true}"' in script  # a missing tool fails the tests there, never skips them


def test_readme_first_screen_says_what_the_book_is_what_to_type_and_what_it_needs():
    first = "\n".join(README.splitlines()[:40])
    assert "executable book" in first and "make test" in first and "make book" in first
    needs = first[first.index("## What a machine needs") :]
    for tool in ("Python 3.11", "make", "npm", "Quarto", "chromium", "epubcheck"):
        assert tool in needs, tool


def test_booktools_keeps_within_its_2000_lines():
    """The budget for tools/booktools (issue 34: at most 2,000): one parser, tools that each do one job, Quarto
    doing what Quarto does; a change that adds lines takes them from elsewhere."""
    lines = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in (ROOT / "tools" / "booktools").glob("*.py")}
    assert sum(lines.values()) <= 2000, sorted(lines.items(), key=lambda item: -item[1])


def test_make_test_runs_every_test_and_test_fast_leaves_out_only_the_slow_ones():
    import tomllib

    pytest_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_config["addopts"].split()  # a mistyped mark is an error, not a new mark
    assert any(marker.startswith("slow:") for marker in pytest_config["markers"])
    makefile = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^(test|test-fast):.*\n\t(.*)$", makefile, flags=re.M))
    assert recipes["test"] == "$(PY) -m pytest"
    assert recipes["test-fast"].endswith('$(PY) -m pytest -m "not slow" -q')


def test_every_figure_caption_asks_its_question_and_gives_the_answer():
    """A reader skimming the figures gets each one's takeaway: the caption's question, then its answer."""
    missing = []
    for path in sorted((ROOT / "chapters").glob("*.qmd")):
        for caption in re.findall(r'^#\| fig-cap: "(.*)"$', path.read_text(encoding="utf-8"), flags=re.M):
            question, mark, answer = caption.partition("?")
            if not mark or len(answer.strip()) < 15:
                missing.append(f"{path.name}: {caption[:60]}")
    assert missing == []


def test_exercises_carry_their_pages_chapter_number_and_every_typed_exercise_reference_exists():
    """Exercises are numbered by hand: "**Exercise 14.2 (...)**" or "**9.2**", each with its "Solution 14.2".
    A split page renumbers the book, so each page's exercises must run N.1, N.2, ... with N the chapter
    number Quarto gives that page, and every "Exercise N.M" written anywhere must name one of them."""
    from booktools.book import load_book
    from booktools.numbering import compute_numbering

    heading = re.compile(r"^\*\*(?:Exercise )?(\d+\.\d+)(?=[ *(.])", re.M)
    numbering, found = compute_numbering(load_book(ROOT)), set()
    for info in (info for info in numbering.chapters if info.number and not info.entry.appendix):
        text = (ROOT / info.display).read_text(encoding="utf-8")
        numbers = heading.findall(text)
        assert numbers == [f"{info.number}.{k}" for k in range(1, len(numbers) + 1)], (info.display, numbers)
        assert re.findall(r'title="Solution (\d+\.\d+)"', text) == numbers, info.display
        found |= set(numbers)
    assert len(found) > 30
    written = [*ROOT.glob("chapters/*.qmd"), ROOT / "index.qmd", *ROOT.glob("tests/**/*.py")]
    for path in written:
        pairs = re.findall(r"\bExercises? (\d+\.\d+)\b(?:,? and (\d+\.\d+)\b)?", path.read_text(encoding="utf-8"))
        for number in (number for pair in pairs for number in pair if number):
            assert number in found, (path.name, number)


def _formula_glyphs(latex: str) -> int:
    """About how many glyphs an inline formula draws: a command is one glyph, braces, scripts' marks and
    spacing draw none, and an inline `{python}` value counts as three digits."""
    latex = re.sub(r"`\{python\}[^`]*`", "000", latex)
    latex = re.sub(r"\\(?:boldsymbol|mathrm|mathbf|mathit|text|operatorname|big|Big|left|right|[;,!: ]|quad)", "", latex)
    latex = re.sub(r"\\[a-zA-Z]+", "x", latex)
    return len(re.sub(r"[{}_^\s]", "", latex))


def test_no_inline_formula_is_wider_than_a_phone_line():
    """MathJax does not break an inline formula, so one wider than a 390 px line pushes the page sideways
    (a 30-glyph merge rule did, by 8 px): a long formula goes on its own line or in pieces."""
    assert _formula_glyphs(r"(\boldsymbol{\alpha}_1, \xi_1) \circ (\alpha_2, \xi_2)") == 15
    assert _formula_glyphs(r"e^{-`{python} f'{x:.0f}'`}") == 5
    wide = []
    for path in sorted([ROOT / "index.qmd", *ROOT.glob("chapters/*.qmd"), *ROOT.glob("appendices/*.qmd")]):
        text = re.sub(r"```.*?```|\$\$.*?\$\$", "", path.read_text(encoding="utf-8"), flags=re.S)
        for formula in re.findall(r"(?<![\\$])\$([^$]+?)\$", text):
            if _formula_glyphs(formula) > 26:
                wide.append(f"{path.name}: ${formula[:60]}$")
    assert wide == []
