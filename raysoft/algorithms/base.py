"""The shape every synchronous algorithm has, independent of where clients run.

An algorithm is a module of pure functions plus one object that wires them, made from the
algorithm's settings (its section of the config, :class:`~raysoft.config.AlgorithmConfig`):
``Algo(settings)``; the object reads them as ``self.settings``. :class:`Algorithm` is its
protocol (the type the engine takes):

* ``init_server(ctx) -> state`` and ``init_client(ctx) -> client_state``;
* ``round(ctx, state, t)``: a generator expressing one round as a sequence of client calls.
  It yields :class:`ClientCall` requests (an operation, the clients that run it, and one
  payload broadcast to all of them), receives ``{client_id: result}`` for each, and finally
  returns a :class:`RoundResult` (the new state, the round's diagnostics, whether the weights
  changed). The backend decides where and how the calls run; the algorithm never knows about
  Ray. A call with ``reduce`` (a :class:`Reduction`) receives a :class:`Reduced` instead: a
  weighted sum of the finite results planned from their named extras, which a backend may
  accumulate where the clients run (``ray.reduce_in_actors``), one tensor per actor; a client
  op under such a call returns a tensor (summed whole) or an :class:`Update` (the tensor
  summed and named extras);
* ``client_ops``: the client half, ``op(ctx, client_state, payload, t) -> (client_state, result)``;
  ``readonly_ops`` name the ops that leave the client state as it was (default: ``evaluate``) and
  ``stateless_ops`` those that do not read it (they get ``None``), so a host that keeps states
  on disk (``ray.client_state: disk``) neither writes back nor loads them;
* ``eval_payload(state)``: what the client op ``evaluate`` receives. Its result is an
  :class:`EvalResult` (metrics, and an ``extra`` for ``absorb_eval(state, results)`` when the
  algorithm defines it: IFCA's chosen center) or a plain dict of metrics (no key starting
  with ``_``: extras go in an EvalResult);
* optional, for algorithms with models to score on the holdout sets (:class:`Clustered`):
  ``centers(state)`` (the models evaluated on the holdout sets) and ``weights(state)`` (each
  client's importance / mixture weights over the centers, or ``None``). An algorithm without
  them has no center rows and no weight records.

The earlier forms (a round's ``(new_state, diagnostics_dict)``, an ``evaluate`` dict's
``_``-prefixed extras, a reduced call's positional result tuple) are errors of one line that
say what to write instead (CHANGELOG.md).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np
import torch
from torch import nn

from ..config import AlgorithmConfig, Config
from ..data import ClientData
from ..errors import PluginFailure
from ..models import DataInfo, build_model
from ..params import Term, add_terms
from ..rng import torch_generator

T = TypeVar("T")
S = TypeVar("S", bound=AlgorithmConfig)  # an algorithm's settings class


@dataclass(frozen=True)
class Update:
    """What a client op returns to a call with ``reduce`` when the server needs more than the
    sum: ``summed``, the tensor the reduction adds up, and ``extras``, named values (small: a
    chosen center, a distance, mixture weights) that reach the reduction's :meth:`Reduction.plan`
    and the round (:attr:`Reduced.extras`) by name. A plain tensor is an Update without extras."""

    summed: torch.Tensor
    extras: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extras", dict(self.extras))  # a dict: walked (sent, counted) as one


def split_result(result: object, op: str) -> tuple[torch.Tensor, dict[str, object]]:
    """(the summed tensor, the named extras) of one client's result to a reduced call of client
    op ``op``: an :class:`Update`'s, or a tensor and no extras. Anything else (a positional
    tuple, the earlier form) is a :class:`~raysoft.errors.PluginFailure` of one line saying
    what to return instead."""
    if isinstance(result, Update):
        return result.summed, dict(result.extras)
    if isinstance(result, torch.Tensor):
        return result, {}
    what = "a tuple" if isinstance(result, tuple) else type(result).__name__
    raise PluginFailure(f"client op {op!r} returned {what} to a reduced call: return "
                        "raysoft.sdk.Update(summed=..., extras={...}) (or a tensor)")


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
        return self.add_start(pairwise(sums, torch.add))

    # the tree shape (``ray.sum_shape: tree``): its association is fixed by the client ids alone
    def groups(self, group: int) -> list[dict[int, Term | list[Term]]]:
        """The terms in runs of ``group`` consecutive clients (in id order): each run is summed
        from zeros, then the runs' sums pairwise (:func:`pairwise`), then added to ``start``."""
        ids = sorted(self.terms)
        return [{k: self.terms[k] for k in ids[i : i + group]} for i in range(0, len(ids), group)]

    def zero(self) -> torch.Tensor | None:
        """Where a run of the tree starts: zeros like ``start`` (None: like the first term)."""
        return None if self.start is None else torch.zeros_like(self.start)

    def add_start(self, total: torch.Tensor) -> torch.Tensor:
        """``start + total`` (into ``start``), or ``total`` when there is no start."""
        return total if self.start is None else self.start.add_(total)


