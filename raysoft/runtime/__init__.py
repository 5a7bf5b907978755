"""The runtime: drives an algorithm's rounds or stream through an executor, Ray-free.

``make_coordinator(cfg, executor, run_id, run_dir, resume)`` picks the coordinator the
algorithm needs (:class:`~raysoft.runtime.rounds.RoundCoordinator` for synchronous rounds,
:class:`~raysoft.runtime.streams.StreamCoordinator` for streams), wraps the executor in a
:class:`~raysoft.runtime.faults.FaultInjector` when the config injects faults, and makes every
piece of the coordinator's own work run with one torch thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..algorithms import is_stream, make_algorithm
from ..config import Config
from .executor import Executor
from .faults import FaultInjector
from .recording import CoordinatorBase
from .rounds import RoundCoordinator
from .streams import StreamCoordinator
from .threads import torch_threads

if TYPE_CHECKING:
    import pyarrow as pa


class OneThread:
    """Wraps a coordinator so that its own work (aggregation, evaluation, the server steps)
    always runs with one torch thread, whichever process hosts it."""

    def __init__(self, coord: CoordinatorBase) -> None:
        self.coord = coord

    def advance(self, stop: bool = False) -> dict[str, Any]:
        with torch_threads(1):
            return self.coord.advance(stop)

    def results(self) -> tuple[dict[str, pa.Table], dict[str, object]]:
        with torch_threads(1):
            tables, summary = self.coord.results()
        if self.coord.stopped_at is not None:  # a callback ended the run early
            summary.update(stopped_early=True, stopped_at=self.coord.stopped_at)
        return tables, summary


def make_coordinator(cfg: Config, executor: Executor, run_id: str, run_dir: str | None = None,
                     resume: bool = False) -> OneThread:
    """The coordinator of one run over ``executor`` (continued from ``run_dir``'s checkpoint
    with ``resume``)."""
    with torch_threads(1):
        algorithm = make_algorithm(cfg.algorithm)
        if cfg.faults:
            executor = FaultInjector(executor, cfg.faults)
        coord: CoordinatorBase
        if is_stream(algorithm):
            coord = StreamCoordinator(cfg, executor, algorithm, run_id, run_dir=run_dir)
        else:
            coord = RoundCoordinator(cfg, executor, algorithm, run_id, run_dir=run_dir)
        if resume:
            coord.resume()
        return OneThread(coord)


__all__ = ["CoordinatorBase", "Executor", "FaultInjector", "OneThread", "RoundCoordinator", "StreamCoordinator",
           "make_coordinator", "torch_threads"]
