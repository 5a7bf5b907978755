"""The client actors and the executor that runs client ops on them (inside the coordinator).

* Each client actor hosts a contiguous block of clients (``ray.clients_per_actor``; ``auto``
  sizes the pool to the cluster's CPUs, or GPU shares when ``num_gpus_per_actor > 0``), builds
  their data itself from (config, client id, seed), and keeps their state across rounds.
* The actor declares ``num_cpus_per_actor`` / ``num_gpus_per_actor`` and uses CUDA only when
  Ray gave it a GPU and torch sees one.
* Each client call's payload (e.g. the round's centers) is put in the object store once and
  every actor receives the same reference.
* Every wait on an actor has a deadline (:mod:`.deadlines`); a dead or hung actor is a
  :class:`~raysoft.errors.ClientFailure`, from which the coordinator recovers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import ray

from ..config import Config, ConfigError, parse_config
from ..errors import ClientFailure, RaysoftError, first_line
from .cluster import joined_cluster
from .deadlines import Deadlines
from .plan import balanced_segments, not_placed

if TYPE_CHECKING:  # torch and the runtime: imported where the executor runs, not on the driver
    import numpy as np
    import torch
    from ray.util.placement_group import PlacementGroup

    from ..algorithms.base import Plan
    from ..config import RayConfig
    from ..params import Term
    from ..runtime.executor import Held, Placement
    from .host import ClientHost

log = logging.getLogger(__name__)

# what a dead client actor or node looks like to the caller
_DEAD = tuple(
    getattr(ray.exceptions, name)
    for name in ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                 "NodeDiedError", "ObjectLostError", "OwnerDiedError")
    if hasattr(ray.exceptions, name)
)

# raysoft's own errors (the user's input, or a run's stop) cross actor boundaries as one line
_PLAIN = RaysoftError


def plain_error(err: BaseException) -> BaseException | None:
    """The user-facing error inside a Ray error (a task's error, possibly raised in an actor
    called by an actor), re-made with its one-line message; None if there is none."""
    e: BaseException | None = err
    for _ in range(16):
        if isinstance(e, ray.exceptions.RayTaskError):
            e = e.cause
        elif isinstance(e, _PLAIN):
            plain = type(e)(str(e))
            plain.__dict__.update(e.__dict__)  # what it carries (a plug-in's traceback as text, notes)
            return plain
        else:
            return None
    return None


def _get(ref: Any) -> Any:
    """``ray.get`` whose user-facing errors arrive as one line (not as a Ray traceback)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        plain = plain_error(err)
        if plain is None:
            raise
        raise plain from None


