"""Held-out clients (``data.held_out``): who they are, that they never train, each built-in's
cold start by hand on tiny problems, and end-to-end runs that score them."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.configs import small_config, stream_config
from support.images import write_fmnist
from support.paths import ROOT
from support.runs import assert_same

import raysoft
from raysoft.algorithms.base import ClientContext
from raysoft.algorithms.fedavg import local_budget
from raysoft.algorithms.fedem import fit_mixture
from raysoft.algorithms.fedsoft import client_unseen
from raysoft.algorithms.ifca import center_cold_start
from raysoft.backends.host import ClientHost
from raysoft.config import parse_config
from raysoft.data import ClientData
from raysoft.errors import ConfigError
from raysoft.models import DataInfo
from raysoft.unseen import held_out_clients, unseen_summary

# fpfc's first run in a session costs ~8 s of start-up: slow
ROUNDS = {"fedavg": {}, "local": {}, "ifca": {"num_centers": 2, "init_threshold": 0.2},
          "fedsoft": {"num_centers": 2}, "fedem": {"num_centers": 2}, "fpfc": {}}


# ============================================================================ who is held out
def _data(**data):
    return parse_config({"algorithm": {"clients_per_round": 2}, "data": data}).data


def test_a_share_or_a_count_draws_distinct_clients_from_the_data_seed():
    data = _data(clients=10, held_out=0.25)
    assert data.held_out_count() == 2  # round(2.5) = 2
    ids = held_out_clients(data, 3)
    assert len(set(ids)) == 2 and ids == tuple(sorted(ids)) and held_out_clients(data, 3) == ids
    assert _data(clients=10, held_out=0.01).held_out_count() == 1  # at least one
    assert _data(clients=10, held_out=3).held_out_count() == 3
    assert held_out_clients(_data(clients=10), 3) == ()  # the default: none
    fixed = _data(clients=50, held_out=5, seed=7)
    assert held_out_clients(fixed, 1) == held_out_clients(fixed, 2)  # data.seed alone draws them


@pytest.mark.parametrize("value, why", [(1.5, "neither a share"), (10, "leaves no client to train"),
                                        (0.99, "leaves no client to train"), (-0.1, "greater than or equal")])
def test_a_held_out_that_cannot_be_is_refused_in_one_line(value, why):
    with pytest.raises(ConfigError, match=why) as err:
        _data(clients=10, held_out=value)
    assert "\n" not in str(err.value)


# ============================================================================ cold starts by hand
def _regression_client(x: list[float], y: list[float], test: tuple[list[float], list[float]] | None = None,
                       **cfg) -> ClientContext:
    """One client of a 1-d linear regression (a model's vector is (w, b))."""
    raw = {"algorithm": {"name": "fedavg", "clients_per_round": 1}, "data": {"clients": 2},
           "train": {"optimizer": "sgd", "lr": 0.1, "batch_size": None, "local_epochs": 1}, **cfg}
    col = lambda v: torch.tensor(v)[:, None]  # noqa: E731
    data = ClientData(col(x), torch.tensor(y), np.zeros(len(x), dtype=int),
                      *((col(test[0]), torch.tensor(test[1])) if test else (None, None)))
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Flatten(0))  # [n] predictions
    return ClientContext(cfg=parse_config(raw), client=0, data=data,
                         info=DataInfo(input_dim=1, num_outputs=1, task="regression"), scratch=model)


def test_ifca_and_fpfc_serve_the_center_with_the_lowest_loss_on_the_clients_training_data():
    """y = 2x at x = (1, 2): center (1, 0) has mse 2.5, (2, 0) has 0, (0, 3) has 1 -> center 1,
    chosen on the training data and scored on the test split (x = 3, y = 7): (7 - 6)^2 = 1."""
    ctx = _regression_client([1.0, 2.0], [2.0, 4.0], test=([3.0], [7.0]))
    out = center_cold_start(ctx, torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]]))
    assert out.extra == 1 and out.metrics["center"] == 1.0
    assert out.metrics["mse"] == pytest.approx(1.0) and "test_mse" not in out.metrics


