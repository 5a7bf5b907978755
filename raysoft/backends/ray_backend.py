"""Ray backend: a coordinator actor runs the rounds over the client actors (:mod:`.actors`).

* The driver only paces the coordinator (one remote call per round, for the progress bar) and
  writes the results it returns: one writer. Each of its calls has a deadline; a coordinator that
  dies or hangs ends the run with one line (a checkpointed run resumes).
* Before any actor starts, the driver plans the client actors (:mod:`.plan`, a pure function)
  against the cluster's nodes (:mod:`.cluster`; for a local Ray it starts, before starting it,
  :mod:`.session`) and refuses a plan the cluster can never hold; it reserves their placement
  group and waits for it at most ``ray.placement_timeout_s``. An input error raised inside an
  actor (a bad data file, a config error) reaches the caller as the same one-line error as the
  driver's own checks.
* The coordinator lives on the driver's node (it writes checkpoints into the run directory
  there); the plug-ins named by import path travel with it (Ray's ``py_modules``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from ..config import Config, ConfigError, RayConfig, parse_config
from ..errors import CoordinatorFailure, first_line
from .actors import _DEAD, RayExecutor, _get
from .cluster import joined_cluster, reserve
from .deadlines import Deadlines
from .plan import Cluster, plan
from .session import connect, plugin_env, shutdown

if TYPE_CHECKING:  # the runtime imports torch: in the coordinator's process only
    from ray.util.placement_group import PlacementGroup

    from ..runtime import OneThread

# The driver imports neither torch nor the runtime (hundreds of MB per process;
# docs/performance.md): the coordinator and client actors import them in their own processes.


@ray.remote(num_cpus=0, concurrency_groups={"control": 1})  # type: ignore[call-overload]  # missing from Ray's stubs
class CoordinatorActor:
    """Runs the rounds of one experiment over the client actors (built by :meth:`start`, so
    that an error while building them is an ordinary task error, one line to the user).
    :meth:`shutdown` runs in a concurrency group of its own, so that a stopped run releases
    its client actors at once, not after the round (or upload) in progress."""

    def __init__(self) -> None:
        self.executor: RayExecutor | None = None
        self.coord: OneThread | None = None

    def start(self, cfg_dict: dict[str, Any], run_id: str, run_dir: str | None, resume: bool,
              blocks: list[list[int]], pg: PlacementGroup | None, first_bundle: int = 0) -> None:
        from ..runtime import make_coordinator

        cfg = parse_config(cfg_dict)
        self.executor = RayExecutor(cfg, blocks, pg, first_bundle)
        self.coord = make_coordinator(cfg, self.executor, run_id, run_dir=run_dir, resume=resume)

    @property
    def _coord(self) -> OneThread:
        if self.coord is None:
            raise RuntimeError("the coordinator actor was not started")
        return self.coord

    def advance(self, stop: bool = False) -> dict[str, Any]:
        return self._coord.advance(stop)

    @ray.method(concurrency_group="control")
    def shutdown(self) -> None:
        """Release the client actors (the driver removes the placement group it reserved);
        runs beside an ``advance`` in progress, which then fails (the run is being stopped)."""
        for a in self.executor.actors if self.executor is not None else ():
            ray.kill(a)

    def results(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._coord.results()


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

    def __call__(self, op: str, *args: object) -> Any:
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


def _release(coord: Any, pg: PlacementGroup | None) -> None:
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
