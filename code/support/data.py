"""Where the book's data files are: the corpus and the model-config excerpts.

The files live in the repository's ``data/`` folder. ``pyproject.toml`` ships
that folder inside the package as ``longctx.data``, so a wheel carries them and
they are found through ``importlib.resources`` from any working directory, in
the repository or far from it.
"""

from __future__ import annotations

import pathlib
from importlib import resources

from .checks import describe

# The package that holds the data files, and the one file every installation of it has.
DATA_PACKAGE = "longctx.data"
_ANCHOR = "README.md"


def _data_root() -> pathlib.Path:
    """Return the folder that really holds the book's data files.

    In a wheel that is ``longctx/data`` inside ``site-packages``. In the
    editable install that ``make env`` makes, the package's files are links to
    the repository's ``data/`` folder; the links are followed, so the answer is
    that folder, and a file added to it is found without reinstalling.

    Raises:
        FileNotFoundError: If the installed package lacks its data files.
    """
    anchor = pathlib.Path(str(resources.files(DATA_PACKAGE).joinpath(_ANCHOR)))
    if not anchor.is_file():
        raise FileNotFoundError(
            f"the package {DATA_PACKAGE} has no {_ANCHOR} at {anchor}: "
            "the installation is incomplete; reinstall longctx"
        )
    return anchor.resolve().parent


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
        if not isinstance(part, str):
            raise TypeError(f"data_path parts must be strings (got {describe(part)})")
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
