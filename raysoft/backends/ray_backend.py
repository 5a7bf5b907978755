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
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import ray

from ..config import Config, ConfigError, RayConfig, parse_config

# The driver imports neither torch nor the runtime (about 0.5 GB of resident memory): the
# coordinator and client actors import them in their own processes.

log = logging.getLogger(__name__)

# what a dead client actor or node looks like to the caller
_DEAD = tuple(
    getattr(ray.exceptions, name)
    for name in ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
                 "NodeDiedError", "ObjectLostError", "OwnerDiedError")
    if hasattr(ray.exceptions, name)
)


def _slots(rc: RayConfig, res: dict[str, float]) -> int:
    """How many client actors one node (or pool of resources) can host."""
    slots = math.floor(res.get("CPU", 0.0) / rc.num_cpus_per_actor + 1e-9)
    if rc.num_gpus_per_actor > 0:
        slots = min(slots, math.floor(res.get("GPU", 0.0) / rc.num_gpus_per_actor + 1e-9))
    return max(slots, 0)


def plan_actors(num_clients: int, rc: RayConfig, resources: dict[str, float] | list[dict[str, float]]) -> list[list[int]]:
    """Blocks of client ids, one per actor. With ``auto``, the pool is sized node by node from
    ``resources`` (one dict per alive node, or one dict for the whole cluster)."""
    if rc.clients_per_actor == "auto":
        nodes = [resources] if isinstance(resources, dict) else list(resources)
        if rc.num_gpus_per_actor > 0 and not any(n.get("GPU", 0.0) > 0 for n in nodes):
            raise RuntimeError(f"ray.num_gpus_per_actor is {rc.num_gpus_per_actor} but the cluster has no GPU")
        num_actors = max(1, min(num_clients, sum(_slots(rc, n) for n in nodes)))
        per_actor = math.ceil(num_clients / num_actors)
    else:
        per_actor = int(rc.clients_per_actor)
    ids = list(range(num_clients))
    return [ids[i : i + per_actor] for i in range(0, num_clients, per_actor)]