def test_fedsoft_counts_the_samples_each_center_fits_best_and_serves_that_mixture():
    """Centers y = 2x and y = 0: the first fits samples 1-3 best, the second sample 4, so u =
    (3/4, 1/4) and the served model is (1.5, 0): on a test split of the same four points,
    residuals (-0.5, -1, -1.5, 6), mse 39.5 / 4."""
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 0.0]
    centers = {"centers": torch.tensor([[2.0, 0.0], [0.0, 0.0]])}  # the payload: sigma is the client's setting
    fedsoft = lambda sigma: {"name": "fedsoft", "clients_per_round": 1, "sigma": sigma}  # noqa: E731
    ctx = _regression_client(x, y, test=(x, y), algorithm=fedsoft(0.01))
    _, out = client_unseen(ctx, None, centers, 0)
    assert (out["u[0]"], out["u[1]"]) == (0.75, 0.25)
    assert out["mse"] == pytest.approx(39.5 / 4)
    # the counter smoother's floor is kept, then the weights are normalised: (3/4, 0.3) / 1.05
    _, floored = client_unseen(_regression_client(x, y, test=(x, y), algorithm=fedsoft(0.3)), None, centers, 0)
    w = 0.75 / 1.05 * 2.0
    assert floored["mse"] == pytest.approx(((w - 2) ** 2 + (2 * w - 4) ** 2 + (3 * w - 6) ** 2 + 16 * w**2) / 4,
                                           rel=1e-5)


def test_fedem_em_on_frozen_learners_finds_the_mixture_that_drew_the_data():
    """Two frozen 'learners' whose losses are Gaussian negative log-likelihoods (means -2 and 2);
    20,000 samples drawn 30 % from the first: EM's weights come within 0.02 of (0.3, 0.7) and
    are its fixed point."""
    rng = np.random.default_rng(0)
    first = rng.random(20_000) < 0.3
    x = np.where(first, rng.normal(-2.0, 1.0, first.size), rng.normal(2.0, 1.0, first.size))
    losses = torch.tensor(np.stack([0.5 * (x + 2.0) ** 2, 0.5 * (x - 2.0) ** 2]))
    pi, steps = fit_mixture(losses)
    assert abs(float(pi[0]) - 0.3) < 0.02 and 1 < steps < 500
    again = torch.softmax(torch.log(pi)[:, None] - losses, dim=0).mean(dim=1)
    assert torch.allclose(again, pi, atol=1e-7)
    one, steps = fit_mixture(losses, 1, 0.0)  # unseen_em_steps: 1, the reference code's one step
    assert steps == 1 and torch.allclose(one, torch.softmax(-losses, dim=0).mean(dim=1))
    # one learner perfect on every sample, the other far off: all the weight on the first
    sure, _ = fit_mixture(torch.tensor([[0.0, 0.0, 0.0], [50.0, 60.0, 70.0]]))
    assert float(sure[0]) == pytest.approx(1.0)


def test_locals_budget_is_the_epochs_a_training_client_has_had():
    assert local_budget(4, 6, 8, 2) == 6  # 4 rounds * 6/8 of the clients * 2 epochs
    assert local_budget(10, 20, 8, 1) == 10  # every client every round
    assert local_budget(0, 2, 8, 1) == 1  # never less than one epoch


def test_the_summary_is_the_mean_p10_and_median_of_the_headline():
    metrics = {k: {"mse": float(10 * k), "center": 0.0} for k in range(1, 6)}
    out = unseen_summary(metrics, "mse", 3)
    assert out["metric"] == "mse" and out["mean"] == 30.0 and out["median"] == 30.0
    assert out["p10"] == pytest.approx(14.0) and out["scored"] == 5 and out["step"] == 3


# ============================================================================ whole runs
@pytest.fixture()
def calls(monkeypatch):
    """Every (op, clients) a ClientHost is asked to run."""
    seen: list[tuple[str, list[int]]] = []
    call, keep = ClientHost.call, ClientHost.call_for_reduction

    def spy(self, op, ids, *args, **kw):
        ids = list(ids)
        seen.append((op, ids))
        return call(self, op, ids, *args, **kw)

    def spy_keep(self, op, ids, *args, **kw):
        ids = list(ids)
        seen.append((op, ids))
        return keep(self, op, ids, *args, **kw)

    monkeypatch.setattr(ClientHost, "call", spy)
    monkeypatch.setattr(ClientHost, "call_for_reduction", spy_keep)
    return seen


