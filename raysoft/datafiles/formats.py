"""Whether an image dataset's files are in the format its loader reads: IDX headers against the
file's size (gzip streams read through to the end, which also checks their CRC), CIFAR's pickles
through an unpickler that builds only numpy arrays, lists and strings (so a pickle that would run
code is refused, not run) and their md5s. A bad file raises :class:`DataFileError`, one line
naming it."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import zlib

from ..errors import DataFileError, one_line
from .locations import CIFAR_FILES, find_fmnist, require_cifar, require_emnist

# the md5 of every official python-version file (torchvision's lists; a test checks them)
CIFAR_MD5 = {
    10: {"data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
         "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
         "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e",
         "batches.meta": "5ff9c542aee3614f3951f8cda6e48888"},
    100: {"train": "16019d7e3df5f24257cddd939b257f8d", "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
          "meta": "7973b15100ade9c7d40fb424638fde48"},
}


IDX_ITEMSIZE = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}  # type code -> bytes per item
_IDX_HEAD = 4 + 4 * 4  # the longest header: magic and four sizes


def idx_layout(head: bytes, length: int, where: str) -> tuple[int, tuple[int, ...], int]:
    """(type code, shape, header size) of IDX data of ``length`` bytes that starts with ``head``
    (magic 0x0000TTDD: type TT, DD dimensions, big-endian sizes); :class:`DataFileError` unless
    the length is exactly what the header says."""
    if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in IDX_ITEMSIZE or not 1 <= head[3] <= 4:
        raise DataFileError(f"{where}: not an IDX file (bad magic number {head[:4].hex() or 'none'})")
    ndim = head[3]
    header = 4 + 4 * ndim
    if length < header or len(head) < header:
        raise DataFileError(f"{where}: truncated IDX file (header of {header} bytes, file has {length})")
    shape = tuple(int(d) for d in struct.unpack(f">{ndim}I", head[4:header]))
    items = 1
    for d in shape:
        items *= d
    expected = header + items * IDX_ITEMSIZE[head[2]]
    if length != expected:
        kind = "truncated" if length < expected else "oversized"
        raise DataFileError(f"{where}: {kind} IDX file (shape {shape} needs {expected} bytes, file has {length})")
    return head[2], shape, header


def _head_and_length(path: str, gunzip: bool = True) -> tuple[bytes, int]:
    """The first bytes of a file's content and its length, gunzipped (read through to the end)
    if it is gzip, detected by content as the loader does."""
    with open(path, "rb") as f:
        head = f.read(_IDX_HEAD)
        if not (gunzip and head[:2] == b"\x1f\x8b"):
            return head, os.fstat(f.fileno()).st_size
        f.seek(0)
        try:
            with gzip.GzipFile(fileobj=f) as g:
                head = g.read(_IDX_HEAD)
                length = len(head)
                while chunk := g.read(1 << 20):
                    length += len(chunk)
        except (OSError, EOFError, zlib.error) as err:
            raise DataFileError(f"{path}: corrupt gzip file ({one_line(err)})") from None
    return head, length


def _idx_shape(path: str, ndim: int, gunzip: bool = True) -> tuple[int, ...]:
    """The shape of an unsigned-byte IDX file with ``ndim`` dimensions (28x28 images)."""
    head, length = _head_and_length(path, gunzip)
    if not gunzip and head[:2] == b"\x1f\x8b":
        raise DataFileError(f"{path}: gzip-compressed; the loader reads it uncompressed (gunzip it)")
    code, shape, _ = idx_layout(head, length, path)
    if len(shape) != ndim:
        raise DataFileError(f"{path}: expected an IDX file with {ndim} dimensions, got shape {shape}")
    if code != 0x08:
        raise DataFileError(f"{path}: expected unsigned-byte IDX data (type 0x08, got 0x{code:02x})")
    if ndim == 3 and shape[1:] != (28, 28):
        raise DataFileError(f"{path}: expected 28x28 images, got {shape[1]}x{shape[2]}")
    return shape


def _idx_pair(name: str, images: str, labels: str, gunzip: bool = True) -> None:
    x, y = _idx_shape(images, 3, gunzip), _idx_shape(labels, 1, gunzip)
    if x[0] != y[0]:
        raise DataFileError(f"{name}: {images} has {x[0]} images but {labels} has {y[0]} labels")


def _check_torch_file(path: str) -> None:
    """A file torch.load reads (torchvision's legacy EMNIST cache): a zip archive whose members
    read back intact, or torch's older pickle-based format."""
    import zipfile

    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as err:
            raise DataFileError(f"{path}: corrupt torch file ({one_line(err)})") from None
        if bad is not None:
            raise DataFileError(f"{path}: corrupt torch file (member {bad} fails its CRC)")
        return
    with open(path, "rb") as f:
        if f.read(1) != b"\x80":
            raise DataFileError(f"{path}: not a torch file (neither a zip archive nor a pickle)")


class _Refused(pickle.UnpicklingError):
    """A pickle asks for a global that a dataset file never needs."""


class _ArraysOnly(pickle.Unpickler):
    """Unpickles CIFAR's files, which hold dicts of numpy arrays, lists and strings: numpy's
    array constructors are the only globals it resolves, so a pickle that would call anything
    else is refused before anything runs."""

    def find_class(self, module: str, name: str):  # pickle's hook
        import codecs

        import numpy as np

        core = getattr(np, "_core", None) or np.core
        allowed = {
            ("numpy.core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): core.multiarray._reconstruct,
            ("numpy", "ndarray"): np.ndarray,
            ("numpy", "dtype"): np.dtype,
            ("_codecs", "encode"): codecs.encode,
        }
        if (module, name) not in allowed:
            raise _Refused(f"it imports {module}.{name}, which a CIFAR file never does")
        return allowed[(module, name)]


def _cifar_entry(path: str) -> dict:
    """One CIFAR pickle, read as torchvision reads it (latin-1 strings), arrays only."""
    try:
        with open(path, "rb") as f:
            entry = _ArraysOnly(f, encoding="latin1").load()
    except _Refused as err:
        raise DataFileError(f"{path}: not a CIFAR pickle ({one_line(err)}); it was not loaded") from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        struct.error,
        MemoryError,
    ) as err:
        truncated = isinstance(err, EOFError) or "truncated" in str(err)
        why = "truncated" if truncated else f"{type(err).__name__}: {one_line(err)}"
        raise DataFileError(f"{path}: unreadable CIFAR pickle ({why})") from None
    if not isinstance(entry, dict):
        raise DataFileError(f"{path}: not a CIFAR pickle (holds a {type(entry).__name__}, not a dict)")
    return entry


def _check_cifar(root: str, num_classes: int) -> None:
    import numpy as np

    folder = require_cifar(root, num_classes)
    labels_key = "labels" if num_classes == 10 else "fine_labels"
    meta_file, meta_key = ("batches.meta", "label_names") if num_classes == 10 else ("meta", "fine_label_names")
    for name in CIFAR_FILES[num_classes]:
        path = os.path.join(folder, name)
        entry = _cifar_entry(path)
        if name == meta_file:
            if len(entry.get(meta_key) or ()) != num_classes:
                raise DataFileError(f"{path}: expected {num_classes} names under {meta_key!r}")
            continue
        data, labels = entry.get("data"), entry.get(labels_key)
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
            got = getattr(data, "shape", type(data).__name__)
            raise DataFileError(f"{path}: expected 'data' as unsigned bytes [n, 3072], got {got}")
        if not isinstance(labels, list) or len(labels) != data.shape[0]:
            raise DataFileError(f"{path}: expected {data.shape[0]} {labels_key!r}, got "
                                f"{len(labels) if isinstance(labels, list) else type(labels).__name__}")
    check_cifar_md5(folder, num_classes)


def check_cifar_md5(folder: str, num_classes: int) -> None:
    """Raise :class:`DataFileError` naming every file of CIFAR's ``folder`` whose md5 is not the
    official file's (:data:`CIFAR_MD5`)."""
    bad = []
    for name in CIFAR_FILES[num_classes]:
        h = hashlib.md5()
        with open(os.path.join(folder, name), "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        if h.hexdigest() != CIFAR_MD5[num_classes][name]:
            bad.append(name)
    if bad:
        raise DataFileError(f"cifar{num_classes}: md5 mismatch for {', '.join(bad)} in {folder} "
                            "(not the official python-version files)")


def verify_files(name: str, root: str) -> None:
    """Raise :class:`MissingDataError` unless dataset ``name``'s files are in ``root``, and
    :class:`DataFileError` unless each is in the format its loader reads (see the module's doc)."""
    if name == "fmnist":
        paths = find_fmnist(root)
        for prefix in ("train", "t10k"):
            _idx_pair(name, paths[f"{prefix}-images-idx3-ubyte"], paths[f"{prefix}-labels-idx1-ubyte"])
    elif name == "emnist_letters":
        files = require_emnist(root)
        processed = os.path.join(root, "EMNIST", "processed")
        legacy = [os.path.join(processed, f) for f in ("training_byclass.pt", "test_byclass.pt")]
        if all(os.path.isfile(f) for f in legacy):  # torchvision then reads these, not the raw files
            for f in legacy:
                _check_torch_file(f)
        else:
            for i in (0, 2):
                _idx_pair(name, files[i], files[i + 1], gunzip=False)
    elif name in ("cifar10", "cifar100"):
        _check_cifar(root, int(name[len("cifar") :]))
    else:
        raise ValueError(f"unknown image dataset {name!r}")