@ray.remote
class ClientActor:
    """Thin wrapper around a ClientHost."""

    def __init__(self, cfg_dict: dict[str, Any], client_ids: list[int]) -> None:
        import torch

        from .host import ClientHost

        cfg = parse_config(cfg_dict)
        gpu_ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        device = "cuda" if gpu_ids and torch.cuda.is_available() else "cpu"
        self.host = ClientHost(cfg, client_ids, device=device)

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        return self.host.call(op, client_ids, payload, t)

    def keep(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             part: int | None) -> dict[int, Any]:
        return self.host.keep(op, client_ids, payload, t, part)

    def add_terms(self, terms: dict[int, Any], acc: Any) -> Any:
        return self.host.add_terms(terms, acc)

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
    """Runs client ops on the client actors (used inside the coordinator actor)."""

    def __init__(self, cfg: Config, trial_pg: Any = None) -> None:
        self.cfg_dict = cfg.to_dict()
        self.rc = cfg.ray
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.blocks = plan_actors(cfg.data.clients, self.rc, nodes or ray.cluster_resources())
        self.pg = None
        self.first_bundle, self.own_pg = 0, True
        if self.rc.placement == "trial":  # the bundles after the first of the Tune trial's reservation
            self.pg, self.first_bundle, self.own_pg = trial_pg, 1, False
            if len(trial_pg.bundle_specs) < 1 + len(self.blocks):
                raise RuntimeError(f"ray.placement: trial: the trial reserved {len(trial_pg.bundle_specs) - 1} "
                                   f"actor bundles for {len(self.blocks)} client actors")
        elif self.rc.placement != "none":  # one bundle per actor, spread over (or packed on) nodes
            from ray.util.placement_group import placement_group

            bundle = {"CPU": self.rc.num_cpus_per_actor}
            if self.rc.num_gpus_per_actor:
                bundle["GPU"] = self.rc.num_gpus_per_actor
            self.pg = placement_group([dict(bundle) for _ in self.blocks], strategy=self.rc.placement.upper())
            ray.get(self.pg.ready())
        self.actors = [self._start(block, i) for i, block in enumerate(self.blocks)]
        self.owner = {k: i for i, block in enumerate(self.blocks) for k in block}
        self.placement = ray.get([a.describe.remote() for a in self.actors])
        self.late: list[int] = []  # clients whose updates missed the last call's deadline

    def _start(self, block: list[int], index: int):
        opts: dict[str, Any] = {"num_cpus": self.rc.num_cpus_per_actor, "num_gpus": self.rc.num_gpus_per_actor}
        if self.pg is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=self.first_bundle + index)
        return ClientActor.options(**opts).remote(self.cfg_dict, block)

    def _gather(self, futures: list) -> list:
        try:
            return ray.get(futures)
        except _DEAD as err:
            from ..errors import ClientFailure

            raise ClientFailure(str(err).splitlines()[0]) from None

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
        parts: dict[int, dict[int, Any]] = {}
        for k in sorted(plan.terms):
            parts.setdefault(self.owner[k], {})[k] = plan.terms[k]
        order = sorted(parts, key=lambda i: min(parts[i]))
        for a, b in zip(order, order[1:]):
            if max(parts[a]) > min(parts[b]):  # blocks are contiguous ranges; never interleave
                raise RuntimeError("accumulate: actors' client blocks interleave")
        acc = plan.start
        for i in order:
            acc = self.actors[i].add_terms.remote(parts[i], acc)
        return self._gather([acc])[0]

    def _run(self, method: str, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             extra: tuple = ()) -> dict[int, Any]:
        ref = ray.put(payload)  # once per call, shared by every actor
        groups: dict[int, list[int]] = {}
        for k in client_ids:
            groups.setdefault(self.owner[k], []).append(k)
        futures = []
        for i, ks in sorted(groups.items()):
            futures.append(getattr(self.actors[i], method).remote(op, ks, ref, t, *extra))
        self.late = []
        if self.rc.round_deadline_s is not None and op != "evaluate":
            ready, pending = ray.wait(futures, num_returns=len(futures), timeout=self.rc.round_deadline_s)
            for f in pending:  # the actor finishes in the background; its updates are dropped
                self.late += groups[sorted(groups)[futures.index(f)]]
            futures = [f for f in futures if f not in pending]
        out: dict[int, Any] = {}
        for result in self._gather(futures):
            out.update(result)
        return out

    def get_states(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for part in self._gather([a.get_states.remote() for a in self.actors]):
            out.update(part)
        return out

    def set_states(self, states: dict[int, Any]) -> None:
        self._gather([a.set_states.remote({k: states[k] for k in block}) for a, block in zip(self.actors, self.blocks)])

    def reset(self) -> None:
        self._gather([a.reset.remote() for a in self.actors])

    def kill(self, actor: int) -> None:
        """Fault injection: kill one client actor."""
        ray.kill(self.actors[actor % len(self.actors)], no_restart=True)

    def recover(self) -> None:
        """Replace dead actors by new ones hosting the same clients (rebuilt from seed and id)."""
        for i, actor in enumerate(self.actors):
            try:
                ray.get(actor.describe.remote())
            except _DEAD:
                log.warning("client actor %d died; restarting it for clients %s", i, self.blocks[i][:3])
                self.actors[i] = self._start(self.blocks[i], i)
                self.placement[i] = self._gather([self.actors[i].describe.remote()])[0]


@ray.remote(num_cpus=0)
class CoordinatorActor:
    """Runs the rounds of one experiment over the client actors."""

    def __init__(self, cfg_dict: dict[str, Any], run_id: str, run_dir: str | None, resume: bool,
                 trial_pg: Any = None) -> None:
        from ..runtime import make_coordinator

        cfg = parse_config(cfg_dict)
        self.executor = RayExecutor(cfg, trial_pg)
        self.coord = make_coordinator(cfg, self.executor, run_id, run_dir=run_dir, resume=resume)

    def advance(self) -> dict[str, Any]:
        return self.coord.advance()

    def shutdown(self) -> None:
        """Release the client actors and their placement group."""
        for a in self.executor.actors:
            ray.kill(a)
        if self.executor.pg is not None and self.executor.own_pg:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.executor.pg)

    def results(self):
        return self.coord.results()


def connect(rc: RayConfig) -> bool:
    """Join or start Ray; True if this call started (and so must stop) it."""
    if ray.is_initialized():
        return False
    address = rc.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(
            num_cpus=rc.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    return True


def run(cfg: Config, run_id: str, on_progress, run_dir: str | None = None, resume: bool = False):
    from .drive import drive

    trial_pg = None
    if cfg.ray.placement == "trial":
        from ray.util import get_current_placement_group

        trial_pg = get_current_placement_group()
        if trial_pg is None:
            raise ConfigError("ray.placement: trial is for runs inside a Ray Tune trial (raysoft sweep); "
                              "use spread, pack or none")
    started = connect(cfg.ray)
    coord = None
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # the coordinator lives on the driver's node: it writes checkpoints into the run
        # directory there, and losing a worker node must not take it away
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        coord = CoordinatorActor.options(scheduling_strategy=here).remote(cfg.to_dict(), run_id, run_dir, resume,
                                                                          trial_pg)
        drive(lambda: ray.get(coord.advance.remote()), on_progress)
        return ray.get(coord.results.remote())
    finally:
        if coord is not None:
            try:
                ray.get(coord.shutdown.remote())
            except Exception:  # noqa: BLE001 - best effort: the coordinator may be gone
                pass
            ray.kill(coord)
        if started:
            ray.shutdown()
