"""``raysoft new NAME [--kind algorithm|dataset]``: a new project in one folder, as ``flwr new``
writes one: a plug-in that already runs (importing only :mod:`raysoft.sdk`), its job YAML, a
README with the two commands (run it, test it) and its own tests (pytest).

The algorithm starts as FedAvg with a server step size (``server_lr``; 1 is FedAvg number for
number, which its test checks against the built-in ``fedavg``); the dataset as a mixture of S
linear-regression distributions, run by the built-in FedSoft. Both are real, small and fast, the
places to change are named in their docstrings.
"""

from __future__ import annotations

import keyword
from pathlib import Path

from .errors import ConfigError

KINDS = ("algorithm", "dataset")


def _class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Plugin"


ALGORITHM = '''"""{cls}: a raysoft algorithm plug-in (``algorithm.name: {name}:{cls}``), written by ``raysoft new``.

It starts as FedAvg (H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Aguera y Arcas,
"Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017,
arXiv:1602.05629) with a server step size (S. J. Reddi et al., "Adaptive Federated Optimization",
ICLR 2021, arXiv:2003.00295): each round the server draws ``clients_per_round`` clients uniformly
and sends them the global model w; each trains it on its own data with the ``train`` section's
solver; the server moves w toward the sample-weighted mean of the returned models,
w <- w + server_lr (mean - w). ``server_lr: 1`` is the built-in ``fedavg``, number for number
(trained client by client: ``train.batched_clients: 'off'``); test_{name}.py checks it.

Make it yours: ``round`` is the server half (what is sent, to whom, how the replies combine),
``_train`` / ``_evaluate`` the client half. The contract is raysoft's docs/plugins.md.
This file imports only from ``raysoft.sdk``, the stable surface for plug-ins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from raysoft.sdk import (
    SGD,
    Adam,
    AlgorithmConfig,
    ClientContext,
    ClientCall,
    Configured,
    RoundGenerator,
    RoundResult,
    ServerContext,
    WeightedMean,
    evaluate_vector,
    get_flat,
    numpy_rng,
    scratch_optimizer,
    train_from,
    uniform_selection,
)


class {cls}Config(AlgorithmConfig):
    """{cls}'s settings: AlgorithmConfig's (rounds, clients_per_round, eval_every, ...) and its own."""

    server_lr: float = Field(1.0, gt=0.0, description="server step size: w <- w + server_lr (mean - w); 1 is FedAvg")


@dataclass
class GlobalModel:
    model: torch.Tensor  # [d], the global model w as one flat vector


def _train(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int) -> tuple[Adam | SGD, torch.Tensor]:
    """Client k: train the global model on its own data (the ``train`` section's solver); return it."""
    return opt, train_from(ctx, opt, payload["model"], t)


def _evaluate(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any],
              t: int) -> tuple[Adam | SGD, dict[str, float]]:
    """The global model's metrics on the client's own data."""
    return opt, evaluate_vector(ctx, payload["model"])


class {cls}(Configured[{cls}Config]):
    """FedAvg with a server step size (server_lr = 1: FedAvg)."""

    Settings = {cls}Config
    client_ops = {{"train": _train, "evaluate": _evaluate}}

    def init_server(self, ctx: ServerContext) -> GlobalModel:
        return GlobalModel(get_flat(ctx.new_model("center", 0)))  # the same w^0 as the built-in fedavg

    def init_client(self, ctx: ClientContext) -> Adam | SGD:
        return scratch_optimizer(ctx)  # each client keeps its optimizer's state across rounds

    def round(self, ctx: ServerContext, state: GlobalModel, t: int) -> RoundGenerator:
        selected = uniform_selection(ctx.num_clients, self.settings.clients_per_round,
                                     numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", selected, {{"model": state.model}}, reduce=WeightedMean(ctx.sizes))
        if not res.clients:  # every update excluded: keep w
            return RoundResult(state, trained=0)
        lr = self.settings.server_lr
        model = res.value if lr == 1.0 else state.model + lr * (res.value - state.model)
        return RoundResult(GlobalModel(model), trained=len(res.clients))

    def centers(self, state: GlobalModel) -> torch.Tensor:
        return state.model[None, :]

    def weights(self, state: GlobalModel) -> None:
        return None

    def eval_payload(self, state: GlobalModel) -> dict[str, Any]:
        return {{"model": state.model}}
'''

