"""LEAF's natural partitions, read from the JSON files LEAF's preprocessing writes: FEMNIST (a
client per writer) and Shakespeare (a client per speaking role).

LEAF (``data/<name>/preprocess.sh``) writes ``data/<name>/data/train/*.json`` and
``data/<name>/data/test/*.json``, each ``{"users": [...], "num_samples": [...], "user_data":
{user: {"x": [...], "y": [...]}}}``; a user's samples are split between its train and test files.

- ``femnist``: ``x`` is 784 floats in [0, 1] (a 28x28 character, white 1.0), ``y`` one of 62
  classes (digits, uppercase, lowercase); a client's ``x`` is ``[n, 1, 28, 28]``.
- ``shakespeare``: ``x`` is a line of 80 characters, ``y`` the character that follows; each is
  an index into LEAF's 80 characters (:data:`raysoft.catalog.LEAF_CHARS`), ``x`` ``[n, 80]``
  int64. A character outside them is refused, naming it and its file.

Which writers (roles) become the ``data.clients`` clients (``data.select``): ``random``, drawn
from the data seed (``data.seed``, else the run's), then kept in the files' order; ``largest``,
those with the most train samples (ties in the files' order); ``first``, the first in the files'
order (files by name, users as listed). Writers with fewer than ``data.min_samples`` train
samples are never chosen. A client holds exactly its writer's train samples (in the files'
order) and, as its own test split, its writer's test samples. There is one distribution (no
known clusters): its holdout set is the first ``data.test_samples`` of a seeded permutation of
the chosen writers' test samples.

The files are read once per process (cached by dataset and folder), each user's samples kept as
compact numpy arrays: the whole of FEMNIST (3,500 writers, 800k samples) takes about 2.5 GB
per process; LEAF's sampled versions (``--sf 0.05``) a twentieth of that.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..catalog import LEAF_CHARS, LEAF_DATASETS, LeafData
from ..datafiles.leaf_files import leaf_json_files, leaf_root
from ..errors import DataFileError, one_line
from ..models import DataInfo
from ..rng import numpy_rng

__all__ = ["LeafClients", "LeafFiles", "choose", "read_leaf"]

_CHAR_INDEX = {c: i for i, c in enumerate(LEAF_CHARS)}


@dataclass(frozen=True)
class LeafFiles:
    """Every user of a LEAF dataset, in the files' order: train and test arrays per user."""

    users: list[str]
    train: dict[str, tuple[np.ndarray, np.ndarray]]
    test: dict[str, tuple[np.ndarray, np.ndarray]]


def _tokens(lines: list, path: str, user: str) -> np.ndarray:
    """Lines of text as LEAF's character indices [n, L] (uint8)."""
    try:
        out = np.array([[_CHAR_INDEX[c] for c in line] for line in lines], dtype=np.uint8)
    except KeyError as err:
        raise DataFileError(f"{path}: user {user!r}: character {err.args[0]!r} is not one of LEAF's 80") from None
    except (TypeError, ValueError) as err:  # not strings, or lines of different lengths
        raise DataFileError(f"{path}: user {user!r}: x must be lines of one length ({one_line(err)})") from None
    return out


