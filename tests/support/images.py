"""Tiny dataset files in the real on-disk formats, written by the tests themselves.

Fashion-MNIST: IDX files (gzipped and raw). EMNIST: uncompressed IDX files in
``<root>/EMNIST/raw/`` as torchvision's EMNIST reads them. CIFAR: Python-2 style pickles (keys
are py2 ``str``, i.e. ``b"data"`` when loaded with ``encoding="bytes"``) as the official
``cifar-10-batches-py`` / ``cifar-100-python`` archives hold them.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np

N_TRAIN, N_TEST = 40, 12


def idx_bytes(arr: np.ndarray) -> bytes:
    """An unsigned-byte IDX file: magic 0x0000 08 <ndim>, big-endian sizes, data."""
    assert arr.dtype == np.uint8
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if gz else data)


def unique_images(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Random uint8 images (distinct and asymmetric with overwhelming probability)."""
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def write_fmnist(root: Path, gz: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3-ubyte": unique_images(rng, N_TRAIN, (28, 28)),
        "train-labels-idx1-ubyte": (np.arange(N_TRAIN) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": unique_images(rng, N_TEST, (28, 28)),
        "t10k-labels-idx1-ubyte": ((np.arange(N_TEST) * 3) % 10).astype(np.uint8),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        write_idx(root / (name + (".gz" if gz else "")), arr, gz)
    return arrays


def write_emnist(root: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """byclass: labels 0-9 digits, 10-35 'A'-'Z', 36-61 'a'-'z'."""
    rng = np.random.default_rng(seed)
    raw = root / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    out = {}
    for split, reps in (("train", 2), ("test", 1)):
        y = np.tile(np.arange(62), reps).astype(np.uint8)
        rng.shuffle(y)
        x = unique_images(rng, len(y), (28, 28))
        write_idx(raw / f"emnist-byclass-{split}-images-idx3-ubyte", x, gz=False)
        write_idx(raw / f"emnist-byclass-{split}-labels-idx1-ubyte", y, gz=False)
        out[split] = (x, y)
    return out


class Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 ``str`` (BINSTRING), like the official CIFAR pickles."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)
        self.write(head + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def write_py2_pickle(path: Path, obj: dict) -> None:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    path.write_bytes(buf.getvalue())


def write_cifar10(root: Path, per_batch: int = 4, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Five training batches and a test batch; returns (train_x, train_y, test_x, test_y)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    xs, ys = [], []
    for i, name in enumerate([f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        batch_label = f"training batch {i + 1} of 5" if name != "test_batch" else "testing batch 1 of 1"
        write_py2_pickle(folder / name, {
            b"batch_label": batch_label.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img_{i}_{j}.png".encode() for j in range(per_batch)],
        })
        xs.append(data)
        ys.append(labels)
    write_py2_pickle(folder / "batches.meta", {
        b"num_cases_per_batch": per_batch,
        b"label_names": [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer",
                                               "dog", "frog", "horse", "ship", "truck")],
        b"num_vis": 3072,
    })
    train_x = np.concatenate(xs[:5]).reshape(-1, 3, 32, 32)
    return train_x, np.concatenate(ys[:5]), xs[5].reshape(-1, 3, 32, 32), np.array(ys[5])


def write_cifar100(root: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for name, n in (("train", 10), ("test", 6)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size=n)]
        write_py2_pickle(folder / name, {
            b"filenames": [f"{name}_{j}.png".encode() for j in range(n)],
            b"batch_label": f"{name}ing batch 1 of 1".encode(),
            b"fine_labels": fine,
            b"coarse_labels": [v // 5 for v in fine],
            b"data": data,
        })
        out[name] = (data, fine)
    write_py2_pickle(folder / "meta", {
        b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    })
    return out


def write_learnable_fmnist(root, n_train=6000, n_test=2000, seed=0):
    """Fashion-MNIST-shaped IDX files (the real on-disk format) of 10 noisy class templates, so
    that the quick bench needs neither Debian's package nor a download."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(10, 28, 28))
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = (np.arange(n) % 10).astype(np.uint8)
        x = np.clip(0.6 * templates[y] + rng.integers(0, 100, size=(n, 28, 28)), 0, 255).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", x, gz=True)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", y, gz=True)


def as_official_cifar(monkeypatch, root: Path, classes: int) -> None:
    """Make the CIFAR files written under ``root`` pass as the official ones: their md5s become
    the table the loader and the driver's check compare with (for the test's duration)."""
    import hashlib

    from raysoft.datafiles import CIFAR_FILES, CIFAR_FOLDERS, formats

    folder = Path(root) / CIFAR_FOLDERS[classes]
    table = {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in CIFAR_FILES[classes]}
    monkeypatch.setitem(formats.CIFAR_MD5, classes, table)
