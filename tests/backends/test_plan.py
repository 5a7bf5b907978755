"""The client actors' plan: a pure function of (clients, the ray section, the cluster's nodes)
that plans or refuses in one line; refusals before Ray starts; bounded waits for placement."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from support.configs import small_config

import raysoft
from raysoft.backends.plan import Cluster, not_placed, plan, slots
from raysoft.config import ConfigError, RayConfig

LOCAL = Cluster(({"CPU": 2.0},), name="the local Ray")


def _refusal(num_clients, rc, cluster=LOCAL) -> str:
    with pytest.raises(ConfigError) as err:
        plan(num_clients, rc, cluster)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- the planner alone
def test_one_cpu_actor_per_client_on_two_cpus_is_refused_with_what_fits():
    msg = _refusal(12, RayConfig(clients_per_actor=1))
    assert msg.startswith("ray.clients_per_actor: 12 clients at 1 per actor make 12 client actors of 1 CPU each")
    assert "the local Ray (2 CPUs, no GPU) holds 2 at most" in msg
    assert "set ray.clients_per_actor to 6 or more" in msg and "ray.num_cpus_per_actor to 0.1666 or less" in msg
    # what it suggests fits
    assert plan(12, RayConfig(clients_per_actor=6), LOCAL).actors == 2
    assert plan(12, RayConfig(clients_per_actor=1, num_cpus_per_actor=0.1666), LOCAL).actors == 12


@pytest.mark.parametrize("per_actor", [10, "auto"])
def test_gpu_actors_without_a_gpu_are_refused(per_actor):
    msg = _refusal(12, RayConfig(num_gpus_per_actor=0.25, clients_per_actor=per_actor))
    assert msg.startswith("ray.num_gpus_per_actor: each client actor asks for 0.25 GPU but the local Ray")
    assert "set ray.num_gpus_per_actor: 0" in msg


def test_gpu_fractions_stay_within_one_gpu():
    # 2 GPUs hold floor(1 / 0.4) = 2 actors each, not floor(2 / 0.4) = 5
    node = {"CPU": 64.0, "GPU": 2.0}
    assert slots([node], 1.0, 0.4) == 4
    assert plan(4, RayConfig(clients_per_actor=1, num_gpus_per_actor=0.4), Cluster((node,))).actors == 4
    msg = _refusal(5, RayConfig(clients_per_actor=1, num_gpus_per_actor=0.4), Cluster((node,)))
    assert "holds 4 at most" in msg and "ray.num_gpus_per_actor to 0.3333 or less" in msg


def test_an_actor_larger_than_every_node_is_refused():
    cluster = Cluster(({"CPU": 2.0}, {"CPU": 3.0}), name="the cluster")
    msg = _refusal(10, RayConfig(num_cpus_per_actor=4.0), cluster)
    assert msg.startswith("ray.num_cpus_per_actor: each client actor asks for 4 CPUs")
    assert "(2 nodes, 5 CPUs, no GPU) has at most 3 on a node; set ray.num_cpus_per_actor to 3 or less" in msg


def test_bundles_fit_node_by_node_for_every_placement():
    # 1.5 + 1.5 CPUs hold two actors of one CPU (not three), whether spread, packed or unplaced
    cluster = Cluster(({"CPU": 1.5}, {"CPU": 1.5}))
    for placement in ("spread", "pack", "none"):
        assert plan(10, RayConfig(clients_per_actor=5, placement=placement), cluster).actors == 2
        assert "holds 2 at most" in _refusal(10, RayConfig(clients_per_actor=3, placement=placement), cluster)


def test_a_cluster_that_may_grow_waits_instead_of_refusing():
    p = plan(12, RayConfig(clients_per_actor=1), Cluster(({"CPU": 2.0},), can_grow=True))
    assert p.actors == 12 and p.bundle == {"CPU": 1.0}
    assert p.waiting is not None and "holds 2 at most" in p.waiting
    assert plan(12, RayConfig(clients_per_actor=6), LOCAL).waiting is None


def test_not_placed_says_why():
    grown = Cluster(({"CPU": 2.0},), can_grow=True)
    msg = not_placed(12, RayConfig(clients_per_actor=1), grown, 12, 30.0)
    assert msg.startswith("ray.placement_timeout_s: 12 client actors of 1 CPU each were not placed within 30 s: "
                          "ray.clients_per_actor: ")
    busy = not_placed(4, RayConfig(clients_per_actor=2), grown, 2, 30.0)
    assert busy.endswith("has room for them, but other work holds it; try again later or raise "
                         "ray.placement_timeout_s")


@st.composite
def _requests(draw):
    rc = RayConfig(
        clients_per_actor=draw(st.one_of(st.just("auto"), st.integers(1, 60))),
        num_cpus_per_actor=draw(st.one_of(st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 16.0]),
                                          st.floats(1e-6, 128.0, allow_nan=False))),
        num_gpus_per_actor=draw(st.one_of(st.sampled_from([0.0, 0.04, 0.25, 0.5, 1.0]),
                                          st.floats(0.0, 1.0, allow_nan=False))),
        placement=draw(st.sampled_from(["spread", "pack", "none"])),
    )
    node = st.fixed_dictionaries({"CPU": st.one_of(st.integers(0, 64).map(float), st.floats(0.0, 256.0)),
                                  "GPU": st.one_of(st.integers(0, 8).map(float), st.floats(0.0, 4.0))})
    nodes = tuple(draw(st.lists(node, min_size=0, max_size=6)))
    return draw(st.integers(1, 500)), rc, Cluster(nodes, can_grow=draw(st.booleans()))


@settings(max_examples=400, deadline=2000)
@given(_requests())
def test_any_request_on_any_cluster_is_planned_or_refused_in_one_line(request):
    num_clients, rc, cluster = request
    try:
        p = plan(num_clients, rc, cluster)
    except ConfigError as err:
        msg = str(err)
        assert msg and "\n" not in msg and msg.startswith("ray.")
        assert not cluster.can_grow
        return
    assert sorted(sum(p.blocks, [])) == list(range(num_clients)) and all(p.blocks)
    fits = slots(cluster.nodes, rc.num_cpus_per_actor, rc.num_gpus_per_actor) >= p.actors
    assert (p.waiting is None) == fits
    if p.waiting is not None:
        assert cluster.can_grow and "\n" not in p.waiting
    if rc.clients_per_actor != "auto":
        assert p.actors == math.ceil(num_clients / rc.clients_per_actor)


# --------------------------------------------------------------------------- before Ray starts
def test_a_local_rays_resources_are_known_before_it_starts(monkeypatch):
    from raysoft.backends.cluster import local_cluster

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cluster = local_cluster(RayConfig(num_cpus=3))
    assert cluster.nodes == ({"CPU": 3.0, "GPU": 0.0},) and not cluster.can_grow

    def unavailable(*a, **k):
        raise RuntimeError("no such private API")

    monkeypatch.setattr("ray._private.resource_and_label_spec.ResourceAndLabelSpec.resolve", unavailable)
    assert local_cluster(RayConfig(num_cpus=3)).nodes == ({"CPU": 3.0},)
    assert local_cluster(RayConfig(num_gpus_per_actor=0.5)) is None  # checked once Ray runs


def _cli(tmp_path, *overrides, clients=12):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config(data={"clients": clients}, ray={"backend": "ray", "num_cpus": 2})))
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, whatever this machine has
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "raysoft", "run", str(cfg), "--out", str(out),
                           *sum((["--set", o] for o in overrides), [])],
                          capture_output=True, text=True, timeout=120, env=env)
    return proc, out


@pytest.mark.parametrize("overrides, expected", [
    (["ray.clients_per_actor=1"], "raysoft: error: ray.clients_per_actor: 12 clients at 1 per actor make 12 client "
                                  "actors of 1 CPU each, but the local Ray (2 CPUs, no GPU) holds 2 at most"),
    (["ray.num_gpus_per_actor=0.25", "ray.clients_per_actor=10"],
     "raysoft: error: ray.num_gpus_per_actor: each client actor asks for 0.25 GPU but the local Ray"),
    (["ray.num_gpus_per_actor=0.25"], "raysoft: error: ray.num_gpus_per_actor: each client actor asks for 0.25 GPU"),
])
def test_impossible_ray_requests_are_refused_before_ray_starts(tmp_path, overrides, expected):
    proc, out = _cli(tmp_path, *overrides)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected)  # Ray never started: it would have logged
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
@pytest.mark.ray
def test_a_plan_the_running_ray_cannot_hold_is_refused_before_anything_is_written(ray_session, tmp_path):
    cfg = small_config(data={"clients": 12}, ray={"backend": "ray", "clients_per_actor": 1})
    with pytest.raises(ConfigError, match="holds 2 at most"):
        raysoft.run(cfg, out=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.ray
def test_a_cluster_that_may_grow_is_waited_for_with_a_deadline(ray_session, tmp_path, monkeypatch):
    # as if an autoscaler could add nodes: the plan waits for its placement group, at most
    # ray.placement_timeout_s, then fails the same way, leaving nothing behind
    from raysoft.backends import cluster, ray_backend

    real = cluster.joined_cluster
    for module in (cluster, ray_backend):  # the plan's cluster and the one the refusal describes
        monkeypatch.setattr(module, "joined_cluster", lambda: Cluster(real().nodes, can_grow=True))
    cfg = small_config(data={"clients": 12}, ray={"backend": "ray", "clients_per_actor": 1,
                                                  "placement_timeout_s": 0.5}, output={"checkpoint_every": 2})
    import ray

    before = set(ray.util.placement_group_table())
    with pytest.raises(ConfigError) as err:
        raysoft.run(cfg, out=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("ray.placement_timeout_s: 12 client actors of 1 CPU each were not placed within 0.5 s")
    assert list(tmp_path.iterdir()) == []
    ours = {k: v for k, v in ray.util.placement_group_table().items() if k not in before}
    assert ours and all(pg["state"] == "REMOVED" for pg in ours.values())


def test_balanced_segments_split_consecutive_ids_at_the_smallest_largest_cost():
    from raysoft.backends.plan import balanced_segments

    costs = {1: 5, 3: 1, 4: 1, 7: 1, 8: 4, 9: 2}
    # no split into 3 runs does better than 6 ([1] 5 | [3 4 7 8] 7 > 6 forces a fourth); the
    # earlier runs fill up to 6 first: [1 3] 6 | [4 7 8] 6 | [9] 2
    assert balanced_segments([9, 1, 4, 3, 8, 7], costs, 3) == [[1, 3], [4, 7, 8], [9]]
    assert balanced_segments([1, 3, 4, 7, 8, 9], costs, 2) == [[1, 3, 4], [7, 8, 9]]  # 7 | 7
    assert balanced_segments([1, 3], costs, 5) == [[1], [3]]
    assert balanced_segments([1, 3, 4], costs, 1) == [[1, 3, 4]]
    assert balanced_segments([], costs, 2) == []
    # equal costs: even counts; one heavy client alone in its run
    assert [len(r) for r in balanced_segments(range(60), [150] * 60, 2)] == [30, 30]
    heavy = [20000] + [400] * 59
    runs = balanced_segments(range(60), heavy, 2)  # 20,000 + 5 x 400 = 22,000 against 54 x 400 = 21,600
    assert [len(r) for r in runs] == [6, 54] and sum(heavy[k] for k in runs[0]) == 22000


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 5))
def test_balanced_segments_is_optimal_over_every_split(sizes, parts):
    import itertools

    from raysoft.backends.plan import balanced_segments

    ids = list(range(len(sizes)))
    runs = balanced_segments(ids, sizes, parts)
    assert [k for r in runs for k in r] == ids and 1 <= len(runs) <= parts and all(runs)
    best = min(max(sum(sizes[a:b]) for a, b in zip((0,) + cut, cut + (len(sizes),)))
               for n in range(min(parts, len(sizes)))
               for cut in itertools.combinations(range(1, len(sizes)), n))
    assert max(sum(sizes[k] for k in r) for r in runs) == best
