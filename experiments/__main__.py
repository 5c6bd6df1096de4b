"""python -m experiments: see experiments/extension.py (or --help).

Chapter 4's run is python -m experiments.copying, Chapter 7's python -m experiments.forgetting;
`make experiment` runs all three.
"""

import sys

from .extension import main

sys.exit(main())