def leaves_state(algorithm: OptionalHooks, op: str) -> bool:
    """Whether client op ``op`` of ``algorithm`` leaves the client's state as it was (its
    ``readonly_ops``, which read it, or its ``stateless_ops``, which do not; the engine's
    :data:`SERVED_OP` too), of any algorithm, synchronous or stream, where it declares them."""
    return op == SERVED_OP or op in algorithm.stateless_ops or op in algorithm.readonly_ops


# ----------------------------------------------------------------------------- the served model
SERVED_OP = "raysoft_served"  # the engine's client op: each client's personalised model on its test split
SERVED_MODELS, SERVED_INDEX = "raysoft_served_models", "raysoft_served_index"  # the default's payload


def default_served(algorithm: OptionalHooks, state: Any) -> dict[str, Any] | None:
    """What the engine adds to the evaluation payload for an algorithm without ``serve``: the
    models ``centers(state)`` and each client's row of them, ``assignment(state)`` where the
    algorithm has one (its cluster's model), else the one center when there is exactly one (a
    global model). None: the engine cannot tell which model a client is served."""
    centers = algorithm.centers
    if centers is None:
        return None
    models = centers(state)
    assign = algorithm.assignment
    if assign is not None:
        index = np.asarray(assign(state), dtype=np.int64)
        if index.min(initial=0) < 0:  # a client never assigned (IFCA before its first evaluation)
            return None
    elif models.shape[0] == 1:
        index = np.zeros(0, dtype=np.int64)  # everyone: row 0
    else:
        return None
    return {SERVED_MODELS: models, SERVED_INDEX: index}


def has_served(algorithm: OptionalHooks, state: Any) -> bool:
    """Whether the engine can score each client's personalised model: the algorithm has
    ``serve`` or :func:`default_served` finds its models."""
    return algorithm.serve is not None or default_served(algorithm, state) is not None


def served_op(algorithm: OptionalHooks) -> ClientOp:
    """The engine's client op :data:`SERVED_OP`: the model ``algorithm`` serves this client
    (its ``serve(ctx, client_state, payload, t)``, else :func:`default_served`'s row), scored
    by :func:`~raysoft.evaluation.score_client` on the client's test split
    (:meth:`~raysoft.data.ClientData.test_split`); None where the client has none. The client
    state is left as it was."""
    from ..evaluation import score_client
    from ..params import set_flat

    serve = algorithm.serve

    def op(ctx: ClientContext, cs: Any, payload: dict[str, Any], t: int) -> tuple[Any, dict[str, float] | None]:
        split = ctx.data.test_split()
        if split is None:
            return cs, None
        if serve is not None:
            model = serve(ctx, cs, payload, t)
        else:
            index = payload[SERVED_INDEX]
            model = payload[SERVED_MODELS][int(index[ctx.client]) if len(index) else 0]
        if isinstance(model, torch.Tensor):
            set_flat(ctx.scratch, model)
            model = ctx.scratch
        return cs, score_client(model, split[0], split[1], ctx.info.task)

    return op


def served_batched(algorithm: OptionalHooks) -> Callable[[list[ClientContext], list[Any] | None, dict[str, Any], int],
                                                  list[dict[str, float] | None]]:
    """The engine's :data:`SERVED_OP` over several clients of one host: with ``serve``, client by
    client (:func:`served_op`; ``states`` are their client states); without, the clients served
    the same model of :func:`default_served` are scored together
    (:func:`~raysoft.evaluation.score_clients`), their
    states not read (``states`` may be None). Returns each client's metrics, None for a client
    without a test split."""
    from ..evaluation import score_clients
    from ..params import set_flat

    if algorithm.serve is not None:
        one = served_op(algorithm)

        def each(ctxs: list[ClientContext], states: list[Any] | None, payload: dict[str, Any],
                 t: int) -> list[dict[str, float] | None]:
            assert states is not None
            return [one(c, s, payload, t)[1] for c, s in zip(ctxs, states)]

        return each

    def grouped(ctxs: list[ClientContext], states: list[Any] | None, payload: dict[str, Any],
                t: int) -> list[dict[str, float] | None]:
        index, models = payload[SERVED_INDEX], payload[SERVED_MODELS]
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(ctxs):
            if c.data.test_split() is not None:
                groups.setdefault(int(index[c.client]) if len(index) else 0, []).append(i)
        out: list[dict[str, float] | None] = [None] * len(ctxs)
        for row in sorted(groups):
            scratch = ctxs[0].scratch
            set_flat(scratch, models[row])
            splits = [ctxs[i].data.test_split() for i in groups[row]]
            for i, m in zip(groups[row], score_clients(scratch, [s for s in splits if s is not None],
                                                       ctxs[0].info.task)):
                out[i] = m
        return out

    return grouped


