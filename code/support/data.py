"""Where the book's data files are: the corpus and the model-config excerpts."""

from __future__ import annotations

import pathlib


def _repo_root() -> pathlib.Path:
    """Return the repository root, found from where ``longctx`` is installed (the folder above ``code/``)."""
    try:
        import longctx

        for entry in longctx.__path__:
            candidate = pathlib.Path(entry).resolve().parent
            if (candidate / "data").is_dir():
                return candidate
    except ImportError:
        pass
    # Not installed: look upward from the working directory for the book project.
    here = pathlib.Path.cwd().resolve()
    for candidate in (here, *here.parents):
        if (candidate / "_quarto.yml").is_file() and (candidate / "data").is_dir():
            return candidate
    raise FileNotFoundError(
        "cannot find the book's data/ folder: install the package (pip install -e .) "
        "or run from inside the repository"
    )


def data_path(*parts: str) -> pathlib.Path:
    """Return the absolute path of a file or folder inside the book's ``data/`` folder.

    Works from any working directory (the repository root, ``notebooks/``, an
    exercise folder) because it starts from where ``longctx`` is installed.

    Args:
        *parts: Path pieces below ``data/``, e.g. ``data_path("configs", "llama.json")``.

    Returns:
        The absolute path; ``data_path()`` is the folder itself.

    Raises:
        TypeError: If a piece is not a string.
        ValueError: If a piece is absolute or climbs out of ``data/`` with ``..``.
        FileNotFoundError: If the path does not exist (the message names it).
    """
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"data_path parts must be strings (got {type(part).__name__})")
        if pathlib.PurePath(part).is_absolute() or ".." in pathlib.PurePath(part).parts:
            raise ValueError(f"data_path parts must be relative and stay inside data/ (got {part!r})")
    path = _repo_root().joinpath("data", *parts)
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder in the book's data/: {path}")
    return path
