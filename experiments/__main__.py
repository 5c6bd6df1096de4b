"""python -m experiments: see experiments/extension.py (or --help)."""

import sys

from .extension import main

sys.exit(main())
