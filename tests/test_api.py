"""End-to-end runs: what a run writes, FedSoft's claims at small scale, determinism across
backends and packings, and the Ray backend's actor pool."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.configs import small_config

import raysoft
from raysoft.backends.plan import plan_actors
from raysoft.cli import main as cli_main
from raysoft.config import RayConfig
from raysoft.params import weighted_sum

METRIC_COLUMNS = [
    "run_id",
    "algorithm",
    "step",
    "time_s",
    "scope",
    "entity",
    "eval_dist",
    "metric",
    "value",
    "virtual_time",
]


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_run_directory_follows_the_contract(fedsoft_run):
    d = fedsoft_run.run_dir
    assert sorted(p.name for p in d.iterdir()) == [
        "client_metrics.parquet", "clients.parquet", "clustering.parquet", "comm.parquet", "config.yaml",
        "diagnostics.parquet", "metrics.parquet", "provenance.json", "summary.json", "weights.parquet"]
    diag = pd.read_parquet(d / "diagnostics.parquet")  # FedSoft's coupling, one row per round
    assert list(diag.columns) == ["run_id", "step", "name", "value"] and list(diag.step) == list(range(20))
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


@pytest.mark.slow
@pytest.mark.ray
def test_same_numbers_on_every_backend_and_packing(ray_session, tmp_path):
    cfg = small_config(ray={"num_cpus_per_actor": 0.1})
    ref_m, ref_w = _comparable(raysoft.run(cfg, out=tmp_path))
    for packing in (1, 4, 10):
        cfg = small_config(ray={"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.1})
        m, w = _comparable(raysoft.run(cfg, out=tmp_path))
        pd.testing.assert_frame_equal(m, ref_m, check_exact=True)
        pd.testing.assert_frame_equal(w, ref_w, check_exact=True)


@pytest.mark.slow
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
        (RayConfig(clients_per_actor=1, num_cpus_per_actor=0.2), {"CPU": 2.0}, [1] * 10),
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
    with pytest.raises(raysoft.ConfigError, match="ray.num_gpus_per_actor: .* has none"):
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


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algo, packings", [
    ({"name": "fedavg"}, (1, 3, 10)),
    ({"name": "ifca", "init_threshold": 0.0}, (3,)),
    ({"name": "ifca", "init_threshold": 0.0, "option": "gradient"}, (4,)),
    ({"name": "fedem"}, (3,)),
    ({"name": "fedsoft"}, (1, 3)),
    ({"name": "fedsoft", "selection": "full"}, (4,)),
])
def test_sums_in_the_actors_equal_the_coordinators_on_every_packing(ray_session, tmp_path, algo, packings):
    # the chain of actors adds the clients' terms in client-id order: the same floats as the
    # coordinator's sum over every update (FedAvg's mean, IFCA's centers, FedEM's learners,
    # FedSoft's centers, a client selected by several clusters added to each of their rows)
    algo = {**algo, "rounds": 4, "clients_per_round": 6, "eval_every": 1}
    ref = raysoft.run(small_config(algorithm=algo, ray={"reduce_in_actors": False}), out=tmp_path)
    ref_m = ref.metrics.drop(columns=["run_id", "time_s"])
    assert ref_m.value.nunique() > 4  # the models move: a real comparison
    ray_cfgs = [{}] + [{"backend": "ray", "clients_per_actor": p, "num_cpus_per_actor": 0.1} for p in packings]
    if algo["name"] == "fedavg":
        ray_cfgs.append(
            {"backend": "ray", "clients_per_actor": 3, "num_cpus_per_actor": 0.1, "reduce_in_actors": False}
        )
    for ray_cfg in ray_cfgs:
        m = raysoft.run(small_config(algorithm=algo, ray=ray_cfg), out=tmp_path).metrics
        pd.testing.assert_frame_equal(m.drop(columns=["run_id", "time_s"]), ref_m, check_exact=True)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algo", [{"name": "fedavg"}, {"name": "fedsoft"}])
def test_the_tree_sum_is_the_same_on_every_backend_and_packing(ray_session, tmp_path, algo):
    # ray.sum_shape: tree adds runs of sum_group clients from zeros, then the runs pairwise: its
    # association is fixed by the client ids, so the coordinator, the in-process host and any
    # packing of actors (runs that straddle actors included) give the same floats
    algo = {**algo, "rounds": 4, "clients_per_round": 7, "eval_every": 1}
    tree = {"sum_shape": "tree", "sum_group": 2}
    ref = raysoft.run(small_config(algorithm=algo, ray={**tree, "reduce_in_actors": False}), out=tmp_path)
    ref_m = ref.metrics.drop(columns=["run_id", "time_s"])
    chain = raysoft.run(small_config(algorithm=algo), out=tmp_path).metrics.drop(columns=["run_id", "time_s"])
    if algo["name"] == "fedavg":  # another association, other last bits (FedSoft's few models per
        assert not ref_m.equals(chain)  # center happen to round alike on this config)
    for ray_cfg in [{}, {"backend": "ray", "clients_per_actor": 3, "num_cpus_per_actor": 0.1}]:
        m = raysoft.run(small_config(algorithm=algo, ray={**tree, **ray_cfg}), out=tmp_path).metrics
        pd.testing.assert_frame_equal(m.drop(columns=["run_id", "time_s"]), ref_m, check_exact=True)


def test_the_tree_sum_adds_runs_then_pairs():
    from raysoft.algorithms.base import Plan

    # float32 terms whose sum depends on the association: 1e8, 1, -1e8, 1, 1 (coef 1)
    vals = [1e8, 1.0, -1e8, 1.0, 1.0]
    parts = {k: torch.tensor([v], dtype=torch.float32) for k, v in enumerate(vals)}
    terms = {k: (None, 1.0) for k in parts}
    chain = Plan(torch.zeros(1), dict(terms)).apply(parts)
    tree = Plan(torch.zeros(1), dict(terms)).apply(parts, group=2)
    # chain: ((((0 + 1e8) + 1) - 1e8) + 1) + 1 = 2 (the first 1 is lost in float32)
    # tree, runs of 2: (1e8 + 1) = 1e8, (-1e8 + 1) = -1e8 + 1 -> -99999999 rounds to -1e8, (1);
    # pairs: (1e8 - 1e8) = 0, then 0 + 1 = 1; start 0 + 1 = 1
    assert chain.item() == 2.0 and tree.item() == 1.0
    assert Plan(None, dict(terms)).apply(parts, group=10).item() == 2.0  # one run: the chain from zeros


def test_the_chain_adds_in_client_id_order_like_weighted_sum():
    from raysoft.algorithms import WeightedMean
    from raysoft.backends.host import ClientHost

    sizes = np.array([3, 1, 4, 1, 5])
    gen = torch.Generator().manual_seed(0)
    updates = {k: torch.randn(50, generator=gen) * 10.0 ** k for k in range(5)}  # rounding depends on order
    coef = WeightedMean(sizes).coefficients([0, 2, 3, 4])
    assert coef == pytest.approx({0: 3 / 13, 2: 4 / 13, 3: 1 / 13, 4: 5 / 13})
    want = weighted_sum([updates[k] for k in coef], list(coef.values()))  # the coordinator's sum
    first, second = ClientHost.__new__(ClientHost), ClientHost.__new__(ClientHost)
    first.kept = {k: updates[k] for k in (0, 1, 2)}
    second.kept = {k: updates[k] for k in (3, 4)}
    first.device = second.device = torch.device("cpu")  # where each host adds (its GPU, on one)
    plan = WeightedMean(sizes).plan({k: {} for k in coef})
    acc = first.add_terms({k: v for k, v in plan.terms.items() if k < 3}, plan.start)
    got = second.add_terms({k: v for k, v in plan.terms.items() if k >= 3}, acc)
    assert torch.equal(got, want)
    backwards = sum(updates[k] * c for k, c in reversed(coef.items()))
    assert not torch.equal(backwards, want)  # another order would round differently
    # dropped once summed (the tree calls a host once per run); client 1, not in the plan, stays
    # until the next keep replaces what is kept
    assert list(first.kept) == [1] and second.kept == {}


@pytest.mark.slow
def test_matrix_products_do_not_depend_on_memory_alignment():
    # MKL rounds sgemm differently with the inputs' alignment unless MKL_CBWR asks for strict
    # reproducibility; importing raysoft sets it (a fresh process: MKL reads it once)
    code = """
