"""The data, model and callback example plug-ins outside the package: examples/npz_clients (a
dataset read from the user's .npz files), examples/mlp_model (an MLP model factory) and
examples/early_stop (a callback that stops a run); and the callbacks' edges: the built-in
``tensorboard`` logger (or its refusal when the package is missing), and a callback that raises."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.paths import EXAMPLES
from support.runs import values as _values

import raysoft
from raysoft import cli
from raysoft.callbacks import RunInfo
from raysoft.config import load_raw, parse_config
from raysoft.errors import ConfigError
from raysoft.models import DataInfo, build_model
from raysoft.plugins import ship_paths

NPZ, MLP_DIR, EARLY = EXAMPLES / "npz_clients", EXAMPLES / "mlp_model", EXAMPLES / "early_stop"

# the same module objects the runs resolve `npz_clients:NpzClients`, `mlp:MLP`, `early_stop:EarlyStop` to
for _folder in (NPZ, MLP_DIR, EARLY):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
from early_stop import EarlyStop, EarlyStopSettings  # noqa: E402
from mlp import MLP, MLPSettings  # noqa: E402
from npz_clients import NpzClients, NpzSettings  # noqa: E402

_spec = importlib.util.spec_from_file_location("npz_make_files", NPZ / "make_files.py")
make_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_files)


# ============================================================================ npz_clients
# 4 clients of 2 distributions, 3 features; every mixture is realised exactly by its size
SIZES = [8, 12, 10, 16]
MIXTURES = [[0.25, 0.75], [0.5, 0.5], [1.0, 0.0], [0.75, 0.25]]


def write_npz(folder: Path, classification: bool = False) -> Path:
    """Tiny files in the documented format: client 0 with a mixture and per-sample components,
    client 1 with components only (its mixture is theirs), client 2 with a mixture and its own
    test split, client 3 with a mixture only; a holdout set of 20 samples per distribution."""
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(2, 3))
    folder.mkdir(parents=True, exist_ok=True)

    def draw(comp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=(len(comp), 3))
        y = np.einsum("nd,nd->n", x, theta[comp]) + 0.1 * rng.normal(size=len(comp))
        return x, ((y > 0).astype(np.int64) + 2 * comp if classification else y)  # 4 classes

    for k, (n, mix) in enumerate(zip(SIZES, MIXTURES)):
        first = int(mix[0] * n)
        comp = rng.permutation(np.r_[np.zeros(first, int), np.ones(n - first, int)])
        x, y = draw(comp)
        arrays = {"x": x, "y": y}
        if k in (0, 1):
            arrays["component"] = comp
        if k != 1:
            arrays["mixture"] = np.array(mix)
        if k == 2:
            arrays["test_x"], arrays["test_y"] = draw(np.zeros(4, int))
        np.savez(folder / f"client_{k}.npz", **arrays)
    for s in range(2):
        x, y = draw(np.full(20, s))
        np.savez(folder / f"holdout_{s}.npz", x=x, y=y)
    return folder


def npz_config(folder: Path, **ray) -> dict:
    return {
        "seed": 1,
        "algorithm": {"name": "fedsoft", "rounds": 2, "clients_per_round": 2, "eval_every": 1},
        "data": {"name": "npz_clients:NpzClients", "folder": str(folder), "clients": 4, "distributions": 2},
        "model": {"name": "linear"},
        "train": {"optimizer": "sgd", "lr": 0.02, "local_epochs": 1},
        "ray": {"backend": "inprocess", **ray},
        "output": {"progress": "none"},
    }


@pytest.fixture
def npz_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(NPZ)
    return write_npz(tmp_path / "files")


@pytest.fixture(scope="module")
def npz_inprocess(tmp_path_factory):
    """One in-process run on the tiny files (shared by the checks of its tables and the Ray run)."""
    tmp = tmp_path_factory.mktemp("npz")
    folder = write_npz(tmp / "files")
    here = Path.cwd()
    try:
        os.chdir(NPZ)
        result = raysoft.run(npz_config(folder), out=tmp / "runs")
    finally:
        os.chdir(here)
    return folder, result


def test_npz_dataset_reads_task_shapes_and_tensors_from_the_files(tmp_path):
    folder = write_npz(tmp_path / "reg")
    data = NpzClients(NpzSettings(name="npz_clients:NpzClients", folder=str(folder), clients=4), 0)
    assert data.info == DataInfo(input_dim=3, num_outputs=1, task="regression")
    assert data.client_sizes(4, None).tolist() == SIZES
    np.testing.assert_array_equal(data.client_mixtures(4, 2, None), MIXTURES)
    x, y, comp, tx, ty = data.client(2, 10, np.array([1.0, 0.0]))
    assert (x.shape, x.dtype, y.shape, y.dtype) == ((10, 3), torch.float32, (10,), torch.float32)
    assert (tx.shape, ty.shape) == ((4, 3), (4,)) and (comp == 0).all()
    assert len(data.client(3, 16, np.array(MIXTURES[3]))) == 3  # no test split in its file

    folder = write_npz(tmp_path / "cls", classification=True)
    data = NpzClients(NpzSettings(name="npz_clients:NpzClients", folder=str(folder), clients=4), 0)
    assert data.info == DataInfo(input_dim=3, num_outputs=4, task="classification")  # labels 0..3
    x, y, _ = data.client(0, 8, np.array(MIXTURES[0]))
    assert y.dtype == torch.int64 and int(y.max()) <= 3
    data = NpzClients(NpzSettings(name="npz_clients:NpzClients", folder=str(folder), clients=4, num_classes=7), 0)
    assert data.info.num_outputs == 7
    # files of 3 distributions need no partition key (the default 10:90 is for S = 2)
    assert NpzSettings(name="npz_clients:NpzClients", folder="f", distributions=3).partition == "random"
    # a relative folder is pinned to the directory the config is read in
    assert NpzSettings(name="npz_clients:NpzClients", folder="data").folder == str(Path.cwd() / "data")


def test_npz_run_records_the_files_sizes_and_mixtures(npz_inprocess):
    folder, result = npz_inprocess
    clients = result.table("clients")
    assert clients.groupby("client")["samples"].sum().tolist() == SIZES
    shares = clients.pivot(index="client", columns="distribution", values="share").to_numpy()
    np.testing.assert_array_equal(shares, MIXTURES)  # client 1's from its per-sample components
    assert result.summary["rounds"] == 2 and result.summary["metric"] == "mse"
    assert sorted(result.metrics["step"].unique()) == [0, 1, 2]
    recorded = yaml.safe_load((result.run_dir / "config.yaml").read_text())["data"]
    assert recorded["folder"] == str(folder) and recorded["name"] == "npz_clients:NpzClients"


@pytest.mark.parametrize("damage, named", [
    (lambda f: (f / "client_2.npz").unlink(), "client_2.npz: no such file"),
    (lambda f: np.savez(f / "client_1.npz", x=np.zeros((3, 3)), mixture=np.array([0.5, 0.5])),
     "client_1.npz: has no array 'y'"),
    (lambda f: np.savez(f / "client_3.npz", x=np.zeros((3, 3)), y=np.zeros(3)),
     "client_3.npz: has neither 'mixture' nor 'component'"),
    (lambda f: np.savez(f / "client_1.npz", x=np.zeros((3, 4)), y=np.zeros(3), mixture=np.array([1.0, 0.0])),
     "client_1.npz: x has features of shape (4,)"),
    (lambda f: (f / "holdout_1.npz").write_bytes(b"not a zip"), "holdout_1.npz: not a readable .npz file"),
    (lambda f: (f / "holdout_0.npz").unlink(), "holdout_0.npz: no such file"),
], ids=["missing-client", "missing-array", "no-mixture", "other-shape", "bad-file", "missing-holdout"])
def test_npz_bad_files_are_refused_before_anything_is_written(npz_dir, tmp_path, damage, named):
    damage(npz_dir)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError, match="data: npz_clients:NpzClients: .*") as err:
        raysoft.run(npz_config(npz_dir), out=out)
    message = str(err.value)
    assert named in message and str(npz_dir) in message and "\n" not in message
    assert list(out.iterdir()) == []


def test_npz_missing_folder_and_too_many_clients_are_refused(npz_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="folder '.*nowhere' does not exist"):
        raysoft.run(npz_config(tmp_path / "nowhere"), out=out)
    cfg = npz_config(npz_dir)
    cfg["data"]["clients"] = 5
    with pytest.raises(ConfigError, match=r"client_4\.npz: no such file \(data.clients is 5"):
        raysoft.run(cfg, out=out)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_npz_run_on_ray_equals_the_in_process_run(npz_inprocess, ray_session, tmp_path, monkeypatch):
    """The plug-in module is shipped to the actors (py_modules): the run starts from the
    example's folder, the actors import npz_clients from what was shipped and read the same files."""
    folder, ref = npz_inprocess
    monkeypatch.chdir(NPZ)
    # the folder given relative to the directory the run starts in: pinned there, not the actors'
    cfg = npz_config(Path(os.path.relpath(folder, NPZ)), backend="ray", clients_per_actor=2, num_cpus_per_actor=0.1)
    assert ship_paths(parse_config(cfg)) == [str(NPZ / "npz_clients.py")]
    result = raysoft.run(cfg, out=tmp_path)
    for name in ("metrics", "weights", "clients"):
        pd.testing.assert_frame_equal(_values(result.run_dir, name), _values(ref.run_dir, name), check_exact=True)


