"""Where ``raysoft bench`` finds its peers (Flower, pfl-research): their harnesses, and their venvs.

The harnesses (the peers' venvs, and the scripts those venvs' python runs) live in the
``benchmarks/`` folder of a raysoft checkout, beside ``raysoft/``: they are not installed with
the package. :func:`harness_dir` finds the folder (``$RAYSOFT_BENCHMARKS``, else the one beside
the imported ``raysoft``), :func:`load_harness` imports it as the package ``benchmarks``; without
it the bench runs raysoft, the bare loop and the floors, and says in one line
(:data:`MISSING`) why the peers' rows are left out. Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError

ENV = "RAYSOFT_BENCHMARKS"  # the benchmarks/ folder, where raysoft is not imported from a checkout
MARKERS = ("__init__.py", "venvs.py", "flower_env.py", "pfl_env.py")  # what makes a folder the peers' harness


def peer_venv(peer: str) -> Path:
    """Where a peer's venv lives by default: outside any checkout, in the user's cache
    (``$RAYSOFT_PEER_VENVS``, else ``$XDG_CACHE_HOME/raysoft``, else ``~/.cache/raysoft``), as
    ``venv-<peer>``: several GB each, made once and shared by every checkout and test run."""
    home = os.environ.get("RAYSOFT_PEER_VENVS")
    if home:
        return Path(home) / f"venv-{peer}"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "raysoft" / f"venv-{peer}"


def _is_harness(path: Path) -> bool:
    return all((path / name).is_file() for name in MARKERS)


def checkout_dir() -> Path:
    """The ``benchmarks/`` folder beside the imported ``raysoft`` package (in a checkout)."""
    return Path(__file__).resolve().parents[2] / "benchmarks"


def harness_dir() -> Path | None:
    """The peers' harness folder: ``$RAYSOFT_BENCHMARKS`` if set (:class:`ConfigError`, one
    line, if it is no such folder), else the checkout's ``benchmarks/``; None without one."""
    given = os.environ.get(ENV)
    if given:
        path = Path(given).expanduser().resolve()
        if not _is_harness(path):
            raise ConfigError(f"{ENV}={given}: not the benchmarks/ folder of a raysoft checkout "
                              f"(no {', '.join(MARKERS)} there)")
        return path
    path = checkout_dir()
    return path if _is_harness(path) else None


MISSING = ("their harnesses are in the benchmarks/ folder of a raysoft checkout, not installed with raysoft "
           f"(run raysoft from a checkout, or set {ENV} to that folder)")


def load_harness() -> ModuleType | None:
    """The peers' harness as the package ``benchmarks`` (imported from :func:`harness_dir`, once);
    None where there is none. A different ``benchmarks`` already imported is a
    :class:`ConfigError` (one line)."""
    path = harness_dir()
    if path is None:
        return None
    loaded = sys.modules.get("benchmarks")
    if loaded is not None:
        where = [Path(p).resolve() for p in getattr(loaded, "__path__", [])]
        if path not in where:
            raise ConfigError(f"another package named benchmarks is imported ({', '.join(map(str, where))}), "
                              f"not the peers' harness at {path}")
        return loaded
    spec = importlib.util.spec_from_file_location("benchmarks", path / "__init__.py",
                                                  submodule_search_locations=[str(path)])
    if spec is None or spec.loader is None:  # pragma: no cover - a folder with an __init__.py always has one
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmarks"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["benchmarks"]
        raise
    return module


def harness_module(name: str) -> ModuleType:
    """``benchmarks.<name>`` of the peers' harness (``flower_env``, ``pfl_env``, ``venvs``);
    :class:`ConfigError` (one line, :data:`MISSING`) without the harness."""
    if load_harness() is None:
        raise ConfigError(f"the Flower and pfl peers: {MISSING}")
    return importlib.import_module(f"benchmarks.{name}")


__all__ = ["ENV", "MISSING", "checkout_dir", "harness_dir", "harness_module", "load_harness", "peer_venv"]
