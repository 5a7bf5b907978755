"""The built-in image datasets fetched on first use (``data.download: true``), by torchvision's
own classes: their mirrors, their md5 checks and their layouts, which the loaders of
:mod:`raysoft.data.images` read. Nothing is fetched when the files are already in the folder.

The folder is ``data.root``, else ``$RAYSOFT_DATA``, else (``fmnist``) Debian's folder where it
holds the files, else ``$XDG_CACHE_HOME/raysoft`` (``~/.cache/raysoft``). torchvision (and
torch) are imported only when something is missing. Without the network the run is refused in
one line naming the folder to fill by hand.
"""

from __future__ import annotations

import os
from urllib.error import URLError

from ..errors import MissingDataError, one_line
from .locations import CIFAR_FOLDERS, FMNIST_DEBIAN_ROOT, check_files, default_root

# what to put in the folder by hand, where the download fails
_BY_HAND = {
    "fmnist": "the four Fashion-MNIST IDX files (FashionMNIST/raw/ or the folder itself)",
    "emnist_letters": "EMNIST/raw/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte",
    "cifar10": f"{CIFAR_FOLDERS[10]}/ (CIFAR-10's python version, unpacked)",
    "cifar100": f"{CIFAR_FOLDERS[100]}/ (CIFAR-100's python version, unpacked)",
}


def cache_root() -> str:
    """``$XDG_CACHE_HOME/raysoft``, else ``~/.cache/raysoft``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "raysoft")


def download_root(name: str, root: str | None) -> str:
    """Where dataset ``name``'s files are looked for, and fetched to if missing: as
    :func:`default_root` where ``root`` or $RAYSOFT_DATA says, else Debian's Fashion-MNIST where
    it is installed, else the cache."""
    if root or os.environ.get("RAYSOFT_DATA"):
        return default_root(name, root)
    if name == "fmnist":
        try:
            check_files(name, FMNIST_DEBIAN_ROOT)
            return FMNIST_DEBIAN_ROOT
        except MissingDataError:
            pass
    return cache_root()


def _fetch(name: str, folder: str) -> None:
    """torchvision's download of dataset ``name`` into ``folder`` (its own mirrors and md5s)."""
    from torchvision import datasets

    if name == "fmnist":
        datasets.FashionMNIST(folder, train=True, download=True)
    elif name == "emnist_letters":
        datasets.EMNIST(folder, split="byclass", train=True, download=True)
    elif name == "cifar10":
        datasets.CIFAR10(folder, train=True, download=True)
    elif name == "cifar100":
        datasets.CIFAR100(folder, train=True, download=True)
    else:
        raise ValueError(f"no download for dataset {name!r}")


def ensure_files(name: str, root: str | None) -> str:
    """The folder of dataset ``name``'s files, fetched there first if they are missing."""
    folder = download_root(name, root)
    try:
        check_files(name, folder)
        return folder
    except MissingDataError:
        pass
    os.makedirs(folder, exist_ok=True)
    try:
        _fetch(name, folder)
    except (OSError, RuntimeError, URLError, ValueError) as err:
        raise MissingDataError(f"{name}: download into {folder} failed ({one_line(err)[:300]}); without the network, "
                               f"put {_BY_HAND[name]} in {folder} and set data.root to it") from None
    check_files(name, folder)
    return folder
