"""``python -m raysoft ARGS`` is ``raysoft ARGS``: the command line (:mod:`raysoft.cli`) for an
environment whose ``raysoft`` script is not on the PATH, e.g. as a Ray Job's entrypoint
(``python -m raysoft run CONFIG``, which :mod:`raysoft.submit` treats as ``raysoft run``)."""

from .cli import main

raise SystemExit(main())