@ray.remote
class ClientActor:
    """Thin wrapper around a ClientHost, built by :meth:`start` (so that the wait for the
    actor's placement is apart from the building of its clients, and an error while building
    them is an ordinary task error, one line to the user)."""

    def __init__(self, cfg_dict: dict[str, Any], client_ids: list[int]) -> None:
        self.cfg_dict, self.client_ids = cfg_dict, list(client_ids)
        self.host: ClientHost | None = None

    @property
    def _host(self) -> ClientHost:
        if self.host is None:
            raise RuntimeError("the client actor was not started")
        return self.host

    def ping(self) -> bool:
        return True

    def hang(self, seconds: float) -> None:
        """Fault injection (``hang_actor``): busy, alive and silent for ``seconds``."""
        import time

        time.sleep(seconds)

    def start(self) -> Placement:
        from ..devices import choose, deterministic
        from .host import ClientHost

        cfg = parse_config(self.cfg_dict)
        gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        device = choose(cfg.train.device, bool(gpu_ids))
        deterministic(device).__enter__()  # for the actor's life: its process runs only its clients
        self.host = ClientHost(cfg, self.client_ids, device=str(device))
        return self.describe()

    def call(self, op: str, client_ids: list[int], payload: dict[str, object], t: int) -> dict[int, object]:
        return self._host.call(op, client_ids, payload, t)

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, object],
                           t: int) -> dict[int, Held]:
        return self._host.call_for_reduction(op, client_ids, payload, t)

    def add_terms(self, terms: dict[int, Term | list[Term]], acc: torch.Tensor | None,
                  fresh: bool = False) -> torch.Tensor:
        return self._host.add_terms(terms, acc, fresh)

    def combine(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """One addition of the tree (:func:`~raysoft.algorithms.base.pairwise`): ``a + b``."""
        import torch

        return torch.add(a, b)

    def lend(self, client_ids: list[int]) -> dict[int, Any]:
        return self._host.lend(client_ids)

    def take(self, states: dict[int, Any]) -> None:
        self._host.take(states)

    @ray.method(num_returns=2)
    def call_with_visitors(self, method: str, op: str, client_ids: list[int], payload: dict[str, object], t: int,
                           *lent: dict[int, object],
                           ) -> tuple[dict[int, object] | dict[int, Held], dict[int, object]]:
        return self._host.call_with_visitors(method, op, client_ids, payload, t, lent)

    def get_states(self) -> dict[int, Any]:
        return self._host.get_states()

    def set_states(self, states: dict[int, Any]) -> None:
        self._host.set_states(states)

    def reset(self) -> None:
        self._host.reset()

    def describe(self) -> Placement:
        ctx = ray.get_runtime_context()
        return {"clients": self._host.client_ids, "node_id": ctx.get_node_id(), "device": str(self._host.device)}


class ActorPool:
    """The client actors of a run, one per block of the driver's plan, in its placement group
    ``pg`` (None: Ray's default placement) from bundle ``first_bundle`` on (a Tune trial's
    reservation starts with the trial's own): their placement, every wait on them (with a
    deadline, :mod:`.deadlines`), and their recovery."""

    def __init__(self, cfg: Config, blocks: list[list[int]], pg: PlacementGroup | None = None,
                 first_bundle: int = 0) -> None:
        self.cfg_dict = cfg.to_dict()
        self.num_clients = cfg.data.clients
        self.rc = cfg.ray
        self.blocks = blocks
        self.pg, self.first_bundle = pg, first_bundle
        self.deadlines = Deadlines(self.rc.call_timeout_s)  # no wait on a live actor without one
        self.actors: list[Any] = [self._create(block, i) for i, block in enumerate(self.blocks)]
        self._placed(range(len(self.actors)))
        for attempt in range(5):  # an actor that dies while the clients are built is replaced
            try:
                self.placement: list[Placement] = self.gather([a.start.remote() for a in self.actors], "start",
                                                              self.everyone())
                break
            except ClientFailure:
                if attempt == 4:
                    raise
                self._replace_dead()

    def everyone(self) -> list[int]:
        return list(range(len(self.actors)))

    def _create(self, block: list[int], index: int):
        opts: dict[str, Any] = {"num_cpus": self.rc.num_cpus_per_actor, "num_gpus": self.rc.num_gpus_per_actor}
        if self.pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=self.first_bundle + index)
        return ClientActor.options(**opts).remote(self.cfg_dict, block)  # type: ignore[attr-defined]  # an ActorClass

    def _placed(self, indices) -> None:
        """Wait, at most ``ray.placement_timeout_s``, until the actors ``indices`` run (placed
        on a node, their process started); building their clients comes after, unbounded."""
        indices = list(indices)
        refs = [self.actors[i].ping.remote() for i in indices]
        if not refs:
            return
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.rc.placement_timeout_s)
        if pending:
            raise ConfigError(not_placed(self.num_clients, self.rc, joined_cluster(), len(self.blocks),
                                         self.rc.placement_timeout_s))
        self.gather(refs, "ping", indices)

    def gather(self, futures: list, op: str = "call", who: list[int] | None = None) -> list:
        """The futures' values, waiting at most the deadline of ``op`` (:mod:`.deadlines`); a dead
        actor, or one that has not answered by then (hung: killed here), is a
        :class:`ClientFailure`, which the coordinator recovers from like a dead actor. ``who``:
        each future's actor (else the actors that do not answer a ping are the hung ones)."""
        if not futures:
            return []
        began = time.monotonic()
        limit = self.deadlines.limit(op)
        _, pending = ray.wait(futures, num_returns=len(futures), timeout=limit)
        if pending:
            hung = sorted({who[futures.index(f)] for f in pending}) if who is not None else self._silent()
            for i in hung:
                ray.kill(self.actors[i], no_restart=True)
            raise ClientFailure(f"client actor{'s' if len(hung) > 1 else ''} {', '.join(map(str, hung))} did not "
                                f"answer {op!r} within {self.deadlines.say(op)}: killed as hung")
        try:
            out = ray.get(futures)
        except _DEAD as err:
            raise ClientFailure(first_line(err)) from None
        self.deadlines.measured(op, time.monotonic() - began)
        return out

    def _silent(self, within_s: float = 10.0) -> list[int]:
        """The client actors that do not answer a ping within ``within_s`` (busy or hung)."""
        pings = [a.ping.remote() for a in self.actors]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=within_s)
        return [i for i, p in enumerate(pings) if p not in ready]

    def kill(self, actor: int) -> None:
        """Fault injection: kill one client actor."""
        ray.kill(self.actors[actor % len(self.actors)], no_restart=True)

    def hang(self, actor: int, seconds: float) -> None:
        """Fault injection: one client actor busy, alive and silent, for ``seconds``."""
        self.actors[actor % len(self.actors)].hang.remote(seconds)

    def recover(self) -> None:
        """Replace dead actors (and those that do not answer a ping within a minute: killed as
        hung) by new ones hosting the same clients (rebuilt from seed and id)."""
        dead = self._replace_dead()
        for i, where in zip(dead, self.gather([self.actors[i].start.remote() for i in dead], "start", dead)):
            self.placement[i] = where

    def _replace_dead(self) -> list[int]:
        """Replace the dead (or silent: killed) actors by new, placed, not yet started ones."""
        pings = [a.ping.remote() for a in self.actors]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=60.0)
        dead = []
        for i, ping in enumerate(pings):
            if ping in ready:
                try:
                    ray.get(ping)
                    continue
                except _DEAD:
                    pass
            else:
                ray.kill(self.actors[i], no_restart=True)
            log.warning("client actor %d died; restarting it for clients %s", i, self.blocks[i][:3])
            self.actors[i] = self._create(self.blocks[i], i)
            dead.append(i)
        self._placed(dead)
        return dead


