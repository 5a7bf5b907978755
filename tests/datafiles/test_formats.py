"""The driver's torch-free check of every dataset file's format, before anything starts; and
the same one-line error when a loader finds a bad file inside an actor."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from support.configs import small_config
from support.images import idx_bytes, write_cifar10, write_cifar100, write_emnist, write_fmnist

import raysoft
from raysoft.api import check_data
from raysoft.config import ConfigError, parse_config
from raysoft.datafiles import CIFAR_MD5, verify_files
from raysoft.errors import DataFileError


def _refused(name: str, root: Path) -> str:
    with pytest.raises(DataFileError) as err:
        verify_files(name, str(root))
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# --------------------------------------------------------------------------- Fashion-MNIST
@pytest.mark.parametrize("gz", [True, False])
def test_well_formed_fmnist_passes(tmp_path, gz):
    write_fmnist(tmp_path, gz=gz)
    verify_files("fmnist", str(tmp_path))


def test_a_truncated_gzip_file_is_named(tmp_path):
    write_fmnist(tmp_path)
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    _cut(path)
    assert _refused("fmnist", tmp_path) == (f"{path}: corrupt gzip file (Compressed file ended before the "
                                            "end-of-stream marker was reached)")


def test_a_gzip_stream_of_a_truncated_idx_file_is_named(tmp_path):
    write_fmnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-100]))
    msg = _refused("fmnist", tmp_path)
    assert msg.startswith(f"{path}: truncated IDX file (shape (40, 28, 28) needs 31376 bytes, file has 31276)")


def test_a_gzip_file_with_a_bad_crc_is_named(tmp_path):
    write_fmnist(tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF  # the CRC: only reading the stream to its end finds it
    path.write_bytes(bytes(data))
    assert _refused("fmnist", tmp_path).startswith(f"{path}: corrupt gzip file (CRC check failed")


@pytest.mark.parametrize("name, data, expected", [
    ("train-images-idx3-ubyte", b"\x00\x01\x08\x03" + bytes(20), "not an IDX file (bad magic number 00010803)"),
    ("train-images-idx3-ubyte", idx_bytes(np.zeros((40, 28, 28), np.uint8)) + b"x", "oversized IDX file"),
    ("train-images-idx3-ubyte", idx_bytes(np.zeros((40, 32, 32), np.uint8)), "expected 28x28 images, got 32x32"),
    ("train-labels-idx1-ubyte", idx_bytes(np.zeros((40, 2), np.uint8)), "expected an IDX file with 1 dimensions"),
    ("t10k-labels-idx1-ubyte", idx_bytes(np.zeros(11, np.uint8)), "has 12 images but"),
])
def test_raw_idx_problems_are_named(tmp_path, name, data, expected):
    write_fmnist(tmp_path, gz=False)
    (tmp_path / name).write_bytes(data)
    msg = _refused("fmnist", tmp_path)
    assert expected in msg and str(tmp_path / name) in msg


def test_the_real_fashion_mnist_passes():
    from raysoft.datafiles import FMNIST_DEBIAN_ROOT

    if not os.path.isdir(FMNIST_DEBIAN_ROOT):
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    verify_files("fmnist", FMNIST_DEBIAN_ROOT)


# --------------------------------------------------------------------------- EMNIST
def test_emnist_raw_files_are_checked_as_torchvision_reads_them(tmp_path):
    write_emnist(tmp_path)
    verify_files("emnist_letters", str(tmp_path))
    raw = tmp_path / "EMNIST" / "raw"
    labels = raw / "emnist-byclass-test-labels-idx1-ubyte"
    labels.write_bytes(gzip.compress(labels.read_bytes()))  # torchvision reads them uncompressed
    assert _refused("emnist_letters", tmp_path) == f"{labels}: gzip-compressed; the loader reads it uncompressed " \
                                                   "(gunzip it)"
    images = raw / "emnist-byclass-train-images-idx3-ubyte"
    _cut(images, 0.9)
    assert "truncated IDX file" in _refused("emnist_letters", tmp_path)


def test_emnist_legacy_torch_files_are_checked(tmp_path):
    processed = tmp_path / "EMNIST" / "processed"
    processed.mkdir(parents=True)
    import torch

    for f in ("training_byclass.pt", "test_byclass.pt"):
        torch.save((torch.zeros(2, 28, 28, dtype=torch.uint8), torch.zeros(2)), processed / f)
    verify_files("emnist_letters", str(tmp_path))
    _cut(processed / "test_byclass.pt")
    assert _refused("emnist_letters", tmp_path).startswith(f"{processed / 'test_byclass.pt'}: ")


# --------------------------------------------------------------------------- CIFAR
@pytest.mark.parametrize("classes, writer, folder, first", [
    (10, write_cifar10, "cifar-10-batches-py", "data_batch_1"),
    (100, write_cifar100, "cifar-100-python", "train"),
])
def test_cifar_pickles_are_read_as_the_loader_reads_them_and_their_md5_checked(tmp_path, classes, writer, folder,
                                                                                first):
    writer(tmp_path)
    # well-formed files in the real format, but not the official ones: the loader's md5 check
    msg = _refused(f"cifar{classes}", tmp_path)
    assert msg.startswith(f"cifar{classes}: md5 mismatch for {first}")
    path = tmp_path / folder / first
    _cut(path, 0.7)
    assert _refused(f"cifar{classes}", tmp_path) == f"{path}: unreadable CIFAR pickle (truncated)"
    path.write_bytes(pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}, protocol=2))
    assert "expected 2 " in _refused(f"cifar{classes}", tmp_path)


class _Payload:
    """A pickle that runs code when loaded: it creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_a_cifar_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    marker = tmp_path / "ran"
    path.write_bytes(pickle.dumps({"data": _Payload(marker)}, protocol=2))
    msg = _refused("cifar10", tmp_path)
    assert msg.startswith(f"{path}: not a CIFAR pickle (it imports ")
    assert not marker.exists()


