"""Federated datasets: who holds what, built from (data config, client id, seed).

:class:`Federation` is cheap to construct anywhere (driver, coordinator, client actor): it
computes sizes and mixtures, and builds a client's samples only when asked, so client data is
created inside the actor that hosts the client and never shipped through the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import DataConfig
from ..models import DataInfo
from ..plugins import PluginError
from ..rng import numpy_rng
from .partition import client_sizes, component_counts, mixtures

if TYPE_CHECKING:
    from ..protocols import Dataset

__all__ = ["ClientData", "Federation", "component_counts"]


@dataclass(frozen=True)
class ClientData:
    """One client's training set."""

    x: torch.Tensor
    y: torch.Tensor
    components: np.ndarray  # the true distribution of each sample
    test_x: torch.Tensor | None = None  # the client's own test split, where the data has one
    test_y: torch.Tensor | None = None
    # where the data has no test split of its own: one the engine drew (Federation.with_test_split)
    drawn_test_x: torch.Tensor | None = None
    drawn_test_y: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def test_split(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The split the client's personalised model is scored on: its own test split where the
        data has one, else the one drawn from its mixture (:meth:`Federation.with_test_split`),
        else None."""
        if self.test_x is not None and self.test_y is not None:
            return self.test_x, self.test_y
        if self.drawn_test_x is not None and self.drawn_test_y is not None:
            return self.drawn_test_x, self.drawn_test_y
        return None


class Federation:
    """The clients of an experiment and the holdout sets of its distributions."""

    def __init__(self, cfg: DataConfig, seed: int) -> None:
        """``seed``: the run's; ``cfg.seed`` (data.seed), when set, draws the data instead."""
        self.cfg = cfg
        self.seed = seed = cfg.draw_seed(seed)
        rng = numpy_rng(seed, "partition", str(cfg.partition))
        self._gen: Dataset = cfg.plugin.load()(cfg, seed)
        info = getattr(self._gen, "info", None)
        if not isinstance(info, DataInfo):
            raise PluginError(f"dataset {cfg.name!r}: its info must be a raysoft.sdk.DataInfo (got {info!r})")
        self.info: DataInfo = info
        if hasattr(self._gen, "client_sizes"):
            self.sizes = np.asarray(self._gen.client_sizes(cfg.clients, rng), dtype=np.int64)
        else:
            self.sizes = client_sizes(cfg.clients, cfg.samples_min, cfg.samples_max, rng)
        if hasattr(self._gen, "client_mixtures"):  # a dataset that knows its clients' true mixtures
            self.mixtures = np.asarray(self._gen.client_mixtures(cfg.clients, cfg.distributions, rng), dtype=float)
        else:
            self.mixtures = mixtures(str(cfg.partition), cfg.clients, cfg.distributions, rng)
        if self.sizes.shape != (cfg.clients,) or self.mixtures.shape != (cfg.clients, cfg.distributions):
            raise PluginError(f"dataset {cfg.name!r}: {self.sizes.shape[0]} sizes and mixtures of shape "
                              f"{self.mixtures.shape} for {cfg.clients} clients and {cfg.distributions} distributions")
        if hasattr(self._gen, "set_layout"):
            self._gen.set_layout(self.sizes, self.mixtures)

    @property
    def num_clients(self) -> int:
        return self.cfg.clients

    @property
    def num_distributions(self) -> int:
        return self.cfg.distributions

    def client_data(self, k: int) -> ClientData:
        """Build client k's training data (deterministic in (config, seed, k))."""
        if not 0 <= k < self.num_clients:
            raise IndexError(f"client {k} out of range 0..{self.num_clients - 1}")
        return ClientData(*self._gen.client(k, int(self.sizes[k]), self.mixtures[k]))  # x, y, components[, test]

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Holdout test set of one distribution."""
        return self._gen.holdout(dist)

    def label_counts(self) -> dict[int, dict[str, np.ndarray]] | None:
        """Each client's count of each label per split (``{"train": [C], "test": [C]}``), where
        the dataset can say so cheaply (its optional ``label_counts(k)``), else None."""
        counts = getattr(self._gen, "label_counts", None)
        if counts is None or self.info.task != "classification":
            return None
        return {k: counts(k) for k in range(self.num_clients)}

    def drawn_test_split(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A test split for client k where the data has none: as many samples as its training
        set, the same number of each distribution (its realised counts), drawn from the
        distributions' holdout sets (without replacement where a holdout set is large enough),
        from the random stream (data seed, "client-test", k), which nothing else draws from."""
        counts = component_counts(int(self.sizes[k]), self.mixtures[k])
        rng = numpy_rng(self.seed, "client-test", k)
        if not hasattr(self, "_holdouts"):
            self._holdouts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        xs, ys = [], []
        for s, c in enumerate(counts.tolist()):
            if c == 0:
                continue
            if s not in self._holdouts:
                self._holdouts[s] = self.holdout(s)
            hx, hy = self._holdouts[s]
            idx = torch.from_numpy(rng.choice(len(hy), size=int(c), replace=int(c) > len(hy)))
            xs.append(hx[idx])
            ys.append(hy[idx])
        return torch.cat(xs), torch.cat(ys)

    def with_test_split(self, k: int, data: ClientData) -> ClientData:
        """Client k's data with a test split to score its personalised model on: itself where the
        dataset gave one (``test_x``, ``test_y``), else with :meth:`drawn_test_split` as
        ``drawn_test_x``, ``drawn_test_y`` (which the algorithms' own metrics never read)."""
        if data.test_split() is not None:
            return data
        x, y = self.drawn_test_split(k)
        return replace(data, drawn_test_x=x, drawn_test_y=y)

    def realized_shares(self) -> np.ndarray:
        """[N, S] shares actually realised by the integer sample counts."""
        counts = np.stack([component_counts(int(n), m) for n, m in zip(self.sizes, self.mixtures)])
        return counts / self.sizes[:, None]
