"""What ``help()`` shows a reader who imports ``longctx``: every public class answers for itself.

A student who types ``help(ch03.GroupedQueryAttention)`` should read the layer's own account of
its arguments first, not the ~900 lines ``nn.Module`` inherits, nor a tuple's help. So every
public class of every chapter module has its own docstring, and where its constructor takes
arguments, an ``Args:`` section (a layer, a model) or an ``Attributes:`` section (a dataclass, a
NamedTuple, whose fields are its arguments) naming each of them. An ``nn.Module`` subclass also
has an ``__init__`` docstring of its own, so ``help()`` never shows PyTorch's for it.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHAPTERS = sorted(path.parent.name for path in (ROOT / "code").glob("ch*/_generated.py"))



def public_classes() -> list[tuple[str, type]]:
    """Every class a chapter module defines and exports (a type alias such as LatentCache is not one)."""
    found = []
    for chapter in CHAPTERS:
        module = importlib.import_module(f"longctx.{chapter}")
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and obj.__module__.startswith(f"longctx.{chapter}"):
                found.append((f"{chapter}.{name}", obj))
    return found


def constructor_arguments(cls: type) -> list[str]:
    """The arguments a caller passes to build ``cls`` (not self, not **settings)."""
    parameters = inspect.signature(cls).parameters.values()
    return [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def argument_section(cls: type) -> str:
    """The Args or Attributes section of the class's or its own ``__init__``'s docstring ('' if none)."""
    init = cls.__dict__.get("__init__")
    docs = [cls.__dict__.get("__doc__") or "", getattr(init, "__doc__", None) or ""]
    for doc in map(inspect.cleandoc, docs):
        match = re.search(r"^(Args|Attributes):\n((?:[ \t]+.*\n?|\n)*)", doc, flags=re.MULTILINE)
        if match:
            return match.group(2)
    return ""


def missing_arguments(cls: type) -> list[str]:
    section = argument_section(cls)
    return [name for name in constructor_arguments(cls) if not re.search(rf"\b{name}\b", section)]


def test_the_walk_finds_the_classes_of_every_chapter():
    found = {key.split(".")[0] for key, _ in public_classes()}
    assert found == set(CHAPTERS)
    keys = {key for key, _ in public_classes()}
    assert {"ch03.GroupedQueryAttention", "ch05.OnlineState", "ch07.Seen"} <= keys
    assert "ch03.LatentCache" not in keys  # an alias of torch.Tensor, documented where it is saved


def _classes(*, modules_only: bool = False) -> list:
    return [pytest.param(key, cls, id=key) for key, cls in public_classes()
            if not modules_only or issubclass(cls, torch.nn.Module)]


@pytest.mark.parametrize(("key", "cls"), _classes())
def test_every_public_class_documents_its_own_arguments(key, cls):
    assert cls.__dict__.get("__doc__"), f"{key} has no docstring of its own"
    arguments = constructor_arguments(cls)
    if not arguments:
        return
    assert argument_section(cls), f"{key}({', '.join(arguments)}) has no Args or Attributes section"
    assert not missing_arguments(cls), f"{key}'s Args do not name {missing_arguments(cls)}"


@pytest.mark.parametrize(("key", "cls"), _classes(modules_only=True))
def test_a_layer_never_shows_pytorchs_init_docstring(key, cls):
    assert inspect.getdoc(cls.__init__) != inspect.getdoc(torch.nn.Module.__init__), key
    assert cls.__init__.__qualname__.split(".")[0] != "Module", key


def test_help_of_the_grouped_layer_opens_with_its_arguments():
    from longctx import ch03

    text = pydoc_text(ch03.GroupedQueryAttention)
    head = text[: text.index("Method resolution order")]
    assert "Args:" in head and "kv_heads: Key-value heads" in head
    init = text[text.index("__init__(self"):][:400]
    assert "Initialize internal Module state" not in init and "the Args are the class's" in init


def test_help_of_the_online_state_is_its_own_not_a_tuples():
    from longctx import ch05

    state = ch05.online_softmax_start((2,), 3, torch.zeros(1))
    assert isinstance(state, ch05.OnlineState) and state.running_sum.shape == (2, 1)
    head = pydoc_text(ch05.OnlineState)[:800]
    assert "The state of an online softmax" in head and "running_sum: l, (..., R, 1)" in head
    assert "Built-in immutable sequence" not in head  # the tuple's own help


def test_snapkv_says_what_it_returns_and_its_window():
    from longctx import ch07

    doc = " ".join(inspect.getdoc(ch07.keep_snap).split())
    assert "(B, H, keep)" in doc and "sorted by position" in doc and "window of 4" in doc
    assert ch07.POLICIES["snapkv"][1]["window"] == 4  # the window the docstring names
    assert "(B, H, n - window)" in inspect.getdoc(ch07.snap_votes)  # the entries before the window


def pydoc_text(obj) -> str:
    import pydoc

    return pydoc.plain(pydoc.render_doc(obj))


def test_the_appendix_reads_a_constants_hash_colon_lines():
    from booktools.apiref import COMMENTED

    text = '# a plain comment\nPLAIN = 1\n#: Two lines\n#: of text.\nABOVE: dict = {}\nBELOW = 2\n"""A string."""\n'
    assert {match[2]: match[1] for match in COMMENTED.finditer(text)} == {"ABOVE": "#: Two lines\n#: of text.\n"}


def test_the_api_appendix_says_what_every_public_constant_holds():
    from booktools.apiref import api_entries

    entries = {f"{entry.module}.{entry.name}": entry for entry in api_entries(ROOT)}
    constants = {key: entry.summary for key, entry in entries.items() if entry.kind == "constant"}
    assert {"longctx.ch06.RECIPE_SETTINGS", "longctx.ch07.POLICIES", "longctx.ch02.CORPUS_FILE"} <= set(constants)
    assert not [key for key, summary in constants.items() if not summary]
    assert constants["longctx.ch06.RECIPE_SETTINGS"].startswith("Each recipe's settings beside its factor")
    assert constants["longctx.ch04.COPYING_TASK"].startswith("The chapter's selective-copying task")


CHAPTER_FILES = pathlib.Path(__file__).resolve().parents[1] / "chapters"
API_TABLE = r"\n((?:\|.*\|\n)+)\n: [^\n]*\{{#tbl-{module}-api\}}"


def _opening_table_names(module: str) -> set[str] | None:
    """The backticked names of a chapter's opening table of what it saves (on one of its pages)."""
    pages = [path.read_text() for path in sorted(CHAPTER_FILES.glob(f"{module}-*.qmd"))]
    table = next(filter(None, (re.search(API_TABLE.format(module=module), text) for text in pages)), None)
    if table is None:
        return None
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table.group(1)))


@pytest.mark.parametrize("module", ["ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07"])
def test_a_chapters_opening_table_lists_exactly_what_it_saves(module):
    names = _opening_table_names(module)
    assert names is not None, f"{module} has no opening table labelled tbl-{module}-api"
    public = set(importlib.import_module(f"longctx.{module}").__all__)
    assert sorted(public - names) == [], "saved but not in the opening table"
    assert sorted(names - public) == [], "in the opening table but not saved"
