"""`python -m paramsurgery.repro.reduce --harvest-child DIR` (internal)."""

import sys

from paramsurgery.repro.reduce.child import main

sys.exit(main(sys.argv[1:]))