DATASET = '''"""{cls}: a raysoft dataset plug-in (``data.name: {name}:{cls}``), written by ``raysoft new``.

S distributions of linear regression, y = <x, theta_s> + eps with x ~ N(0, I_d), theta_s ~
N(0, theta_std^2 I_d) and eps ~ N(0, noise_std^2): client k's n samples are drawn from the
distributions in the shares raysoft gives it (``data.partition``), each sample's distribution
recorded; distribution s's holdout set scores the centers. Every draw comes from its own named
random stream (``numpy_rng(seed, "{name}", ...)``), so a client's data is the same wherever it runs.

Make it yours: read your files in ``client`` and ``holdout`` (raysoft's examples/npz_clients reads
one .npz per client). The contract is raysoft's docs/plugins.md.
This file imports only from ``raysoft.sdk``, the stable surface for plug-ins.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from raysoft.sdk import DataConfig, DataInfo, numpy_rng


class {cls}Settings(DataConfig):
    """The ``data`` section: DataConfig's keys (clients, distributions, partition, samples_min/max,
    test_samples) and its own."""

    dim: int = Field(10, ge=1, description="input dimension d")
    theta_std: float = Field(3.0, gt=0.0, description="std of each distribution's true model theta_s")
    noise_std: float = Field(1.0, ge=0.0, description="std of the label noise eps")


class {cls}:
    """S linear-regression distributions; client k's samples drawn in its shares."""

    Settings = {cls}Settings

    def __init__(self, settings: {cls}Settings, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        self.thetas = numpy_rng(seed, "{name}", "theta").normal(
            0.0, settings.theta_std, size=(settings.distributions, settings.dim))
        self.info = DataInfo(input_dim=settings.dim, num_outputs=1, task="regression")

    def _draw(self, rng: np.random.Generator, dist: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = rng.standard_normal((len(dist), self.settings.dim))
        y = np.einsum("nd,nd->n", x, self.thetas[dist]) + self.settings.noise_std * rng.standard_normal(len(dist))
        return torch.from_numpy(x).float(), torch.from_numpy(y).float()

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Client k's (x [n, d], y [n], the distribution of each sample)."""
        rng = numpy_rng(self.seed, "{name}", "client", k)
        dist = rng.choice(len(shares), size=n, p=np.asarray(shares) / np.sum(shares))
        x, y = self._draw(rng, dist)
        return x, y, dist

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution ``dist``'s holdout set (``test_samples`` samples)."""
        rng = numpy_rng(self.seed, "{name}", "holdout", dist)
        return self._draw(rng, np.full(self.settings.test_samples, dist))
'''

ALGORITHM_JOB = '''# {cls} ({name}.py beside this file, imported as {name}:{cls}) on FedSoft's synthetic
# linear-regression mixture, made small: S = 2 distributions, 10:90, N = 20 clients, 10 a round,
# 20 rounds. Run from this folder: raysoft run job.yaml (--set ray.backend=inprocess: without Ray)
seed: 0
algorithm:
  name: {name}:{cls}
  server_lr: 1.0
  rounds: 20
  clients_per_round: 10
  eval_every: 5
data:
  name: synthetic
  clients: 20
  distributions: 2
  partition: "10:90"
  samples_min: 50
  samples_max: 100
  test_samples: 500
model:
  name: linear
train:
  optimizer: sgd
  lr: 0.01
  batch_size: 10
  local_epochs: 2
output:
  dir: runs
  name: {name}
'''

DATASET_JOB = '''# FedSoft on {cls} ({name}.py beside this file, imported as {name}:{cls}): S = 2
# distributions, 10:90, N = 20 clients, 20 rounds. Run from this folder: raysoft run job.yaml
# (--set ray.backend=inprocess: without Ray)
seed: 0
algorithm:
  name: fedsoft
  rounds: 20
  clients_per_round: 5        # per cluster
  eval_every: 5
data:
  name: {name}:{cls}
  clients: 20
  distributions: 2
  partition: "10:90"
  samples_min: 50
  samples_max: 100
  test_samples: 500
  dim: 10
model:
  name: linear
train:
  optimizer: sgd
  lr: 0.01
  batch_size: 10
  local_epochs: 2
output:
  dir: runs
  name: {name}
'''

