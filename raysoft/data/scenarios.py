"""Heterogeneity scenarios over a labelled classification pool (``data.name: scenario``).

The pool is a built-in image dataset's train and test splits (``base: fmnist`` ...) or what a
dataset plug-in's ``labelled_pool()`` hands over. From (settings, seed) alone:

1. Clusters: client k is in cluster ``k * S // N`` (contiguous blocks, as ``partition:
   clusters``); S = ``distributions``. Its true mixture is one-hot (clients.parquet's
   ``distribution`` is its cluster).
2. The train pool (or a seeded subset of ``pool_samples``) is shuffled and cut into S disjoint
   parts in proportion to the clusters' numbers of clients.
3. Each cluster's part is split among its clients by one of Flower Datasets' partitioners:
   ``IidPartitioner`` (iid, equal), ``SizePartitioner`` (iid, power-law sizes),
   ``DirichletPartitioner`` (each class split over the clients by Dirichlet(alpha) shares),
   ``InnerDirichletPartitioner`` (power-law sizes, each client's classes Dirichlet(alpha)),
   ``PathologicalPartitioner`` (c classes a client). A client's part is disjoint from every
   other's; its last ``test_fraction`` is its own test split.
4. Cluster s relabels its samples (concept shift: a permutation of the classes, or a swap of
   two) and transforms its inputs (feature shift: rotation, brightness, Gaussian noise, blur),
   on the clients' data and on its holdout (the same ``test_samples`` of the base's test split
   for every cluster, under the cluster's map and transform).

The partition needs only the labels; it is computed once per process and cached, like the
pools, so each client actor builds its clients' tensors from its indices.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..catalog import IMAGE_DATASETS, ScenarioData
from ..errors import Refusal
from ..models import DataInfo
from ..rng import numpy_rng, torch_generator

__all__ = ["Layout", "Pool", "Scenario", "cluster_of", "label_maps", "partition", "power_law_sizes", "transform"]


@dataclass(frozen=True)
class Pool:
    """A labelled pool: inputs (uint8 images, or float arrays) and int64 labels of both splits."""

    train_x: np.ndarray | torch.Tensor
    train_y: np.ndarray
    test_x: np.ndarray | torch.Tensor
    test_y: np.ndarray
    num_classes: int
    scale: float  # inputs are divided by it (255 for uint8 images)


@dataclass(frozen=True)
class Layout:
    """Who holds which samples of the pool: each client's cluster and train/test indices."""

    cluster: np.ndarray  # [N]
    train: list[np.ndarray]
    test: list[np.ndarray]


def cluster_of(num_clients: int, num_clusters: int) -> np.ndarray:
    """Client k's cluster: k * S // N."""
    return np.arange(num_clients) * num_clusters // num_clients


def power_law_sizes(total: int, n: int, power: float, low: int, rng: np.random.Generator) -> np.ndarray:
    """n sizes summing to at most ``total``: ``low`` each plus the rest in proportion to
    Pareto(power) + 1 weights (floored)."""
    if total < n * low:
        raise Refusal(f"data: {total} samples cannot give {n} clients {low} each (min_samples)")
    w = rng.pareto(power, size=n) + 1.0
    return low + np.floor(w / w.sum() * (total - n * low)).astype(np.int64)


def _flower_parts(cfg: ScenarioData, labels: np.ndarray, n: int, seed: int,
                  sizes: np.ndarray | None) -> list[np.ndarray]:
    """The positions (into ``labels``) of each of n clients, by Flower Datasets' partitioners."""
    from datasets import Dataset
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        InnerDirichletPartitioner,
        PathologicalPartitioner,
        SizePartitioner,
    )

    table = Dataset.from_dict({"label": labels, "i": np.arange(len(labels))})
    p: Any
    if cfg.label_skew == "shards":
        p = PathologicalPartitioner(n, "label", cfg.classes_per_client, class_assignment_mode="first-deterministic",
                                    shuffle=True, seed=seed)
    elif cfg.label_skew == "dirichlet" and sizes is not None:
        p = InnerDirichletPartitioner([int(v) for v in sizes], "label", cfg.alpha, shuffle=True, seed=seed)
    elif cfg.label_skew == "dirichlet":
        p = DirichletPartitioner(n, "label", cfg.alpha, min_partition_size=cfg.min_samples, self_balancing=False,
                                 shuffle=True, seed=seed)
    elif sizes is not None:
        p = SizePartitioner([int(v) for v in sizes])
    else:
        p = IidPartitioner(n)
    p.dataset = table
    with warnings.catch_warnings():  # "classes not used", "sizes do not sum to the dataset": by design here
        warnings.simplefilter("ignore", UserWarning)
        return [np.asarray(p.load_partition(j)["i"], dtype=np.int64) for j in range(n)]


