"""The pfl side of the seconds-per-round benchmark: its own virtual environment and a runner.

pfl 0.6.0 (Apple's pfl-research, ``pfl[pytorch]``) pins ``packaging<26`` while raysoft's venv
has packaging 26, so pfl lives in a separate venv. :func:`ensure_pfl_venv` makes it (once, with
:func:`raysoft.bench.venvs.ensure_venv`: a stamp file names the installed requirements), and
:func:`run_pfl` runs ``pfl_bench.py`` (a standalone script beside this module that does not
import ``raysoft``) with that venv's python and returns the JSON it wrote. Standard library only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .venvs import ensure_venv, peer_requirements, peer_venv, run_script

BENCH_SCRIPT = Path(__file__).with_name("pfl_bench.py")
PFL_VERSION = "0.6.0"
STAMP_NAME = ".raysoft-pfl-stamp"

PFL_REQUIREMENTS = peer_requirements(f"pfl[pytorch]=={PFL_VERSION}")


def ensure_pfl_venv(path: Path) -> Path:
    """Create (if needed) the pfl venv at ``path`` with :data:`PFL_REQUIREMENTS` and return
    its python. A venv counts as complete only when its stamp file (written after pip
    succeeded) names the same requirements; otherwise the requirements are (re)installed."""
    return ensure_venv(path, PFL_REQUIREMENTS, STAMP_NAME, "pfl")


def run_pfl(python: Path, data_npz: Path, out_json: Path, workers: int = 2, timeout: float | None = None) -> dict:
    """Run ``pfl_bench.py`` with the pfl venv's ``python`` on ``data_npz`` (W1's or W2's export
    of the bare loop) with ``workers`` pfl worker processes, writing ``out_json``, and return the
    parsed JSON. A failure (nonzero exit, timeout, missing or bad JSON) is a one-line
    :class:`RuntimeError` carrying the last line of the script's stderr."""
    args = ["--data", str(data_npz), "--out", str(out_json), "--workers", str(int(workers))]
    return run_script(python, BENCH_SCRIPT, args, Path(out_json), timeout=timeout)


__all__ = ["PFL_REQUIREMENTS", "ensure_pfl_venv", "run_pfl", "BENCH_SCRIPT"]

if __name__ == "__main__":  # pragma: no cover - convenience: python -m raysoft.bench.pfl_env PATH
    print(ensure_pfl_venv(Path(sys.argv[1]) if len(sys.argv) > 1 else peer_venv("pfl")))
