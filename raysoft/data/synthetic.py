"""FedSoft's synthetic linear-regression mixture (FedSoft, AAAI'22, Experiments;
docs/algorithms.md#synthetic-data-scale).

y = <x, theta_s> + eps, x ~ N(0, I_d), theta_s ~ N(0, sigma_0^2 I_d), eps ~ N(0, noise_std^2).
The paper says sigma_0 = 10 (our default); the reference code passes 10 as a *variance*
(sigma_0 = sqrt(10)): set ``data.theta_std: 3.1623`` for that. Each client's samples are drawn
fresh from its own stream (the reference code's bug of every client sharing the same first-n
pool samples is not reproduced) and shuffled once, so a fixed-order local epoch mixes
components.
"""

from __future__ import annotations

import numpy as np
import torch

from ..catalog import SyntheticData
from ..models import DataInfo
from ..rng import numpy_rng
from .partition import component_counts


class SyntheticRegression:
    """Generator of clients' training sets and per-distribution holdout sets."""

    def __init__(self, cfg: SyntheticData, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.thetas = numpy_rng(seed, "synthetic", "theta").normal(
            0.0, cfg.theta_std, size=(cfg.distributions, cfg.dim)
        )
        self.info = DataInfo(input_dim=int(cfg.dim), num_outputs=1, task="regression")

    def _draw(self, rng: np.random.Generator, dist: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((count, self.cfg.dim))
        y = x @ self.thetas[dist] + self.cfg.noise_std * rng.standard_normal(count)
        return x, y

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(x [n, d], y [n], component of each sample) of client k."""
        rng = numpy_rng(self.seed, "synthetic", "client", k)
        counts = component_counts(n, shares)
        xs, ys, comps = [], [], []
        for s, c in enumerate(counts):
            x, y = self._draw(rng, s, int(c))
            xs.append(x)
            ys.append(y)
            comps.append(np.full(int(c), s))
        order = rng.permutation(n)
        x = np.concatenate(xs)[order]
        y = np.concatenate(ys)[order]
        comp = np.concatenate(comps)[order]
        return torch.from_numpy(x).float(), torch.from_numpy(y).float(), comp

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The holdout test set of distribution ``dist``."""
        rng = numpy_rng(self.seed, "synthetic", "test", dist)
        x, y = self._draw(rng, dist, self.cfg.test_samples)
        return torch.from_numpy(x).float(), torch.from_numpy(y).float()
