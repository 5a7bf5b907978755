"""W1 (FedSoft) and W2 (FedAvg) in pfl's simulation: the pfl side of the seconds-per-round benchmark.

A standalone script for the pfl venv (see ``raysoft/bench/pfl_env.py``): it imports only the
standard library, numpy, torch and pfl (0.6.0, Apple's pfl-research), never ``raysoft``.

    <pfl-venv>/bin/python raysoft/bench/pfl_bench.py --data W2.npz --out result.json [--workers 2]

The ``.npz`` is written by raysoft's bare loop (``bare_fedavg`` / ``bare_fedsoft`` in
``raysoft/bench/bare.py``); ``algorithm`` says which:

* ``fedavg`` (W2): as for Flower (``raysoft/bench/flower.py``): the clients' data (``x_<k>``,
  ``y_<k>``, ``num_clients``), every round's clients (``selection`` [rounds, K]), the initial
  CNN (``init_<i>`` in ``model.parameters()`` order), a test set (``x_test``, ``y_test``), the
  hyperparameters (``lr``, ``momentum``, ``batch_size``, ``local_epochs``, ``seed``,
  ``channels``, ``hidden``, ``classes``), and ``shuffle`` and ``shuffle_entropy``.
* ``fedsoft`` (W1): the clients' data (``x_<k>`` [n_k, d], ``y_<k>`` [n_k]), ``sizes``, the
  initial centers (``center_<s>``) and the clients' initial model (``client_init``) as flat
  vectors of the bias-free ``Linear(dim, 1)``, a holdout set per distribution
  (``x_test_<s>``, ``y_test_<s>``), ``num_clients``, ``num_centers``, ``num_distributions``,
  ``dim``, ``rounds``, ``clients_per_round`` (K per center), ``estimation_interval`` (tau),
  ``sigma``, ``prox_weight`` (lambda), ``lr`` (Adam), ``batch_size``, ``local_epochs``, ``seed``,
  ``select_entropy`` and ``shuffle_entropy``.

Random streams: client k's batch order in round t comes from
``np.random.default_rng(SeedSequence([*shuffle_entropy, k, t]))`` (a fresh permutation per
epoch), and W1's selection of round t from ``SeedSequence([*select_entropy, t])``: the streams
the bare loop draws from, so both run the same local steps on the same batches.

How pfl is used. Each client is a pfl user: a ``FederatedDataset`` whose user sampler names the
users of the next cohort, a ``Dataset`` per user (reshuffled at each epoch from the stream
above), a ``PyTorchModel``, a ``SimulatedBackend`` that runs the cohort through the algorithm's
``simulate_one_user`` and sums the users' statistics (all-reduced over the workers), and
``FederatedAlgorithm.run`` driving the central iterations.

* W2 is pfl's own ``FederatedAveraging`` with the ``WeightByDatapoints`` postprocessor (so the
  mean is weighted by n_k, as FedAvg's) and a central ``SGD(lr=1)`` applying the mean update,
  local ``SGD`` (lr, momentum) from ``PyTorchModel.do_multiple_epochs_of``. One change:
  pfl's ``FederatedNNAlgorithm`` evaluates every user of the cohort before and after its local
  training when ``iteration % evaluation_frequency == 0``, which is always true of iteration 0;
  the other systems evaluate no user, so the subclass here turns that off (the test accuracy is
  computed once, after the last round). The users of a round come from ``selection``: the
  sampler walks ``(client, round)`` pairs in that order and ``user_id_to_weight`` (n_k) lets
  pfl balance each cohort over the workers, as its docs advise for users of unequal sizes.
* W1's FedSoft is written here as a pfl algorithm (``FedSoft``, a ``FederatedAlgorithm``, the
  base pfl documents for custom algorithms; pfl has no FedSoft). The server (the algorithm
  object) keeps the S centers, the importance weights u [N, S] and the selection; the users
  do the rest. A FedSoft round is one or two central iterations of pfl: every tau-th round
  first an *estimation* iteration over all N users (each user counts n_ks, its samples whose
  lowest-loss center is s, and sends them as a row of an [N, S] statistic; the server sets
  u_ks = max(n_ks / n_k, sigma)), then a *training* iteration over the union of the clients
  each center drew (K per center, without replacement, with the probabilities of eq. (6),
  v_sk = u_ks n_k / sum_k' u_k's n_k'). A training user continues its own local model with its
  own Adam state (kept between rounds in pfl's ``DiskUserStateStorage``, which pfl documents for
  stateful users in multi-process simulations on one machine), minimising its MSE plus
  lambda/2 sum_s u_ks ||w - c_s||^2 through ``do_multiple_epochs_of`` with a train step like
  pfl's FedProx one, and sends its model into the sum of each center that selected it; the
  server's c_s is the mean of those (a center no client drew keeps its value).

  Where it differs from raysoft's bare loop: nowhere in the maths. The counts n_ks travel
  instead of u_k because pfl's all-reduce carries float32 and the counts are integers (exact),
  so the server's u is the bare loop's float64 u to the bit; the centers are sums in float32
  over the users (of each worker, then across workers) where the bare loop stacks and averages,
  so they agree to float32 rounding, which can grow over the rounds (and, in principle, move a
  sample whose two center losses nearly tie to the other center). Estimating is a central
  iteration of its own (pfl has one cohort query per context, and the training cohort depends
  on the estimate); both are timed as the one FedSoft round they make.

Workers: pfl's way to speed a simulation up is its distributed mode ("Fast distributed
simulations" in its docs): the users of a cohort are sharded over worker processes, each a
``torch.distributed`` (gloo) rank, whose sums are all-reduced, and the guide advises adding
processes per device until the speed-up stops. This machine has 2 cores and no GPU, so
``--workers 2`` (the default) runs two single-threaded ranks, one per core (``--workers 1``:
one rank with 2 torch threads). pfl's docs name two launchers: ``torchrun`` (preferred for
PyTorch) and the ``PFL_WORKER_ADDRESSES``/``PFL_WORKER_RANK`` environment variables. This
script uses the variables: run as above it is a launcher (standard library only) that starts
the ranks itself on 127.0.0.1 and a free port, so no torchrun agent (a further process that
imports torch only to wait: 0.5 GB PSS here) counts in pfl's memory; the ranks and what they
do are the same. Rank 0 writes the result. A rank that fails takes the others down (they
would wait in the all-reduce).

Timing: a round's seconds run from the end of the previous round (or the start of training) to
the end of the algorithm's central update of this round, as pfl's ``StopwatchCallback`` laps
its central iterations (rank 0's clock; the all-reduce makes the ranks finish together).
``total_s`` is the launcher's wall clock from starting the ranks to their exit (start-up,
loading the data, all rounds, the final evaluation). Memory is measured from outside, by
``raysoft bench``, over the launcher and all its descendants.

Output: a JSON file (``--out``) and its path as the last line of stdout; any failure exits 1
with a one-line error as the last line of stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder (raysoft/bench, modules for raysoft's interpreter, not this
# venv's) comes first on sys.path, where a module of it could shadow one pfl imports.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

NAME = "bench/pfl_bench.py"
RANK_FLAG = "--rank-process"  # set by the launcher on the ranks it starts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, type=Path, help="the benchmark's .npz (from raysoft's bare loop)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the result JSON")
    parser.add_argument("--workers", type=int, default=2, help="pfl worker processes (ranks); default 2, one per core")
    parser.add_argument(RANK_FLAG, dest="state_dir", type=Path, help=argparse.SUPPRESS)
    return parser


class RankFailed(Exception):
    """A rank's own one-line error, passed on by the launcher."""


