"""Where the saved code checks its arguments: at the boundaries, not in the kernels.

The book's rule (CONTRIBUTING.md, "Bad input: checked at the boundary"): arguments are checked where they
enter from a person, one line per argument through a plain ``longctx.support`` helper,
and kernels keep their bodies for the algorithm. Two halves, two pieces of evidence:

- every boundary refuses its bad inputs: ``tests/test_bad_input.py`` sweeps each entry
  of its ``BOUNDARIES`` table with a bad value for every argument, and refuses each of
  its ``SILENT`` cases (values that would give a wrong answer without an error). This
  file checks that the sweep leaves no argument of a boundary untried;
- no function that is not a boundary (attention, masks, RoPE, scans, tiles, helpers)
  has more check statements than algorithm statements: a kernel refuses at most the
  few values that would give a silently wrong answer. A boundary is an entry of
  ``BOUNDARIES`` (a constructor or ``__post_init__`` counts with its class).

A *check statement* is a ``raise``, an ``assert``, a call of a ``check_*`` helper (alone
or assigned), or an ``if``/``for``/``try`` that holds nothing but checks (a ``try``
whose handlers only raise counts with its body). Every other statement inside a
function is algorithm; docstrings are neither.

``python tests/test_code_shape.py`` prints the kernels that hold checks, with their counts.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_CHECK_CALL = re.compile(r"^_?check")


def all_modules() -> tuple[str, ...]:
    return tuple(sorted(p.parent.name for p in (ROOT / "code").glob("ch[0-9][0-9]/_generated.py")))


def _called_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def is_check(statement: ast.stmt) -> bool:
    """Return whether ``statement`` only checks arguments (see the module's docstring)."""
    if isinstance(statement, ast.Raise | ast.Assert):
        return True
    if isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign | ast.AugAssign | ast.Return):
        name = _called_name(statement.value) if statement.value is not None else None
        return name is not None and bool(_CHECK_CALL.match(name))
    if isinstance(statement, ast.If | ast.For):
        return all(is_check(s) for s in statement.body + statement.orelse)
    if isinstance(statement, ast.Try):
        return bool(statement.handlers) and all(
            all(isinstance(s, ast.Raise) for s in handler.body) for handler in statement.handlers
        )
    return False


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement of ``body``, nested ones included, nested functions and classes not."""
    found = []
    for statement in body:
        found.append(statement)
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            found.extend(_statements(getattr(statement, field, []) or []))
        for handler in getattr(statement, "handlers", []) or []:
            found.extend(_statements(handler.body))
    return found


def _count(body: list[ast.stmt]) -> tuple[int, int]:
    """Return (check statements, algorithm statements) of a function body."""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    checks = algorithm = 0
    for statement in body:
        inner = len(_statements([statement]))
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # counted as functions of their own
        if is_check(statement):
            checks += inner
        else:
            nested_checks, nested_algorithm = _count_nested(statement)
            checks += nested_checks
            algorithm += 1 + nested_algorithm
    return checks, algorithm


def _count_nested(statement: ast.stmt) -> tuple[int, int]:
    checks = algorithm = 0
    blocks = [getattr(statement, field, []) or [] for field in ("body", "orelse", "finalbody")]
    blocks += [handler.body for handler in getattr(statement, "handlers", []) or []]
    for block in blocks:
        c, a = _count(block) if block else (0, 0)
        checks, algorithm = checks + c, algorithm + a
    return checks, algorithm


@dataclass
class FunctionCount:
    module: str
    name: str  # "function" or "Class.method"
    checks: int
    algorithm: int


def function_counts(module: str) -> list[FunctionCount]:
    """Return the counts of every function and method of ``code/<module>/_generated.py``."""
    tree = ast.parse((ROOT / "code" / module / "_generated.py").read_text(encoding="utf-8"))
    counts = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                counts.append(FunctionCount(module, prefix + node.name, *_count(node.body)))
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(tree.body, "")
    return counts


def _boundaries() -> set[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_bad_input import BOUNDARIES

    return {key for table in BOUNDARIES.values() for key in table}


def _is_boundary(count: FunctionCount, boundaries: set[str]) -> bool:
    name = f"{count.module}.{count.name}"
    # a constructor or config validator belongs to its class's boundary entry
    for suffix in (".__init__", ".__post_init__"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name in boundaries


def kernel_problems(modules: tuple[str, ...]) -> list[str]:
    """Functions that are not boundaries yet have more check than algorithm statements."""
    boundaries = _boundaries()
    return [
        f"{c.module}.{c.name}: {c.checks} check vs {c.algorithm} algorithm statements"
        for module in modules
        for c in function_counts(module)
        if c.checks > c.algorithm and not _is_boundary(c, boundaries)
    ]


# --------------------------------------------------------------------------- tests


def test_the_counter_tells_checks_from_algorithm():
    source = '''
def f(x, heads):
    """Docstring."""
    heads = check_int("heads", heads, minimum=1)
    if x.shape[-1] % heads:
        raise ValueError("no")
    for name in ("a", "b"):
        support.check_tensor(name, x)
    try:
        y = torch.broadcast_shapes(x.shape, x.shape)
    except RuntimeError:
        raise ValueError("no") from None
    z = x * 2
    if z.sum() > 0:
        z = z + 1
    return z
'''
    (function,) = ast.parse(source).body
    # checks: check_int, if + raise, for + check_tensor, try + y= + raise -> 1 + 2 + 2 + 3
    assert _count(function.body) == (8, 4)


def test_every_chapter_is_found():
    modules = all_modules()
    assert {"ch01", "ch02", "ch03", "ch04", "ch05", "ch06"} <= set(modules), modules


def test_the_sweep_tries_every_argument_of_every_boundary():
    """The sweep is the evidence that each boundary refuses bad input: it must reach every argument."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_bad_input import _cases, _entries, _target

    tried = {(key, parameter) for key, parameter, _ in _cases()}
    untried = []
    for key, valid in sorted(_entries().items()):
        _, _, parameters = _target(key, valid)
        untried += [f"{key}({p.name})" for p in parameters
                    if p.name not in valid.any_value and (key, p.name) not in tried]
    assert not untried, f"the bad-input sweep tries no bad value for: {untried}"


def test_the_counter_finds_the_checks_of_a_known_kernel_and_a_known_boundary():
    counts = {c.name: c for c in function_counts("ch03")}
    # visibility_mask refuses a non-integer length, a zero window and negative sinks, and computes
    assert counts["visibility_mask"].checks == 3 and counts["visibility_mask"].algorithm > 3
    assert counts["GroupedQueryAttention.__init__"].checks >= 5  # three counts and two divisions


@pytest.mark.parametrize("module", all_modules())
def test_no_kernel_checks_more_than_it_computes(module):
    assert not kernel_problems((module,))


if __name__ == "__main__":
    try:
        boundaries = _boundaries()
    except ImportError:
        sys.exit("test_bad_input.BOUNDARIES not found")
    for module in all_modules():
        for c in function_counts(module):
            if c.checks and not _is_boundary(c, boundaries):
                print(f"{c.module}.{c.name}: {c.checks} check vs {c.algorithm} algorithm statements")
    problems = kernel_problems(all_modules())
    print(f"kernels with more checks than algorithm: {len(problems)}")
