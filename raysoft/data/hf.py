"""A Hugging Face dataset split into clients by a Flower Datasets partitioner (``data.name: hf``;
the optional extra ``pip install 'raysoft[hf]'``).

The split ``data.split`` of ``data.path`` is read with ``datasets``: a hub id
(``load_dataset(path, subset, split=...)``, cached by ``datasets`` in ``~/.cache/huggingface``), a
folder written by ``save_to_disk`` (``load_from_disk``), a folder of data files, or Parquet files
(a path or glob ending ``.parquet``). It is given to the partitioner ``data.partitioner``, a class
of ``flwr_datasets.partitioner`` made with ``data.partitioner_args``; where the class takes them
and the arguments do not say, ``num_partitions`` is ``data.clients``, ``seed`` the data seed and
``partition_by`` the label column. When it makes more partitions than ``data.clients``
(``NaturalIdPartitioner``: one per writer, role, user), ``data.select`` chooses which, as for
LEAF's datasets (:func:`raysoft.data.leaf.choose`).

Client k holds partition ``p_k``: ``int(client_test * len)`` of its samples make the client's
own test split, the rest, in the partition's order, its train set; the test samples are drawn by
a seeded permutation (``client_test_from: random``) or are the partition's last ones (``end``:
temporal data, such as Shakespeare's lines). There is one distribution: its holdout set is
``data.test_samples`` drawn from ``data.test_split`` where given, else from the clients' test
splits.

Inputs (``data.features``): images (``[n, C, H, W]`` floats in [0, 1]), numbers (vectors,
float32), or text (LEAF's 80 characters, one token each: ``[n, L]`` int64, for ``char_lstm``).
Labels (``data.label``): class ids (a ``ClassLabel`` or integers), one character each for text,
else class names mapped to ids in sorted order.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..catalog import LEAF_CHARS, HFData
from ..errors import DataFileError, one_line
from ..models import DataInfo

if TYPE_CHECKING:
    from datasets import Dataset
    from flwr_datasets.partitioner import Partitioner
from ..rng import numpy_rng
from .leaf import choose

__all__ = ["HFClients", "load_split", "make_partitioner"]

_EXTRA = "pip install 'raysoft[hf]'"
_CHAR_INDEX = {c: i for i, c in enumerate(LEAF_CHARS)}


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError(f"data.name hf needs the datasets package: {_EXTRA}") from None
    return datasets


def load_split(path: str, subset: str | None, split: str) -> Dataset:
    """One split of a dataset (a ``datasets.Dataset``), from the hub, a saved folder or files."""
    datasets = _datasets()
    try:
        if os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f))
                                       for f in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(path)
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise ValueError(f"no split {split!r} (has {', '.join(ds)})")
                ds = ds[split]
            return ds
        if path.endswith(".parquet"):
            return datasets.load_dataset("parquet", data_files={split: path}, split=split)
        return datasets.load_dataset(path, subset, split=split)
    except (OSError, ValueError, KeyError, ConnectionError) as err:
        raise DataFileError(f"hf: cannot load split {split!r} of {path} ({type(err).__name__}: {one_line(err)})") \
            from None


def make_partitioner(name: str, args: Mapping[str, object], clients: int, seed: int, label: str) -> Partitioner:
    """``flwr_datasets.partitioner.<name>(**args)``, with the defaults the module's doc names."""
    try:
        from flwr_datasets import partitioner as fp
    except ImportError:
        raise ImportError(f"data.name hf needs the flwr-datasets package: {_EXTRA}") from None
    cls = getattr(fp, name, None)
    if not (isinstance(cls, type) and issubclass(cls, fp.Partitioner)) or cls is fp.Partitioner:
        known = sorted(n for n in dir(fp) if n.endswith("Partitioner") and n != "Partitioner")
        raise ValueError(f"data.partitioner: {name!r} is not one of flwr_datasets.partitioner's ({', '.join(known)})")
    params = inspect.signature(cls).parameters
    full = dict(args)
    defaults = {"num_partitions": clients, "seed": seed, "partition_by": label}
    for key, value in defaults.items():
        if key in params and key not in full and not (key == "partition_by" and name.startswith(("NaturalId",
                                                                                                 "GroupedNaturalId"))):
            full[key] = value
    try:
        return cls(**full)
    except (TypeError, ValueError) as err:
        raise ValueError(f"data.partitioner {name}({', '.join(f'{k}={v!r}' for k, v in full.items())}): "
                         f"{one_line(err)}") from None


