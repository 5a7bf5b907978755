"""Image loaders, rotation and the rotated-image mixture, on tiny files in the real formats.

Fashion-MNIST: IDX files (gzipped and raw). EMNIST: uncompressed IDX files in
``<root>/EMNIST/raw/`` as torchvision's EMNIST reads them. CIFAR: Python-2 style pickles (keys
are py2 ``str``, i.e. ``b"data"`` when loaded with ``encoding="bytes"``) as the official
``cifar-10-batches-py`` / ``cifar-100-python`` archives hold them.
"""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.images import (
    N_TEST,
    N_TRAIN,
    as_official_cifar,
    idx_bytes,
    write_cifar10,
    write_cifar100,
    write_emnist,
    write_fmnist,
)

from raysoft.catalog import ImageData
from raysoft.data.image_mixture import ImageMixture, distribution_specs, load_pools
from raysoft.data.images import (
    FMNIST_DEBIAN_ROOT,
    MissingDataError,
    default_root,
    load_cifar,
    load_emnist_letters,
    load_fmnist,
    read_idx,
    rotate,
)
from raysoft.data.partition import component_counts
from raysoft.rng import numpy_rng


@pytest.fixture
def fmnist_root(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path / "fmnist"
    return root, write_fmnist(root)


# --------------------------------------------------------------------------- fmnist
@pytest.mark.parametrize("gz", [True, False])
def test_load_fmnist_reads_gzipped_and_raw_idx(tmp_path, gz):
    arrays = write_fmnist(tmp_path, gz=gz)
    data = load_fmnist(str(tmp_path))
    assert data.num_classes == 10
    assert data.train_x.shape == (N_TRAIN, 1, 28, 28) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (N_TEST, 1, 28, 28)
    assert data.train_y.dtype == np.int64
    np.testing.assert_array_equal(data.train_x[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.test_x[:, 0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.train_y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(data.test_y, arrays["t10k-labels-idx1-ubyte"])


def test_load_fmnist_accepts_torchvision_layout(tmp_path):
    arrays = write_fmnist(tmp_path / "FashionMNIST" / "raw", gz=False)
    np.testing.assert_array_equal(load_fmnist(str(tmp_path)).train_y, arrays["train-labels-idx1-ubyte"])


def test_missing_fmnist_folder_is_a_one_line_missing_data_error(tmp_path):
    where = tmp_path / "nowhere"
    with pytest.raises(MissingDataError) as err:
        load_fmnist(str(where))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("fmnist: expected train-images-idx3-ubyte")
    assert str(where) in msg and "dataset-fashion-mnist" in msg
    assert isinstance(err.value, FileNotFoundError)


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_idx_file_is_a_one_line_value_error(tmp_path, gz):
    write_fmnist(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    data = path.read_bytes()[:-100]
    path.unlink()
    if gz:
        path = tmp_path / "train-images-idx3-ubyte.gz"
        data = gzip.compress(data)
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        load_fmnist(str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "truncated" in msg


def test_corrupt_gzip_and_bad_magic_are_one_line_value_errors(tmp_path):
    gz = gzip.compress(idx_bytes(np.zeros((3, 28, 28), np.uint8)))
    (tmp_path / "cut.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(ValueError, match=r"cut\.gz: corrupt gzip file") as err:
        read_idx(str(tmp_path / "cut.gz"))
    assert "\n" not in str(err.value)
    (tmp_path / "bad").write_bytes(b"\x00\x01\x08\x03" + bytes(20))
    with pytest.raises(ValueError, match="bad magic number"):
        read_idx(str(tmp_path / "bad"))
    (tmp_path / "labels").write_bytes(idx_bytes(np.zeros(5, np.uint8)))
    with pytest.raises(ValueError, match="3 dimensions"):
        read_idx(str(tmp_path / "labels"), ndim=3)


def test_default_root(monkeypatch):
    monkeypatch.delenv("RAYSOFT_DATA", raising=False)
    assert default_root("fmnist", "/given") == "/given"
    assert default_root("fmnist", None) == FMNIST_DEBIAN_ROOT
    with pytest.raises(MissingDataError, match="cifar10: .*data.root must be set") as err:
        default_root("cifar10", None)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("RAYSOFT_DATA", "/env")
    assert default_root("cifar10", None) == "/env"
    assert default_root("fmnist", None) == "/env"
    assert default_root("emnist_letters", "/given") == "/given"


@pytest.mark.skipif(
    not os.path.isfile(os.path.join(FMNIST_DEBIAN_ROOT, "train-images-idx3-ubyte.gz")),
    reason="Debian's dataset-fashion-mnist is not installed",
)
def test_real_fashion_mnist_from_debian():
    data = load_fmnist(FMNIST_DEBIAN_ROOT)
    assert data.train_x.shape == (60000, 1, 28, 28) and data.test_x.shape == (10000, 1, 28, 28)
    assert data.num_classes == 10
    assert np.bincount(data.train_y).tolist() == [6000] * 10
    assert np.bincount(data.test_y).tolist() == [1000] * 10


# --------------------------------------------------------------------------- EMNIST
def test_emnist_letters_lowercase_and_uppercase_mapping(tmp_path):
    written = write_emnist(tmp_path)
    lower, upper = load_emnist_letters(str(tmp_path))
    for arrays, first in ((lower, 36), (upper, 10)):
        assert arrays.num_classes == 26
        splits = (("train", arrays.train_x, arrays.train_y), ("test", arrays.test_x, arrays.test_y))
        for split, x, y in splits:
            wx, wy = written[split]
            keep = (wy >= first) & (wy < first + 26)
            assert x.shape == (int(keep.sum()), 1, 28, 28) and x.dtype == np.uint8
            assert y.dtype == np.int64 and y.min() == 0 and y.max() == 25
            np.testing.assert_array_equal(y, wy[keep].astype(np.int64) - first)
            np.testing.assert_array_equal(x[:, 0], wx[keep])  # as stored: not transposed
    assert len(lower.train_y) == 2 * 26 and len(upper.test_y) == 26


def test_missing_emnist_names_the_files_torchvision_reads(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load_emnist_letters(str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("emnist_letters: expected emnist-byclass-train-images-idx3-ubyte")
    assert os.path.join(str(tmp_path), "EMNIST", "raw") in msg


# --------------------------------------------------------------------------- CIFAR
def test_cifar_pickles_have_the_real_keys(tmp_path):
    write_cifar10(tmp_path)
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    assert set(entry) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert entry[b"data"].shape == (4, 3072) and entry[b"data"].dtype == np.uint8


def test_load_cifar10(tmp_path, monkeypatch):
    train_x, train_y, test_x, test_y = write_cifar10(tmp_path)
    as_official_cifar(monkeypatch, tmp_path, 10)
    data = load_cifar(str(tmp_path), 10)
    assert data.num_classes == 10
    assert data.train_x.shape == (20, 3, 32, 32) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(data.train_x, train_x)
    np.testing.assert_array_equal(data.test_x, test_x)
    np.testing.assert_array_equal(data.train_y, train_y)
    np.testing.assert_array_equal(data.test_y, test_y)
    assert data.train_y.dtype == np.int64


def test_load_cifar100_fine_labels(tmp_path, monkeypatch):
    written = write_cifar100(tmp_path)
    as_official_cifar(monkeypatch, tmp_path, 100)
    data = load_cifar(str(tmp_path), 100)
    assert data.num_classes == 100
    assert data.train_x.shape == (10, 3, 32, 32) and data.test_x.shape == (6, 3, 32, 32)
    np.testing.assert_array_equal(data.train_x, written["train"][0].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(data.train_y, written["train"][1])
    np.testing.assert_array_equal(data.test_y, written["test"][1])


def test_cifar_md5_is_checked_by_default(tmp_path):
    write_cifar10(tmp_path)
    with pytest.raises(ValueError, match="cifar10: md5 mismatch for data_batch_1") as err:
        load_cifar(str(tmp_path), 10)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("classes,folder", [(10, "cifar-10-batches-py"), (100, "cifar-100-python")])
def test_missing_cifar_is_a_one_line_missing_data_error(tmp_path, classes, folder):
    with pytest.raises(MissingDataError) as err:
        load_cifar(str(tmp_path), classes)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cifar{classes}: expected")
    assert os.path.join(str(tmp_path), folder) in msg


def test_the_torch_free_cifar_file_lists_are_torchvisions():
    from torchvision.datasets import CIFAR10, CIFAR100

    from raysoft.datafiles import CIFAR_FILES, CIFAR_FOLDERS

    for classes, official in ((10, CIFAR10), (100, CIFAR100)):
        assert CIFAR_FOLDERS[classes] == official.base_folder
        names = [f for f, _ in official.train_list + official.test_list] + [official.meta["filename"]]
        assert list(CIFAR_FILES[classes]) == names


@pytest.mark.slow
def test_checking_a_runs_input_imports_neither_torch_nor_torchvision(fmnist_root):
    # the driver of a Ray run: config, data files, model fit, the Ray backend's module
    root = str(fmnist_root[0])
    code = f"""
import sys
import raysoft
from raysoft.api import check_data
from raysoft.backends import ray_backend
from raysoft.config import ConfigError, parse_config
cfg = check_data(parse_config({{"data": {{"name": "fmnist", "root": {root!r}}}, "model": {{"name": "cnn"}},
                               "algorithm": {{"name": "fedavg"}}}}))
try:
    check_data(parse_config({{"data": {{"name": "fmnist", "root": {root!r}}}, "model": {{"name": "linear"}}}}))
except ConfigError as err:
    print(err)
print(sorted(m for m in ("torch", "torchvision") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["model.name: model 'linear' does not fit a classification task", "[]"]


# --------------------------------------------------------------------------- rotate
def test_rotate_90_is_counter_clockwise_and_exact():
    img = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]).div(10).reshape(1, 1, 3, 3)
    expected = torch.tensor([[3.0, 6.0, 9.0], [2.0, 5.0, 8.0], [1.0, 4.0, 7.0]]).div(10).reshape(1, 1, 3, 3)
    assert torch.equal(rotate(img, 90), expected)
    assert torch.equal(rotate(img, -270), expected)
    assert torch.equal(rotate(rotate(img, 90), 270), img)


def test_rotate_360_is_identity_and_45_keeps_shape():
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(rotate(x, 360.0), x)
    assert torch.equal(rotate(x, 0), x)
    y = rotate(x, 45.0)
    assert y.shape == x.shape and not torch.equal(y, x)
    assert 0.0 <= float(y.min()) and float(y.max()) <= 1.0
    wide = torch.rand(2, 1, 4, 6)
    assert torch.equal(rotate(wide, 180), wide.flip(-1).flip(-2))


# --------------------------------------------------------------------------- ImageMixture
def fmnist_cfg(root: Path, **kw) -> ImageData:
    args = dict(name="fmnist", clients=4, distributions=2, partition="30:70", root=str(root), test_samples=5)
    args.update(kw)
    return ImageData(**args)


SIZES = np.array([6, 7, 5, 8])
MIX = np.array([[0.3, 0.7], [0.3, 0.7], [0.7, 0.3], [0.7, 0.3]])


def pool_index(images: torch.Tensor, pool: np.ndarray) -> list[int]:
    """Index in ``pool`` ([n, 1, 28, 28] uint8) of each float image (exact match)."""
    lookup = {pool[i].tobytes(): i for i in range(len(pool))}
    as_bytes = (images * 255).round().to(torch.uint8).numpy()
    return [lookup[a.tobytes()] for a in as_bytes]


def test_image_mixture_info_and_specs(fmnist_root):
    root, _ = fmnist_root
    gen = ImageMixture(fmnist_cfg(root), seed=0)
    assert gen.image_shape == (1, 28, 28)
    assert (gen.info.input_dim, gen.info.num_outputs, gen.info.task) == (784, 10, "classification")
    assert gen.specs == [(0, 0.0), (0, 180.0)]
    assert distribution_specs("fmnist", 4) == [(0, 0.0), (0, 90.0), (0, 180.0), (0, 270.0)]
    assert distribution_specs("cifar10", 2, [15.0, 30.0]) == [(0, 15.0), (0, 30.0)]
    assert distribution_specs("emnist_letters", 1) == [(0, 0.0)]
    assert distribution_specs("emnist_letters", 2) == [(0, 0.0), (1, 0.0)]
    assert distribution_specs("emnist_letters", 4) == [(0, 0.0), (1, 0.0), (0, 90.0), (1, 90.0)]


def test_image_mixture_clients_follow_counts_are_disjoint_and_rotated(fmnist_root):
    root, arrays = fmnist_root
    gen = ImageMixture(fmnist_cfg(root), seed=1, sizes=SIZES, mixtures=MIX)
    pool = load_fmnist(str(root))
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    for k in range(4):
        x, y, comp = gen.client(k, int(SIZES[k]), MIX[k])
        assert x.shape == (SIZES[k], 1, 28, 28) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and comp.shape == (SIZES[k],)
        assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
        assert np.bincount(comp, minlength=2).tolist() == component_counts(int(SIZES[k]), MIX[k]).tolist()
        for s, angle in ((0, 0.0), (1, 180.0)):
            mine = comp == s
            base = rotate(x[torch.from_numpy(mine)], -angle)  # undo the rotation exactly
            idx = pool_index(base, pool.train_x)  # KeyError if not a (rotated) base image
            np.testing.assert_array_equal(y[torch.from_numpy(mine)].numpy(), pool.train_y[idx])
            assert len(set(idx)) == len(idx) and not seen[s] & set(idx), "clients' samples overlap"
            seen[s] |= set(idx)
    assert len(seen[1]) == sum(component_counts(int(n), m)[1] for n, m in zip(SIZES, MIX))


def test_image_mixture_samples_are_the_permutation_slices(fmnist_root):
    root, _ = fmnist_root
    gen = ImageMixture(fmnist_cfg(root), seed=1, sizes=SIZES, mixtures=MIX)
    pool = gen.pools()[0]
    counts = np.stack([component_counts(int(n), m) for n, m in zip(SIZES, MIX)])
    x, _, comp = gen.client(2, int(SIZES[2]), MIX[2])
    offset = counts[:2, 0].sum()  # clients 0 and 1 took the first ones
    perm = numpy_rng(1, "images", "perm", 0).permutation(N_TRAIN)
    got = pool_index(x[torch.from_numpy(comp == 0)], pool.train_x)
    assert sorted(got) == sorted(perm[offset : offset + counts[2, 0]].tolist())
    assert not np.array_equal(comp, np.sort(comp)), "components are interleaved"


def test_image_mixture_is_reproducible(fmnist_root):
    root, _ = fmnist_root
    a = ImageMixture(fmnist_cfg(root), seed=7, sizes=SIZES, mixtures=MIX)
    b = ImageMixture(fmnist_cfg(root), seed=7)
    b.set_layout(SIZES, MIX)
    for k in (0, 3):
        xa, ya, ca = a.client(k, int(SIZES[k]), MIX[k])
        xb, yb, cb = b.client(k, int(SIZES[k]), MIX[k])
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and np.array_equal(ca, cb)
    assert torch.equal(a.holdout(1)[0], b.holdout(1)[0])
    c = ImageMixture(fmnist_cfg(root), seed=8, sizes=SIZES, mixtures=MIX)
    assert not torch.equal(a.client(0, int(SIZES[0]), MIX[0])[0], c.client(0, int(SIZES[0]), MIX[0])[0])


def test_image_mixture_wraps_around_a_small_pool(fmnist_root):
    root, _ = fmnist_root
    sizes = np.array([30, 30])
    mix = np.array([[0.9, 0.1], [0.9, 0.1]])  # 27 + 27 samples of component 0 from a pool of 40
    gen = ImageMixture(fmnist_cfg(root, clients=2), seed=0, sizes=sizes, mixtures=mix)
    perm = numpy_rng(0, "images", "perm", 0).permutation(N_TRAIN)
    pool = gen.pools()[0].train_x
    x0, _, c0 = gen.client(0, 30, mix[0])
    x1, _, c1 = gen.client(1, 30, mix[1])
    assert sorted(pool_index(x0[torch.from_numpy(c0 == 0)], pool)) == sorted(perm[:27].tolist())
    wrapped = perm[(27 + np.arange(27)) % N_TRAIN]
    assert sorted(pool_index(x1[torch.from_numpy(c1 == 0)], pool)) == sorted(wrapped.tolist())


def test_image_mixture_holdout_size_and_rotation(fmnist_root):
    root, arrays = fmnist_root
    gen = ImageMixture(fmnist_cfg(root), seed=2)
    test = arrays["t10k-images-idx3-ubyte"][:, None]
    x0, y0 = gen.holdout(0)
    x1, y1 = gen.holdout(1)
    assert x0.shape == (5, 1, 28, 28) and y0.shape == (5,) and y0.dtype == torch.int64
    idx0 = pool_index(x0, test)
    idx1 = pool_index(rotate(x1, 180), test)
    np.testing.assert_array_equal(y1.numpy(), arrays["t10k-labels-idx1-ubyte"][idx1])
    assert torch.equal(rotate(x1, 180), torch.from_numpy(test[idx1]).float() / 255)
    assert len(set(idx0)) == 5
    big = ImageMixture(fmnist_cfg(root, test_samples=1000), seed=2)
    assert big.holdout(0)[0].shape[0] == N_TEST  # fewer if the split is smaller


def test_image_mixture_loads_each_dataset_once_per_process(fmnist_root):
    root, _ = fmnist_root
    a = ImageMixture(fmnist_cfg(root), seed=0)
    b = ImageMixture(fmnist_cfg(root), seed=1)
    assert a.pools() is b.pools() is load_pools("fmnist", str(root))


def test_image_mixture_missing_files(tmp_path, monkeypatch):
    # construction reads no files; the first use does
    gen = ImageMixture(fmnist_cfg(tmp_path / "empty"), seed=0, sizes=SIZES, mixtures=MIX)
    with pytest.raises(MissingDataError):
        gen.check_files()
    with pytest.raises(MissingDataError, match="^fmnist: expected"):
        gen.holdout(0)
    monkeypatch.delenv("RAYSOFT_DATA", raising=False)
    with pytest.raises(MissingDataError, match="data.root must be set"):
        ImageMixture(ImageData(name="cifar10", clients=4, distributions=2), seed=0)


def test_image_mixture_needs_a_layout_for_clients(fmnist_root):
    root, _ = fmnist_root
    gen = ImageMixture(fmnist_cfg(root), seed=0)
    with pytest.raises(RuntimeError, match="set_layout"):
        gen.client(0, 6, MIX[0])
    gen.set_layout(SIZES, MIX)
    with pytest.raises(ValueError, match="differ from the layout"):
        gen.client(0, 7, MIX[0])


def test_image_mixture_emnist_letters_four_distributions(tmp_path):
    written = write_emnist(tmp_path)
    cfg = ImageData(name="emnist_letters", clients=2, distributions=4, partition="random",
                     root=str(tmp_path), test_samples=100)
    sizes = np.array([8, 8])
    mix = np.full((2, 4), 0.25)
    gen = ImageMixture(cfg, seed=0, sizes=sizes, mixtures=mix)
    assert gen.info.num_outputs == 26 and gen.info.input_dim == 784
    lower, upper = load_emnist_letters(str(tmp_path))
    for dist, base in ((0, lower), (1, upper), (2, lower), (3, upper)):
        x, y = gen.holdout(dist)
        assert x.shape == (26, 1, 28, 28)
        angle = 90.0 if dist >= 2 else 0.0
        idx = pool_index(rotate(x, -angle), base.test_x)
        np.testing.assert_array_equal(y.numpy(), base.test_y[idx])
    x, y, comp = gen.client(1, 8, mix[1])
    assert np.bincount(comp, minlength=4).tolist() == [2, 2, 2, 2]
    assert int(y.max()) < 26
    assert written["train"][0].shape == (124, 28, 28)


def test_image_mixture_cifar_checks_md5_of_real_files(tmp_path):
    write_cifar10(tmp_path)
    gen = ImageMixture(ImageData(name="cifar10", clients=2, distributions=2, root=str(tmp_path)), seed=0)
    assert gen.image_shape == (3, 32, 32) and gen.info.input_dim == 3072
    with pytest.raises(ValueError, match="md5 mismatch"):
        gen.holdout(0)
