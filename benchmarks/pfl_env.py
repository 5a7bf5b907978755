"""The pfl side of the seconds-per-round benchmark: its own virtual environment and a runner.

pfl 0.6.0 (Apple's pfl-research, ``pfl[pytorch]``) pins ``packaging<26`` while raysoft's venv
has packaging 26, so pfl lives in a separate venv. :func:`ensure_pfl_venv` makes it (once, with
:func:`benchmarks.venvs.ensure_venv`: a stamp file names the installed requirements), and
:func:`run_pfl` runs ``python -m benchmarks.pfl`` (the package beside this module, which does
not import ``raysoft``) with that venv's python and returns the JSON it wrote. Standard library
only (and raysoft's ``peer_venv`` when run as ``python -m benchmarks.pfl_env [PATH]``, which
makes the venv).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .venvs import ensure_venv, peer_requirements, run_module

BENCH_MODULE = "pfl"  # python -m benchmarks.pfl
PFL_VERSION = "0.6.0"
STAMP_NAME = ".raysoft-pfl-stamp"

PFL_REQUIREMENTS = peer_requirements(f"pfl[pytorch]=={PFL_VERSION}")


def ensure_pfl_venv(path: Path) -> Path:
    """Create (if needed) the pfl venv at ``path`` with :data:`PFL_REQUIREMENTS` and return
    its python. A venv counts as complete only when its stamp file (written after pip
    succeeded) names the same requirements; otherwise the requirements are (re)installed."""
    return ensure_venv(path, PFL_REQUIREMENTS, STAMP_NAME, "pfl")


def run_pfl(python: Path, data_npz: Path, out_json: Path, workers: int = 2, timeout: float | None = None) -> dict:
    """Run ``python -m benchmarks.pfl`` with the pfl venv's ``python`` on ``data_npz`` (W1's or W2's export
    of the bare loop) with ``workers`` pfl worker processes, writing ``out_json``, and return the
    parsed JSON. A failure (nonzero exit, timeout, missing or bad JSON) is a one-line
    :class:`RuntimeError` carrying the last line of the script's stderr."""
    args = ["--data", str(data_npz), "--out", str(out_json), "--workers", str(int(workers))]
    return run_module(python, BENCH_MODULE, args, Path(out_json), timeout=timeout)


__all__ = ["PFL_REQUIREMENTS", "ensure_pfl_venv", "run_pfl", "BENCH_MODULE"]


def main(argv: list[str]) -> int:  # pragma: no cover - convenience: python -m benchmarks.pfl_env [PATH]
    from raysoft.bench.peers import peer_venv

    print(ensure_pfl_venv(Path(argv[0]) if argv else peer_venv("pfl")))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