ALGORITHM_TEST = '''"""{cls}'s tests: it runs, server_lr = 1 is raysoft's FedAvg number for number, a run stopped
at round 3 and resumed ends as an uninterrupted one, and a bad setting is refused in one line."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

import raysoft

HERE = Path(__file__).resolve().parent
QUICK = ["ray.backend=inprocess", "output.progress=none", "train.batched_clients=off", "algorithm.rounds=6",
         "algorithm.eval_every=2"]


@pytest.fixture(autouse=True)
def _here(monkeypatch):
    monkeypatch.chdir(HERE)  # {name}:{cls} is imported from this folder


def _metrics(run_dir):
    return pd.read_parquet(Path(run_dir) / "metrics.parquet").drop(columns=["run_id", "time_s", "algorithm"])


def test_it_runs_and_is_fedavg_at_server_lr_1(tmp_path):
    mine = raysoft.run(raysoft.load_config("job.yaml", QUICK), out=tmp_path)
    fedavg = raysoft.run(raysoft.load_config("job.yaml", [*QUICK, "algorithm.name=fedavg"]), out=tmp_path)
    pd.testing.assert_frame_equal(_metrics(mine.run_dir), _metrics(fedavg.run_dir))
    half = raysoft.run(raysoft.load_config("job.yaml", [*QUICK, "algorithm.server_lr=0.5"]), out=tmp_path)
    assert not _metrics(half.run_dir)["value"].equals(_metrics(mine.run_dir)["value"])


def test_a_stopped_run_resumes_to_the_same_numbers(tmp_path):
    whole = raysoft.run(raysoft.load_config("job.yaml", QUICK), out=tmp_path)
    stop = [*QUICK, "output.checkpoint_every=2", "faults=[{{kind: nan_update, at_round: 3, client: 0}}]",
            "algorithm.clients_per_round=20"]
    cfg = raysoft.load_config("job.yaml", stop)
    with pytest.raises(raysoft.RaysoftError):
        raysoft.run(cfg, out=tmp_path, dir_name="stopped")
    stopped = tmp_path / "stopped"
    saved = yaml.safe_load((stopped / "config.yaml").read_text())
    (stopped / "config.yaml").write_text(yaml.safe_dump({{**saved, "faults": []}}))  # the cause put right
    again = raysoft.run(raysoft.load_config("job.yaml", [*QUICK, "algorithm.clients_per_round=20"]), out=tmp_path)
    raysoft.resume(stopped)
    pd.testing.assert_frame_equal(_metrics(stopped), _metrics(again.run_dir))
    assert (Path(whole.run_dir) / "summary.json").is_file()


def test_a_bad_setting_is_refused():
    with pytest.raises(raysoft.ConfigError, match="server_lr"):
        raysoft.load_config("job.yaml", ["algorithm.server_lr=0"])
'''

