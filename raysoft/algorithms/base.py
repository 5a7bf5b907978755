"""The shape every synchronous algorithm has, independent of where clients run.

An algorithm is a module of pure functions plus one object that wires them, made from the
algorithm's settings (its section of the config, :class:`~raysoft.config.AlgorithmConfig`):
``Algo(settings)``; the object reads them as ``self.settings``.

* ``init_server(ctx) -> state`` and ``init_client(ctx) -> client_state``;
* ``round(ctx, state, t)``: a generator expressing one round as a sequence of client calls.
  It yields :class:`ClientCall` requests (an operation, the clients that run it, and one
  payload broadcast to all of them), receives ``{client_id: result}`` for each, and finally
  returns ``(new_state, diagnostics)``. The backend decides where and how the calls run; the
  algorithm never knows about Ray. A call with ``reduce`` (a :class:`Reduction`) receives a
  :class:`Reduced` instead: a weighted sum of the finite results planned from their small
  parts, which a backend may accumulate where the clients run (``ray.reduce_in_actors``), one
  tensor per actor;
* ``client_ops``: the client half, ``op(ctx, client_state, payload, t) -> (client_state, result)``;
  ``readonly_ops`` name the ops that leave the client state as it was (default: ``evaluate``) and
  ``stateless_ops`` those that do not read it (they get ``None``), so a host that keeps states
  on disk (``ray.client_state: disk``) neither writes back nor loads them;
* ``centers(state)`` (models evaluated on the holdout sets) and ``weights(state)``
  (each client's importance / mixture weights over the centers, or ``None``);
* ``eval_payload(state)``: what the client op ``evaluate`` receives. Its results are metric
  dicts; keys starting with ``_`` are not metrics and go to ``absorb_eval(state, results)``
  when the algorithm defines it (IFCA: every client's chosen center).

A round's diagnostics with ``weights_updated: True`` make the coordinator record the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import torch
from torch import nn

from ..config import AlgorithmConfig, Config
from ..data import ClientData
from ..models import DataInfo, build_model
from ..params import Term, add_terms
from ..rng import torch_generator


def split_result(result: Any, part: int | None) -> tuple[torch.Tensor, Any]:
    """(the summed part, the rest) of one client's result: element ``part`` of a result tuple
    and the tuple with it set to None, or the whole result and None."""
    if part is None:
        return result, None
    return result[part], tuple(None if i == part else r for i, r in enumerate(result))


@dataclass
class Plan:
    """How a call's results are summed: ``acc = start`` (zeros like the first term if None),
    then, for every client k in id order, ``acc[row] += coef * r_k`` (the whole ``acc`` when
    ``row`` is None), with ``terms[k] = (row, coef)`` (or a list of them: one result added to
    several rows) and r_k the summed part of k's result."""

    start: torch.Tensor | None
    terms: Mapping[int, Term | list[Term]]

    def apply(self, parts: Mapping[int, torch.Tensor], group: int | None = None) -> torch.Tensor | None:
        """The sum, ``parts[k]`` being client k's summed part, added into ``start`` in place
        (:func:`~raysoft.params.add_terms`); ``start`` (None too) when there is no term.
        ``group``: the tree shape instead of the chain (:meth:`groups`, :func:`pairwise`)."""
        if not self.terms:
            return self.start
        if group is None:
            return add_terms(self.terms, parts, self.start)
        sums = [add_terms(terms, parts, self.zero()) for terms in self.groups(group)]
        return self.finish(pairwise(sums))

    # the tree shape (``ray.sum_shape: tree``): its association is fixed by the client ids alone
    def groups(self, group: int) -> list[dict[int, Term | list[Term]]]:
        """The terms in runs of ``group`` consecutive clients (in id order): each run is summed
        from zeros, then the runs' sums pairwise (:func:`pairwise`), then added to ``start``."""
        ids = sorted(self.terms)
        return [{k: self.terms[k] for k in ids[i : i + group]} for i in range(0, len(ids), group)]

    def zero(self) -> torch.Tensor | None:
        """Where a run of the tree starts: zeros like ``start`` (None: like the first term)."""
        return None if self.start is None else torch.zeros_like(self.start)

    def finish(self, total: torch.Tensor) -> torch.Tensor:
        """``start + total`` (into ``start``), or ``total`` when there is no start."""
        return total if self.start is None else self.start.add_(total)


def leaves_state(algorithm: Any, op: str) -> bool:
    """Whether client op ``op`` of ``algorithm`` leaves the client's state as it was (its
    ``readonly_ops``, which read it, or its ``stateless_ops``, which do not)."""
    return op in getattr(algorithm, "stateless_ops", ()) or op in getattr(algorithm, "readonly_ops", ("evaluate",))