def pairwise(sums: list[T], add: Callable[[T, T], T]) -> T:
    """The sum of ``sums`` as a balanced tree of additions ``add(a, b)``, in order: level by
    level, ``[s0 + s1, s2 + s3, ...]`` (an odd last one carried up), so log2(n) levels deep.
    The one tree of the tree-shaped sums: :meth:`Plan.apply` adds tensors (``torch.add``), the
    Ray backend (:func:`raysoft.backends.actors.tree`) references to them on the actors."""
    if not sums:
        raise ValueError("pairwise: nothing to add")
    while len(sums) > 1:
        sums = [add(a, b) for a, b in zip(sums[0::2], sums[1::2])] + (sums[-1:] if len(sums) % 2 else [])
    return sums[0]


def planned_sum(plan: Plan, parts: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """``plan.apply(parts)`` for a plan that has a start or a term (an empty sum is an error)."""
    out = plan.apply(parts)
    if out is None:
        raise ValueError("an empty sum: the plan has no start and no term")
    return out


class Reduction:
    """A sum of the clients' results that a backend may run where the clients are (in client-id
    order, so the same number wherever it runs): each result's ``summed`` tensor (an
    :class:`Update`'s, or the result itself), with the coefficients that :meth:`plan` makes
    from every client's named extras."""

    def plan(self, extras: Mapping[int, Mapping[str, object]]) -> Plan:
        """The sum over the clients in ``extras`` (those whose result is finite; each one's named
        extras, empty for a plain tensor). Its ``start`` is a new tensor (the sum is added into
        it), never one of the reduction's own."""
        raise NotImplementedError


@dataclass(frozen=True)
class WeightedMean(Reduction):
    """sum_k n_k r_k / sum_k n_k over the finite results, n = ``sizes`` (FedAvg)."""

    sizes: np.ndarray

    def coefficients(self, ids: list[int]) -> dict[int, float]:
        """n_k / sum n over ``ids`` (ascending), the weights ``weighted_sum`` applies."""
        total = float(sum(self.sizes[k] for k in ids))
        return {k: float(self.sizes[k] / total) for k in sorted(ids)}

    def plan(self, extras: Mapping[int, Mapping[str, object]]) -> Plan:
        return Plan(None, {k: (None, c) for k, c in self.coefficients(list(extras)).items()})


@dataclass
class Reduced:
    """What a call with ``reduce`` returns: the sum (None when no result was finite and the
    plan has no start), the clients whose results are in it (ascending), and each of their
    results' named extras (:attr:`Update.extras`; empty for a plain tensor)."""

    value: torch.Tensor | None
    clients: list[int]
    extras: Mapping[int, Mapping[str, object]]


@dataclass(frozen=True)
class ClientCall:
    """Ask ``clients`` to run client op ``op`` with the broadcast ``payload``; with ``reduce``,
    return only the reduction of their results. ``each``: the payload's keys whose value holds
    one entry per client (a dict keyed by client id, or an array whose first axis is the
    client) of which each client reads only its own, ``payload[key][client]``: what a
    deployment would send it, and what ``comm.parquet`` counts (the simulator still passes the
    whole payload)."""

    op: str
    clients: list[int]
    payload: dict[str, Any] = field(default_factory=dict)
    reduce: Reduction | None = None
    each: tuple[str, ...] = ()


@dataclass
class ServerContext:
    """What the server half (``init_server``, ``round``) may know.

    * ``cfg``: the whole run config (:class:`~raysoft.config.Config`): ``cfg.seed`` for random
      streams, ``cfg.train`` (``lr``, ...), ``cfg.data``, your settings as ``cfg.algorithm``;
    * ``sizes``: every client's number of training samples, ``[num_clients]`` int64 (the n_k
      of a weighted mean: ``WeightedMean(ctx.sizes)``);
    * ``info``: the data's shape (:class:`~raysoft.models.DataInfo`);
    * ``num_clients``: ``len(sizes)``;
    * ``new_model(*stream)``: a fresh model drawn from the random stream ``(cfg.seed, *stream)``,
      e.g. ``ctx.new_model("center", 0)`` (what the built-ins start from), on the CPU;
    * ``held_out``: the clients ``data.held_out`` keeps out of training (ascending; empty by
      default): never select them, never count them. ``pool`` is the clients that train and
      ``pool_sizes`` the sizes with the held-out clients' set to 0 (``sizes`` itself when none is
      held out), the n_k of an aggregate over the training clients.
    """

    cfg: Config
    sizes: np.ndarray
    info: DataInfo
    held_out: tuple[int, ...] = ()

    @property
    def num_clients(self) -> int:
        """The number of clients (``data.clients``), held-out ones included."""
        return int(self.sizes.shape[0])

    @property
    def pool(self) -> list[int]:
        """The clients that train (every client but the held-out ones), ascending."""
        out = set(self.held_out)
        return [k for k in range(self.num_clients) if k not in out]

    @property
    def pool_sizes(self) -> np.ndarray:
        """``sizes`` with the held-out clients' set to 0 (``sizes`` itself when none is held out)."""
        if not self.held_out:
            return self.sizes
        out = np.array(self.sizes, copy=True)
        out[list(self.held_out)] = 0
        return out

    def new_model(self, *stream: int | str) -> nn.Module:
        """A model initialised from the random stream (seed, *stream)."""
        return build_model(self.cfg.model, self.info, torch_generator(self.cfg.seed, *stream))


@dataclass
class ClientContext:
    """What the client half (``init_client`` and every client op) may know; one per client.

    * ``cfg``: the whole run config (:class:`~raysoft.config.Config`): ``cfg.seed``, the local
      solver ``cfg.train`` (optimizer, ``lr``, ``batch_size``, ``local_epochs``), your settings
      as ``cfg.algorithm``;
    * ``client``: this client's id, ``0 .. num_clients - 1``;
    * ``data``: its data (:class:`~raysoft.data.ClientData`): ``x``, ``y``, ``components`` (the
      true distribution of each sample) and, where the dataset has one, the client's own test
      split ``test_x``, ``test_y`` (else None); on :attr:`device`;
    * ``info``: the data's shape (:class:`~raysoft.models.DataInfo`: ``input_dim``,
      ``num_outputs``, ``task``, ``input_shape``);
    * ``scratch``: a model shared by the clients of one host, whose parameters a client op may
      overwrite freely (load a vector with ``set_flat``, train it, read it with ``get_flat``);
      nothing may be kept in it between calls;
    * ``device``: where the host runs its clients (``train.device``); make tensors there
      (:meth:`tensor`, ``device=ctx.device``);
    * ``num_clients``: the number of clients (``data.clients``);
    * ``new_model(*stream)``: a fresh model drawn from the random stream ``(cfg.seed, *stream)``
      (on the CPU, then moved to :attr:`device`: the same numbers on every device), e.g.
      ``ctx.new_model("client_init")`` for a client's own model;
    * ``tensor(value, dtype=None)``: ``value`` (a numpy array of a payload, a list, a tensor) as
      a tensor on :attr:`device`, of ``dtype`` (None: the value's own);
    * ``settings(Kind)``: the algorithm's settings, ``cfg.algorithm``, typed as ``Kind`` (its
      ``Settings`` class): THE way a client op reads them, e.g.
      ``ctx.settings(FedSoftConfig).sigma``.

    Settings are known, not sent: every host has the run's config from its start (as it has the
    model's architecture), so a client op reads the algorithm's settings with :meth:`settings`
    (the local solver from ``cfg.train``, the seed from ``cfg.seed``), and a payload carries
    only the run's state, what changes between rounds (centers, models, weights). What a
    payload carries is what ``comm.parquet`` counts.
    """

    cfg: Config
    client: int
    data: ClientData
    info: DataInfo
    scratch: nn.Module  # a model whose parameters client ops may overwrite freely
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where the host runs its clients

    @property
    def num_clients(self) -> int:
        """The number of clients (``data.clients``)."""
        return int(self.cfg.data.clients)

    def new_model(self, *stream: int | str) -> nn.Module:
        """A model initialised from the random stream (seed, *stream), on :attr:`device` (drawn
        on the CPU, so the same numbers on every device)."""
        return build_model(self.cfg.model, self.info, torch_generator(self.cfg.seed, *stream)).to(self.device)

    def tensor(self, value: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``value`` (an array, a list, a tensor) as a tensor on :attr:`device`: how a client op
        makes a tensor from a payload's numpy arrays."""
        return torch.as_tensor(value, dtype=dtype, device=self.device)

    def settings(self, kind: type[S]) -> S:
        """The algorithm's settings (``cfg.algorithm``, the object the server half reads as
        ``self.settings``), checked to be a ``kind`` (the algorithm's ``Settings`` class, or a
        base of it): how a client op reads its settings, typed. Anything else is a ``TypeError``
        of one line naming both classes."""
        settings = self.cfg.algorithm
        if not isinstance(settings, kind):
            raise TypeError(f"ctx.settings({kind.__name__}): the run's algorithm settings are "
                            f"{type(settings).__name__}, not {kind.__name__}")
        return settings


@dataclass(frozen=True)
class RoundResult:
    """What ``round`` returns (the generator's return value).

    * ``state``: the server's new state;
    * ``diagnostics``: the algorithm's own per-round figures, ``{name: number}``, written to
      ``diagnostics.parquet`` (one row per name, at the round);
    * ``weights_updated``: True records ``weights(state)`` in ``weights.parquet`` at this round
      (an algorithm that estimates weights sets it when they changed);
    * ``trained``: the number of clients whose training went into the round, reported with the
      step (``raysoft bench`` counts clients trained per second from it; None: not said).
    """

    state: Any
    diagnostics: Mapping[str, float] = field(default_factory=dict)
    weights_updated: bool = False
    trained: int | None = None


def as_round_result(value: object) -> RoundResult:
    """A round's return value, which must be a :class:`RoundResult`; anything else (the earlier
    ``(state, dict)`` pair among them) is a ``TypeError`` of one line saying what to return."""
    if isinstance(value, RoundResult):
        return value
    what = f"a tuple of {len(value)}" if isinstance(value, tuple) else type(value).__name__
    raise TypeError(f"returned {what}, not a RoundResult: return RoundResult(state, diagnostics, "
                    "weights_updated, trained)")


@dataclass(frozen=True)
class EvalResult:
    """What the client op ``evaluate`` may return as its result: ``metrics`` (``{name: number}``,
    each a row of ``metrics.parquet``, scope ``client``) and ``extra``, anything else the server
    should learn from the evaluation (not recorded): ``absorb_eval(state, results)`` receives
    every client's EvalResult and may read it (IFCA: the center the client chose)."""

    metrics: Mapping[str, float]
    extra: Any = None


def eval_metrics(result: object) -> dict[str, float]:
    """The metrics of one client's ``evaluate`` result: an :class:`EvalResult`'s ``metrics``, or
    a plain dict of metrics. A dict with a key starting with ``_`` (the earlier form of extras)
    is a ``TypeError`` of one line saying to put the extras in an EvalResult."""
    if isinstance(result, EvalResult):
        return dict(result.metrics)
    if isinstance(result, Mapping):
        extras = sorted(str(k) for k in result if str(k).startswith("_"))
        if extras:
            raise TypeError(f"its evaluate op returned a dict with keys starting with '_' ({', '.join(extras)}): "
                            "put extras in EvalResult(metrics, extra)")
        return dict(result)
    raise TypeError(f"its evaluate op returned {type(result).__name__}, not an EvalResult or a dict of metrics")


# a round yields calls and is sent each call's results: {client: result}, or a Reduced for a call with ``reduce``
RoundGenerator = Generator[ClientCall, Any, RoundResult]
# a client op: op(ctx, client_state, payload, t) -> (client_state, result)
ClientOp = Callable[[ClientContext, Any, dict[str, Any], int], tuple[Any, Any]]


# a batched client op: op(ctxs, client_states, payload, t) -> (client_states, results), one entry a client
BatchedOp = Callable[[list[ClientContext], list[Any], dict[str, Any], int], tuple[list[Any], list[Any]]]
# serve(ctx, client_state, payload, t) -> the model the client is served (a module, or a flat vector)
ServeOp = Callable[[ClientContext, Any, dict[str, Any], int], "nn.Module | torch.Tensor"]


class OptionalHooks(Protocol):
    """The optional attributes of an algorithm, each with the default the engine reads when an
    algorithm does not define it: :class:`Configured` (and so every built-in and the stream
    template) inherits them, and :func:`with_defaults` gives them to a plug-in that implements
    :class:`Algorithm` without it, so the engine reads them as plain attributes.

    * ``readonly_ops``: the client ops that read the client state and leave it as it was;
    * ``stateless_ops``: the client ops that do not read it (they get ``None``);
    * ``batched_ops``: op name -> :data:`BatchedOp`, a host's clients of one call at once;
    * ``own_data``: the clients build their data themselves (the streams), not the federation;
    * ``state_types``: the classes of the algorithm's states a checkpoint may hold;
    * ``centers(state)``, ``weights(state)`` (:class:`Clustered`), ``assignment(state)`` (each
      client's center, -1 for none yet), ``absorb_eval(state, results)`` (the server learns from an
      evaluation), ``serve`` (:data:`ServeOp`) and ``unseen_payload(state)`` (a held-out client's
      cold start): None where the algorithm has no such method.
    """

    readonly_ops: tuple[str, ...] = ("evaluate",)
    stateless_ops: tuple[str, ...] = ()
    batched_ops: Mapping[str, BatchedOp] = MappingProxyType({})
    own_data: bool = False
    state_types: tuple[type, ...] = ()
    centers: Callable[[Any], torch.Tensor] | None = None
    weights: Callable[[Any], np.ndarray | None] | None = None
    assignment: Callable[[Any], Sequence[int] | np.ndarray] | None = None
    absorb_eval: Callable[[Any, dict[int, Any]], Any] | None = None
    serve: ServeOp | None = None
    unseen_payload: Callable[[Any], dict[str, Any]] | None = None


OPTIONAL_HOOKS = ("readonly_ops", "stateless_ops", "batched_ops", "own_data", "state_types", "centers", "weights",
                  "assignment", "absorb_eval", "serve", "unseen_payload")


class Configured(OptionalHooks, Generic[S]):
    """An algorithm object made from its settings (its ``Settings``), which it reads as
    ``self.settings``; it has :class:`OptionalHooks`' defaults."""

    def __init__(self, settings: S) -> None:
        self.settings = settings


class Algorithm(Protocol):
    """The protocol of a synchronous algorithm (what the engine takes): made as
    ``Algo(settings)``, it has ``settings``, ``client_ops`` (op name -> :data:`ClientOp`,
    ``evaluate`` among them), ``init_server``, ``init_client``, ``round`` and ``eval_payload``.
    Optional (:class:`OptionalHooks`, whose defaults the engine reads where an algorithm lacks
    one): ``centers`` and ``weights`` (:class:`Clustered`), ``absorb_eval(state, results)``,
    ``assignment(state)``, ``serve``, ``unseen_payload``, ``readonly_ops``, ``stateless_ops``,
    ``batched_ops``, ``own_data`` and ``state_types``."""

    @property
    def settings(self) -> AlgorithmConfig: ...

    @property
    def client_ops(self) -> Mapping[str, ClientOp]: ...

    def init_server(self, ctx: ServerContext) -> Any: ...

    def init_client(self, ctx: ClientContext) -> Any: ...

    def round(self, ctx: ServerContext, state: Any, t: int) -> RoundGenerator: ...

    def eval_payload(self, state: Any) -> dict[str, Any]: ...


class EngineAlgorithm(Algorithm, OptionalHooks, Protocol):
    """What the engine holds: an :class:`Algorithm` with every optional attribute
    (:class:`OptionalHooks`), its own or the default (:func:`with_defaults`)."""


def with_defaults(algorithm: Algorithm) -> EngineAlgorithm:
    """``algorithm`` with :class:`OptionalHooks`' default of each optional attribute it lacks
    (a plug-in that implements :class:`Algorithm` without :class:`Configured`), set on the
    object; itself, unchanged, when it has every one (every :class:`Configured` does)."""
    for name in OPTIONAL_HOOKS:
        if not hasattr(algorithm, name):
            setattr(algorithm, name, getattr(OptionalHooks, name))
    return cast(EngineAlgorithm, algorithm)


class Clustered(Algorithm, Protocol):
    """An :class:`Algorithm` with models to score on every distribution's holdout set:
    ``centers(state)``, a tensor ``[centers, parameters]`` (their number may change during a
    run), and ``weights(state)``, each client's weights over the centers ``[clients,
    centers]``, or None. The engine records center rows and weights only for an algorithm that
    has them."""

    def centers(self, state: Any) -> torch.Tensor: ...

    def weights(self, state: Any) -> np.ndarray | None: ...
