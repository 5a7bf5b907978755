"""W1 in pfl: FedSoft written as a pfl algorithm (pfl has none), on the bare loop's clients,
initial models and random streams (the package's docstring says how and where it differs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.algorithm import FederatedAlgorithm
from pfl.common_types import Population
from pfl.context import CentralContext
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.user_state import DiskUserStateStorage
from pfl.exception import UserNotFoundError
from pfl.hyperparam import AlgorithmHyperParams, NNTrainHyperParams
from pfl.internal.bridge.pytorch.utils import clip_norm_and_update
from pfl.internal.ops.selector import get_default_framework_module as get_ops
from pfl.metrics import Metrics
from pfl.model.pytorch import PyTorchModel
from pfl.stats import MappedVectorStatistics
from torch import nn

from .common import EpochShuffled, PflModule, RoundClock, base_result, scalar, stream


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
            self.selected = select_clients(v, spec["clients_per_round"], stream(spec["select_entropy"], t))
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
    spec: dict[str, Any] = {key: int(scalar(data, key)) for key in (
        "num_clients", "num_centers", "num_distributions", "dim", "rounds", "clients_per_round",
        "estimation_interval", "batch_size", "local_epochs", "seed")}
    spec.update({key: float(scalar(data, key)) for key in ("sigma", "prox_weight", "lr")})
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
        return EpochShuffled(spec["xs"][k], spec["ys"][k], str(k), stream(entropy, k, t))

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
    return base_result("fedsoft", laps, algorithm.trained_per_round, float(np.mean(mse)), "center mse")

