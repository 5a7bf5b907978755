"""A dataset plug-in that reads the user's own files: one ``client_<k>.npz`` per client and one
``holdout_<s>.npz`` per distribution, in ``data.folder`` (the format is in README.md).

Use it as ``data: {name: npz_clients:NpzClients, folder: data, clients: N, distributions: S}``
from the folder that holds this file (or with this file's folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from raysoft.sdk import DataConfig, DataInfo

REQUIRED = ("x", "y")


class NpzSettings(DataConfig):
    """The ``data`` section of an npz run: DataConfig's keys (``clients`` and ``distributions``
    must match the files; ``partition`` (recorded as ``random``), ``samples_*`` and ``test_samples``
    are not used) plus the folder."""

    folder: str = Field(description="folder of client_<k>.npz and holdout_<s>.npz; a relative path is taken "
                                    "from the directory the run starts in, and recorded as absolute")
    num_classes: int | None = Field(None, ge=2, description="classification: the number of classes; default the "
                                                            "largest label in the files + 1")

    @model_validator(mode="before")
    @classmethod
    def _partition_unused(cls, raw: Any) -> Any:
        # the mixtures come from the files: DataConfig's default partition (10:90, which needs
        # S = 2) would refuse files of other numbers of distributions for a key that is not used
        if isinstance(raw, Mapping) and raw.get("partition") is None:
            raw = {**raw, "partition": "random"}
        return raw

    @field_validator("folder")
    @classmethod
    def _absolute(cls, v: str) -> str:
        # pinned on the driver, so that actors (whose working directory is Ray's) find the same folder
        return str(Path(v).expanduser().absolute())


def _header(zf: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of array ``name`` of an open .npz, read from its .npy header only."""
    with zf.open(f"{name}.npy") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(shape), np.dtype(dtype)