@pytest.mark.slow
def test_npz_example_job_runs_on_the_demo_files(tmp_path, monkeypatch):
    """make_files.py's demo folder passes verify, and the example's job (in-process) tells the two
    distributions apart and estimates the mixtures."""
    make_files.write(tmp_path / "data")
    monkeypatch.chdir(NPZ)
    raw = load_raw(NPZ / "job.yaml", ["ray.backend=inprocess", "output.progress=none",
                                      f"data.folder={tmp_path / 'data'}"])
    result = raysoft.run(raw, out=tmp_path / "runs")
    s = result.summary
    assert s["rounds"] == 30 and s["distinct_best_centers"] and s["weight_mae"] < 0.2
    assert result.table("clients").groupby("client")["samples"].sum().between(40, 80).all()


# ============================================================================ mlp_model
INFO = DataInfo(input_dim=6, num_outputs=4, task="classification")


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_mlp_same_seed_same_weights_and_shapes(monkeypatch):
    settings = MLPSettings(name="mlp:MLP", widths=[8, 5])
    a = MLP(settings, INFO, torch.Generator().manual_seed(3))
    b = MLP(settings, INFO, torch.Generator().manual_seed(3))
    c = MLP(settings, INFO, torch.Generator().manual_seed(4))
    assert [tuple(p.shape) for p in a.parameters()] == [(8, 6), (8,), (5, 8), (5,), (4, 5), (4,)]
    assert all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(b)))
    assert not any(torch.equal(p, q) for p, q in zip(_weights(a), _weights(c)))
    assert a(torch.zeros(7, 6)).shape == (7, 4)
    reg = MLP(MLPSettings(name="mlp:MLP", widths=[]), DataInfo(3, 1, "regression"), torch.Generator())
    assert reg(torch.zeros(7, 3)).shape == (7,)  # [] is a linear model; regression squeezed
    # through the config and raysoft's model builder, as a run builds it
    monkeypatch.chdir(MLP_DIR)
    cfg = parse_config({"algorithm": {"name": "fedavg", "clients_per_round": 2}, "data": {"clients": 2},
                        "model": {"name": "mlp:MLP", "widths": [8, 5], "init": "torch_default"}})
    assert isinstance(cfg.model, MLPSettings) and "hidden" not in MLPSettings.model_fields  # the cnn's own key
    d = build_model(cfg.model, INFO, torch.Generator().manual_seed(3))
    e = build_model(cfg.model, INFO, torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(_weights(d), _weights(e)))
    # widths [] is the built-in logistic model, weight for weight (the same init from the same draws)
    linear = parse_config({"algorithm": {"name": "fedavg", "clients_per_round": 2}, "data": {"clients": 2},
                           "model": {"name": "mlp:MLP", "widths": [], "init": "torch_default"}})
    logistic = parse_config({"algorithm": {"name": "fedavg", "clients_per_round": 2}, "data": {"clients": 2},
                             "model": {"name": "logistic", "init": "torch_default"}})
    a, b = (build_model(c.model, INFO, torch.Generator().manual_seed(5)) for c in (linear, logistic))
    assert all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(b)))
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a(x), b(x))
    with pytest.raises(ConfigError, match="model.widths"):
        parse_config({"algorithm": {"name": "fedavg", "clients_per_round": 2}, "data": {"clients": 2},
                      "model": {"name": "mlp:MLP", "widths": [8, 0]}})


