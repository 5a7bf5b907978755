"""``python -m raysoft.bench ARGS`` is ``raysoft bench ARGS``; ``raysoft bench`` starts its
measurement subprocesses this way (``--worker``)."""

import sys

from ..cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
