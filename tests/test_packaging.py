"""The package as readers install it.

- A wheel, built from the repository and installed into a clean virtual environment
  (no network: ``--no-deps``, the pinned packages borrowed from the project's
  environment), runs the README's examples from a folder outside the repository and
  finds every shipped data file and every saved run the chapters read.
- Editable installs, in setuptools' default mode (what ``environment.yml``'s ``-e .``
  gives a conda user) and in its strict mode (what ``make env`` uses), find every data file from a
  folder outside the repository, and a file added to ``data/`` without reinstalling.
- The editable install that ``make env`` makes is legible to static tools: pyright
  resolves every chapter, and jedi takes ``longctx.ch03.KVConfig`` to its definition
  in ``code/ch03/_generated.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PYRIGHT = ROOT / "web" / "node_modules" / ".bin" / "pyright"
# What a wheel is built from: the package metadata, the readers' code, the data and the saved runs.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "code", "data", "experiments/results", "benchmarks/results")
# The saved runs the chapters read, shipped as package data: support.load_results's prefixes.
SAVED_RUNS = {"copying": "experiments/results", "extension": "experiments/results",
              "forgetting": "experiments/results", "speculative": "experiments/results",
              "benchmarks": "benchmarks/results", "serving": "benchmarks/results"}


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _chapter_modules() -> list[str]:
    return sorted(path.name for path in (ROOT / "code").glob("ch[0-9][0-9]") if (path / "__init__.py").is_file())


def _data_files(folder: Path) -> dict[str, str]:
    """Map each file below ``folder`` (relative POSIX path) to the SHA-256 of its bytes."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _readme_examples() -> list[str]:
    """The README's Python examples: its ```python blocks and its `.venv/bin/python -c "..."` lines."""
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    inline = re.findall(r'\.venv/bin/python -c "(.*?)"', README, flags=re.S)
    assert blocks and inline, "the README should show both kinds of example"
    return [*blocks, *inline]


def _clean_environment() -> dict[str, str]:
    """This process's environment without anything that would point Python at the repository."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}


# --------------------------------------------------------------------------- the wheel


def _copy_sources(destination: Path) -> Path:
    """Copy what the package is built from into ``destination``, so a build leaves nothing in the worktree."""
    destination.mkdir()
    for name in WHEEL_SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, destination / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(origin, destination / name)
    return destination


def _fresh_environment(folder: Path, *install: str) -> Path:
    """Return the interpreter of a new virtual environment in which pip has installed ``install``.

    No network and no build isolation: the pinned setuptools of the project's environment
    builds. The environment gets the project's pinned packages (torch and the rest) through
    a path file, never the project's own ``longctx``.
    """
    _run([sys.executable, "-m", "venv", "--without-pip", str(folder)])
    python = folder / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    # The pinned dependencies, from the project's environment (setuptools among them, for an editable
    # build). A path line in a .pth file adds the folder to sys.path but does not run the .pth files inside
    # it, so the project's editable longctx stays out, and pip leaves a distribution outside the new
    # environment alone.
    (purelib / "pinned-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
          "--no-build-isolation", *install])
    return python


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh virtual environment with only the built wheel installed in it."""
    work = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(work / "source")
    dist = work / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", str(dist), str(source)])
    (wheel,) = dist.glob("longctx-*.whl")
    return _fresh_environment(work / "venv", str(wheel))


