"""FPFC's clustered synthetic classification data (docs/algorithms.md#fpfc-synthetic-data).

``generator: fpfc`` (default) is what the FPFC reference code builds
(Synthetic/data/generate_synthetic_dataset.py): per cluster p, mu_p ~ N(0, 1),
W_p ~ N(mu_p, 1)^{C x d}, b_p ~ N(mu_p, 1)^C; x ~ U[0, 1)^d;
y = argmax(W_p x + b_p + N(0, noise_std^2 I_C)) with noise_std 0.5; device sizes
n_i = (int(lognormal(4, 2)) + 50) * 5 (no cap), split 80/20 into train/test.

``generator: fedprox`` is FedProx's synthetic(alpha, beta) (litian96/FedProx), with the model
prior drawn per CLUSTER so that devices of a cluster share their model: u_p ~ N(0, alpha),
W_p ~ N(u_p, 1), b_p ~ N(u_p, 1); per device B_k ~ N(0, beta), v_k ~ N(B_k, 1)^d,
x ~ N(v_k, diag(j^-1.2)); y = argmax(W_p x + b_p).

A device whose mixture is not one-hot draws each sample's cluster by its shares.
"""

from __future__ import annotations

import numpy as np
import torch

from ..catalog import FPFCSyntheticData
from ..models import DataInfo
from ..rng import numpy_rng
from .partition import component_counts


class FPFCSynthetic:
    """Per-cluster multinomial-logistic data; each client also gets a local test split."""

    def __init__(self, cfg: FPFCSyntheticData, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        d, c = int(cfg.dim), cfg.classes
        rng = numpy_rng(seed, "fpfc_synthetic", "models")
        self.w = np.empty((cfg.distributions, c, d))
        self.b = np.empty((cfg.distributions, c))
        for p in range(cfg.distributions):
            mu = rng.normal(0.0, np.sqrt(cfg.alpha) if cfg.generator == "fedprox" else 1.0)
            self.w[p] = rng.normal(mu, 1.0, size=(c, d))
            self.b[p] = rng.normal(mu, 1.0, size=c)
        self.cov_diag = np.arange(1, d + 1, dtype=float) ** -1.2
        self.info = DataInfo(input_dim=d, num_outputs=c, task="classification")

    def client_sizes(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """TRAIN sizes: 80% of n_i = (int(lognormal(4, 2)) + 50) * 5."""
        total = (rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + 50) * 5
        return (total * 4) // 5

    def _features(self, rng: np.random.Generator, count: int, centre: np.ndarray | None) -> np.ndarray:
        d = int(self.cfg.dim)
        if centre is None:
            return rng.uniform(0.0, 1.0, size=(count, d))
        return centre + rng.standard_normal((count, d)) * np.sqrt(self.cov_diag)

    def _labels(self, rng: np.random.Generator, x: np.ndarray, p: int) -> np.ndarray:
        logits = x @ self.w[p].T + self.b[p]
        if self.cfg.generator == "fpfc" and self.cfg.noise_std:
            logits = logits + self.cfg.noise_std * rng.standard_normal(logits.shape)
        return logits.argmax(axis=1)

    def _draw(self, rng: np.random.Generator, counts: np.ndarray, centre: np.ndarray | None):
        xs, ys, comps = [], [], []
        for p, c in enumerate(counts):
            x = self._features(rng, int(c), centre)
            xs.append(x)
            ys.append(self._labels(rng, x, p))
            comps.append(np.full(int(c), p))
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(comps)

    def client(self, k: int, n: int, shares: np.ndarray):
        """(x, y, components, test_x, test_y) of client k: n train samples and n/4 test samples."""
        rng = numpy_rng(self.seed, "fpfc_synthetic", "client", k)
        centre = None
        if self.cfg.generator == "fedprox":
            centre = rng.normal(rng.normal(0.0, np.sqrt(self.cfg.beta)), 1.0, size=int(self.cfg.dim))
        n_test = max(1, n // 4)
        x, y, comp = self._draw(rng, component_counts(n + n_test, shares), centre)
        order = rng.permutation(n + n_test)
        x, y, comp = x[order], y[order], comp[order]
        tx = torch.from_numpy(x).float()
        ty = torch.from_numpy(y).long()
        return tx[:n], ty[:n], comp[:n], tx[n:], ty[n:]

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh samples of cluster ``dist`` (features as a device of the FPFC generator)."""
        rng = numpy_rng(self.seed, "fpfc_synthetic", "test", dist)
        counts = np.zeros(self.cfg.distributions, dtype=np.int64)
        counts[dist] = self.cfg.test_samples
        centre = None if self.cfg.generator == "fpfc" else np.zeros(int(self.cfg.dim))
        x, y, _ = self._draw(rng, counts, centre)
        return torch.from_numpy(x).float(), torch.from_numpy(y).long()
