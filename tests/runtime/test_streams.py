"""CCFL and FedSoft-Async as asynchronous streams: reproducible across backends and packings,
the contract's tables, drift, joins, and CCFL's estimates on real rotated Fashion-MNIST."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import small_config, stream_config
from support.images import write_fmnist
from support.paths import ANALYSIS

import raysoft
from raysoft.algorithms.stream import kl_divergence
from raysoft.catalog import ImageData
from raysoft.data.drift import DriftingImages
from raysoft.runtime.streams import StreamCoordinator

REAL_FMNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm")
    write_fmnist(root)
    return root


def test_kl_by_hand():
    assert kl_divergence([0.5, 0.5], [0.5, 0.5]) == 0.0
    assert kl_divergence([1.0, 0.0], [0.25, 0.75]) == pytest.approx(np.log(4))


def test_drifting_data_follows_the_paper(fm):
    d = DriftingImages(ImageData(name="fmnist", clients=6, distributions=3, partition="random", samples_min=10,
                                  samples_max=20, root=str(fm)), seed=0, public_samples=6)
    for m in range(6):
        for c in range(3):
            n, shares = d.shares(m, c)
            assert 10 <= n <= 20 and shares.sum() == pytest.approx(1.0)
            assert 0.4 <= shares[m % 3] <= 0.9  # the main cluster's share
    a, b = d.cycle(1, 0), d.cycle(1, 1)
    assert not np.array_equal(a.shares, b.shares)  # fresh data every cycle
    assert len(a.test_y) == max(1, len(a) // 5)
    torch_eq = d.cycle(1, 0)
    assert (torch_eq.x == a.x).all()  # reproducible


def test_data_seed_fixes_the_stream_data(fm):
    """data.seed draws every cycle's data and the server's sets whatever the run's seed."""
    def drift(seed: int, data_seed: int | None) -> DriftingImages:
        return DriftingImages(ImageData(name="fmnist", clients=6, distributions=3, partition="random",
                                         samples_min=10, samples_max=20, root=str(fm), seed=data_seed),
                              seed=seed, public_samples=6)
    a, b = drift(0, 4), drift(1, 4)
    assert (a.cycle(2, 3).x == b.cycle(2, 3).x).all() and np.array_equal(a.cycle(2, 3).shares, b.cycle(2, 3).shares)
    assert (a.public(1)[0] == b.public(1)[0]).all()
    assert not np.array_equal(drift(0, None).cycle(2, 3).shares, a.cycle(2, 3).shares)


def _drift(fm, **kw) -> DriftingImages:
    return DriftingImages(ImageData(name="fmnist", clients=6, distributions=4, partition="random", samples_min=10,
                                     samples_max=20, root=str(fm), test_samples=4), seed=0, public_samples=3, **kw)


def _rows(x) -> set[bytes]:
    return {row.numpy().tobytes() for row in x.reshape(len(x), -1)}


def test_disjoint_validation_sets_share_no_image_with_pre_training_or_tests(fm):
    shared, disjoint = _drift(fm), _drift(fm, validation="disjoint")
    for s in range(4):
        assert _rows(shared.validation(s)[0]) == _rows(shared.public(s)[0])  # D_k = the pre-training images
        val, pub = _rows(disjoint.validation(s)[0]), _rows(disjoint.public(s)[0])
        assert len(disjoint.validation(s)[1]) == 3 and not val & pub
        assert not val & _rows(disjoint.holdout(s)[0])
    tests = _rows(disjoint.cycle(0, 0).test_x)
    assert not tests & set().union(*(_rows(disjoint.validation(s)[0]) | _rows(disjoint.public(s)[0]) for s in range(4)))


def test_the_rest_from_some_of_the_other_clusters(fm):
    d = _drift(fm, rest_split="some")
    zeros = 0
    for m in range(6):
        for c in range(20):
            _, shares = d.shares(m, c)
            assert shares.sum() == pytest.approx(1.0) and 0.4 <= shares[m % 4] <= 0.9
            others = np.delete(shares, m % 4)
            assert (others > 0).any()
            zeros += int((others == 0).any())
    assert zeros > 0  # some other clusters get no share at all (never with dirichlet)
    assert all((np.delete(_drift(fm).shares(m, c)[1], m % 4) > 0).all() for m in range(6) for c in range(20))