def _one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, RankFailed) else f"{type(exc).__name__}: {exc}"
    return text.replace("\n", " ").strip()


# --------------------------------------------------------------------------------------------
# the launcher (standard library only: it holds no torch while the ranks run)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _descendants(pids: list[int]) -> list[int]:
    """The processes below ``pids`` (Linux /proc; elsewhere none)."""
    kids: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        kids.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry))
    out, todo = [], list(pids)
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _end(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still there after ``grace``, and
    to what they started and left behind (pfl's cohort sampler runs in a subprocess of a rank,
    which a rank stopped in the middle of an all-reduce may leave)."""
    below = _descendants([p.pid for p in procs if p.poll() is None])
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass


def launch(args: argparse.Namespace) -> int:
    """Start ``--workers`` ranks of this script, wait for them, finish rank 0's JSON."""
    if args.workers < 1:
        raise ValueError("--workers must be at least 1")
    if not args.data.is_file():
        raise FileNotFoundError(f"no data file {args.data}")
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # rank 0 writes it afresh
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="raysoft-pfl-") as scratch_dir:
        scratch = Path(scratch_dir)
        # pfl makes the ranks a torch.distributed group at tcp://<the first address>; the
        # others only count the ranks
        port = _free_port()
        addresses = ",".join(f"127.0.0.1:{port + r}" for r in range(args.workers))
        procs: list[subprocess.Popen] = []
        logs = [scratch / f"rank{r}.err" for r in range(args.workers)]
        try:
            for r in range(args.workers):
                env = dict(os.environ, PFL_PYTORCH_DEVICE="cpu")
                if args.workers > 1:
                    env.update(PFL_WORKER_ADDRESSES=addresses, PFL_WORKER_RANK=str(r))
                else:
                    env.pop("PFL_WORKER_ADDRESSES", None)
                    env.pop("PFL_WORKER_RANK", None)
                cmd = [sys.executable, str(Path(__file__).resolve()), "--data", str(args.data.resolve()),
                       "--out", str(out), "--workers", str(args.workers), RANK_FLAG, str(scratch)]
                with open(logs[r], "w") as err:
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env))
            failed = None
            while any(p.poll() is None for p in procs):
                failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
                if failed is not None:
                    break
                time.sleep(0.1)
            if failed is None:
                failed = next((r for r, p in enumerate(procs) if p.returncode != 0), None)
        finally:
            _end(procs)
        if failed is not None:
            line = _last_line(logs[failed]) or f"exit {procs[failed].returncode}"
            prefix = f"{NAME}: error: "
            raise RankFailed(f"rank {failed}: {line[len(prefix):] if line.startswith(prefix) else line}")
    result = json.loads(out.read_text())
    result["total_s"] = time.perf_counter() - t0
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def _on_sigterm(signum, frame):  # end the ranks as on Ctrl-C rather than die at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        launch(args)
    except BaseException as exc:  # one line on stderr for any failure
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        sys.stdout.flush()
        msg = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else _one_line(exc)
        print(f"{NAME}: error: {msg}", file=sys.stderr, flush=True)
        return 1
    print(args.out.resolve(), flush=True)
    return 0