class Counters(TypedDict):
    """The balancing's counters since the last ``take_counters``."""

    actor_samples: list[int]  # per actor: the training samples it ran
    clients_moved: int  # clients trained away from their actor


class Routing:
    """Which actor runs which clients of a call: each client's home actor (``owner``), or with
    ``ray.balance: cost`` runs of even cost (:func:`~.plan.balanced_segments`) where the other
    actors' clients visit with their states; where each client last ran (its term of a sum is
    there), and the counters of that balancing."""

    def __init__(self, rc: RayConfig, owner: dict[int, int], num_actors: int,
                 leaves_state: Callable[[str], bool]) -> None:
        self.rc, self.owner, self.num_actors, self.leaves_state = rc, owner, num_actors, leaves_state
        self.costs: np.ndarray | None = None  # per client: its samples (balanced rounds), from set_costs
        self.where: dict[int, int] = {}  # client -> the actor its last call ran on
        self.samples = [0] * num_actors  # per actor: training samples run since take_counters()
        self.moved = 0  # clients trained away from their actor since take_counters()

    def take_counters(self) -> Counters:
        out: Counters = {"actor_samples": list(self.samples), "clients_moved": self.moved}
        self.samples, self.moved = [0] * self.num_actors, 0
        return out

    def home(self, k: int) -> int:
        """The actor holding client ``k``'s term of a sum: where its last call ran."""
        return self.where.get(k, self.owner[k])

    def groups(self, op: str, client_ids: list[int]) -> dict[int, list[int]]:
        """Which actor runs which clients of a call: by owner, or (``ray.balance: cost``, for
        the ops that change client states, i.e. training) runs of consecutive client ids of
        even cost, run j on actor j (other actors' clients visit it with their states)."""
        costs = self.costs
        balance = (self.rc.balance == "cost" and costs is not None and not self.leaves_state(op)
                   and self.rc.round_deadline_s is None and self.num_actors > 1)
        if balance and costs is not None:
            return dict(enumerate(balanced_segments(client_ids, costs, self.num_actors)))
        groups: dict[int, list[int]] = {}
        for k in sorted(client_ids):
            groups.setdefault(self.owner[k], []).append(k)
        return groups

    def route(self, op: str, client_ids: list[int]) -> tuple[dict[int, list[int]], dict[int, dict[int, list[int]]]]:
        """A call's groups (actor -> its clients) and visitors (actor -> owner -> the owner's
        clients it runs), counted."""
        groups = self.groups(op, client_ids)
        self.where = {k: i for i, ks in groups.items() for k in ks}
        if not self.leaves_state(op) and self.costs is not None:
            for i, ks in groups.items():
                self.samples[i] += sum(int(self.costs[k]) for k in ks)
        visitors: dict[int, dict[int, list[int]]] = {}
        for i, ks in groups.items():
            for k in ks:
                if self.owner[k] != i:
                    visitors.setdefault(i, {}).setdefault(self.owner[k], []).append(k)
                    self.moved += 1
        return groups, visitors


