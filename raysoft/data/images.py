"""Image datasets on disk: Fashion-MNIST, EMNIST letters, CIFAR-10/100; and image rotation.

Nothing is downloaded. Each loader reads a folder and returns uint8 arrays [n, C, H, W]:

- ``fmnist``: the four IDX files (gzipped or not) that Debian's ``dataset-fashion-mnist``
  installs in ``/usr/share/datasets/fashion-mnist``, parsed by :func:`read_idx`. Also found in
  ``<root>/FashionMNIST/raw/`` (torchvision's layout).
- ``emnist_letters``: ``torchvision.datasets.EMNIST(root, split="byclass", download=False)``,
  i.e. the uncompressed files ``<root>/EMNIST/raw/emnist-byclass-{train,test}-
  {images-idx3,labels-idx1}-ubyte``. Lowercase letters are byclass labels 36..61, uppercase
  10..35 (FedSoft's reference code); images are kept as torchvision stores them (not transposed).
- ``cifar10`` / ``cifar100``: ``torchvision.datasets.CIFAR10/CIFAR100(root, download=False)``,
  i.e. ``<root>/cifar-10-batches-py/`` or ``<root>/cifar-100-python/``.

A missing file raises :class:`MissingDataError`, a corrupt one a :class:`DataFileError` (a
``ValueError``); both messages are one line naming the dataset, the files and the folder. The
driver checks the same formats before anything starts (:func:`raysoft.datafiles.verify_files`).
"""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..datafiles import (  # noqa: F401 - re-exported
    FMNIST_DEBIAN_ROOT,
    FMNIST_FILES,
    ROOT_HINT,
    DataFileError,
    MissingDataError,
    check_cifar_md5,
    check_files,
    default_root,
    emnist_files,
    find_fmnist,
    idx_layout,
    require_cifar,
    require_emnist,
)
from ..devices import to_numpy
from ..errors import one_line

# torchvision (its import costs every process memory; docs/performance.md) is imported only by
# the loaders and the rotations that need it, not for Fashion-MNIST rotated by multiples of 90°

__all__ = [
    "FMNIST_DEBIAN_ROOT",
    "DataFileError",
    "ImageArrays",
    "MissingDataError",
    "check_files",
    "default_root",
    "emnist_files",
    "load_cifar",
    "load_emnist_letters",
    "load_fmnist",
    "parse_idx",
    "read_idx",
    "rotate",
]

@dataclass(frozen=True)
class ImageArrays:
    """A dataset's train and test splits: uint8 images [n, C, H, W], int64 labels [n]."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int



# --------------------------------------------------------------------------- IDX files
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_bytes(path: str) -> bytes:
    """A file's bytes, gunzipped if it is gzip (detected by content, not by name)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise DataFileError(f"{path}: corrupt gzip file ({one_line(err)})") from None
    return data