def pairwise(sums: list[torch.Tensor]) -> torch.Tensor:
    """The sum of ``sums`` as a balanced tree of additions, in order: level by level,
    ``[s0 + s1, s2 + s3, ...]`` (an odd last one carried up), so log2(n) levels deep."""
    if not sums:
        raise ValueError("pairwise: nothing to add")
    while len(sums) > 1:
        sums = [torch.add(a, b) for a, b in zip(sums[0::2], sums[1::2])] + (sums[-1:] if len(sums) % 2 else [])
    return sums[0]



def summed(plan: Plan, parts: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """``plan.apply(parts)`` for a plan that has a start or a term (an empty sum is an error)."""
    out = plan.apply(parts)
    if out is None:
        raise ValueError("an empty sum: the plan has no start and no term")
    return out


class Reduction:
    """A sum of the clients' results that a backend may run where the clients are (in client-id
    order, so the same number wherever it runs). ``part``: the element of a result tuple that is
    summed (None: the whole result); the rest of each result (with that element None) comes
    back per client, and :meth:`plan` turns it into the sum's coefficients."""

    part: int | None = None

    def plan(self, rest: dict[int, Any]) -> Plan:
        """The sum over the clients in ``rest`` (those whose result is finite). Its ``start`` is
        a new tensor (the sum is added into it), never one of the reduction's own."""
        raise NotImplementedError


@dataclass(frozen=True)
class WeightedMean(Reduction):
    """sum_k n_k r_k / sum_k n_k over the finite results, n = ``sizes`` (FedAvg)."""

    sizes: np.ndarray

    def coefficients(self, ids: list[int]) -> dict[int, float]:
        """n_k / sum n over ``ids`` (ascending), the weights ``weighted_sum`` applies."""
        total = float(sum(self.sizes[k] for k in ids))
        return {k: float(self.sizes[k] / total) for k in sorted(ids)}

    def plan(self, rest: dict[int, Any]) -> Plan:
        return Plan(None, {k: (None, c) for k, c in self.coefficients(list(rest)).items()})


@dataclass
class Reduced:
    """What a call with ``reduce`` returns: the sum (None when no result was finite and the
    plan has no start), the clients whose results are in it (ascending), and the rest of each
    of their results."""

    value: torch.Tensor | None
    clients: list[int]
    rest: dict[int, Any]


@dataclass(frozen=True)
class ClientCall:
    """Ask ``clients`` to run client op ``op`` with the broadcast ``payload``; with ``reduce``,
    return only the reduction of their results."""

    op: str
    clients: list[int]
    payload: dict[str, Any] = field(default_factory=dict)
    reduce: Reduction | None = None


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
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where the host runs its clients

    def new_model(self, *stream: int | str) -> nn.Module:
        """A model initialised from the random stream (seed, *stream), on :attr:`device` (drawn
        on the CPU, so the same numbers on every device)."""
        return build_model(self.cfg.model, self.info, torch_generator(self.cfg.seed, *stream)).to(self.device)

    def tensor(self, value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``value`` (an array, a list, a tensor) as a tensor on :attr:`device`: how a client op
        makes a tensor from a payload's numpy arrays."""
        return torch.as_tensor(value, dtype=dtype, device=self.device)


# a round yields calls and is sent each call's results: {client: result}, or a Reduced for a call with ``reduce``
RoundGenerator = Generator[ClientCall, Any, tuple[Any, dict[str, Any]]]
ClientOp = Callable[[ClientContext, Any, dict[str, Any], int], tuple[Any, Any]]


S = TypeVar("S", bound=AlgorithmConfig)


class Configured(Generic[S]):
    """An algorithm object made from its settings (its ``Settings``), which it reads as ``self.settings``."""

    name: str
    readonly_ops: tuple[str, ...] = ("evaluate",)
    stateless_ops: tuple[str, ...] = ()

    def __init__(self, settings: S) -> None:
        self.settings = settings


class Algorithm(Protocol):
    name: str
    settings: AlgorithmConfig
    client_ops: dict[str, ClientOp]

    def init_server(self, ctx: ServerContext) -> Any: ...

    def init_client(self, ctx: ClientContext) -> Any: ...

    def round(self, ctx: ServerContext, state: Any, t: int) -> RoundGenerator: ...

    def centers(self, state: Any) -> torch.Tensor: ...

    def weights(self, state: Any) -> np.ndarray | None: ...

    def eval_payload(self, state: Any) -> dict[str, Any]: ...