if __name__ == "__main__" and RANK_FLAG not in sys.argv[1:]:
    sys.exit(main())  # the launcher ends here, before the imports of the ranks below


# --------------------------------------------------------------------------------------------
# a rank: numpy, torch and pfl

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.aggregate.weighting import WeightByDatapoints  # noqa: E402
from pfl.algorithm import FederatedAlgorithm, FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.common_types import Population  # noqa: E402
from pfl.context import CentralContext  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import MinimizeReuseUserSampler  # noqa: E402
from pfl.data.user_state import DiskUserStateStorage  # noqa: E402
from pfl.exception import UserNotFoundError  # noqa: E402
from pfl.hyperparam import AlgorithmHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.internal.bridge.pytorch.utils import clip_norm_and_update  # noqa: E402
from pfl.internal.ops.selector import get_default_framework_module as get_ops  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402
from pfl.stats import MappedVectorStatistics  # noqa: E402
from torch import nn  # noqa: E402


def _scalar(data, key: str):
    if key not in data.files:
        raise ValueError(f"the data file has no {key!r}")
    return np.asarray(data[key]).item()


def _stream(entropy: np.ndarray, *parts: int) -> np.random.Generator:
    """The bare loop's stream (its prefix ``entropy``, then ``parts``)."""
    return np.random.default_rng(np.random.SeedSequence([*(int(e) for e in entropy), *(int(p) for p in parts)]))


