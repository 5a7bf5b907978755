"""Execution backends: where the clients of an experiment run.

Both backends drive the same Ray-free coordinators (:mod:`raysoft.runtime`) over the same
:class:`~raysoft.backends.host.ClientHost` code, so they give identical numbers.

``run(cfg, run_id, on_progress) -> (tables, summary)``
"""

from __future__ import annotations

from ..config import Config
from .drive import ProgressFn


def run_backend(cfg: Config, run_id: str, on_progress: ProgressFn, run_dir: str | None = None, resume: bool = False):
    """Run (or, with ``resume``, continue from ``run_dir``'s checkpoint) the experiment on the
    backend the config names."""
    if cfg.ray.backend == "inprocess":
        from .inprocess import run
    else:
        from .ray_backend import run
    return run(cfg, run_id, on_progress, run_dir=run_dir, resume=resume)
