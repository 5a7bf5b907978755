"""The cluster a run's client actors must fit on: its nodes (a local Ray known before it
starts, or the joined one), the check of a plan against them before anything starts, and the
placement group that reserves them, with a deadline (``ray.placement_timeout_s``)."""

from __future__ import annotations

import logging
import os

import ray

from ..config import Config, ConfigError, RayConfig
from . import raycompat
from .plan import Cluster, Plan, not_placed, plan

log = logging.getLogger(__name__)


def local_cluster(rc: RayConfig) -> Cluster | None:
    """The local Ray that :func:`connect` would start, known before it starts: Ray's own
    detection of CPUs and GPUs (``ray.num_cpus``, CUDA_VISIBLE_DEVICES and Ray's resource
    overrides respected; torch is not imported). Should that detection be unavailable (a
    private API), the CPUs are ``ray.num_cpus`` or the machine's, and a plan that asks for GPUs
    is left to the check made once Ray runs (None)."""
    node = raycompat.local_resources(rc.num_cpus)
    if node is None:
        if rc.num_gpus_per_actor > 0:
            return None
        node = {"CPU": float(rc.num_cpus or os.cpu_count() or 1)}
    return Cluster((node,), can_grow=False, name="the local Ray")


def joined_cluster() -> Cluster:
    """The nodes of the Ray this process is connected to. It may grow unless this process
    started it (a local Ray): an autoscaler may add nodes to any other."""
    nodes = tuple(n["Resources"] for n in ray.nodes() if n.get("Alive")) or (ray.cluster_resources(),)
    local = raycompat.started_here()  # unknown: the cluster may grow (and the wait is bounded)
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
