"""``python -m benchmarks.pfl --data X.npz --out result.json [--workers 2]``: the launcher, or
(with the launcher's ``--rank-process``) one of its ranks. The launcher's modules are the
standard library's only; a rank's import numpy, torch and pfl."""

from __future__ import annotations

import sys

from .cli import RANK_FLAG


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if RANK_FLAG in argv:
        from .rank import main as rank_main

        return rank_main(argv)
    from .launcher import main as launcher_main

    return launcher_main(argv)


if __name__ == "__main__":
    sys.exit(main())