DATASET_TEST = '''"""{cls}'s tests: its clients hold the shares they are given, the same seed gives the same data,
FedSoft runs on it and its centers learn, a run stopped at round 3 and resumed ends as an
uninterrupted one."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import raysoft
from {name} import {cls}, {cls}Settings

HERE = Path(__file__).resolve().parent
QUICK = ["ray.backend=inprocess", "output.progress=none", "algorithm.rounds=6", "algorithm.eval_every=2"]


@pytest.fixture(autouse=True)
def _here(monkeypatch):
    monkeypatch.chdir(HERE)  # {name}:{cls} is imported from this folder


def test_clients_hold_their_shares_and_the_seed_fixes_the_data():
    settings = {cls}Settings(name="{name}:{cls}", clients=4, distributions=2, partition="10:90")
    x, y, dist = {cls}(settings, seed=0).client(1, 2000, np.array([0.1, 0.9]))
    assert x.shape == (2000, settings.dim) and y.shape == (2000,)
    assert abs(np.mean(dist == 1) - 0.9) < 0.03
    x2, _, _ = {cls}(settings, seed=0).client(1, 2000, np.array([0.1, 0.9]))
    assert bool((x == x2).all())
    hx, hy = {cls}(settings, seed=0).holdout(0)
    assert len(hx) == len(hy) == settings.test_samples


def _metrics(run_dir):
    return pd.read_parquet(Path(run_dir) / "metrics.parquet").drop(columns=["run_id", "time_s"])


def test_fedsoft_learns_on_it(tmp_path):
    run = raysoft.run(raysoft.load_config("job.yaml", QUICK), out=tmp_path)
    m = _metrics(run.run_dir)
    centers = m[(m.scope == "cluster") & (m.metric == "mse")]
    first, last = centers.step.min(), centers.step.max()
    assert centers[centers.step == last].value.min() < centers[centers.step == first].value.min()


def test_a_stopped_run_resumes_to_the_same_numbers(tmp_path):
    stop = [*QUICK, "output.checkpoint_every=2", "faults=[{{kind: nan_update, at_round: 3, client: 0}}]",
            "algorithm.clients_per_round=20"]
    with pytest.raises(raysoft.RaysoftError):
        raysoft.run(raysoft.load_config("job.yaml", stop), out=tmp_path, dir_name="stopped")
    stopped = tmp_path / "stopped"
    saved = yaml.safe_load((stopped / "config.yaml").read_text())
    (stopped / "config.yaml").write_text(yaml.safe_dump({{**saved, "faults": []}}))  # the cause put right
    again = raysoft.run(raysoft.load_config("job.yaml", [*QUICK, "algorithm.clients_per_round=20"]), out=tmp_path)
    raysoft.resume(stopped)
    pd.testing.assert_frame_equal(_metrics(stopped), _metrics(again.run_dir))
'''

README = '''# {name}

A raysoft {kind} plug-in, written by `raysoft new {name}{kind_flag}`: `{name}.py` ({what}),
`job.yaml` (the experiment that runs it) and `test_{name}.py` (its tests). raysoft imports
`{name}:{cls}` from the folder a run starts in, and on Ray ships the file to the actors.

From this folder:

    raysoft run job.yaml                  # on a local Ray (add --set ray.backend=inprocess: without Ray)
    python -m pytest test_{name}.py       # its tests (in-process, seconds)

`raysoft run` prints the run directory as its last line; `raysoft report DIR` draws its figures.
Change `{name}.py` (its docstring says where), keep the tests passing, add your own.
'''


def new_project(name: str, kind: str = "algorithm", out: str | Path | None = None) -> Path:
    """Write project ``name`` (a Python module name) into ``out`` (default ``./NAME``); refused if
    the folder exists."""
    if not name.isidentifier() or keyword.iskeyword(name) or name in ("raysoft", "test"):
        raise ConfigError(f"new: {name!r} is not usable as a Python module name (letters, digits and _, "
                          "not starting with a digit)")
    if kind not in KINDS:
        raise ConfigError(f"new: --kind must be one of {', '.join(KINDS)} (got {kind!r})")
    target = Path(out) if out is not None else Path(name)
    if target.exists():
        raise ConfigError(f"new: {str(target)!r} already exists")
    cls = _class_name(name)
    fill = {"name": name, "cls": cls, "kind": kind, "kind_flag": "" if kind == "algorithm" else " --kind dataset",
            "what": "FedAvg with a server step size, to make yours" if kind == "algorithm"
            else "S linear-regression distributions, to make yours"}
    files = {
        f"{name}.py": ALGORITHM if kind == "algorithm" else DATASET,
        "job.yaml": ALGORITHM_JOB if kind == "algorithm" else DATASET_JOB,
        f"test_{name}.py": ALGORITHM_TEST if kind == "algorithm" else DATASET_TEST,
        "README.md": README,
    }
    target.mkdir(parents=True)
    for fname, template in files.items():
        (target / fname).write_text(template.format(**fill))
    return target


__all__ = ["KINDS", "new_project"]
