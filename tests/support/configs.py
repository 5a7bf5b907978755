"""Small configs for runs of seconds, and a check that a PNG holds a plot."""

from __future__ import annotations

import copy
import struct

SMALL = {
    "seed": 3,
    "algorithm": {"name": "fedsoft", "rounds": 4, "clients_per_round": 6, "eval_every": 2},
    "data": {"name": "synthetic", "clients": 10, "distributions": 2, "partition": "10:90",
             "samples_min": 40, "samples_max": 60, "test_samples": 200},
    "train": {"local_epochs": 2},
    "ray": {"backend": "inprocess"},
    "output": {"progress": "none"},
}


def small_config(**sections) -> dict:
    """SMALL with some sections' keys replaced, e.g. small_config(ray={"backend": "ray"})."""
    cfg = copy.deepcopy(SMALL)
    for name, values in sections.items():
        if isinstance(values, dict):
            cfg.setdefault(name, {}).update(values)
        else:
            cfg[name] = values
    return cfg


def stream_config(root, name="ccfl", **algo) -> dict:
    """A stream run (CCFL by default) small enough for seconds: 6 clients, 3 rotated clusters of
    the tiny fake Fashion-MNIST that ``support.images.write_fmnist`` writes under ``root``, 24
    uploads; ``algo`` overrides algorithm keys (e.g. drift=False)."""
    return small_config(
        algorithm={"name": name, "rounds": 24, "eval_every": 8, "public_samples": 6, "pretrain_epochs": 1,
                   "l_bar": "min", **algo},
        data={"name": "fmnist", "clients": 6, "distributions": 3, "partition": "random", "samples_min": 10,
              "samples_max": 20, "root": str(root), "test_samples": 8},
        model={"name": "cnn", "channels": [2, 4], "hidden": 8},
        train={"optimizer": "sgd", "lr": 0.05, "batch_size": 8, "local_epochs": 1},
    )


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path) -> None:
    """``path`` is a PNG with a plot in it: the signature, over 5 kB, at least 300x200 pixels."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 5_000, path
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert width >= 300 and height >= 200, path