def _run_outside(python: Path, source: str, folder: Path) -> str:
    folder.mkdir(exist_ok=True)
    done = subprocess.run([str(python), "-c", source], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=_clean_environment())
    assert done.returncode == 0, f"failed from {folder}:\n{source}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_wheel_is_what_runs_and_its_data_is_inside_it(wheel_python, tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.util, json, sys
        import longctx
        from longctx import support, {", ".join(_chapter_modules())}
        print(json.dumps({{
            "package": list(longctx.__path__),
            "data": str(support.data_path()),
            "prefix": sys.prefix,
            "tools": [name for name in ("booktools", "longctx.booktools")
                      if importlib.util.find_spec(name) is not None],
        }}))
        """
    )
    where = json.loads(_run_outside(wheel_python, script, tmp_path / "elsewhere"))
    prefix = Path(where["prefix"])
    assert prefix == wheel_python.parent.parent
    assert [Path(p).is_relative_to(prefix) for p in where["package"]] == [True], where["package"]
    assert Path(where["data"]).is_relative_to(prefix) and not Path(where["data"]).is_relative_to(ROOT)
    # the build tools are not part of the readers' package (the project's editable install of them
    # is a .pth file in the pinned packages' folder, which a path line does not run)
    assert where["tools"] == [], where["tools"]


@pytest.mark.slow
def test_wheel_ships_every_data_file_byte_for_byte(wheel_python, tmp_path):
    script = "from longctx import support; print(support.data_path())"
    installed = Path(_run_outside(wheel_python, script, tmp_path / "elsewhere").strip())
    assert _data_files(installed) == _data_files(ROOT / "data")


@pytest.mark.slow
def test_wheel_ships_every_saved_run_and_loads_each_outside_the_repository(wheel_python, tmp_path):
    """Issue 37: a reader's scratch folder, the wheel's Python, no repository anywhere above it."""
    script = textwrap.dedent(
        f"""
        import json
        from longctx import support
        found = {{prefix: str(support.load_results(prefix)[1]) for prefix in {sorted(SAVED_RUNS)!r}}}
        print(json.dumps({{"folders": [str(f) for f in support.results_folders()], "found": found}}))
        """
    )
    where = json.loads(_run_outside(wheel_python, script, tmp_path / "elsewhere"))
    prefix = wheel_python.parent.parent
    experiments_folder, benchmarks_folder = (Path(folder) for folder in where["folders"])
    assert experiments_folder.is_relative_to(prefix) and benchmarks_folder.is_relative_to(prefix)
    assert _data_files(experiments_folder) == _data_files(ROOT / "experiments" / "results")
    assert _data_files(benchmarks_folder) == _data_files(ROOT / "benchmarks" / "results")
    for name, folder in SAVED_RUNS.items():
        path = Path(where["found"][name])
        assert path.is_relative_to(prefix), name
        assert path.read_bytes() == (ROOT / folder / path.name).read_bytes(), name


EXERCISES = sorted((ROOT / "tests" / "exercises").glob("ch*.py"))


def test_every_chapter_module_has_an_exercise_script():
    """Issue 37: one student's script a chapter, so no chapter's exercise path goes untried."""
    chapters = {path.stem.split("_")[0] for path in EXERCISES}
    assert chapters == set(_chapter_modules()), chapters ^ set(_chapter_modules())


@pytest.mark.slow
@pytest.mark.parametrize("script", EXERCISES, ids=[path.stem for path in EXERCISES])
def test_exercise_scripts_run_outside_the_repository(wheel_python, script, tmp_path):
    """Each script asserts the chapter's number itself, with only the wheel's longctx to import."""
    output = _run_outside(wheel_python, script.read_text(encoding="utf-8"), tmp_path / "scratch")
    assert output.startswith(f"ok {script.stem.split('_')[0]} "), output


@pytest.mark.slow
def test_wheel_runs_the_readme_examples_outside_the_repository(wheel_python, tmp_path):
    for number, source in enumerate(_readme_examples()):
        _run_outside(wheel_python, source, tmp_path / f"example-{number}")


@pytest.mark.slow
def test_wheel_loads_every_shipped_config_and_the_corpus(wheel_python, tmp_path):
    script = textwrap.dedent(
        """
        import json
        from longctx import ch02, ch03, support
        names = sorted(path.stem for path in support.data_path("configs").glob("*.json"))
        configs = {name: ch03.load_model_config(name) for name in names}
        corpus = ch02.load_corpus()
        print(json.dumps({"configs": configs, "corpus_bytes": len(corpus.encode("utf-8"))}))
        """
    )
    loaded = json.loads(_run_outside(wheel_python, script, tmp_path / "elsewhere"))
    shipped = sorted((ROOT / "data" / "configs").glob("*.json"))
    assert sorted(loaded["configs"]) == [path.stem for path in shipped]
    for path in shipped:
        assert loaded["configs"][path.stem] == json.loads(path.read_text(encoding="utf-8"))
    assert loaded["corpus_bytes"] == (ROOT / "data" / "pride-and-prejudice-ch01-30.txt").stat().st_size


@pytest.mark.slow
def test_wheel_finds_its_data_from_the_package_not_the_repository(wheel_python, tmp_path):
    script = "from longctx import support; print(support.data_path('configs', 'llama-2-7b.json').read_text()[:1])"
    assert _run_outside(wheel_python, script, tmp_path / "elsewhere") == "{\n"


# --------------------------------------------------------------------------- editable installs


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "strict"], ids=["default", "strict"])
def test_editable_install_finds_every_data_file_and_a_new_one(mode, tmp_path):
    """setuptools' default editable mode (environment.yml's ``-e .``) makes ``longctx.data`` a namespace
    package whose path holds the editable finder's hook, which is no folder; data_path must still work,
    as it does in the strict mode ``make env`` uses.

    (setuptools' third mode, ``compat``, only puts the source folder on ``sys.path``; with ``longctx``
    mapped onto ``code/`` there is no ``longctx`` folder to find, so nothing imports in that mode.)"""
    source = _copy_sources(tmp_path / "source")
    settings = [] if mode is None else ["--config-settings", f"editable_mode={mode}"]
    python = _fresh_environment(tmp_path / "venv", *settings, "-e", str(source))
    script = textwrap.dedent(
        """
        import json
        import longctx.data
        from longctx import ch02, ch03, support
        print(json.dumps({
            "data": str(support.data_path()),
            "namespace_path": [str(p) for p in longctx.data.__path__],
            "corpus_bytes": len(ch02.load_corpus().encode("utf-8")),
            "config": ch03.load_model_config("llama-2-7b"),
            "runs": {prefix: str(support.load_results(prefix)[1]) for prefix in PREFIXES},
        }))
        """
    ).replace("PREFIXES", repr(sorted(SAVED_RUNS)))
    found = json.loads(_run_outside(python, script, tmp_path / "elsewhere"))
    assert Path(found["data"]) == source / "data"
    # the saved runs are read where the source keeps them, as the data files are
    assert {name: Path(path).parent for name, path in found["runs"].items()} == {
        name: source / folder for name, folder in SAVED_RUNS.items()}
    if mode is None:  # the case that broke: the path lists something that is not a folder
        assert not all(Path(p).is_dir() for p in found["namespace_path"]), found["namespace_path"]
    assert found["corpus_bytes"] == (ROOT / "data" / "pride-and-prejudice-ch01-30.txt").stat().st_size
    assert found["config"] == json.loads((ROOT / "data" / "configs" / "llama-2-7b.json").read_text())
    listed = _run_outside(python, "from longctx import support; print(support.data_path())", tmp_path / "elsewhere")
    assert _data_files(Path(listed.strip())) == _data_files(ROOT / "data")
    # editable means editable: a file added to data/ is found without reinstalling
    (source / "data" / "added.txt").write_text("new\n")
    added = "from longctx import support; print(support.data_path('added.txt').read_text(), end='')"
    assert _run_outside(python, added, tmp_path / "elsewhere") == "new\n"


def test_declared_dependencies_are_satisfied_by_the_pins():
    """pyproject's run-time requirements and requirements.txt's exact pins cannot drift apart."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[canonicalize_name(name)] = version
    assert declared
    for text in declared:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} is a run-time requirement but requirements.txt does not pin it"
        assert requirement.specifier.contains(pinned, prereleases=True), f"{pinned} does not satisfy {text}"