class EpochShuffled(Dataset):
    """A user's data whose every pass (epoch) is a new permutation from the user's stream of
    this round, batch by batch as the bare loop slices it (``shuffle`` off: the data's order)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, user_id: str, rng: np.random.Generator | None):
        super().__init__((x, y), user_id=user_id)
        self._rng = rng

    def iter(self, batch_size):  # pfl's name
        x, y = self.raw_data
        if batch_size is None:
            yield [x, y]
            return
        n = len(y)
        order = self._rng.permutation(n) if self._rng is not None else np.arange(n)
        for i in range(0, n, batch_size):
            idx = torch.from_numpy(order[i:i + batch_size])
            yield [x[idx], y[idx]]


class RoundClock(TrainingProcessCallback):
    """Laps of pfl's central iterations (as its StopwatchCallback takes them)."""

    def __init__(self) -> None:
        self.laps: list[float] = []
        self._t = time.perf_counter()

    def on_train_begin(self, *, model) -> Metrics:
        self._t = time.perf_counter()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        now = time.perf_counter()
        self.laps.append(now - self._t)
        self._t = now
        return False, Metrics()


def _write(out: Path, result: dict) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)


def _base_result(algorithm: str, laps: list[float], clients_per_round: list[int], quality: float, metric: str) -> dict:
    import importlib.metadata

    return {
        "system": "pfl", "algorithm": algorithm,
        "pfl_version": importlib.metadata.version("pfl"), "torch_version": torch.__version__,
        "workers": int(get_ops().distributed.world_size),
        "sec_per_round": [float(t) for t in laps],
        "clients_per_round": clients_per_round if len(set(clients_per_round)) > 1 else int(clients_per_round[0]),
        "updates": [int(c) for c in clients_per_round],
        "rounds": len(laps), "quality": float(quality), "quality_metric": metric,
    }


# --------------------------------------------------------------------------------------------
# W2: FedAvg, the CNN


