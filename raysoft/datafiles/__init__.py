"""Image datasets' files, checked without torch or torchvision, so that the driver of a Ray run
checks its input without importing them (torch's import costs every process that makes it
hundreds of MB; docs/performance.md#where-a-w2-round-goes): :mod:`.locations` (where the files
are and whether they are there) and :mod:`.formats` (whether each is in the format its loader
reads, :func:`verify_files`). The loaders themselves are in :mod:`raysoft.data.images`; which
datasets and models exist, and which fit which, in :mod:`raysoft.catalog`.
"""

from ..errors import DataFileError, MissingDataError
from .formats import CIFAR_MD5, IDX_ITEMSIZE, check_cifar_md5, idx_layout, verify_files
from .locations import (
    CIFAR_FILES,
    CIFAR_FOLDERS,
    FMNIST_DEBIAN_ROOT,
    FMNIST_FILES,
    ROOT_HINT,
    check_files,
    default_root,
    emnist_files,
    find_fmnist,
    require_cifar,
    require_emnist,
)

__all__ = [
    "CIFAR_FILES", "CIFAR_FOLDERS", "CIFAR_MD5", "FMNIST_DEBIAN_ROOT", "FMNIST_FILES", "IDX_ITEMSIZE", "ROOT_HINT",
    "DataFileError", "MissingDataError", "check_cifar_md5", "check_files", "default_root", "emnist_files",
    "find_fmnist", "idx_layout",
    "require_cifar", "require_emnist", "verify_files",
]
