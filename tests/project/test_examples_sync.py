"""The synchronous example plug-ins, examples/fedprox (FedProx) and examples/cfl (CFL): their
maths by hand, their jobs end to end (in-process, on Ray with two packings, killed with -9 and
resumed, swept over the plug-in's own setting), and a bad setting refused in one line."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.paths import EXAMPLES
from support.runs import assert_same as _assert_same
from support.runs import values as _values

import raysoft
from raysoft.algorithms.base import ClientContext, ServerContext
from raysoft.config import load_raw, parse_config
from raysoft.data import ClientData
from raysoft.models import DataInfo
from raysoft.optim import SGD

FEDPROX, CFL = EXAMPLES / "fedprox", EXAMPLES / "cfl"
RAYSOFT = str(Path(sys.executable).parent / "raysoft")


def _module(folder: Path, name: str):
    """The example module ``name`` (folder/name.py), under its own name, as the plug-in
    resolver imports it from that folder."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fedprox = _module(FEDPROX, "fedprox")
cfl = _module(CFL, "cfl")


def _job(folder: Path, *overrides: str) -> dict:
    """The example's job.yaml with ``overrides`` (section.key=value), as a raw config."""
    return load_raw(folder / "job.yaml", list(overrides))



# ============================================================================ FedProx by hand
def _tiny_client(mu: float = 0.0) -> ClientContext:
    """One client of a 1-d linear regression: x = (1, 2), y = (2, 2), full-batch SGD lr 0.1,
    2 local steps; FedProx's mu (a setting: the client reads it from its config)."""
    # the settings of this module's own class: ctx.settings checks the class, and another test may
    # have imported examples/fedprox again under the same name (a class of the same name, not this one)
    settings = fedprox.FedProxConfig(name="fedprox:FedProx", clients_per_round=1, mu=mu)
    cfg = parse_config({"algorithm": settings,
                        "data": {"clients": 1},
                        "train": {"optimizer": "sgd", "lr": 0.1, "batch_size": None, "local_epochs": 2}})
    data = ClientData(torch.tensor([[1.0], [2.0]]), torch.tensor([[2.0], [2.0]]), np.zeros(2, dtype=int))
    return ClientContext(cfg=cfg, client=0, data=data, info=DataInfo(input_dim=1, num_outputs=1, task="regression"),
                         scratch=torch.nn.Linear(1, 1))


@pytest.mark.parametrize("mu, expected", [(0.0, [1.12, 0.15]), (1.0, [1.11, 0.14])])
def test_fedprox_local_step_adds_mu_times_the_distance_to_the_global_model(mu, expected):
    """From w^t = (w, b) = (1, 0), loss mean (w x + b - y)^2:
    step 1 at w^t: residuals (-1, 0), gradient (-1, -1), the proximal term 0 -> (1.1, 0.1);
    step 2: residuals (-0.8, 0.3), gradient (-0.2, -0.5), plus mu (w - w^t) = mu (0.1, 0.1)
    -> mu = 0: (1.12, 0.15); mu = 1: gradient (-0.1, -0.4) -> (1.11, 0.14)."""
    ctx = _tiny_client(mu)
    opt = SGD(ctx.scratch.parameters(), lr=0.1)
    start = torch.tensor([1.0, 0.0])  # [weight, bias]
    _, w = fedprox._train(ctx, opt, {"model": start}, 0)  # the payload: w^t alone
    torch.testing.assert_close(w, torch.tensor(expected))
    assert torch.equal(start, torch.tensor([1.0, 0.0]))  # the broadcast model is not written into


def test_fedprox_pull_is_nothing_at_mu_zero():
    anchor = torch.tensor([1.0, -2.0])
    assert fedprox.proximal_pull(0.0, anchor) == {}
    pull = fedprox.proximal_pull(0.5, anchor)
    assert pull["pull_scale"] == 0.5
    torch.testing.assert_close(pull["pull_target"], torch.tensor([0.5, -1.0]))


