"""Algorithm registry: name -> algorithm class (pure client and server halves, Ray-free).

``make_algorithm(settings)`` builds the algorithm object of a config's ``algorithm`` section.
Synchronous algorithms expose ``round``; the asynchronous streams (CCFL, FedSoft-Async, the
stream Local) expose the stream protocol of :mod:`raysoft.algorithms.stream`.
"""

from __future__ import annotations

from typing import Any

from ..config import AlgorithmConfig
from .base import Algorithm, ClientCall, ClientContext, Plan, Reduced, Reduction, ServerContext, WeightedMean
from .ccfl import CCFL
from .fedavg import FedAvg, Local
from .fedem import FedEM
from .fedsoft import FedSoft
from .fedsoft_async import FedSoftAsync
from .fpfc import FPFC
from .ifca import IFCA
from .local_stream import LocalStream
from .stream import StreamAlgorithm

ALGORITHMS: dict[str, type] = {
    "fedsoft": FedSoft, "ifca": IFCA, "fedem": FedEM, "fedavg": FedAvg, "local": Local,
    "fpfc": FPFC, "fpfc_l1": FPFC, "ccfl": CCFL, "fedsoft_async": FedSoftAsync, "local_stream": LocalStream,
}


def make_algorithm(settings: AlgorithmConfig) -> Any:
    """The algorithm object for a config's ``algorithm`` section."""
    try:
        return ALGORITHMS[settings.name](settings)
    except KeyError:
        raise ValueError(f"unknown algorithm {settings.name!r}") from None


def is_stream(algorithm: Any) -> bool:
    """An asynchronous, client-driven stream (not synchronous rounds)."""
    return isinstance(algorithm, StreamAlgorithm)


__all__ = ["ALGORITHMS", "Algorithm", "ClientCall", "ClientContext", "Plan", "Reduced", "Reduction",
           "ServerContext", "StreamAlgorithm", "WeightedMean", "is_stream", "make_algorithm"]
