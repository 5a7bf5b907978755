"""The shape every synchronous algorithm has, independent of where clients run.

An algorithm is a module of pure functions plus one object that wires them:

* ``init_server(ctx) -> state`` and ``init_client(ctx) -> client_state``;
* ``round(ctx, state, t)``: a generator expressing one round as a sequence of client calls.
  It yields :class:`ClientCall` requests (an operation, the clients that run it, and one
  payload broadcast to all of them), receives ``{client_id: result}`` for each, and finally
  returns ``(new_state, diagnostics)``. The backend decides where and how the calls run; the
  algorithm never knows about Ray. A call with ``reduce`` (a :class:`WeightedMean`) receives
  a :class:`Reduced` instead: the weighted mean of the finite results, which a backend may
  accumulate where the clients run (``ray.reduce_in_actors``), one vector per actor;
* ``client_ops``: the client half, ``op(ctx, client_state, payload, t) -> (client_state, result)``;
* ``centers(state)`` (models evaluated on the holdout sets) and ``weights(state)``
  (each client's importance / mixture weights over the centers, or ``None``);
* ``eval_payload(state)``: what the client op ``evaluate`` receives. Its results are metric
  dicts; keys starting with ``_`` are not metrics and go to ``absorb_eval(state, results)``
  when the algorithm defines it (IFCA: every client's chosen center).

A round's diagnostics with ``weights_updated: True`` make the coordinator record the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Protocol

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..data import ClientData
from ..models import DataInfo, build_model
from ..rng import torch_generator


@dataclass(frozen=True)
class WeightedMean:
    """sum_k n_k r_k / sum_k n_k over the clients whose result r_k is finite, with
    n = ``sizes``, accumulated in client-id order (:func:`~raysoft.params.weighted_sum`):
    the same number wherever it is summed."""

    sizes: np.ndarray

    def coefficients(self, ids: list[int]) -> dict[int, float]:
        """n_k / sum n over ``ids`` (ascending), the weights ``weighted_sum`` applies."""
        total = float(sum(self.sizes[k] for k in ids))
        return {k: float(self.sizes[k] / total) for k in sorted(ids)}


@dataclass
class Reduced:
    """What a call with ``reduce`` returns: the reduced vector (None when no result was
    finite) and the clients whose results are in it, ascending."""

    vector: torch.Tensor | None
    clients: list[int]


@dataclass(frozen=True)
class ClientCall:
    """Ask ``clients`` to run client op ``op`` with the broadcast ``payload``; with ``reduce``,
    return only the reduction of their results."""

    op: str
    clients: list[int]
    payload: dict[str, Any] = field(default_factory=dict)
    reduce: WeightedMean | None = None


@dataclass
class ServerContext:
    """What the server half may know: the config, client sizes, and the model shape."""

    cfg: Config
    sizes: np.ndarray
    info: DataInfo

    @property
    def num_clients(self) -> int:
        return int(self.sizes.shape[0])

    def new_model(self, *stream: int | str) -> nn.Module:
        """A model initialised from the random stream (seed, *stream)."""
        return build_model(self.cfg.model, self.info, torch_generator(self.cfg.seed, *stream))


@dataclass
class ClientContext:
    """What the client half may know: its id, its data, and a scratch model."""

    cfg: Config
    client: int
    data: ClientData
    info: DataInfo
    scratch: nn.Module  # a model whose parameters client ops may overwrite freely

    def new_model(self, *stream: int | str) -> nn.Module:
        return build_model(self.cfg.model, self.info, torch_generator(self.cfg.seed, *stream))


RoundGenerator = Generator[ClientCall, dict[int, Any], tuple[Any, dict[str, Any]]]
ClientOp = Callable[[ClientContext, Any, dict[str, Any], int], tuple[Any, Any]]


class Algorithm(Protocol):
    name: str
    client_ops: dict[str, ClientOp]

    def init_server(self, ctx: ServerContext) -> Any: ...

    def init_client(self, ctx: ClientContext) -> Any: ...

    def round(self, ctx: ServerContext, state: Any, t: int) -> RoundGenerator: ...

    def centers(self, state: Any) -> torch.Tensor: ...

    def weights(self, state: Any) -> np.ndarray | None: ...

    def eval_payload(self, state: Any) -> dict[str, Any]: ...