# --------------------------------------------------------------------------- static tools


@pytest.mark.slow  # a fresh interpreter, outside the repository
def test_editable_install_points_at_this_repository(tmp_path):
    """`make env` installs the package as links to code/ and data/, never as copies."""
    script = "import longctx.ch03 as m; from longctx import support; print(m.__file__); print(support.data_path())"
    module_file, data = _run([sys.executable, "-c", script], cwd=tmp_path).stdout.split()
    assert Path(module_file).resolve() == ROOT / "code" / "ch03" / "__init__.py"
    assert Path(data) == ROOT / "data"


@pytest.mark.slow  # pyright comes from npm (web/node_modules): `make test-fast` needs no npm
def test_pyright_resolves_every_chapter_and_support(tmp_path):
    if not PYRIGHT.exists():
        pytest.fail(f"pyright is not installed at {PYRIGHT}: run `make test` (it runs `npm ci --prefix web`)")
    modules = [*_chapter_modules(), "support"]
    exercise = tmp_path / "exercise.py"  # a reader's file, outside the repository
    exercise.write_text(
        f"from longctx import {', '.join(modules)}\n"
        "from longctx.ch03 import KVConfig\n\n"
        f"print({', '.join(modules)})\n"
        "reveal_type(KVConfig)\n"
    )
    done = subprocess.run([str(PYRIGHT), "--outputjson", "--pythonpath", sys.executable, str(exercise)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    problems = [d for d in report["generalDiagnostics"] if d["severity"] != "information"]
    assert not problems, json.dumps(problems, indent=1)
    revealed = [d["message"] for d in report["generalDiagnostics"] if d["severity"] == "information"]
    assert revealed == ['Type of "KVConfig" is "type[KVConfig]"']


@pytest.mark.slow  # jedi starts the environment's interpreter to read it
def test_jedi_goes_to_kvconfigs_definition_in_the_generated_module(tmp_path):
    import jedi

    source = "from longctx.ch03 import KVConfig\nKVConfig\n"
    exercise = tmp_path / "exercise.py"
    exercise.write_text(source)
    environment = jedi.create_environment(sys.executable, safe=False)
    (definition,) = jedi.Script(source, path=exercise, environment=environment).goto(2, 3, follow_imports=True)
    generated = ROOT / "code" / "ch03" / "_generated.py"
    # The editable install's files are links in build/; the definition is the file they link to.
    assert Path(definition.module_path).resolve() == generated
    assert generated.read_text().splitlines()[definition.line - 1].startswith("class KVConfig")


@pytest.mark.slow  # starts another Python process
@pytest.mark.parametrize("folder", ["root", "chapters", "outside"])
def test_chapter_5s_setup_runs_from_any_folder(folder, tmp_path):
    """Chapter 10 imports the repository's benchmarks package without touching sys.path: make env
    installs benchmarks/ and experiments/ in the book's environment (tools/pyproject.toml), not in the
    readers' package, so the chapter's first cell runs from the book's root, from chapters/ (where
    Jupyter starts a kernel for a chapter) and from a folder outside the repository alike, and reads
    the saved run that the package serves."""
    from booktools.qmd import parse

    chapter = ROOT / "chapters" / "ch05-measured.qmd"
    setup = next(cell for cell in parse(chapter.read_text(encoding="utf-8")).cells if cell.is_python)
    assert "sys.path" not in setup.code
    source = setup.code + "\nprint('benchmarks:', decode.__file__)\nprint('saved results:', saved_path)\n"
    where = {"root": ROOT, "chapters": ROOT / "chapters", "outside": tmp_path}[folder]
    environment = _clean_environment() | {"MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", source], cwd=where, capture_output=True, text=True,
                          timeout=300, env=environment)
    assert done.returncode == 0, f"chapter 5's setup failed from {where}:\n{done.stderr[-3000:]}"
    assert f"benchmarks: {ROOT / 'benchmarks' / 'decode.py'}\n" in done.stdout
    assert f"saved results: {ROOT / 'benchmarks' / 'results'}/benchmarks-" in done.stdout
    # the readers' package itself holds no runner
    assert importlib.util.find_spec("longctx.benchmarks") is None
