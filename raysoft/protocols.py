"""The protocols of the plug-ins that are not algorithms: a dataset, a model factory and a
callback (the algorithms' are :class:`raysoft.algorithms.base.Algorithm` and the stream
template :class:`raysoft.algorithms.stream.StreamAlgorithm`). They are the types the engine
takes, exported from :mod:`raysoft.sdk`, so that mypy checks a plug-in against them::

    _: type[Dataset] = NpzClients
    _: ModelFactory[MLPSettings] = MLP
    _: type[CallbackHooks] = EarlyStop

Light: nothing but the standard library is imported here at run time (the annotations name
torch, numpy and pandas types for the type checker only). :class:`DataInfo`, what a model
knows of the data, lives here too: the model protocol names it, and it is part of the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    import pandas as pd
    import torch
    from torch import nn

    from .config import ModelConfig


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about the data."""

    input_dim: int
    num_outputs: int  # 1 for regression, #classes for classification
    task: str  # "regression" or "classification"
    input_shape: tuple[int, ...] = ()  # (C, H, W) for images


S_contra = TypeVar("S_contra", bound="ModelConfig", contravariant=True)


class Dataset(Protocol):
    """A dataset plug-in, made as ``Dataset(settings, seed)`` (``settings``: the ``data``
    section). Required: ``info``, ``client`` and ``holdout``; optional, read when present:
    ``client_sizes(num_clients, rng)``, ``client_mixtures(num_clients, distributions, rng)``,
    ``set_layout(sizes, mixtures)``, the classmethod ``verify(settings)`` and, for streams,
    ``client_cycle`` (:class:`DriftingDataset`)."""

    @property
    def info(self) -> DataInfo:
        """The data's shape: ``input_dim``, ``num_outputs``, ``task``, ``input_shape``."""
        ...

    def client(self, k: int, n: int, shares: np.ndarray, /) -> tuple[Any, ...]:
        """Client k's ``(x, y, components[, test_x, test_y])``: ``n`` samples whose true
        distributions are drawn in ``shares``; ``components`` is each sample's distribution."""
        ...

    def holdout(self, dist: int, /) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution ``dist``'s holdout set ``(x, y)``, on which the centers are scored."""
        ...


class DriftingDataset(Dataset, Protocol):
    """A dataset whose clients' data changes between the cycles of a stream: a :class:`Dataset`
    with the optional hook ``client_cycle`` (docs/plugins.md#streams-over-any-dataset). A dataset
    without it feeds a stream too, its clients keeping their data from cycle to cycle."""

    def client_cycle(self, k: int, cycle: int, n: int, shares: np.ndarray, /) -> tuple[Any, ...]:
        """Client k's data of stream cycle ``cycle`` >= 1 (cycle 0 is :meth:`client`'s), in
        :meth:`client`'s form ``(x, y, components[, test_x, test_y])``; ``n`` and ``shares``:
        the client's size and mixture as the federation drew them. Deterministic in (seed, k,
        cycle); the true mixture of the cycle is read from ``components``."""


class LabelledPool(Protocol):
    """A classification dataset plug-in that hands over its whole labelled pool, so that the
    heterogeneity scenarios (``data.name: scenario``, ``data.base``: the plug-in) can partition
    it. ``info.task`` must be ``"classification"`` and ``info.num_outputs`` the classes."""

    @property
    def info(self) -> DataInfo: ...

    def labelled_pool(self) -> tuple[
        np.ndarray | torch.Tensor, np.ndarray | torch.Tensor, np.ndarray | torch.Tensor, np.ndarray | torch.Tensor
    ]:
        """``(train_x, train_y, test_x, test_y)``: inputs [n, ...] (float; images [n, C, H, W] in
        [0, 1] for the image transforms), integer labels 0..C-1 [n]; numpy arrays or tensors."""
        ...


class ModelFactory(Protocol[S_contra]):
    """A model plug-in: ``factory(settings, info, generator) -> torch.nn.Module`` (a class whose
    constructor takes these is one). ``settings`` is the ``model`` section (its ``Settings``),
    every weight is drawn from ``generator``."""

    def __call__(self, settings: S_contra, info: DataInfo, generator: torch.Generator, /) -> nn.Module: ...


class CallbackHooks(Protocol):
    """A callback plug-in, made as ``Callback(settings, run)``; :class:`raysoft.callbacks.Callback`
    is a base with both hooks doing nothing."""

    def on_rows(self, rows: pd.DataFrame, /) -> bool | None:
        """The ``metrics.parquet`` rows recorded since the last call; True stops the run."""
        ...

    def on_end(self, summary: dict[str, Any], run_dir: Path, /) -> None:
        """Called once the run's files are written."""
        ...
