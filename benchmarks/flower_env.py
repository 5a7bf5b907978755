"""The Flower side of the seconds-per-round benchmark: its own virtual environment and a runner.

Flower 1.42's ``flwr[simulation]`` pins ``ray==2.55.1``, which conflicts with the Ray this
package runs on, so Flower lives in a separate venv. :func:`ensure_flower_venv` makes it (once,
with :func:`benchmarks.venvs.ensure_venv`: a stamp file names the installed requirements),
and :func:`run_flower` runs ``flower.py`` (a standalone script beside this module that does not
import ``raysoft``) with that venv's python and returns the JSON it wrote. Standard library only
(and raysoft's ``peer_venv`` when run as ``python -m benchmarks.flower_env [PATH]``, which makes
the venv).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .venvs import ensure_venv, peer_requirements, pip, run_script, stamp_matches

BENCH_SCRIPT = Path(__file__).with_name("flower.py")
FLOWER_VERSION = "1.42.0"
STAMP_NAME = ".raysoft-flower-stamp"

FLOWER_REQUIREMENTS = peer_requirements(f"flwr[simulation]=={FLOWER_VERSION}")


# Requirements of flwr whose version bound may be dropped when the index cannot meet it, and
# why that is harmless. The package index of this project's machines is a snapshot whose newest
# certifi (2026.10.18) is one day older than the one flwr 1.42.0 asks for (>=2026.10.19);
# certifi is only a CA bundle and Flower's simulation makes no TLS connections.
RELAXABLE = {"certifi": "a CA bundle; the simulation opens no TLS connection"}

# Run with the Flower venv's python: flwr's requirements for the "simulation" extra, markers
# evaluated, with the version bounds of the RELAXABLE ones dropped; one per line.
_DEPS_SCRIPT = """
import importlib.metadata as m, sys
from pip._vendor.packaging.requirements import Requirement
relax = set(sys.argv[1:])
for line in m.requires("flwr") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": "simulation"}):
        continue
    r.marker = None
    if r.name.lower() in relax:
        r.specifier = type(r.specifier)("")
    print(r)
"""


def _install_relaxed(python: Path) -> subprocess.CompletedProcess:
    """flwr without its dependencies, then those dependencies (RELAXABLE ones unbounded) and
    the rest of FLOWER_REQUIREMENTS in one resolver run."""
    flwr_req = FLOWER_REQUIREMENTS[0].replace("[simulation]", "")
    proc = pip(python, "--no-deps", flwr_req)
    if proc.returncode != 0:
        return proc
    deps = subprocess.run([str(python), "-c", _DEPS_SCRIPT, *RELAXABLE], capture_output=True, text=True)
    if deps.returncode != 0:
        return deps
    flwr_deps = [d.strip() for d in deps.stdout.splitlines() if d.strip()]
    return pip(python, *flwr_deps, *FLOWER_REQUIREMENTS[1:])


def _relax(python: Path, failed: subprocess.CompletedProcess):
    """When pip could not resolve because a RELAXABLE dependency of flwr has no release meeting
    flwr's bound on the index: the relaxed install, and the stamp's note saying so."""
    if not any(f"no matching distribution found for {name}" in failed.stderr.lower() for name in RELAXABLE):
        return None
    note = f"# installed with the version bounds of flwr's {', '.join(RELAXABLE)} requirement dropped\n"
    return _install_relaxed(python), note


def ensure_flower_venv(path: Path) -> Path:
    """Create (if needed) the Flower venv at ``path`` with :data:`FLOWER_REQUIREMENTS` and
    return its python. A venv counts as complete only when its stamp file (written after pip
    succeeded) names the same requirements; otherwise the requirements are (re)installed.

    When pip cannot resolve the requirements because a dependency of flwr named in
    :data:`RELAXABLE` has no release meeting flwr's bound on the index, flwr is installed
    without dependencies and its dependencies with that bound dropped (the stamp says so)."""
    return ensure_venv(path, FLOWER_REQUIREMENTS, STAMP_NAME, "Flower", fallback=_relax)


def flower_venv_ready(path: Path) -> bool:
    """Whether a complete Flower venv is at ``path`` (its stamp names :data:`FLOWER_REQUIREMENTS`)."""
    return stamp_matches(Path(path), STAMP_NAME, FLOWER_REQUIREMENTS)


def run_flower(
    python: Path,
    data_npz: Path,
    out_json: Path,
    num_actors: int = 2,
    timeout: float | None = None,
    gpu_share: float = 0.0,
) -> dict:
    """Run ``flower.py`` with the Flower venv's ``python`` on ``data_npz``, writing
    ``out_json``, and return the parsed JSON (``gpu_share`` > 0: every client on that share of
    the GPU, ``client_resources``'s ``num_gpus``). A failure (nonzero exit, timeout, missing or
    bad JSON) is a one-line :class:`RuntimeError` carrying the last line of the script's stderr."""
    args = ["--data", str(data_npz), "--out", str(out_json), "--num-actors", str(int(num_actors))]
    if gpu_share > 0:
        args += ["--gpu-share", repr(float(gpu_share))]
    return run_script(python, BENCH_SCRIPT, args, Path(out_json), timeout=timeout)


__all__ = ["FLOWER_REQUIREMENTS", "ensure_flower_venv", "flower_venv_ready", "run_flower", "BENCH_SCRIPT"]


def main(argv: list[str]) -> int:  # pragma: no cover - convenience: python -m benchmarks.flower_env [PATH]
    from raysoft.bench.peers import peer_venv

    print(ensure_flower_venv(Path(argv[0]) if argv else peer_venv("flower")))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