def _arrays(name: str, x: list, y: list, path: str, user: str) -> tuple[np.ndarray, np.ndarray]:
    if len(x) != len(y):
        raise DataFileError(f"{path}: user {user!r} has {len(x)} x but {len(y)} y")
    shape, classes = LEAF_DATASETS[name]
    if name == "shakespeare":
        xs, ys = _tokens(x, path, user), _tokens(y, path, user)
        if len(x) and (xs.shape[1] != shape[0] or ys.shape[1] != 1):
            raise DataFileError(f"{path}: user {user!r}: expected lines of {shape[0]} characters and one next "
                                f"character, got {xs.shape[1]} and {ys.shape[1]}")
        return xs.reshape(len(x), *shape), ys.reshape(-1).astype(np.int64)
    try:
        xs = np.asarray(x, dtype=np.float32).reshape(len(x), *shape)
        ys = np.asarray(y, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise DataFileError(f"{path}: user {user!r}: expected x of 784 numbers and integer y ({one_line(err)})") \
            from None
    if len(ys) and (ys.min() < 0 or ys.max() >= classes):
        raise DataFileError(f"{path}: user {user!r}: labels must be in 0..{classes - 1}, got {ys.min()}..{ys.max()}")
    return xs, ys


def _read_split(name: str, root: str, split: str) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    users: list[str] = []
    data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for path in leaf_json_files(root, split, name):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            listed, user_data = doc["users"], doc["user_data"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataFileError(f"{path}: not a LEAF JSON file ({type(err).__name__}: {one_line(err)})") from None
        for user in listed:
            if user not in user_data:
                raise DataFileError(f"{path}: user {user!r} is listed but has no user_data")
            if user in data:
                raise DataFileError(f"{path}: user {user!r} appears in two {split} files")
            entry = user_data[user]
            data[user] = _arrays(name, entry.get("x", []), entry.get("y", []), path, user)
            users.append(user)
        del doc, user_data
    return users, data


_CACHE: dict[tuple[str, str], LeafFiles] = {}
_LOCK = threading.Lock()


def read_leaf(name: str, root: str) -> LeafFiles:
    """A LEAF dataset's train and test users (read once per process)."""
    if name not in LEAF_DATASETS:
        raise ValueError(f"unknown LEAF dataset {name!r} (known: {', '.join(LEAF_DATASETS)})")
    key = (name, os.path.abspath(root))
    with _LOCK:
        if key not in _CACHE:
            users, train = _read_split(name, root, "train")
            _, test = _read_split(name, root, "test")
            _CACHE[key] = LeafFiles(users, train, test)
        return _CACHE[key]


def choose(sizes: np.ndarray, num: int, how: str, rng: np.random.Generator) -> np.ndarray:
    """Indices of the ``num`` chosen among candidates of these sizes, in their order: ``random``
    (drawn from ``rng``), ``largest`` (ties by order) or ``first``."""
    if num > len(sizes):
        raise ValueError(f"data.clients is {num} but there are only {len(sizes)} to choose from")
    if how == "first":
        return np.arange(num)
    if how == "largest":
        return np.sort(np.argsort(-np.asarray(sizes), kind="stable")[:num])
    if how == "random":
        return np.sort(rng.choice(len(sizes), size=num, replace=False))
    raise ValueError(f"unknown selection {how!r}")


class LeafClients:
    """FEMNIST's writers or Shakespeare's roles as clients (see the module's doc)."""

    def __init__(self, cfg: LeafData, seed: int) -> None:
        if cfg.name not in LEAF_DATASETS:
            raise ValueError(f"dataset {cfg.name!r} is not a LEAF dataset ({', '.join(LEAF_DATASETS)})")
        self.cfg = cfg
        self.seed = seed
        self.root = leaf_root(cfg.name, cfg.root)
        shape, classes = LEAF_DATASETS[cfg.name]
        self.info = DataInfo(input_dim=int(np.prod(shape)), num_outputs=classes, task="classification",
                             input_shape=shape)
        self._chosen: list[str] | None = None

    def writers(self) -> list[str]:
        """The chosen writers (roles), client k the k-th."""
        if self._chosen is None:
            files = read_leaf(self.cfg.name, self.root)
            candidates = [u for u in files.users if len(files.train[u][1]) >= self.cfg.min_samples]
            sizes = np.array([len(files.train[u][1]) for u in candidates], dtype=np.int64)
            try:
                idx = choose(sizes, self.cfg.clients, self.cfg.select,
                             numpy_rng(self.seed, "leaf", self.cfg.name, "writers"))
            except ValueError as err:
                raise ValueError(f"{self.cfg.name}: {err} (writers with at least {self.cfg.min_samples} train "
                                 f"samples in {self.root})") from None
            self._chosen = [candidates[i] for i in idx]
        return self._chosen

    def client_sizes(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Each chosen writer's number of train samples."""
        files = read_leaf(self.cfg.name, self.root)
        return np.array([len(files.train[u][1]) for u in self.writers()], dtype=np.int64)

    def client_mixtures(self, num_clients: int, distributions: int, rng: np.random.Generator) -> np.ndarray:
        return np.ones((num_clients, 1))

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        xt = torch.from_numpy(x.astype(np.int64) if self.cfg.name == "shakespeare" else x)
        return xt, torch.from_numpy(y)

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple:
        """Writer k's train samples, each of distribution 0, and its test samples."""
        files = read_leaf(self.cfg.name, self.root)
        user = self.writers()[k]
        x, y = self._tensors(*files.train[user])
        if len(y) != n:
            raise ValueError(f"client {k} ({user}): {len(y)} samples, the layout says {n}")
        test = files.test.get(user)
        if test is None:
            empty = np.empty((0, *self.info.input_shape), dtype=files.train[user][0].dtype)
            test = (empty, np.empty(0, dtype=np.int64))
        tx, ty = self._tensors(*test)
        return x, y, np.zeros(n, dtype=np.int64), tx, ty

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A seeded sample of ``test_samples`` of the chosen writers' test samples."""
        if dist != 0:
            raise IndexError(f"distribution {dist} out of range 0..0")
        files = read_leaf(self.cfg.name, self.root)
        parts = [files.test[u] for u in self.writers() if u in files.test]
        if not parts:
            raise DataFileError(f"{self.cfg.name}: none of the chosen writers has test samples in {self.root}/test")
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        idx = numpy_rng(self.seed, "leaf", self.cfg.name, "holdout").permutation(len(y))[: self.cfg.test_samples]
        return self._tensors(x[idx], y[idx])
