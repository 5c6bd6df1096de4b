"""The book's own tooling: one `.qmd` parser and the steps built on it.

Run as `python -m booktools <verb>`:

- `tangle [--check] [FILE...]`: `# @save` cells -> code/chNN/_generated.py and __init__.py
- `notebooks [FILE...]`: chapters -> notebooks/chNN-*.ipynb, Quarto syntax translated
- `execute [FILE...]`: run the notebooks in fresh kernels -> _build/executed/
- `check`: cross-references, citations, labels, captions, chapter list, saved code, generated modules
- `quarto`: the book (HTML, EPUB; PDF with TeX), rendered by Quarto from the executed chapters -> _book/

Submodules are imported lazily so that `tangle` starts fast.
"""