@pytest.mark.slow
def test_mlp_example_job_runs_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(MLP_DIR)
    raw = load_raw(MLP_DIR / "job.yaml", ["ray.backend=inprocess", "output.progress=none"])
    result = raysoft.run(raw, out=tmp_path)
    m = result.metrics
    acc = m[(m.scope == "cluster") & (m.metric == "accuracy")].groupby(["step", "eval_dist"])["value"].max()
    assert result.summary["rounds"] == 10
    assert acc.loc[10].mean() > acc.loc[0].mean() + 0.5  # measured: 0.08 -> 0.88
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["model"]["widths"] == [32]


# ============================================================================ early_stop
COLUMNS = ["run_id", "algorithm", "step", "time_s", "scope", "entity", "eval_dist", "metric", "value", "virtual_time"]


def rows(step: int, cluster: dict[tuple[int, int], float], metric: str = "mse", noise: bool = True) -> pd.DataFrame:
    """metrics.parquet rows of one evaluation: ``cluster`` maps (center, eval_dist) to the value;
    with ``noise``, also client rows and a loss (which the callback must ignore)."""
    out = [("r", "fedavg", step, 0.0, "cluster", c, s, metric, v, None) for (c, s), v in cluster.items()]
    if noise:
        out += [("r", "fedavg", step, 0.0, "client", k, -1, metric, 0.0, None) for k in range(3)]
        out += [("r", "fedavg", step, 0.0, "cluster", 0, 0, "loss", -1.0, None)]
    return pd.DataFrame(out, columns=COLUMNS)