def chain(actors: list[Any], home: Callable[[int], int], terms: Mapping[int, Term | list[Term]], acc: Any,
          fresh: bool = False) -> tuple[Any, int]:
    """The reference to ``acc`` plus ``terms``, added actor after actor in client-id order, each
    client's term on its actor (``home``) (``fresh``: from zeros like ``acc``), and the actor it
    ends on."""
    parts: dict[int, dict[int, Term | list[Term]]] = {}
    for k in sorted(terms):
        parts.setdefault(home(k), {})[k] = terms[k]
    order = sorted(parts, key=lambda i: min(parts[i]))
    for a, b in zip(order, order[1:]):
        if max(parts[a]) > min(parts[b]):  # blocks are contiguous ranges; never interleave
            raise RuntimeError("accumulate: actors' client blocks interleave")
    for n, i in enumerate(order):
        acc = actors[i].add_terms.remote(parts[i], acc, fresh and n == 0)
    return acc, order[-1]


def tree(actors: list[Any], home: Callable[[int], int], plan: Plan, group: int) -> Any:
    """``ray.sum_shape: tree``: each run of ``group`` consecutive clients is a short chain from
    zeros (all runs at once), the runs' sums are added pairwise on the actors, and the total to
    the start: the additions of ``Plan.apply(parts, group)``, log-depth. The total's reference."""
    from ..algorithms.base import pairwise  # torch: imported where the executor runs, not on the driver

    start = None if plan.start is None else ray.put(plan.start)
    level = [chain(actors, home, terms, start, fresh=True) for terms in plan.groups(group)]

    def add(x: tuple[Any, int], y: tuple[Any, int]) -> tuple[Any, int]:
        """One addition of the tree, on the actor that made ``x``'s sum (the tensor is already there)."""
        return actors[x[1]].combine.remote(x[0], y[0]), x[1]

    total, i = pairwise(level, add)
    if start is not None:  # start + total, as Plan.add_start
        total = actors[i].combine.remote(start, total)
    return total


