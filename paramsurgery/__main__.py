import sys

from paramsurgery.cli import main

sys.exit(main())