def test_fedprox_settings_refuse_a_negative_mu():
    with pytest.raises(raysoft.ConfigError, match="algorithm.mu"):
        parse_config({"algorithm": {"name": "fedprox:FedProx", "mu": -1}})
    assert parse_config({"algorithm": {"name": "fedprox:FedProx"}}).algorithm.mu == 0.01


def test_fedprox_with_mu_zero_is_the_builtin_fedavg_bit_for_bit(tmp_path, monkeypatch):
    """The same streams and arithmetic: identical metrics. (The built-in FedAvg trains a host's
    clients in one vectorised computation for linear models, equal up to rounding only; the
    plug-in trains client by client, so the comparison is with train.batched_clients: off.)"""
    monkeypatch.chdir(FEDPROX)
    small = ("ray.backend=inprocess", "output.progress=none", "algorithm.rounds=4", "algorithm.eval_every=2",
             "data.clients=10", "algorithm.clients_per_round=5", "train.batched_clients='off'")
    prox0 = raysoft.run(_job(FEDPROX, *small, "algorithm.mu=0"), out=tmp_path / "prox0").run_dir
    prox1 = raysoft.run(_job(FEDPROX, *small, "algorithm.mu=1"), out=tmp_path / "prox1").run_dir
    raw = _job(FEDPROX, *small)
    raw["algorithm"] = {k: v for k, v in raw["algorithm"].items() if k != "mu"} | {"name": "fedavg"}
    avg = raysoft.run(raw, out=tmp_path / "avg").run_dir
    a, b = _values(prox0).drop(columns="algorithm"), _values(avg).drop(columns="algorithm")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    c = _values(prox1).drop(columns="algorithm")
    assert not c.value.equals(a.value)  # mu does something


# ============================================================================ CFL by hand
# four updates: alpha_01 = 1/sqrt2, alpha_02 = -1, alpha_03 = 0, alpha_12 = alpha_13 = -1/sqrt2, alpha_23 = 0
UPDATES = np.array([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [0.0, -2.0]])


def test_cfl_cosine_similarities_by_hand():
    r = 1 / np.sqrt(2)
    expected = np.array([[1, r, -1, 0], [r, 1, -r, -r], [-1, -r, 1, 0], [0, -r, 0, 1]])
    np.testing.assert_allclose(cfl.cosine_similarities(UPDATES), expected, atol=1e-12)
    # a zero update has similarity 0 with everything (the 1e-12 in the denominator)
    np.testing.assert_array_equal(cfl.cosine_similarities(np.array([[0.0, 0.0], [1.0, 0.0]]))[0], [0.0, 0.0])


def test_cfl_bipartition_by_hand():
    """Distances -alpha: the closest pair is (0, 1) at -1/sqrt2, merged; then {0,1}-2 is
    max(1, 1/sqrt2) = 1, {0,1}-3 is max(0, 1/sqrt2) = 0.71 and 2-3 is 0: {2, 3} merged."""
    s = cfl.cosine_similarities(UPDATES)
    first, second = cfl.bipartition(s)
    assert (first, second) == ([0, 1], [2, 3])
    assert cfl.max_cross_similarity(s, first, second) == pytest.approx(0.0, abs=1e-12)


def test_cfl_bipartition_is_complete_linkage_not_single_linkage():
    """A chain 0-1-2-3 (distances 0.1, 0.2, 0.3): single linkage would merge {0,1,2} and leave 3
    alone; complete linkage: {0,1} (0.1), then {0,1}-2 = 0.9, {0,1}-3 = 1.0, 2-3 = 0.3: {2,3}."""
    d = np.array([[0, 0.1, 0.9, 1.0], [0.1, 0, 0.2, 0.5], [0.9, 0.2, 0, 0.3], [1.0, 0.5, 0.3, 0]])
    assert cfl.bipartition(-d) == ([0, 1], [2, 3])


def test_cfl_bipartition_agrees_with_scikit_learn():
    from sklearn.cluster import AgglomerativeClustering

    for seed in range(30):
        rng = np.random.default_rng(seed)
        m = int(rng.integers(3, 12))
        u = rng.normal(size=(m, 5)) + (rng.integers(0, 2, size=(m, 1)) * 2 - 1) * rng.normal(size=(1, 5))
        s = cfl.cosine_similarities(u)
        labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(-s).labels_
        theirs = sorted(sorted(np.flatnonzero(labels == g).tolist()) for g in (0, 1))
        assert sorted(cfl.bipartition(s)) == theirs, seed


