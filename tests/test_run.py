"""End-to-end runs: what a run writes, FedSoft's claims at small scale, determinism across
backends and packings, and the Ray backend's actor pool."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

import raysoft
from raysoft.backends.ray_backend import plan_actors
from raysoft.config import RayConfig

from conftest import small_config

METRIC_COLUMNS = ["run_id", "algorithm", "step", "time_s", "scope", "entity", "eval_dist", "metric", "value", "virtual_time"]


def _fedsoft_20(**sections):
    """20 clients, 10:90, K = 12 (60% as the paper's K = 60 of 100), sigma_0 = 10 (the paper's)."""
    base = dict(
        algorithm={"rounds": 20, "clients_per_round": 12, "eval_every": 5},
        data={"clients": 20, "samples_min": 100, "samples_max": 200},
        train={"local_epochs": 10, "lr": 0.05},
    )
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return small_config(**base)


@pytest.fixture(scope="module")
def fedsoft_run(tmp_path_factory):
    return raysoft.run(_fedsoft_20(), out=tmp_path_factory.mktemp("runs"))


def test_fedsoft_recovers_the_two_clusters_and_the_mixtures(fedsoft_run):
    s = fedsoft_run.summary
    assert s["distinct_best_centers"]
    m = fedsoft_run.metrics
    last = m[(m.scope == "cluster") & (m.step == 20) & (m.metric == "mse")]
    score = last.pivot(index="eval_dist", columns="entity", values="value").to_numpy()
    for d in (0, 1):
        own = s["distributions"][d]["best_center"]
        # the specialised center is far better on its distribution than the other center
        assert score[d, own] < 0.5 * score[d, 1 - own]
    assert s["weight_mae"] < 0.05
    w = fedsoft_run.table("weights")
    final = w[w.step == w.step.max()].pivot(index="client", columns="center", values="estimate")
    truth = fedsoft_run.table("clients").pivot(index="client", columns="distribution", values="share")
    matched = final[[int(s["matching"]["0"]), int(s["matching"]["1"])]].to_numpy()
    assert np.abs(matched - truth.to_numpy()).mean() == pytest.approx(s["weight_mae"])
    local = m[(m.scope == "client") & (m.metric == "mse")].groupby("step").value.mean()
    assert local.loc[20] < 0.5 * local.loc[0]  # personalised models fit their own data


def test_run_directory_follows_the_contract(fedsoft_run):
    d = fedsoft_run.run_dir
    assert sorted(p.name for p in d.iterdir()) == [
        "clients.parquet", "config.yaml", "metrics.parquet", "summary.json", "weights.parquet"]
    m = pd.read_parquet(d / "metrics.parquet")
    assert list(m.columns) == METRIC_COLUMNS
    assert set(m.scope) == {"cluster", "client"}
    assert sorted(m.step.unique()) == [0, 5, 10, 15, 20]
    assert (m[m.scope == "client"].eval_dist == -1).all()
    assert set(m[m.scope == "cluster"].eval_dist) == {0, 1}
    assert (m.run_id == fedsoft_run.run_id).all() and (m.algorithm == "fedsoft").all()
    w = pd.read_parquet(d / "weights.parquet")
    assert list(w.columns) == ["run_id", "step", "client", "center", "estimate"]
    assert sorted(w.step.unique()) == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]  # every tau = 2 rounds
    c = pd.read_parquet(d / "clients.parquet")
    assert list(c.columns) == ["run_id", "step", "client", "distribution", "share", "samples"]
    assert len(c) == 40 and np.allclose(c.groupby("client").share.sum(), 1.0)
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    assert cfg["algorithm"]["num_centers"] == 2 and cfg["train"]["lr"] == 0.05
    summary = json.loads((d / "summary.json").read_text())
    assert summary["rounds"] == 20 and summary["wall_time_s"] > 0
    assert not [p for p in d.parent.iterdir() if p.name.endswith(".partial")]


def test_a_failed_run_leaves_nothing_behind(tmp_path, monkeypatch):
    import raysoft.api

    def boom(*a, **k):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(raysoft.api, "run_backend", boom)
    with pytest.raises(RuntimeError):
        raysoft.run(small_config(), out=tmp_path)
    assert list(tmp_path.iterdir()) == []


def _comparable(result):
    m = result.metrics.drop(columns=["run_id", "time_s"])
    w = result.table("weights").drop(columns=["run_id"])
    return m, w


@pytest.mark.ray
def test_same_numbers_on_every_backend_and_packing(ray_session, tmp_path):
    cfg = small_config(ray={"num_cpus_per_actor": 0.1})
    ref_m, ref_w = _comparable(raysoft.run(cfg, out=tmp_path))
    for packing in (1, 4, 10):
        cfg = small_config(ray={"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.1})
        m, w = _comparable(raysoft.run(cfg, out=tmp_path))
        pd.testing.assert_frame_equal(m, ref_m, check_exact=True)
        pd.testing.assert_frame_equal(w, ref_w, check_exact=True)


@pytest.mark.ray
def test_ray_run_with_auto_pool(ray_session, tmp_path):
    r = raysoft.run(_fedsoft_20(ray={"backend": "ray"}, algorithm={"rounds": 4}), out=tmp_path)
    assert r.summary["rounds"] == 4
    assert r.metrics.step.max() == 4


def test_different_seeds_differ(tmp_path):
    a = raysoft.run(small_config(), out=tmp_path).metrics.value.to_numpy()
    b = raysoft.run(small_config(seed=4), out=tmp_path).metrics.value.to_numpy()
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    "rc,resources,expected",
    [
        (RayConfig(), {"CPU": 2.0}, [5, 5]),
        (RayConfig(num_cpus_per_actor=0.5), {"CPU": 2.0}, [3, 3, 3, 1]),
        (RayConfig(clients_per_actor=1), {"CPU": 2.0}, [1] * 10),
        (RayConfig(clients_per_actor=4), {"CPU": 8.0}, [4, 4, 2]),
        (RayConfig(num_gpus_per_actor=0.25), {"CPU": 16.0, "GPU": 1.0}, [3, 3, 3, 1]),
        (RayConfig(), {"CPU": 64.0}, [1] * 10),
    ],
)
def test_plan_actors(rc, resources, expected):
    blocks = plan_actors(10, rc, resources)
    assert [len(b) for b in blocks] == expected
    assert sum(blocks, []) == list(range(10))


def test_plan_actors_without_gpu_is_an_error():
    with pytest.raises(RuntimeError, match="no GPU"):
        plan_actors(10, RayConfig(num_gpus_per_actor=0.5), {"CPU": 4.0})


def test_output_to_a_pyarrow_uri(tmp_path):
    target = tmp_path / "bucket"
    r = raysoft.run(small_config(), out=f"file://{target}")
    assert r.location == f"file://{target}/{r.run_dir.name}"
    published = target / r.run_dir.name
    m = pd.read_parquet(published / "metrics.parquet")
    pd.testing.assert_frame_equal(m, r.metrics)
    assert json.loads((published / "summary.json").read_text())["rounds"] == 4


def test_unusable_output_uri_is_a_config_error(tmp_path):
    with pytest.raises(raysoft.ConfigError, match="output.dir: cannot use 'nosuch://x'"):
        raysoft.run(small_config(), out="nosuch://x")


def test_plan_actors_sizes_the_pool_node_by_node():
    # 1.5 + 1.5 CPUs: 1 actor of 1 CPU per node (2 in all), not floor(3 / 1) = 3
    assert len(plan_actors(10, RayConfig(), [{"CPU": 1.5}, {"CPU": 1.5}])) == 2
    # a head without CPUs hosts none
    assert len(plan_actors(10, RayConfig(), [{"CPU": 0.0}, {"CPU": 2.0}])) == 2
