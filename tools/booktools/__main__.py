"""Command line: `python -m booktools <verb>` (tangle, execute, notebooks, check, quarto).

Exit codes: 0 success, 1 the book has problems (each printed as FILE:LINE: message), 2 usage.
"""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