@pytest.mark.parametrize("name", ["ccfl", "fedsoft_async"])
def test_stream_writes_the_contract(tmp_path, fm, name):
    r = raysoft.run(stream_config(fm, name), out=tmp_path)
    m = r.metrics
    assert m.step.max() == 24
    client = m[m.scope == "client"]
    assert {"accuracy_before", "accuracy_after", "kl", "staleness"} <= set(client.metric)
    assert len(client[client.metric == "accuracy_before"]) == 24  # one per upload
    w = r.table("weights")
    assert len(w) == 24 * 3 and np.allclose(w.groupby(["step"]).estimate.sum(), 1.0)
    c = r.table("clients")
    assert len(c) == 24 * 3 and set(c.step) == set(w.step)
    assert r.summary["uploads"] == 24 and r.summary["kl"] >= 0
    assert 0 <= r.summary["cli_bfr"] <= 1 and 0 <= r.summary["cli_aft"] <= 1 and 0 <= r.summary["cluster_acc"] <= 1
    assert sorted(m[m.scope == "cluster"].step.unique()) == [0, 8, 16, 24]
    kl = client[client.metric == "kl"].set_index("step").value
    if name == "fedsoft_async":  # the clients estimate; the server has no Algorithm 1 terms
        assert not (r.run_dir / "estimation.parquet").exists()
        assert r.summary["kl_fresh_estimates"] == pytest.approx(r.summary["kl"])  # every mu is fresh
        return
    e = r.table("estimation")  # CCFL: Algorithm 1's terms of every fresh upload, per cluster
    fresh = r.summary["uploads"] - r.summary["stale_uploads"]  # stale uploads reuse the last estimate
    assert len(e) == 3 * fresh > 0 and set(e.step) <= set(w.step)
    scores = e.pivot(index="step", columns="center", values="score")
    np.testing.assert_allclose(scores.sum(axis=1), 1.0)  # the c1/c2 combination sums to 1
    z = np.exp(7.0 * scores.to_numpy())  # the default amplifier A = 7
    u = w.pivot(index="step", columns="center", values="estimate").loc[scores.index].to_numpy()
    np.testing.assert_allclose(u, z / z.sum(axis=1, keepdims=True), rtol=1e-9)
    assert (e.l > 0).all() and (e.d1 >= 0).all() and (e.d2 > 0).all()
    assert e.alpha.between(0.0, 0.025).all() and (e.groupby("step").alpha.max() > 0).any()
    # the KL of the estimates made at their upload; stale uploads reuse the client's last one
    assert r.summary["kl_fresh_estimates"] == pytest.approx(kl[kl.index.isin(e.step)].mean())
    assert r.summary["kl"] == pytest.approx(kl.mean())