def parse_idx(data: bytes, where: str = "IDX data") -> np.ndarray:
    """Parse IDX bytes (magic 0x0000TTDD: type TT, DD dimensions, big-endian sizes)."""
    code, shape, header = idx_layout(data[:20], len(data), where)
    dtype = np.dtype(_IDX_TYPES[code])
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: str, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (gzipped or not); check the number of dimensions if given."""
    arr = parse_idx(_read_bytes(path), path)
    if ndim is not None and arr.ndim != ndim:
        raise DataFileError(f"{path}: expected an IDX file with {ndim} dimensions, got shape {arr.shape}")
    return arr


def load_fmnist(root: str) -> ImageArrays:
    """Fashion-MNIST from its IDX files: 10 classes, images [n, 1, 28, 28]."""
    paths = find_fmnist(root)
    splits = []
    for prefix in ("train", "t10k"):
        x_path, y_path = paths[f"{prefix}-images-idx3-ubyte"], paths[f"{prefix}-labels-idx1-ubyte"]
        x, y = read_idx(x_path, ndim=3), read_idx(y_path, ndim=1)
        if x.dtype != np.uint8 or y.dtype != np.uint8:
            raise DataFileError(f"fmnist: {x_path} / {y_path}: expected unsigned-byte IDX files")
        if len(x) != len(y):
            raise DataFileError(f"fmnist: {x_path} has {len(x)} images but {y_path} has {len(y)} labels")
        splits.append((np.ascontiguousarray(x[:, None]), y.astype(np.int64)))
    (train_x, train_y), (test_x, test_y) = splits
    return ImageArrays(train_x, train_y, test_x, test_y, num_classes=10)


# --------------------------------------------------------------------------- EMNIST
EMNIST_LOWER = (36, 62)  # byclass labels of 'a'..'z'
EMNIST_UPPER = (10, 36)  # byclass labels of 'A'..'Z'


def _emnist_split(root: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    from torchvision.datasets import EMNIST

    ds = EMNIST(root, split="byclass", train=train, download=False)
    return to_numpy(ds.data), to_numpy(ds.targets).astype(np.int64)


def _letters(x: np.ndarray, y: np.ndarray, labels: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    keep = (y >= labels[0]) & (y < labels[1])
    return np.ascontiguousarray(x[keep][:, None]), y[keep] - labels[0]


def load_emnist_letters(root: str) -> tuple[ImageArrays, ImageArrays]:
    """EMNIST byclass letters: (lowercase, uppercase), 26 classes each, images [n, 1, 28, 28]."""
    files = require_emnist(root)
    try:
        train = _emnist_split(root, train=True)
        test = _emnist_split(root, train=False)
    except (AssertionError, RuntimeError, TypeError, ValueError, KeyError) as err:
        raise DataFileError(
            f"emnist_letters: cannot read the byclass files in {os.path.dirname(files[0])} "
            f"({type(err).__name__}: {one_line(err)})"
        ) from None
    out = []
    for labels in (EMNIST_LOWER, EMNIST_UPPER):
        tx, ty = _letters(*train, labels)
        vx, vy = _letters(*test, labels)
        out.append(ImageArrays(tx, ty, vx, vy, num_classes=26))
    return out[0], out[1]


# --------------------------------------------------------------------------- CIFAR
def _cifar_classes(num_classes: int):
    """(torchvision's class, a subclass whose integrity check only tests that the files exist:
    the md5s are checked before, file by file)."""
    from torchvision.datasets import CIFAR10, CIFAR100

    official = {10: CIFAR10, 100: CIFAR100}[num_classes]
    unchecked = type(f"_{official.__name__}Unchecked", (official,), {
        "train_list": [[f, None] for f, _ in official.train_list],
        "test_list": [[f, None] for f, _ in official.test_list],
        "meta": {**official.meta, "md5": None},
    })
    return official, unchecked


def load_cifar(root: str, num_classes: int) -> ImageArrays:
    """CIFAR-10 or CIFAR-100 (fine labels) via torchvision: images [n, 3, 32, 32].

    torchvision's own classes check the md5 of every batch file on each construction (twice
    for train + test). Here the md5s of the official files are checked once, file by file
    (:func:`raysoft.datafiles.formats.check_cifar_md5`, on whichever node loads them), so a
    mismatch names the file; the data is then read through a subclass whose integrity check
    only tests existence.
    """
    name = f"cifar{num_classes}"
    folder = require_cifar(root, num_classes)
    _, unchecked = _cifar_classes(num_classes)
    check_cifar_md5(folder, num_classes)
    splits = []
    try:
        for train in (True, False):
            ds = unchecked(root, train=train, download=False)
            x = np.ascontiguousarray(np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2))
            splits.append((x, np.asarray(ds.targets, dtype=np.int64)))
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise DataFileError(
            f"{name}: cannot read the batch files in {folder} ({type(err).__name__}: {one_line(err)})"
        ) from None
    (train_x, train_y), (test_x, test_y) = splits
    return ImageArrays(train_x, train_y, test_x, test_y, num_classes=num_classes)


# --------------------------------------------------------------------------- rotation
def rotate(images: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate float images [..., C, H, W] counter-clockwise by ``degrees``.

    Multiples of 90 degrees are exact (``torch.rot90``; for non-square images only 180);
    other angles use bilinear interpolation about the image centre, with 0 outside.
    Always returns a new tensor of the same shape.
    """
    if images.ndim < 3:
        raise ValueError(f"rotate expects images [..., C, H, W], got shape {tuple(images.shape)}")
    angle = float(degrees) % 360.0
    quarter = round(angle / 90.0)
    if abs(angle - 90.0 * quarter) < 1e-6:
        k = quarter % 4
        if k == 0:
            return images.clone()
        if k == 2 or images.shape[-1] == images.shape[-2]:
            return torch.rot90(images, k, dims=(-2, -1))
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    return TF.rotate(images, angle, interpolation=InterpolationMode.BILINEAR, fill=0.0)
