"""A small drifting dataset plug-in for streams (``data.name: blobs:DriftingBlobs``): S
distributions of the same C-class Gaussian-blob problem, each with its own class means (a
concept shift between clusters), and clients whose mixture of distributions moves between the
stream's cycles (the optional drift hook ``client_cycle``).

Distribution s, class c: x ~ N(mu_{s,c}, spread^2 I) in ``dim`` dimensions, the means drawn once
from N(0, separation^2 I) by ``(seed, "blobs", "means")``. Cycle 0 of client k is its
federation's draw (``client``: ``n`` samples in the mixture ``shares`` the partition gave it);
in every later cycle the client keeps its main distribution (the largest share of its first
mixture) with a share drawn from U[0.4, 0.9] and splits the rest over the others by
Dirichlet(1), as the CCFL paper's image streams do. Everything is drawn from ``(seed, client,
cycle)``, so any process rebuilds the same data.

Of raysoft it imports only ``raysoft.sdk``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import Field

from raysoft.sdk import DataConfig, DataInfo, numpy_rng


class BlobSettings(DataConfig):
    """The ``data`` section: DataConfig's keys (``clients``, ``distributions``, ``partition``,
    ``samples_min``/``samples_max`` for the sizes, ``test_samples`` for each holdout) and the blobs'."""

    classes: int = Field(4, ge=2, description="C, the classes of every distribution")
    dim: int = Field(8, ge=1, description="the inputs' dimension")
    separation: float = Field(2.0, gt=0.0, description="scale of the class means' N(0, separation^2 I) draw")
    spread: float = Field(1.0, gt=0.0, description="the classes' standard deviation around their means")


def cycle_mixture(first: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A later cycle's mixture: the main distribution of ``first`` keeps U[0.4, 0.9], the others
    share the rest by Dirichlet(1)."""
    k = len(first)
    out = np.zeros(k)
    main = int(np.argmax(first))
    if k == 1:
        out[0] = 1.0
        return out
    share = rng.uniform(0.4, 0.9)
    out[main] = share
    out[[s for s in range(k) if s != main]] = (1.0 - share) * rng.dirichlet(np.ones(k - 1))
    return out


class DriftingBlobs:
    """Gaussian blobs, one set of class means per distribution; clients drift between cycles."""

    Settings = BlobSettings

    def __init__(self, settings: BlobSettings, seed: int) -> None:
        self.settings, self.seed = settings, seed
        s, c, d = settings.distributions, settings.classes, settings.dim
        self.means = numpy_rng(seed, "blobs", "means").normal(0.0, settings.separation, (s, c, d))
        self.info = DataInfo(input_dim=d, num_outputs=c, task="classification")

    def _draw(self, counts: np.ndarray, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """counts[s] samples of distribution s, classes uniform, in a random order."""
        xs, ys, comps = [], [], []
        for s, n in enumerate(counts):
            y = rng.integers(0, self.settings.classes, size=int(n))
            xs.append(self.means[s, y] + rng.normal(0.0, self.settings.spread, (int(n), self.settings.dim)))
            ys.append(y)
            comps.append(np.full(int(n), s))
        order = rng.permutation(int(sum(counts)))
        x = torch.from_numpy(np.concatenate(xs)[order].astype(np.float32))
        y_all = torch.from_numpy(np.concatenate(ys)[order].astype(np.int64))
        return x, y_all, np.concatenate(comps)[order]

    def client(self, k: int, n: int, shares: np.ndarray, /) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        rng = numpy_rng(self.seed, "blobs", "client", k)
        return self._draw(rng.multinomial(n, shares / shares.sum()), rng)

    def client_cycle(self, k: int, cycle: int, n: int,
                     shares: np.ndarray, /) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The drift hook: client k's data of stream cycle ``cycle`` >= 1 (see the module's docstring)."""
        rng = numpy_rng(self.seed, "blobs", "cycle", k, cycle)
        return self._draw(rng.multinomial(n, cycle_mixture(shares, rng)), rng)

    def holdout(self, dist: int, /) -> tuple[torch.Tensor, torch.Tensor]:
        rng = numpy_rng(self.seed, "blobs", "holdout", dist)
        counts = np.zeros(self.settings.distributions, dtype=np.int64)
        counts[dist] = self.settings.test_samples
        x, y, _ = self._draw(counts, rng)
        return x, y


if TYPE_CHECKING:  # mypy checks the plug-in against the dataset protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import DriftingDataset

    _: type[DriftingDataset] = DriftingBlobs
