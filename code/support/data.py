"""Where the book's data files are: the corpus and the model-config excerpts.

The files live in the repository's ``data/`` folder. ``pyproject.toml`` ships
that folder inside the package as ``longctx.data``, so a wheel carries them and
they are found from any working directory, in the repository or far from it.
"""

from __future__ import annotations

import importlib.util
import pathlib

from .checks import check_type

# The package that holds the data files, and the one file every installation of it has.
DATA_PACKAGE = "longctx.data"
_ANCHOR = "README.md"


def _data_root() -> pathlib.Path:
    """Return the folder that really holds the book's data files.

    The import system says where ``longctx.data`` lives, and the first of its
    folders that holds the anchor file is the one. That covers the three ways
    the package is installed. From a wheel it is ``longctx/data`` inside
    ``site-packages``. In setuptools' strict editable install (``make env``) it
    is a tree of links, which are followed to the repository's ``data/``, so a
    file added there is found without reinstalling. In the default editable
    install (``pip install -e .``, what ``environment.yml`` runs) ``data/`` has
    no ``__init__.py`` and becomes a namespace package whose path also lists
    the editable finder's hook, an entry that is no folder; asking
    ``importlib.resources`` for it would fail with ``NotADirectoryError``, so
    the folders are read from the package's spec instead.

    Raises:
        FileNotFoundError: If the installed package lacks its data files.
    """
    spec = importlib.util.find_spec(DATA_PACKAGE)
    folders = [] if spec is None else list(spec.submodule_search_locations or [])
    for folder in folders:
        anchor = pathlib.Path(folder, _ANCHOR)
        if anchor.is_file():
            return anchor.resolve().parent
    raise FileNotFoundError(
        f"the package {DATA_PACKAGE} has no {_ANCHOR} in any of {folders}: "
        "the installation is incomplete; reinstall longctx"
    )


def data_path(*parts: str) -> pathlib.Path:
    """Return the absolute path of a file or folder among the book's data files.

    Works from any working directory (the repository root, ``notebooks/``, an
    exercise folder far away) and from a wheel as well as from the repository,
    because it asks the installed package where its data is (``_data_root``).

    Args:
        *parts: Path pieces below the data folder, e.g.
            ``data_path("configs", "llama-2-7b.json")``.

    Returns:
        The absolute path; ``data_path()`` is the data folder itself.

    Raises:
        TypeError: If a piece is not a string.
        ValueError: If a piece is empty, absolute or climbs out with ``..``,
            or if no such file or folder exists (the message lists what the
            nearest existing folder holds).
    """
    for part in parts:
        check_type("data_path parts", part, str)
        pure = pathlib.PurePosixPath(part)
        if not part or pure.is_absolute() or ".." in pure.parts:
            raise ValueError(
                "data_path parts must be non-empty relative paths that stay "
                f"inside the data folder (got {part!r})"
            )
    root = _data_root()
    path = root.joinpath(*parts)
    if not path.exists():
        folder = path.parent
        while not folder.is_dir():
            folder = folder.parent
        held = sorted(f"{p.name}/" if p.is_dir() else p.name for p in folder.iterdir())
        where = folder.relative_to(root).as_posix()
        raise ValueError(
            f"data_path parts must name a file or folder among the book's data files in {root}; "
            f"{'the data folder' if where == '.' else where + '/'} holds: {', '.join(held)} "
            f"(got {'/'.join(parts)!r})"
        )
    return path
