"""The algorithms (pure client and server halves, Ray-free), one module each.

``make_algorithm(settings)`` builds the algorithm object of a config's ``algorithm`` section; its
``name`` is looked up by :mod:`raysoft.plugins`, which finds the built-ins through the entry
points raysoft's ``pyproject.toml`` registers (group ``raysoft.algorithms``), as it finds a
user's.
Synchronous algorithms expose ``round``; the asynchronous streams (CCFL, FedSoft-Async, the
stream Local) expose the stream protocol of :mod:`raysoft.algorithms.stream`.
"""

from __future__ import annotations

from typing import Any

from ..config import AlgorithmConfig
from ..plugins import PluginError, resolve
from .base import Algorithm, ClientCall, ClientContext, Plan, Reduced, Reduction, ServerContext, WeightedMean
from .stream import StreamAlgorithm, StreamConfig


def make_algorithm(settings: AlgorithmConfig) -> Any:
    """The algorithm object for a config's ``algorithm`` section: the class its ``name`` names
    (:func:`raysoft.plugins.resolve`; built-ins and plug-ins alike), made from the settings."""
    algorithm = resolve("algorithms", settings.name)(settings)
    ops = getattr(algorithm, "client_ops", None)
    if not isinstance(ops, dict) or not all(callable(op) for op in ops.values()):
        raise PluginError(f"algorithm {settings.name!r}: client_ops must be a dict of op name -> "
                          "op(ctx, client_state, payload, t) -> (client_state, result)")
    return algorithm


def is_stream(algorithm: Any) -> bool:
    """An asynchronous, client-driven stream (not synchronous rounds)."""
    return isinstance(algorithm, StreamAlgorithm)


__all__ = ["Algorithm", "ClientCall", "ClientContext", "Plan", "Reduced", "Reduction",
           "ServerContext", "StreamAlgorithm", "StreamConfig", "WeightedMean", "is_stream", "make_algorithm"]
