"""What made a run: ``provenance.json`` in every run directory, and ``raysoft --version``.

Written when the run starts (atomically, :func:`raysoft.results.atomic_path`): raysoft's version
(and the git commit, with ``+dirty`` for uncommitted changes, where the package sits in a
checkout), Ray's, torch's and Python's versions, the machine (OS, CPU model and count, GPUs) and
the device the clients train on (``train.device`` and what it resolves to). A resume adds the
same facts of the machine that continued it under ``resumes``, and says in one line on stderr
when a version differs from the run's start. Versions are read from the installed packages'
metadata: nothing here imports Ray or torch.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from .results import atomic_path

if TYPE_CHECKING:
    from .config import Config

FILE = "provenance.json"
VERSIONS = ("raysoft", "commit", "ray", "torch", "python")  # compared on resume


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def raysoft_version() -> str:
    """The installed raysoft's version (its metadata: raysoft is always installed, its built-in
    plug-ins are entry points)."""
    return _version("raysoft") or "unknown"


def git_commit() -> str | None:
    """The commit of the checkout the imported raysoft package sits in (``+dirty`` with uncommitted
    changes to tracked files), or None for an installed package."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """The machine's GPU names (nvidia-smi, else torch's view where torch is already imported)."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout
            return [line.strip() for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    cuda = getattr(sys.modules.get("torch"), "cuda", None)  # None too while another thread imports torch
    if cuda is not None and cuda.is_available():
        return [cuda.get_device_name(i) for i in range(cuda.device_count())]
    return []


def device_used(cfg: Config, gpus: list[str]) -> str:
    """What ``train.device`` resolves to for this run's clients: ``cpu`` or ``cuda``."""
    spec = cfg.train.device
    if spec != "auto":
        return spec
    if cfg.ray.backend == "ray":  # an actor trains on CUDA only with a GPU share
        return "cuda" if cfg.ray.num_gpus_per_actor > 0 and gpus else "cpu"
    return "cuda" if gpus else "cpu"


class Versions(TypedDict):
    """raysoft's version and commit (None outside a checkout), Ray's and torch's (None where not
    installed) and Python's."""

    raysoft: str
    commit: str | None
    ray: str | None
    torch: str | None
    python: str


def versions() -> Versions:
    """raysoft's version and commit, Ray's, torch's and Python's."""
    return {"raysoft": raysoft_version(), "commit": git_commit(), "ray": _version("ray"),
            "torch": _version("torch"), "python": platform.python_version()}


def collect(cfg: Config) -> dict[str, object]:
    """The provenance of a run of ``cfg`` started now, on this machine."""
    gpus = _gpus()
    return {**versions(), "os": f"{platform.system()} {platform.release()}", "machine": platform.machine(),
            "cpu": _cpu_model(), "cpus": os.cpu_count(), "gpus": gpus, "host": platform.node(),
            "device": cfg.train.device, "device_used": device_used(cfg, gpus), "backend": cfg.ray.backend}


def version_line() -> str:
    """``raysoft --version``: ``raysoft 0.1.0 (commit abc123) ray 2.60.0 torch 2.14.1 python 3.11.7``."""
    v = versions()
    commit = f" (commit {v['commit'][:12]}{'+dirty' if v['commit'].endswith('+dirty') else ''})" if v["commit"] else ""
    return (f"raysoft {v['raysoft']}{commit}  ray {v['ray'] or '-'}  torch {v['torch'] or '-'}  "
            f"python {v['python']}")


def _write(run_dir: Path, blob: Mapping[str, object]) -> None:
    with atomic_path(run_dir / FILE) as tmp:
        tmp.write_text(json.dumps(blob, indent=2) + "\n")


def write(run_dir: Path, cfg: Config) -> None:
    """Write a new run's ``provenance.json``."""
    _write(run_dir, collect(cfg))


def read(run_dir: Path) -> dict[str, Any] | None:
    """A run's provenance, or None (a run from before provenance was recorded, or unreadable)."""
    try:
        blob = json.loads((Path(run_dir) / FILE).read_text())
    except (OSError, ValueError):
        return None
    return blob if isinstance(blob, dict) else None


def differences(before: Mapping[str, object], now: Mapping[str, object]) -> list[str]:
    """``torch 2.13.0 -> 2.14.1`` for each version that differs."""
    return [f"{key} {before.get(key)} -> {now.get(key)}" for key in VERSIONS if before.get(key) != now.get(key)]


def on_resume(run_dir: Path, cfg: Config) -> str | None:
    """Record the resuming machine under ``resumes``; the one line that says which versions
    differ from the run's start (None when all are the same)."""
    before = read(run_dir)
    now = collect(cfg)
    if before is None:
        _write(run_dir, {**now, "note": "recorded at a resume: the run's start recorded no provenance"})
        return None
    _write(run_dir, {**before, "resumes": [*before.get("resumes", []), now]})
    diff = differences(before, now)
    return f"resuming on other versions than the run started with: {', '.join(diff)}" if diff else None


__all__ = ["FILE", "collect", "differences", "on_resume", "read", "version_line", "versions", "write"]
