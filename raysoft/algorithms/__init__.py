"""Algorithm registry: name -> algorithm object (pure client and server halves)."""

from __future__ import annotations

from .base import Algorithm, ClientCall, ClientContext, Plan, Reduced, Reduction, ServerContext, WeightedMean
from .fedavg import FedAvg, Local
from .fedem import FedEM
from .fedsoft import FedSoft
from .fpfc import FPFC
from .ifca import IFCA

ALGORITHMS: dict[str, Algorithm] = {
    "fedsoft": FedSoft(), "ifca": IFCA(), "fedem": FedEM(), "fedavg": FedAvg(), "local": Local(),
    "fpfc": FPFC(), "fpfc_l1": FPFC(),
}


def get_algorithm(name: str) -> Algorithm:
    from ..config import STREAM_ALGORITHMS

    if name in STREAM_ALGORITHMS:  # the client half of the asynchronous streams
        from ..stream import StreamAlgorithm

        return StreamAlgorithm(name)  # type: ignore[return-value]
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}") from None


__all__ = ["ALGORITHMS", "Algorithm", "ClientCall", "ClientContext", "ServerContext", "get_algorithm"]
