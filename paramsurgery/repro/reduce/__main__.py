"""`python -m paramsurgery.repro.reduce --harvest-child DIR` (internal)."""

import sys

from .child import main

sys.exit(main(sys.argv[1:]))
