"""Drifting client data for asynchronous streams (the CCFL paper's Appendix A.1;
docs/algorithms.md#ccfl-drift).

Cluster s is the image dataset rotated by ``data.rotations[s]`` (default s * 360 / K). Each
client has a fixed main cluster (client m: m mod K) and receives a fresh dataset at the start
and after every upload-download cycle (``drift: false`` keeps the first one): n ~ U{samples_min
.. samples_max} samples (the paper: 500..2000), a main share ~ U[0.4, 0.9], the rest split over
the other clusters by ``rest_split`` (``dirichlet``: Dirichlet(1); ``uniform``: equally) — the
paper does not say how [GUESS]. Its test set has the same mixture (20% of n; the paper's "Cli
Bfr/Aft" sets). Training samples come from the train split; test samples from the test split
after the ``public_samples`` per cluster that the server keeps (pre-training and validation
set D_k), so clients never test on the server's images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..catalog import ImageData
from ..config import DataConfig
from ..models import DataInfo
from ..rng import numpy_rng
from .image_mixture import DATASETS, _to_float, distribution_specs, load_pools
from .images import default_root, rotate
from .partition import component_counts


@dataclass(frozen=True)
class CycleData:
    """One client's data of one cycle."""

    x: torch.Tensor
    y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    shares: np.ndarray  # the true mixture

    def __len__(self) -> int:
        return int(self.y.shape[0])


class DriftingImages:
    """Per-(client, cycle) datasets, the server's public sets, and cluster test sets."""

    def __init__(self, cfg: DataConfig, seed: int, public_samples: int, rest_split: str = "dirichlet",
                 validation: str = "shared") -> None:
        if not isinstance(cfg, ImageData) or cfg.name not in DATASETS:
            raise ValueError(f"streams need an image dataset, not {cfg.name!r}")
        self.cfg, self.seed = cfg, cfg.draw_seed(seed)  # data.seed, when set, draws the data
        self.public_samples, self.rest_split, self.validation_split = public_samples, rest_split, validation
        # test-split images the server keeps per cluster: its pre-training set, and a validation
        # set of the same size after it when the two are disjoint
        self.reserved = public_samples * (2 if validation == "disjoint" else 1)
        self.root = default_root(cfg.name, cfg.root)
        self.specs = distribution_specs(cfg.name, cfg.distributions, cfg.rotations)
        shape, classes = DATASETS[cfg.name]
        self.info = DataInfo(int(np.prod(shape)), classes, "classification", shape)

    @property
    def num_clusters(self) -> int:
        return len(self.specs)

    def main_cluster(self, client: int) -> int:
        return client % self.num_clusters

    def shares(self, client: int, cycle: int) -> tuple[int, np.ndarray]:
        """(n, true mixture) of a client's dataset in a cycle."""
        rng = numpy_rng(self.seed, "drift", "shares", client, cycle)
        k = self.num_clusters
        n = int(rng.integers(self.cfg.samples_min, self.cfg.samples_max + 1))
        main = self.main_cluster(client)
        out = np.zeros(k)
        if k == 1:
            out[0] = 1.0
            return n, out
        share = rng.uniform(0.4, 0.9)
        if self.rest_split == "dirichlet":
            rest = rng.dirichlet(np.ones(k - 1))
        elif self.rest_split == "uniform":
            rest = np.full(k - 1, 1.0 / (k - 1))
        else:  # "some": the rest from a random non-empty subset of the other clusters, Dirichlet(1) over it
            size = int(rng.integers(1, k))
            chosen = rng.choice(k - 1, size=size, replace=False)
            rest = np.zeros(k - 1)
            rest[chosen] = rng.dirichlet(np.ones(size))
        out[main] = share
        out[[s for s in range(k) if s != main]] = (1.0 - share) * rest
        return n, out

    def _test_perm(self, s: int) -> np.ndarray:
        base, _ = self.specs[s]
        size = len(load_pools(self.cfg.name, self.root)[base].test_y)
        return numpy_rng(self.seed, "drift", "test-perm", s).permutation(size)

    def _draw(self, rng: np.random.Generator, counts: np.ndarray, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        pools = load_pools(self.cfg.name, self.root)
        xs, ys = [], []
        for s, c in enumerate(counts):
            if c == 0:
                continue
            base, angle = self.specs[s]
            pool = pools[base]
            if split == "train":
                idx = rng.choice(len(pool.train_y), size=int(c), replace=False)
                x, y = pool.train_x[idx], pool.train_y[idx]
            else:  # client tests: the test split minus the server's images
                rest = self._test_perm(s)[self.reserved :]
                idx = rest[rng.choice(len(rest), size=int(c), replace=len(rest) < c)]
                x, y = pool.test_x[idx], pool.test_y[idx]
            xs.append(rotate(_to_float(x), angle))
            ys.append(torch.from_numpy(y))
        images, labels = torch.cat(xs), torch.cat(ys)
        order = torch.from_numpy(rng.permutation(len(labels)))
        return images[order], labels[order]

    def cycle(self, client: int, cycle: int) -> CycleData:
        """Client ``client``'s fresh dataset of cycle ``cycle`` (and its test set)."""
        n, shares = self.shares(client, cycle)
        rng = numpy_rng(self.seed, "drift", "samples", client, cycle)
        x, y = self._draw(rng, component_counts(n, shares), "train")
        tx, ty = self._draw(rng, component_counts(max(1, n // 5), shares), "test")
        return CycleData(x, y, tx, ty, shares)

    def public(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's public set of cluster s (pre-training and validation set D_k)."""
        base, angle = self.specs[s]
        pool = load_pools(self.cfg.name, self.root)[base]
        idx = self._test_perm(s)[: self.public_samples]
        return rotate(_to_float(pool.test_x[idx]), angle), torch.from_numpy(pool.test_y[idx])

    def validation(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's validation set D_k of cluster s: its public set (``shared``), or as many
        other images (``disjoint``), so that F(w_k; D_k) is not a training loss."""
        if self.validation_split != "disjoint":
            return self.public(s)
        base, angle = self.specs[s]
        pool = load_pools(self.cfg.name, self.root)[base]
        idx = self._test_perm(s)[self.public_samples : self.reserved]
        return rotate(_to_float(pool.test_x[idx]), angle), torch.from_numpy(pool.test_y[idx])

    def holdout(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cluster s's test set (``data.test_samples``), disjoint from the server's images."""
        base, angle = self.specs[s]
        pool = load_pools(self.cfg.name, self.root)[base]
        rest = self._test_perm(s)[self.reserved :]
        idx = rest[: self.cfg.test_samples]
        return rotate(_to_float(pool.test_x[idx]), angle), torch.from_numpy(pool.test_y[idx])