def _run(tmp_path, algorithm: dict, **sections):
    cfg = small_config(algorithm=algorithm, **sections)
    cfg["data"] = {**cfg["data"], "held_out": 0.2, **sections.get("data", {})}
    return raysoft.run(cfg, out=tmp_path)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "fpfc" else n
                                  for n in sorted(ROUNDS)])
def test_held_out_clients_never_train_and_are_scored_at_the_end(tmp_path, calls, name):
    run = _run(tmp_path, {"name": name, **ROUNDS[name]})
    held = tuple(run.summary["held_out"]["clients"])
    assert held == held_out_clients(parse_config(small_config(data={"held_out": 0.2})).data, 3) and len(held) == 2
    for op, ids in calls:
        assert (op == "unseen") == bool(set(ids) & set(held)), (op, ids)
    assert [ids for op, ids in calls if op == "unseen"] == [list(held)]  # once, at the final evaluation
    rows = pd.read_parquet(run.run_dir / "client_metrics.parquet")
    assert not set(rows[~rows.held_out].client) & set(held)  # the trained clients' served models: theirs alone
    rows = rows[rows.held_out]
    assert set(rows.client) == set(held) and set(rows.step) == {4}
    mse = rows[rows.metric == "mse"].sort_values("client").value.to_numpy()
    summary = run.summary["held_out"]
    assert summary["metric"] == "mse" and summary["mean"] == pytest.approx(mse.mean())
    assert summary["median"] == pytest.approx(np.median(mse)) and summary["scored"] == 2
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    assert not set(metrics[metrics.scope == "client"].entity) & set(held)  # no training-client rows
    if (run.run_dir / "weights.parquet").exists():
        assert not set(pd.read_parquet(run.run_dir / "weights.parquet").client) & set(held)


def test_every_evaluation_scores_them_when_asked(tmp_path):
    run = _run(tmp_path, {"name": "ifca", "num_centers": 2}, data={"held_out_eval": "every"})
    rows = pd.read_parquet(run.run_dir / "client_metrics.parquet")
    assert sorted(set(rows.step)) == [0, 2, 4] and run.summary["held_out"]["step"] == 4


def test_fedsoft_with_full_participation_never_trains_them(tmp_path, calls):
    run = _run(tmp_path, {"name": "fedsoft", "num_centers": 2, "selection": "full"})
    held = set(run.summary["held_out"]["clients"])
    trained = {k for op, ids in calls if op in ("train", "estimate") for k in ids}
    assert trained == set(range(10)) - held


def test_with_none_held_out_nothing_is_written(tmp_path):
    run = raysoft.run(small_config(algorithm={"name": "ifca", "num_centers": 2}), out=tmp_path)
    assert "held_out" not in run.summary
    assert not pd.read_parquet(run.run_dir / "client_metrics.parquet").held_out.any()


PLUGIN = '''
from raysoft.algorithms.base import ClientCall, RoundResult
from raysoft.algorithms.fedavg import FedAvg, GlobalModel, _fedavg_evaluate, _fedavg_train
from raysoft.config import AlgorithmConfig


class Settings(AlgorithmConfig):
    pass


class EveryoneAvg(FedAvg):
    """FedAvg over every client it knows of, and no cold start."""

    Settings = Settings
    client_ops = {"train": _fedavg_train, "evaluate": _fedavg_evaluate}
    stateless_ops = ()

    def round(self, ctx, state, t):
        res = yield ClientCall("train", list(range(ctx.num_clients)), {"model": state.model})
        return RoundResult(GlobalModel(sum(res.values()) / len(res)), trained=len(res))
'''


