"""Where LEAF's JSON files are (``data.root``, else ``$RAYSOFT_DATA/<name>``) and whether they are
there, checked without reading them (the driver checks this before anything starts; the loader,
:mod:`raysoft.data.leaf`, reads them)."""

from __future__ import annotations

import os

from ..errors import MissingDataError


def leaf_root(name: str, root: str | None) -> str:
    """The folder of ``train/`` and ``test/``: ``root``, else ``$RAYSOFT_DATA/<name>``."""
    if root:
        return root
    env = os.environ.get("RAYSOFT_DATA")
    if env:
        return os.path.join(env, name)
    raise MissingDataError(f"{name}: no data folder: set data.root (or RAYSOFT_DATA) to LEAF's data/{name}/data "
                           "folder, holding train/*.json and test/*.json")


def leaf_json_files(root: str, split: str, name: str) -> list[str]:
    """The ``.json`` files of ``root/split``, sorted by name, or :class:`MissingDataError`."""
    folder = os.path.join(root, split)
    files = sorted(f for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(folder) else []
    if not files:
        raise MissingDataError(f"{name}: expected LEAF's {split}/*.json files in {folder} (run LEAF's "
                               f"data/{name}/preprocess.sh, then set data.root to its data/{name}/data)")
    return [os.path.join(folder, f) for f in files]


def require_leaf(name: str, root: str | None) -> str:
    """The data folder of LEAF dataset ``name``, once its train and test files are seen there."""
    folder = leaf_root(name, root)
    for split in ("train", "test"):
        leaf_json_files(folder, split, name)
    return folder