def test_cfl_update_norms_plain_and_weighted():
    # plain mean: the sum of the rows (1, -1) / 4, norm sqrt2 / 4; the largest norm 2
    mean_norm, max_norm = cfl.update_norms(UPDATES, cfl.mean_weights([1, 1, 1, 3], "mean"))
    assert (mean_norm, max_norm) == (pytest.approx(np.sqrt(2) / 4), 2.0)
    # n-weighted (1, 1, 1, 3) / 6: (1 + 1 - 1, 1 - 6) / 6 = (1, -5) / 6
    mean_norm, _ = cfl.update_norms(UPDATES, cfl.mean_weights([1, 1, 1, 3], "samples"))
    assert mean_norm == pytest.approx(np.sqrt(26) / 6)


@pytest.mark.parametrize("mean_norm, max_norm, size, rnd, split", [
    (0.3, 2.0, 3, 6, True),
    (0.4, 2.0, 3, 6, False),   # mean_norm < eps1, strictly
    (0.3, 1.6, 3, 6, False),   # max_norm > eps2, strictly
    (0.3, 2.0, 2, 6, False),   # more than 2 members
    (0.3, 2.0, 3, 5, False),   # round (from 1) > warmup
])
def test_cfl_should_split_conditions(mean_norm, max_norm, size, rnd, split):
    assert cfl.should_split(mean_norm, max_norm, size, rnd, eps1=0.4, eps2=1.6, warmup=5) is split


def _drive(algo, state, updates: dict[int, torch.Tensor], sizes, t=0):
    """One round of ``algo`` with the clients' updates given: (new state, diagnostics)."""
    ctx = ServerContext(cfg=SimpleNamespace(seed=0), sizes=np.asarray(sizes), info=None)
    gen = algo.round(ctx, state, t)
    call = next(gen)
    assert call.op == "train" and call.clients == sorted(updates)
    with pytest.raises(StopIteration) as stop:
        gen.send(updates)
    return stop.value.value


def test_cfl_round_splits_then_each_half_adds_its_mean_update():
    algo = cfl.CFL(cfl.CFLConfig(name="cfl:CFL", clients_per_round=4, warmup=0))
    state = cfl.CFLState(torch.tensor([[0.5, 0.5]]), np.zeros(4, dtype=np.int64))
    updates = {k: torch.tensor(u, dtype=torch.float32) for k, u in enumerate(UPDATES)}
    out = _drive(algo, state, updates, [1, 1, 1, 3])
    new = out.state
    # mean norm sqrt2/4 < 0.4, max norm 2 > 1.6, 4 members, round 1 > 0: split into {0,1}, {2,3};
    # each half: (0.5, 0.5) + the mean of its members' updates
    torch.testing.assert_close(new.models, torch.tensor([[1.5, 1.0], [0.0, -0.5]]))
    np.testing.assert_array_equal(new.labels, [0, 0, 1, 1])
    d = out.diagnostics
    assert d["num_clusters"] == 2 and d["max_cross_similarity[0]"] == pytest.approx(0.0, abs=1e-7)
    assert d["mean_norm[0]"] == pytest.approx(np.sqrt(2) / 4) and d["max_norm[0]"] == pytest.approx(2.0)
    assert out.weights_updated and out.trained == 4
    np.testing.assert_array_equal(algo.weights(new), [[1, 0], [1, 0], [0, 1], [0, 1]])
    # weighted by n = (1, 1, 1, 3): the mean norm sqrt26/6 = 0.85 is not below eps1: no split,
    # the model moves by the weighted mean update (1, -5)/6
    algo = cfl.CFL(cfl.CFLConfig(name="cfl:CFL", clients_per_round=4, warmup=0, weighting="samples"))
    out = _drive(algo, state, updates, [1, 1, 1, 3])
    torch.testing.assert_close(out.state.models, torch.tensor([[0.5 + 1 / 6, 0.5 - 5 / 6]]))
    assert out.diagnostics["num_clusters"] == 1 and "max_cross_similarity[0]" not in out.diagnostics


