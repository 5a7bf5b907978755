"""The in-process backend (``ray.backend: inprocess``): every client in one ClientHost and the
coordinator in this process, no Ray started. It gives the same numbers as the Ray backend for
the same seed, so tests, debugging and the one-process measurements of docs/results.md use it."""

from __future__ import annotations

from ..config import Config
from ..devices import choose, deterministic
from ..runtime import make_coordinator
from .drive import drive
from .host import ClientHost


def run(cfg: Config, run_id: str, on_progress, run_dir: str | None = None, resume: bool = False):
    device = choose(cfg.train.device)
    with deterministic(device):  # the caller's own flags back when the run ends
        host = ClientHost(cfg, range(cfg.data.clients), device=str(device))
        coord = make_coordinator(cfg, host, run_id, run_dir=run_dir, resume=resume)
        drive(coord.advance, on_progress)
        return coord.results()