class PflModule(nn.Module):
    """A torch network with the ``loss`` and ``metrics`` pfl's PyTorchModel calls: cross-entropy
    (and accuracy) for a classifier, mean squared error for a regression."""

    def __init__(self, net: nn.Module, classify: bool) -> None:
        super().__init__()
        self.net, self.classify = net, classify

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss(self, out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return (F.cross_entropy if self.classify else F.mse_loss)(out, y, reduction=reduction)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.train()
        return self._loss(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        self.eval()
        out = self(x)
        n = len(y)
        found = {"loss": Weighted(float(self._loss(out, y, reduction="sum")), n)}
        if self.classify:
            found["accuracy"] = Weighted(float((out.argmax(1) == y).sum()), n)
        return found


def cnn(channels: tuple[int, ...], hidden: int, classes: int) -> PflModule:
    """conv5x5(c1)-ReLU-maxpool2, conv5x5(c2)-ReLU-maxpool2, Linear(c2*7*7, hidden)-ReLU,
    Linear(hidden, classes), for 1x28x28 inputs (raysoft's ``cnn``)."""
    c1, c2 = int(channels[0]), int(channels[1])
    return PflModule(nn.Sequential(
        nn.Conv2d(1, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    ), classify=True)


class FedAvgNoUserEval(FederatedAveraging):
    """pfl's FederatedAveraging without its evaluation of each user before and after local
    training (which iteration 0 always does): the other systems evaluate no user."""

    def get_next_central_contexts(self, model, iteration, algorithm_params, model_train_params,
                                  model_eval_params=None):
        contexts, model, metrics = super().get_next_central_contexts(
            model, iteration, algorithm_params, model_train_params, model_eval_params)
        if contexts is not None:
            contexts = tuple(dataclasses.replace(c, do_evaluation=False) for c in contexts)
        return contexts, model, metrics


def run_fedavg(data, out: Path) -> dict:
    num_clients = int(_scalar(data, "num_clients"))
    selection = np.asarray(data["selection"]).astype(np.int64)
    if selection.ndim != 2 or selection.min() < 0 or selection.max() >= num_clients:
        raise ValueError(f"selection must be [rounds, K] of clients 0..{num_clients - 1}")
    rounds, k = selection.shape
    if k < get_ops().distributed.world_size:
        raise ValueError(f"{k} clients a round cannot keep {get_ops().distributed.world_size} workers busy")
    xs, ys = [], []
    for c in range(num_clients):
        y = torch.from_numpy(np.asarray(data[f"y_{c}"], dtype=np.int64).ravel())
        xs.append(torch.from_numpy(np.asarray(data[f"x_{c}"], dtype=np.float32).reshape(len(y), 1, 28, 28)))
        ys.append(y)
    shuffle = bool(_scalar(data, "shuffle"))
    entropy = np.asarray(data["shuffle_entropy"])
    y_test = torch.from_numpy(np.asarray(data["y_test"], dtype=np.int64).ravel())
    x_test = torch.from_numpy(np.asarray(data["x_test"], dtype=np.float32).reshape(len(y_test), 1, 28, 28))
    channels = tuple(int(c) for c in np.asarray(data["channels"]).ravel())
    module = cnn(channels, int(_scalar(data, "hidden")), int(_scalar(data, "classes")))
    params = list(module.parameters())
    with torch.no_grad():
        for i, p in enumerate(params):
            a = np.asarray(data[f"init_{i}"], dtype=np.float32)
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"init_{i} has shape {tuple(a.shape)}, the model's parameter {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))
    if f"init_{len(params)}" in data.files:
        raise ValueError(f"the data file has more init_<i> arrays than the model's {len(params)} parameters")

    lr, momentum = float(_scalar(data, "lr")), float(_scalar(data, "momentum"))

    def sgd(parameters, lr):
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)

    model = PyTorchModel(module, local_optimizer_create=sgd,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))

    def make_dataset(user):  # user: (client, round)
        c, t = user
        return EpochShuffled(xs[c], ys[c], str(c), _stream(entropy, c, t) if shuffle else None)

    users = [(int(c), t) for t, row in enumerate(selection) for c in row]
    fed = FederatedDataset(make_dataset, MinimizeReuseUserSampler(users),
                           user_id_to_weight={u: len(ys[u[0]]) for u in users})
    backend = SimulatedBackend(training_data=fed, val_data=fed, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                                         train_cohort_size=k, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_batch_size=int(_scalar(data, "batch_size")),
                                      local_num_epochs=int(_scalar(data, "local_epochs")), local_learning_rate=lr)
    clock = RoundClock()
    model = FedAvgNoUserEval().run(algorithm_params, backend, model, train_params, callbacks=[clock],
                                   send_metrics_to_platform=False)
    if len(clock.laps) != rounds:
        raise RuntimeError(f"{len(clock.laps)} of {rounds} rounds were timed")
    # the module's own metrics (summed loss and correct count) over the test set, 1000 at a time
    chunks = [module.metrics(x_test[i:i + 1000], y_test[i:i + 1000]) for i in range(0, len(y_test), 1000)]
    correct = sum(c["accuracy"].weighted_value for c in chunks)
    result = _base_result("fedavg", clock.laps, [k] * rounds, correct / max(len(y_test), 1), "accuracy")
    result["accuracy"] = result["quality"]
    # the test set's mean cross-entropy
    result["test_loss"] = sum(c["loss"].weighted_value for c in chunks) / max(len(y_test), 1)
    return result


# --------------------------------------------------------------------------------------------
# W1: FedSoft, linear regression


def linear_regression(dim: int) -> PflModule:
    """y = <x, w>: Linear(d -> 1) without bias (raysoft's ``linear``)."""
    return PflModule(nn.Sequential(nn.Linear(dim, 1, bias=False), nn.Flatten(0)), classify=False)


class CohortSampler:
    """pfl's user sampler for cohorts the algorithm picks: each call names the next user of the
    cohort last set (pfl's distributed sampler gives rank r the users r, r + W, ...)."""

    def __init__(self) -> None:
        self.cohort: list = []
        self._pos = 0

    def set(self, cohort: list) -> None:
        self.cohort, self._pos = list(cohort), 0

    def __call__(self):
        user = self.cohort[self._pos % len(self.cohort)]
        self._pos += 1
        return user


def selection_probabilities(u: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Equation (6): v_sk = u_ks n_k / sum_k' u_k's n_k'; [S, N]. A zero column gives 1/N."""
    mass = np.asarray(u, dtype=np.float64).T * np.asarray(sizes, dtype=np.float64)[None, :]
    totals = mass.sum(axis=1, keepdims=True)
    return np.where(totals > 0, mass / np.where(totals > 0, totals, 1.0), 1.0 / mass.shape[1])


def select_clients(v: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each center s, K clients drawn without replacement with probabilities v[s] (all of
    those with a positive probability when fewer), sorted."""
    out = []
    for probs in v:
        size = min(k, int((probs > 0).sum()))
        out.append(np.sort(rng.choice(len(probs), size=size, replace=False, p=probs / probs.sum())))
    return out


def _fedsoft_step(pytorch_model, local_optimizer, raw_data, train_kwargs, train_step_args, *,
                  centers, u, lam, carry):
    """One local step of FedSoft's client: MSE plus lambda/2 sum_s u_ks ||w - c_s||^2 (the
    shape of pfl's FedProx step), on the user's own Adam state."""
    if carry.get("optimizer") is not local_optimizer:  # the first step: restore the user's Adam
        carry["optimizer"] = local_optimizer
        if carry.get("state") is not None:
            local_optimizer.load_state_dict(carry["state"])
    w = torch.cat([p.reshape(-1) for p in pytorch_model.parameters()])
    prox = 0.5 * lam * (u * ((w[None, :] - centers) ** 2).sum(dim=1)).sum()
    loss = pytorch_model.loss(*raw_data, **train_kwargs) + prox
    loss.backward()
    train_step_args.grad_accumulation_state.increment()
    clip_norm_and_update(pytorch_model, local_optimizer, train_step_args)


@dataclasses.dataclass(frozen=True)
class FedSoftParams(AlgorithmHyperParams):
    """What a central iteration of FedSoft asks of its users: ``estimate`` (count n_ks) or
    ``train`` (proximal local training), in FedSoft round ``round``."""

    phase: str
    round: int


class FedSoft(FederatedAlgorithm):
    """FedSoft (Ruan and Joe-Wong, AAAI'22, Algorithm 1) as a pfl algorithm: the server keeps the
    centers, the importance weights and the selection; ``simulate_one_user`` is the client."""

    def __init__(self, spec: dict, sampler: CohortSampler, storage: DiskUserStateStorage, model: PyTorchModel):
        super().__init__()
        self.spec, self.sampler, self.storage = spec, sampler, storage
        self.N, self.S = spec["num_clients"], spec["num_centers"]
        self.centers = torch.stack([torch.from_numpy(c) for c in spec["centers"]])  # [S, D]
        self.u = np.full((self.N, self.S), 1.0 / self.S)
        self.selected: list[np.ndarray] = []
        self.round, self._estimated = 0, -1
        self.round_of_iteration: list[int] = []  # the FedSoft round of each central iteration
        self.trained_per_round: list[int] = []
        # the model's variables, to move flat vectors in and out of pfl's PyTorchModel
        self._names = list(model.variable_map)
        self._shapes = [tuple(v.shape) for v in model.variable_map.values()]

    def _params(self, vector: torch.Tensor) -> dict:
        out, i = {}, 0
        for name, shape in zip(self._names, self._shapes):
            n = int(np.prod(shape))
            out[name] = vector[i:i + n].reshape(shape)
            i += n
        return out

    def get_next_central_contexts(self, model, iteration, algorithm_params, model_train_params,
                                  model_eval_params=None):
        spec, t = self.spec, self.round
        if t == spec["rounds"]:
            return None, model, Metrics()
        if t % spec["estimation_interval"] == 0 and self._estimated != t:
            phase, cohort = "estimate", list(range(self.N))
        else:
            phase = "train"
            v = selection_probabilities(self.u, spec["sizes"])
            self.selected = select_clients(v, spec["clients_per_round"], _stream(spec["select_entropy"], t))
            cohort = sorted({int(c) for sel in self.selected for c in sel})
        if len(cohort) < get_ops().distributed.world_size:
            raise RuntimeError(f"round {t}: {len(cohort)} users cannot keep "
                               f"{get_ops().distributed.world_size} workers busy")
        self.sampler.set([(c, t) for c in cohort])
        self.round_of_iteration.append(t)
        context = CentralContext(current_central_iteration=iteration, do_evaluation=False, cohort_size=len(cohort),
                                 population=Population.TRAIN, algorithm_params=FedSoftParams(phase=phase, round=t),
                                 model_train_params=model_train_params.static_clone(), model_eval_params=None,
                                 seed=self._get_seed())
        return (context,), model, Metrics()

    def simulate_one_user(self, model, user_dataset, central_context):
        k = int(user_dataset.user_id)
        x, y = user_dataset.raw_data
        module = model.pytorch_model
        if central_context.algorithm_params.phase == "estimate":
            # n_ks: the samples whose lowest-loss center is s (ties to the lowest s)
            with torch.no_grad():
                losses = []
                for s in range(self.S):
                    model.set_parameters(self._params(self.centers[s]))
                    losses.append(((module(x) - y) ** 2).numpy())
            counts = np.bincount(np.stack(losses).argmin(axis=0), minlength=self.S)
            row = torch.zeros(self.N, self.S)
            row[k] = torch.from_numpy(counts.astype(np.float32))
            return MappedVectorStatistics({"counts": row}), Metrics()
        try:
            state = self.storage.load_state(str(k), "fedsoft")
        except UserNotFoundError:  # its first training: the clients' initial model, a fresh Adam
            state = {"w": self.spec["client_init"], "adam": None}
        model.set_parameters(self._params(state["w"]))
        carry = {"state": state["adam"]}
        u = torch.as_tensor(self.u[k], dtype=torch.float32)
        model.do_multiple_epochs_of(user_dataset, central_context.model_train_params, _fedsoft_step,
                                    centers=self.centers, u=u, lam=self.spec["prox_weight"], carry=carry)
        w = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()
        self.storage.save_state({"w": w, "adam": carry["optimizer"].state_dict()}, str(k), "fedsoft")
        zero = torch.zeros_like(w)
        return MappedVectorStatistics({f"center_{s}": (w if k in set(sel.tolist()) else zero)
                                       for s, sel in enumerate(self.selected)}), Metrics()

    def process_aggregated_statistics(self, central_context, aggregate_metrics, model, statistics):
        if central_context.algorithm_params.phase == "estimate":
            counts = statistics["counts"].double().numpy()
            if not np.array_equal(counts.sum(axis=1), self.spec["lengths"]):
                raise RuntimeError(f"round {self.round}: the estimation missed users")
            self.u = np.maximum(counts / self.spec["lengths"][:, None], self.spec["sigma"])
            self._estimated = self.round
            return model, Metrics()
        self.centers = torch.stack([statistics[f"center_{s}"] / len(sel) if len(sel) else self.centers[s]
                                    for s, sel in enumerate(self.selected)])
        self.trained_per_round.append(len({int(c) for sel in self.selected for c in sel}))
        self.round += 1
        return model, Metrics()


def load_fedsoft(data) -> dict:
    spec: dict[str, Any] = {key: int(_scalar(data, key)) for key in (
        "num_clients", "num_centers", "num_distributions", "dim", "rounds", "clients_per_round",
        "estimation_interval", "batch_size", "local_epochs", "seed")}
    spec.update({key: float(_scalar(data, key)) for key in ("sigma", "prox_weight", "lr")})
    n, d = spec["num_clients"], spec["dim"]
    spec["xs"] = [torch.from_numpy(np.asarray(data[f"x_{k}"], dtype=np.float32).reshape(-1, d)) for k in range(n)]
    spec["ys"] = [torch.from_numpy(np.asarray(data[f"y_{k}"], dtype=np.float32).ravel()) for k in range(n)]
    spec["lengths"] = np.array([len(y) for y in spec["ys"]], dtype=np.float64)
    spec["sizes"] = np.asarray(data["sizes"], dtype=np.int64)
    spec["centers"] = [np.asarray(data[f"center_{s}"], dtype=np.float32).ravel() for s in range(spec["num_centers"])]
    spec["client_init"] = torch.from_numpy(np.asarray(data["client_init"], dtype=np.float32).ravel())
    spec["tests"] = [(torch.from_numpy(np.asarray(data[f"x_test_{s}"], dtype=np.float32).reshape(-1, d)),
                      torch.from_numpy(np.asarray(data[f"y_test_{s}"], dtype=np.float32).ravel()))
                     for s in range(spec["num_distributions"])]
    spec["select_entropy"] = np.asarray(data["select_entropy"])
    spec["shuffle_entropy"] = np.asarray(data["shuffle_entropy"])
    if len(spec["sizes"]) != n or any(c.shape != (d,) for c in spec["centers"]) or spec["client_init"].shape != (d,):
        raise ValueError("sizes, center_<s> or client_init do not fit num_clients and dim")
    return spec


def run_fedsoft(data, out: Path, state_dir: Path) -> dict:
    spec = load_fedsoft(data)
    module = linear_regression(spec["dim"])
    model = PyTorchModel(module, local_optimizer_create=torch.optim.Adam,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    sampler = CohortSampler()
    entropy = spec["shuffle_entropy"]

    def make_dataset(user):  # user: (client, round)
        k, t = user
        return EpochShuffled(spec["xs"][k], spec["ys"][k], str(k), _stream(entropy, k, t))

    fed = FederatedDataset(make_dataset, sampler)
    backend = SimulatedBackend(training_data=fed, val_data=fed)
    storage = DiskUserStateStorage(str(state_dir / "users"))
    algorithm = FedSoft(spec, sampler, storage, model)
    train_params = NNTrainHyperParams(local_batch_size=spec["batch_size"], local_num_epochs=spec["local_epochs"],
                                      local_learning_rate=spec["lr"])
    clock = RoundClock()
    algorithm.run(FedSoftParams(phase="", round=0), backend, model, train_params, callbacks=[clock],
                  send_metrics_to_platform=False)
    rounds = spec["rounds"]
    if algorithm.round != rounds or len(clock.laps) != len(algorithm.round_of_iteration):
        raise RuntimeError(f"{algorithm.round} of {rounds} rounds ran")
    laps = [0.0] * rounds  # a FedSoft round: its estimation (if any) and training iterations
    for t, lap in zip(algorithm.round_of_iteration, clock.laps):
        laps[t] += lap
    with torch.no_grad():  # per distribution, the best center's holdout MSE; their mean
        mse = []
        for x, y in spec["tests"]:
            errs = []
            for c in algorithm.centers:
                model.set_parameters(algorithm._params(c))
                errs.append(float(((module(x) - y) ** 2).mean()))
            mse.append(min(errs))
    return _base_result("fedsoft", laps, algorithm.trained_per_round, float(np.mean(mse)), "center mse")


# --------------------------------------------------------------------------------------------


def rank_main(args: argparse.Namespace) -> dict:
    world = max(1, int(args.workers))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    with np.load(args.data) as data:
        seed = int(_scalar(data, "seed"))
        # the same global seeds on every rank: pfl draws its datasets' and algorithms' random
        # states from numpy's global one, and expects them equal on all workers
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        algorithm = str(_scalar(data, "algorithm"))
        if algorithm == "fedavg":
            result = run_fedavg(data, args.out)
        elif algorithm == "fedsoft":
            result = run_fedsoft(data, args.out, args.state_dir)
        else:
            raise ValueError(f"unknown algorithm {algorithm!r} in the data file")
    if get_ops().distributed.global_rank == 0:
        _write(args.out.resolve(), result)
    return result


def _end_subprocesses() -> None:
    """pfl's cohort sampler (W2 on several ranks) runs in a ``multiprocess`` subprocess that
    only an atexit hook would end."""
    try:
        import multiprocess

        for child in multiprocess.active_children():
            child.terminate()
            child.join(5)
    except Exception:  # noqa: BLE001 - best effort
        pass


if __name__ == "__main__":
    _args = _parser().parse_args()

    def _on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_sigterm)
    code = 0
    try:
        rank_main(_args)
    except BaseException as exc:  # noqa: BLE001 - one line on stderr for any failure
        code = 1
        msg = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else _one_line(exc)
        sys.stdout.flush()
        print(f"{NAME}: error: {msg}", file=sys.stderr, flush=True)
    _end_subprocesses()
    sys.stdout.flush()
    sys.stderr.flush()
    # not sys.exit: a thread of torch.distributed or pfl must not keep a rank alive
    os._exit(code)
