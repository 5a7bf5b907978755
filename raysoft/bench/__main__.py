"""``python -m raysoft.bench``: how ``raysoft bench`` starts its measurement subprocesses."""

import sys

from .runner import main

sys.exit(main())
