"""W2 in pfl: its own ``FederatedAveraging`` on the bare loop's clients, selections, initial CNN
and batch orders (the package's docstring says how)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.data.federated_dataset import FederatedDataset
from pfl.data.sampling import MinimizeReuseUserSampler
from pfl.hyperparam import NNTrainHyperParams
from pfl.internal.ops.selector import get_default_framework_module as get_ops
from pfl.model.pytorch import PyTorchModel
from torch import nn

from .common import EpochShuffled, PflModule, RoundClock, base_result, scalar, stream


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
    num_clients = int(scalar(data, "num_clients"))
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
    shuffle = bool(scalar(data, "shuffle"))
    entropy = np.asarray(data["shuffle_entropy"])
    y_test = torch.from_numpy(np.asarray(data["y_test"], dtype=np.int64).ravel())
    x_test = torch.from_numpy(np.asarray(data["x_test"], dtype=np.float32).reshape(len(y_test), 1, 28, 28))
    channels = tuple(int(c) for c in np.asarray(data["channels"]).ravel())
    module = cnn(channels, int(scalar(data, "hidden")), int(scalar(data, "classes")))
    params = list(module.parameters())
    with torch.no_grad():
        for i, p in enumerate(params):
            a = np.asarray(data[f"init_{i}"], dtype=np.float32)
            if tuple(a.shape) != tuple(p.shape):
                raise ValueError(f"init_{i} has shape {tuple(a.shape)}, the model's parameter {tuple(p.shape)}")
            p.copy_(torch.from_numpy(a))
    if f"init_{len(params)}" in data.files:
        raise ValueError(f"the data file has more init_<i> arrays than the model's {len(params)} parameters")

    lr, momentum = float(scalar(data, "lr")), float(scalar(data, "momentum"))

    def sgd(parameters, lr):
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)

    model = PyTorchModel(module, local_optimizer_create=sgd,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))

    def make_dataset(user):  # user: (client, round)
        c, t = user
        return EpochShuffled(xs[c], ys[c], str(c), stream(entropy, c, t) if shuffle else None)

    users = [(int(c), t) for t, row in enumerate(selection) for c in row]
    fed = FederatedDataset(make_dataset, MinimizeReuseUserSampler(users),
                           user_id_to_weight={u: len(ys[u[0]]) for u in users})
    backend = SimulatedBackend(training_data=fed, val_data=fed, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=rounds,
                                         train_cohort_size=k, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_batch_size=int(scalar(data, "batch_size")),
                                      local_num_epochs=int(scalar(data, "local_epochs")), local_learning_rate=lr)
    clock = RoundClock()
    model = FedAvgNoUserEval().run(algorithm_params, backend, model, train_params, callbacks=[clock],
                                   send_metrics_to_platform=False)
    if len(clock.laps) != rounds:
        raise RuntimeError(f"{len(clock.laps)} of {rounds} rounds were timed")
    # the module's own metrics (summed loss and correct count) over the test set, 1000 at a time
    chunks = [module.metrics(x_test[i:i + 1000], y_test[i:i + 1000]) for i in range(0, len(y_test), 1000)]
    correct = sum(c["accuracy"].weighted_value for c in chunks)
    result = base_result("fedavg", clock.laps, [k] * rounds, correct / max(len(y_test), 1), "accuracy")
    result["accuracy"] = result["quality"]
    # the test set's mean cross-entropy
    result["test_loss"] = sum(c["loss"].weighted_value for c in chunks) / max(len(y_test), 1)
    return result

