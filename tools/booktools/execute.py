"""Execute the exported notebooks in fresh kernels and substitute inline expressions.

Each notebook runs cell by cell in its own `python3` kernel (cwd = the book's root, matplotlib's
inline backend). A markdown cell's `` `{python} expr` `` values are evaluated when the cell is
reached, after the code above it, as Quarto does, and replaced by `qmd.inline_text` of their
result; the raw results stay in the cell's `user_expressions` metadata, the one record of inline
values, from which Quarto renders the chapter (`booktools quarto`) and the reader's notebooks
take their text. A failing cell is reported as `chapters/FILE.qmd:LINE: ...` with the
traceback's last lines; that chapter's executed notebook is not written (a stale one is removed).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .book import Book
from .notebooks import export_book, needs_kernel
from .qmd import INLINE_EXPRESSION, inline_text

__all__ = ["ChapterRun", "inline_text", "execute_notebook", "execute_book"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class InlineError(Exception):
    """An inline expression that could not be evaluated."""


@dataclass
class ChapterRun:
    """The outcome of executing one notebook."""

    source: str  # "chapters/ch03-long-context.qmd"
    seconds: float
    error: str | None = None  # "FILE:LINE: message" and the traceback's last lines


def kernel_env(jobs: int = 1) -> dict[str, str]:
    """The environment for a chapter's kernel."""
    env = dict(os.environ)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env.setdefault("PYTHONHASHSEED", "0")
    env.setdefault("TQDM_DISABLE", "1")
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, jobs)))
    return env


def _tail(text: str, lines: int = 8) -> str:
    text = _ANSI.sub("", text)
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join("    " + line for line in kept[-lines:])


def _qmd_line_of(root: Path, source: str, needle: str) -> int:
    try:
        for number, text in enumerate((root / source).read_text(encoding="utf-8").splitlines(), 1):
            if needle in text:
                return number
    except OSError:
        pass
    return 0


def _evaluate_inline(client, expressions: list[str]) -> list[dict]:
    """Evaluate expressions in the running kernel; returns their `user_expressions` entries.

    Each entry is `{"expression": ..., "result": {"data", "metadata", "status"}}`, the form
    Jupyter and Quarto use; `inline_text` turns one into the text a reader sees.
    """
    wanted = {f"e{index}": f"({expr})" for index, expr in enumerate(expressions)}
    msg_id = client.kc.execute("", silent=True, store_history=False, user_expressions=wanted)
    reply = client.wait_for_reply(msg_id)
    if reply is None:
        raise InlineError("the kernel did not answer")
    results = reply["content"].get("user_expressions", {})
    entries = []
    for index, expr in enumerate(expressions):
        result = results.get(f"e{index}", {})
        if result.get("status") != "ok":
            name = result.get("ename", "Error")
            value = result.get("evalue", "")
            raise InlineError(f"inline expression `{{python}} {expr}` failed: {name}: {_ANSI.sub('', value)}")
        entries.append(
            {
                "expression": expr.strip(),
                "result": {"data": result.get("data", {}), "metadata": result.get("metadata", {}), "status": "ok"},
            }
        )
    return entries


def execute_notebook(notebook, root: Path, *, timeout: int = 600, jobs: int = 1):
    """Execute a notebook (in place) in a fresh kernel, substituting inline expressions.

    Returns:
        The notebook.

    Raises:
        CellFailure: a cell or inline expression failed (message names file and line).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    source = notebook.metadata.get("longctx", {}).get("source", "<notebook>")
    if not needs_kernel(notebook):
        return notebook
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(root)}},
        allow_errors=False,
    )
    # The kernel's own log (not cell output, which comes over the protocol) is noise here.
    with client.setup_kernel(env=kernel_env(jobs), stderr=subprocess.DEVNULL):
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type == "code":
                line = cell.metadata.get("longctx", {}).get("line", 0)
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as exc:
                    raise CellFailure(f"{source}:{line}: cell failed:\n{_tail(str(exc))}") from None
                except CellTimeoutError:
                    raise CellFailure(f"{source}:{line}: cell ran longer than {timeout} s (--timeout)") from None
                except DeadKernelError as exc:
                    raise CellFailure(f"{source}:{line}: the kernel died while running this cell: {exc}") from None
            elif cell.cell_type == "markdown":
                expressions = [match.group("expr") for match in INLINE_EXPRESSION.finditer(cell.source)]
                if not expressions:
                    continue
                try:
                    raw = _evaluate_inline(client, expressions)
                except InlineError as exc:
                    failing = str(exc).split("`")[1] if "`" in str(exc) else ""
                    line = _qmd_line_of(root, source, f"`{failing}`") if failing else 0
                    raise CellFailure(f"{source}:{line}: {exc}") from None
                cell.source = _substitute(cell.source, [inline_text(entry["result"]) for entry in raw])
                cell.metadata["user_expressions"] = raw
    return notebook


def _substitute(text: str, values: list[str]) -> str:
    """Replace the inline expressions of `text`, in order, by `values`."""
    found = iter(values)
    return INLINE_EXPRESSION.sub(lambda _match: next(found), text)


class CellFailure(Exception):
    """A chapter's cell failed; the message is `FILE:LINE: ...`."""


def _run_one(notebook_path: str, output_path: str, root: str, timeout: int, jobs: int) -> ChapterRun:
    import nbformat

    started = time.perf_counter()
    notebook = nbformat.read(notebook_path, as_version=4)
    source = notebook.metadata.get("longctx", {}).get("source", notebook_path)
    output = Path(output_path)
    try:
        execute_notebook(notebook, Path(root), timeout=timeout, jobs=jobs)
    except CellFailure as exc:
        output.unlink(missing_ok=True)
        return ChapterRun(source, time.perf_counter() - started, str(exc))
    except Exception as exc:  # the kernel could not start, ...
        output.unlink(missing_ok=True)
        message = f"{source}:0: execution failed: {type(exc).__name__}: {exc}"
        return ChapterRun(source, time.perf_counter() - started, message)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    nbformat.write(notebook, str(temporary))
    os.replace(temporary, output)
    return ChapterRun(source, time.perf_counter() - started)


def execute_book(
    book: Book,
    out: Path,
    files: list[str | Path] | None = None,
    *,
    jobs: int = 1,
    timeout: int = 600,
    notebooks_dir: Path | None = None,
    report=None,
) -> tuple[list[ChapterRun], list[str]]:
    """Export then execute the book's notebooks into `out`.

    Returns:
        (runs, problems): one run per notebook in book order, and export problems.
    """
    # the unexecuted export is a step of execution; notebooks/ holds what `make notebooks` gives readers
    notebooks_dir = notebooks_dir or book.root / "_build" / "export"
    paths, problems = export_book(book, notebooks_dir, files)
    if problems:
        return [], problems
    out.mkdir(parents=True, exist_ok=True)
    tasks = [(str(path), str(out / path.name), str(book.root), timeout, jobs) for path in paths]
    runs: list[ChapterRun] = []
    if jobs <= 1 or len(tasks) <= 1:
        for task in tasks:
            run = _run_one(*task)
            if report:
                report(run)
            runs.append(run)
        return runs, []
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        futures = [pool.submit(_run_one, *task) for task in tasks]
        for future in futures:
            run = future.result()
            if report:
                report(run)
            runs.append(run)
    return runs, []
