"""Virtual environments of the peer systems of ``raysoft bench``, and running a script in one.

A peer (Flower, pfl) whose requirements clash with raysoft's own (Flower pins another Ray,
pfl an older ``packaging``) lives in a venv of its own: :func:`ensure_venv` makes it once (a
stamp file holding the requirements is written after a successful install, and a venv whose
stamp is missing or differs is reinstalled), and :func:`run_script` (:func:`run_module`) runs a
standalone script (a package of this folder) that does not import ``raysoft`` with that venv's
python and returns the JSON it wrote. Run by raysoft's interpreter (``raysoft bench``), standard
library only; where the venvs live by default is :func:`raysoft.bench.peers.peer_venv`.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import venv
from collections.abc import Callable, Sequence
from pathlib import Path

HOME = Path(__file__).resolve().parent  # this folder, benchmarks/

# (python, the failed pip run) -> None (no remedy), or (the remedy's pip run, a note for the stamp)
Fallback = Callable[[Path, subprocess.CompletedProcess], "tuple[subprocess.CompletedProcess, str] | None"]


def torch_requirement() -> str:
    """``torch==X.Y.Z`` of the calling interpreter (a local tag such as ``+cpu`` dropped, so
    the peer venv's pip may pick whichever build of that release the index has)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "torch"
    return f"torch=={version.split('+', 1)[0]}"


def peer_requirements(peer: str) -> list[str]:
    """A peer's venv requirements: the peer itself (pinned by the caller), the calling
    interpreter's torch release (so both sides run the same kernels) and numpy."""
    return [peer, torch_requirement(), "numpy"]


def venv_python(path: Path) -> Path:
    return Path(path) / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def pip_error(text: str) -> str:
    """pip's first ``ERROR:`` line (the later ones are pointers to its docs), else the last."""
    for line in (text or "").splitlines():
        if line.startswith("ERROR:"):
            return line.strip()
    return last_line(text)


def stamp_matches(path: Path, stamp_name: str, requirements: Sequence[str]) -> bool:
    """Whether the venv at ``path`` has a python and a stamp naming exactly ``requirements``,
    one a line in this order (lines of notes, starting with ``#``, aside)."""
    path = Path(path)
    stamp = path / stamp_name
    if not (venv_python(path).exists() and stamp.exists()):
        return False
    lines = [ln.strip() for ln in stamp.read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")] == list(requirements)


def ensure_venv(path: Path, requirements: Sequence[str], stamp_name: str, label: str,
                fallback: Fallback | None = None) -> Path:
    """Create (if needed) the venv at ``path`` with ``requirements`` and return its python. A
    venv counts as complete only when its stamp file (written after pip succeeded) names the
    same requirements; otherwise they are (re)installed. ``fallback`` may retry a failed
    install another way (its note goes into the stamp). ``label`` names the venv in errors
    ("the Flower venv")."""
    path = Path(path).resolve()
    python = venv_python(path)
    stamp = path / stamp_name
    wanted = "\n".join(requirements) + "\n"
    if stamp_matches(path, stamp_name, requirements):
        return python
    if stamp.exists():
        stamp.unlink()
    if not python.exists():
        if path.exists() and any(path.iterdir()) and not (path / "pyvenv.cfg").exists():
            raise RuntimeError(f"{path} exists and is no virtual environment: not touching it")
        try:
            venv.EnvBuilder(with_pip=True, clear=path.exists()).create(path)
        except Exception as exc:  # noqa: BLE001 - venv/ensurepip failures come in several types
            raise RuntimeError(f"creating the {label} venv at {path} failed: {exc}".replace("\n", " ")) from None
        # keep the venv out of git when it lies inside a work tree (as Python 3.13's venv does)
        (path / ".gitignore").write_text("*\n")
    note = ""
    proc = pip(python, *requirements)
    if proc.returncode != 0 and fallback is not None:
        remedy = fallback(python, proc)
        if remedy is not None:
            proc, note = remedy
    if proc.returncode != 0:
        raise RuntimeError(
            f"pip install into the {label} venv {path} failed (exit {proc.returncode}): "
            f"{pip_error(proc.stderr or proc.stdout)}"
        )
    stamp.write_text(wanted + note)
    return python


def run_script(python: Path, script: Path, args: Sequence[str], out_json: Path,
               timeout: float | None = None) -> dict:
    """Run ``script`` with ``python`` and ``args`` (which make it write ``out_json``) and
    return the parsed JSON. A failure (nonzero exit, timeout, missing or bad JSON) is a
    one-line :class:`RuntimeError` carrying the last line of the script's stderr.

    The script runs in its own process group, which its children (Ray's processes, pfl's
    workers) join: after a timeout (or an interrupt of this process) the script gets SIGINT
    to shut down cleanly, and whatever of that group is still there 30 s later is killed."""
    cmd = [str(python), str(script), *map(str, args)]
    return _run(cmd, f"benchmarks/{Path(script).name}", Path(out_json), timeout, None)


def run_module(python: Path, module: str, args: Sequence[str], out_json: Path,
               timeout: float | None = None) -> dict:
    """:func:`run_script` for ``python -m benchmarks.<module>``: this folder's parent on the
    script's ``PYTHONPATH`` (and its children's), so that ``benchmarks`` is importable there."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HOME.parent), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [str(python), "-m", f"benchmarks.{module}", *map(str, args)]
    return _run(cmd, f"benchmarks/{module.replace('.', '/')}", Path(out_json), timeout, env)


def _run(cmd: list[str], name: str, out_json: Path, timeout: float | None, env: dict[str, str] | None) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        err = stop(proc)
        raise RuntimeError(f"{name} timed out after {timeout} s: {last_line(err)}") from None
    finally:
        if proc.poll() is None:
            stop(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}): {last_line(err)}")
    try:
        return json.loads(out_json.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{name} wrote no readable JSON at {out_json}: {exc}".replace("\n", " ")) from None


def stop(proc: subprocess.Popen, grace: float = 30.0) -> str:
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


__all__ = ["ensure_venv", "last_line", "pip", "pip_error", "run_module", "run_script", "stamp_matches", "stop",
           "peer_requirements", "torch_requirement", "venv_python"]
