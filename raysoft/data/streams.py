"""Where a stream's clients get their data: any dataset of the data contract, drift optional.

A stream reads its clients' data per cycle (one dataset a clock tick, a fresh one after every
upload-download cycle when the dataset drifts). :func:`stream_source` picks the source:

* the built-in image datasets (``fmnist``, ``emnist_letters``, ``cifar10``, ``cifar100``):
  :class:`~raysoft.data.drift.DriftingImages`, the CCFL paper's rotated mixtures, whose clients
  draw a fresh mixture every cycle (unchanged: the papers' numbers hold);
* any other dataset, built-in or plug-in: :class:`FederatedStream`, through the same
  :class:`~raysoft.data.Federation` as the rounds. Cycle 0 is client k's ``client(k, n,
  shares)``; a dataset that says how its clients' data changes between cycles has the optional
  hook ``client_cycle(k, cycle, n, shares)`` (same answer as ``client``, for cycle >= 1); one
  without it keeps its clients' data from cycle to cycle. The server's validation set of
  distribution s (its D_k, and what a pre-training algorithm trains on) is the first
  ``public_samples`` of the dataset's holdout s (at most half of it); the rest is the cluster's
  test set, and a client without its own test split is tested on n // 5 samples of it drawn
  in the client's true mixture of the cycle (as the image streams' clients are).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..catalog import ImageData
from ..config import DataConfig
from ..models import DataInfo
from ..rng import numpy_rng
from . import Federation
from .drift import CycleData, DriftingImages
from .image_mixture import DATASETS
from .partition import component_counts


class FederatedStream:
    """A stream's per-(client, cycle) data, the server's validation sets and the cluster test
    sets, from any dataset of the data contract (see the module's docstring)."""

    def __init__(self, cfg: DataConfig, seed: int, public_samples: int) -> None:
        self.cfg, self.run_seed, self.public_samples = cfg, seed, public_samples
        self.fed = Federation(cfg, seed)
        self.seed = self.fed.seed
        self.info: DataInfo = self.fed.info
        self._holdouts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_clusters(self) -> int:
        return self.cfg.distributions

    @property
    def drifts(self) -> bool:
        """The dataset says how its clients' data changes between cycles (``client_cycle``)."""
        return hasattr(self.fed._gen, "client_cycle")

    def shares(self, client: int, cycle: int) -> tuple[int, np.ndarray]:
        """(n, mixture) of the client's data as the federation drew it (its size for placement)."""
        return int(self.fed.sizes[client]), self.fed.mixtures[client]

    def _split(self, s: int) -> int:
        """How many of holdout s's first samples the server keeps (its validation set)."""
        return min(self.public_samples, len(self._holdout(s)[1]) // 2)

    def _holdout(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        if s not in self._holdouts:
            self._holdouts[s] = self.fed.holdout(s)
        return self._holdouts[s]

    def validation(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's validation set D_k of distribution s: the first samples of its holdout."""
        x, y = self._holdout(s)
        v = self._split(s)
        return x[:v], y[:v]

    public = validation  # what a pre-training algorithm (CCFL) trains its cluster models on

    def holdout(self, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution s's test set: its holdout after the server's samples."""
        x, y = self._holdout(s)
        v = self._split(s)
        return x[v:], y[v:]

    def cycle(self, client: int, cycle: int) -> CycleData:
        """Client ``client``'s data of cycle ``cycle`` and its test set."""
        n, mixture = self.shares(client, cycle)
        gen: Any = self.fed._gen
        if cycle > 0 and self.drifts:
            got = tuple(gen.client_cycle(client, cycle, n, mixture))
        else:
            d = self.fed.client_data(client)
            got = (d.x, d.y, d.components, d.test_x, d.test_y)
        x, y, components = got[0], got[1], np.asarray(got[2])
        if len(y) == 0:
            raise ValueError(f"dataset {self.cfg.name!r}: client {client} has no samples in cycle {cycle}")
        shares = np.bincount(components.astype(np.int64), minlength=self.num_clusters)[: self.num_clusters]
        shares = shares / shares.sum()
        test = got[3:5] if len(got) >= 5 else (None, None)
        if test[0] is None or test[1] is None:
            test = self._test_draw(client, cycle, max(1, len(y) // 5), shares)
        return CycleData(x, y, test[0], test[1], shares)

    def _test_draw(self, client: int, cycle: int, n: int, shares: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """n samples of the distributions' test sets in the mixture ``shares``."""
        rng = numpy_rng(self.seed, "stream", "test", client, cycle)
        xs, ys = [], []
        for s, c in enumerate(component_counts(n, shares)):
            if c == 0:
                continue
            x, y = self.holdout(s)
            idx = torch.from_numpy(rng.choice(len(y), size=int(c), replace=len(y) < c))
            xs.append(x[idx])
            ys.append(y[idx])
        return torch.cat(xs), torch.cat(ys)


StreamSource = DriftingImages | FederatedStream


def stream_source(cfg: DataConfig, seed: int, public_samples: int, rest_split: str = "dirichlet",
                  validation: str = "shared") -> StreamSource:
    """The data of a stream: the rotated image mixtures for the built-in image datasets (with
    ``rest_split`` and ``validation``), any other dataset through its federation."""
    if isinstance(cfg, ImageData) and cfg.name in DATASETS:
        return DriftingImages(cfg, seed, public_samples, rest_split, validation)
    return FederatedStream(cfg, seed, public_samples)
