"""Ray backend: a coordinator actor runs the rounds; client actors host the clients.

* Each client actor hosts a contiguous block of clients (``ray.clients_per_actor``; ``auto``
  sizes the pool to the cluster's CPUs, or GPU shares when ``num_gpus_per_actor > 0``), builds
  their data itself from (config, client id, seed), and keeps their state across rounds.
* Each client call's payload (e.g. the round's centers) is put in the object store once and
  every actor receives the same reference.
* The actor declares ``num_cpus_per_actor`` / ``num_gpus_per_actor`` and uses CUDA only when
  Ray gave it a GPU and torch sees one.
* The driver only paces the coordinator (one remote call per round, for the progress bar) and
  writes the results it returns: one writer.
* Before any actor starts, the driver plans the client actors (:mod:`.plan`, a pure function)
  against the cluster's nodes (for a local Ray it starts, before starting it) and refuses a plan
  the cluster can never hold; it reserves their placement group and waits for it at most
  ``ray.placement_timeout_s``. An input error raised inside an actor (a bad data file, a config
  error) reaches the caller as the same one-line error as the driver's own checks.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import ray

from ..config import Config, ConfigError, RayConfig, parse_config
from ..errors import ClientFailure, CoordinatorFailure, JoinError, RaysoftError, first_line
from ..interrupts import keep_sigterm_handler
from ..plugins import ship_paths
from . import auth
from .deadlines import Deadlines
from .join import probe
from .plan import Cluster, Plan, balanced_segments, not_placed, plan, plan_actors  # noqa: F401 - plan_actors re-exported

# The driver imports neither torch nor the runtime (hundreds of MB per process;
# docs/performance.md): the coordinator and client actors import them in their own processes.

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
            return type(e)(str(e))
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


# --------------------------------------------------------------------------- resources
def local_cluster(rc: RayConfig) -> Cluster | None:
    """The local Ray that :func:`connect` would start, known before it starts: Ray's own
    detection of CPUs and GPUs (``ray.num_cpus``, CUDA_VISIBLE_DEVICES and Ray's resource
    overrides respected; torch is not imported). Should that detection be unavailable (a
    private API), the CPUs are ``ray.num_cpus`` or the machine's, and a plan that asks for GPUs
    is left to the check made once Ray runs (None)."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec(num_cpus=rc.num_cpus).resolve(is_head=True, node_ip_address="127.0.0.1")
        if spec.num_cpus is None:
            raise ValueError("no CPU count")
        node = {"CPU": float(spec.num_cpus), "GPU": float(spec.num_gpus or 0)}
    except Exception:  # noqa: BLE001 - a private API
        if rc.num_gpus_per_actor > 0:
            return None
        node = {"CPU": float(rc.num_cpus or os.cpu_count() or 1)}
    return Cluster((node,), can_grow=False, name="the local Ray")


def joined_cluster() -> Cluster:
    """The nodes of the Ray this process is connected to. It may grow unless this process
    started it (a local Ray): an autoscaler may add nodes to any other."""
    nodes = tuple(n["Resources"] for n in ray.nodes() if n.get("Alive")) or (ray.cluster_resources(),)
    try:  # the node ray.init started in this process, if it did (a private attribute)
        from ray._private import worker

        local = bool(getattr(worker._global_node, "ray_init_cluster", False))
    except Exception:  # noqa: BLE001 - without it, assume the cluster may grow (and wait, bounded)
        local = False
    return Cluster(nodes, can_grow=not local, name="the local Ray" if local else "the cluster")


def preflight(cfg: Config) -> None:
    """Refuse (:class:`ConfigError`, one line) a plan of client actors that can never be
    placed, before Ray starts when raysoft is to start a local Ray, or on the Ray this process
    is already connected to; a cluster still to be joined is checked once joined."""
    rc = cfg.ray
    if rc.placement == "trial":  # inside a Tune trial: checked against the trial's reservation
        return
    if ray.is_initialized():
        cluster: Cluster | None = joined_cluster()
    elif rc.address or os.environ.get("RAY_ADDRESS"):
        return
    else:
        cluster = local_cluster(rc)
    if cluster is not None:
        plan(cfg.data.clients, rc, cluster)