@pytest.mark.slow
@pytest.mark.ray
def test_virtual_stream_is_identical_on_every_backend_and_packing(ray_session, tmp_path, fm):
    ref = raysoft.run(stream_config(fm), out=tmp_path).metrics.drop(columns=["run_id", "time_s"])
    for packing in (1, 3):
        cfg = stream_config(fm)
        cfg["ray"] = {"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.25}
        m = raysoft.run(cfg, out=tmp_path).metrics.drop(columns=["run_id", "time_s"])
        pd.testing.assert_frame_equal(m.reset_index(drop=True), ref.reset_index(drop=True), check_exact=True)


@pytest.mark.slow
@pytest.mark.ray
def test_ccfl_estimation_on_the_actors_equals_the_coordinators(ray_session, tmp_path, fm):
    """F(w_m; D_k) made by the uploading client's actor (the default) or by the coordinator:
    the same tables, in-process and on Ray; the server's own forward passes drop to the cluster
    models it changed."""
    runs = {}
    for where in ("coordinator", "actors"):
        for backend in ("inprocess", "ray"):
            cfg = stream_config(fm, estimate_on=where)
            cfg["ray"] = {"backend": backend, "clients_per_actor": 3, "num_cpus_per_actor": 0.25}
            runs[where, backend] = raysoft.run(cfg, out=tmp_path)
    ref = runs["coordinator", "inprocess"]
    for r in runs.values():
        for table in ("metrics", "estimation"):
            a, b = (x.table(table).drop(columns=["run_id", "time_s"], errors="ignore") for x in (r, ref))
            pd.testing.assert_frame_equal(a, b, check_exact=True)
    spent = {k: r.summary["time_breakdown_s"]["server_estimation_on_actors"] for k, r in runs.items()}
    assert spent["actors", "ray"] > 0 == spent["coordinator", "ray"]
    server = {w: runs[w, "inprocess"].summary["server_estimation_forwards"] for w in ("coordinator", "actors")}
    assert 0 < server["actors"] < server["coordinator"]


def test_no_drift_keeps_each_clients_mixture_and_late_joiners_start_late(tmp_path, fm):
    joins = [0.0, 0.0, 0.0, 0.0, 0.0, 1000.0]  # client 5 joins after everyone else's uploads
    cfg = stream_config(fm, drift=False)
    cfg["data"]["join_schedule"] = joins
    r = raysoft.run(cfg, out=tmp_path)
    c = r.table("clients")
    per_client = c.groupby(["client", "distribution"]).share.nunique()
    assert (per_client == 1).all()  # the same mixture at every upload
    assert 5 not in set(c.client)


@pytest.mark.parametrize("name", ["ccfl", "fedsoft_async"])
def test_a_late_joiner_fetches_the_current_tuple_and_its_first_upload_carries_its_t(tmp_path, fm, name):
    """A newcomer fetches the server's current (w, t) when it joins, not the t = 0 model: its
    first upload is stamped with the number of uploads the server had applied by then."""
    cfg = stream_config(fm, name=name)
    cfg["data"]["join_schedule"] = [0.0] * 5 + [3.0]
    m = raysoft.run(cfg, out=tmp_path).metrics
    uploads = m[m.metric == "accuracy_before"]
    first = uploads[uploads.entity == 5].sort_values("step").iloc[0]
    joined_at = int((uploads[uploads.entity != 5].virtual_time < 3.0).sum())  # uploads applied before it joined
    stale = m[(m.metric == "staleness") & (m.entity == 5) & (m.step == first.step)].value.iloc[0]
    assert joined_at > 0 and first.virtual_time > 3.0
    assert first.step - stale == joined_at  # tau, the t of the tuple it fetched


def test_local_work_per_cycle_is_a_key(tmp_path, fm):
    """H (algorithm.local_epochs) sets the epochs of each cycle; by default train.local_epochs."""
    samples = {}
    for h in (None, 3):
        cfg = stream_config(fm, **({} if h is None else {"local_epochs": h}))
        m = raysoft.run(cfg, out=tmp_path / str(h)).metrics
        samples[h] = m[m.metric == "samples_trained"].sort_values(["step", "entity"]).value.to_numpy()
    assert (samples[3] == 3 * samples[None]).all() and samples[None].min() > 0


def test_stream_config_errors():
    with pytest.raises(raysoft.ConfigError, match="needs a classification dataset"):
        raysoft.load_config(None, ["algorithm.name=ccfl"])
    with pytest.raises(raysoft.ConfigError, match="c1 \\+ c2 must be <= 1"):
        raysoft.load_config(None, ["algorithm={name: ccfl, c1: 0.8, c2: 0.5}", "data.name=fmnist"])


@pytest.mark.slow
@pytest.mark.skipif(not REAL_FMNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_ccfl_estimates_the_main_cluster_on_rotated_fashion_mnist(tmp_path):
    """Pre-trained cluster models and CCFL's estimation: the largest estimated weight is the
    upload's dominant cluster significantly more often than chance (1/K = 0.5; with 40 uploads
    a hit rate above 0.65 has p < 0.05 under chance)."""
    cfg = small_config(
        algorithm={"name": "ccfl", "rounds": 40, "eval_every": 20, "public_samples": 500, "pretrain_epochs": 3},
        data={"name": "fmnist", "clients": 8, "distributions": 2, "partition": "random", "samples_min": 100,
              "samples_max": 200, "test_samples": 300},
        model={"name": "cnn", "channels": [8, 16], "hidden": 64},
        train={"optimizer": "adam", "lr": 0.001, "batch_size": 32, "local_epochs": 1},
    )
    r = raysoft.run(cfg, out=tmp_path)
    w = r.table("weights").pivot(index=["step", "client"], columns="center", values="estimate")
    truth = r.table("clients").pivot(index=["step", "client"], columns="distribution", values="share")
    hit = (w.to_numpy().argmax(axis=1) == truth.loc[w.index].to_numpy().argmax(axis=1)).mean()
    assert hit > 0.65
    assert r.summary["cluster_acc"] > 0.5  # pre-trained and updated cluster models (chance: 0.1)


def _metrics(run_dir):
    return pd.read_parquet(Path(run_dir) / "metrics.parquet").drop(columns=["run_id", "time_s"])


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["clock", "shift"])
def test_a_stream_interrupted_after_a_checkpoint_resumes_to_identical_results(tmp_path, fm, monkeypatch, policy):
    """Checkpoints hold the server state, the clocks, the pending uploads and the histories: a
    run stopped mid-stream and resumed writes exactly what an uninterrupted run writes."""
    cfg = stream_config(fm, upload_policy=policy, shift_threshold=0.3, max_silent_ticks=2)
    clean = raysoft.run(cfg, out=tmp_path / "clean")
    cfg["output"] = {"checkpoint_every": 5}
    original = StreamCoordinator._apply
    calls = {"n": 0}

    def crash_after_13(self, m, up):
        calls["n"] += 1
        if calls["n"] > 13:
            raise RuntimeError("driver lost")
        original(self, m, up)

    monkeypatch.setattr(StreamCoordinator, "_apply", crash_after_13)
    with pytest.raises(RuntimeError, match="driver lost"):
        raysoft.run(cfg, out=tmp_path / "killed")
    monkeypatch.setattr(StreamCoordinator, "_apply", original)
    (run_dir,) = (tmp_path / "killed").iterdir()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["state"].t == 10 and ckpt["computed"]  # pending uploads are part of the checkpoint
    assert _metrics(run_dir).step.max() == 10 and not (run_dir / "summary.json").exists()
    resumed = raysoft.resume(run_dir)
    pd.testing.assert_frame_equal(_metrics(run_dir), _metrics(clean.run_dir), check_exact=True)
    for key in ("cli_bfr", "cli_aft", "kl", "bytes_down_per_client", "silent_ticks"):
        assert resumed.summary[key] == clean.summary[key]


def test_costs_local_and_fedsoft_async_download_k_times_ccfls_bytes(tmp_path, fm):
    """Per upload CCFL downloads one model, FedSoft-Async all K; Local communicates nothing and
    has no estimate; every client trains on the same number of samples in all three (same clocks,
    same data)."""
    runs = {name: raysoft.run(stream_config(fm, name=name), out=tmp_path)
            for name in ("ccfl", "fedsoft_async", "local_stream")}
    c, f, loc = (runs[n].summary for n in ("ccfl", "fedsoft_async", "local_stream"))
    # the CNN [2, 4] / 8: conv 1*2*25+2, conv 2*4*25+4, fc 4*7*7*8+8, fc 8*10+10 float32 parameters
    model_bytes = 4 * (52 + 204 + 1576 + 90)
    per_client = 24 / 6  # uploads per client
    assert c["bytes_down_per_client"] == model_bytes * per_client
    assert f["bytes_down_per_client"] == 3 * c["bytes_down_per_client"]  # K = 3
    assert c["bytes_up_per_client"] == model_bytes * per_client
    assert f["bytes_up_per_client"] == (model_bytes + 8 * 3) * per_client  # the model and mu
    assert loc["bytes_down_per_client"] == loc["bytes_up_per_client"] == 0
    assert c["samples_trained_per_client"] == f["samples_trained_per_client"] == loc["samples_trained_per_client"]
    assert c["client_estimation_forwards_per_client"] == 0 < f["client_estimation_forwards_per_client"]
    assert c["server_estimation_forwards"] > 0 == f["server_estimation_forwards"]
    assert set(c["time_breakdown_s"]) == {
        "client_training",
        "client_estimation",
        "server_estimation",
        "server_estimation_on_actors",
    }
    assert loc["kl"] is None and loc["cli_aft"] is None and loc["cluster_acc"] is None
    assert loc["cli_bfr"] is not None and runs["local_stream"].table("weights").empty
    m = runs["ccfl"].metrics
    assert (m[m.metric == "bytes_down"].value == model_bytes).sum() == 24


def test_upload_after_a_data_shift_keeps_training_silently_until_the_mixture_moves(tmp_path, fm):
    """upload_policy shift: an upload's mixture is at least shift_threshold (total variation)
    away from the client's previous upload's, unless it waited max_silent_ticks ticks; uploads
    come in virtual-time order."""
    r = raysoft.run(stream_config(fm, upload_policy="shift", shift_threshold=0.3, max_silent_ticks=2),
                    out=tmp_path)
    m = r.metrics
    ups = m[m.metric == "accuracy_before"].sort_values("step")
    assert ups.virtual_time.notna().all() and ups.virtual_time.is_monotonic_increasing
    silent = m[m.metric == "silent_ticks"].set_index(["entity", "step"]).value
    assert silent.sum() == r.summary["silent_ticks"] > 0
    shares = r.table("clients").pivot(index=["client", "step"], columns="distribution", values="share")
    checked = 0
    for client, g in shares.groupby(level="client"):
        steps = g.index.get_level_values("step")
        assert silent[(client, steps[0])] == 0  # the first upload is immediate
        tv = 0.5 * np.abs(np.diff(g.to_numpy(), axis=0)).sum(axis=1)
        for step, moved in zip(steps[1:], tv):
            assert moved >= 0.3 or silent[(client, step)] == 2
            checked += 1
    assert checked > 0
    assert raysoft.run(stream_config(fm), out=tmp_path).summary["silent_ticks"] == 0


@pytest.mark.slow
def test_compare_runs_the_three_stream_methods_and_prints_table_1(tmp_path, fm):
    from raysoft.compare import compare

    path = compare(stream_config(fm), ["ccfl", "fedsoft_async", "local"], out=tmp_path)
    table = pd.read_parquet(path / "comparison.parquet").set_index("algorithm")
    assert list(table.index) == ["ccfl", "fedsoft_async", "local"]
    local = json.loads((path / "local" / "summary.json").read_text())
    assert local["algorithm"] == "local_stream" and table.loc["local", "bytes_down_per_client"] == 0
    assert table.loc["fedsoft_async", "bytes_down_per_client"] == 3 * table.loc["ccfl", "bytes_down_per_client"]
    md = (path / "comparison.md").read_text()
    assert "| algorithm | Cli Bfr | Cli Aft | Cluster | KL |" in md
    assert f"| ccfl | {table.loc['ccfl', 'cli_bfr']:.3f} | {table.loc['ccfl', 'cli_aft']:.3f} |" in md
    with pytest.raises(raysoft.ConfigError, match="fedsoft runs synchronous rounds"):
        compare(stream_config(fm), ["ccfl", "fedsoft"], out=tmp_path)
    # analysis/ccfl_estimate_cap.py reads the comparison: the cap and the measured estimates
    import subprocess
    import sys

    script = ANALYSIS / "ccfl_estimate_cap.py"
    out = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, check=True).stdout
    row = next(line for line in out.splitlines() if line.startswith(f"| {path} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    weights = pd.read_parquet(path / "ccfl" / "weights.parquet")
    assert cells[1:4] == ["3", "[7.0]", "0.742"]  # K = 3, the default A = 7: e^(7/4) / (e^(7/4) + 2)
    assert float(cells[4]) == pytest.approx(weights.estimate.max(), abs=5e-4) and weights.estimate.max() <= 0.742
    est = pd.read_parquet(path / "ccfl" / "estimation.parquet")
    assert cells[5] == f"{est.l.min():.1f}" and cells[6].endswith(f" of {est.step.nunique()}")
    ccfl = json.loads((path / "ccfl" / "summary.json").read_text())
    assert cells[8] == f"{table.loc['ccfl', 'kl']:.3f}" and cells[12] == f"{table.loc['fedsoft_async', 'kl']:.3f}"
    assert cells[9] == f"{ccfl['kl_fresh_estimates']:.3f}"
    for name, cell in (("ccfl", cells[7]), ("fedsoft_async", cells[11])):  # main cluster ranked first
        w_, c_ = (pd.read_parquet(path / name / f"{t}.parquet") for t in ("weights", "clients"))
        top = w_.loc[w_.groupby(["step", "client"]).estimate.idxmax()].set_index(["step", "client"])
        main = c_.loc[c_.groupby(["step", "client"]).share.idxmax()].set_index(["step", "client"])
        assert cell == f"{(top.center == main.distribution.loc[top.index]).mean():.3f}"
    assert "| fmnist(4) | 4 | [7.0] | 0.420 | 0.154 |" in out
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