def partition(cfg: ScenarioData, train_y: np.ndarray, seed: int) -> Layout:
    """Every client's cluster and its train and test indices into the train pool."""
    n_pool = len(train_y)
    pool = np.arange(n_pool)
    if cfg.pool_samples is not None:
        if cfg.pool_samples > n_pool:
            raise Refusal(f"data.pool_samples: {cfg.pool_samples} > the {n_pool} samples of {cfg.base}")
        pool = np.sort(numpy_rng(seed, "scenario", "pool").permutation(n_pool)[: cfg.pool_samples])
    cluster = cluster_of(cfg.clients, cfg.distributions)
    members = np.bincount(cluster, minlength=cfg.distributions)
    shuffled = pool[numpy_rng(seed, "scenario", "clusters").permutation(len(pool))]
    cuts = np.floor(np.cumsum(members) / cfg.clients * len(pool)).astype(np.int64)
    train: list[np.ndarray] = [np.empty(0, np.int64)] * cfg.clients
    test: list[np.ndarray] = [np.empty(0, np.int64)] * cfg.clients
    for s in range(cfg.distributions):
        part = shuffled[(cuts[s - 1] if s else 0): cuts[s]]
        ks = np.flatnonzero(cluster == s)
        sizes = None
        if cfg.quantity == "power_law":
            sizes = power_law_sizes(len(part), len(ks), cfg.power, cfg.min_samples,
                                    numpy_rng(seed, "scenario", "sizes", s))
        flower_seed = int(numpy_rng(seed, "scenario", "partitioner", s).integers(2**31))
        try:
            parts = _flower_parts(cfg, train_y[part], len(ks), flower_seed, sizes)
        except ValueError as err:
            raise Refusal(f"data: cluster {s}: {' '.join(str(err).split())}") from None
        for k, pos in zip(ks, parts):
            held = int(math.floor(len(pos) * cfg.test_fraction))
            if len(pos) - held < 1:
                raise Refusal(f"data: client {k} gets no training samples ({len(pos)} in all); "
                              "use more pool_samples or fewer clients")
            idx = part[pos]
            train[k], test[k] = idx[: len(idx) - held], idx[len(idx) - held:]
    return Layout(cluster, train, test)


def label_maps(cfg: ScenarioData, num_classes: int, seed: int) -> np.ndarray:
    """[S, C]: cluster s's label of each class (cluster 0: the identity)."""
    maps = np.tile(np.arange(num_classes), (cfg.distributions, 1))
    for s in range(1, cfg.distributions):
        if cfg.concept == "permutation":
            maps[s] = numpy_rng(seed, "scenario", "permutation", s).permutation(num_classes)
        elif cfg.concept == "swap":
            a, b = 2 * (s - 1), 2 * (s - 1) + 1
            if b >= num_classes:
                raise Refusal(f"data.concept swap: cluster {s} swaps classes {a} and {b}, "
                              f"but there are {num_classes}")
            maps[s, [a, b]] = maps[s, [b, a]]
    return maps


DEFAULT_SHIFT = {  # cluster s of S -> the transform's parameter
    "rotation": lambda s, n: s * 360.0 / n,
    "brightness": lambda s, n: 1.0 - 0.6 * s / max(n - 1, 1),
    "noise": lambda s, n: 0.3 * s / max(n - 1, 1),
    "blur": lambda s, n: 1.5 * s / max(n - 1, 1),
}


