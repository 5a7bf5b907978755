"""``python -m raysoft.report ARGS`` is ``raysoft report ARGS``."""

import sys

from ..cli import main

sys.exit(main(["report", *sys.argv[1:]]))