import raysoft, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x, w = torch.randn(200, 60, generator=g), torch.randn(60, 1, generator=g)
ref, same = x @ w, []
for off in range(1, 16):
    buf = torch.empty(200 * 60 + off)
    shifted = buf[off:].view(200, 60)
    shifted.copy_(x)
    same.append(torch.equal(shifted @ w, ref))
print(sum(same))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "MKL_CBWR"})
    assert out.stdout.split()[-1] == "15"


def test_a_relative_output_dir_is_refused_inside_a_ray_job(tmp_path, monkeypatch, capsys):
    """A Ray Job runs in a working directory Ray deletes: results there would be lost."""
    from raysoft.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    with pytest.raises(raysoft.ConfigError, match="relative, and a Ray Job's working directory is temporary"):
        raysoft.run(small_config(), out="runs")
    assert not (tmp_path / "runs").exists()
    assert raysoft.run(small_config(), out=tmp_path / "abs").run_dir.parent == tmp_path / "abs"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    # submitting with a relative --out to a cluster elsewhere is refused before anything is sent
    # (192.0.2.1 is a documentation address, never contacted); to a cluster on this machine the
    # path is made absolute here (tests/e2e/test_multinode.py submits so)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(small_config()))
    assert main(["run", "c.yaml", "--out", "runs", "--address", "http://192.0.2.1:8265"]) == 2
    from raysoft.api import job_output_dir

    assert job_output_dir("runs", "http://127.0.0.1:8265") == str(tmp_path / "runs")
    assert job_output_dir("runs", "http://localhost:8265") == str(tmp_path / "runs")
    assert job_output_dir("s3://bucket/runs", "http://10.0.0.5:8265") == "s3://bucket/runs"
    assert "give an absolute path on storage the cluster's nodes share" in capsys.readouterr().err