def early_stop(**settings) -> EarlyStop:
    run = RunInfo("r", Path("."), parse_config({"algorithm": {"name": "fedavg", "clients_per_round": 2},
                                                 "data": {"clients": 2}}))
    return EarlyStop(EarlyStopSettings(name="early_stop:EarlyStop", **settings), run)


def test_early_stop_by_hand():
    """patience 2, min_delta 0.1, min: the watched value is the mean over distributions of the
    best center's mse: 3.5, 3.0 (better), 2.95 (not by 0.1: 1), 2.5 (better), 2.45 (1), 2.6 (2: stop)."""
    cb = early_stop(metric="mse", patience=2, min_delta=0.1)
    best = [3.5, 3.0, 2.95, 2.5, 2.45, 2.6]
    said = []
    for i, v in enumerate(best):
        said.append(cb.on_rows(rows(5 * i, {(0, 0): v - 0.5, (1, 0): v + 7, (0, 1): v + 9, (1, 1): v + 0.5})))
        said.append(cb.on_rows(rows(5 * i + 1, {}, noise=True)))  # a call without the metric counts for nothing
    assert said == [False] * 10 + [True, False]  # True at the 6th evaluation
    assert cb.best == 2.5 and cb.best_step == 15 and [s for s, _ in cb.history] == [0, 5, 10, 15, 20, 25]

    # several evaluations in one call (a stream's batch): True once the patience runs out inside it
    cb = early_stop(metric="mse", patience=2)
    frame = pd.concat([rows(s, {(0, 0): v}) for s, v in ((0, 1.0), (1, 0.9), (2, 0.9), (3, 0.95), (4, 0.1))])
    assert cb.on_rows(frame) is True and cb.history[-1] == (3, 0.95)

    # max, with the entities' mean: accuracy 0.5, 0.6, 0.6, 0.55 -> stops at the 4th (patience 2)
    cb = early_stop(metric="accuracy", mode="max", entities="mean", patience=2)
    said = [cb.on_rows(rows(i, {(0, 0): v - 0.1, (1, 0): v + 0.1}, metric="accuracy"))
            for i, v in enumerate([0.5, 0.6, 0.6, 0.55])]
    assert said == [False, False, False, True]


