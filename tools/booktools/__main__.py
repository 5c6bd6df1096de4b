"""`python -m booktools VERB`: the command line of `cli`."""

from .cli import main

raise SystemExit(main())