def test_the_printed_run_directory_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = raysoft.run(small_config(), out="runs")
    assert run.run_dir.is_absolute() and run.location == str(tmp_path / "runs" / run.run_dir.name)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algo", [{"name": "fedsoft"}, {"name": "fedavg"}])
def test_balanced_rounds_even_the_actors_samples_and_keep_the_numbers(ray_session, algo):
    """ray.balance: cost moves clients (with their states) between actors so that each actor
    trains runs of consecutive ids of even samples: never a larger largest load than the
    clients' own actors, smaller in some round, and bit-identical results."""
    from raysoft.backends import run_backend
    from raysoft.config import parse_config

    algo = {**algo, "rounds": 5, "clients_per_round": 7, "eval_every": 1}
    out = {}
    for balance in ("clients", "cost"):
        cfg = parse_config(small_config(algorithm=algo, data={"samples_min": 20, "samples_max": 400},
                                        ray={"backend": "ray", "clients_per_actor": 4, "num_cpus_per_actor": 0.1,
                                             "balance": balance}))
        infos = []
        tables, _ = run_backend(cfg, "t", infos.append)
        rounds = [i for i in infos if "actor_samples" in i]
        out[balance] = (tables["metrics"].to_pandas().drop(columns=["run_id", "time_s"]), rounds)
    (m_own, own), (m_cost, cost) = out["clients"], out["cost"]
    pd.testing.assert_frame_equal(m_cost, m_own, check_exact=True)
    assert len(own) == len(cost) == 5
    assert all(r["clients_moved"] == 0 for r in own) and sum(r["clients_moved"] for r in cost) > 0
    assert all(sum(a["actor_samples"]) == sum(b["actor_samples"]) for a, b in zip(own, cost))
    assert all(max(b["actor_samples"]) <= max(a["actor_samples"]) for a, b in zip(own, cost))
    assert any(max(b["actor_samples"]) < max(a["actor_samples"]) for a, b in zip(own, cost))


def test_data_seed_keeps_the_data_and_the_run_seed_varies_the_training(tmp_path):
    """Two runs with data.seed fixed and different run seeds: the same clients (clients.parquet:
    sizes and mixtures) and different training draws (metrics); the same seeds again: the same run."""
    runs = [raysoft.run(small_config(seed=s, data={"seed": 11}), out=tmp_path) for s in (0, 1)]
    clients = [r.table("clients").drop(columns="run_id") for r in runs]
    pd.testing.assert_frame_equal(clients[0], clients[1])
    other = raysoft.run(small_config(seed=0), out=tmp_path).table("clients").drop(columns="run_id")
    assert not other.equals(clients[0])  # without data.seed the run's seed draws the data
    a, b = (r.metrics.value.to_numpy() for r in runs)
    assert len(a) == len(b) and not np.array_equal(a, b)
    again = raysoft.run(small_config(seed=0, data={"seed": 11}), out=tmp_path)
    np.testing.assert_array_equal(again.metrics.value.to_numpy(), a)