def test_the_torch_free_md5s_are_torchvisions():
    from torchvision.datasets import CIFAR10, CIFAR100

    for classes, official in ((10, CIFAR10), (100, CIFAR100)):
        entries = official.train_list + official.test_list + [[official.meta["filename"], official.meta["md5"]]]
        assert CIFAR_MD5[classes] == dict(entries)


# --------------------------------------------------------------------------- before anything starts
def test_check_data_refuses_a_corrupt_file_as_a_config_error(tmp_path):
    write_fmnist(tmp_path)
    _cut(tmp_path / "train-images-idx3-ubyte.gz")
    cfg = parse_config({"data": {"name": "fmnist", "root": str(tmp_path)}, "model": {"name": "cnn"}})
    with pytest.raises(ConfigError, match=r"^data: .*train-images-idx3-ubyte\.gz: corrupt gzip file"):
        check_data(cfg)


def test_cli_truncated_fmnist_file_is_one_line_exit_2_and_nothing_written(tmp_path):
    root = tmp_path / "fm"
    write_fmnist(root)
    _cut(root / "train-labels-idx1-ubyte.gz")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config(
        algorithm={"name": "fedavg", "rounds": 1}, model={"name": "cnn", "channels": [2, 4], "hidden": 8},
        data={"name": "fmnist", "root": str(root), "clients": 6, "samples_min": 5, "samples_max": 8,
              "partition": "random", "test_samples": 5})))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "raysoft", "run", str(cfg), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"raysoft: error: data: {root / 'train-labels-idx1-ubyte.gz'}: corrupt gzip file "
                     "(Compressed file ended before the end-of-stream marker was reached)"]
    assert not out.exists() or not any(out.iterdir())


# --------------------------------------------------------------------------- inside the actors
def _fmnist_run(root: Path, **ray) -> dict:
    return small_config(algorithm={"name": "fedavg", "rounds": 1, "clients_per_round": 4},
                        model={"name": "cnn", "channels": [2, 4], "hidden": 8},
                        data={"name": "fmnist", "root": str(root), "clients": 4, "samples_min": 5, "samples_max": 8,
                              "partition": "random", "test_samples": 5},
                        ray=ray)


def test_a_file_a_loader_finds_bad_is_the_same_one_line_error_in_process(tmp_path, monkeypatch):
    # a file that goes bad after the driver's check (or differs on another node)
    root = tmp_path / "fm"
    write_fmnist(root, gz=False)
    _cut(root / "t10k-images-idx3-ubyte", 0.9)
    monkeypatch.setattr("raysoft.datafiles.verify_files", lambda name, root: None)
    with pytest.raises(ConfigError) as err:
        raysoft.run(_fmnist_run(root), out=tmp_path / "out")
    assert str(err.value).startswith(f"data: {root / 't10k-images-idx3-ubyte'}: truncated IDX file")
    assert not any((tmp_path / "out").iterdir())


@pytest.mark.slow
@pytest.mark.ray
def test_a_file_a_loader_finds_bad_inside_an_actor_is_one_line_not_a_ray_traceback(ray_session, tmp_path,
                                                                                    monkeypatch):
    root = tmp_path / "fm"
    write_fmnist(root, gz=False)
    _cut(root / "t10k-images-idx3-ubyte", 0.9)
    monkeypatch.setattr("raysoft.datafiles.verify_files", lambda name, root: None)  # the driver's check only
    with pytest.raises(ConfigError) as err:
        raysoft.run(_fmnist_run(root, backend="ray", clients_per_actor=2, num_cpus_per_actor=0.5),
                    out=tmp_path / "out")
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg and "Ray" not in msg
    assert msg.startswith(f"data: {root / 't10k-images-idx3-ubyte'}: truncated IDX file")
    assert not any((tmp_path / "out").iterdir())