def _arrays(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{array name: (shape, dtype)} of an .npz file, without reading the data."""
    with zipfile.ZipFile(path) as zf:
        names = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
        return {n: _header(zf, n) for n in names}


def _kind(dtype: np.dtype) -> str:
    if dtype.kind == "f":
        return "regression"
    if dtype.kind in "iub":
        return "classification"
    raise ValueError(f"y has dtype {dtype}: expected floats (regression) or integers (classification)")


class NpzClients:
    """Clients and holdout sets read from .npz files (see README.md for the format)."""

    Settings = NpzSettings

    def __init__(self, settings: NpzSettings, seed: int) -> None:
        self.cfg = settings
        self.folder = Path(settings.folder)
        first = _arrays(self.client_path(0))
        x_shape, y_dtype = first["x"][0], first["y"][1]
        task = _kind(y_dtype)
        if task == "classification":
            classes = settings.num_classes or self._max_label() + 1
        else:
            classes = 1
        feature_shape = tuple(int(d) for d in x_shape[1:])
        self.info = DataInfo(input_dim=int(np.prod(feature_shape)), num_outputs=int(classes), task=task,
                             input_shape=feature_shape if len(feature_shape) > 1 else ())

    # ------------------------------------------------------------------ files
    def client_path(self, k: int) -> Path:
        return self.folder / f"client_{k}.npz"

    def holdout_path(self, s: int) -> Path:
        return self.folder / f"holdout_{s}.npz"

    def _paths(self) -> list[Path]:
        return ([self.client_path(k) for k in range(self.cfg.clients)]
                + [self.holdout_path(s) for s in range(self.cfg.distributions)])

    def _max_label(self) -> int:
        top = 0
        for path in self._paths():
            with np.load(path) as z:
                for name in ("y", "test_y"):
                    if name in z.files and z[name].size:
                        top = max(top, int(z[name].max()))
        return top

    # ------------------------------------------------------------------ the dataset protocol
    def client_sizes(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Each client's number of training samples: the length of its ``y``."""
        return np.array([_arrays(self.client_path(k))["y"][0][0] for k in range(num_clients)], dtype=np.int64)

    def client_mixtures(self, num_clients: int, distributions: int, rng: np.random.Generator) -> np.ndarray:
        """[N, S] true mixtures: each file's ``mixture``, else the shares of its ``component``
        labels, else (one distribution) 1."""
        return np.stack([self._mixture(k, distributions) for k in range(num_clients)])

    def _mixture(self, k: int, distributions: int) -> np.ndarray:
        with np.load(self.client_path(k)) as z:
            if "mixture" in z.files:
                return np.asarray(z["mixture"], dtype=float)
            if "component" in z.files:
                comp = np.asarray(z["component"], dtype=np.int64)
                return np.bincount(comp, minlength=distributions) / max(len(comp), 1)
        return np.ones(distributions)  # verify() allows this for one distribution only

    def client(self, k: int, n: int, shares: np.ndarray) -> tuple[Any, ...]:
        """(x, y, component of each sample[, test_x, test_y]) of client k, as in its file."""
        with np.load(self.client_path(k)) as z:
            arrays = {name: z[name] for name in z.files}
        x, y = self._x(arrays["x"]), self._y(arrays["y"])
        if "component" in arrays:
            comp = np.asarray(arrays["component"], dtype=np.int64)
        else:  # unknown per sample: the client's main distribution
            comp = np.full(len(y), int(np.argmax(shares)), dtype=np.int64)
        if "test_x" in arrays:
            return x, y, comp, self._x(arrays["test_x"]), self._y(arrays["test_y"])
        return x, y, comp

    def holdout(self, dist: int) -> tuple[torch.Tensor, torch.Tensor]:
        with np.load(self.holdout_path(dist)) as z:
            return self._x(z["x"]), self._y(z["y"])

    def _x(self, x: np.ndarray) -> torch.Tensor:
        out = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return out.reshape(len(out), *self.info.input_shape) if self.info.input_shape else out.reshape(len(out), -1)

    def _y(self, y: np.ndarray) -> torch.Tensor:
        if self.info.task == "regression":
            return torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
        return torch.from_numpy(np.asarray(y, dtype=np.int64))

    # ------------------------------------------------------------------ checked on the driver
    @classmethod
    def verify(cls, settings: NpzSettings) -> None:
        """Refuse (ValueError naming the first bad file) a folder that lacks a file or an array, or
        whose arrays do not fit together; reads the arrays' headers, and only the small
        ``mixture`` and ``component`` arrays."""
        folder = Path(settings.folder)
        if not folder.is_dir():
            raise ValueError(f"folder {str(folder)!r} does not exist (make it with make_files.py, or set data.folder)")
        S = settings.distributions
        feature, kind = None, None

        def check_xy(path: Path, arrays: dict, x: str, y: str) -> int:
            nonlocal feature, kind
            for name in (x, y):
                if name not in arrays:
                    raise ValueError(f"{path}: has no array {name!r} (it has {', '.join(sorted(arrays)) or 'none'})")
            (xs, _), (ys, ydt) = arrays[x], arrays[y]
            try:
                ykind = _kind(ydt)
            except ValueError as err:
                raise ValueError(f"{path}: {err}") from None
            if len(ys) != 1:
                raise ValueError(f"{path}: {y} must be one-dimensional (got shape {ys})")
            if len(xs) < 2 or xs[0] != ys[0]:
                raise ValueError(f"{path}: {x} must be [samples, features...] with as many rows as {y} "
                                 f"(got {x} {xs}, {y} {ys})")
            if feature is None:
                feature, kind = xs[1:], ykind
            elif xs[1:] != feature:
                raise ValueError(f"{path}: {x} has features of shape {xs[1:]}, the first client's have {feature}")
            elif ykind != kind:
                raise ValueError(f"{path}: {y} has dtype {ydt} ({ykind}) but the first client's is {kind}")
            return int(ys[0])

        for k in range(settings.clients):
            path = folder / f"client_{k}.npz"
            arrays = cls._open(path, f"data.clients is {settings.clients}: client_0..client_{settings.clients - 1}")
            n = check_xy(path, arrays, "x", "y")
            if n == 0:
                raise ValueError(f"{path}: has no samples")
            if ("test_x" in arrays) != ("test_y" in arrays):
                raise ValueError(f"{path}: has one of test_x and test_y: give both or neither")
            if "test_x" in arrays:
                check_xy(path, arrays, "test_x", "test_y")
            with np.load(path) as z:
                if "mixture" in arrays:
                    m = np.asarray(z["mixture"], dtype=float)
                    if m.shape != (S,) or (m < 0).any() or abs(m.sum() - 1) > 1e-6:
                        raise ValueError(f"{path}: mixture must be {S} non-negative shares summing to 1 "
                                         f"(data.distributions is {S}; got {m.tolist()})")
                if "component" in arrays:
                    c = np.asarray(z["component"])
                    if c.shape != (n,) or c.dtype.kind not in "iu" or c.min() < 0 or c.max() >= S:
                        raise ValueError(f"{path}: component must be {n} integers in 0..{S - 1}, one per sample")
            if S > 1 and "mixture" not in arrays and "component" not in arrays:
                raise ValueError(f"{path}: has neither 'mixture' nor 'component', which {S} distributions need")
        for s in range(S):
            path = folder / f"holdout_{s}.npz"
            check_xy(path, cls._open(path, f"data.distributions is {S}: holdout_0..holdout_{S - 1}"), "x", "y")

    @staticmethod
    def _open(path: Path, expected: str) -> dict:
        if not path.is_file():
            raise ValueError(f"{path}: no such file ({expected})")
        try:
            return _arrays(path)
        except (zipfile.BadZipFile, ValueError, KeyError, EOFError) as err:
            raise ValueError(f"{path}: not a readable .npz file ({err})") from None


if TYPE_CHECKING:  # mypy checks NpzClients against the dataset protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import Dataset

    _: type[Dataset] = NpzClients