def test_a_plugin_without_a_cold_start_has_them_skipped_in_one_line(tmp_path, monkeypatch, calls, capsys):
    (tmp_path / "everyone_avg.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        run = _run(tmp_path, {"name": "everyone_avg:EveryoneAvg"}, output={"progress": "lines"})
    finally:
        sys.modules.pop("everyone_avg", None)
    held = set(run.summary["held_out"]["clients"])
    assert all(not set(ids) & held for _, ids in calls)  # its call to every client left them out
    assert "no cold start" in run.summary["held_out"]["skipped"] and run.summary["events"]["held_out_skipped"] == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "held_out_skipped" in line]
    assert len(said) == 1 and "2 held-out clients are not scored" in said[0]
    assert not pd.read_parquet(run.run_dir / "client_metrics.parquet").held_out.any()


@pytest.mark.slow  # the first stream run of a session builds its images and pre-trains: ~20 s
@pytest.mark.parametrize("name", ["ccfl", "fedsoft_async", "local_stream"])
def test_a_streams_held_out_clients_never_upload_and_are_scored(tmp_path, name):
    write_fmnist(tmp_path / "fmnist")
    cfg = stream_config(tmp_path / "fmnist", name)
    cfg["data"]["held_out"] = 2
    run = raysoft.run(cfg, out=tmp_path)
    held = set(run.summary["held_out"]["clients"])
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    assert not set(metrics[metrics.scope == "client"].entity) & held
    rows = pd.read_parquet(run.run_dir / "client_metrics.parquet")
    assert not set(rows[~rows.held_out].client) & held  # the trained clients' served models: theirs alone
    rows = rows[rows.held_out]
    assert set(rows.client) == held and set(rows.metric) >= {"accuracy", "loss"}
    assert run.summary["held_out"]["metric"] == "accuracy" and run.summary["held_out"]["scored"] == 2
    json.dumps(run.summary)


@pytest.mark.slow
def test_the_same_numbers_for_any_packing_on_ray(tmp_path, ray_session):
    """FedEM's cold starts on Ray with three clients per actor and with five: the same rows."""
    runs = [_run(tmp_path / str(k), {"name": "fedem", "num_centers": 2},
                 ray={"backend": "ray", "clients_per_actor": k, "num_cpus_per_actor": 0.1}) for k in (3, 5)]
    assert_same(*runs, tables=("client_metrics", "metrics"))
    assert runs[0].summary["held_out"] == runs[1].summary["held_out"]


def test_a_resumed_run_scores_them_as_the_run_it_continues(tmp_path):
    """FedEM, cold starts at every evaluation: stopped at round 3 (a non-finite update, its
    checkpoint of round 2 kept) and resumed, the same rows as a run never stopped."""
    algorithm = {"name": "fedem", "num_centers": 2, "clients_per_round": 10}
    clean = _run(tmp_path, algorithm, data={"held_out_eval": "every"})
    assert 0 not in clean.summary["held_out"]["clients"]
    cfg = small_config(algorithm=algorithm, output={"checkpoint_every": 2},
                       faults=[{"kind": "nan_update", "at_round": 3, "client": 0}])
    cfg["data"] = {**cfg["data"], "held_out": 0.2, "held_out_eval": "every"}
    with pytest.raises(raysoft.errors.UpdateError):
        raysoft.run(cfg, out=tmp_path, dir_name="stopped")
    run_dir = tmp_path / "stopped"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**saved, "faults": []}))
    resumed = raysoft.resume(run_dir)
    assert_same(clean, resumed, tables=("client_metrics", "metrics"))
    assert resumed.summary["held_out"] == clean.summary["held_out"]


def test_a_plugins_own_cold_start_is_used(tmp_path, monkeypatch):
    """The FedProx example's cold start is the global model: with mu 0 it is the built-in FedAvg,
    whose held-out rows it writes number for number (both trained client by client)."""
    monkeypatch.chdir(ROOT / "examples" / "fedprox")
    train = {"batched_clients": "off", "local_epochs": 2}
    try:
        prox = _run(tmp_path / "prox", {"name": "fedprox:FedProx", "mu": 0.0}, train=train)
    finally:
        sys.modules.pop("fedprox", None)
    avg = _run(tmp_path / "avg", {"name": "fedavg"}, train=train)
    held = [pd.read_parquet(r.run_dir / "client_metrics.parquet").query("held_out").drop(columns="run_id")
            .reset_index(drop=True) for r in (prox, avg)]
    pd.testing.assert_frame_equal(*held)
    assert prox.summary["held_out"]["scored"] == 2
