"""The algorithms (pure client and server halves, Ray-free), one module each, and their settings
(:mod:`raysoft.algorithms.settings`, light: no torch).

``make_algorithm(settings)`` builds the algorithm object of a config's ``algorithm`` section; its
``name`` is looked up by :mod:`raysoft.plugins`, which finds the built-ins through the entry
points raysoft's ``pyproject.toml`` registers (group ``raysoft.algorithms``), as it finds a
user's. Synchronous algorithms expose ``round``; the asynchronous streams (CCFL, FedSoft-Async,
the stream Local) expose the stream protocol of :mod:`raysoft.algorithms.stream`.

This package's names are imported on first use (PEP 562), so that importing
``raysoft.algorithms.settings`` (a driver validating a config) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from ..config import AlgorithmConfig
    from .base import (
        Algorithm,
        ClientCall,
        ClientContext,
        Clustered,
        EngineAlgorithm,
        EvalResult,
        Plan,
        Reduced,
        Reduction,
        RoundResult,
        ServerContext,
        Update,
        WeightedMean,
    )
    from .settings import StreamConfig
    from .stream import StreamAlgorithm

_LAZY = {
    "Algorithm": "base", "ClientCall": "base", "ClientContext": "base", "Clustered": "base", "EvalResult": "base",
    "Plan": "base", "Reduced": "base", "Reduction": "base", "RoundResult": "base", "ServerContext": "base",
    "Update": "base", "WeightedMean": "base",
    "StreamAlgorithm": "stream", "StreamConfig": "settings",
}


def make_algorithm(settings: AlgorithmConfig) -> EngineAlgorithm | StreamAlgorithm:
    """The algorithm object for a config's ``algorithm`` section: the class its ``name`` names
    (its ``plugin``, :meth:`raysoft.plugins.Plugin.load`; built-ins and plug-ins alike), made from the settings,
    with the defaults of the optional attributes it lacks (:func:`~.base.with_defaults`)."""
    from ..plugins import PluginError
    from .base import with_defaults

    algorithm: Algorithm | StreamAlgorithm = settings.plugin.load()(settings)
    ops = getattr(algorithm, "client_ops", None)
    if not isinstance(ops, dict) or not all(callable(op) for op in ops.values()):
        raise PluginError(f"algorithm {settings.name!r}: client_ops must be a dict of op name -> "
                          "op(ctx, client_state, payload, t) -> (client_state, result)")
    if "evaluate" not in ops and not is_stream(algorithm):  # the coordinator evaluates every client with it
        raise PluginError(f"algorithm {settings.name!r}: client_ops has no 'evaluate' op (its ops: "
                          f"{', '.join(sorted(ops)) or 'none'}); add evaluate(ctx, client_state, payload, t) -> "
                          "(client_state, metrics)")
    return algorithm if is_stream(algorithm) else with_defaults(algorithm)


def is_stream(algorithm: object) -> TypeIs[StreamAlgorithm]:
    """An asynchronous, client-driven stream (not synchronous rounds)."""
    from .stream import StreamAlgorithm

    return isinstance(algorithm, StreamAlgorithm)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Algorithm", "ClientCall", "ClientContext", "Clustered", "EvalResult", "Plan", "Reduced", "Reduction",
           "RoundResult", "ServerContext", "StreamAlgorithm", "StreamConfig", "Update", "WeightedMean", "is_stream",
           "make_algorithm"]