def _text_tokens(lines: np.ndarray, where: str) -> np.ndarray:
    try:
        return np.array([[_CHAR_INDEX[c] for c in str(line)] for line in lines], dtype=np.int64)
    except KeyError as err:
        raise DataFileError(f"hf: {where}: character {err.args[0]!r} is not one of LEAF's 80") from None
    except ValueError:
        raise DataFileError(f"hf: {where}: text of different lengths (a client's lines must have one length)") \
            from None


class _Columns:
    """How the feature and label columns become tensors (fixed once from the whole split)."""

    def __init__(self, ds: Dataset, cfg: HFData) -> None:
        missing = [c for c in (cfg.features, cfg.label) if c not in ds.column_names]
        if missing:
            raise DataFileError(f"hf: {cfg.path} has no column {missing[0]!r} (columns: {', '.join(ds.column_names)})")
        self.cfg = cfg
        first = ds.select_columns([cfg.features]).with_format("numpy")[:1][cfg.features]
        self.text = first.dtype.kind in "US"
        feature = ds.features[cfg.label]
        self.names: list[str] | None = None
        if self.text:
            classes = len(LEAF_CHARS)
        elif getattr(feature, "num_classes", None):
            classes = int(feature.num_classes)
        else:
            labels = ds.select_columns([cfg.label]).with_format("numpy")[:][cfg.label]
            if labels.dtype.kind in "US":
                self.names = sorted({str(v) for v in labels})
                classes = len(self.names)
            else:
                classes = int(labels.max()) + 1
        self.classes = cfg.num_classes or classes
        x = self.inputs(first)
        self.shape: tuple[int, ...] = tuple(x.shape[1:]) if (self.text or x.dim() == 4) else ()
        dim = int(np.prod(x.shape[1:]))
        self.info = DataInfo(input_dim=dim, num_outputs=self.classes, task="classification", input_shape=self.shape)

    def inputs(self, x: np.ndarray) -> torch.Tensor:
        if self.text:
            return torch.from_numpy(_text_tokens(x, f"column {self.cfg.features!r}"))
        if x.dtype == object:
            raise DataFileError(f"hf: column {self.cfg.features!r}: inputs of different shapes")
        if x.ndim == 3:  # grey images [n, H, W]
            x = x[:, None]
        elif x.ndim == 4:  # [n, H, W, C]
            x = x.transpose(0, 3, 1, 2)
        elif x.ndim == 1:
            x = x[:, None]
        t = torch.from_numpy(np.ascontiguousarray(x))
        return t.float().div_(255.0) if t.dtype == torch.uint8 and t.dim() == 4 else t.float()

    def labels(self, y: np.ndarray) -> torch.Tensor:
        if self.text:
            return torch.from_numpy(_text_tokens(y, f"column {self.cfg.label!r}").reshape(-1))
        if self.names is not None:
            index = {n: i for i, n in enumerate(self.names)}
            return torch.tensor([index[str(v)] for v in y], dtype=torch.int64)
        out = torch.from_numpy(np.asarray(y).astype(np.int64))
        if len(out) and (out.min() < 0 or out.max() >= self.classes):
            raise DataFileError(f"hf: labels must be in 0..{self.classes - 1}, got {int(out.min())}..{int(out.max())}")
        return out

    def tensors(self, ds: Dataset, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        batch = ds.select_columns([self.cfg.features, self.cfg.label]).with_format("numpy")[rows.tolist()]
        if len(rows) == 0:
            dtype = torch.int64 if self.text else torch.float32
            empty = torch.empty((0, *(self.shape or (self.info.input_dim,))), dtype=dtype)
            return empty, torch.empty(0, dtype=torch.int64)
        return self.inputs(batch[self.cfg.features]), self.labels(batch[self.cfg.label])


class _Loaded:
    """A split, its partitioner and the chosen partitions (one per process and settings)."""

    def __init__(self, cfg: HFData, seed: int) -> None:
        self.ds = load_split(cfg.path, cfg.subset, cfg.split)
        self.columns = _Columns(self.ds, cfg)
        self.partitioner = make_partitioner(cfg.partitioner, cfg.partitioner_args, cfg.clients, seed, cfg.label)
        self.partitioner.dataset = self.ds
        total = int(self.partitioner.num_partitions)
        sizes = np.array([len(self.partitioner.load_partition(i)) for i in range(total)], dtype=np.int64)
        try:
            self.chosen = choose(sizes, cfg.clients, cfg.select, numpy_rng(seed, "hf", "partitions"))
        except ValueError as err:
            raise ValueError(f"hf: {err} (partitions of {cfg.partitioner})") from None
        self.splits: list[tuple[np.ndarray, np.ndarray]] = []
        for k, p in enumerate(self.chosen.tolist()):
            n = int(sizes[p])
            cut = int(cfg.client_test * n)
            if cfg.client_test_from == "end":
                self.splits.append((np.arange(n - cut), np.arange(n - cut, n)))
                continue
            perm = numpy_rng(seed, "hf", "client_test", k).permutation(n)
            self.splits.append((np.sort(perm[cut:]), np.sort(perm[:cut])))


_CACHE: dict[tuple[str, int], _Loaded] = {}
_LOCK = threading.Lock()


class HFClients:
    """Clients of a Hugging Face dataset, one per chosen partition (see the module's doc)."""

    def __init__(self, cfg: HFData, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.info: DataInfo = self._loaded().columns.info

    def _loaded(self) -> _Loaded:
        key = (self.cfg.model_dump_json(), self.seed)
        with _LOCK:
            if key not in _CACHE:
                _CACHE[key] = _Loaded(self.cfg, self.seed)
            return _CACHE[key]

    def client_sizes(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        return np.array([len(train) for train, _ in self._loaded().splits], dtype=np.int64)

    def client_mixtures(self, num_clients: int, distributions: int, rng: np.random.Generator) -> np.ndarray:
        return np.ones((num_clients, 1))

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple:
        """Partition k's train samples (each of distribution 0) and its own test split."""
        loaded = self._loaded()
        part = loaded.partitioner.load_partition(int(loaded.chosen[k]))
        train, test = loaded.splits[k]
        if len(train) != n:
            raise ValueError(f"client {k}: {len(train)} samples, the layout says {n}")
        x, y = loaded.columns.tensors(part, train)
        tx, ty = loaded.columns.tensors(part, test)
        return x, y, np.zeros(n, dtype=np.int64), tx, ty

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``test_samples`` of ``test_split``, else of the clients' own test splits (seeded)."""
        if dist != 0:
            raise IndexError(f"distribution {dist} out of range 0..0")
        loaded = self._loaded()
        rng = numpy_rng(self.seed, "hf", "holdout")
        if self.cfg.test_split is not None:
            ds = load_split(self.cfg.path, self.cfg.subset, self.cfg.test_split)
            idx = np.sort(rng.permutation(len(ds))[: self.cfg.test_samples])
            return loaded.columns.tensors(ds, idx)
        parts = [self.client(k, len(loaded.splits[k][0]), np.ones(1))[3:] for k in range(len(loaded.chosen))]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        if len(y) == 0:
            raise ValueError("hf: no test samples for the holdout set: set data.test_split or data.client_test > 0")
        pick = torch.from_numpy(rng.permutation(len(y))[: self.cfg.test_samples])
        return x[pick], y[pick]
