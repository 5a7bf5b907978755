"""Where each image dataset's files are: the data folder (``data.root``, ``$RAYSOFT_DATA``, Debian's
Fashion-MNIST), the file names torchvision's loaders read, and whether they are all there."""

from __future__ import annotations

import os

from ..errors import MissingDataError

FMNIST_DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"
FMNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
ROOT_HINT = "set data.root / RAYSOFT_DATA"
_FMNIST_HINT = f"install Debian's dataset-fashion-mnist or {ROOT_HINT}"

# torchvision's layouts (CIFAR10/CIFAR100.base_folder, train_list, test_list, meta; a test
# checks these against torchvision's own lists)
CIFAR_FOLDERS = {10: "cifar-10-batches-py", 100: "cifar-100-python"}
CIFAR_FILES = {
    10: tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
    100: ("train", "test", "meta"),
}


def default_root(name: str, root: str | None) -> str:
    """The data folder of dataset ``name``: ``root``, else $RAYSOFT_DATA, else Debian's (fmnist)."""
    if root:
        return root
    env = os.environ.get("RAYSOFT_DATA")
    if env:
        return env
    if name == "fmnist":
        return FMNIST_DEBIAN_ROOT
    where = {
        "emnist_letters": "EMNIST/raw/emnist-byclass-*-ubyte",
        "cifar10": CIFAR_FOLDERS[10] + "/",
        "cifar100": CIFAR_FOLDERS[100] + "/",
    }.get(name, "its files")
    raise MissingDataError(
        f"{name}: no data folder: data.root must be set (or RAYSOFT_DATA) to the folder holding {where}"
    )


def find_fmnist(root: str) -> dict[str, str]:
    """Paths of the four Fashion-MNIST files in root (or root/FashionMNIST/raw)."""
    for folder in (root, os.path.join(root, "FashionMNIST", "raw")):
        found = {}
        for base in FMNIST_FILES:
            for candidate in (base, base + ".gz"):
                if os.path.isfile(os.path.join(folder, candidate)):
                    found[base] = os.path.join(folder, candidate)
                    break
        if len(found) == len(FMNIST_FILES):
            return found
    raise MissingDataError(
        f"fmnist: expected {', '.join(f + '[.gz]' for f in FMNIST_FILES)} in {root} ({_FMNIST_HINT})"
    )


def emnist_files(root: str) -> list[str]:
    """The files torchvision's ``EMNIST(root, split="byclass")`` reads (uncompressed IDX)."""
    raw = os.path.join(root, "EMNIST", "raw")
    return [
        os.path.join(raw, f"emnist-byclass-{split}-{kind}-ubyte")
        for split in ("train", "test")
        for kind in ("images-idx3", "labels-idx1")
    ]


def require_emnist(root: str) -> list[str]:
    """The raw byclass files, or MissingDataError (torchvision's legacy .pt files also count)."""
    files = emnist_files(root)
    processed = os.path.join(root, "EMNIST", "processed")
    legacy = all(
        os.path.isfile(os.path.join(processed, f)) for f in ("training_byclass.pt", "test_byclass.pt")
    )
    if not legacy and not all(os.path.isfile(f) for f in files):
        gz = " (found .gz files: gunzip them)" if all(os.path.isfile(f + ".gz") for f in files) else ""
        names = ", ".join(os.path.basename(f) for f in files)
        raise MissingDataError(
            f"emnist_letters: expected {names} in {os.path.dirname(files[0])}{gz} ({ROOT_HINT})"
        )
    return files


def require_cifar(root: str, num_classes: int) -> str:
    """The folder of CIFAR-10/100's python-version files, or MissingDataError."""
    if num_classes not in CIFAR_FOLDERS:
        raise ValueError(f"CIFAR has 10 or 100 classes, got {num_classes}")
    folder = os.path.join(root, CIFAR_FOLDERS[num_classes])
    if not all(os.path.isfile(os.path.join(folder, f)) for f in CIFAR_FILES[num_classes]):
        raise MissingDataError(
            f"cifar{num_classes}: expected {', '.join(CIFAR_FILES[num_classes])} in {folder} ({ROOT_HINT})"
        )
    return folder


def check_files(name: str, root: str) -> None:
    """Raise :class:`MissingDataError` unless dataset ``name``'s files are in ``root`` (stat only)."""
    if name == "fmnist":
        find_fmnist(root)
    elif name == "emnist_letters":
        require_emnist(root)
    elif name in ("cifar10", "cifar100"):
        require_cifar(root, int(name[len("cifar") :]))
    else:
        raise ValueError(f"unknown image dataset {name!r}")