def shifts(cfg: ScenarioData) -> list[float]:
    """Each cluster's transform parameter (``shift``, else the default)."""
    if cfg.feature == "none":
        return [0.0] * cfg.distributions
    if cfg.shift is not None:
        return [float(v) for v in cfg.shift]
    return [DEFAULT_SHIFT[cfg.feature](s, cfg.distributions) for s in range(cfg.distributions)]


def transform(x: torch.Tensor, feature: str, value: float, generator: torch.Generator | None = None,
              image: bool = True) -> torch.Tensor:
    """Float inputs under one cluster's transform (images [n, C, H, W] in [0, 1])."""
    if feature == "none":
        return x
    if feature in ("rotation", "blur", "brightness") and not image:
        raise Refusal(f"data.feature {feature} needs image data (inputs [n, C, H, W])")
    if feature == "rotation":
        from .images import rotate

        return rotate(x, value)
    if feature == "noise":
        out = x + value * torch.randn(x.shape, generator=generator, dtype=x.dtype)
        return out.clamp_(0.0, 1.0) if image else out
    import torchvision.transforms.functional as TF

    if feature == "brightness":
        return TF.adjust_brightness(x, value)
    if feature == "blur":
        if value <= 0:
            return x
        size = 2 * math.ceil(3 * value) + 1
        size = min(size, 2 * ((min(x.shape[-2:]) - 1) // 2) + 1)
        return TF.gaussian_blur(x, [size, size], [value, value])
    raise ValueError(f"unknown feature shift {feature!r}")


# --------------------------------------------------------------------------- the pools, cached per process
_POOLS: dict[tuple[object, ...], tuple[Pool, DataInfo]] = {}
_LAYOUTS: dict[tuple[str, int], Layout] = {}
_LOCK = threading.RLock()  # layout() holds it while loading the pool


def _plugin_pool(cfg: ScenarioData, seed: int) -> tuple[Pool, DataInfo]:
    base = cfg.base_plugin
    settings = base.settings.model_validate({"name": cfg.base, **cfg.base_settings})
    obj = base.load()(settings, seed)
    hand_over = getattr(obj, "labelled_pool", None)
    info = getattr(obj, "info", None)
    if hand_over is None or not isinstance(info, DataInfo) or info.task != "classification":
        raise Refusal(f"data.base {cfg.base!r}: a scenario needs a classification dataset with labelled_pool() "
                      "(docs/plugins.md#a-labelled-pool)")
    tx, ty, vx, vy = hand_over()
    pool = Pool(torch.as_tensor(np.asarray(tx), dtype=torch.float32), np.asarray(ty, dtype=np.int64),
                torch.as_tensor(np.asarray(vx), dtype=torch.float32), np.asarray(vy, dtype=np.int64),
                info.num_outputs, 1.0)
    if len(pool.train_y) != len(pool.train_x) or len(pool.test_y) != len(pool.test_x):
        raise Refusal(f"data.base {cfg.base!r}: labelled_pool() gave inputs and labels of different lengths")
    return pool, info


def load_pool(cfg: ScenarioData, seed: int) -> tuple[Pool, DataInfo]:
    """The base's pool and its DataInfo (loaded once per process)."""
    if cfg.base in IMAGE_DATASETS:
        from .image_mixture import load_pools
        from .images import default_root

        root = default_root(cfg.base, cfg.root)
        key: tuple[object, ...] = (cfg.base, root)
    else:
        key = (cfg.base, repr(sorted(cfg.base_settings.items())), seed)
    with _LOCK:
        if key not in _POOLS:
            if cfg.base in IMAGE_DATASETS:
                arrays = load_pools(cfg.base, root)[0]  # emnist_letters: the lowercase pool
                shape, classes = IMAGE_DATASETS[cfg.base]
                info = DataInfo(input_dim=int(np.prod(shape)), num_outputs=classes, task="classification",
                                input_shape=shape)
                _POOLS[key] = (Pool(arrays.train_x, arrays.train_y, arrays.test_x, arrays.test_y, classes, 255.0),
                               info)
            else:
                _POOLS[key] = _plugin_pool(cfg, seed)
        return _POOLS[key]


def _info_of(cfg: ScenarioData) -> DataInfo | None:
    """A built-in base's DataInfo, without reading its files."""
    if cfg.base not in IMAGE_DATASETS:
        return None
    shape, classes = IMAGE_DATASETS[cfg.base]
    return DataInfo(input_dim=int(np.prod(shape)), num_outputs=classes, task="classification", input_shape=shape)


class Scenario:
    """A heterogeneity scenario: clients' data and per-cluster holdouts (module docstring)."""

    Settings = ScenarioData

    def __init__(self, cfg: ScenarioData, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        info = _info_of(cfg)
        self.info: DataInfo = info if info is not None else load_pool(cfg, seed)[1]
        self.image = len(self.info.input_shape) == 3
        if cfg.feature in ("rotation", "blur", "brightness") and not self.image:
            raise Refusal(f"data.feature {cfg.feature} needs image data; {cfg.base!r} has inputs of shape "
                          f"{self.info.input_shape or (self.info.input_dim,)}")
        self.shifts = shifts(cfg)

    def pool(self) -> Pool:
        return load_pool(self.cfg, self.seed)[0]

    def layout(self) -> Layout:
        key = (self.cfg.model_dump_json(), self.seed)
        with _LOCK:
            if key not in _LAYOUTS:
                _LAYOUTS[key] = partition(self.cfg, self.pool().train_y, self.seed)
            return _LAYOUTS[key]

    def maps(self) -> np.ndarray:
        return label_maps(self.cfg, self.info.num_outputs, self.seed)

    # ------------------------------------------------------------------ the Dataset hooks
    def client_sizes(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        return np.array([len(i) for i in self.layout().train], dtype=np.int64)

    def client_mixtures(self, num_clients: int, num_dists: int, rng: np.random.Generator) -> np.ndarray:
        return np.eye(num_dists)[cluster_of(num_clients, num_dists)]

    def _samples(self, idx: np.ndarray, s: int, split: str, who: int,
                 test: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        pool = self.pool()
        xs, ys = (pool.test_x, pool.test_y) if test else (pool.train_x, pool.train_y)
        x = torch.as_tensor(np.ascontiguousarray(xs[idx])).float() / pool.scale
        if self.info.input_shape and tuple(x.shape[1:]) != tuple(self.info.input_shape):
            x = x.reshape(len(idx), *self.info.input_shape)
        gen = torch_generator(self.seed, "scenario", "noise", split, who) if self.cfg.feature == "noise" else None
        x = transform(x, self.cfg.feature, self.shifts[s], gen, self.image)
        return x, torch.from_numpy(self.maps()[s][ys[idx]])

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple[torch.Tensor | np.ndarray, ...]:
        lay = self.layout()
        s = int(lay.cluster[k])
        if n != len(lay.train[k]):
            raise ValueError(f"client {k}: {n} samples asked but the partition gives it {len(lay.train[k])}")
        x, y = self._samples(lay.train[k], s, "train", k)
        comps = np.full(n, s, dtype=np.int64)
        if self.cfg.test_fraction == 0:
            return x, y, comps
        tx, ty = self._samples(lay.test[k], s, "test", k)
        return x, y, comps, tx, ty

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same ``test_samples`` of the base's test split for every cluster, under its map and transform."""
        if not 0 <= dist < self.cfg.distributions:
            raise IndexError(f"distribution {dist} out of range 0..{self.cfg.distributions - 1}")
        size = len(self.pool().test_y)
        idx = numpy_rng(self.seed, "scenario", "holdout").permutation(size)[: min(self.cfg.test_samples, size)]
        return self._samples(idx, dist, "holdout", dist, test=True)

    def label_counts(self, k: int) -> dict[str, np.ndarray]:
        """Client k's count of each (mapped) label in its train and test splits, from the indices alone."""
        lay, pool = self.layout(), self.pool()
        m = self.maps()[int(lay.cluster[k])]
        c = self.info.num_outputs
        return {split: np.bincount(m[pool.train_y[idx]], minlength=c)
                for split, idx in (("train", lay.train[k]), ("test", lay.test[k]))}