def test_cfl_does_not_split_a_cluster_some_of_whose_members_sat_out():
    """Five members, four drawn: the updates that split the cluster above do not split it now;
    its model moves by their mean (1, -1) / 4."""
    algo = cfl.CFL(cfl.CFLConfig(name="cfl:CFL", clients_per_round=4, warmup=0))
    state = cfl.CFLState(torch.tensor([[0.5, 0.5]]), np.zeros(5, dtype=np.int64))
    ctx = ServerContext(cfg=SimpleNamespace(seed=0), sizes=np.ones(5), info=None)
    gen = algo.round(ctx, state, 1)  # after round 0, the weights are recorded only when a cluster splits
    call = next(gen)
    assert len(call.clients) == 4
    with pytest.raises(StopIteration) as stop:
        gen.send({k: torch.tensor(u, dtype=torch.float32) for k, u in zip(call.clients, UPDATES)})
    out = stop.value.value
    torch.testing.assert_close(out.state.models, torch.tensor([[0.75, 0.25]]))
    assert out.diagnostics["num_clusters"] == 1 and not out.weights_updated


def test_cfl_takes_every_client_each_round_by_default():
    cfg = parse_config({"algorithm": {"name": "cfl:CFL"}, "data": {"clients": 7}})
    assert cfg.algorithm.clients_per_round == 7
    assert parse_config({"algorithm": {"name": "cfl:CFL", "clients_per_round": 3}}).algorithm.clients_per_round == 3


# ============================================================================ end to end
@pytest.mark.slow
def test_cfl_job_splits_into_the_four_true_clusters(tmp_path, monkeypatch):
    monkeypatch.chdir(CFL)
    r = raysoft.run(_job(CFL, "ray.backend=inprocess", "output.progress=none"), out=tmp_path)
    assert r.summary["ari"] == 1.0 and r.summary["num_clusters"] == 4
    a = pd.read_parquet(r.run_dir / "assignments.parquet")
    groups = a.groupby("predicted").client.apply(sorted).tolist()
    assert sorted(groups) == [list(range(5 * c, 5 * c + 5)) for c in range(4)]  # clients 5c..5c+4 hold distribution c
    # the number of clusters grows one split at a time, never during the warm-up
    d = pd.read_parquet(r.run_dir / "diagnostics.parquet")
    counts = d[d.name == "num_clusters"].sort_values("step")
    assert counts.step.tolist() == list(range(30))
    assert counts.value.iloc[0] == 1 and counts.value.iloc[-1] == 4 and counts.value.is_monotonic_increasing
    assert counts[counts.value > 1].step.min() >= 5  # round t + 1 > warmup = 5
    splits = d[d.name.str.startswith("max_cross_similarity")]
    assert len(splits) == 3 and (splits.value < 0).all()  # three splits, each between opposed updates
    # every center of each evaluation on every holdout: 1 center at the start, 4 at the end,
    # and each distribution's best final center is a different one with a small error
    m = r.metrics
    cl = m[(m.scope == "cluster") & (m.metric == "mse")]
    assert cl[cl.step == 0].entity.nunique() == 1 and cl[cl.step == 30].entity.nunique() == 4
    assert r.summary["distinct_best_centers"] and r.summary["weight_mae"] == 0.0
    assert all(d_["mse"] < 2.0 for d_ in r.summary["distributions"])


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, at_least: int, timeout: float = 180) -> Path | None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = list(out.glob("*/checkpoint.pt")) if out.exists() else []
        if found:
            try:
                if torch.load(found[0], weights_only=False)["round"] >= at_least:
                    return found[0].parent
            except Exception:  # noqa: BLE001 - read while being replaced: try again
                pass
        time.sleep(0.05)
    return None


