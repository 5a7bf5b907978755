"""Rotated image mixtures (FedSoft, Experiments): distribution s = (base image pool, angle).

- ``fmnist`` / ``cifar10`` / ``cifar100``: every distribution draws from the whole train
  split, rotated by ``data.rotations[s]`` (default s * 360 / S degrees).
- ``emnist_letters``: S = 1: lowercase 0; S = 2: lowercase 0, uppercase 0; S = 4: lowercase 0,
  uppercase 0, lowercase 90, uppercase 90 (``data.rotations`` overrides the angles).

Each distribution s has its own permutation of its train pool. Client k takes, for component
s, the next ``count`` indices of that permutation after those of clients 0..k-1, so clients'
samples are disjoint while the pool lasts (then indices wrap around). These offsets need every
client's counts: the owner calls :meth:`ImageMixture.set_layout` (or passes ``sizes`` and
``mixtures`` to the constructor) once, which costs O(N * S). Construction reads no files
(only ``info`` is needed on the driver); the arrays are loaded on the first ``client`` or
``holdout`` call and cached per process, keyed by (dataset, folder), so an actor hosting many
clients reads the files once.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from ..catalog import IMAGE_DATASETS, ImageData
from ..models import DataInfo
from ..rng import numpy_rng
from .images import (
    ImageArrays,
    check_files,
    default_root,
    load_cifar,
    load_emnist_letters,
    load_fmnist,
    rotate,
)
from .partition import component_counts

__all__ = ["DATASETS", "ImageMixture", "distribution_specs", "load_pools"]

DATASETS = IMAGE_DATASETS  # name -> ((C, H, W), number of classes)
_EMNIST_SPECS = ((0, 0.0), (1, 0.0), (0, 90.0), (1, 90.0))  # pools: 0 lowercase, 1 uppercase


def distribution_specs(name: str, num: int, rotations: list[float] | None = None) -> list[tuple[int, float]]:
    """(base pool index, rotation in degrees) of each of the ``num`` distributions."""
    if name not in DATASETS:
        raise ValueError(f"unknown image dataset {name!r} (known: {', '.join(DATASETS)})")
    if name == "emnist_letters":
        if num not in (1, 2, 4):
            raise ValueError(f"emnist_letters has 1, 2 or 4 distributions, got {num}")
        specs = list(_EMNIST_SPECS[:num])
    else:
        specs = [(0, s * 360.0 / num) for s in range(num)]
    if rotations is not None:
        if len(rotations) != num:
            raise ValueError(f"rotations has {len(rotations)} angles but there are {num} distributions")
        specs = [(base, float(angle)) for (base, _), angle in zip(specs, rotations)]
    return specs


_CACHE: dict[tuple[str, str], tuple[ImageArrays, ...]] = {}
_LOCK = threading.Lock()


def _load(name: str, folder: str) -> tuple[ImageArrays, ...]:
    if name == "fmnist":
        return (load_fmnist(folder),)
    if name == "emnist_letters":
        return load_emnist_letters(folder)
    if name in ("cifar10", "cifar100"):
        return (load_cifar(folder, DATASETS[name][1]),)
    raise ValueError(f"unknown image dataset {name!r}")


def load_pools(name: str, folder: str) -> tuple[ImageArrays, ...]:
    """The base pools of a dataset (emnist_letters: lowercase, uppercase), loaded once per process."""
    key = (name, os.path.abspath(folder))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load(name, folder)
        return _CACHE[key]


def _to_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)


class ImageMixture:
    """Generator of clients' training sets and per-distribution holdout sets of rotated images."""

    def __init__(
        self,
        cfg: ImageData,
        seed: int,
        sizes: np.ndarray | None = None,
        mixtures: np.ndarray | None = None,
    ) -> None:
        if cfg.name not in DATASETS:
            raise ValueError(f"unknown image dataset {cfg.name!r} (known: {', '.join(DATASETS)})")
        self.cfg = cfg
        self.seed = seed
        self.root = default_root(cfg.name, cfg.root)  # raises MissingDataError if unset (not fmnist)
        self.specs = distribution_specs(cfg.name, cfg.distributions, cfg.rotations)
        self.image_shape, num_classes = DATASETS[cfg.name]
        c, h, w = self.image_shape
        self.info = DataInfo(
            input_dim=c * h * w, num_outputs=num_classes, task="classification", input_shape=self.image_shape
        )
        self._counts: np.ndarray | None = None
        self._offsets: np.ndarray | None = None
        self._perms: dict[int, np.ndarray] = {}
        if sizes is not None or mixtures is not None:
            if sizes is None or mixtures is None:
                raise ValueError("pass both sizes and mixtures, or neither")
            self.set_layout(sizes, mixtures)

    # ------------------------------------------------------------------ layout
    def set_layout(self, sizes: np.ndarray, mixtures: np.ndarray) -> None:
        """Every client's size n_k [N] and shares [N, S]: fixes where each client's samples start."""
        if len(sizes) != len(mixtures):
            raise ValueError(f"{len(sizes)} sizes but {len(mixtures)} mixture rows")
        counts = np.stack([component_counts(int(n), np.asarray(m)) for n, m in zip(sizes, mixtures)])
        if counts.shape[1] != len(self.specs):
            raise ValueError(
                f"mixtures have {counts.shape[1]} components but there are {len(self.specs)} distributions"
            )
        self._counts = counts
        self._offsets = np.cumsum(counts, axis=0) - counts

    def check_files(self) -> None:
        """Raise MissingDataError now if the dataset's files are absent (stat only, no reading)."""
        check_files(self.cfg.name, self.root)

    def pools(self) -> tuple[ImageArrays, ...]:
        """The base pools (loaded on first use, cached per process)."""
        return load_pools(self.cfg.name, self.root)

    def _perm(self, s: int, size: int) -> np.ndarray:
        if s not in self._perms:
            self._perms[s] = numpy_rng(self.seed, "images", "perm", s).permutation(size)
        return self._perms[s]

    # ------------------------------------------------------------------ data
    def client(self, k: int, n: int, shares: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(x [n, C, H, W] float in [0, 1], y [n] int64, component of each sample) of client k."""
        if self._counts is None or self._offsets is None:
            raise RuntimeError("ImageMixture.client: call set_layout(sizes, mixtures) first")
        if not 0 <= k < len(self._counts):
            raise IndexError(f"client {k} out of range 0..{len(self._counts) - 1}")
        counts = component_counts(n, np.asarray(shares))
        if not np.array_equal(counts, self._counts[k]):
            raise ValueError(
                f"client {k}: counts {counts.tolist()} differ from the layout's {self._counts[k].tolist()}"
            )
        pools = self.pools()
        xs, ys, comps = [], [], []
        for s, c in enumerate(counts.tolist()):
            if c == 0:
                continue
            base, angle = self.specs[s]
            pool = pools[base]
            perm = self._perm(s, len(pool.train_y))
            idx = perm[(int(self._offsets[k, s]) + np.arange(c)) % len(perm)]
            xs.append(rotate(_to_float(pool.train_x[idx]), angle))
            ys.append(pool.train_y[idx])
            comps.append(np.full(c, s, dtype=np.int64))
        if not xs:
            empty = torch.empty((0, *self.image_shape))
            return empty, torch.empty(0, dtype=torch.int64), np.empty(0, np.int64)
        order = numpy_rng(self.seed, "images", "client", k).permutation(n)
        x = torch.cat(xs)[torch.from_numpy(order)]
        y = torch.from_numpy(np.concatenate(ys)[order])
        return x, y, np.concatenate(comps)[order]

    def label_counts(self, k: int) -> dict[str, np.ndarray]:
        """Client k's count of each label (its training set; it has no test split), from the
        layout's indices: the same samples as :meth:`client`, no image is converted."""
        if self._counts is None or self._offsets is None:
            raise RuntimeError("ImageMixture.label_counts: call set_layout(sizes, mixtures) first")
        pools = self.pools()
        counts = np.zeros(self.info.num_outputs, dtype=np.int64)
        for s, c in enumerate(self._counts[k].tolist()):
            if c:
                pool = pools[self.specs[s][0]]
                perm = self._perm(s, len(pool.train_y))
                idx = perm[(int(self._offsets[k, s]) + np.arange(c)) % len(perm)]
                counts += np.bincount(pool.train_y[idx], minlength=self.info.num_outputs)
        return {"train": counts}

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``test_samples`` of a permutation of distribution ``dist``'s test split, rotated."""
        if not 0 <= dist < len(self.specs):
            raise IndexError(f"distribution {dist} out of range 0..{len(self.specs) - 1}")
        base, angle = self.specs[dist]
        pool = self.pools()[base]
        size = len(pool.test_y)
        perm = numpy_rng(self.seed, "images", "test", dist).permutation(size)
        idx = perm[: min(self.cfg.test_samples, size)]
        return rotate(_to_float(pool.test_x[idx]), angle), torch.from_numpy(pool.test_y[idx])
