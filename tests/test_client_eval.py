"""Clusterings scored against the truth and every client's personalised model, at every
evaluation (clustering.parquet, client_metrics.parquet, the summary's ``personalised`` and
``time_to_target``): by hand, and end to end against scikit-learn on small in-process runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
from support.configs import small_config
from support.digests import SYNC

import raysoft
from raysoft.algorithms.fedem import Mixture, mixture_metrics
from raysoft.catalog import SyntheticData
from raysoft.data import Federation, component_counts
from raysoft.evaluation import client_summary, clustering_rows, score_client, time_to_target, worse_percentile
from raysoft.models import LinearRegression
from raysoft.params import get_flat


def _table(run, name: str) -> pd.DataFrame:
    return pd.read_parquet(run.run_dir / f"{name}.parquet")


def test_client_summary_by_hand():
    acc = np.array([0.9, 0.1, 0.5, 0.7, 0.3, 0.2, 0.4, 0.6, 0.8, 1.0, 0.0])  # 11 clients: the worst tenth is 2
    s = client_summary(acc, "accuracy")
    assert s["mean"] == pytest.approx(0.5)
    assert s["median"] == pytest.approx(0.5)
    assert s["p10"] == pytest.approx(0.1) and s["p90"] == pytest.approx(0.9)
    assert s["worst10_mean"] == pytest.approx(0.05)  # 0.0 and 0.1
    mse = client_summary(np.array([1.0, 2.0, 10.0]), "mse")  # lower is better: the worst is the largest
    assert mse["worst10_mean"] == 10.0
    assert worse_percentile(acc, "accuracy") == pytest.approx(0.1)
    assert worse_percentile(acc, "mse") == pytest.approx(0.9)


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    hist = [{"step": 0, "virtual_time": 0.0, "mean": 0.2, "worse": 0.1},
            {"step": 5, "virtual_time": 7.5, "mean": 0.61, "worse": 0.3},
            {"step": 10, "virtual_time": 15.0, "mean": 0.55, "worse": 0.6}]
    got = time_to_target(hist, 0.6, "accuracy")
    assert got["mean"] == {"step": 5, "virtual_time": 7.5}
    assert got["p10"] == {"step": 10, "virtual_time": 15.0}
    assert time_to_target(hist, 0.9, "accuracy")["mean"] is None
    assert time_to_target(hist, 0.2, "mse")["mean"] == {"step": 0, "virtual_time": 0.0}  # at most 0.2


def test_clustering_rows_by_hand():
    truth = np.array([0, 0, 1, 1])
    same = clustering_rows(truth, np.array([1, 1, 0, 0]), None)  # the labels are arbitrary
    assert same == {"ari": 1.0, "nmi": 1.0}
    moved = clustering_rows(truth, np.array([0, 0, 0, 1]), np.array([0, 0, 1, 1]))
    assert moved["changed"] == 1.0
    assert moved["ari"] == pytest.approx(adjusted_rand_score(truth, [0, 0, 0, 1]))


def test_the_drawn_test_split_has_each_distribution_as_the_training_set():
    cfg = SyntheticData(clients=4, distributions=2, partition="10:90", samples_min=20, samples_max=30,
                        test_samples=50)
    fed = Federation(cfg, 3)
    for k in range(4):
        data = fed.with_test_split(k, fed.client_data(k))
        x, y = data.test_split()
        assert len(y) == len(data.y)
        counts = component_counts(int(fed.sizes[k]), fed.mixtures[k])
        pooled = [fed.holdout(s) for s in range(2)]
        first = pooled[0][0].tolist()  # each sample of the split is a sample of its distribution's holdout set
        assert sum(row in first for row in x.tolist()) == counts[0]
        again = Federation(cfg, 3).drawn_test_split(k)
        assert torch.equal(again[0], x) and torch.equal(again[1], y)
    assert data.test_x is None  # the algorithms' own metrics (test_*) never see it


def test_fedem_serves_its_mixture():
    torch.manual_seed(0)
    scratch = torch.nn.Sequential(torch.nn.Linear(3, 4))
    learners = torch.stack([get_flat(torch.nn.Sequential(torch.nn.Linear(3, 4))) for _ in range(2)])
    pi = torch.tensor([0.3, 0.7])
    x, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    got = score_client(Mixture(scratch, learners, pi, "classification"), x, y, "classification")
    want = mixture_metrics(scratch, learners, pi, x, y, "classification")
    assert got == pytest.approx(want)
    reg = torch.nn.Sequential(LinearRegression(3))
    vecs = torch.stack([get_flat(LinearRegression(3)) for _ in range(2)])
    yr = torch.randn(20)
    assert score_client(Mixture(reg, vecs, pi, "regression"), x, yr, "regression") == pytest.approx(
        mixture_metrics(reg, vecs, pi, x, yr, "regression"))


@pytest.mark.parametrize("case", ["ifca", "fpfc", "fedsoft", "fedem"])
def test_clustering_rows_equal_sklearn_at_the_final_step(case, tmp_path):
    cfg = small_config(**SYNC[case])
    run = raysoft.run(cfg, out=tmp_path)
    rows = _table(run, "clustering")
    clients = _table(run, "clients")
    truth = clients.loc[clients.groupby("client").share.idxmax()].sort_values("client").distribution.to_numpy()
    final = int(rows.step.max())
    assert final == cfg["algorithm"]["rounds"]
    evals = sorted(rows.step.unique())
    every = cfg["algorithm"]["eval_every"]
    assert evals == list(range(0, final + 1, every))  # a row at every evaluation
    if case in ("ifca", "fpfc"):
        a = _table(run, "assignments").sort_values("client")
        predicted, name = a.predicted.to_numpy(), "assignment"
    else:
        w = _table(run, "weights")
        w = w[w.step == w.step.max()]
        predicted = w.pivot(index="client", columns="center", values="estimate").to_numpy().argmax(axis=1)
        name = "weights_argmax"
    got = rows[rows.step == final].set_index(["clustering", "metric"]).value
    assert got[(name, "ari")] == pytest.approx(adjusted_rand_score(truth, predicted), abs=1e-12)
    assert got[(name, "nmi")] == pytest.approx(normalized_mutual_info_score(truth, predicted), abs=1e-12)
    assert (name, "changed") in got.index
    summary = json.loads((run.run_dir / "summary.json").read_text())
    if name == "weights_argmax":  # the mixture error at the end is the summary's matched weight MAE
        assert got[(name, "mixture_mae")] == pytest.approx(summary["weight_mae"])
    else:
        assert got[(name, "ari")] == pytest.approx(summary["ari"])


@pytest.mark.parametrize("case", ["fedavg", "local", "fedsoft"])
def test_every_client_is_scored_at_every_evaluation(case, tmp_path):
    cfg = small_config(**SYNC[case], output={"progress": "none", "target": 1e9})  # mse: any value reaches it
    run = raysoft.run(cfg, out=tmp_path)
    rows = _table(run, "client_metrics")
    assert not rows.held_out.any()
    assert sorted(rows.step.unique()) == [0, 2, 4]
    assert rows.groupby("step").client.nunique().eq(cfg["data"]["clients"]).all()
    summary = json.loads((run.run_dir / "summary.json").read_text())
    final = rows[(rows.step == 4) & (rows.metric == "mse")].sort_values("client").value.to_numpy()
    assert summary["personalised"]["mse"] == pytest.approx(client_summary(final, "mse"))
    assert summary["personalised"]["clients"] == 10
    assert summary["time_to_target"]["mean"] == {"step": 0, "virtual_time": None}


@pytest.mark.slow  # about 16 s on a shared machine
def test_a_stream_scores_its_clusterings_and_every_clients_last_reply(tmp_path):
    from support.configs import stream_config
    from support.images import write_fmnist

    write_fmnist(tmp_path / "fm")
    run = raysoft.run(stream_config(tmp_path / "fm"), out=tmp_path / "out")
    summary = json.loads((run.run_dir / "summary.json").read_text())
    rows = _table(run, "client_metrics")
    final = rows[(rows.step == 24) & (rows.metric == "accuracy")]
    assert len(final) == 6 and final.value.mean() == pytest.approx(summary["cli_aft"])  # every client's last reply
    assert summary["personalised"]["accuracy"]["mean"] == pytest.approx(summary["cli_aft"])
    # the last evaluation's clustering: each client's last estimate against its mixture at its last upload
    w, c = _table(run, "weights"), _table(run, "clients")
    last_w = w[w.step == w.groupby("client").step.transform("max")]
    last_c = c[c.step == c.groupby("client").step.transform("max")]
    predicted = last_w.pivot(index="client", columns="center", values="estimate").to_numpy().argmax(axis=1)
    truth = last_c.pivot(index="client", columns="distribution", values="share").to_numpy().argmax(axis=1)
    got = _table(run, "clustering")
    got = got[got.step == 24].set_index("metric").value
    assert got["ari"] == pytest.approx(adjusted_rand_score(truth, predicted), abs=1e-12)
    assert got["nmi"] == pytest.approx(normalized_mutual_info_score(truth, predicted), abs=1e-12)


def test_scoring_clients_together_gives_each_its_own_figures():
    from raysoft.evaluation import score_clients

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    splits = [(torch.randn(n, 5), torch.randint(0, 3, (n,))) for n in (3, 200, 1, 17)]
    together = score_clients(model, splits, "classification")
    alone = [score_client(model, x, y, "classification") for x, y in splits]
    for a, b in zip(together, alone):
        assert a == pytest.approx(b, rel=1e-6)
    reg = [(torch.randn(n, 3), torch.randn(n)) for n in (4, 9)]
    lin = LinearRegression(3)
    for a, (x, y) in zip(score_clients(lin, reg, "regression"), reg):
        assert a == pytest.approx(score_client(lin, x, y, "regression"), rel=1e-6)


@pytest.mark.slow  # about 7 s on a shared machine
def test_the_cfl_example_is_scored_as_it_splits_into_the_true_clusters(tmp_path, monkeypatch):
    """A plug-in with ``centers`` and ``assignment`` and no ``serve``: its clustering is scored at
    every evaluation (CFL's job finds the 4 true clusters by round 15) and each client is served
    its cluster's model."""
    import yaml
    from support.paths import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "cfl"))
    cfg = yaml.safe_load((ROOT / "examples" / "cfl" / "job.yaml").read_text())
    cfg["algorithm"]["rounds"] = 15
    cfg["ray"] = {"backend": "inprocess"}
    cfg["output"] = {"progress": "none"}
    run = raysoft.run(cfg, out=tmp_path)
    rows = _table(run, "clustering").pivot_table(index="step", columns="metric", values="value")
    assert list(rows.index) == [0, 5, 10, 15]
    assert rows.loc[0, "ari"] == 0.0 and rows.loc[15, "ari"] == 1.0 and rows.loc[15, "nmi"] == pytest.approx(1.0)
    assert rows.loc[15, "changed"] > 0  # the last split moved clients
    served = _table(run, "client_metrics")
    assert served[served.step == 15].client.nunique() == 20


@pytest.mark.slow  # starts Ray
def test_clients_scored_together_give_the_same_numbers_whatever_the_packing(tmp_path):
    """FedAvg's batched evaluate and the served models scored a host's clients at a time: the
    same rows on Ray with 4 client actors of 3 clients as in one process."""
    packed = raysoft.run(small_config(**SYNC["fedavg"], ray={"backend": "ray", "num_cpus": 2, "clients_per_actor": 3,
                                                            "num_cpus_per_actor": 0.5}), out=tmp_path / "ray")
    alone = raysoft.run(small_config(**SYNC["fedavg"]), out=tmp_path / "inprocess")
    for name in ("client_metrics", "metrics"):
        a, b = (_table(r, name).drop(columns=["run_id"] + (["time_s"] if name == "metrics" else []))
                for r in (packed, alone))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
