"""How much of the saved code is argument checking, counted by statement.

The book's rule (DESIGN.md, "Checks at the boundary"): arguments are checked where they
enter from a person, and kernels keep their bodies for the algorithm. Three targets follow,
each a test over every ``code/chNN/_generated.py`` there is (a new chapter is held to them
as soon as it is tangled):

- in each chapter, check statements are at most 12 % of check plus algorithm statements;
- over all generated modules together, the same 12 %;
- no function that is not a boundary (attention, masks, RoPE, scans, tiles, helpers)
  has more check statements than algorithm statements. A boundary is an entry of
  ``tests/test_bad_input.py``'s ``BOUNDARIES`` (a constructor or ``__post_init__`` counts
  with its class).

A *check statement* is a ``raise``, an ``assert``, a call of a ``check_*`` helper (alone
or assigned), or an ``if``/``for``/``try`` that holds nothing but checks (a ``try``
whose handlers only raise counts with its body). Every other statement inside a
function is algorithm; docstrings are neither.

``python tests/test_code_shape.py`` prints the counts per module and the kernels over
the line.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TARGET_SHARE = 0.12
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


def module_share(module: str) -> tuple[int, int]:
    """Return (check statements, check + algorithm statements) over one generated module."""
    counts = function_counts(module)
    checks = sum(c.checks for c in counts)
    return checks, checks + sum(c.algorithm for c in counts)


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


def whole_book_ratio_problems(modules: tuple[str, ...]) -> list[str]:
    """The target over the given modules together, as a list of what misses it (empty: met)."""
    checks = total = 0
    for module in modules:
        c, t = module_share(module)
        checks, total = checks + c, total + t
    share = checks / total
    return [] if share <= TARGET_SHARE else [f"{checks} of {total} statements are checks ({share:.1%})"]


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


@pytest.mark.parametrize("module", all_modules())
def test_no_more_than_the_target_share_of_a_chapter_is_checks(module):
    checks, total = module_share(module)
    assert checks <= TARGET_SHARE * total, (
        f"{module}: {checks} of {total} statements are checks ({checks / total:.1%}), "
        f"over the {TARGET_SHARE:.0%} target: move checks out of kernels and helpers, "
        "or make a boundary's checks one call (support.check_arguments, check_fields)")


def test_no_more_than_the_target_share_of_the_whole_book_is_checks():
    assert not whole_book_ratio_problems(all_modules())


@pytest.mark.parametrize("module", all_modules())
def test_no_kernel_checks_more_than_it_computes(module):
    assert not kernel_problems((module,))


if __name__ == "__main__":
    modules = all_modules()
    for module in modules:
        checks, total = module_share(module)
        print(f"{module}: {checks:4d} check of {total:4d} statements ({checks / total:.1%})")
    grand = [module_share(m) for m in modules]
    checks, total = sum(c for c, _ in grand), sum(t for _, t in grand)
    print(f"all : {checks:4d} check of {total:4d} statements ({checks / total:.1%})")
    try:
        problems = kernel_problems(modules)
    except ImportError:
        problems = ["(test_bad_input.BOUNDARIES not found)"]
    print(f"kernels with more checks than algorithm: {len(problems)}")
    for line in problems:
        print("  ", line)