def test_a_run_to_a_uri_removes_its_staging_folder_on_success_and_failure(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    target = tmp_path / "bucket"
    r = raysoft.run(small_config(), out=f"file://{target}")
    assert list(scratch.iterdir()) == []  # the staging copy is gone; the published run is there
    assert not r.run_dir.exists()
    pd.testing.assert_frame_equal(r.metrics, pd.read_parquet(target / r.run_dir.name / "metrics.parquet"))
    with pytest.raises(raysoft.errors.UpdateError):
        raysoft.run(small_config(train={"lr": 1e30}), out=f"file://{target}")
    assert list(scratch.iterdir()) == []
    assert [p.name for p in target.iterdir()] == [r.run_dir.name]


def test_a_uri_run_whose_publishing_fails_keeps_its_staging_copy(tmp_path, monkeypatch):
    import tempfile

    import raysoft.api

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(raysoft.api.pafs, "copy_files", full)
    with pytest.raises(raysoft.errors.RunStopped, match="its complete results are kept in ") as err:
        raysoft.run(small_config(), out=f"file://{tmp_path / 'bucket'}")
    (staging,) = scratch.iterdir()
    (kept,) = staging.iterdir()
    assert str(err.value).endswith(str(kept)) and (kept / "summary.json").is_file()


def test_resume_says_which_round_it_continues_from(tmp_path, capsys):
    # a run stopped by a non-finite update at round 3 keeps its checkpoint of round 2; --resume said nothing
    # about where it continued
    cfg = small_config(algorithm={"clients_per_round": 10}, output={"checkpoint_every": 2, "progress": "lines"},
                       faults=[{"kind": "nan_update", "at_round": 3, "client": 0}])
    with pytest.raises(raysoft.errors.UpdateError):
        raysoft.run(cfg, out=tmp_path, dir_name="stopped")
    run_dir = tmp_path / "stopped"
    assert (run_dir / "checkpoint.pt").is_file() and not (run_dir / "summary.json").exists()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**saved, "faults": []}))  # the cause put right
    capsys.readouterr()
    raysoft.resume(run_dir)
    said = capsys.readouterr().err.splitlines()
    assert f"fedsoft: resuming {run_dir} from round 2 of 4 (its last checkpoint)" in said
    assert (run_dir / "summary.json").is_file()


def test_a_recovered_run_says_each_round_once(tmp_path, capsys):
    # an actor killed at round 5 recovers from the checkpoint of round 3 and replays round 4,
    # whose progress line was said twice
    cfg = small_config(algorithm={"clients_per_round": 10, "rounds": 6, "eval_every": 1},
                       output={"checkpoint_every": 3, "progress": "lines"},
                       faults=[{"kind": "kill_actor", "at_round": 5, "actor": 0}])
    raysoft.run(cfg, out=tmp_path)
    said = [line for line in capsys.readouterr().err.splitlines() if "elapsed" in line]
    assert [line.split()[2] for line in said] == [f"{r}/6" for r in range(7)]


def test_resume_from_a_relative_path_prints_the_run_directory_absolute(tmp_path, capsys, monkeypatch):
    # docs/running.md: the run directory is always printed absolute; --resume printed it as given
    cfg = small_config(algorithm={"clients_per_round": 10}, output={"checkpoint_every": 2},
                       faults=[{"kind": "nan_update", "at_round": 3, "client": 0}])
    with pytest.raises(raysoft.errors.UpdateError):
        raysoft.run(cfg, out=tmp_path, dir_name="stopped")
    saved = yaml.safe_load((tmp_path / "stopped" / "config.yaml").read_text())
    (tmp_path / "stopped" / "config.yaml").write_text(yaml.safe_dump({**saved, "faults": []}))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert cli_main(["run", "--resume", "stopped", "--progress", "none"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "stopped")
