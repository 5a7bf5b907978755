"""Where the client actors go: a pure function from (number of clients, the ``ray`` section,
the cluster's nodes) to a plan, or a one-line refusal (:class:`~raysoft.config.ConfigError`)
naming the keys to change and what would fit. Neither Ray nor torch is imported: the driver
plans before Ray starts (a local Ray's resources are known then), and again from the nodes of
the cluster it joined.

Every client actor asks for one bundle, ``{"CPU": num_cpus_per_actor, "GPU":
num_gpus_per_actor}``, and a bundle must fit on one node. Ray hands out fractions of a GPU
within one GPU (a bundle of 0.4 GPU never straddles two), so a node of G GPUs hosts
``floor(G) * floor(1 / g)`` bundles of g GPU, plus those of any fractional rest. ``spread``,
``pack`` (Ray's PACK, which uses as few nodes as it can but more when it must) and ``none``
all need the same thing: enough bundles across the nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import ConfigError, RayConfig

if TYPE_CHECKING:
    import numpy as np

_EPS = 1e-9
_MANY = 10**12  # more actors than any cluster hosts; bounds the arithmetic of tiny requests


@dataclass(frozen=True)
class Cluster:
    """What the client actors can use: each node's total resources (``CPU``, ``GPU``), whether
    nodes may still arrive (an autoscaling cluster: the plan may wait for them), and how
    messages name it."""

    nodes: tuple[Mapping[str, float], ...]
    can_grow: bool = False
    name: str = "the cluster"

    @classmethod
    def of(cls, resources: Mapping[str, float] | Sequence[Mapping[str, float]], **kw) -> Cluster:
        """A cluster from one dict of resources (one node) or a list of them."""
        nodes = (resources,) if isinstance(resources, Mapping) else tuple(resources)
        return cls(nodes=nodes, **kw)

    def describe(self) -> str:
        cpus = sum(_amount(n, "CPU") for n in self.nodes)
        gpus = sum(_amount(n, "GPU") for n in self.nodes)
        nodes = f"{len(self.nodes)} nodes, " if len(self.nodes) != 1 else ""
        gpu = f"{gpus:g} GPU{'s' if gpus > 1 else ''}" if gpus > 0 else "no GPU"
        return f"{self.name} ({nodes}{cpus:g} CPU{'s' if cpus > 1 else ''}, {gpu})"


@dataclass(frozen=True)
class Plan:
    """Blocks of client ids, one per client actor, and the bundle each actor asks for.
    ``waiting`` is None when the cluster holds the actors now; otherwise it says what is
    missing, and the caller waits (at most ``ray.placement_timeout_s``) for nodes to arrive."""

    blocks: list[list[int]]
    bundle: dict[str, float] = field(default_factory=dict)
    waiting: str | None = None

    @property
    def actors(self) -> int:
        return len(self.blocks)


def _amount(node: Mapping[str, float], key: str) -> float:
    v = node.get(key, 0.0)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def _floor(x: float) -> int:
    """floor(x) for a count of actors (tolerant of float error, bounded, never negative)."""
    if not x > 0:
        return 0
    return int(min(math.floor(x + _EPS), _MANY)) if math.isfinite(x) else _MANY


def _gpu_slots(gpus: float, per_actor: float) -> int:
    """Bundles of ``per_actor`` GPU (0 < per_actor <= 1) on a node of ``gpus`` GPUs; a fraction
    is taken from within one GPU."""
    whole = _floor(gpus)
    rest = max(gpus - whole, 0.0)
    return min(whole * _floor(1.0 / per_actor) + _floor(rest / per_actor), _MANY)


def node_slots(node: Mapping[str, float], cpus: float, gpus: float) -> int:
    """How many client actors of (``cpus``, ``gpus``) one node hosts."""
    n = _floor(_amount(node, "CPU") / cpus) if cpus > 0 else _MANY
    if gpus > 0:
        n = min(n, _gpu_slots(_amount(node, "GPU"), gpus))
    return n


def slots(nodes: Sequence[Mapping[str, float]], cpus: float, gpus: float) -> int:
    return min(sum(node_slots(n, cpus, gpus) for n in nodes), _MANY)


def plan(num_clients: int, rc: RayConfig, cluster: Cluster) -> Plan:
    """The client actors' plan on ``cluster``; :class:`ConfigError` (one line) if the cluster
    can never hold it (and cannot grow)."""
    if num_clients < 1:
        raise ConfigError(f"data.clients: must be at least 1 (got {num_clients})")
    cpus, gpus = float(rc.num_cpus_per_actor), float(rc.num_gpus_per_actor)
    if not (cpus > 0 and math.isfinite(cpus)) or not (0 <= gpus <= 1):
        raise ConfigError(f"ray.num_cpus_per_actor / num_gpus_per_actor: cannot place actors of {cpus:g} CPU "
                          f"and {gpus:g} GPU")
    bundle = {"CPU": cpus, **({"GPU": gpus} if gpus > 0 else {})}
    have = slots(cluster.nodes, cpus, gpus)
    if rc.clients_per_actor == "auto":
        num_actors = max(1, min(num_clients, have))
        per_actor = math.ceil(num_clients / num_actors)
    else:
        per_actor = int(rc.clients_per_actor)
    ids = list(range(num_clients))
    blocks = [ids[i : i + per_actor] for i in range(0, num_clients, per_actor)]
    if have >= len(blocks):
        return Plan(blocks, bundle)
    why = refusal(num_clients, rc, cluster, len(blocks), have)
    if cluster.can_grow:
        return Plan(blocks, bundle, waiting=why)
    raise ConfigError(why)


def _bundle_text(cpus: float, gpus: float) -> str:
    gpu = f" and {gpus:g} GPU" if gpus > 0 else ""
    return f"{cpus:g} CPU{'s' if cpus > 1 else ''}{gpu}"


def _largest(fits, upper: float) -> float | None:
    """The largest value v in (0, upper], to Ray's precision (1e-4), with fits(v); None if none.
    ``fits`` is monotone: true below some threshold."""
    if upper <= 0 or not fits(1e-4):
        return None
    lo, hi = 1e-4, upper
    if fits(hi):
        return math.floor(hi * 1e4 + _EPS) / 1e4
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    v = math.floor(lo * 1e4) / 1e4
    return v if v > 0 and fits(v) else None


def refusal(num_clients: int, rc: RayConfig, cluster: Cluster, actors: int, have: int) -> str:
    """One line: why ``actors`` client actors do not fit ``cluster`` (which holds ``have``), the
    keys to change, and what would fit."""
    cpus, gpus = float(rc.num_cpus_per_actor), float(rc.num_gpus_per_actor)
    where = cluster.describe()
    nodes = cluster.nodes
    if have == 0:  # not even one actor: the bundle itself is too large for every node
        if gpus > 0 and not any(_gpu_slots(_amount(n, "GPU"), gpus) for n in nodes):
            most = max((_amount(n, "GPU") for n in nodes), default=0.0)
            if most <= 0:
                return (f"ray.num_gpus_per_actor: each client actor asks for {gpus:g} GPU but {where} has none; "
                        "set ray.num_gpus_per_actor: 0 (or join a cluster with GPUs: --address)")
            return (f"ray.num_gpus_per_actor: each client actor asks for {gpus:g} GPU but {where} has at most "
                    f"{most:g} on a node; set ray.num_gpus_per_actor to {min(most, 1.0):g} or less")
        most = max((_amount(n, "CPU") for n in nodes if not gpus or _gpu_slots(_amount(n, "GPU"), gpus)),
                   default=0.0)
        if most <= 0:
            return (f"ray.num_cpus_per_actor: each client actor asks for {cpus:g} CPU"
                    f"{'s' if cpus > 1 else ''} but {where} has no CPU for it"
                    + (" on a node with a GPU" if gpus > 0 else ""))
        return (
            f"ray.num_cpus_per_actor: each client actor asks for {cpus:g} CPU{'s' if cpus > 1 else ''} but "
            f"{where} has at most {most:g} on a node; set ray.num_cpus_per_actor to {math.floor(most * 1e4) / 1e4:g}"
            " or less"
        )
    per = "auto" if rc.clients_per_actor == "auto" else int(rc.clients_per_actor)
    fix = [f"set ray.clients_per_actor to {math.ceil(num_clients / have)} or more (or auto)"]
    c_fit = _largest(lambda v: slots(nodes, v, gpus) >= actors, cpus)
    if c_fit is not None and c_fit < cpus:
        fix.append(f"ray.num_cpus_per_actor to {c_fit:g} or less")
    if gpus > 0:
        g_fit = _largest(lambda v: slots(nodes, cpus, v) >= actors, gpus)
        if g_fit is not None and g_fit < gpus:
            fix.append(f"ray.num_gpus_per_actor to {g_fit:g} or less")
    return (f"ray.clients_per_actor: {num_clients} clients at {per} per actor make {actors} client actors of "
            f"{_bundle_text(cpus, gpus)} each, but {where} holds {have} at most; " + ", or ".join(fix))


def plan_actors(num_clients: int, rc: RayConfig,
                resources: Mapping[str, float] | Sequence[Mapping[str, float]]) -> list[list[int]]:
    """Blocks of client ids, one per actor, on a fixed cluster (one dict of resources per node,
    or one for the whole cluster); :class:`ConfigError` if they cannot all be placed."""
    return plan(num_clients, rc, Cluster.of(resources)).blocks


def not_placed(num_clients: int, rc: RayConfig, cluster: Cluster, actors: int, seconds: float) -> str:
    """One line: ``actors`` client actors waited ``seconds`` for ``cluster`` (as it is now) in
    vain; why (the plan's refusal on the cluster as it stands, or other work holding it)."""
    head = (f"ray.placement_timeout_s: {actors} client actors of "
            f"{_bundle_text(float(rc.num_cpus_per_actor), float(rc.num_gpus_per_actor))} each were not placed "
            f"within {seconds:g} s")
    try:
        plan(num_clients, rc, Cluster(cluster.nodes, can_grow=False, name=cluster.name))
    except ConfigError as err:
        return f"{head}: {err}"
    return (f"{head}: {cluster.describe()} has room for them, but other work holds it; try again later or raise "
            "ray.placement_timeout_s")


def balanced_segments(ids: Sequence[int], costs: Sequence[int] | np.ndarray, parts: int) -> list[list[int]]:
    """A call's clients ``ids`` split into at most ``parts`` runs of consecutive ids (in id order),
    the largest run's cost (``costs[k]``: client k's samples) as small as any split into runs can
    make it; earlier runs are filled first. Runs of consecutive ids keep the sums of the chain in
    client-id order, and the split depends only on the ids, their costs and ``parts``."""
    ids = sorted(int(k) for k in ids)
    if parts < 1:
        raise ValueError(f"balanced_segments: parts must be at least 1 (got {parts})")
    if not ids:
        return []
    c = [max(int(costs[k]), 1) for k in ids]

    def runs(cap: int) -> list[list[int]]:
        out: list[list[int]] = [[]]
        load = 0
        for k, ck in zip(ids, c):
            if out[-1] and load + ck > cap:
                out.append([])
                load = 0
            out[-1].append(k)
            load += ck
        return out

    lo, hi = max(c), sum(c)  # the smallest cap that needs at most ``parts`` runs
    while lo < hi:
        mid = (lo + hi) // 2
        if len(runs(mid)) <= parts:
            hi = mid
        else:
            lo = mid + 1
    return runs(lo)
