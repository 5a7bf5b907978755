"""The stream contract a plug-in relies on (docs/plugins.md#streams): the engine counts the
uploads and stops the stream at ``rounds`` whatever the plug-in's state says, a reply's
``extras`` come back with the client's next upload, and a missing hook is one line at load."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.configs import stream_config
from support.images import write_fmnist

import raysoft

RAYSOFT = str(Path(sys.executable).parent / "raysoft")

PLUGIN = '''
from dataclasses import dataclass

import torch

import numpy as np

from raysoft.sdk import DataConfig, DataInfo, StreamAlgorithm, StreamConfig, nbytes, numpy_rng

SEEN = []  # (client, tau, extras) of every upload the server applied


@dataclass
class State:
    x: torch.Tensor
    t: int
    clusters: int
    version: int = 0  # the plug-in's own model version: sent with every reply


class Base(StreamAlgorithm):
    """One global model, the mean of itself and every upload; ``STEP`` is what its server
    step adds to its own ``t`` (a plug-in's bookkeeping, not the engine's)."""

    Settings = StreamConfig
    STEP = 1

    def first_anchor(self, payload):
        return payload["x"], None, nbytes(payload["x"])

    def receive(self, cs, reply):
        return reply["model"], None, nbytes(reply["model"])

    def init_stream_server(self, models):
        return State(models.mean(0), 0, len(models))

    def cold_start(self, state, initial_models):
        return {"x": state.x, "extras": {"version": "cold"}}

    def server_step(self, state, client, up, scratch, val_sets):
        SEEN.append((client, up["tau"], dict(up["extras"])))
        x = 0.5 * (state.x + up["w"])
        new = State(x, state.t + self.STEP, state.clusters, state.version + 1)
        return new, x, {"stale": False, "u": None, "fresh": False, "staleness": 0}

    def reply(self, state, model):
        return {"model": model, "extras": {"version": state.version}}


class Counts(Base):
    def models(self, state):
        return state.x.unsqueeze(0).expand(state.clusters, -1)


class Forgets(Counts):
    STEP = 0


class Fourfold(Counts):
    STEP = 4


class NoModels(Base):
    pass


class Points:
    """A dataset plug-in without the drift hook: 3 classes around each distribution's own means."""

    Settings = DataConfig

    def __init__(self, settings, seed):
        self.seed = seed
        self.means = numpy_rng(seed, "points").normal(0.0, 3.0, (settings.distributions, 3, 4))
        self.info = DataInfo(input_dim=4, num_outputs=3, task="classification")

    def _draw(self, rng, counts):
        y = [rng.integers(0, 3, int(n)) for n in counts]
        x = np.concatenate([self.means[s, ys] + rng.normal(0, 1, (len(ys), 4)) for s, ys in enumerate(y)])
        comps = np.concatenate([np.full(len(ys), s) for s, ys in enumerate(y)])
        return torch.tensor(x, dtype=torch.float32), torch.from_numpy(np.concatenate(y)), comps

    def client(self, k, n, shares):
        rng = numpy_rng(self.seed, "client", k)
        return self._draw(rng, rng.multinomial(n, shares / shares.sum()))

    def holdout(self, dist):
        counts = np.zeros(len(self.means), dtype=np.int64)
        counts[dist] = 40
        x, y, _ = self._draw(numpy_rng(self.seed, "holdout", dist), counts)
        return x, y


class DriftingPoints(Points):
    def client_cycle(self, k, cycle, n, shares):
        rng = numpy_rng(self.seed, "cycle", k, cycle)
        return self._draw(rng, rng.multinomial(n, rng.dirichlet(np.ones(len(shares)))))
'''


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm")
    write_fmnist(root)
    return root


@pytest.fixture(scope="module")
def plugin_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "contract_plugin.py").write_text(textwrap.dedent(PLUGIN))
    sys.path.insert(0, str(folder))  # one module object for the module's runs (plug-ins resolve once)
    import contract_plugin

    yield contract_plugin
    sys.path.remove(str(folder))


@pytest.fixture
def plugin(plugin_module):
    plugin_module.SEEN.clear()
    return plugin_module


def config(fm, name: str) -> dict:
    cfg = stream_config(fm, name=f"contract_plugin:{name}", rounds=24, eval_every=8)
    for key in ("l_bar", "pretrain_epochs"):  # CCFL's keys
        cfg["algorithm"].pop(key)
    return cfg


@pytest.mark.parametrize("name", ["Forgets", "Fourfold", "Counts"])
def test_the_engine_counts_the_uploads_whatever_the_plugin_does_with_its_t(fm, tmp_path, plugin, name):
    # a server step that left its t alone ran forever; one that added 4 stopped after 6 uploads
    r = raysoft.run(config(fm, name), out=tmp_path)
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert summary["uploads"] == summary["rounds"] == 24 and len(plugin.SEEN) == 24
    m = pd.read_parquet(r.run_dir / "metrics.parquet")
    assert sorted(m[m.metric == "accuracy_before"].step) == list(range(1, 25))
    assert sorted(m[(m.scope == "cluster") & (m.entity == 0)].step.unique()) == [0, 8, 16, 24]
    # every reply says the engine's epoch: a client's tau is the upload count when it was made
    assert all(0 <= tau < t for t, (_, tau, _) in enumerate(plugin.SEEN, start=1))


def test_a_replys_extras_come_back_with_the_clients_next_upload(fm, tmp_path, plugin):
    raysoft.run(config(fm, "Counts"), out=tmp_path)
    last: dict[int, int] = {}  # the version each client's last reply carried
    for version, (client, _, extras) in enumerate(plugin.SEEN, start=1):
        assert extras == {"version": last.get(client, "cold")}  # the cold start's own extras first
        last[client] = version
    assert len(last) == 6


def test_a_missing_stream_hook_is_one_line_at_load_and_leaves_no_run_folder(fm, tmp_path, plugin):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(config(fm, "NoModels")))
    out = tmp_path / "out"
    ran = subprocess.run([RAYSOFT, "run", str(job), "--out", str(out)], capture_output=True, text=True,
                         cwd=Path(plugin.__file__).parent, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1 and "must implement models" in ran.stderr, ran.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("dataset", ["Points", "DriftingPoints"])
def test_ccfl_streams_over_a_dataset_plugin_drifting_where_it_says_how(tmp_path, plugin, dataset):
    # streams refused anything but the built-in image datasets
    cfg = stream_config(tmp_path, eval_every=8, public_samples=10)
    cfg["data"] = {"name": f"contract_plugin:{dataset}", "clients": 6, "distributions": 3, "partition": "random",
                   "samples_min": 20, "samples_max": 30}
    cfg["model"] = {"name": "logistic"}
    r = raysoft.run(cfg, out=tmp_path / "out")
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert summary["uploads"] == 24 and 0.0 <= summary["cli_bfr"] <= 1.0 and 0.0 <= summary["cluster_acc"] <= 1.0
    clients = pd.read_parquet(r.run_dir / "clients.parquet")
    moved = clients.groupby(["client", "distribution"]).share.nunique().max() > 1
    assert moved == (dataset == "DriftingPoints")  # without client_cycle a client keeps its data
    estimation = pd.read_parquet(r.run_dir / "estimation.parquet")
    assert len(estimation) == 3 * (24 - summary["stale_uploads"])  # CCFL estimated on the holdouts' first samples
