"""The book's own tooling: one `.qmd` parser (`qmd`) and the steps built on it; `python -m booktools --help`
lists the verbs (`cli`). Submodules are imported lazily, so that `tangle` starts fast."""
