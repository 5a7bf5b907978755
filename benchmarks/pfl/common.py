"""What a rank's two workloads share: the data file's fields, the bare loop's random streams,
a user's dataset, the round clock, the result's JSON and the torch module pfl trains."""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pfl.callback.base import TrainingProcessCallback
from pfl.data.dataset import Dataset
from pfl.internal.ops.selector import get_default_framework_module as get_ops
from pfl.metrics import Metrics, Weighted
from torch import nn


def scalar(data, key: str):
    if key not in data.files:
        raise ValueError(f"the data file has no {key!r}")
    return np.asarray(data[key]).item()


def stream(entropy: np.ndarray, *parts: int) -> np.random.Generator:
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


def write_result(out: Path, result: dict) -> None:
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)


def base_result(algorithm: str, laps: list[float], clients_per_round: list[int], quality: float, metric: str) -> dict:
    return {
        "system": "pfl", "algorithm": algorithm,
        "pfl_version": importlib.metadata.version("pfl"), "torch_version": torch.__version__,
        "workers": int(get_ops().distributed.world_size),
        "sec_per_round": [float(t) for t in laps],
        "clients_per_round": clients_per_round if len(set(clients_per_round)) > 1 else int(clients_per_round[0]),
        "updates": [int(c) for c in clients_per_round],
        "rounds": len(laps), "quality": float(quality), "quality_metric": metric,
    }


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