class RayExecutor:
    """Runs client ops on the client actors (used inside the coordinator actor): the actors
    (:class:`ActorPool`: placement, deadlines, recovery), which actor runs which clients of a
    call (:class:`Routing`: by owner, or balanced by cost with the other actors' clients
    visiting), and the sums of the clients' terms along the actors (:func:`chain`, :func:`tree`)."""

    def __init__(self, cfg: Config, blocks: list[list[int]], pg: PlacementGroup | None = None,
                 first_bundle: int = 0) -> None:
        from functools import partial

        from ..algorithms import make_algorithm
        from ..algorithms.base import leaves_state  # torch: imported where the executor runs, not on the driver

        self.rc = cfg.ray
        self.pool = ActorPool(cfg, blocks, pg, first_bundle)
        self.leaves_state = partial(leaves_state, make_algorithm(cfg.algorithm))  # op -> its clients' states unchanged
        owner = {k: i for i, block in enumerate(blocks) for k in block}
        self.routing = Routing(self.rc, owner, len(blocks), self.leaves_state)
        self.late: list[int] = []  # clients whose updates missed the last call's deadline

    @property
    def actors(self) -> list[Any]:
        return self.pool.actors

    @property
    def placement(self) -> list[Placement]:
        """Each actor's clients, node and device (as its ``describe``)."""
        return self.pool.placement

    @placement.setter
    def placement(self, value: list[Placement]) -> None:
        self.pool.placement = value

    def set_costs(self, costs: np.ndarray) -> None:
        """Each client's cost (its training samples): with ``ray.balance: cost``, the clients of a
        training call are split over the actors by it."""
        self.routing.costs = costs

    def take_counters(self) -> Counters:
        """Since the last call: each actor's training samples (a client's samples per training
        call, the cost ``ray.balance`` evens out) and the clients trained away from their actor."""
        return self.routing.take_counters()

    def call(self, op: str, client_ids: list[int], payload: dict[str, object], t: int) -> dict[int, object]:
        return self._run("call", op, client_ids, payload, t)

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, object],
                           t: int) -> dict[int, Held]:
        held: dict[int, Held] = self._run("call_for_reduction", op, client_ids, payload, t)  # type: ignore[assignment]  # what that method answers
        return held

    def accumulate(self, plan: Plan) -> torch.Tensor:
        """The chain: the actor with the lowest client ids starts the sum from the plan's start,
        each next actor adds its clients' terms to the partial sum it receives (Ray passes the
        reference on, the tensor goes actor to actor), so the terms are added in client-id
        order whatever the packing. The training ran in parallel before; only these additions
        are sequential."""
        if self.rc.sum_shape == "tree":
            total = tree(self.actors, self.routing.home, plan, self.rc.sum_group)
        else:
            total = chain(self.actors, self.routing.home, plan.terms, plan.start)[0]
        return self.pool.gather([total], "sum")[0]

    def _run(self, method: str, op: str, client_ids: list[int], payload: dict[str, object],
             t: int) -> dict[int, object]:
        ref = ray.put(payload)  # once per call, shared by every actor
        groups, visitors = self.routing.route(op, client_ids)
        trains = not self.leaves_state(op)
        futures, returned = self._dispatch(method, op, groups, visitors, ref, t, trains)
        asked = [groups[i] for i in sorted(groups)]
        self.late = []
        if self.rc.round_deadline_s is not None and trains and asked:  # none asked: no wait
            futures, asked = self._stragglers_left_out(futures, asked, self.rc.round_deadline_s)
        out: dict[int, object] = {}
        who = [self.routing.where[ks[0]] for ks in asked]
        for ks, result in zip(asked, self.pool.gather(futures, op, who)):
            out.update(result)
            self.late += [k for k in ks if k not in result]  # timed out on its actor
        self.late.sort()
        self.pool.gather(returned, "take")
        return out

    def _dispatch(self, method: str, op: str, groups: dict[int, list[int]], visitors: dict[int, dict[int, list[int]]],
                  ref: ray.ObjectRef, t: int, trains: bool) -> tuple[list, list]:
        """Start a call on every actor of ``groups`` (the payload ``ref`` put once, shared); the
        ``visitors`` (clients away from home) visit with their states, lent by their owners and
        (after a training call) taken back. (The calls' futures in actor order, the takes'.)"""
        actors = self.actors
        # every loan is asked for before any call, so that no owner lends only after its own training
        lent = {i: [actors[o].lend.remote(g) for o, g in sorted(vis.items())] for i, vis in visitors.items()}
        futures, back = [], {}
        for i, ks in sorted(groups.items()):
            if i not in lent:
                futures.append(getattr(actors[i], method).remote(op, ks, ref, t))
                continue
            answer, back[i] = actors[i].call_with_visitors.remote(method, op, ks, ref, t, *lent[i])
            futures.append(answer)
        # the visitors' new states go home, actor to actor; asked for after every call, so that
        # no actor's own training waits behind a take (an actor runs its calls in order)
        returned = [actors[o].take.remote(states) for i, states in sorted(back.items()) for o in visitors[i]
                    if trains]
        return futures, returned

    def _stragglers_left_out(self, futures: list, asked: list[list[int]],
                             deadline_s: float) -> tuple[list, list[list[int]]]:
        """``ray.round_deadline_s``: each client is timed on its actor and a late one left out of
        the answer; an actor that has not answered once each of its clients could have used the
        whole deadline (plus a grace) is a straggler as a whole: it finishes in the background,
        unused, its clients late. The futures and clients still awaited."""
        guard = deadline_s * max(map(len, asked)) + self.rc.deadline_grace_s
        _, pending = ray.wait(futures, num_returns=len(futures), timeout=guard)
        for f in pending:
            self.late += asked[futures.index(f)]
        kept = [i for i, f in enumerate(futures) if f not in pending]
        return [futures[i] for i in kept], [asked[i] for i in kept]

    def get_states(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for part in self.pool.gather([a.get_states.remote() for a in self.actors], "states", self.pool.everyone()):
            out.update(part)
        return out

    def set_states(self, states: dict[int, Any]) -> None:
        self.pool.gather([a.set_states.remote({k: states[k] for k in block})
                          for a, block in zip(self.actors, self.pool.blocks)], "states", self.pool.everyone())

    def reset(self) -> None:
        self.pool.gather([a.reset.remote() for a in self.actors], "reset", self.pool.everyone())

    def kill(self, actor: int) -> None:
        """Fault injection: kill one client actor."""
        self.pool.kill(actor)

    def hang(self, actor: int, seconds: float) -> None:
        """Fault injection: one client actor busy, alive and silent, for ``seconds``."""
        self.pool.hang(actor, seconds)

    def recover(self) -> None:
        """Replace dead actors (and those that do not answer a ping within a minute: killed as
        hung) by new ones hosting the same clients (rebuilt from seed and id)."""
        self.pool.recover()
