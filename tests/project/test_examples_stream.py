"""examples/fedasync: FedAsync (Xie, Koyejo, Gupta 2020) as a stream plug-in outside the package.
Its server maths by hand (staleness functions, one update), a run in-process on the tiny fake
Fashion-MNIST with every server step checked against the formula, the same numbers on Ray for
two packings of clients, and the command line from the example's own folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import stream_config
from support.images import write_fmnist
from support.paths import EXAMPLES
from support.runs import values as _values

import raysoft

EXAMPLE = EXAMPLES / "fedasync"
RAYSOFT = str(Path(sys.executable).parent / "raysoft")
NAME = "fedasync:FedAsync"

sys.path.insert(0, str(EXAMPLE))  # the same module object the run resolves `fedasync:FedAsync` to
import fedasync  # noqa: E402
from fedasync import FedAsync, FedAsyncConfig, FedAsyncState, fedasync_update, mixing_weight, staleness_weight  # noqa: E402


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm")
    write_fmnist(root)
    return root


def settings(**kw) -> FedAsyncConfig:
    return FedAsyncConfig(name=NAME, **kw)


def tiny(fm, **algo) -> dict:
    """support.configs' tiny stream (6 clients, 3 clusters, 24 uploads) with FedAsync's keys."""
    cfg = stream_config(fm, name=NAME, **algo)
    cfg["algorithm"].pop("l_bar")  # a CCFL key
    return cfg


# ----------------------------------------------------------------------------- the maths by hand
def test_staleness_functions_by_hand():
    const, poly, hinge = settings(staleness="constant"), settings(), settings(staleness="hinge", a=10.0, b=4.0)
    assert poly.alpha == 0.6 and poly.staleness == "polynomial" and poly.a == 0.5  # the documented defaults
    assert [staleness_weight(t, 0, const) for t in (0, 1, 50)] == [1.0, 1.0, 1.0]
    # polynomial (t - tau + 1)^(-a), a = 0.5
    assert staleness_weight(5, 2, poly) == pytest.approx(0.5)  # 4^-0.5
    assert staleness_weight(10, 2, poly) == pytest.approx(1 / 3)  # 9^-0.5
    assert staleness_weight(3, 3, poly) == 1.0
    assert staleness_weight(4, 3, settings(a=1.0)) == pytest.approx(0.5)  # 2^-1
    # hinge: 1 up to b, then 1 / (a (t - tau - b) + 1)
    assert staleness_weight(4, 0, hinge) == 1.0
    assert staleness_weight(5, 0, hinge) == pytest.approx(1 / 11)
    assert staleness_weight(7, 1, hinge) == pytest.approx(1 / 21)
    assert staleness_weight(9, 0, settings(staleness="hinge", a=0.5, b=1.0)) == pytest.approx(0.2)  # 1/(0.5*8+1)
    # alpha_t = alpha s(t - tau)
    assert mixing_weight(5, 2, poly) == pytest.approx(0.3)
    assert mixing_weight(5, 2, settings(alpha=0.9, staleness="constant")) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="t - tau must be >= 0"):
        staleness_weight(1, 2, poly)


@pytest.mark.parametrize("bad", [{"alpha": 2.0}, {"alpha": 0.0}, {"alpha": 1.0}, {"staleness": "linear"},
                                 {"a": -1.0}, {"b": -1.0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        settings(**bad)


def test_fedasync_update_by_hand():
    x, x_new = torch.tensor([0.0, 10.0]), torch.tensor([10.0, 0.0])
    out = fedasync_update(x, x_new, 0.25)
    assert torch.equal(out, torch.tensor([2.5, 7.5]))
    assert torch.equal(x, torch.tensor([0.0, 10.0]))  # a new tensor, the old model untouched
    assert torch.equal(fedasync_update(x, x_new, 0.0), x)


def test_one_server_step_by_hand():
    algo = FedAsync(settings())  # alpha 0.6, polynomial a = 0.5
    state = algo.init_stream_server(torch.tensor([[0.0, 0.0, 2.0, 4.0], [2.0, 4.0, 4.0, 4.0]]))
    assert torch.equal(state.x, torch.tensor([1.0, 2.0, 3.0, 4.0])) and state.t == 0  # x_0: the average
    assert algo.cold_start(state, None)["t"] == 0
    state = FedAsyncState(x=state.x, t=4, clusters=2)
    up = {"w": torch.tensor([3.0, 2.0, 1.0, 0.0]), "tau": 2}
    new, model, diag = algo.server_step(state, 5, up, None, [])
    # t = 5, t - tau = 3, s = 4^-0.5 = 0.5, alpha_t = 0.3: x = 0.7 x + 0.3 x_new
    assert new.t == 5 and diag["staleness"] == 3 and diag["alpha"] == pytest.approx(0.3)
    assert diag["stale"] is False and diag["u"] is None
    torch.testing.assert_close(new.x, torch.tensor([1.6, 2.0, 2.4, 2.8]))
    assert torch.equal(state.x, torch.tensor([1.0, 2.0, 3.0, 4.0]))  # the old state is not modified
    reply = algo.reply(new, model)
    assert torch.equal(reply["model"], new.x)  # the engine stamps the reply with its epoch t
    reply["t"] = 5
    anchor, models, down = algo.receive(None, reply)
    assert torch.equal(anchor, new.x) and models is None and down == 16
    evaluated = algo.models(new)  # the one global model, once per cluster's validation set
    assert evaluated.shape == (2, 4) and all(torch.equal(row, new.x) for row in evaluated)


# ----------------------------------------------------------------------------- runs
def _spy(monkeypatch) -> list[dict]:
    """Every server step of the runs that follow, with the model before and after."""
    seen: list[dict] = []
    original = FedAsync.server_step

    def server_step(self, state, client, up, scratch, val_sets):
        new, model, diag = original(self, state, client, up, scratch, val_sets)
        seen.append({**diag, "x_before": state.x, "x_after": new.x, "w": up["w"], "t_before": state.t})
        return new, model, diag

    monkeypatch.setattr(fedasync.FedAsync, "server_step", server_step)
    return seen


@pytest.mark.slow
def test_a_stream_run_in_process_mixes_every_upload_by_its_staleness(fm, tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    steps = _spy(monkeypatch)
    r = raysoft.run(tiny(fm), out=tmp_path)
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert summary["kind"] == "stream" and summary["algorithm"] == NAME
    assert summary["uploads"] == 24 and summary["stale_uploads"] == 0  # FedAsync drops nothing
    for key in ("cli_bfr", "cli_aft", "cluster_acc"):
        assert 0.0 <= summary[key] <= 1.0
    m = pd.read_parquet(r.run_dir / "metrics.parquet")
    client = m[m.scope == "client"]
    assert len(client[client.metric == "accuracy_before"]) == 24  # one row per upload
    assert sorted(client[client.metric == "accuracy_before"].step) == list(range(1, 25))
    # one model down and one up per upload: the same bytes
    d = steps[0]["x_before"].numel()
    for metric in ("bytes_down", "bytes_up"):
        assert (client[client.metric == metric].value == 4 * d).all()
    # the server: x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = 0.6 (t - tau + 1)^-0.5
    assert [s["t"] for s in steps] == list(range(1, 25))
    for s in steps:
        assert s["t"] == s["t_before"] + 1 and s["staleness"] == s["t"] - s["tau"] >= 1
        assert s["alpha"] == pytest.approx(0.6 * (s["staleness"] + 1) ** -0.5)
        assert torch.equal(s["x_after"], fedasync_update(s["x_before"], s["w"], s["alpha"]))
    for a, b in zip(steps, steps[1:]):
        assert torch.equal(a["x_after"], b["x_before"])  # one global model, carried upload to upload
    gaps = {s["staleness"] for s in steps}
    assert 1 in gaps and max(gaps) > 1  # fresh and stale uploads both happen...
    fresh = max(s["alpha"] for s in steps if s["staleness"] == 1)
    assert all(s["alpha"] < fresh for s in steps if s["staleness"] > 1)  # ...and the stale weigh less
    # the algorithm's own per-upload diagnostics: staleness and alpha_t, in diagnostics.parquet
    diag = pd.read_parquet(r.run_dir / "diagnostics.parquet")
    staleness = diag[diag.name == "staleness"]
    assert dict(zip(staleness.step, staleness.value)) == {s["t"]: s["staleness"] for s in steps}
    alphas = diag[diag.name == "alpha_t"]
    assert dict(zip(alphas.step, alphas.value)) == pytest.approx({s["t"]: s["alpha"] for s in steps})
    # the clusters' figures are the one global model on each cluster's test set
    cluster = m[(m.scope == "cluster") & (m.metric == "accuracy")]
    assert sorted(cluster.step.unique()) == [0, 8, 16, 24]
    assert (cluster.groupby(["step", "eval_dist"]).value.nunique() == 1).all()
    per_eval = cluster[cluster.entity == 0].groupby("step").value.mean()
    assert summary["cluster_acc"] == pytest.approx(per_eval.mean())


@pytest.mark.slow
@pytest.mark.ray
def test_on_ray_the_stream_is_identical_for_two_packings_and_in_process(ray_session, fm, tmp_path, monkeypatch):
    monkeypatch.chdir(EXAMPLE)
    ref = _values(raysoft.run(tiny(fm), out=tmp_path / "here"))
    for packing in (1, 3):
        cfg = tiny(fm)
        cfg["ray"] = {"backend": "ray", "clients_per_actor": packing, "num_cpus_per_actor": 0.25}
        m = _values(raysoft.run(cfg, out=tmp_path / f"ray{packing}"))
        pd.testing.assert_frame_equal(m, ref, check_exact=True)


TINY_SET = ["data.clients=6", "data.distributions=3", "data.samples_min=10", "data.samples_max=20",
            "data.test_samples=8", "algorithm.rounds=12", "algorithm.eval_every=6", "algorithm.public_samples=6",
            "algorithm.pretrain_epochs=1", "model.channels=[2, 4]", "model.hidden=8", "train.batch_size=8",
            "ray.backend=inprocess", "output.progress=none"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RAYSOFT, "run", "job.yaml", *args], cwd=EXAMPLE, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_a_bad_setting_from_the_command_line_is_one_line_and_exit_2(fm, tmp_path):
    out = tmp_path / "out"
    bad = _cli("--set", f"data.root={fm}", "--set", "algorithm.alpha=2", "--out", str(out))
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "algorithm.alpha" in bad.stderr, bad.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_the_job_runs_from_the_examples_folder(fm, tmp_path):
    sets = [x for s in [f"data.root={fm}", *TINY_SET, "algorithm.staleness=hinge"] for x in ("--set", s)]
    done = _cli(*sets, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    run_dir = Path(done.stdout.strip().splitlines()[-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kind"] == "stream" and summary["algorithm"] == NAME and summary["uploads"] == 12
    m = pd.read_parquet(run_dir / "metrics.parquet")
    assert len(m[m.metric == "accuracy_before"]) == 12
    assert np.isfinite(m.value).all()