@pytest.mark.slow
def test_fedprox_job_killed_with_minus_9_and_resumed_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    """The CLI from the example's folder (where fedprox.py is imported from), SIGKILLed after a
    checkpoint, then ``raysoft run --resume DIR`` there: the same numbers as a clean run."""
    sets = ["ray.backend=inprocess", "algorithm.rounds=40", "output.checkpoint_every=2"]
    monkeypatch.chdir(FEDPROX)
    clean = raysoft.run(_job(FEDPROX, *sets, "output.progress=none"), out=tmp_path / "clean")
    assert clean.summary["algorithm"] == "fedprox:FedProx" and clean.summary["rounds"] == 40
    out = tmp_path / "killed"
    cmd = [RAYSOFT, "run", "job.yaml", "--out", str(out), "--progress", "lines"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, cwd=FEDPROX, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run_dir = _wait_for_checkpoint(out, proc, at_least=6)  # past the evaluation of round 5
        assert run_dir is not None and proc.poll() is None, "the run finished (or failed) before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    partial = pd.read_parquet(run_dir / "metrics.parquet")
    assert 0 < partial.step.max() < 40 and not (run_dir / "summary.json").exists()
    done = subprocess.run([RAYSOFT, "run", "--resume", str(run_dir), "--progress", "none"], cwd=FEDPROX,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(run_dir)
    _assert_same(run_dir, clean.run_dir)
    # the uninterrupted run itself: the global model's mean error over the two distributions went
    # down (one model for two regressions: it cannot fit both)
    m = clean.metrics
    cl = m[(m.scope == "cluster") & (m.metric == "mse")].groupby("step").value.mean()
    assert cl.loc[40] < 0.9 * cl.loc[0]


@pytest.mark.slow
@pytest.mark.ray
def test_fedprox_on_ray_two_packings_and_in_process_give_identical_metrics(ray_session, tmp_path, monkeypatch):
    """fedprox.py reaches the coordinator and client actors through Ray's py_modules; one client
    per actor or three: the same numbers, and the same as in-process."""
    monkeypatch.chdir(FEDPROX)
    small = ("output.progress=none", "data.clients=4", "algorithm.clients_per_round=3", "algorithm.rounds=4",
             "algorithm.eval_every=2", "ray.num_cpus_per_actor=0.25")
    dirs = {}
    for name, extra in (("one", ("ray.clients_per_actor=1",)), ("three", ("ray.clients_per_actor=3",)),
                        ("inprocess", ("ray.backend=inprocess",))):
        dirs[name] = raysoft.run(_job(FEDPROX, *small, *extra), out=tmp_path / name).run_dir
    actors = {n: pd.read_parquet(dirs[n] / "placement.parquet").actor.nunique() for n in ("one", "three")}
    assert actors == {"one": 4, "three": 2}
    _assert_same(dirs["one"], dirs["three"])
    _assert_same(dirs["one"], dirs["inprocess"])


@pytest.mark.slow
@pytest.mark.ray
def test_sweep_over_the_plugins_own_mu(ray_session, tmp_path, monkeypatch):
    from raysoft.sweep import sweep

    monkeypatch.chdir(FEDPROX)
    spec = {"config": "job.yaml",
            "set": ["algorithm.rounds=2", "algorithm.eval_every=1", "data.clients=4", "algorithm.clients_per_round=2",
                    "train.local_epochs=1"],
            "grid": {"algorithm.mu": [0.0, 0.1]}, "trial": {"actors": 1}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep_dir = sweep(path, out=tmp_path / "out")
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    assert list(table.trial) == [0, 1] and list(table["grid.algorithm.mu"]) == [0.0, 0.1]
    assert table["rounds"].tolist() == [2, 2] and set(table.algorithm) == {"fedprox:FedProx"}
    for row in table.itertuples():
        cfg = yaml.safe_load((Path(row.run_dir) / "config.yaml").read_text())
        assert cfg["algorithm"]["mu"] == row._2  # grid.algorithm.mu
    assert any(c.startswith("final.mse.c0.d") for c in table.columns)


def test_a_negative_mu_on_the_command_line_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from raysoft.cli import main

    monkeypatch.chdir(FEDPROX)
    out = tmp_path / "out"
    assert main(["run", "job.yaml", "--set", "algorithm.mu=-1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "algorithm.mu" in err[0], err
    assert not out.exists()