def reserve(cfg: Config, p: Plan):
    """The placement group of the plan's actors (None with ``placement: none``), once Ray has
    placed it; :class:`ConfigError` if it is not placed within ``ray.placement_timeout_s``."""
    rc = cfg.ray
    if p.waiting:
        log.warning("waiting up to %g s (ray.placement_timeout_s) for the cluster to grow: %s",
                    rc.placement_timeout_s, p.waiting)
    if rc.placement == "none":
        return None
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([dict(p.bundle) for _ in p.blocks], strategy=rc.placement.upper())
    try:
        ray.get(pg.ready(), timeout=rc.placement_timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise ConfigError(
            not_placed(cfg.data.clients, rc, joined_cluster(), p.actors, rc.placement_timeout_s)
        ) from None
    except BaseException:
        remove_placement_group(pg)
        raise
    return pg


@ray.remote
class ClientActor:
    """Thin wrapper around a ClientHost, built by :meth:`start` (so that the wait for the
    actor's placement is apart from the building of its clients, and an error while building
    them is an ordinary task error, one line to the user)."""

    def __init__(self, cfg_dict: dict[str, Any], client_ids: list[int]) -> None:
        self.cfg_dict, self.client_ids = cfg_dict, list(client_ids)
        self.host: Any = None

    def ping(self) -> bool:
        return True

    def hang(self, seconds: float) -> None:
        """Fault injection (``hang_actor``): busy, alive and silent for ``seconds``."""
        import time

        time.sleep(seconds)

    def start(self) -> dict[str, Any]:
        import torch

        from .host import ClientHost

        cfg = parse_config(self.cfg_dict)
        gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        device = "cuda" if gpu_ids and torch.cuda.is_available() else "cpu"
        self.host = ClientHost(cfg, self.client_ids, device=device)
        return self.describe()

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        return self.host.call(op, client_ids, payload, t)

    def keep(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             part: int | None) -> dict[int, Any]:
        return self.host.keep(op, client_ids, payload, t, part)

    def add_terms(self, terms: dict[int, Any], acc: Any, fresh: bool = False) -> Any:
        return self.host.add_terms(terms, acc, fresh)

    def combine(self, a: Any, b: Any) -> Any:
        """One addition of the tree (``Plan.apply``'s ``pairwise``): ``a + b``."""
        import torch

        return torch.add(a, b)

    def lend(self, client_ids: list[int]) -> dict[int, Any]:
        return self.host.lend(client_ids)

    def take(self, states: dict[int, Any]) -> None:
        self.host.take(states)

    @ray.method(num_returns=2)
    def visit(self, method: str, op: str, client_ids: list[int], payload: dict[str, Any], t: int, extra: tuple,
              *lent: dict[int, Any]) -> tuple[Any, dict[int, Any]]:
        return self.host.visit(method, op, client_ids, payload, t, extra, lent)

    def get_states(self) -> dict[int, Any]:
        return self.host.get_states()

    def set_states(self, states: dict[int, Any]) -> None:
        self.host.set_states(states)

    def reset(self) -> None:
        self.host.reset()

    def describe(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"clients": self.host.client_ids, "node_id": ctx.get_node_id(), "device": str(self.host.device)}


class RayExecutor:
    """Runs client ops on the client actors (used inside the coordinator actor), one actor per
    block of the driver's plan, in its placement group ``pg`` (None: Ray's default placement)
    from bundle ``first_bundle`` on (a Tune trial's reservation starts with the trial's own)."""

    def __init__(self, cfg: Config, blocks: list[list[int]], pg: Any = None, first_bundle: int = 0) -> None:
        self.cfg_dict = cfg.to_dict()
        self.num_clients = cfg.data.clients
        self.rc = cfg.ray
        self.blocks = blocks
        self.pg, self.first_bundle = pg, first_bundle
        self.deadlines = Deadlines(self.rc.call_timeout_s)  # no wait on a live actor without one
        self.actors: list[Any] = []
        for i, block in enumerate(self.blocks):
            self.actors.append(self._create(block, i))
        self._placed(range(len(self.actors)))
        self.owner = {k: i for i, block in enumerate(self.blocks) for k in block}
        for attempt in range(5):  # an actor that dies while the clients are built is replaced
            try:
                self.placement = self._gather([a.start.remote() for a in self.actors], "start",
                                              list(range(len(self.actors))))
                break
            except ClientFailure:
                if attempt == 4:
                    raise
                self._replace_dead()
        self.late: list[int] = []  # clients whose updates missed the last call's deadline
        self.costs: Any = None  # per client: its samples (balanced rounds), from set_costs
        self.where: dict[int, int] = {}  # client -> the actor its last keep ran on
        self.samples = [0] * len(self.actors)  # per actor: training samples run since take_counters()
        self.moved = 0  # clients trained away from their actor since take_counters()
        from functools import partial

        from ..algorithms import make_algorithm
        from ..algorithms.base import leaves_state  # torch: imported where the executor runs, not on the driver

        self.leaves_state = partial(leaves_state, make_algorithm(cfg.algorithm))  # op -> its clients' states unchanged

    def set_costs(self, costs: Any) -> None:
        """Each client's cost (its training samples): with ``ray.balance: cost``, the clients of a
        training call are split over the actors by it."""
        self.costs = costs

    def take_counters(self) -> dict[str, Any]:
        """Since the last call: each actor's training samples (a client's samples per training
        call, the cost ``ray.balance`` evens out) and the clients trained away from their actor."""
        out = {"actor_samples": list(self.samples), "clients_moved": self.moved}
        self.samples, self.moved = [0] * len(self.actors), 0
        return out

    def _groups(self, op: str, client_ids: list[int]) -> dict[int, list[int]]:
        """Which actor runs which clients of a call: by owner, or (``ray.balance: cost``, for
        the ops that change client states, i.e. training) runs of consecutive client ids of
        even cost, run j on actor j (other actors' clients visit it with their states)."""
        balance = (self.rc.balance == "cost" and self.costs is not None and not self.leaves_state(op)
                   and self.rc.round_deadline_s is None and len(self.actors) > 1)
        if balance:
            return dict(enumerate(balanced_segments(client_ids, self.costs, len(self.actors))))
        groups: dict[int, list[int]] = {}
        for k in sorted(client_ids):
            groups.setdefault(self.owner[k], []).append(k)
        return groups

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
        self._gather(refs, "ping", indices)

    def _gather(self, futures: list, op: str = "call", who: list[int] | None = None) -> list:
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

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        return self._run("call", op, client_ids, payload, t)

    def keep(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             part: int | None) -> dict[int, Any]:
        return self._run("keep", op, client_ids, payload, t, (part,))

    def accumulate(self, plan: Any) -> Any:
        """The chain: the actor with the lowest client ids starts the sum from the plan's start,
        each next actor adds its clients' terms to the partial sum it receives (Ray passes the
        reference on, the tensor goes actor to actor), so the terms are added in client-id
        order whatever the packing. The training ran in parallel before; only these additions
        are sequential."""
        if self.rc.sum_shape == "tree":
            return self._tree(plan)
        return self._gather([self._chain(plan.terms, plan.start)[0]], "sum")[0]

    def _chain(self, terms: dict[int, Any], acc: Any, fresh: bool = False) -> tuple[Any, int]:
        """The reference to ``acc`` plus ``terms``, added actor after actor in client-id order
        (``fresh``: from zeros like ``acc``), and the actor it ends on."""
        parts: dict[int, dict[int, Any]] = {}
        for k in sorted(terms):
            parts.setdefault(self.where.get(k, self.owner[k]), {})[k] = terms[k]
        order = sorted(parts, key=lambda i: min(parts[i]))
        for a, b in zip(order, order[1:]):
            if max(parts[a]) > min(parts[b]):  # blocks are contiguous ranges; never interleave
                raise RuntimeError("accumulate: actors' client blocks interleave")
        for n, i in enumerate(order):
            acc = self.actors[i].add_terms.remote(parts[i], acc, fresh and n == 0)
        return acc, order[-1]

    def _tree(self, plan: Any) -> Any:
        """``ray.sum_shape: tree``: each run of ``sum_group`` consecutive clients is a short
        chain from zeros (all runs at once), the runs' sums are added pairwise on the actors, and
        the total to the start: the additions of ``Plan.apply(parts, group)``, log-depth."""
        start = None if plan.start is None else ray.put(plan.start)
        level = [self._chain(terms, start, fresh=True) for terms in plan.groups(self.rc.sum_group)]
        # each pair is added on the actor that made its first sum (the tensor is already there)
        while len(level) > 1:
            pairs = zip(level[0::2], level[1::2])
            level = [(self.actors[i].combine.remote(a, b), i) for (a, i), (b, _) in pairs] + (
                level[-1:] if len(level) % 2 else [])
        total, i = level[0]
        if start is not None:  # start + total, as Plan.finish
            total = self.actors[i].combine.remote(start, total)
        return self._gather([total], "sum")[0]

    def _run(self, method: str, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             extra: tuple = ()) -> dict[int, Any]:
        ref = ray.put(payload)  # once per call, shared by every actor
        groups = self._groups(op, client_ids)
        self.where = {k: i for i, ks in groups.items() for k in ks}
        if not self.leaves_state(op) and self.costs is not None:
            for i, ks in groups.items():
                self.samples[i] += sum(int(self.costs[k]) for k in ks)
        visitors: dict[int, dict[int, list[int]]] = {}  # actor -> owner -> the owner's clients it runs
        for i, ks in groups.items():
            for k in ks:
                if self.owner[k] != i:
                    visitors.setdefault(i, {}).setdefault(self.owner[k], []).append(k)
                    self.moved += 1
        # every loan is asked for before any call, so that no owner lends only after its own training
        lent = {i: [self.actors[o].lend.remote(g) for o, g in sorted(vis.items())] for i, vis in visitors.items()}
        futures, back = [], {}
        for i, ks in sorted(groups.items()):
            if i not in lent:
                futures.append(getattr(self.actors[i], method).remote(op, ks, ref, t, *extra))
                continue
            visit, back[i] = self.actors[i].visit.remote(method, op, ks, ref, t, tuple(extra), *lent[i])
            futures.append(visit)
        # the visitors' new states go home, actor to actor; asked for after every call, so that
        # no actor's own training waits behind a take (an actor runs its calls in order)
        returned = [self.actors[o].take.remote(states) for i, states in sorted(back.items()) for o in visitors[i]
                    if not self.leaves_state(op)]
        self.late = []
        asked = [groups[i] for i in sorted(groups)]
        if self.rc.round_deadline_s is not None and not self.leaves_state(op):
            # each client is timed on its actor and a late one left out of the answer; an actor
            # that has not answered once each of its clients could have used the whole deadline
            # (plus a grace) is a straggler as a whole: it finishes in the background, unused
            guard = self.rc.round_deadline_s * max(map(len, asked)) + self.rc.deadline_grace_s
            _, pending = ray.wait(futures, num_returns=len(futures), timeout=guard)
            for f in pending:
                self.late += asked[futures.index(f)]
            kept = [i for i, f in enumerate(futures) if f not in pending]
            futures, asked = [futures[i] for i in kept], [asked[i] for i in kept]
        out: dict[int, Any] = {}
        who = [self.where[ks[0]] for ks in asked]
        for ks, result in zip(asked, self._gather(futures, op, who)):
            out.update(result)
            self.late += [k for k in ks if k not in result]  # timed out on its actor
        self.late.sort()
        self._gather(returned, "take")
        return out

    def get_states(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        everyone = list(range(len(self.actors)))
        for part in self._gather([a.get_states.remote() for a in self.actors], "states", everyone):
            out.update(part)
        return out

    def set_states(self, states: dict[int, Any]) -> None:
        self._gather([a.set_states.remote({k: states[k] for k in block}) for a, block in zip(self.actors, self.blocks)],
                     "states", list(range(len(self.actors))))

    def reset(self) -> None:
        self._gather([a.reset.remote() for a in self.actors], "reset", list(range(len(self.actors))))

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
        for i, where in zip(dead, self._gather([self.actors[i].start.remote() for i in dead], "start", dead)):
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


@ray.remote(num_cpus=0, concurrency_groups={"control": 1})  # type: ignore[call-overload]  # missing from Ray's stubs
class CoordinatorActor:
    """Runs the rounds of one experiment over the client actors (built by :meth:`start`, so
    that an error while building them is an ordinary task error, one line to the user).
    :meth:`shutdown` runs in a concurrency group of its own, so that a stopped run releases
    its client actors at once, not after the round (or upload) in progress."""

    def __init__(self) -> None:
        self.executor: RayExecutor | None = None
        self.coord: Any = None

    def start(self, cfg_dict: dict[str, Any], run_id: str, run_dir: str | None, resume: bool,
              blocks: list[list[int]], pg: Any, first_bundle: int = 0) -> None:
        from ..runtime import make_coordinator

        cfg = parse_config(cfg_dict)
        self.executor = RayExecutor(cfg, blocks, pg, first_bundle)
        self.coord = make_coordinator(cfg, self.executor, run_id, run_dir=run_dir, resume=resume)

    def advance(self, stop: bool = False) -> dict[str, Any]:
        return self.coord.advance(stop)

    @ray.method(concurrency_group="control")
    def shutdown(self) -> None:
        """Release the client actors (the driver removes the placement group it reserved);
        runs beside an ``advance`` in progress, which then fails (the run is being stopped)."""
        for a in self.executor.actors if self.executor is not None else ():
            ray.kill(a)

    def results(self):
        return self.coord.results()


def plugin_env(cfg: Config) -> dict[str, Any] | None:
    """The runtime environment that makes the config's plug-ins importable in the coordinator and
    its client actors (which inherit it): the plug-in modules named by import path, uploaded to
    the cluster (Ray's ``py_modules``; Ray takes local paths at ``ray.init`` only, so they are
    uploaded here, as ``ray.init`` would, and named by their content-hash URIs). None when every
    plug-in is installed or built in."""
    paths = ship_paths(cfg)
    if not paths:
        return None
    import tempfile

    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    with tempfile.TemporaryDirectory(prefix="raysoft-ship-") as scratch:
        return upload_py_modules_if_needed({"py_modules": paths}, include_gitignore=True, scratch_dir=scratch)


def connect(rc: RayConfig, runtime_env: dict[str, Any] | None = None) -> bool:
    """Join the cluster of ``ray.address`` (or RAY_ADDRESS), else start a local Ray of its own
    (the one :func:`local_cluster` describes); True if this call started (and so must stop) it.
    ``runtime_env``: this driver's job's (a sweep's plug-ins, for its trials). A run's SIGTERM
    handler survives ``ray.init`` (which installs its own)."""
    if ray.is_initialized():
        return False
    address = rc.address or os.environ.get("RAY_ADDRESS")
    source = "ray.address" if rc.address else "RAY_ADDRESS"
    if address and address != "local":  # nothing answering there: one line within the deadline
        probe(address, rc.join_timeout_s, source)
    auth.prepare(None if address in (None, "local") else address)
    with keep_sigterm_handler():
        if address:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                         runtime_env=runtime_env)
            except ConnectionError as err:
                raise JoinError(f"{source} {address}: {first_line(err)}") from None
        else:  # a new local Ray, even if another one runs on this machine (Ray would join it)
            ray.init(
                address="local",
                num_cpus=rc.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env=runtime_env,
            )
            _start_watchdog()
    return True


_WATCHDOG: list[Any] = []  # the watchdog of the local Ray this process started, if any


def _start_watchdog() -> None:
    """A process that ends the local Ray just started once this driver is gone, even if the
    driver is killed with SIGKILL and cannot clean up (``watchdog.py``)."""
    import subprocess
    import sys

    node = getattr(ray._private.worker, "_global_node", None)
    pids = [info.process.pid for infos in getattr(node, "all_processes", {}).values() for info in infos
            if getattr(info, "process", None) is not None]
    if not pids:
        return
    script = os.path.join(os.path.dirname(__file__), "watchdog.py")
    _WATCHDOG.append(subprocess.Popen([sys.executable, script, str(os.getpid()), *map(str, pids)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))


def shutdown() -> None:
    """Stop the local Ray this process started (and its watchdog)."""
    ray.shutdown()
    while _WATCHDOG:
        w = _WATCHDOG.pop()
        w.terminate()
        w.wait(timeout=10)


def run(cfg: Config, run_id: str, on_progress, run_dir: str | None = None, resume: bool = False):
    """Plan the client actors on the cluster (refusing a plan it can never hold), reserve their
    placement group (waiting at most ``ray.placement_timeout_s``), then drive the coordinator.
    The per-round waits have no deadline: a round takes as long as its clients' training (a
    dead actor or node ends the wait with an error; ``ray.round_deadline_s`` drops stragglers),
    and a signal interrupts them."""
    from .drive import drive

    trial_pg = None
    if cfg.ray.placement == "trial":
        from ray.util import get_current_placement_group

        trial_pg = get_current_placement_group()
        if trial_pg is None:
            raise ConfigError("ray.placement: trial is for runs inside a Ray Tune trial (raysoft sweep); "
                              "use spread, pack or none")
    started = connect(cfg.ray)
    coord = pg = None
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if trial_pg is not None:  # the trial's bundles after its own, each one actor's "node"
            reserved = Cluster(tuple(trial_pg.bundle_specs[1:]), name="the trial's reservation")
            p = plan(cfg.data.clients, cfg.ray, reserved)
            if p.actors > len(reserved.nodes):
                raise ConfigError(f"ray.placement: trial: the trial reserved {len(reserved.nodes)} actor bundles "
                                  f"for {p.actors} client actors")
        else:
            p = plan(cfg.data.clients, cfg.ray, joined_cluster())
            pg = reserve(cfg, p)
        # the coordinator lives on the driver's node: it writes checkpoints into the run
        # directory there, and losing a worker node must not take it away
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        # the plug-ins named by import path travel with the coordinator (Ray's py_modules); its
        # client actors inherit its runtime environment
        env = plugin_env(cfg)
        coord = CoordinatorActor.options(  # type: ignore[attr-defined]  # an ActorClass
            scheduling_strategy=here, **({"runtime_env": env} if env else {})).remote()
        ask = _Asker(coord, cfg.ray)
        ask("start", cfg.to_dict(), run_id, run_dir, resume, p.blocks, pg or trial_pg, 1 if trial_pg is not None else 0)
        advance: Callable[..., dict[str, Any]] = lambda stop=False: ask("advance", stop)  # noqa: E731
        drive(advance, on_progress)
        return ask("results")
    finally:
        _release(coord, pg)
        if started:
            shutdown()


class _Asker:
    """The driver's calls to the coordinator, each with a deadline (the coordinator's own waits
    on its client actors have theirs, :class:`RayExecutor`; the driver's is looser, so that the
    coordinator can notice a hung client actor and recover first). A coordinator that died or
    did not answer in time is a :class:`CoordinatorFailure`, one line."""

    def __init__(self, coord: Any, rc: RayConfig) -> None:
        self.coord, self.rc = coord, rc
        self.deadlines = Deadlines()

    def limit(self, op: str) -> float:
        if op == "start":  # placing the client actors, then building their clients
            return self.rc.placement_timeout_s + 2 * self.deadlines.limit(op)
        fixed = 4 * self.rc.call_timeout_s + 120 if self.rc.call_timeout_s is not None else 0.0
        return max(2 * self.deadlines.limit(op) + 120, fixed)

    def __call__(self, op: str, *args: Any) -> Any:
        ref = getattr(self.coord, op).remote(*args)
        began, limit = time.monotonic(), self.limit(op)
        ready, _ = ray.wait([ref], timeout=limit)
        if not ready:
            ray.kill(self.coord)
            raise CoordinatorFailure(f"the coordinator actor did not answer {op!r} within {limit:g} s (hung): "
                                     "stopped; ray.call_timeout_s sets the waits")
        try:
            out = _get(ref)
        except _DEAD as err:
            raise CoordinatorFailure(f"the coordinator actor died during {op!r} ({first_line(err)})") from None
        self.deadlines.measured(op, time.monotonic() - began)
        return out


def _release(coord: Any, pg: Any) -> None:
    """Stop the coordinator and its client actors and free their placement group (best effort,
    bounded: the coordinator may be gone)."""
    if coord is not None:
        try:
            ray.get(coord.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - best effort
            pass
        ray.kill(coord)
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - best effort
            pass
