"""The Flower side of the seconds-per-round benchmark: its own virtual environment and a runner.

Flower 1.42's ``flwr[simulation]`` pins ``ray==2.55.1``, which conflicts with the Ray this
package runs on, so Flower lives in a separate venv. :func:`ensure_flower_venv` makes it (once:
a stamp file holding the requirements is written after a successful install, and a venv whose
stamp is missing or differs is reinstalled), and :func:`run_flower` runs ``flower.py``
(a standalone script beside this module that does not import ``raysoft``) with that venv's
python and returns the JSON it wrote. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

BENCH_SCRIPT = Path(__file__).with_name("flower.py")
FLOWER_VERSION = "1.42.0"
STAMP_NAME = ".raysoft-flower-stamp"


def _torch_requirement() -> str:
    """``torch==X.Y.Z`` of the calling interpreter (a local tag such as ``+cpu`` dropped, so
    the Flower venv's pip may pick whichever build of that release the index has)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "torch"
    return f"torch=={version.split('+', 1)[0]}"


FLOWER_REQUIREMENTS: list[str] = [
    f"flwr[simulation]=={FLOWER_VERSION}",
    _torch_requirement(),
    "numpy",
]


def _venv_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


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


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def _install_relaxed(python: Path) -> subprocess.CompletedProcess:
    """flwr without its dependencies, then those dependencies (RELAXABLE ones unbounded) and
    the rest of FLOWER_REQUIREMENTS in one resolver run."""
    flwr_req = FLOWER_REQUIREMENTS[0].replace("[simulation]", "")
    proc = _pip(python, "--no-deps", flwr_req)
    if proc.returncode != 0:
        return proc
    deps = subprocess.run([str(python), "-c", _DEPS_SCRIPT, *RELAXABLE], capture_output=True, text=True)
    if deps.returncode != 0:
        return deps
    flwr_deps = [d.strip() for d in deps.stdout.splitlines() if d.strip()]
    return _pip(python, *flwr_deps, *FLOWER_REQUIREMENTS[1:])


def _pip_error(text: str) -> str:
    """pip's first ``ERROR:`` line (the later ones are pointers to its docs), else the last."""
    for line in (text or "").splitlines():
        if line.startswith("ERROR:"):
            return line.strip()
    return _last_line(text)


def ensure_flower_venv(path: Path) -> Path:
    """Create (if needed) the Flower venv at ``path`` with :data:`FLOWER_REQUIREMENTS` and
    return its python. A venv counts as complete only when its stamp file (written after pip
    succeeded) names the same requirements; otherwise the requirements are (re)installed.

    When pip cannot resolve the requirements because a dependency of flwr named in
    :data:`RELAXABLE` has no release meeting flwr's bound on the index, flwr is installed
    without dependencies and its dependencies with that bound dropped (the stamp says so)."""
    path = Path(path).resolve()
    python = _venv_python(path)
    stamp = path / STAMP_NAME
    wanted = "\n".join(FLOWER_REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text().startswith(wanted):
        return python
    if stamp.exists():
        stamp.unlink()
    if not python.exists():
        if path.exists() and any(path.iterdir()) and not (path / "pyvenv.cfg").exists():
            raise RuntimeError(f"{path} exists and is no virtual environment: not touching it")
        try:
            venv.EnvBuilder(with_pip=True, clear=path.exists()).create(path)
        except Exception as exc:  # venv/ensurepip failures come in several types
            raise RuntimeError(f"creating the Flower venv at {path} failed: {exc}".replace("\n", " ")) from None
        # keep the venv out of git when it lies inside a work tree (as Python 3.13's venv does)
        (path / ".gitignore").write_text("*\n")
    note = ""
    proc = _pip(python, *FLOWER_REQUIREMENTS)
    if proc.returncode != 0 and any(
        f"no matching distribution found for {name}" in proc.stderr.lower() for name in RELAXABLE
    ):
        proc = _install_relaxed(python)
        note = f"# installed with the version bounds of flwr's {', '.join(RELAXABLE)} requirement dropped\n"
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip install into the Flower venv {path} failed (exit {proc.returncode}): "
            f"{_pip_error(proc.stderr or proc.stdout)}"
        )
    stamp.write_text(wanted + note)
    return python


def run_flower(
    python: Path,
    data_npz: Path,
    out_json: Path,
    num_actors: int = 2,
    timeout: float | None = None,
) -> dict:
    """Run ``flower.py`` with the Flower venv's ``python`` on ``data_npz``, writing
    ``out_json``, and return the parsed JSON. A failure (nonzero exit, timeout, missing or bad
    JSON) is a one-line :class:`RuntimeError` carrying the last line of the script's stderr."""
    out_json = Path(out_json)
    cmd = [
        str(python), str(BENCH_SCRIPT),
        "--data", str(data_npz),
        "--out", str(out_json),
        "--num-actors", str(int(num_actors)),
    ]
    # its own process group, which Ray's processes join: after a timeout (or an interrupt of
    # this process) the script gets SIGINT to shut Ray down, and whatever of that group is
    # still there 30 s later is killed
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        err = _stop(proc)
        raise RuntimeError(f"bench/flower.py timed out after {timeout} s: {_last_line(err)}") from None
    finally:
        if proc.poll() is None:
            _stop(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"bench/flower.py failed (exit {proc.returncode}): {_last_line(err)}")
    try:
        return json.loads(out_json.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"bench/flower.py wrote no readable JSON at {out_json}: {exc}".replace("\n", " ")) from None


def _stop(proc: subprocess.Popen, grace: float = 30.0) -> str:
    """SIGINT to the script, then SIGKILL to what is left of its process group; its stderr."""
    err = ""
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    except OSError:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # the group is gone already
        pass
    if proc.poll() is None:
        _, err = proc.communicate()
    return err or ""


__all__ = ["FLOWER_REQUIREMENTS", "ensure_flower_venv", "run_flower", "BENCH_SCRIPT"]

if __name__ == "__main__":  # pragma: no cover - convenience: python -m raysoft.bench.flower_env PATH
    print(ensure_flower_venv(Path(sys.argv[1] if len(sys.argv) > 1 else ".venv-flower")))