@pytest.mark.slow
def test_early_stop_example_job_stops_early(tmp_path, monkeypatch):
    monkeypatch.chdir(EARLY)
    raw = load_raw(EARLY / "job.yaml", ["ray.backend=inprocess", "output.progress=none"])
    result = raysoft.run(raw, out=tmp_path)
    s, rounds = result.summary, raw["algorithm"]["rounds"]
    assert s["stopped_early"] is True and 0 < s["stopped_at"] < rounds and s["rounds"] == s["stopped_at"]
    assert result.metrics["step"].max() == s["stopped_at"]
    assert yaml.safe_load((result.run_dir / "config.yaml").read_text())["algorithm"]["rounds"] == rounds
    # the recorded metrics, replayed evaluation by evaluation, stop a fresh callback at that round
    cb = early_stop(**{k: v for k, v in raw["callbacks"][0].items() if k != "name"})
    m = result.metrics
    said = [cb.on_rows(m[m.step == step]) for step in sorted(m.step.unique())]
    assert said[-1] is True and not any(said[:-1])


# ============================================================================ callbacks' edges
def _has_tensorboard() -> bool:
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


HAS_TENSORBOARD = _has_tensorboard()


def small_run(**extra) -> dict:
    return {"seed": 3, "algorithm": {"name": "fedavg", "rounds": 2, "clients_per_round": 4, "eval_every": 1},
            "data": {"name": "synthetic", "clients": 4, "samples_min": 20, "samples_max": 30, "test_samples": 50},
            "train": {"local_epochs": 1}, "ray": {"backend": "inprocess"}, "output": {"progress": "none"}, **extra}


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="the tensorboard package is not installed here (its refusal is "
                                                "tested instead)")
def test_tensorboard_scalars_equal_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    result = raysoft.run(small_run(callbacks=[{"name": "tensorboard", "logdir": str(logdir)}]), out=tmp_path / "runs")
    acc = EventAccumulator(str(logdir / result.run_id), size_guidance={"scalars": 0})
    acc.Reload()
    m = result.metrics
    assert sorted(acc.Tags()["scalars"]) == sorted({f"{r.scope}/{r.metric}/e{r.entity}/d{r.eval_dist}"
                                                    for r in m.itertuples()})
    for r in m.itertuples():
        events = {e.step: e.value for e in acc.Scalars(f"{r.scope}/{r.metric}/e{r.entity}/d{r.eval_dist}")}
        assert events[r.step] == pytest.approx(r.value, rel=1e-6)  # stored as float32


def test_tensorboard_without_the_package_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Where the package is installed, it is hidden (an import of it then fails as if absent)."""
    for name in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"callback 'tensorboard': .*pip install 'raysoft\[tensorboard\]'"):
        raysoft.run(small_run(callbacks=[{"name": "tensorboard"}]), out=out)
    assert list(out.iterdir()) == []
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(small_run(callbacks=[{"name": "tensorboard", "logdir": str(tmp_path / "tb")}])))
    assert cli.main(["run", str(job), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "raysoft[tensorboard]" in err
    assert list(out.iterdir()) == [] and not (tmp_path / "tb").exists()


BOOM = '''
from raysoft.sdk import Callback


class Boom(Callback):
    def on_rows(self, rows):
        if rows["step"].max() >= 1:
            raise RuntimeError("the disk is full\\n(second line)")
'''


def test_a_callback_that_raises_ends_the_run_in_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / "boom_cb.py").write_text(BOOM)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "runs"
    with pytest.raises(ConfigError) as err:
        raysoft.run(small_run(callbacks=[{"name": "boom_cb:Boom"}]), out=out)
    message = str(err.value)
    assert "boom_cb:Boom" in message and "on_rows" in message and "RuntimeError: the disk is full" in message
    assert "\n" not in message
    assert list(out.iterdir()) == []  # a refused run leaves nothing
